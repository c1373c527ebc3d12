"""The MPI ranks of the weak-scaling experiment, and how they end together.

Under ``mpiexec`` every rank runs the same experiment; only rank 0 writes
files and prints (:func:`is_root`). The ranks end in one of three ways,
each of them deterministic:

- Normally, or after Ctrl-C / SIGTERM: a signal never interrupts a rank
  (:class:`experiments.stopping.StopSignals` only records it); the ranks
  agree whether to stop at their check points (:class:`StopPoints`: after
  every iteration and before every run), so they all leave their
  collectives at the same place. Rank 0 then writes and prints what
  finished while the others wait, and every rank finalizes MPI and exits
  with the same status (:func:`end_job`). Nothing races an ``MPI_Abort``,
  which would kill rank 0 before its last lines leave the machine.
- Bad input: :func:`same_verdict` runs the checks on every rank and ends
  every rank with status 2 when any rank finds a problem; rank 0 prints
  the one ``error:`` line.
- A fault (an exception on any rank): ``cgdp_chainer.mpi``'s abort hooks
  print its traceback and abort the job (see :func:`is_usage_exit`).
"""
import collections
import contextlib
import io
import sys
import time

import numpy

from cgdp_chainer import blas
from cgdp_chainer import mpi as cgdp_mpi
from experiments import stopping

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


def rank_cores(world):
    """CPU cores of this rank: the machine's, shared by its ranks.

    Args:
        world (World or None): The run's ranks.
    """
    sharing = 1 if world is None else world.local_size
    return max(1, blas.cpu_cores() // sharing)


def rank_blas_limit(world, device_specs):
    """BLAS threads of this whole rank, or None to leave BLAS alone.

    Ranks that share a machine and compute on its CPU each get their share
    of the cores; GPU replicas and single processes are left alone.

    Args:
        world (World or None): The run's ranks.
        device_specs (list of str): The rank's replicas.
    """
    if world is None or world.local_size < 2 or any(
            spec.startswith('@cupy') for spec in device_specs):
        return None
    return rank_cores(world)


def mpi_settings(world, single_process_note):
    """What env.json records about the MPI ranks (None without MPI).

    Args:
        world (World or None): The MPI ranks.
        single_process_note (str): Why single-process modes are not run.
    """
    if world is None:
        return None
    return {'ranks': world.size, 'ranks_on_rank0_machine': world.local_size,
            'hosts': world.hosts,
            'iteration_time': 'maximum over the ranks',
            'single_process_modes': single_process_note}


def _wait(request):
    """Waits for a non-blocking MPI request with short sleeps, so that a
    rank that waits (for rank 0 writing files, say) leaves the cores to
    the others instead of spinning as a blocking MPI call does."""
    pause = 1e-5
    while not request.Test():
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


def max_over_ranks(comm, values):
    """Element-wise maximum of every rank's ``values``. Collective.

    Args:
        comm (mpi4py.MPI.Comm): The ranks.
        values (sequence of float): This rank's values.

    Returns:
        numpy.ndarray: The maxima (float64).
    """
    from mpi4py import MPI
    send = numpy.asarray(values, dtype=numpy.float64)
    receive = numpy.empty_like(send)
    _wait(comm.Iallreduce(send, receive, op=MPI.MAX))
    return receive


class StopPoints(object):
    """The points where a run stops after SIGINT or SIGTERM.

    Under MPI they are collective, and every rank must pass the same
    points in the same order: each is an all-reduce of the ranks' stop
    requests (the signal number, 0 for none), so that when any rank has
    seen a signal, every rank raises :class:`~experiments.stopping.
    Interrupted` at the same point, with the same signal. In a single
    process they only look at this process's request.

    Args:
        world (World or None): The MPI ranks; None in a single process.
        signals (experiments.stopping.StopSignals): The signal handler.
    """

    def __init__(self, world, signals):
        self.world = world
        self.signals = signals

    def _agree(self, seconds):
        local = self.signals.signum or 0
        if self.world is None:
            return seconds, local
        agreed = max_over_ranks(self.world.comm, [seconds, local])
        return float(agreed[0]), int(agreed[1])

    def iteration(self, seconds=0.0):
        """After an iteration: its time over the ranks, unless they stop.

        Args:
            seconds (float): This rank's time of the iteration.

        Returns:
            float: The largest of the ranks' times.

        Raises:
            experiments.stopping.Interrupted: A rank saw a signal.
        """
        seconds, signum = self._agree(seconds)
        if signum:
            raise stopping.Interrupted(signum)
        return seconds

    def check(self):
        """Before a run: stops every rank if any saw a signal.

        Raises:
            experiments.stopping.Interrupted: A rank saw a signal.
        """
        self.iteration(0.0)

    def final(self):
        """At the end: the signal any rank saw, if one did.

        Returns:
            int or None: The signal number (the largest, if ranks saw
            different ones), or None.
        """
        return self._agree(0.0)[1] or None


class JobExit(SystemExit):
    """Every rank ends with this status (see :func:`same_verdict`)."""


def same_verdict(world, check, *args, **kwargs):
    """Runs ``check`` (which may end the run through ``cli.fail``) so that
    every rank reaches the same verdict.

    Every rank runs ``check``; if it exits on any rank (bad input, or
    ``--help``), rank 0 prints the first such rank's message once and
    every rank raises :class:`JobExit` with its status, to end the job
    normally (:func:`end_job`). Without MPI it is just ``check(...)``.

    Args:
        world (World or None): The MPI ranks; None in a single process.
        check (callable): The check; its return value is passed on.
        *args, **kwargs: Its arguments.

    Returns:
        What ``check`` returned.

    Raises:
        JobExit: ``check`` exited on some rank.
    """
    if world is None:
        return check(*args, **kwargs)
    captured = io.StringIO()
    value, verdict = None, None
    try:
        with contextlib.redirect_stderr(captured):
            value = check(*args, **kwargs)
    except SystemExit as error:
        verdict = (error.code if isinstance(error.code, int) else 1,
                   captured.getvalue())
    else:
        sys.stderr.write(captured.getvalue())
    verdicts = world.comm.allgather(verdict)
    failed = [entry for entry in verdicts if entry is not None]
    if failed:
        status, message = failed[0]
        if world.rank == 0:
            sys.stderr.write(message)
            sys.stderr.flush()
        raise JobExit(status)
    return value


def is_usage_exit(error):
    """True if a SystemExit ends every rank alike: it came through
    :func:`same_verdict`, or it is a clean exit (status 0). False if only
    this rank exits with an error: then it must abort the job, or the
    other ranks would wait for it forever.

    Args:
        error (SystemExit): The exit.
    """
    return isinstance(error, JobExit) or error.code in (None, 0)


def end_job(world):
    """The last step of every rank: waits for all ranks, then flushes.

    After it the rank returns its exit status and MPI is finalized at
    exit; since every rank gets here, nobody is killed and Hydra forwards
    rank 0's output to the end.

    Args:
        world (World): The MPI ranks.
    """
    _wait(world.comm.Ibarrier())
    sys.stdout.flush()
    sys.stderr.flush()
