"""The optimizer form on one GPU: CGDP's multi-node optimizer against the
actual optimizer, ChainerMN's and the limit.

    python -m benchmarks.gpu_anyloop [--nets all] [--batches 64,16]
        [--image-size 224] [--device @cupy:0] [--iterations 4]
        [--warmup 1] [--rounds 2] [--ranks 1] [--out DIR]

``--ranks 1`` (the default): one rank on one device, in this process (a
singleton MPI process: mpi4py's ``COMM_WORLD`` of size 1, wrapped by
``chainermn.create_communicator('naive', comm)``). For each network and
batch, four runs are built, each on its own copy of the same initial
network (seed 0) with a fresh MomentumSGD, and then alternated round by
round (a GPU's speed drifts over minutes, so runs timed apart do not
compare):

- ``plain``: the actual optimizer's own loop,
  ``optimizer.update(model, x, t)``, no ChainerMN;
- ``chainermn``: ``chainermn.create_multi_node_optimizer(actual, comm)``;
- ``cgdp``: ``cgdp_chainer.create_multi_node_optimizer(actual, comm)``;
- ``limit``: forward and backward on a batch already on the device, no
  update (:func:`benchmarks.baseline.time_iterations`).

The batch is on the device before the first update. Each time is ms per
iteration: ``update()`` then a device synchronize, the median of the
measured iterations of every round, each round after ``--warmup`` untimed
iterations of each run (the first ``update()`` of every optimizer, which
for the multi-node ones only broadcasts rank 0's weights, is untimed too).
Printed per network and batch: the four times and the ratios
``plain/cgdp`` (goal >= 1.00), ``limit/cgdp`` (goal >= 0.95 at batch 64)
and ``chainermn/cgdp``.

``--ranks N`` (N >= 2): the same script under the project's mpiexec
(``$CGDP_MPIEXEC``, else the one next to this Python: see
``cgdp_chainer.mpi.find_mpiexec``; ``mpiexec -launcher fork -n N``),
every rank on ``--device`` (so all of them share one GPU), ``--batches``
per rank, ChainerMN against CGDP, alternated round
by round; an iteration takes the slowest rank's time. Where no mpiexec is
found, that part says so and is skipped. ``--ranks 1,2`` runs both parts.
ChainerMN's naive communicator hands CuPy device pointers to MPI, which
only a CUDA-aware MPI reads (MPICH's wheel is not one; 'pure_nccl' refuses
two ranks on one GPU): on a GPU, the ranks' ChainerMN runs use
:mod:`cgdp_chainer.mpi.host_staged`, the naive communicator with its
arrays staged through host memory, the only way ChainerMN runs there (its
copies count in its time). CGDP's runs reduce host arrays either way.

``--device @numpy`` runs all of it on the CPU (the CI test runs it tiny).
``--out DIR`` writes ``gpu_anyloop.csv`` (one row per network and batch),
``gpu_anyloop_ranks.csv`` and ``gpu_anyloop.json`` (all of it, with the
device). Bad options exit with status 2 and one ``error:`` line.
"""
from experiments import cli  # NOQA: first: one-line errors, quiet imports

import models  # NOQA: before Chainer, so cgdp_chainer._compat runs first

import argparse
import collections
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import chainer
from chainer.dataset import convert

import cgdp_chainer
from benchmarks import gpu
from cgdp_chainer import devices as devices_module
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer.runtime import multi_node_optimizer
from experiments import results
from experiments import train
from experiments import weak_scaling

RUNS = ('plain', 'chainermn', 'cgdp', 'limit')
# The runs of the --ranks N >= 2 part (every rank runs each).
RANK_RUNS = ('chainermn', 'cgdp')
# The ratios: name -> (numerator run, denominator run); each is the
# numerator's time over CGDP's.
RATIOS = collections.OrderedDict([
    ('plain_vs_cgdp', ('plain', 'cgdp')),
    ('limit_vs_cgdp', ('limit', 'cgdp')),
    ('chainermn_vs_cgdp', ('chainermn', 'cgdp'))])
