"""The input path's overlap on the pipelines Chainer's users have: CGDP
(one '@numpy' replica, worker processes and worker threads) against
StandardUpdater, side by side in one run, with the limit
max(input, compute) beside.

    python -m benchmarks.input_path [--batch 32] [--image-size 32]
        [--augment 8] [--iterations 8] [--warmup 2] [--rounds 3]
        [--workers process,thread] [--loaders 2]

Each example is augmented in ``get_example`` as Chainer's imagenet
example's ``PreprocessedDataset`` augments: a random crop and flip drawn
from Python's ``random``, then a few rounds of normalization and noise
drawn from NumPy's global state. Two pipelines read it:

- ``serial``: a ``SerialIterator`` (``shuffle=True``). CGDP reads the next
  batch in a reader process from the random states StandardUpdater reads
  it from while an iteration computes (see
  :mod:`cgdp_chainer.runtime.input.input_path`); StandardUpdater reads it
  at the start of each iteration.
- ``multiprocess``: a ``MultiprocessIterator`` (``--loaders`` processes),
  which prefetches in its own processes; CGDP converts its next batch
  while an iteration computes, StandardUpdater at the start of each.

For each pipeline and worker kind the line gives the median seconds per
iteration of both updaters, their ratio (goal <= 0.85), the input's
seconds per batch alone (the pipeline's reading and conversion, nothing
else running), the compute's (CGDP's iteration when the input costs
nothing: the same model on examples only cropped and flipped;
StandardUpdater's beside it) and CGDP against the limit,
max(input, compute) (goal <= 1.15). Rounds alternate
between the runs; the machine's other load shows in the numbers: rerun
when it was busy.
"""
import argparse
import random
import statistics
import time

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import updaters
import numpy

import cgdp_chainer
from benchmarks import TIMED_REDUCTION
from cgdp_chainer import allocator

_CROP_MARGIN = 4  # pixels the random crop may move


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
    """Synthetic images, each augmented when read: a crop and a flip drawn
    from Python's ``random``, then ``passes`` rounds of a normalization and
    noise drawn from NumPy's global state."""

    def __init__(self, n, image_size, passes, seed=0):
        rng = numpy.random.RandomState(seed)
        side = image_size + _CROP_MARGIN
        self.images = rng.uniform(0, 255, (n, 3, side, side)).astype(
            numpy.float32)
        self.labels = rng.randint(0, 10, n).astype(numpy.int32)
        self.image_size = image_size
        self.passes = passes

    def __len__(self):
        return len(self.images)

    def get_example(self, i):
        size = self.image_size
        top = random.randint(0, _CROP_MARGIN)
        left = random.randint(0, _CROP_MARGIN)
        x = self.images[i][:, top:top + size, left:left + size]
        if random.randint(0, 1):
            x = x[:, :, ::-1]
        for _ in range(self.passes):
            x = x * numpy.float32(1.0 / 255)
            x = (x - x.mean()) / (x.std() + numpy.float32(1e-5))
            x = x + numpy.random.normal(0, 0.01, x.shape).astype(
                numpy.float32)
            x = numpy.clip(x * numpy.float32(255), 0, 255)
        return numpy.ascontiguousarray(x, numpy.float32), self.labels[i]


def _iterator(pipeline, args, passes):
    dataset = AugmentedImages(args.batch * 16, args.image_size, passes)
    if pipeline == 'serial':
        return chainer.iterators.SerialIterator(dataset, args.batch,
                                                shuffle=True)
    return chainer.iterators.MultiprocessIterator(
        dataset, args.batch, shuffle=True, n_processes=args.loaders)


def _updater(mode, iterator, args):
    model = L.Classifier(SmallConvNet())
    optimizer = chainer.optimizers.MomentumSGD(0.01).setup(model)
    if mode == 'standard':
        return updaters.StandardUpdater(iterator, optimizer)
    return cgdp_chainer.CGDPUpdater(
        iterator, optimizer, ['@numpy'], workers=mode,
        blas_threads=args.blas_threads, reduction=TIMED_REDUCTION)


