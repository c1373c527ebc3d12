"""The paper's weak-scaling experiment: typical data parallel against CGDP.

``make experiment NET=resnet152`` runs::

    python -m experiments.weak_scaling --net resnet152 [--devices 1,2,4]
        [--batch B] [--image-size S] [--iterations I] [--warmup W]
        [--chunk-size C] [--out ROOT]

For every device count N and every mode it trains the network on synthetic
data with a fixed batch per device (weak scaling: the global batch grows
with N), runs ``--warmup`` iterations, then times ``--iterations`` calls of
``updater.update()`` one by one. The modes (see :data:`MODES`):

- ``typical``: Chainer's ``ParallelUpdater`` (``StandardUpdater`` for one
  device), the baseline of the paper.
- ``nccl``: Chainer's ``MultiprocessParallelUpdater``; only with two or more
  GPUs and NCCL, otherwise skipped with a note.
- ``cgdp``: :class:`cgdp_chainer.CGDPUpdater`.
- ``chainermn``: ChainerMN's data parallel training, one device per rank
  (only under MPI, at N=1): the multi-node baseline.

Every mode starts from the same weights (the same seed) and sees the same
batches. Without GPUs the replicas are ``'@numpy'`` CPU replicas and the
defaults shrink (see :data:`CPU_DEFAULTS`) so the run fits a small machine.

The results go to ``ROOT/<net>/<run-id>/`` (``ROOT`` defaults to
``results``; the schema is in :mod:`experiments.results`): ``runs.csv``
(written row by row), ``summary.csv``, ``timeline.csv`` (one measured CGDP
iteration at the largest N), ``env.json`` and the figures of
:mod:`experiments.plot`. ``--net all`` runs the four networks and adds
``ROOT/all/<run-id>/efficiency_all.png``. Ctrl-C stops after writing what
finished, and draws the figures from that.

Under MPI (``make experiment NET=alexnet RANKS=2``, which runs
``mpiexec -launcher fork -n 2 python -m experiments.weak_scaling ...``) the
R ranks run the multi-rank modes together: ``cgdp`` with N local replicas
per rank and ``mpi_comm=MPI.COMM_WORLD``, and ``chainermn`` at N=1. The
single-process modes (``typical``, ``nccl``) are not run: their rows come
from a plain ``make experiment``. The batch per device stays the same, so
the global batch is R x N x batch. Each rank trains on its own share of the
synthetic data; an iteration's time is the maximum over the ranks (every
rank measures its ``update()``, then an all-reduce takes the maximum), and
rows carry ``n_ranks=R``. Only rank 0 writes files and figures and prints;
an exception on any rank aborts the whole job, and after Ctrl-C rank 0
writes what finished and then ends every rank.
"""
import collections
import gc
import multiprocessing
import os
import signal
import sys
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

import chainer
from chainer.training.updaters import MultiprocessParallelUpdater
import numpy

from cgdp_chainer import datasets
from cgdp_chainer import devices as devices_module
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer import Timeline
from experiments import plot
from experiments import results
from experiments import train
import models

ALL = results.ALL_NETS
DEFAULT_DEVICE_COUNTS = (1, 2, 4)
DEFAULT_OUT = 'results'
EXIT_INTERRUPTED = 130

# Under MPI, after Ctrl-C: how long the other ranks wait for rank 0 to write
# what finished and end the job, before they end it themselves.
MPI_INTERRUPT_GRACE_SECONDS = 60.0

# Budget of the CPU defaults: `make experiment NET=resnet152` without a GPU
# must finish within 15 minutes on a 2-core machine (set-up excluded).
CPU_BUDGET_SECONDS = 15 * 60

# Forward + backward seconds per image of each network on one '@numpy'
# replica at 64 px, measured on the project's 2-core AMD EPYC machine with
# batch 4 (ResNet-152: 0.55 s per batch). Only used to estimate run times.
CPU_SECONDS_PER_IMAGE_64PX = {
    'alexnet': 0.035,
    'googlenet': 0.038,
    'vgg16': 0.20,
    'resnet152': 0.14,
}

# What an iteration costs beyond forward + backward on CPU replicas: the
# gradient reduction, the optimizer update and the parameter copies (about
# 30% for ResNet-152; more for VGG-16's 138M parameters).
CPU_OVERHEAD_FACTOR = {
    'alexnet': 1.6,
    'googlenet': 1.3,
    'vgg16': 1.6,
    'resnet152': 1.3,
}

# Seconds to build a model and its replicas, per run, on the CPU.
CPU_SETUP_SECONDS = {'alexnet': 3, 'googlenet': 2, 'vgg16': 8,
                     'resnet152': 6}

Settings = collections.namedtuple(
    'Settings', ('image_size', 'batch', 'iterations', 'warmup'))

# Defaults on GPUs: the paper's ImageNet set-up (224 px, the classifiers'
# native size) and a batch of 32 per GPU.
GPU_DEFAULTS = {net: Settings(image_size=224, batch=32, iterations=50,
                              warmup=10) for net in models.NETWORKS}

# Defaults on CPU replicas. 64 px is the smallest size every network takes
# with real feature maps (models.common.MIN_IMAGE_SIZE); a batch of 4 per
# replica keeps a ResNet-152 iteration at N=4 near 3 s on 2 cores; the
# iteration counts make each network's run fit CPU_BUDGET_SECONDS (see
# estimate_seconds) with room for a busy machine. Checked: the ResNet-152
# defaults (estimated 4.5 min idle) took 5 min 5 s of wall time on the
# 2-core machine at a load average of about 4.5.
CPU_DEFAULTS = {
    'alexnet': Settings(image_size=64, batch=4, iterations=30, warmup=3),
    'googlenet': Settings(image_size=64, batch=4, iterations=30, warmup=3),
    'vgg16': Settings(image_size=64, batch=4, iterations=16, warmup=3),
    'resnet152': Settings(image_size=64, batch=4, iterations=20, warmup=3),
}

# The synthetic examples are generated once per run and then cycled, so
# that generating random images never counts as iteration time. Two global
# batches are enough: the content of the data does not change the timing.
BATCHES_IN_MEMORY = 2