# Goals: plain/cgdp at every batch; limit/cgdp per batch.
PLAIN_GOAL = 1.00
LIMIT_GOALS = {64: 0.95}
N_CLASSES = gpu.N_CLASSES
# Sized so that the four networks at batch 64 and 16 (about 35 updates
# per network and batch at 64: VGG-16 ~0.37 s, ResNet-152 ~0.64 s each on
# an H200), with the start-ups, finish within 4 minutes.
CSV_FILE = 'gpu_anyloop.csv'
RANKS_CSV_FILE = 'gpu_anyloop_ranks.csv'
JSON_FILE = 'gpu_anyloop.json'
# Rank 0 of a --ranks job prints each row as this marker and a JSON object.
ROW_MARKER = 'ANYLOOP-ROW '
# The variables an MPI process (a singleton one too) may hold: the job
# launched from here must not take itself for part of this process's.
MPI_VARIABLE_PREFIXES = ('PMI_', 'PMIX_', 'OMPI_', 'HYDRA_', 'MPI_LOCAL')
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summary_columns():
    """The columns of ``gpu_anyloop.csv``, in order."""
    return (['net', 'image_size', 'batch'] +
            ['{}_ms'.format(run) for run in RUNS] + list(RATIOS))


def ranks_columns():
    """The columns of ``gpu_anyloop_ranks.csv``, in order."""
    return (['net', 'image_size', 'batch', 'ranks'] +
            ['{}_ms'.format(run) for run in RANK_RUNS] +
            ['chainermn_vs_cgdp'])


class LoopRun(object):
    """A training loop timed: ``optimizer.update(model, x, t)`` then a
    device synchronize.

    Args:
        model (chainer.Link): The classifier, on the device, set up with
            ``optimizer``.
        optimizer: The actual optimizer or a multi-node one around it.
        batch (tuple): ``(x, t)``, already on the device.
        gpus (list): The GPUs to wait for after each update (empty on the
            CPU).
    """

    def __init__(self, model, optimizer, batch, gpus):
        self.model = model
        self.optimizer = optimizer
        self.batch = batch
        self.gpus = gpus

    def _update(self):
        self.optimizer.update(self.model, *self.batch)
        # GPU only (CuPy 14's cupy.cuda.Device.synchronize; untested
        # here): the clock covers the kernels, not only their launch.
        weak_scaling.synchronize(self.gpus)

    def start(self):
        """The first update, untimed: the multi-node optimizers broadcast
        rank 0's weights in it and take no step (CGDP forms its chunks)."""
        self._update()

    def timed(self, warmup, iterations):
        """Seconds of each of ``iterations`` updates after ``warmup``."""
        for _ in range(warmup):
            self._update()
        seconds = []
        for _ in range(iterations):
            start = time.perf_counter()
            self._update()
            seconds.append(time.perf_counter() - start)
        return seconds

    def close(self):
        """Stops CGDP's host threads (the other optimizers hold none)."""
        if isinstance(self.optimizer,
                      multi_node_optimizer.MultiNodeOptimizer):
            self.optimizer.close()


def make_optimizer(run, communicator):
    """MomentumSGD, as benchmarks.gpu's runs use, wrapped for ``run``.

    Args:
        run (str): ``'plain'``, ``'chainermn'`` or ``'cgdp'``.
        communicator: The ChainerMN communicator (unused by ``plain``).
    """
    actual = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    if run == 'plain':
        return actual
    if run == 'cgdp':
        return cgdp_chainer.create_multi_node_optimizer(actual,
                                                        communicator)
    import chainermn
    return chainermn.create_multi_node_optimizer(actual, communicator)


def device_batch(device, image_size, batch):
    """``batch`` synthetic examples (seed 0) as ``(x, t)`` on ``device``."""
    examples = weak_scaling.synthetic_examples(batch, image_size, N_CLASSES,
                                               seed=0)
    return convert.concat_examples(examples, device)


def build_runs(names, net, spec, batch, image_size, communicator):
    """The runs ``names`` of one network and batch, each on its own copy
    of the same initial network with its own optimizer, started.

    Returns:
        collections.OrderedDict: Run name -> run.
    """
    device = devices_module.parse_device(spec)
    gpus = [device] if devices_module.is_gpu(device) else []
    base = train.build_model(net, n_classes=N_CLASSES, seed=0)
    runs = collections.OrderedDict()
    try:
        if any(name != 'limit' for name in names):
            data = device_batch(device, image_size, batch)
        for name in names:
            if name == 'limit':
                runs[name] = gpu.LimitRun(copy.deepcopy(base), device,
                                          image_size, batch)
                continue
            model = copy.deepcopy(base)
            model.to_device(device)
            optimizer = make_optimizer(name, communicator)
            optimizer.setup(model)
            runs[name] = LoopRun(model, optimizer, data, gpus)
            runs[name].start()
    except BaseException:
        gpu.close_runs(runs)
        raise
    return runs


