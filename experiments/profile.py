"""Profiles a network for the cost model and saves the profile JSON.

``python -m experiments.profile --net NET --device DEV --batch B
--image-size S [--reps R] [--out FILE]``; what a profile holds is described
in :mod:`cgdp_chainer.profiler`, which does the measuring.
"""
import os
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

# The measuring lives in the library; these names stay importable from here.
from cgdp_chainer.profiler import DEFAULT_REPS  # NOQA
from cgdp_chainer.profiler import profile_model  # NOQA
from cgdp_chainer.profiler import profile_replica  # NOQA
from cgdp_chainer.profiler import save_profile  # NOQA
from cgdp_chainer.profiler import STATISTICS  # NOQA


def default_path(net, device, batch, image_size):
    """``results/profiles/<net>_<device>_b<batch>_s<size>.json``."""
    tag = device.replace('@', '').replace(':', '')
    return os.path.join('results', 'profiles', '{}_{}_b{}_s{}.json'.format(
        net, tag, batch, image_size))


def build_parser():
    parser = cli.ArgumentParser(
        description='Measure per-stage times, copy bandwidth and host '
                    'accumulator costs of a network for the cost model.')
    parser.add_argument('--net', required=True, type=cli.net_name)
    parser.add_argument('--device', default=['@numpy'],
                        type=cli.single_device,
                        help="'@numpy' or '@cupy:N' (default @numpy)")
    parser.add_argument('--batch', type=cli.positive_int, default=4)
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--reps', type=cli.positive_int, default=DEFAULT_REPS)
    parser.add_argument('--statistic', choices=sorted(STATISTICS),
                        default='median',
                        help='summary of the repetitions (default median; '
                             'min resists other processes on a shared '
                             'machine)')
    parser.add_argument('--classes', type=cli.positive_int, default=1000)
    parser.add_argument('--out', default=None,
                        help='profile JSON (default results/profiles/...)')
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    cli.check_image_size(args.net, args.image_size)
    from experiments import train
    device = args.device[0]
    model = train.build_model(args.net, n_classes=args.classes, seed=0)
    start = time.perf_counter()
    profile = profile_model(model, device, args.batch, args.image_size,
                            reps=args.reps, n_classes=args.classes,
                            statistic=args.statistic)
    profile['net'] = args.net
    path = args.out or default_path(args.net, device, args.batch,
                                    args.image_size)
    save_profile(profile, path)
    stages = profile['stages']
    print('profiled {} on {} (batch {}, {} px) in {:.1f} s: forward {:.4f} '
          's, backward {:.4f} s over {} stages; chunk overhead {:.2e} s; '
          'copy {:.2f} GB/s; wrote {}'.format(
              args.net, device, args.batch, args.image_size,
              time.perf_counter() - start,
              sum(s['forward_s'] for s in stages),
              sum(s['backward_s'] for s in stages), len(stages),
              profile['chunk_overhead']['backward_s'],
              profile['copy']['d2h_bytes_per_s'] / 1e9, path))


if __name__ == '__main__':
    main()
