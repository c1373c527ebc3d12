"""Checks the cost model against weak-scaling measurements on this CPU.

``make validate-model NET=resnet152`` (``python -m experiments.validate_model
--net NET``):

1. measures, in the same sitting (the machine's speed drifts by up to 30%
   over minutes, so a profile and a measurement taken apart disagree by
   that much): a short weak-scaling run of typical and CGDP (CGDP with
   ``CGDPUpdater``'s default workers) at N = 1, 2, 4 through
   :mod:`experiments.weak_scaling`'s functions, at that experiment's CPU
   settings, kept under ``results/costmodel/validation/<net>/``; with
   ``--summary PATH`` it compares with that run's single-process rows
   instead (``--latest``: the newest ``results/<net>/*/summary.csv``),
   which were not taken in the same sitting;
2. profiles this CPU with one replica, per layer, at the measurement's
   batch and image size (``experiments.profile``), saving the profile under
   ``results/profiles/``; the profile keeps the median of its repetitions
   (``--statistic``), the same statistic as the measured iteration times
   (``median_s``): the model adds up layer times, and the minimum of each
   layer, a lower bound, under-predicts every point (``--statistic min``
   is there for a machine shared with a varying load);
3. predicts typical and CGDP iteration times at each measured N with the
   ``this-cpu`` preset (simulation and closed form), at the chunk size the
   measured run used;
4. prints a table with the per-point error and the median absolute error
   (target: at most 10%), writes it to
   ``results/costmodel/validation_<net>.csv`` and says what the model
   leaves out.

The measurements and the profile share two cores with whatever else runs:
the load average is printed, and a busy machine makes both noisy.
"""
import argparse
import glob
import os
import statistics
import sys
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

from cgdp_chainer import costmodel  # NOQA: E402
from cgdp_chainer.costmodel import hardware  # NOQA: E402
from experiments import profile as profile_module  # NOQA: E402
from experiments import results  # NOQA: E402

TARGET_MEDIAN_ERROR = 0.10
MODES = (results.TYPICAL, results.CGDP)
COLUMNS = ('net', 'mode', 'n_devices', 'batch_per_device', 'image_size',
           'chunk_size', 'measured_s', 'measured_iqr_s', 'predicted_s',
           'closed_form_s', 'error')
OUT_DIR = os.path.join('results', 'costmodel')
# A short measurement: enough iterations for a median on a busy machine.
SHORT_ITERATIONS = 5
SHORT_WARMUP = 2
# More repetitions than the profile's default: the profile is the model's
# only input, and the machine may be busy.
PROFILE_REPS = 5


def newest_summary(root, net):
    """Path of the newest ``<root>/<net>/*/summary.csv``, or ``None``.

    Run folders are named by their start time, so the largest name is the
    newest; the file's modification time breaks ties.
    """
    paths = glob.glob(os.path.join(root, net, '*', results.SUMMARY_FILE))
    if not paths:
        return None
    return max(paths, key=lambda p: (os.path.basename(os.path.dirname(p)),
                                     os.path.getmtime(p)))


def chunk_sizes_of_run(folder):
    """CGDP's resolved chunk size per device count, from the run's env.json
    (1, the runtime's default, where unknown)."""
    path = os.path.join(folder, results.ENV_FILE)
    if not os.path.exists(path):
        return {}
    env = results.read_json(path)
    sizes = env.get('cgdp_chunk_size') or {}
    return {int(n): int(size) for n, size in sizes.items()
            if size is not None}


def measure(net, counts, batch, image_size, iterations, warmup, out_dir,
            chunk_size=None, modes=MODES):
    """A short weak-scaling measurement of ``modes`` on CPU replicas, CGDP
    at ``chunk_size`` (``None``: the runtime's default chunks; ``'model'``:
    the cost model's choice).

    Uses :func:`experiments.weak_scaling.time_mode`, so the updaters, data
    and timing are the experiment's own.

    Returns:
        tuple: ``(summary rows, {N: resolved CGDP chunk size})``.
    """
    from experiments import weak_scaling
    settings = weak_scaling.Settings(image_size=image_size, batch=batch,
                                     iterations=iterations, warmup=warmup)
    args = argparse.Namespace(classes=1000, seed=0, chunk_size=chunk_size)
    runs = []
    chunk_sizes = {}
    os.makedirs(out_dir, exist_ok=True)
    for count in counts:
        specs = weak_scaling.device_specs_for('cpu', count)
        for mode in modes:
            seconds = []

            def on_step(index, elapsed, seconds=seconds):
                if index is not None:
                    seconds.append(elapsed)
            info = weak_scaling.time_mode(net, mode, specs, settings, args,
                                          None, on_step)
            if mode == results.CGDP:
                chunk_sizes[count] = info['chunk_size']
            for index, value in enumerate(seconds):
                runs.append(results.run_row(mode, count, batch, image_size,
                                            index, value))
            print('  measured {} N={}: median {:.3f} s'.format(
                mode, count, statistics.median(seconds)), flush=True)
    results.write_csv(os.path.join(out_dir, results.RUNS_FILE),
                      results.RUNS_COLUMNS, runs)
    summary = results.summarize(runs)
    results.write_csv(os.path.join(out_dir, results.SUMMARY_FILE),
                      results.SUMMARY_COLUMNS, summary)
    return summary, chunk_sizes