def _median_iteration(mode, pipeline, passes, args):
    """Median seconds of an update, after ``--warmup`` ones."""
    numpy.random.seed(0)
    random.seed(0)
    iterator = _iterator(pipeline, args, passes)
    updater = _updater(mode, iterator, args)
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


def _input_seconds(pipeline, args):
    """Seconds per batch of the pipeline's reading and conversion alone,
    in a steady state (a MultiprocessIterator's processes read ahead)."""
    iterator = _iterator(pipeline, args, args.augment)
    try:
        chainer.dataset.concat_examples(iterator.next())
        start = time.perf_counter()
        for _ in range(args.iterations):
            chainer.dataset.concat_examples(iterator.next())
        return (time.perf_counter() - start) / args.iterations
    finally:
        iterator.finalize()


def _report(pipeline, workers, median, inputs, args):
    standard = median['standard', pipeline, args.augment]
    cgdp = median[workers, pipeline, args.augment]
    compute = median[workers, 'serial', 0]
    limit = max(inputs[pipeline], compute)
    what = ('a SerialIterator over a global-random augmentation'
            if pipeline == 'serial' else
            'a MultiprocessIterator ({} processes)'.format(args.loaders))
    print('[input] {}, {} workers: StandardUpdater {:.3f} s, CGDP {:.3f} s '
          'per iteration; CGDP/Standard = {:.3f} (goal <= 0.85); input '
          '{:.3f} s, compute {:.3f} s (StandardUpdater\'s {:.3f} s), limit '
          'max(input, compute) {:.3f} s; CGDP/limit = {:.3f} (goal <= '
          '1.15)'.format(
              what, workers, standard, cgdp, cgdp / standard,
              inputs[pipeline], compute, median['standard', 'serial', 0],
              limit, cgdp / limit), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m benchmarks.input_path',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--image-size', type=int, default=32)
    parser.add_argument('--augment', type=int, default=8,
                        help='normalization and noise passes per example')
    parser.add_argument('--iterations', type=int, default=8)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--workers', default='process,thread',
                        help="CGDP's worker kinds, comma-separated")
    parser.add_argument('--loaders', type=int, default=2,
                        help="the MultiprocessIterator's processes")
    parser.add_argument('--blas-threads', type=int, default=None,
                        help="the CGDP replica's (default: CGDP's, all "
                        'cores for one replica)')
    args = parser.parse_args(argv)
    kinds = args.workers.split(',')
    for kind in kinds:
        if kind not in ('process', 'thread'):
            parser.error('--workers: process and/or thread, got {!r}'.format(
                kind))
    # StandardUpdater computes in this process: it allocates as CGDP's
    # worker processes do (see cgdp_chainer.allocator).
    allocator.keep_freed_memory()
    pipelines = ('serial', 'multiprocess')
    runs = [(mode, pipeline, args.augment) for pipeline in pipelines
            for mode in ['standard'] + kinds]
    # The compute: CGDP's, and StandardUpdater's for its own cost.
    runs += [(mode, 'serial', 0) for mode in ['standard'] + kinds]
    times = {run: [] for run in runs}
    inputs = {pipeline: [] for pipeline in pipelines}
    for _ in range(args.rounds):
        for pipeline in pipelines:
            inputs[pipeline].append(_input_seconds(pipeline, args))
        for run in runs:
            times[run].append(_median_iteration(*run, args=args))
    median = {run: statistics.median(values)
              for run, values in times.items()}
    inputs = {pipeline: statistics.median(values)
              for pipeline, values in inputs.items()}
    print('[input] batch {} at {} px, {} augmentation passes; rounds: '
          '{}'.format(args.batch, args.image_size, args.augment, {
              '{} {} {}'.format(*run): ['{:.3f}'.format(t) for t in values]
              for run, values in times.items()}), flush=True)
    for pipeline in pipelines:
        for kind in kinds:
            _report(pipeline, kind, median, inputs, args)


if __name__ == '__main__':
    main()