def measured_seconds(names, net, batch, args, communicator):
    """Builds, alternates and closes the runs ``names`` of one network and
    batch; returns each run's measured seconds."""
    runs = build_runs(names, net, args.device, batch, args.image_size,
                      communicator)
    try:
        return gpu.alternate(runs, args.rounds, args.warmup,
                             args.iterations)
    finally:
        gpu.close_runs(runs)
        del runs
        # CuPy 14's memory pools (no-op on the CPU).
        weak_scaling.free_gpu_memory([args.device])


def summary_row(net, image_size, batch, seconds):
    """One row of ``gpu_anyloop.csv`` from each run's seconds."""
    medians = {run: statistics.median(seconds[run]) for run in RUNS}
    row = {'net': net, 'image_size': image_size, 'batch': batch}
    for run in RUNS:
        row['{}_ms'.format(run)] = 1e3 * medians[run]
    for ratio, (numerator, denominator) in RATIOS.items():
        row[ratio] = medians[numerator] / medians[denominator]
    return row


def ranks_row(net, image_size, batch, ranks, seconds):
    """One row of ``gpu_anyloop_ranks.csv`` from the job's seconds (per
    iteration, the slowest rank's)."""
    medians = {run: statistics.median(seconds[run]) for run in RANK_RUNS}
    row = {'net': net, 'image_size': image_size, 'batch': batch,
           'ranks': ranks}
    for run in RANK_RUNS:
        row['{}_ms'.format(run)] = 1e3 * medians[run]
    row['chainermn_vs_cgdp'] = medians['chainermn'] / medians['cgdp']
    return row


def goal_misses(row):
    """The goals a row misses, in words (none where no goal applies)."""
    misses = []
    if row['plain_vs_cgdp'] < PLAIN_GOAL:
        misses.append('plain/cgdp {:.3f} < {:.2f}'.format(
            row['plain_vs_cgdp'], PLAIN_GOAL))
    limit_goal = LIMIT_GOALS.get(row['batch'])
    if limit_goal is not None and row['limit_vs_cgdp'] < limit_goal:
        misses.append('limit/cgdp {:.3f} < {:.2f}'.format(
            row['limit_vs_cgdp'], limit_goal))
    return misses


TABLE_HEADER = ('{:<10} {:>5} {:>10} {:>10} {:>10} {:>10} | {:>10} '
                '{:>10} {:>12}').format(
    'network', 'batch', 'plain', 'chainermn', 'cgdp', 'limit',
    'plain/cgdp', 'limit/cgdp', 'chainermn/cgdp')
RANKS_HEADER = '{:<10} {:>5} {:>5} {:>10} {:>10} | {:>14}'.format(
    'network', 'batch', 'ranks', 'chainermn', 'cgdp', 'chainermn/cgdp')


def format_row(row):
    """A row of the printed table: ms per run, then the ratios."""
    times = [row['{}_ms'.format(run)] for run in RUNS]
    ratios = [row[ratio] for ratio in RATIOS]
    return ('{:<10} {:>5} ' + '{:>10.2f} ' * 4 + '| {:>10.3f} {:>10.3f} '
            '{:>12.3f}').format(row['net'], row['batch'], *(times + ratios))


def format_ranks_row(row):
    """A row of the printed table of the --ranks N >= 2 part."""
    return '{:<10} {:>5} {:>5} {:>10.2f} {:>10.2f} | {:>14.3f}'.format(
        row['net'], row['batch'], row['ranks'], row['chainermn_ms'],
        row['cgdp_ms'], row['chainermn_vs_cgdp'])


# ------------------------------------------------------------ command line