def cgdp_workers():
    """The worker kind ``CGDPUpdater`` runs by default (what the
    measurement's cgdp mode uses)."""
    import inspect
    from cgdp_chainer import CGDPUpdater
    parameter = inspect.signature(CGDPUpdater).parameters.get('workers')
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return 'thread'
    return parameter.default


def runtime_chunking(chunk_size, n_layers):
    """The cost model's name for the chunking a CGDP run used: its
    ``chunk_size`` (layers per chunk, at most the model's layers), or,
    where it had none, the runtime's default chunks of
    ``DEFAULT_CHUNK_BYTES``."""
    if chunk_size is None:
        from cgdp_chainer.runtime.chunks import chunking
        return ('bytes', chunking.DEFAULT_CHUNK_BYTES)
    return min(int(chunk_size), n_layers)


def predict_points(profile, summary, chunk_sizes, workers='process'):
    """Predicted seconds for every measured (mode, N) of the summary.

    Args:
        workers (str): CGDP's worker kind in the measurement.

    Returns:
        list of dict: Rows with :data:`COLUMNS` (``net`` left empty).
    """
    hw = hardware.get_hardware(hardware.CPU_PRESET, profile)
    rows = []
    for point in summary:
        mode, n = point['mode'], point['n_devices']
        if mode not in MODES or point.get('n_ranks', 1) != 1:
            continue
        batch = point['batch_per_device']
        size = None
        if mode == results.CGDP:
            size = runtime_chunking(chunk_sizes.get(n),
                                    len(profile['layers']))
        predicted, _ = costmodel.predict_mode(profile, hw, mode, n, batch,
                                              size, workers)
        closed, _ = costmodel.predict_mode(profile, hw, mode, n, batch,
                                           size, workers, method='closed')
        measured = point['median_s']
        rows.append({
            'net': None, 'mode': mode, 'n_devices': n,
            'batch_per_device': batch, 'image_size': point['image_size'],
            'chunk_size': None if size is None else
            costmodel.describe_chunking(size), 'measured_s': measured,
            'measured_iqr_s': point['iqr_s'], 'predicted_s': predicted,
            'closed_form_s': closed,
            'error': predicted / measured - 1.0})
    return rows


def common_scale_error(rows):
    """The error left once every prediction is divided by one factor.

    If the cores were busier (or quieter) while profiling than while
    measuring, every prediction is off by about the same factor; the
    median of the predicted/measured ratios estimates it, and what remains
    is the error of the model's shape across modes and device counts.

    Returns:
        tuple: ``(factor, median absolute error after dividing by it)``.
    """
    ratios = [row['predicted_s'] / row['measured_s'] for row in rows]
    factor = statistics.median(ratios)
    return factor, statistics.median(abs(r / factor - 1.0) for r in ratios)


def describe_profile(profile, batch):
    """One line on what the profile gives the model: a replica's compute
    with all cores and with one thread, the share of it that holds the GIL
    and the BLAS rate that share comes from."""
    hw = hardware.get_hardware(hardware.CPU_PRESET, profile)
    work = costmodel.build_workload(profile, hw, batch)
    compute = sum(work.forward_s) + sum(work.backward_s)
    text = 'one replica: forward + backward {:.3f} s'.format(compute)
    if work.busy_cores is not None:
        text += ' keeping {:.2f} cores busy'.format(work.busy_cores)
    if work.forward_1t_s is not None:
        one = sum(work.forward_1t_s) + sum(work.backward_1t_s)
        text += ' ({:.3f} s on one BLAS thread)'.format(one)
        if work.forward_gil_s is not None:
            gil = sum(work.forward_gil_s) + sum(work.backward_gil_s)
            text += ('; {:.3f} s of it outside BLAS, holding the GIL '
                     '({:.0%}; one thread multiplies at {:.0f} GFLOP/s)'
                     .format(gil, gil / one if one else 0.0,
                             profile['machine']['blas_1t_flops'] / 1e9))
    return text


