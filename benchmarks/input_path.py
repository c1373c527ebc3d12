"""The input path's overlap: CGDP (one '@numpy' replica, worker processes)
against StandardUpdater on a dataset whose examples cost about half of the
compute, measured side by side in one run.

    python -m benchmarks.input_path [--batch 32] [--image-size 32]
        [--augment 6] [--iterations 8] [--warmup 2] [--rounds 3]

Each example is augmented in ``get_example`` (a few NumPy operations on an
image-sized array, from a random stream of the dataset's own, as data
loaders augment), read through a ``SerialIterator``. CGDP reads and
converts the next batch while an iteration computes (see
:mod:`cgdp_chainer.runtime.input.input_path`); StandardUpdater reads it at the
start of each iteration. Rounds alternate between the two, each also
without the augmentation; the ratio of the medians is printed (target
<= 0.85), with what the input adds to an iteration of each (the overlap,
apart from CGDP's own cost per iteration on this small model). The
machine's other load shows in the numbers: rerun when it was busy.
"""
import argparse
import statistics
import time

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import updaters
import numpy

import cgdp_chainer
from cgdp_chainer import allocator


class SmallConvNet(chainer.Chain):
    """Two convolutions and a linear classifier."""

    def __init__(self, n_classes=10):
        super(SmallConvNet, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 16, 3, pad=1)
            self.conv2 = L.Convolution2D(16, 32, 3, pad=1)
            self.fc = L.Linear(None, n_classes)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.conv1(x)), 2)
        h = F.max_pooling_2d(F.relu(self.conv2(h)), 2)
        return self.fc(h)


class AugmentedImages(chainer.dataset.DatasetMixin):
    """Synthetic images, each augmented when read: ``passes`` rounds of a
    flip, a normalization and noise from a stream of the example's own."""

    def __init__(self, n, image_size, passes, seed=0):
        rng = numpy.random.RandomState(seed)
        self.images = rng.uniform(
            0, 255, (n, 3, image_size, image_size)).astype(numpy.float32)
        self.labels = rng.randint(0, 10, n).astype(numpy.int32)
        self.passes = passes

    def __len__(self):
        return len(self.images)

    def get_example(self, i):
        rng = numpy.random.RandomState(int(i))
        x = self.images[i]
        for _ in range(self.passes):
            x = x[:, :, ::-1] * numpy.float32(1.0 / 255)
            x = (x - x.mean()) / (x.std() + numpy.float32(1e-5))
            x = x + rng.normal(0, 0.01, x.shape).astype(numpy.float32)
            x = numpy.clip(x * numpy.float32(255), 0, 255)
        return x.astype(numpy.float32), self.labels[i]


def _updater(mode, args, passes):
    model = L.Classifier(SmallConvNet())
    optimizer = chainer.optimizers.MomentumSGD(0.01).setup(model)
    dataset = AugmentedImages(args.batch * 16, args.image_size, passes)
    iterator = chainer.iterators.SerialIterator(dataset, args.batch,
                                                shuffle=True)
    if mode == 'standard':
        return updaters.StandardUpdater(iterator, optimizer)
    return cgdp_chainer.CGDPUpdater(
        iterator, optimizer, ['@numpy'], workers=args.workers,
        blas_threads=args.blas_threads)


def _median_iteration(updater, args):
    times = []
    try:
        for i in range(args.warmup + args.iterations):
            start = time.perf_counter()
            updater.update()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    finally:
        updater.finalize()
    return statistics.median(times)


def _input_share(args):
    """Seconds of one batch's reads and conversion alone."""
    dataset = AugmentedImages(args.batch, args.image_size, args.augment)
    start = time.perf_counter()
    chainer.dataset.concat_examples([dataset[i] for i in range(args.batch)])
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m benchmarks.input_path',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--image-size', type=int, default=32)
    parser.add_argument('--augment', type=int, default=6,
                        help='augmentation passes per example')
    parser.add_argument('--iterations', type=int, default=8)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--workers', default='process',
                        choices=('process', 'thread'))
    parser.add_argument('--blas-threads', type=int, default=None,
                        help="the CGDP replica's (default: CGDP's, all "
                        'cores for one replica)')
    args = parser.parse_args(argv)
    # StandardUpdater computes in this process: it allocates as CGDP's
    # worker processes do (see cgdp_chainer.allocator).
    allocator.keep_freed_memory()
    # Each updater with the augmentation and without: what the input adds
    # to an iteration of each tells the overlap apart from CGDP's own
    # per-iteration cost on the model.
    runs = [(mode, passes) for passes in (args.augment, 0)
            for mode in ('standard', 'cgdp')]
    times = {run: [] for run in runs}
    for _ in range(args.rounds):
        for mode, passes in runs:
            times[mode, passes].append(_median_iteration(
                _updater(mode, args, passes), args))
    median = {run: statistics.median(values)
              for run, values in times.items()}
    standard, cgdp = median['standard', args.augment], median[
        'cgdp', args.augment]
    print('[input] batch {} at {} px, {} augmentation passes: reading and '
          'converting a batch {:.3f} s; StandardUpdater {:.3f} s, CGDP '
          '(1 @numpy replica, {}) {:.3f} s per iteration; '
          'CGDP/Standard = {:.3f} (target <= 0.85); the input adds {:.3f} s '
          'to an iteration of StandardUpdater, {:.3f} s to one of CGDP '
          '(without it: {:.3f} s and {:.3f} s); rounds: {}'.format(
              args.batch, args.image_size, args.augment, _input_share(args),
              standard, args.workers, cgdp, cgdp / standard,
              standard - median['standard', 0], cgdp - median['cgdp', 0],
              median['standard', 0], median['cgdp', 0],
              {'{} {}'.format(*run): ['{:.3f}'.format(t) for t in values]
               for run, values in times.items()}), flush=True)

if __name__ == '__main__':
    main()
