"""glibc's allocator in the processes that compute: freed memory is kept.

A training step on the CPU allocates and frees the same large temporaries
every iteration (im2col columns, activations, gradients). glibc's malloc
serves a request above its mmap threshold with fresh pages from the system
and gives back what is freed above its trim threshold at the heap's top;
both thresholds move with the process's history. In the regime where they
are low, every step touches new pages, and the page faults cost as much as
the arithmetic: a small convolutional net's step (batch 32, 64 px) took
12,600 minor page faults per iteration, and its backward 142 ms in a CGDP
worker process against 82 ms with the settings below (1 fault per
iteration).

:func:`keep_freed_memory` fixes both thresholds: requests up to glibc's
largest mmap threshold (32 MiB) come from the heap, and up to
:data:`TRIM_THRESHOLD_BYTES` of freed memory stays with the process. CGDP's
worker processes apply it when they start; the benchmarks and experiments
apply it to the processes they compare them with (see
``experiments/cli.py``), so that a comparison measures the training, not
the allocator's history. A user's own settings (``MALLOC_*`` variables,
``GLIBC_TUNABLES``) are left alone.
"""
import ctypes
import os
import sys

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# glibc's largest mmap threshold on 64-bit machines (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD_BYTES = 32 << 20
# Freed memory kept at the heap's top before any goes back to the system.
TRIM_THRESHOLD_BYTES = 1 << 30

# Where one of these is set, the user has chosen the allocator's settings.
USER_SETTINGS = ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_',
                 'MALLOC_MMAP_MAX_', 'MALLOC_TOP_PAD_', 'GLIBC_TUNABLES')


def keep_freed_memory(environ=None):
    """Makes this process's malloc keep and reuse what a step frees.

    Args:
        environ (dict or None): The environment to look for the user's own
            settings in (default: ``os.environ``).

    Returns:
        bool: Whether the settings were applied (False off Linux, without
        glibc's ``mallopt``, or where the user set the allocator).
    """
    environ = os.environ if environ is None else environ
    if not sys.platform.startswith('linux') or any(
            name in environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; musl's stub returns 0.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
