"""The project's one BLAS-thread limiter.

CPU replicas, MPI ranks and profiling runs that share a machine's cores
each get a share of them for BLAS: OpenBLAS's threads spin between calls,
so several processes or threads that each use every core slow each other
down. Everything that limits BLAS threads goes through :class:`BlasLimit`
and computes shares with :func:`threads_per_replica`.
"""
import os


def cpu_cores():
    """Cores this process may run on (its affinity mask where known)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_replica(n_cpu_replicas, blas_threads=None, cores=None):
    """BLAS threads for each of ``n_cpu_replicas`` replicas side by side.

    Args:
        n_cpu_replicas (int): Replicas computing on the CPU at once.
        blas_threads (int or None): An explicit choice, which wins.
        cores (int or None): Cores to share; default: :func:`cpu_cores`.

    Returns:
        int or None: Threads per replica, or ``None`` (leave BLAS alone)
        where fewer than two replicas share the CPU and nothing was given.

    Raises:
        ValueError: ``blas_threads`` is not a positive integer.
    """
    if blas_threads is not None:
        if isinstance(blas_threads, bool) or not isinstance(
                blas_threads, int) or blas_threads < 1:
            raise ValueError(
                'blas_threads must be a positive integer or None (cores '
                'divided by CPU replicas); got {!r}'.format(blas_threads))
        return blas_threads
    if n_cpu_replicas < 2:
        return None
    return max(1, (cores or cpu_cores()) // n_cpu_replicas)


class BlasLimit(object):
    """Limits this process's BLAS threads to ``limit`` inside a ``with``.

    Args:
        limit (int or None): Threads; ``None`` makes it a no-op.
    """

    def __init__(self, limit):
        self.limit = limit
        self._active = None

    def __enter__(self):
        if self.limit is not None:
            import threadpoolctl
            self._active = threadpoolctl.threadpool_limits(
                limits=self.limit, user_api='blas')
        return self

    def __exit__(self, *exc):
        if self._active is not None:
            self._active.restore_original_limits()
            self._active = None
        return False