def format_table(rows):
    """The validation table as text."""
    header = '{:<8} {:>3} {:>19} {:>10} {:>9} {:>10} {:>10} {:>8}'.format(
        'mode', 'N', 'chunk', 'measured', 'iqr', 'simulated', 'closed',
        'error')
    lines = [header, '-' * len(header)]
    for row in rows:
        lines.append(
            '{:<8} {:>3} {:>19} {:>9.3f}s {:>8.3f}s {:>9.3f}s {:>9.3f}s '
            '{:>+7.1%}'.format(
                row['mode'], row['n_devices'],
                row['chunk_size'] or '-',
                row['measured_s'], row['measured_iqr_s'],
                row['predicted_s'], row['closed_form_s'], row['error']))
    return '\n'.join(lines)


def build_parser():
    """The command line's parser."""
    from experiments import weak_scaling
    parser = cli.ArgumentParser(description='Compare the cost model with '
                                'weak-scaling measurements on this CPU.')
    parser.add_argument('--net', required=True, type=cli.net_spec)
    parser.add_argument('--results', default='results',
                        help='results root to search for summary.csv')
    parser.add_argument('--summary', default=None,
                        help='a summary.csv to compare with instead of '
                             'measuring now')
    parser.add_argument('--measure', action='store_true',
                        help='measure now (the default; kept for old '
                             'command lines)')
    parser.add_argument('--latest', action='store_true',
                        help='compare with the newest summary.csv under '
                             '--results instead of measuring now')
    parser.add_argument('--devices', type=weak_scaling.device_counts,
                        default=[1, 2, 4])
    parser.add_argument('--batch', type=cli.positive_int, default=None)
    parser.add_argument('--image-size', type=cli.positive_int, default=None)
    parser.add_argument('--iterations', type=cli.positive_int,
                        default=SHORT_ITERATIONS)
    parser.add_argument('--warmup', type=cli.non_negative_int,
                        default=SHORT_WARMUP)
    parser.add_argument('--reps', type=cli.positive_int,
                        default=PROFILE_REPS,
                        help='profile repetitions (median; default {})'
                        .format(PROFILE_REPS))
    parser.add_argument('--statistic', choices=('min', 'median'),
                        default='median',
                        help='how the profile summarises its repetitions '
                             '(default median, as the measured iteration '
                             'times are medians; min: the least disturbed '
                             'run, a lower bound)')
    parser.add_argument('--out', default=None,
                        help='table CSV (default results/costmodel/'
                             'validation_<net>.csv)')
    return parser


def check_arguments(args):
    """Checks the network and every path before the first measurement;
    returns the table's path."""
    from experiments import weak_scaling
    cli.check_net(args.net, 1000, args.image_size or weak_scaling.defaults_for(
        args.net, 'cpu').image_size)
    out = args.out or os.path.join(OUT_DIR, 'validation_{}.csv'.format(
        args.net))
    cli.check_output_file('--out', out)
    cli.check_output_file('the profile', profile_module.default_path(
        args.net, '@numpy', 1, 1))
    if args.summary is not None and not os.path.isfile(args.summary):
        cli.fail('no such summary file: {}'.format(args.summary))
    if args.summary is not None and (args.latest or args.measure):
        cli.fail('--summary compares with a given run; it cannot be '
                 'combined with --latest or --measure')
    return out


def summary_to_compare(args):
    """The summary.csv to compare with (``--summary``, or the newest with
    ``--latest``), or ``None`` to measure now."""
    if not args.latest:
        return args.summary
    path = newest_summary(args.results, args.net)
    if path is None:
        cli.fail('--latest: no {}/{}/*/{} (run make experiment NET={} '
                 'first, or leave --latest out to measure now)'.format(
                     args.results, args.net, results.SUMMARY_FILE,
                     args.net))
    return path


def read_summary(args, summary_path):
    """The single-process typical and CGDP rows of an earlier run at the
    device counts asked for, and its CGDP chunk sizes.

    Returns:
        tuple: ``(summary rows, {N: CGDP chunk size})``.
    """
    if not os.path.exists(summary_path):
        cli.fail('no such summary file: {}'.format(summary_path))
    summary = [row for row in results.read_csv(summary_path)
               if row['mode'] in MODES and row['n_devices'] in
               args.devices and (row.get('n_ranks') or 1) == 1]
    if not summary:
        cli.fail('{} has no single-process typical or cgdp rows for N '
                 'in {} (a run under MPI has only multi-rank rows: '
                 'compare with a plain make experiment NET={}, or '
                 'measure with --measure)'.format(
                     summary_path, args.devices, args.net))
    chunk_sizes = chunk_sizes_of_run(os.path.dirname(summary_path))
    print('comparing with {}'.format(summary_path))
    return summary, chunk_sizes


