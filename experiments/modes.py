"""The training modes that the weak-scaling experiment compares.

Each mode (:data:`MODES`) says how to build its updater from the run's
:class:`RunInputs` and why it cannot run on given devices (a sentence, or
None): ``typical`` (Chainer's ParallelUpdater, StandardUpdater on one
device), ``nccl`` (MultiprocessParallelUpdater, GPUs with NCCL), ``cgdp``
(:class:`cgdp_chainer.CGDPUpdater`, across the ranks under MPI) and
``chainermn`` (ChainerMN, one device per rank, MPI only). A new mode is
one more entry in :data:`MODES`.
"""
import collections

import chainer
from chainer.training.updaters import MultiprocessParallelUpdater

from cgdp_chainer import blas
from experiments import cli
from experiments import mpi_world
from experiments import train

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
    world (experiments.mpi_world.World or None): The MPI ranks; None in a
        single process.
"""


def global_iterator(inputs):
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
    return train.build_updater(kind, global_iterator(inputs),
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
        # Always explicit: the replicas may compute in other processes,
        # which this rank's own BLAS limit does not reach.
        cores = mpi_world.rank_cores(world)
        options['blas_threads'] = blas.threads_per_replica(
            len(inputs.device_specs), cores=cores) or cores
    return train.build_updater('cgdp', global_iterator(inputs),
                               inputs.optimizer, inputs.device_specs,
                               chunk_size=inputs.chunk_size,
                               timeline=inputs.timeline, **options)


def build_chainermn(inputs):
    """ChainerMN's multi-node data parallel updater, one device per rank.

    Args:
        inputs (RunInputs): The run's model, data and its one device.
    """
    return train.build_updater('chainermn', global_iterator(inputs),
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
    if not nccl_available():
        return 'CuPy has no NCCL here'
    return None


def nccl_available():
    """Whether MultiprocessParallelUpdater can run here.

    Chainer's own check only asks whether ``cupy.cuda.nccl`` imports,
    which it always does on CuPy 14, NCCL's library or not; the module's
    ``available`` flag says whether the library loaded.
    """
    if not MultiprocessParallelUpdater.available():
        return False
    from cupy.cuda import nccl
    return nccl_library_loaded(nccl)


def nccl_library_loaded(nccl):
    """Whether CuPy's NCCL module ``nccl`` found NCCL's library (CuPy
    before ``available`` existed: the import succeeding said so)."""
    return bool(getattr(nccl, 'available', True))


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

# Mode name -> how to build its updater and when it cannot run.
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


# argparse type: comma-separated names of MODES, in MODES order.
mode_list = cli.name_list(MODES, 'mode')
