"""CGDP against Chainer's StandardUpdater and the limit, on one GPU.

    python -m benchmarks.gpu [--nets all] [--batches 64,16]
        [--image-size 224] [--device @cupy:0] [--iterations 4]
        [--warmup 1] [--rounds 2] [--no-model] [--profile-reps 3]
        [--out DIR]

For each network and batch, at N = 1 replica, four runs are built once and
then alternated round by round (a GPU's speed drifts by up to 30% over
minutes, so runs timed apart do not compare):

- ``standard``: Chainer's StandardUpdater on the device;
- ``cgdp-process`` and ``cgdp-thread``: CGDPUpdater(devices=[device])
  with ``workers='process'`` and ``'thread'``, timed inside
  ``unattended()`` as the weak-scaling experiment does;
- ``limit``: forward and backward on a batch already on the device, with
  no update (:func:`benchmarks.baseline.time_iterations`): what CGDP at
  N = 1 costs if the input and the host update were fully hidden.

Each is ms per iteration: ``update()`` then a device synchronize (for the
limit, the forward and the backward, each synchronized), the median of the
measured iterations of every round; each round first runs ``--warmup``
untimed iterations of each run. Printed per network and batch: the four
times, CGDP's speedup (Standard's time / CGDP's, goal >= 1.00, and
>= 1.3 for AlexNet at batch 64), CGDP against the limit (the limit's time
/ CGDP's, goal >= 0.95 at batch 64, >= 0.90 at batch 16), and CGDP's
iteration broken down from its timeline (replica 0's events, medians):
``input`` (from ``update()``'s start to the forward's: the batch, its
hand-over and copy), ``forward``, ``backward`` (to the last chunk's
hand-over) and ``tail`` (from there until ``update()`` returns: the last
chunk's reduce, update and publish).

The cost model's check (:mod:`benchmarks.gpu_model`; ``--no-model``
leaves it out), in the same sitting,
profiles each network per layer on the device, predicts Standard's and
CGDP's times at N = 1 against the measured ones, and, from the measured
link (page-locked and pageable copies) and host figures, the weak-scaling
efficiency of 2, 4 and 8 such devices.

``--device @numpy`` runs all of it on the CPU (the CI test runs it tiny).
``--out DIR`` writes ``gpu_benchmark.csv`` (one row per network and
batch), ``gpu_model.csv``, ``gpu_scaling.csv`` and ``gpu_benchmark.json``
(all of it, with the device and the link). Bad options exit with status 2
and one ``error:`` line.
"""
from experiments import cli  # NOQA: first: one-line errors, quiet imports

import models  # NOQA: before Chainer, so cgdp_chainer._compat runs first

import argparse
import collections
import contextlib
import copy
import os
import platform
import statistics
import time

import chainer
import numpy

from benchmarks import baseline
from benchmarks import gpu_model
from cgdp_chainer import devices as devices_module
from cgdp_chainer import timeline as timeline_module
from experiments import results
from experiments import train
from experiments import weak_scaling

RUNS = ('standard', 'cgdp-process', 'cgdp-thread', 'limit')
# CGDP's runs and their worker kinds.
CGDP_RUNS = collections.OrderedDict([('cgdp-process', 'process'),
                                     ('cgdp-thread', 'thread')])
BREAKDOWN = ('input', 'forward', 'backward', 'tail')
N_CLASSES = 1000
# Defaults sized so that the four networks at batch 64 and 16 (about 5 s
# per iteration of all runs at 64 on an H200, a third of it at 16),
# start-ups and the model's profiles finish within 4 minutes.
DEFAULT_BATCHES = (64, 16)
DEFAULT_ITERATIONS = 4
DEFAULT_WARMUP = 1
DEFAULT_ROUNDS = 2
# The goals, per batch: speedup (Standard / CGDP) and CGDP against the
# limit (limit / CGDP); AlexNet at batch 64 has a speedup goal of its own.
SPEEDUP_GOAL = 1.00
SPEEDUP_GOALS = {('alexnet', 64): 1.3}
LIMIT_GOALS = {64: 0.95, 16: 0.90}
CSV_FILE = 'gpu_benchmark.csv'
JSON_FILE = 'gpu_benchmark.json'


