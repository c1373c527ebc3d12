"""Faults: an exception on one rank aborts the whole MPI job, so that no
rank waits forever in a collective that its peer will never join."""
import os
import sys
import threading
import traceback

from cgdp_chainer.mpi.launch import as_mpi_comm
from cgdp_chainer.mpi import shm


def abort_job(comm, exc_type, exc_value, exc_traceback, exit_code=1,
              where='', abort_grace=10.0):
    """Prints this rank's traceback to stderr and aborts the whole MPI job.

    Does not return. ``MPI_Abort`` makes the process manager kill every
    rank; if it has not ended this process within ``abort_grace`` seconds,
    the process exits by itself.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exc_type, exc_value, exc_traceback: The exception.
        exit_code (int): Exit status of the job.
        where (str): Where it happened, e.g. ``" in thread accumulator"``.
        abort_grace (float): Seconds before the fallback exit.
    """
    comm = as_mpi_comm(comm)
    try:
        rank, size = comm.Get_rank(), comm.Get_size()
    except Exception:
        rank, size = '?', '?'
    lines = traceback.format_exception(exc_type, exc_value, exc_traceback)
    # Ranks share the job's stderr: the prefix keeps interleaved lines
    # attributable.
    prefix = '[rank {}] '.format(rank)
    text = ''.join(prefix + line + '\n'
                   for chunk in lines for line in chunk.rstrip('\n').split(
                       '\n'))
    message = ('{prefix}Uncaught exception on rank {rank} of {size}{where}; '
               'aborting the MPI job.\n{text}{prefix}Calling MPI_Abort({code})'
               '.\n'.format(prefix=prefix, rank=rank, size=size, where=where,
                            text=text, code=exit_code))
    try:
        sys.stderr.write(message)
        sys.stderr.flush()
    except Exception:
        pass
    # If MPI_Abort hangs or returns, this timer still ends the process.
    fallback = threading.Timer(abort_grace, os._exit, (exit_code,))
    fallback.daemon = True
    fallback.start()
    # No rank finalizes after an abort, and MPICH unlinks its shared
    # memory only in MPI_Finalize: without this, every aborted job would
    # leave its segment in /dev/shm.
    shm.unlink_mapped_segments()
    try:
        comm.Abort(exit_code)
    finally:
        os._exit(exit_code)


def _is_clean_exit(exc_type, exc_value):
    return (exc_type is SystemExit and
            (exc_value is None or exc_value.code in (None, 0)))


def _exit_code_of(exc_value, default):
    if isinstance(exc_value, SystemExit) and isinstance(exc_value.code, int):
        return exc_value.code
    return default


class AbortOnException(object):
    """Context manager: an exception leaving the block aborts the MPI job.

    The rank's traceback goes to stderr first. ``SystemExit`` with status 0
    passes through; any other exception, ``KeyboardInterrupt`` included,
    aborts: a rank that stops early would leave the others waiting in a
    collective forever.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.
    """

    def __init__(self, comm, exit_code=1):
        self.comm = comm
        self.exit_code = exit_code

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, exc_traceback):
        if exc_type is None or _is_clean_exit(exc_type, exc_value):
            return False
        abort_job(self.comm, exc_type, exc_value, exc_traceback,
                  _exit_code_of(exc_value, self.exit_code))


def abort_on_exception(comm, exit_code=1):
    """``with abort_on_exception(comm): train()`` (see AbortOnException).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.

    Returns:
        AbortOnException: The context manager.
    """
    return AbortOnException(comm, exit_code)


def install_abort_hooks(comm, exit_code=1):
    """Makes uncaught exceptions, in any thread, abort the whole MPI job.

    Replaces ``sys.excepthook`` (the main thread) and
    ``threading.excepthook`` (other threads: an accumulator thread that
    dies would otherwise leave its rank, and so every rank, waiting).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.
    """
    def main_thread_hook(exc_type, exc_value, exc_traceback):
        if _is_clean_exit(exc_type, exc_value):
            return
        abort_job(comm, exc_type, exc_value, exc_traceback,
                  _exit_code_of(exc_value, exit_code))

    def other_thread_hook(args):
        if _is_clean_exit(args.exc_type, args.exc_value):
            return
        name = args.thread.name if args.thread is not None else '?'
        abort_job(comm, args.exc_type, args.exc_value, args.exc_traceback,
                  _exit_code_of(args.exc_value, exit_code),
                  where=' in thread {}'.format(name))

    sys.excepthook = main_thread_hook
    threading.excepthook = other_thread_hook