def rank_counts(text):
    """argparse type: comma-separated rank counts (1: this process)."""
    items = [item.strip() for item in text.split(',') if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError('no rank count in {!r}'.format(
            text))
    counts = [cli.positive_int(item) for item in items]
    return sorted(set(counts))


def build_parser():
    """The command line's parser."""
    parser = cli.ArgumentParser(prog='python -m benchmarks.gpu_anyloop',
                                description=__doc__.splitlines()[0])
    gpu.add_sizes_and_rounds(parser, cpu_words='for the CPU',
                             batch_words=' per rank')
    parser.add_argument('--ranks', type=rank_counts, default=[1],
                        help='comma-separated: 1 (default) for one rank '
                             'in this process, N >= 2 for an MPI job of N '
                             'ranks on the one device')
    parser.add_argument('--out', default=None,
                        help='folder for the CSV and JSON results')
    # Set by the benchmark on the ranks it launches under mpiexec.
    parser.add_argument('--rank-job', action='store_true',
                        help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None):
    """Parses and checks every option before anything is built; exits
    with 2 on bad input."""
    return gpu.parse_args(argv, build_parser())


class BenchmarkFailed(RuntimeError):
    """A part cannot run or its MPI job failed (the message says why)."""


def chainermn_communicator(device):
    """ChainerMN's naive communicator over ``COMM_WORLD`` (MPI started
    with thread support; a singleton where no launcher started us), host
    staged where several ranks reduce GPU arrays (see the module)."""
    if importlib.util.find_spec('mpi4py') is None:
        raise BenchmarkFailed(
            'mpi4py is not installed: the chainermn and cgdp runs need an '
            'MPI communicator (pip install -e .[mpi], or mpi4py against the '
            "machine's MPI)")
    MPI = cgdp_mpi.init_mpi()
    if MPI.COMM_WORLD.size > 1 and devices_module.is_gpu(
            chainer.get_device(device)):
        from cgdp_chainer.mpi import host_staged
        return host_staged.create_host_staged_communicator(MPI.COMM_WORLD)
    import chainermn
    return chainermn.create_communicator('naive', MPI.COMM_WORLD)


# ------------------------------------------------------ the --ranks N part

def mpiexec_path():
    """The project's mpiexec (:func:`cgdp_chainer.mpi.find_mpiexec`), or
    None where there is none.

    Raises:
        BenchmarkFailed: ``$CGDP_MPIEXEC`` names no executable file.
    """
    try:
        return cgdp_mpi.find_mpiexec()
    except FileNotFoundError as error:
        raise BenchmarkFailed(str(error))


def rank_job_command(mpiexec, ranks, net, batch, args):
    """The command line of one --ranks job: this module on ``ranks``
    local ranks, for one network and batch."""
    return [mpiexec, '-launcher', 'fork', '-n', str(ranks),
            sys.executable, '-m', 'benchmarks.gpu_anyloop', '--rank-job',
            '--nets', net, '--batches', str(batch), '--image-size',
            str(args.image_size), '--device', args.device, '--iterations',
            str(args.iterations), '--warmup', str(args.warmup), '--rounds',
            str(args.rounds)]


def rank_job_environment():
    """This environment without MPI's variables, the repository first on
    the path (the ranks import this module)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(MPI_VARIABLE_PREFIXES) and
           key not in cgdp_mpi.LAUNCH_VARIABLES}
    env['PYTHONPATH'] = os.pathsep.join(
        [REPO_ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    return env


def run_rank_job(command):
    """Runs one --ranks job, passing its output on; returns the rows that
    rank 0 printed.

    Raises:
        BenchmarkFailed: The job failed (its output above says why).
    """
    process = subprocess.Popen(command, cwd=REPO_ROOT,
                               env=rank_job_environment(),
                               stdout=subprocess.PIPE, text=True)
    rows = []
    with process.stdout:
        for line in process.stdout:
            if line.startswith(ROW_MARKER):
                rows.append(json.loads(line[len(ROW_MARKER):]))
            else:
                sys.stdout.write(line)
    status = process.wait()
    if status != 0:
        raise BenchmarkFailed('the {}-rank job exited with status {}'.format(
            command[4], status))
    return rows


def rank_job(args):
    """One rank of a --ranks job: ChainerMN and CGDP alternated on every
    network and batch; rank 0 prints each row (collective)."""
    communicator = chainermn_communicator(args.device)
    with cgdp_mpi.abort_on_exception(communicator):
        from benchmarks import mpi_ranks
        for net in args.nets:
            for batch in args.batches:
                seconds = measured_seconds(RANK_RUNS, net, batch, args,
                                           communicator)
                slowest = {run: mpi_ranks.job_seconds(
                    seconds[run], communicator.mpi_comm)
                    for run in RANK_RUNS}
                if communicator.rank == 0:
                    row = ranks_row(net, args.image_size, batch,
                                    communicator.size, slowest)
                    print(ROW_MARKER + json.dumps(row), flush=True)


def measure_ranks(ranks, args, report):
    """The --ranks N part: one MPI job per network and batch (each starts
    from a fresh GPU context); adds its rows to ``report``."""
    mpiexec = mpiexec_path()
    if mpiexec is None:
        print('{}: the {}-rank part is skipped'.format(
            cgdp_mpi.no_mpiexec_words(), ranks), flush=True)
        report['skipped'].append('{} ranks: no mpiexec'.format(ranks))
        return
    print('{} ranks on {}, ChainerMN (naive, host staged on a GPU) against '
          'CGDP; per iteration '
          'the slowest rank\'s ms'.format(ranks, args.device), flush=True)
    print(RANKS_HEADER, flush=True)
    for net in args.nets:
        for batch in args.batches:
            for row in run_rank_job(rank_job_command(mpiexec, ranks, net,
                                                     batch, args)):
                report['rank_rows'].append(row)
                print(format_ranks_row(row), flush=True)
            write_partial(args, report)


# ------------------------------------------------------------ the report

def write_results(out, report):
    """Writes the report's tables and the whole report under ``out``."""
    os.makedirs(out, exist_ok=True)
    results.write_csv(os.path.join(out, CSV_FILE), summary_columns(),
                      report['rows'])
    results.write_csv(os.path.join(out, RANKS_CSV_FILE), ranks_columns(),
                      report['rank_rows'])
    results.write_json(os.path.join(out, JSON_FILE), report)


def write_partial(args, report):
    """Writes what there is so far (kept if a time limit cuts the run)."""
    if args.out is not None:
        write_results(args.out, report)


def measure_one_rank(args, report):
    """The --ranks 1 part: the four runs in this process; adds its rows
    and missed goals to ``report``."""
    communicator = chainermn_communicator(args.device)
    print('1 rank (a singleton MPI process); ms per iteration', flush=True)
    print(TABLE_HEADER, flush=True)
    for net in args.nets:
        for batch in args.batches:
            seconds = measured_seconds(RUNS, net, batch, args, communicator)
            row = summary_row(net, args.image_size, batch, seconds)
            report['rows'].append(row)
            print(format_row(row), flush=True)
            misses = goal_misses(row)
            if misses:
                report['misses']['{} batch {}'.format(net, batch)] = misses
            write_partial(args, report)


def print_goals(report):
    """Prints the goals the rows miss, or that all are met."""
    if not report['rows']:
        return
    if not report['misses']:
        print('goals: all met (plain/cgdp >= {:.2f}; limit/cgdp {})'.format(
            PLAIN_GOAL, ', '.join('batch {} >= {}'.format(b, g)
                                  for b, g in LIMIT_GOALS.items())))
        return
    for where, misses in report['misses'].items():
        print('goal missed, {}: {}'.format(where, '; '.join(misses)))


def main(argv=None):
    """Command-line entry point.

    Args:
        argv (list of str or None): Arguments; ``None`` reads ``sys.argv``.

    Returns:
        dict or None: The report (None on a rank of a --ranks job):
        ``settings``, ``device``, ``rows`` (:func:`summary_columns`),
        ``rank_rows`` (:func:`ranks_columns`), ``misses`` and ``skipped``.
    """
    args = parse_args(argv)
    if args.rank_job:
        rank_job(args)
        return None
    began = time.perf_counter()
    report = {'settings': dict(vars(args)),
              'device': gpu.describe_device(args.device), 'rows': [],
              'rank_rows': [], 'misses': {}, 'skipped': []}
    print(report['device'], flush=True)
    print('{} px; {} measured iterations x {} rounds after {} warm-up each '
          '(median)'.format(args.image_size, args.iterations, args.rounds,
                            args.warmup), flush=True)
    for ranks in args.ranks:
        if ranks == 1:
            measure_one_rank(args, report)
        else:
            measure_ranks(ranks, args, report)
    print_goals(report)
    write_partial(args, report)
    if args.out is not None:
        print('results in {}'.format(args.out))
    print('({:.0f} s)'.format(time.perf_counter() - began), flush=True)
    return report


if __name__ == '__main__':
    try:
        main()
    except BenchmarkFailed as error:  # a job's tracebacks are above it
        sys.stderr.write('error: {}\n'.format(error))
        sys.exit(1)