def run_column(run):
    """The name of a run's column (``cgdp-process`` -> ``cgdp_process``)."""
    return run.replace('-', '_')


def summary_columns():
    """The columns of ``gpu_benchmark.csv``, in order."""
    columns = ['net', 'image_size', 'batch']
    columns += ['{}_ms'.format(run_column(run)) for run in RUNS]
    for run in CGDP_RUNS:
        columns += ['speedup_{}'.format(CGDP_RUNS[run]),
                    'vs_limit_{}'.format(CGDP_RUNS[run])]
    for run in CGDP_RUNS:
        columns += ['{}_{}_ms'.format(CGDP_RUNS[run], part)
                    for part in BREAKDOWN]
    return columns


class UpdaterRun(object):
    """An updater timed in blocks: ``update()`` then a device synchronize.

    Args:
        updater: The updater (finalized by :meth:`close`).
        gpus (list): The GPUs to wait for after each update (empty on the
            CPU).
        timeline (cgdp_chainer.Timeline or None): CGDP's, whose measured
            iterations :attr:`measured` lists.
    """

    def __init__(self, updater, gpus, timeline=None):
        self.updater = updater
        self.gpus = gpus
        self.timeline = timeline
        self.measured = []

    def _update(self):
        self.updater.update()
        weak_scaling.synchronize(self.gpus)

    def start(self):
        """The first update (start-up, plan), untimed, and more while a
        chunk size search goes on."""
        self._update()
        while weak_scaling.chunk_search_running(self.updater):
            self._update()

    def timed(self, warmup, iterations):
        """Seconds of each of ``iterations`` updates after ``warmup``."""
        unattended = getattr(self.updater, 'unattended',
                             contextlib.nullcontext)
        with unattended():
            for _ in range(warmup):
                self._update()
            seconds = []
            for _ in range(iterations):
                self.measured.append(self.updater.iteration)
                start = time.perf_counter()
                self._update()
                seconds.append(time.perf_counter() - start)
        return seconds

    def close(self):
        """Finalizes the updater (ends CGDP's workers)."""
        self.updater.finalize()


class LimitRun(object):
    """Forward and backward on a batch already on the device, no update.

    Args:
        classifier (models.Classifier): Its own copy of the network.
        device (chainer.backend.Device): Where it runs.
        image_size (int): Image side.
        batch (int): Images per pass.
    """

    def __init__(self, classifier, device, image_size, batch):
        classifier.to_device(device)
        self.classifier = classifier
        self.device = device
        self.image_size = image_size
        self.batch = batch

    def start(self):
        """Nothing to start: each block's first pass is untimed."""

    def timed(self, warmup, iterations):
        """Seconds of each of ``iterations`` passes after ``warmup``
        (:func:`benchmarks.baseline.time_iterations` leaves one pass
        untimed in any case)."""
        skip = max(0, warmup - 1)
        forward, backward = baseline.time_iterations(
            self.classifier, self.device, self.image_size, self.batch,
            skip + iterations)
        return [f + b for f, b in zip(forward, backward)][skip:]

    def close(self):
        """Drops the network's gradients."""
        self.classifier.cleargrads()


def build_runs(net, spec, batch, image_size):
    """The four runs of one network and batch, each on its own copy of
    the same initial network, started (first update done).

    Returns:
        collections.OrderedDict: Run name -> run.
    """
    device = devices_module.parse_device(spec)
    gpus = [device] if devices_module.is_gpu(device) else []
    base = train.build_model(net, n_classes=N_CLASSES, seed=0)
    examples = weak_scaling.synthetic_examples(2 * batch, image_size,
                                               N_CLASSES, seed=0)
    runs = collections.OrderedDict()
    try:
        for run in RUNS:
            if run == 'limit':
                runs[run] = LimitRun(copy.deepcopy(base), device,
                                     image_size, batch)
                continue
            runs[run] = _updater_run(run, copy.deepcopy(base), examples,
                                     spec, batch, gpus)
            runs[run].start()
    except BaseException:
        close_runs(runs)
        raise
    return runs