# --------------------------------------------------------------- the modes

RunInputs = collections.namedtuple(
    'RunInputs', ('optimizer', 'examples', 'device_specs',
                  'batch_per_device', 'chunk_size', 'timeline', 'world'),
    defaults=(None,))
RunInputs.__doc__ = """What a mode's constructor gets to build its updater.

Attributes:
    optimizer: MomentumSGD, set up on a freshly built model (on the CPU).
    examples (list): The synthetic examples (this rank's share under MPI),
        to be cycled in order.
    device_specs (list of str): One device specifier per replica (of this
        rank).
    batch_per_device (int): Examples per replica and iteration.
    chunk_size (int, str or None): CGDP chunk size; None for the default.
    timeline (cgdp_chainer.Timeline or None): Where CGDP records events.
    world (World or None): The MPI ranks; None in a single process.
"""

World = collections.namedtuple(
    'World', ('comm', 'rank', 'size', 'local_rank', 'local_size', 'hosts'))
World.__doc__ = """The MPI ranks of a run (see :func:`mpi_world`).

Attributes:
    comm (mpi4py.MPI.Comm): ``MPI.COMM_WORLD``.
    rank (int): This rank.
    size (int): Number of ranks R.
    local_rank (int): This rank's index among the ranks on its machine.
    local_size (int): Ranks on this machine (they share its cores, GPUs).
    hosts (list of str): Every rank's host name, by rank.
"""


def mpi_world():
    """The run's :class:`World` under an MPI launch, else None.

    Collective under MPI. A plain run does not start MPI (see
    :func:`cgdp_chainer.mpi.launched_with_mpi`).
    """
    comm = cgdp_mpi.world()
    if comm is None:
        return None
    from mpi4py import MPI
    local_rank, local_size = cgdp_mpi.node_ranks(comm)
    return World(comm, comm.Get_rank(), comm.Get_size(), local_rank,
                 local_size, comm.allgather(MPI.Get_processor_name()))


def is_root(world):
    """True on the process that writes files and prints: rank 0, or the
    only process without MPI.

    Args:
        world (World or None): The run's ranks.
    """
    return world is None or world.rank == 0


