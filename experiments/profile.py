"""Profiles a network for the cost model and saves the profile JSON.

``python -m experiments.profile --net NET --device DEV --batch B
--image-size S [--input-shape SHAPE] [--reps R] [--out FILE] [--force]``;
what a profile holds is described in
:mod:`cgdp_chainer.costmodel.profiler`, which does the measuring.

Every argument is checked before the measuring starts: the image size
against the network (a ``module:callable`` is built and probed on
``--input-shape``, default ``3,S,S``: a predictor, whose number of outputs
is read from it, or a chain that computes its own loss, see
:mod:`cgdp_chainer.costmodel.samples`), the output file for writing (its
folder is created if missing) and for an earlier profile, which is replaced
only with ``--force``. Each stage of the measuring writes a line on stderr.
The profile is written atomically: an interrupted run leaves the previous
file.
"""
import os
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

from cgdp_chainer import files
from cgdp_chainer.costmodel import samples
# The measuring lives in the library; these names stay importable from here.
from cgdp_chainer.costmodel.profiler import DEFAULT_REPS  # NOQA
from cgdp_chainer.costmodel.profiler import profile_model  # NOQA
from cgdp_chainer.costmodel.profiler import profile_replica  # NOQA
from cgdp_chainer.costmodel.profiler import save_profile  # NOQA
from cgdp_chainer.costmodel.profiler import STATISTICS  # NOQA
from experiments import progress


def default_path(net, device, batch, image_size):
    """``results/profiles/<net>_<device>_b<batch>_s<size>.json``.

    Args:
        image_size (int or str): The image side, or another input's shape
            (``'20'``, ``'1x28x28'``).
    """
    tag = device.replace('@', '').replace(':', '')
    return os.path.join('results', 'profiles', '{}_{}_b{}_s{}.json'.format(
        net, tag, batch, image_size))


def build_parser():
    """The command-line parser of this script."""
    parser = cli.ArgumentParser(
        prog='python -m experiments.profile',
        description='Measure per-stage times, copy bandwidth and host '
                    'accumulator costs of a network for the cost model.')
    parser.add_argument('--net', required=True, type=cli.net_spec,
                        help='one of the four networks, or module:callable '
                             '(see models.custom)')
    parser.add_argument('--device', default=['@numpy'],
                        type=cli.single_device,
                        help="'@numpy' or '@cupy:N' (default @numpy)")
    parser.add_argument('--batch', type=cli.positive_int, default=4)
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--input-shape', type=cli.input_shape, default=None,
                        metavar='SHAPE',
                        help='one example\'s input of a module:callable '
                             '--net, without the batch: C,H,W for images '
                             'or F for a flat width (default '
                             '3,IMAGE_SIZE,IMAGE_SIZE)')
    parser.add_argument('--reps', type=cli.positive_int, default=DEFAULT_REPS)
    parser.add_argument('--statistic', choices=sorted(STATISTICS),
                        default='median',
                        help='summary of the repetitions (default median; '
                             'min resists other processes on a shared '
                             'machine)')
    parser.add_argument('--classes', type=cli.positive_int, default=1000,
                        help='classes of the four networks (a '
                             'module:callable\'s are read from it)')
    parser.add_argument('--out', default=None, metavar='FILE',
                        help='profile JSON (default results/profiles/...)')
    parser.add_argument('--force', action='store_true',
                        help='replace an existing profile at --out')
    return parser


def parse_args(argv=None):
    """Parses and checks the command line; exits with 2 on bad input.

    Args:
        argv (list of str or None): Arguments; ``sys.argv[1:]`` if ``None``.

    Returns:
        argparse.Namespace: The arguments; ``out`` is the profile's path
        (the default one if none was given).
    """
    args = build_parser().parse_args(argv)
    import models
    args.model = None
    size = args.image_size
    if models.is_custom(args.net):
        shape = args.input_shape or (3, size, size)
        args.model = cli.probe_model(args.net, shape)
        # The file name's size: the side of square RGB images, as the
        # four's, else the whole shape.
        size = shape[-1] if shape == (3, shape[-1], shape[-1]) else \
            samples.describe_shape(shape)
    elif args.input_shape is not None:
        size = args.image_size = cli.check_image_input(args.net,
                                                       args.input_shape)
    else:
        cli.check_net(args.net, args.classes, args.image_size)
    if args.out is None:
        args.out = default_path(args.net, args.device[0], args.batch, size)
    cli.check_output_file('--out', args.out)
    if os.path.exists(args.out) and not args.force:
        cli.fail('--out {} already holds a profile; choose another --out, '
                 'or pass --force to replace it'.format(args.out))
    return args


def main(argv=None):
    """Profiles the network the command line names and writes the JSON.

    Args:
        argv (list of str or None): Arguments; ``sys.argv[1:]`` if ``None``.
    """
    args = parse_args(argv)
    from experiments import train
    device = args.device[0]
    model = args.model or train.build_model(args.net,
                                            n_classes=args.classes, seed=0)
    start = time.perf_counter()
    profile = profile_model(model, device, args.batch, args.image_size,
                            reps=args.reps, n_classes=args.classes,
                            statistic=args.statistic,
                            progress=progress.StageLog())
    profile['net'] = args.net
    path = args.out
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with files.atomic_path(path) as temporary:
        save_profile(profile, temporary)
    layers = profile['layers']
    shape = profile.get('input_shape') or [3, args.image_size,
                                           args.image_size]
    print('profiled {} on {} (batch {}, input {}) in {:.1f} s: forward '
          '{:.4f} s, backward {:.4f} s over {} layers; '
          'copy {:.2f} GB/s; wrote {}'.format(
              args.net, device, args.batch, samples.describe_shape(shape),
              time.perf_counter() - start,
              sum(s['forward_s'] for s in layers),
              sum(s['backward_s'] for s in layers), len(layers),
              profile['copy']['d2h_bytes_per_s'] / 1e9, path))


if __name__ == '__main__':
    main()