def _updater_run(run, model, examples, spec, batch, gpus):
    """StandardUpdater or CGDPUpdater (one replica) over ``examples``."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        examples, batch, repeat=True, shuffle=False)
    if run == 'standard':
        return UpdaterRun(train.build_updater('standard', iterator,
                                              optimizer, [spec]), gpus)
    timeline = timeline_module.Timeline()
    updater = train.build_updater('cgdp', iterator, optimizer, [spec],
                                  timeline=timeline,
                                  workers=CGDP_RUNS[run])
    return UpdaterRun(updater, gpus, timeline)


def close_runs(runs):
    """Closes every run, the first failure raised after all are closed."""
    failure = None
    for run in runs.values():
        try:
            run.close()
        except Exception as error:  # close the others first
            failure = failure or error
    if failure is not None:
        raise failure


def alternate(runs, rounds, warmup, iterations):
    """Times the runs round by round, each round every run in turn.

    Returns:
        dict: Run name -> seconds of all its measured iterations.
    """
    seconds = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            seconds[name] += run.timed(warmup, iterations)
    return seconds


def breakdown(timeline, iterations):
    """Median seconds of each part (:data:`BREAKDOWN`) of CGDP's measured
    iterations, from replica 0's events: they add up to each iteration's
    ``update()`` as the timeline saw it.

    Args:
        timeline (cgdp_chainer.Timeline): The run's.
        iterations (list of int): The measured iterations.

    Raises:
        RuntimeError: An iteration lacks its forward or backward events.
    """
    summaries = {s['iteration']: s for s in timeline.iteration_summaries}
    events = collections.defaultdict(list)
    for event in timeline.events:
        if event.device == 0:
            events[event.iteration].append(event)
    parts = {part: [] for part in BREAKDOWN}
    for iteration in iterations:
        forward = [e for e in events[iteration] if e.kind == 'forward']
        backward = [e for e in events[iteration] if e.kind == 'backward']
        if not forward or not backward or iteration not in summaries:
            raise RuntimeError('the timeline has no forward or backward of '
                               'replica 0 for iteration {}'.format(iteration))
        summary = summaries[iteration]
        forward_start = min(e.start for e in forward)
        forward_end = max(e.end for e in forward)
        backward_end = max(e.end for e in backward)
        parts['input'].append(forward_start - summary['start'])
        parts['forward'].append(forward_end - forward_start)
        parts['backward'].append(backward_end - forward_end)
        parts['tail'].append(summary['end'] - backward_end)
    return {part: statistics.median(values) for part, values in
            parts.items()}


def summary_row(net, image_size, batch, seconds, parts):
    """One row of ``gpu_benchmark.csv`` from the medians and CGDP's
    breakdowns (``{run: {part: seconds}}``)."""
    medians = {run: statistics.median(seconds[run]) for run in RUNS}
    row = {'net': net, 'image_size': image_size, 'batch': batch}
    for run in RUNS:
        row['{}_ms'.format(run_column(run))] = 1e3 * medians[run]
    for run, workers in CGDP_RUNS.items():
        row['speedup_{}'.format(workers)] = medians['standard'] / \
            medians[run]
        row['vs_limit_{}'.format(workers)] = medians['limit'] / medians[run]
        for part in BREAKDOWN:
            row['{}_{}_ms'.format(workers, part)] = 1e3 * parts[run][part]
    return row


def goal_misses(row):
    """The goals a row misses, in words (none where no goal applies)."""
    misses = []
    speedup_goal = SPEEDUP_GOALS.get((row['net'], row['batch']),
                                     SPEEDUP_GOAL)
    limit_goal = LIMIT_GOALS.get(row['batch'])
    for workers in CGDP_RUNS.values():
        speedup = row['speedup_{}'.format(workers)]
        if speedup < speedup_goal:
            misses.append('CGDP ({}) speedup {:.2f} < {:.2f}'.format(
                workers, speedup, speedup_goal))
        vs_limit = row['vs_limit_{}'.format(workers)]
        if limit_goal is not None and vs_limit < limit_goal:
            misses.append('CGDP ({}) / limit {:.2f} < {:.2f}'.format(
                workers, vs_limit, limit_goal))
    return misses


TABLE_HEADER = ('{:<10} {:>5} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7} | '
                '{:>7} {:>7} | {:>7} {:>7} {:>7} {:>7}').format(
    'network', 'batch', 'standard', 'process', 'thread', 'limit',
    'spd-p', 'spd-t', 'lim-p', 'lim-t', 'input', 'fwd', 'bwd', 'tail')


def format_row(row):
    """A row of the printed table: ms, ratios and the process run's
    breakdown (ms)."""
    times = [row['{}_ms'.format(run_column(run))] for run in RUNS]
    ratios = [row['speedup_process'], row['speedup_thread'],
              row['vs_limit_process'], row['vs_limit_thread']]
    parts = [row['process_{}_ms'.format(part)] for part in BREAKDOWN]
    return ('{:<10} {:>5} ' + '{:>9.1f} ' * 4 + '| {:>7.3f} {:>7.3f} | '
            '{:>7.3f} {:>7.3f} | ' + '{:>7.1f} ' * 3 + '{:>7.1f}').format(
                row['net'], row['batch'], *(times + ratios + parts))


def measure_one(net, batch, args):
    """Builds, alternates and closes the four runs of one network and
    batch; returns its row and CGDP's chunking per worker kind."""
    runs = build_runs(net, args.device, batch, args.image_size)
    try:
        seconds = alternate(runs, args.rounds, args.warmup,
                            args.iterations)
        parts = {run: breakdown(runs[run].timeline, runs[run].measured)
                 for run in CGDP_RUNS}
        chunking = {run: getattr(runs[run].updater, 'chunk_size', None)
                    for run in CGDP_RUNS}
    finally:
        close_runs(runs)
        del runs
        weak_scaling.free_gpu_memory([args.device])
    return summary_row(net, args.image_size, batch, seconds, parts), \
        chunking