def cpu_threads(world):
    """CPU cores of this rank: the machine's, shared by its ranks.

    Args:
        world (World or None): The run's ranks.
    """
    cores = os.cpu_count() or 1
    return max(1, cores // (1 if world is None else world.local_size))


def _global_iterator(inputs):
    """One iterator over the global batch (all replicas' shares).

    Args:
        inputs (RunInputs): The run's data, devices and batch per device.
    """
    return chainer.iterators.SerialIterator(
        inputs.examples, inputs.batch_per_device * len(inputs.device_specs),
        repeat=True, shuffle=False)


def build_typical(inputs):
    """Chainer's ParallelUpdater (StandardUpdater for one device).

    Args:
        inputs (RunInputs): The run's model, data and devices.
    """
    kind = 'standard' if len(inputs.device_specs) == 1 else 'parallel'
    return train.build_updater(kind, _global_iterator(inputs),
                               inputs.optimizer, inputs.device_specs)


def build_nccl(inputs):
    """Chainer's MultiprocessParallelUpdater: a process per GPU, NCCL.

    Args:
        inputs (RunInputs): The run's model, data and devices.
    """
    parts = chainer.datasets.split_dataset_n(inputs.examples,
                                             len(inputs.device_specs))
    iterators = [chainer.iterators.SerialIterator(
        part, inputs.batch_per_device, repeat=True, shuffle=False)
        for part in parts]
    return MultiprocessParallelUpdater(iterators, inputs.optimizer,
                                       devices=list(inputs.device_specs))


def build_cgdp(inputs):
    """CGDPUpdater over the same devices; under MPI also across the ranks
    (``mpi_comm``), its CPU replicas sharing this rank's cores.

    Args:
        inputs (RunInputs): The run's model, data and devices.
    """
    options = {}
    world = inputs.world
    if world is not None:
        options['comm'] = world.comm
        options['blas_threads'] = max(
            1, cpu_threads(world) // len(inputs.device_specs))
    return train.build_updater('cgdp', _global_iterator(inputs),
                               inputs.optimizer, inputs.device_specs,
                               chunk_size=inputs.chunk_size,
                               timeline=inputs.timeline, **options)


def build_chainermn(inputs):
    """ChainerMN's multi-node data parallel updater, one device per rank.

    Args:
        inputs (RunInputs): The run's model, data and its one device.
    """
    return train.build_updater('chainermn', _global_iterator(inputs),
                               inputs.optimizer, inputs.device_specs,
                               comm=inputs.world.comm)


SINGLE_PROCESS_ONLY = ('single-process mode, not run under MPI: its rows '
                       'come from a plain make experiment')


def available_always(device_specs, world=None):
    """Skip reason of a mode that runs anywhere: none.

    Args:
        device_specs (list of str): One specifier per replica (unused).
        world (World or None): The MPI ranks (unused).
    """
    return None


def single_process_only(device_specs, world=None):
    """Skip reason of a single-process mode (typical): under MPI.

    Args:
        device_specs (list of str): One specifier per replica (unused).
        world (World or None): The MPI ranks; None in a single process.
    """
    return None if world is None else SINGLE_PROCESS_ONLY


def nccl_unavailable(device_specs, world=None):
    """Why the nccl mode cannot run on ``device_specs`` (None if it can).

    Args:
        device_specs (list of str): One specifier per replica.
        world (World or None): The MPI ranks; None in a single process.
    """
    if world is not None:
        return SINGLE_PROCESS_ONLY
    if not all(spec.startswith('@cupy') for spec in device_specs):
        return 'needs GPUs (these are CPU replicas)'
    if len(device_specs) < 2:
        return 'needs 2 or more GPUs'
    if not MultiprocessParallelUpdater.available():
        return 'CuPy has no NCCL here'
    return None


def chainermn_unavailable(device_specs, world=None):
    """Why the chainermn mode cannot run (None if it can).

    Args:
        device_specs (list of str): One specifier per replica.
        world (World or None): The MPI ranks; None in a single process.
    """
    if world is None:
        return ('needs MPI ranks: make experiment RANKS=2 (mpiexec -n 2 '
                'python -m experiments.weak_scaling ...)')
    if len(device_specs) != 1:
        return 'one device per rank, as ChainerMN trains: N=1 only'
    return None


Mode = collections.namedtuple(
    'Mode', ('build', 'skip_reason', 'label', 'launches'))
Mode.__doc__ = """A training mode of the experiment.

Attributes:
    build (callable): ``build(RunInputs) -> updater``.
    skip_reason (callable): ``skip_reason(device_specs, world)``: why the
        mode cannot run there (a sentence), or None.
    label (str): What it is, in words.
    launches (tuple of str): Where it runs by default: ``'plain'`` (one
        process) and/or ``'mpi'`` (under mpiexec); see :func:`default_modes`.
"""

# Mode name -> how to build its updater and when it cannot run. A new mode
# is one more entry here.
MODES = collections.OrderedDict([
    ('typical', Mode(build_typical, single_process_only,
                     'ParallelUpdater (StandardUpdater on 1 device)',
                     ('plain',))),
    ('nccl', Mode(build_nccl, nccl_unavailable,
                  'MultiprocessParallelUpdater with NCCL', ('plain',))),
    ('cgdp', Mode(build_cgdp, available_always,
                  'CGDPUpdater (across the ranks under MPI)',
                  ('plain', 'mpi'))),
    ('chainermn', Mode(build_chainermn, chainermn_unavailable,
                       'ChainerMN, one device per rank (MPI only)',
                       ('mpi',))),
])


def default_modes(world):
    """The modes run when ``--modes`` is not given: those of the launch.

    Args:
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        list of str: Mode names, in :data:`MODES` order.
    """
    launch = 'plain' if world is None else 'mpi'
    return [name for name, mode in MODES.items() if launch in mode.launches]


# ------------------------------------------------------------ the settings

def device_specs_for(kind, count, world=None):
    """The device specifiers of ``count`` replicas of ``kind``.

    Args:
        kind (str): ``'gpu'`` (GPUs 0 to count - 1) or ``'cpu'``.
        count (int): Number of replicas.
        world (World or None): Under MPI, ranks that share a machine take
            distinct GPUs: local rank L takes ``L x count`` onwards.
    """
    if kind == 'gpu':
        first = 0 if world is None else world.local_rank * count
        return ['@cupy:{}'.format(first + i) for i in range(count)]
    return devices_module.numpy_devices(count)


def device_counts(text):
    """argparse type: device counts such as ``1,2,4``.

    Args:
        text (str): Comma-separated positive integers.

    Returns:
        list of int: Distinct counts, ascending.

    Raises:
        argparse.ArgumentTypeError: An item is not a positive integer.
    """
    import argparse
    counts = []
    for item in text.split(','):
        try:
            counts.append(cli.positive_int(item.strip()))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                'takes positive device counts such as 1,2,4, got {!r}'.format(
                    text))
    return sorted(set(counts))


def net_or_all(text):
    """argparse type: a network name, or ``all``.

    Args:
        text (str): The argument as typed.
    """
    if text == ALL:
        return text
    import argparse
    try:
        return cli.net_name(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError('{} (or {})'.format(error, ALL))


def mode_list(text):
    """argparse type: comma-separated names of :data:`MODES`.

    Args:
        text (str): The argument as typed, e.g. ``typical,cgdp``.
    """
    import argparse
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in MODES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            'unknown mode(s) {}; choose from {}'.format(
                ', '.join(unknown) or '(none)', ', '.join(MODES)))
    return [name for name in MODES if name in names]


def build_parser():
    """The command line of the experiment."""
    parser = cli.ArgumentParser(
        prog='python -m experiments.weak_scaling',
        description='Weak-scaling experiment: typical data parallel, NCCL '
                    'and CGDP training, timed per iteration, with figures.')
    parser.add_argument('--net', required=True, type=net_or_all,
                        help='one of {} or {}'.format(
                            ', '.join(models.NETWORKS), ALL))
    parser.add_argument('--devices', type=device_counts, default=None,
                        help='device counts N (per rank under MPI), e.g. '
                             '1,2,4 (default: 1,2,4, limited to the GPUs '
                             'present)')
    parser.add_argument('--device-kind', choices=('auto', 'gpu', 'cpu'),
                        default='auto',
                        help="replicas on GPUs or '@numpy' CPU replicas "
                             '(auto: GPUs where CuPy sees any)')
    parser.add_argument('--batch', type=cli.positive_int, default=None,
                        help='examples per device and iteration')
    parser.add_argument('--image-size', type=cli.positive_int, default=None)
    parser.add_argument('--iterations', type=cli.positive_int, default=None,
                        help='measured iterations per mode and N')
    parser.add_argument('--warmup', type=cli.non_negative_int, default=None,
                        help='untimed iterations before the measured ones')
    parser.add_argument('--chunk-size', type=cli.chunk_size, default=None,
                        help="CGDP chunk size: an int, 'auto' or 'model' "
                             "(default: CGDPUpdater's)")
    parser.add_argument('--modes', type=mode_list, default=None,
                        help='comma-separated subset of {} (default: {} in '
                             'one process, {} under MPI)'.format(
                                 ', '.join(MODES),
                                 ','.join(default_modes(None)),
                                 ','.join(name for name, mode in
                                          MODES.items()
                                          if 'mpi' in mode.launches)))
    parser.add_argument('--classes', type=cli.positive_int, default=1000,
                        help='classes of the synthetic data set')
    parser.add_argument('--seed', type=cli.non_negative_int, default=0,
                        help='seed of the weights and data (all modes)')
    parser.add_argument('--out', default=DEFAULT_OUT,
                        help='results root; a run goes to '
                             'OUT/<net>/<run-id>/')
    return parser


def resolve_devices(args, world=None):
    """The replica kind and the device counts to run, checked.

    Under MPI the ranks on one machine share its GPUs: each takes its own
    N of them (see :func:`device_specs_for`).

    Args:
        args (argparse.Namespace): The parsed command line.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        tuple: ``(kind, counts, notes)``: ``'gpu'`` or ``'cpu'``, the
        ascending device counts, and lines to print about the choice.
    """
    n_gpus = devices_module.gpu_count()
    kind = args.device_kind
    if kind == 'auto':
        kind = 'gpu' if n_gpus > 0 else 'cpu'
    notes = []
    # Ranks on this machine share its GPUs.
    sharing = 1 if world is None else world.local_size
    if kind == 'gpu' and sharing > 1:
        notes.append('note: {} ranks share this machine\'s {} GPU(s): each '
                     'rank takes its own N'.format(sharing, n_gpus))
        n_gpus //= sharing
    counts = args.devices
    if kind == 'gpu':
        if counts is None:
            counts = [n for n in DEFAULT_DEVICE_COUNTS if n <= n_gpus]
            dropped = [n for n in DEFAULT_DEVICE_COUNTS if n > n_gpus]
            if dropped and counts:
                notes.append('note: N={} skipped: this machine has {} '
                             'GPU(s)'.format(
                                 ','.join(map(str, dropped)), n_gpus))
        if not counts or max(counts) > n_gpus:
            cli.fail('asked for {} GPU(s), but this machine has {} GPU(s) '
                     '(as CuPy sees them){}{}'.format(
                         max(counts or [1]), n_gpus * sharing,
                         '' if sharing == 1 else
                         ', {} for each of its {} ranks'.format(n_gpus,
                                                                sharing),
                         '' if n_gpus else "; use --device-kind cpu for "
                                           "'@numpy' replicas"))
    else:
        if counts is None:
            counts = list(DEFAULT_DEVICE_COUNTS)
        if n_gpus > 0:
            notes.append('note: running CPU replicas although {} GPU(s) are '
                         'present (--device-kind cpu)'.format(n_gpus))
    return kind, counts, notes


def settings_for(net, kind, args):
    """The image size, batch and iteration counts of one network's run.

    Command-line values win over the defaults of :data:`GPU_DEFAULTS` and
    :data:`CPU_DEFAULTS`.

    Args:
        net (str): The network.
        kind (str): ``'gpu'`` or ``'cpu'``.
        args (argparse.Namespace): The parsed command line.

    Returns:
        tuple: ``(Settings, image_size_reason)``.
    """
    defaults = (GPU_DEFAULTS if kind == 'gpu' else CPU_DEFAULTS)[net]
    settings = Settings(
        image_size=args.image_size or defaults.image_size,
        batch=args.batch or defaults.batch,
        iterations=args.iterations or defaults.iterations,
        warmup=defaults.warmup if args.warmup is None else args.warmup)
    if args.image_size is not None:
        reason = 'given with --image-size'
    elif kind == 'gpu':
        reason = ('default on GPUs: 224 px, the ImageNet size of the '
                  'paper\'s experiments')
    else:
        reason = ('default on CPU replicas: {} px instead of the paper\'s '
                  '224 px (about {:.0f}x less work per image), so that the '
                  'default run fits {:.0f} minutes on a 2-core CPU; {} px is '
                  'the smallest size every network takes').format(
                      defaults.image_size, (224.0 / defaults.image_size) ** 2,
                      CPU_BUDGET_SECONDS / 60.0,
                      models.min_image_size(net))
    return settings, reason


def estimate_seconds(net, settings, counts, modes, kind, world=None):
    """Rough run time of one network's experiment on CPU replicas.

    An iteration with N replicas costs about N x batch x seconds per image
    (typical runs the replicas one after the other; CGDP's threads share
    the same cores), times the network's overhead factor; each run adds
    the time to build the model and its replicas. Ranks on one machine
    share its cores, which multiplies the time by their number.

    Args:
        net (str): The network.
        settings (Settings): Image size, batch and iteration counts.
        counts (list of int): The device counts.
        modes (list of str): The requested modes (skipped ones cost nothing).
        kind (str): ``'gpu'`` or ``'cpu'``.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        float or None: Seconds, or None on GPUs (not estimated).
    """
    if kind != 'cpu':
        return None
    per_image = (CPU_SECONDS_PER_IMAGE_64PX[net]
                 * (settings.image_size / 64.0) ** 2
                 * CPU_OVERHEAD_FACTOR[net])
    sharing = 1 if world is None else world.local_size
    total = 0.0
    for count in counts:
        for mode in modes:
            if MODES[mode].skip_reason(device_specs_for(kind, count),
                                       world):
                continue
            total += ((settings.warmup + settings.iterations)
                      * count * settings.batch * per_image * sharing)
            total += CPU_SETUP_SECONDS[net]
    return total


def skipped_runs(kind, counts, modes, world=None):
    """The (mode, count) pairs that cannot run, grouped for one message.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
        counts (list of int): The device counts.
        modes (list of str): The requested modes.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        dict: ``(mode, reason) -> [counts]``, in mode order.
    """
    skipped = collections.OrderedDict()
    for mode in modes:
        for count in counts:
            reason = MODES[mode].skip_reason(device_specs_for(kind, count),
                                             world)
            if reason:
                skipped.setdefault((mode, reason), []).append(count)
    return skipped


def iteration_cost(net, settings, count, kind):
    """Relative cost of one iteration, to weigh the progress bar's steps.

    Args:
        net (str): The network.
        settings (Settings): Its image size and batch.
        count (int): Replicas.
        kind (str): ``'gpu'`` or ``'cpu'``.
    """
    cost = (CPU_SECONDS_PER_IMAGE_64PX[net] * settings.batch
            * (settings.image_size / 64.0) ** 2)
    # On the CPU the replicas share the cores, so N replicas take N times
    # as long; GPUs run side by side.
    return cost * count if kind == 'cpu' else cost


def _minutes(seconds):
    """``m:ss``."""
    return '{}:{:02d}'.format(int(seconds) // 60, int(seconds) % 60)


# ------------------------------------------------------------ progress bar

class Progress(object):
    """A one-line progress bar on stderr with an estimate of time left.

    Steps are weighted by their expected cost, so that the estimate does not
    jump when the runs move on to more devices.

    Args:
        total (float): Sum of the weights of all steps.
        stream: Where to draw (default ``sys.stderr``).
    """

    WIDTH = 28
    # Without a terminal, redraws become lines: print at most this often.
    LOG_EVERY_SECONDS = 20.0

    def __init__(self, total, stream=None):
        self.total = max(total, 1e-12)
        self.done = 0.0
        self.stream = stream or sys.stderr
        self.is_tty = hasattr(self.stream, 'isatty') and self.stream.isatty()
        self.started = None
        self._last_log = 0.0
        self._shown = False

    def advance(self, weight, label):
        """Marks a step of ``weight`` as done and redraws.

        Args:
            weight (float): The step's weight.
            label (str): What is running (shown after the bar).
        """
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.done = min(self.total, self.done + weight)
        elapsed = now - self.started
        fraction = self.done / self.total
        left = elapsed / fraction * (1 - fraction) if fraction > 0 else 0
        filled = int(round(self.WIDTH * fraction))
        line = '[{}{}] {:3.0f}%  {}  elapsed {}  left ~{}'.format(
            '#' * filled, '.' * (self.WIDTH - filled), 100 * fraction, label,
            _minutes(elapsed), _minutes(left))
        if self.is_tty:
            self.stream.write('\r\033[K' + line)
            self._shown = True
        elif now - self._last_log >= self.LOG_EVERY_SECONDS or fraction >= 1:
            self.stream.write(line + '\n')
            self._last_log = now
        self.stream.flush()

    def start_clock(self):
        """Starts the elapsed time (before the first step's work)."""
        if self.started is None:
            self.started = time.monotonic()

    def clear(self):
        """Removes the bar so that a message can be printed."""
        if self.is_tty and self._shown:
            self.stream.write('\r\033[K')
            self.stream.flush()
            self._shown = False


def say(progress, text):
    """Prints a line on stdout without mixing it into the progress bar.

    Args:
        progress (Progress or None): The bar to clear first.
        text (str): The line.
    """
    if progress is not None:
        progress.clear()
    print(text, flush=True)


# ------------------------------------------------------------ running modes

def synthetic_examples(length, image_size, n_classes, seed):
    """``length`` synthetic ImageNet examples, generated up front.

    Args:
        length (int): Number of examples.
        image_size (int): Side of the images.
        n_classes (int): Number of classes.
        seed (int): Seed of the data.
    """
    dataset = datasets.SyntheticImageNet(length, image_size,
                                         n_classes=n_classes, seed=seed)
    return [dataset[i] for i in range(length)]


def synchronize(gpus):
    """Waits for every GPU of the run, so the timing covers their work.

    Args:
        gpus (list of chainer.backend.GpuDevice): The run's GPUs (empty
            for CPU replicas).
    """
    for gpu in gpus:
        gpu.device.synchronize()


def free_gpu_memory(device_specs):
    """Returns CuPy's pooled memory, so the next run starts from empty.

    Args:
        device_specs (list of str): The run's devices.
    """
    if any(spec.startswith('@cupy') for spec in device_specs):
        cupy = devices_module.cupy_module()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def chunk_search_running(updater):
    """True while CGDP's ``chunk_size='auto'`` search is still trying sizes.

    Iterations of the search run with changing chunk sizes, so they belong
    to the warm-up, not to the measurement.

    Args:
        updater: The run's updater (any kind).
    """
    return not getattr(updater, 'chunk_size_settled', True)


def rank_examples(world, per_rank, image_size, n_classes, seed):
    """This rank's share of ``world.size x per_rank`` synthetic examples.

    Every rank describes the same data set and takes its shard
    (:func:`cgdp_chainer.mpi.shard_dataset`); only the shard is generated.

    Args:
        world (World): The MPI ranks.
        per_rank (int): Examples per rank.
        image_size (int): Side of the images.
        n_classes (int): Number of classes.
        seed (int): Seed of the data.
    """
    dataset = datasets.SyntheticImageNet(per_rank * world.size, image_size,
                                         n_classes=n_classes, seed=seed)
    shard = cgdp_mpi.shard_dataset(dataset, world.comm)
    return [shard[i] for i in range(len(shard))]


def max_over_ranks(comm, value):
    """The largest of the ranks' ``value``: the time of an iteration that
    every rank agrees on. Collective.

    A non-blocking all-reduce, polled with short sleeps: Ctrl-C reaches
    Python while it waits (a blocking MPI call would hold it up).

    Args:
        comm (mpi4py.MPI.Comm): The ranks.
        value (float): This rank's value.
    """
    from mpi4py import MPI
    send = numpy.array([value], dtype=numpy.float64)
    receive = numpy.empty_like(send)
    request = comm.Iallreduce(send, receive, op=MPI.MAX)
    pause = 1e-5
    while not request.Test():
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return float(receive[0])


class _BlasThreads(object):
    """Limits BLAS threads to this rank's share of the cores (under MPI on
    CPU replicas; otherwise does nothing)."""

    def __init__(self, world, device_specs):
        self._limit = None
        self._active = None
        if world is not None and world.local_size > 1 and not any(
                spec.startswith('@cupy') for spec in device_specs):
            self._limit = cpu_threads(world)

    def __enter__(self):
        if self._limit is not None:
            import threadpoolctl
            self._active = threadpoolctl.threadpool_limits(
                limits=self._limit, user_api='blas')
        return self

    def __exit__(self, *exc):
        if self._active is not None:
            self._active.restore_original_limits()
        return False


def time_mode(net, mode, device_specs, settings, args, timeline, on_step,
              world=None):
    """Builds a mode's updater, warms it up and times its iterations.

    Under MPI every rank calls it with the same arguments (it is
    collective): each trains on its share of the data, and the time of an
    iteration is the largest over the ranks.

    Args:
        net (str): The network.
        mode (str): A key of :data:`MODES`.
        device_specs (list of str): One device per replica.
        settings (Settings): Image size, batch and iteration counts.
        args (argparse.Namespace): The command line (classes, seed,
            chunk size).
        timeline (cgdp_chainer.Timeline or None): For the cgdp mode.
        on_step (callable): ``on_step(measured_index, seconds)`` after each
            iteration; ``measured_index`` is None during the warm-up.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        dict: ``chunk_size`` (CGDP's resolved chunk size, else None) and
        ``warmup`` (warm-up iterations actually run).
    """
    # Dropout draws from the global state; ranks draw different masks.
    numpy.random.seed(args.seed + (0 if world is None else world.rank))
    model = train.build_model(net, n_classes=args.classes, seed=args.seed)
    optimizer = train.build_optimizer(model)
    batch_total = settings.batch * len(device_specs)
    if world is None:
        examples = synthetic_examples(batch_total * BATCHES_IN_MEMORY,
                                      settings.image_size, args.classes,
                                      args.seed)
    else:
        examples = rank_examples(world, batch_total * BATCHES_IN_MEMORY,
                                 settings.image_size, args.classes,
                                 args.seed)
    inputs = RunInputs(optimizer, examples, device_specs, settings.batch,
                       args.chunk_size if mode == 'cgdp' else None,
                       timeline, world)
    gpus = [device for device in devices_module.parse_devices(device_specs)
            if devices_module.is_gpu(device)]
    with _BlasThreads(world, device_specs):
        updater = MODES[mode].build(inputs)
        warmup = 0
        try:
            while warmup < settings.warmup or chunk_search_running(updater):
                updater.update()
                synchronize(gpus)
                warmup += 1
                on_step(None, None)
            for index in range(settings.iterations):
                start = time.perf_counter()
                updater.update()
                synchronize(gpus)
                seconds = time.perf_counter() - start
                if world is not None:
                    seconds = max_over_ranks(world.comm, seconds)
                on_step(index, seconds)
        finally:
            updater.finalize()
            chunk_size = getattr(updater, 'chunk_size', None)
            # Drop every reference to the run's arrays before the next run,
            # so that the replicas of two runs never coexist in memory.
            del updater, inputs, optimizer, model, examples
            gc.collect()
            free_gpu_memory(device_specs)
    return {'chunk_size': chunk_size, 'warmup': warmup}


def write_timeline(folder, timeline, warmup):
    """Writes the events of one measured CGDP iteration to timeline.csv.

    The iteration shown is the measured one of median duration, so the
    chart is typical rather than the fastest or an outlier.

    Args:
        folder (str): The run folder.
        timeline (cgdp_chainer.Timeline): The recorded run.
        warmup (int): Warm-up iterations (not eligible).

    Returns:
        dict or None: The iteration's summary, None if none was measured.
    """
    measured = [s for s in timeline.iteration_summaries
                if s['iteration'] >= warmup]
    if not measured:
        return None
    measured.sort(key=lambda s: s['duration'])
    chosen = measured[len(measured) // 2]
    results.write_csv(os.path.join(folder, results.TIMELINE_FILE),
                      results.TIMELINE_COLUMNS,
                      results.timeline_rows(timeline.events,
                                            chosen['iteration'],
                                            chosen['start']))
    timeline.export_chrome_trace(os.path.join(folder, results.TRACE_FILE))
    return chosen


def device_kind_name(kind):
    """``CPU replicas (@numpy)`` or the GPU's model, for figure titles.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
    """
    if kind == 'cpu':
        return 'CPU replicas (@numpy)'
    device = devices_module.parse_devices(['@cupy:0'])[0]
    return devices_module.describe(device).replace(' (@cupy:0)', '')


class _NoWriter(object):
    """Stands in for runs.csv on the ranks that write nothing."""

    path = None

    def append(self, row):
        pass

    def close(self):
        pass


def mpi_settings(world):
    """What env.json records about the MPI ranks (None without MPI).

    Args:
        world (World or None): The MPI ranks.
    """
    if world is None:
        return None
    return {'ranks': world.size, 'ranks_on_rank0_machine': world.local_size,
            'hosts': world.hosts,
            'iteration_time': 'maximum over the ranks',
            'single_process_modes': SINGLE_PROCESS_ONLY}


def run_network(net, settings, image_size_reason, kind, counts, args,
                run_id, command, progress, world=None):
    """Runs every mode at every device count for one network.

    Rows go to ``runs.csv`` as they are measured; ``summary.csv``,
    ``env.json`` and the figures are written at the end, also when the run
    is interrupted (then from what finished). Under MPI every rank runs
    the modes together and only rank 0 writes.

    Args:
        net (str): The network.
        settings (Settings): Image size, batch and iteration counts.
        image_size_reason (str): Why that image size (for env.json).
        kind (str): ``'gpu'`` or ``'cpu'``.
        counts (list of int): The device counts, ascending.
        args (argparse.Namespace): The parsed command line.
        run_id (str): The run's folder name.
        command (list of str): The command line, for env.json.
        progress (Progress): The progress bar to advance.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        str or None: The run folder (None on ranks other than 0).
    """
    root = is_root(world)
    n_ranks = 1 if world is None else world.size
    folder = results.run_dir(args.out, net, run_id) if root else None
    largest = max(counts)
    env = results.collect_env(
        command, net=net, run_id=run_id, image_size=settings.image_size,
        image_size_reason=image_size_reason,
        batch_per_device=settings.batch, iterations=settings.iterations,
        warmup=settings.warmup, chunk_size_requested=args.chunk_size,
        n_classes=args.classes, seed=args.seed, device_counts=counts,
        n_ranks=n_ranks, mpi=mpi_settings(world),
        device_kind=device_kind_name(kind),
        device_names=[devices_module.describe(d) for d in
                      devices_module.parse_devices(
                          device_specs_for(kind, largest, world))],
        modes=args.modes, skipped=[], cgdp_chunk_size={}, warmup_run={},
        timeline=None, finished=False, interrupted=False) if root else {}
    if root:
        os.makedirs(folder)
        env_path = os.path.join(folder, results.ENV_FILE)
        results.write_json(env_path, env)
        writer = results.CsvAppender(os.path.join(folder, results.RUNS_FILE),
                                     results.RUNS_COLUMNS)
    else:
        writer = _NoWriter()
    started = time.monotonic()
    try:
        for count in counts:
            specs = device_specs_for(kind, count, world)
            weight = iteration_cost(net, settings, count, kind)
            for mode in args.modes:
                reason = MODES[mode].skip_reason(specs, world)
                if reason:  # announced with the plan (see skipped_runs)
                    if root:
                        env['skipped'].append({'mode': mode,
                                               'n_devices': count,
                                               'reason': reason})
                    continue
                label = '{} {} N={}{}'.format(
                    net, mode, count,
                    '' if world is None else ' R={}'.format(n_ranks))
                # Rank 0's timeline stands for every rank's.
                timeline = (Timeline() if mode == 'cgdp' and count == largest
                            and root else None)

                def on_step(index, seconds, mode=mode, count=count,
                            label=label, weight=weight):
                    if index is not None:
                        writer.append(results.run_row(
                            mode, count, settings.batch,
                            settings.image_size, index, seconds,
                            n_ranks=n_ranks))
                        step = 'it {}/{}'.format(index + 1,
                                                 settings.iterations)
                    else:
                        step = 'warm-up'
                    progress.advance(weight, '{} {}'.format(label, step))

                progress.start_clock()
                info = time_mode(net, mode, specs, settings, args, timeline,
                                 on_step, world)
                if not root:
                    continue
                env['warmup_run']['{} N={}'.format(mode, count)] = \
                    info['warmup']
                if mode == 'cgdp':
                    env['cgdp_chunk_size'][str(count)] = info['chunk_size']
                if timeline is not None:
                    chosen = write_timeline(folder, timeline, info['warmup'])
                    if chosen is not None:
                        env['timeline'] = {
                            'mode': mode, 'n_devices': count,
                            'n_ranks': n_ranks,
                            'iteration': chosen['iteration'],
                            'duration_s': chosen['duration'],
                            'chunk_size': info['chunk_size']}
        env['finished'] = True
    except KeyboardInterrupt:
        env['interrupted'] = True
        raise
    finally:
        if root:
            # A second Ctrl-C must not cut the files that keep the first
            # part.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                writer.close()
                runs = results.read_csv(writer.path)
                results.write_csv(os.path.join(folder, results.SUMMARY_FILE),
                                  results.SUMMARY_COLUMNS,
                                  results.summarize(runs))
                env['wall_seconds'] = time.monotonic() - started
                env['load_average_at_end'] = results.load_average()
                results.write_json(env_path, env)
                plot.draw_run(folder)
            finally:
                signal.signal(signal.SIGINT, previous)
    return folder


def print_summary(folder, progress):
    """Prints summary.csv as a small table.

    With MPI ranks in the rows, ``R`` is the ranks and ``N`` the devices
    per rank; otherwise ``N`` is the devices.

    Args:
        folder (str): The run folder.
        progress (Progress or None): A bar to clear first.
    """
    rows = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    ranks = any(row['n_ranks'] > 1 for row in rows)
    if ranks:
        form = '{:<9} {:>3} {:>3} {:>10} {:>9} {:>11} {:>10} {:>8}'
        header = ('mode', 'R', 'N', 'median_s', 'iqr_s', 'images/s',
                  'efficiency', 'speedup')
    else:
        form = '{:<8} {:>3} {:>10} {:>9} {:>11} {:>10} {:>8}'
        header = ('mode', 'N', 'median_s', 'iqr_s', 'images/s',
                  'efficiency', 'speedup')
    say(progress, form.format(*header))

    def number(value, text):
        return '' if value is None else text.format(value)

    for row in rows:
        replicas = ((row['n_ranks'], row['n_devices']) if ranks
                    else (results.workers(row),))
        say(progress, form.format(
            row['mode'], *replicas,
            number(row['median_s'], '{:.3f}'), number(row['iqr_s'], '{:.3f}'),
            number(row['throughput'], '{:.1f}'),
            number(row['efficiency'], '{:.2f}'),
            number(row['speedup_vs_typical'], '{:.2f}x')))
    for note in results.summary_notes(rows):
        say(progress, note)


def experiment(args, argv, world=None):
    """Plans, runs and reports the experiment (every rank under MPI).

    Args:
        args (argparse.Namespace): The parsed command line.
        argv (list of str): The arguments, for env.json.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        int: Exit status: 0, or 130 after Ctrl-C.
    """
    root = is_root(world)
    if args.modes is None:
        args.modes = default_modes(world)
    nets = list(models.NETWORKS) if args.net == ALL else [args.net]
    kind, counts, notes = resolve_devices(args, world)
    for note in notes:
        print(note)

    plans = []
    for net in nets:
        settings, reason = settings_for(net, kind, args)
        try:
            models.check_image_size(net, settings.image_size)
        except ValueError as error:
            cli.fail('{}; pass --image-size {} or more'.format(
                error, models.min_image_size(net)))
        if settings.batch < 1:
            cli.fail('--batch must be positive')
        plans.append((net, settings, reason))

    if world is not None:
        hosts = sorted(set(world.hosts))
        print('MPI: {} ranks on {} machine(s) ({}); N devices per rank, so '
              'the global batch is R x N x batch; an iteration\'s time is '
              'the maximum over the ranks; rank 0 writes the files'.format(
                  world.size, len(hosts), ', '.join(hosts)))
        print('  single-process rows (typical, nccl) are not measured under '
              'MPI: they come from a plain make experiment (no RANKS)')
    for (mode, reason), skipped_counts in skipped_runs(
            kind, counts, args.modes, world).items():
        print('skip: {} at N={}: {}'.format(
            mode, ','.join(map(str, skipped_counts)), reason))
    total_estimate = 0.0
    for net, settings, reason in plans:
        estimate = estimate_seconds(net, settings, counts, args.modes, kind,
                                    world)
        runnable = [mode for mode in args.modes if any(
            not MODES[mode].skip_reason(device_specs_for(kind, count), world)
            for count in counts)]
        print('plan: {} on {}: {}N = {}; modes {}; {} px, batch {}/device, '
              '{} warm-up + {} measured iterations{}'.format(
                  net, device_kind_name(kind),
                  '' if world is None else 'R = {} ranks, '.format(
                      world.size),
                  ','.join(map(str, counts)),
                  ', '.join(runnable), settings.image_size, settings.batch,
                  settings.warmup, settings.iterations,
                  '' if estimate is None else
                  '; estimated {} (m:ss) on 2 idle cores'.format(
                      _minutes(estimate))))
        print('  image size: {}'.format(reason))
        if kind == 'cpu' and (args.batch is None or args.iterations is None
                              or args.warmup is None):
            print('  why these defaults: no GPU, so the replicas share {} '
                  'CPU core(s); a small batch per replica and few '
                  'iterations keep the run within about {:.0f} minutes on a '
                  '2-core machine'.format(os.cpu_count(),
                                          CPU_BUDGET_SECONDS / 60.0))
        total_estimate += estimate or 0.0
    if len(plans) > 1 and total_estimate:
        print('plan: all networks together estimated {} (m:ss)'.format(
            _minutes(total_estimate)))

    if kind == 'gpu' and 'nccl' in args.modes and max(counts) >= 2 and \
            world is None and MultiprocessParallelUpdater.available():
        # MultiprocessParallelUpdater forks its workers; a process whose
        # CUDA context exists (the earlier modes made one) must start them
        # with forkserver instead.
        multiprocessing.set_start_method('forkserver', force=True)

    run_id = None
    if root:
        run_id = results.free_run_id(args.out, nets + (
            [ALL] if len(nets) > 1 else []))
    if world is not None:
        run_id = world.comm.bcast(run_id, root=0)
    command = [os.path.basename(sys.executable), '-m',
               'experiments.weak_scaling'] + list(argv)
    if world is not None:
        command = ['mpiexec', '-n', str(world.size)] + command
    all_dir = None
    if len(nets) > 1 and root:
        all_dir = results.run_dir(args.out, ALL, run_id)
        os.makedirs(all_dir)
        results.write_json(os.path.join(all_dir, results.INDEX_FILE), {
            'run_id': run_id, 'command': ' '.join(command),
            'nets': collections.OrderedDict(
                (net, os.path.relpath(results.run_dir(args.out, net, run_id),
                                      all_dir)) for net in nets)})

    total_weight = 0.0
    for net, settings, _ in plans:
        for count in counts:
            specs = device_specs_for(kind, count)
            runnable = sum(1 for mode in args.modes
                           if not MODES[mode].skip_reason(specs, world))
            total_weight += (runnable * (settings.warmup + settings.iterations)
                             * iteration_cost(net, settings, count, kind))
    progress = Progress(total_weight, stream=None if root else _DEVNULL)

    started = time.monotonic()
    folders = []
    interrupted = False
    try:
        for net, settings, reason in plans:
            if root:
                folders.append(results.run_dir(args.out, net, run_id))
            run_network(net, settings, reason, kind, counts, args, run_id,
                        command, progress, world)
            if root:
                say(progress, 'wrote {}'.format(folders[-1]))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.clear()
        if all_dir is not None:
            plot.draw_all(all_dir)
    for folder in folders:
        if os.path.exists(os.path.join(folder, results.SUMMARY_FILE)):
            say(None, '\n{}'.format(folder))
            print_summary(folder, None)
    if all_dir is not None:
        say(None, 'all networks: {}'.format(all_dir))
    say(None, 'wall time {} (load average now {})'.format(
        _minutes(time.monotonic() - started),
        ', '.join('{:.1f}'.format(v) for v in results.load_average() or [])))
    if interrupted:
        say(None, 'interrupted: kept the iterations that finished; redraw '
                  'with python -m experiments.plot FOLDER')
        return EXIT_INTERRUPTED
    return 0


class _DevNull(object):
    """A stream that drops what is written (other ranks' progress bar)."""

    def write(self, text):
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


_DEVNULL = _DevNull()


def end_interrupted_job(world):
    """Ends every rank after Ctrl-C, once rank 0 has written its files.

    Ranks may have stopped at different points, some even inside a
    collective that the others left, so the job cannot end with MPI's
    normal finalization. Rank 0, which has written what finished, aborts
    the job with status 130; the other ranks wait for that, and abort it
    themselves after :data:`MPI_INTERRUPT_GRACE_SECONDS` (rank 0 stuck in
    a collective).

    Args:
        world (World): The MPI ranks.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if world.rank == 0:
        sys.stderr.write('interrupted: rank 0 ends the MPI job (status {})'
                         '\n'.format(EXIT_INTERRUPTED))
        sys.stderr.flush()
    else:
        deadline = time.monotonic() + MPI_INTERRUPT_GRACE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.1)
    world.comm.Abort(EXIT_INTERRUPTED)


def main(argv=None):
    """Runs the experiment; see the module's docstring.

    Under an MPI launch (``make experiment RANKS=R``) every rank runs it:
    rank 0 alone prints, other ranks' standard output is dropped, and an
    exception on any rank aborts the whole job.

    Args:
        argv (list of str or None): Arguments (default: ``sys.argv[1:]``).

    Returns:
        int: Exit status: 0, or 130 after Ctrl-C.
    """
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)  # the same verdict on all ranks
    world = mpi_world()  # None (and MPI untouched) without mpiexec
    if world is None:
        return experiment(args, argv)
    if world.rank != 0:
        sys.stdout = _DEVNULL
    cgdp_mpi.install_abort_hooks(world.comm)
    try:
        status = experiment(args, argv, world)
    except SystemExit as error:
        if error.code in (None, 0):
            raise
        # Bad input found after MPI started (its error line is printed):
        # end every rank, not only this one.
        sys.stderr.flush()
        world.comm.Abort(error.code if isinstance(error.code, int) else 1)
        raise
    if status == EXIT_INTERRUPTED:
        end_interrupted_job(world)
    return status


if __name__ == '__main__':
    sys.exit(main())