def measure_now(args, workers):
    """Measures typical and CGDP at the runtime's chunks, then CGDP at the
    cost model's choice, in this sitting.

    Args:
        args (argparse.Namespace): The command line.
        workers (str): CGDP's worker kind (for the message).

    Returns:
        tuple: ``(summary rows, {N: CGDP chunk size}, (the model's
        choice's summary rows, {N: its chunk size}))``.
    """
    from experiments import weak_scaling
    defaults = weak_scaling.defaults_for(args.net, 'cpu')
    batch = args.batch or defaults.batch
    image_size = args.image_size or defaults.image_size
    cli.check_image_size(args.net, image_size)
    out_dir = os.path.join(OUT_DIR, 'validation', args.net)
    cli.check_output_folder('the measurement folder', out_dir)
    print('measuring {} in this sitting: typical and CGDP ({} workers) '
          'at N={} (batch {}, {} px, {} iterations after {} warm-up) '
          'into {}, then profiling'.format(
              args.net, workers, ','.join(map(str, args.devices)),
              batch, image_size, args.iterations, args.warmup, out_dir),
          flush=True)
    summary, chunk_sizes = measure(args.net, args.devices, batch,
                                   image_size, args.iterations,
                                   args.warmup, out_dir)
    print('measuring CGDP at the cost model\'s choice '
          "(chunk_size='model')", flush=True)
    choice = measure(args.net, args.devices, batch, image_size,
                     args.iterations, args.warmup,
                     os.path.join(out_dir, 'model_choice'),
                     chunk_size='model', modes=(results.CGDP,))
    return summary, chunk_sizes, choice


def one_setting(summary):
    """The summary's one batch per device and image size; fails if it
    mixes several."""
    batches = {row['batch_per_device'] for row in summary}
    sizes = {row['image_size'] for row in summary}
    if len(batches) != 1 or len(sizes) != 1:
        cli.fail('the summary mixes batch sizes {} or image sizes {}; '
                 'validate one setting at a time'.format(sorted(batches),
                                                         sorted(sizes)))
    return batches.pop(), sizes.pop()


def profile_now(args, batch, image_size):
    """Profiles the network on one ``@numpy`` replica and saves the
    profile under ``results/profiles/``.

    Returns:
        tuple: ``(profile, its path)``.
    """
    from experiments import train
    print('profiling {} on one @numpy replica (batch {}, {} px, {} of {} '
          'reps)'.format(args.net, batch, image_size, args.statistic,
                         args.reps), flush=True)
    model = train.build_model(args.net, seed=0)
    profile = profile_module.profile_model(model, '@numpy', batch,
                                           image_size, reps=args.reps,
                                           statistic=args.statistic)
    profile['net'] = args.net
    profile_path = profile_module.default_path(args.net, '@numpy', batch,
                                               image_size)
    profile_module.save_profile(profile, profile_path)
    del model
    return profile, profile_path


def print_report(args, profile, rows, median_error, workers, batch):
    """Prints the table, the median error against the target and the
    error after one common scale factor."""
    print()
    print('{}: predicted (this-cpu preset, {} cores, CGDP with {} '
          'workers) against measured iteration times'.format(
              args.net, profile['machine']['cores'], workers))
    print(describe_profile(profile, batch))
    print(format_table(rows))
    verdict = 'within' if median_error <= TARGET_MEDIAN_ERROR else 'MISSES'
    print('median absolute error: {:.1%} ({} the {:.0%} target)'.format(
        median_error, verdict, TARGET_MEDIAN_ERROR))
    scale, shape_error = common_scale_error(rows)
    print('after one common scale factor ({:.2f}, e.g. a different load on '
          'the shared cores while profiling than while measuring): median '
          'absolute error {:.1%}'.format(scale, shape_error))


def main(argv=None):
    args = build_parser().parse_args(argv)
    out = check_arguments(args)
    start = time.perf_counter()
    load_start = results.load_average()
    workers = cgdp_workers()

    summary_path = summary_to_compare(args)
    choice = ([], {})  # CGDP at the model's choice: measured only now
    if summary_path is not None:
        summary, chunk_sizes = read_summary(args, summary_path)
    else:
        summary, chunk_sizes, choice = measure_now(args, workers)
    batch, image_size = one_setting(summary)
    profile, profile_path = profile_now(args, batch, image_size)

    rows = predict_points(profile, summary, chunk_sizes, workers) + \
        predict_points(profile, choice[0], choice[1], workers)
    for row in rows:
        row['net'] = args.net
    median_error = statistics.median(abs(row['error']) for row in rows)
    os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
    results.write_csv(out, COLUMNS, rows)

    print_report(args, profile, rows, median_error, workers, batch)
    print('load average at start {} and end {}; profile {}; table {}'
          .format(_load(load_start), _load(results.load_average()),
                  profile_path, out))
    print('What the model leaves out: docs/COSTMODEL.md')
    print('({:.0f} s)'.format(time.perf_counter() - start))
    return 0


def _load(values):
    if not values:
        return '?'
    return '/'.join('{:.1f}'.format(v) for v in values)


if __name__ == '__main__':
    sys.exit(main())