def describe_device(spec):
    """The device and the software stack, in one line."""
    device = devices_module.parse_device(spec)
    return 'device: {}; chainer {}, numpy {}, python {}, {} CPU cores'.format(
        devices_module.describe(device), chainer.__version__,
        numpy.__version__, platform.python_version(), os.cpu_count())


def batch_list(text):
    """argparse type: comma-separated positive batch sizes."""
    items = [item.strip() for item in text.split(',') if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError('no batch size in {!r}'.format(
            text))
    return [cli.positive_int(item) for item in items]


def net_list(text):
    """argparse type: ``all`` or comma-separated networks (names of
    ``models.NETWORKS`` or ``module:callable``)."""
    if text.strip() == 'all':
        return list(models.NETWORKS)
    items = [item.strip() for item in text.split(',') if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError('no network in {!r}'.format(text))
    return [cli.net_spec(item) for item in items]


def add_sizes_and_rounds(parser, cpu_words='for the CPU stand-in',
                         batch_words=''):
    """The options that every GPU benchmark shares: what to measure (the
    networks, batches, image size, device) and how (iterations, warm-up,
    rounds)."""
    parser.add_argument('--nets', type=net_list, default=list(
        models.NETWORKS), help="'all' (default) or comma-separated "
        'networks (names, or module:callable)')
    parser.add_argument('--batches', type=batch_list,
                        default=list(DEFAULT_BATCHES),
                        help='comma-separated batch sizes{} (default '
                        '64,16)'.format(batch_words))
    parser.add_argument('--image-size', type=cli.positive_int, default=224)
    parser.add_argument('--device', type=cli.single_device,
                        default='@cupy:0',
                        help="'@cupy:N' (default @cupy:0), or '@numpy' "
                             + cpu_words)
    parser.add_argument('--iterations', type=cli.positive_int,
                        default=DEFAULT_ITERATIONS,
                        help='measured iterations per run and round')
    parser.add_argument('--warmup', type=cli.non_negative_int,
                        default=DEFAULT_WARMUP,
                        help='untimed iterations per run and round')
    parser.add_argument('--rounds', type=cli.positive_int,
                        default=DEFAULT_ROUNDS)


def build_parser():
    """The command line's parser."""
    parser = cli.ArgumentParser(prog='python -m benchmarks.gpu',
                                description=__doc__.splitlines()[0])
    add_sizes_and_rounds(parser)
    parser.add_argument('--no-model', action='store_true',
                        help='leave out the cost model\'s check')
    parser.add_argument('--profile-reps', type=cli.positive_int,
                        default=gpu_model.PROFILE_REPS,
                        help='repetitions of the cost model\'s profile')
    parser.add_argument('--out', default=None,
                        help='folder for the CSV and JSON results')
    return parser


def parse_args(argv=None, parser=None):
    """Parses and checks every option before anything is built; exits
    with 2 on bad input (``parser``: another benchmark's, with this one's
    shared options)."""
    args = (parser or build_parser()).parse_args(argv)
    args.device = args.device[0]
    for net in args.nets:
        cli.check_net(net, N_CLASSES, args.image_size)
    if args.out is not None:
        cli.check_output_folder('--out', args.out)
    return args


def write_results(out, report):
    """Writes the report's tables and the whole report under ``out``."""
    os.makedirs(out, exist_ok=True)
    results.write_csv(os.path.join(out, CSV_FILE), summary_columns(),
                      report['rows'])
    gpu_model.write_tables(out, report.get('model'))
    results.write_json(os.path.join(out, JSON_FILE), report)


def main(argv=None):
    """Command-line entry point.

    Args:
        argv (list of str or None): Arguments; ``None`` reads ``sys.argv``.

    Returns:
        dict: The report: ``settings``, ``device``, ``rows`` (one per
        network and batch, :func:`summary_columns`), ``misses`` and, with
        the model's check, ``model``.
    """
    args = parse_args(argv)
    began = time.perf_counter()
    print(describe_device(args.device), flush=True)
    print('{} px; N = 1 replica; {} measured iterations x {} rounds after '
          '{} warm-up each (median); ms per iteration'.format(
              args.image_size, args.iterations, args.rounds, args.warmup),
          flush=True)
    report = {'settings': {key: value for key, value in vars(args).items()},
              'device': describe_device(args.device), 'rows': [],
              'misses': {}}
    if not args.no_model:
        report['model'] = gpu_model.new_report()
    print(TABLE_HEADER, flush=True)
    for net in args.nets:
        for batch in args.batches:
            measure_and_model(net, batch, args, report)
            if args.out is not None:  # kept if a time limit cuts the run
                write_results(args.out, report)
            print('  ({:.0f} s so far)'.format(
                time.perf_counter() - began), flush=True)
    print_goals(report)
    if not args.no_model:
        gpu_model.print_report(report['model'])
    if args.out is not None:
        print('results in {}'.format(args.out))
    print('({:.0f} s)'.format(time.perf_counter() - began), flush=True)
    return report


def measure_and_model(net, batch, args, report):
    """Measures one network and batch, then (the model's check)
    profiles it and predicts, in the same sitting; adds both to
    ``report``."""
    row, chunking = measure_one(net, batch, args)
    report['rows'].append(row)
    print(format_row(row), flush=True)
    misses = goal_misses(row)
    if misses:
        report['misses']['{} batch {}'.format(net, batch)] = misses
    if not args.no_model:
        gpu_model.check(report['model'], net, batch, args.image_size,
                        args.device, row, chunking, args.profile_reps)


def print_goals(report):
    """Prints the goals the rows miss, or that all are met."""
    if not report['misses']:
        print('goals: all met (speedup >= {:.2f}, {}; CGDP / limit {})'
              .format(SPEEDUP_GOAL, ', '.join(
                  '{} batch {} >= {}'.format(n, b, g)
                  for (n, b), g in SPEEDUP_GOALS.items()), ', '.join(
                  'batch {} >= {}'.format(b, g)
                  for b, g in LIMIT_GOALS.items())))
        return
    for where, misses in report['misses'].items():
        print('goal missed, {}: {}'.format(where, '; '.join(misses)))


if __name__ == '__main__':
    main()
