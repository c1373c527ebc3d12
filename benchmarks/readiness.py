"""The readiness backward against loss.backward(), side by side in one run.

    python -m benchmarks.readiness [--net resnet152] [--image-size 64]
        [--batch 4] [--repeats 5]

Each repeat runs one forward, then times ``loss.backward()``; then one
forward, then times ``ReadinessBackward.backward`` (which also counts each
parameter's consumers and reports each ready parameter); the order of the two
alternates between repeats. Prints the median of each and the ratios of the medians and of the minima
(traversal / loss.backward()); machines here are shared and noisy, so only
the ratio from one run means anything.
"""
import statistics
import time

import models  # NOQA: imports the compat module before Chainer
import numpy

from cgdp_chainer.runtime.replica import readiness
from experiments import cli


def _timed_backward(model, x, t, method, engine):
    model.cleargrads()
    loss = model(x, t)
    start = time.perf_counter()
    if method == 'loss.backward()':
        loss.backward()
    else:
        engine.backward(loss, lambda name, used: None)
    return time.perf_counter() - start


def main(argv=None):
    parser = cli.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--net', default='resnet152', choices=models.NETWORKS)
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--batch', type=cli.positive_int, default=4)
    parser.add_argument('--repeats', type=cli.positive_int, default=5)
    args = parser.parse_args(argv)
    try:
        models.check_image_size(args.net, args.image_size)
    except ValueError as e:
        cli.fail(str(e))

    model = models.Classifier(models.get_model(args.net, n_classes=1000,
                                               seed=0))
    rng = numpy.random.RandomState(0)
    x = rng.uniform(-1, 1, (args.batch, 3, args.image_size,
                            args.image_size)).astype(numpy.float32)
    t = rng.randint(0, 1000, args.batch).astype(numpy.int32)
    engine = readiness.ReadinessBackward(model.namedparams())
    methods = ('loss.backward()', 'readiness')
    times = {m: [] for m in methods}
    _timed_backward(model, x, t, methods[0], engine)  # warm-up
    for repeat in range(args.repeats):
        for method in (methods if repeat % 2 == 0 else methods[::-1]):
            times[method].append(_timed_backward(model, x, t, method, engine))

    print('{} at {} px, batch {}, {} repeats, {} parameters'.format(
        args.net, args.image_size, args.batch, args.repeats,
        len(engine.names)))
    for method in methods:
        print('  {:<16} median {:.3f} s  (all: {})'.format(
            method, statistics.median(times[method]),
            ', '.join('{:.3f}'.format(s) for s in times[method])))
    print('  ratio traversal / loss.backward(): {:.3f} (medians), {:.3f} '
          '(minima, the least disturbed runs)'.format(
              statistics.median(times['readiness'])
              / statistics.median(times['loss.backward()']),
              min(times['readiness']) / min(times['loss.backward()'])))


if __name__ == '__main__':
    main()
