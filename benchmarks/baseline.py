"""Forward and backward time of each network on one device.

The baseline against which the data-parallel runs are read: how long one
training iteration's forward pass (network and loss) and backward pass
take for each network on a single device, at the small test size (64x64,
batch 4) and at the canonical size (224x224, batch 2). Each number is the
median of ``--repeats`` timed iterations after one untimed warm-up
iteration.

Usage::

    python -m benchmarks.baseline [--nets resnet152 vgg16] [--device @numpy]
                                  [--repeats 5]

Every argument is checked before the first network is built; bad input
exits with status 2 and one ``error:`` line.
"""
from experiments import cli  # NOQA: first: one-line errors, quiet imports

import models  # NOQA: before Chainer, so cgdp_chainer._compat runs first

import os
import platform
import statistics
import time

import chainer
import numpy

from cgdp_chainer import devices

# (image side in pixels, batch size): the small size the CPU tests use and
# the canonical ImageNet crop.
SETTINGS = ((64, 4), (224, 2))
N_CLASSES = 1000


def _synchronize(device):
    # GPU kernels run asynchronously; wait for them so the clock measures
    # the work and not only its launch.
    if devices.is_gpu(device):
        device.device.synchronize()


def time_iterations(classifier, device, image_size, batch, repeats):
    """Times forward and backward passes of one classifier.

    Args:
        classifier (models.Classifier): The network with its loss, already
            on ``device``.
        device (chainer.backend.Device): Where the classifier lives.
        image_size (int): Side of the square input images.
        batch (int): Images per iteration.
        repeats (int): Timed iterations (one untimed warm-up comes first).

    Returns:
        tuple of lists: Forward seconds and backward seconds, one per timed
        iteration.
    """
    rng = numpy.random.RandomState(0)
    x = device.send(rng.standard_normal(
        (batch, 3, image_size, image_size)).astype(numpy.float32))
    t = device.send(rng.randint(0, N_CLASSES, size=batch).astype(
        numpy.int32))
    forward_seconds, backward_seconds = [], []
    with chainer.using_config('train', True):
        for iteration in range(repeats + 1):
            classifier.cleargrads()
            _synchronize(device)
            start = time.perf_counter()
            loss = classifier(x, t)
            _synchronize(device)
            middle = time.perf_counter()
            loss.backward()
            _synchronize(device)
            end = time.perf_counter()
            del loss
            if iteration > 0:  # the first pass pays for allocation, caches
                forward_seconds.append(middle - start)
                backward_seconds.append(end - middle)
    classifier.cleargrads()
    return forward_seconds, backward_seconds


def run(nets, device_spec, repeats):
    """Measures every network and setting; prints a line for each.

    Args:
        nets (sequence of str): Names in ``models.NETWORKS``.
        device_spec (str): ``'@numpy'`` or ``'@cupy:N'``.
        repeats (int): Timed iterations per network and setting.

    Returns:
        list of dict: One row per (network, image size) with keys ``net``,
        ``image_size``, ``batch``, ``forward_s`` and ``backward_s``
        (medians in seconds).
    """
    device = devices.parse_device(device_spec)
    print('device: {}; chainer {}, numpy {}, python {}, {} CPU cores'.format(
        devices.describe(device), chainer.__version__, numpy.__version__,
        platform.python_version(), os.cpu_count()))
    print('median of {} iterations after 1 warm-up; training mode, {} '
          'classes'.format(repeats, N_CLASSES))
    print('{:<10} {:>6} {:>6} {:>12} {:>13} {:>12}'.format(
        'network', 'image', 'batch', 'forward_ms', 'backward_ms', 'total_ms'))
    rows = []
    for net in nets:
        classifier = models.Classifier(
            models.get_model(net, n_classes=N_CLASSES, seed=0))
        classifier.to_device(device)
        for image_size, batch in SETTINGS:
            forward, backward = time_iterations(
                classifier, device, image_size, batch, repeats)
            row = {'net': net, 'image_size': image_size, 'batch': batch,
                   'forward_s': statistics.median(forward),
                   'backward_s': statistics.median(backward)}
            rows.append(row)
            print('{:<10} {:>6} {:>6} {:>12.1f} {:>13.1f} {:>12.1f}'.format(
                net, image_size, batch, 1e3 * row['forward_s'],
                1e3 * row['backward_s'],
                1e3 * (row['forward_s'] + row['backward_s'])), flush=True)
        del classifier
    return rows


def build_parser():
    """The command-line parser of this script."""
    parser = cli.ArgumentParser(
        prog='python -m benchmarks.baseline',
        description='Forward and backward time per iteration of each '
                    'network on one device.')
    parser.add_argument('--nets', nargs='+', type=cli.net_name,
                        default=list(models.NETWORKS), metavar='NET',
                        help='networks to time: {} (default: all '
                             'four)'.format(', '.join(models.NETWORKS)))
    parser.add_argument('--device', default=['@numpy'],
                        type=cli.single_device,
                        help="'@numpy' (default) or '@cupy:N'")
    parser.add_argument('--repeats', type=cli.positive_int, default=5,
                        help='timed iterations per setting (default: 5)')
    return parser


def parse_args(argv=None):
    """Parses and checks the command line; exits with 2 on bad input.

    Args:
        argv (list of str or None): Arguments; ``None`` reads ``sys.argv``.

    Returns:
        argparse.Namespace: ``nets``, ``device`` (a one-item list) and
        ``repeats``.
    """
    args = build_parser().parse_args(argv)
    for net in args.nets:
        for image_size, _ in SETTINGS:
            cli.check_image_size(net, image_size)
    return args


def main(argv=None):
    """Command-line entry point.

    Args:
        argv (list of str or None): Arguments; ``None`` reads ``sys.argv``.
    """
    args = parse_args(argv)
    run(args.nets, args.device[0], args.repeats)


if __name__ == '__main__':
    main()
