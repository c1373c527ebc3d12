"""Random draws that stay repeatable when replicas run in threads.

Chainer's dropout on the CPU draws its mask from NumPy's one global random
state. Replicas computing in several threads would then take their draws in
whatever order the threads happen to run, so two identical runs, or a run
and its resume from a snapshot, would differ. The CGDP device workers
instead give each thread its own ``RandomState``, seeded per iteration from
draws the updater makes in the calling thread; :func:`dropout` uses it.
Outside such a scope it is Chainer's dropout, drawing from the global state.
"""
import contextlib
import threading

import chainer
import chainer.functions as F
import numpy

_local = threading.local()


@contextlib.contextmanager
def thread_random_state(seed):
    """Gives the current thread its own random state for the block.

    Args:
        seed (int): Seed of the thread's ``numpy.random.RandomState``.
    """
    previous = getattr(_local, 'state', None)
    _local.state = numpy.random.RandomState(seed)
    try:
        yield _local.state
    finally:
        _local.state = previous


def current_random_state():
    """The thread's own random state, or ``None`` outside a scope."""
    return getattr(_local, 'state', None)


def dropout(x, ratio=0.5):
    """:func:`chainer.functions.dropout`, with the mask drawn from the
    thread's own random state where there is one (CPU arrays only).

    Args:
        x (chainer.Variable or numpy.ndarray): Input.
        ratio (float): Probability of dropping a unit.
    """
    state = current_random_state()
    array = x.array if isinstance(x, chainer.Variable) else x
    if state is None or not chainer.config.train or \
            not isinstance(array, numpy.ndarray):
        return F.dropout(x, ratio=ratio)
    scale = array.dtype.type(1.0 / (1.0 - ratio))
    mask = (state.random_sample(array.shape) >= ratio) * scale
    return F.dropout(x, ratio=ratio, mask=mask.astype(array.dtype))
