"""Random streams of the replicas, repeatable under a seeded script.

Chainer's own random functions (``F.dropout``, ``F.gaussian``,
``L.NegativeSampling``'s sampler, ...) draw from NumPy's one global random
state on the CPU and from ``cupy.random``'s state of the current device on
a GPU. Under ``StandardUpdater`` a script that calls
``numpy.random.seed(s)`` (and ``cupy.random.seed(s)``) so trains the same
on every run. Under CGDP the replicas draw instead from streams derived from
``(base, rank, iteration, replica)``, where ``base`` is derived once, when
the updater is built, from the caller's global NumPy state without
advancing it (:func:`base_seed`), and kept in the updater's snapshots:

* a worker process seeds its own global NumPy state before each iteration
  of its replica;
* a GPU replica draws from a ``cupy.random.RandomState`` of its own,
  installed as its device's state for the iteration and seeded from the
  stream (the caller's CuPy state stays as it was);
* :func:`dropout` draws from a ``RandomState`` of the replica's thread,
  also seeded from the stream; it stays repeatable where NumPy's global
  state cannot be, in several ``'@numpy'`` replica threads;
* ``'@numpy'`` replica threads share the process's global NumPy state: for
  the replicas' run the updater installs a state derived from the stream of
  the first of them and then puts the caller's back
  (:class:`SharedGlobalState`). With one such replica that is its own
  stream; with several, draws from it interleave in thread order.

The caller's global state is so left as ``StandardUpdater`` leaves it for a
model without random functions: the iterator's shuffles and the script's
own draws are the same.
"""
import collections
import contextlib
import hashlib
import threading

import chainer
import chainer.functions as F
import numpy

# First word of every replica stream's entropy, so that these streams differ
# from any other SeedSequence keyed on small integers.
STREAM_TAG = 0x43474450  # 'CGDP'

# The spawn keys of a replica's streams.
NUMPY_STREAM = 0    # the process's global NumPy state
DROPOUT_STREAM = 1  # the thread's own state (cgdp_chainer.randomness.dropout)
CUPY_STREAM = 2     # the GPU replica's CuPy state
PROBE_STREAM = 3    # the first iteration's second draw of the loss


def probe_words(base):
    """The seed of the first iteration's second forward of the master on
    the whole batch, which tells a loss that draws random numbers in test
    mode from a deterministic one (see ``CGDPUpdater``'s ``reduction``).

    A stream of its own, derived from the updater's base seed: repeatable
    under a seeded script, and not the caller's state, from which the
    first forward drew (and which is put back after both).

    Args:
        base (int): The updater's base seed (see :func:`base_seed`).

    Returns:
        numpy.ndarray: 128 bits, for ``numpy.random.seed``.
    """
    return numpy.random.SeedSequence(
        [STREAM_TAG, int(base)], spawn_key=(PROBE_STREAM,)).generate_state(4)

_local = threading.local()


def base_seed():
    """A seed derived from NumPy's global random state, which it does not
    advance: the same after the same ``numpy.random.seed(s)`` and draws.

    Returns:
        int: In ``[0, 2**63)`` (it fits an int64 in snapshots and MPI).
    """
    name, key, pos, has_gauss, cached_gaussian = \
        numpy.random.get_state(legacy=True)
    digest = hashlib.sha256(name.encode('ascii'))
    digest.update(numpy.ascontiguousarray(key, dtype=numpy.uint32).tobytes())
    digest.update(numpy.array([pos, has_gauss], dtype=numpy.int64).tobytes())
    digest.update(numpy.array([cached_gaussian],
                              dtype=numpy.float64).tobytes())
    return int.from_bytes(digest.digest()[:8], 'little') >> 1


class ReplicaSeed(collections.namedtuple(
        'ReplicaSeed', ('base', 'rank', 'iteration', 'replica',
                        'global_numpy'))):
    """What a replica seeds its random streams from in one iteration.

    Attributes:
        base (int): The updater's base seed (see :func:`base_seed`).
        rank (int): The MPI rank (0 without MPI).
        iteration (int): The updater's iteration.
        replica (int): The replica's index.
        global_numpy (bool): Whether the replica owns its process's global
            NumPy state (a worker process) and seeds it.
    """

    __slots__ = ()

    def sequence(self, stream):
        """The ``numpy.random.SeedSequence`` of one of the streams.

        Args:
            stream (int): :data:`NUMPY_STREAM`, :data:`DROPOUT_STREAM` or
                :data:`CUPY_STREAM`.
        """
        return numpy.random.SeedSequence(
            [STREAM_TAG, int(self.base), int(self.rank),
             int(self.iteration), int(self.replica)], spawn_key=(stream,))

    def words(self, stream):
        """128 bits of one of the streams, to seed a ``RandomState`` with
        (``RandomState.seed(words)``: far cheaper than building one).

        Args:
            stream (int): As for :meth:`sequence`.
        """
        return self.sequence(stream).generate_state(4)


def same_numpy_state(a, b):
    """Whether two ``numpy.random.get_state()`` tuples are equal (a draw of
    any kind moves the Mersenne Twister's position or its key)."""
    return a[0] == b[0] and numpy.array_equal(a[1], b[1]) and \
        tuple(a[2:]) == tuple(b[2:])


class SharedGlobalState(object):
    """Seeds NumPy's global random state from ``words`` for a block and
    puts the previous state back afterwards; ``drawn`` then says whether
    anything drew from it meanwhile.

    For the ``'@numpy'`` replica threads, which share the process's global
    state with the caller (who waits for them, drawing nothing).

    Args:
        words (numpy.ndarray): The seed (see :meth:`ReplicaSeed.words`).
    """

    def __init__(self, words):
        self._words = words
        self._installed = None
        self._saved = None
        self.drawn = False

    def __enter__(self):
        self._saved = numpy.random.get_state(legacy=True)
        numpy.random.seed(self._words)
        self._installed = numpy.random.get_state(legacy=True)
        return self

    def __exit__(self, *exc):
        self.drawn = not same_numpy_state(numpy.random.get_state(legacy=True),
                                     self._installed)
        numpy.random.set_state(self._saved)
        return False


@contextlib.contextmanager
def replica_streams(seed, device):
    """Seeds the random streams of one replica's iteration.

    Args:
        seed (ReplicaSeed): The iteration's seed of the replica.
        device (chainer.backend.Device): The replica's device, current in
            the calling thread.
    """
    if seed.global_numpy:
        numpy.random.seed(seed.words(NUMPY_STREAM))
    state = getattr(_local, 'replica_state', None)
    if state is None:
        state = _local.replica_state = numpy.random.RandomState()
    state.seed(seed.words(DROPOUT_STREAM))
    previous = getattr(_local, 'state', None)
    _local.state = state
    try:
        with _cupy_state(seed, device):
            yield
    finally:
        _local.state = previous


@contextlib.contextmanager
def _cupy_state(seed, device):
    """Makes a CuPy state of the replica's own, seeded from its stream, the
    state of its device (current in this thread) for the block."""
    if not isinstance(device, chainer.backend.GpuDevice):
        yield
        return
    import cupy
    states = getattr(_local, 'cupy_states', None)
    if states is None:
        states = _local.cupy_states = {}
    value = int(seed.sequence(CUPY_STREAM).generate_state(
        1, numpy.uint64)[0])
    state = states.get(device.device.id)
    if state is None:
        state = states[device.device.id] = cupy.random.RandomState(value)
    else:
        state.seed(value)
    previous = cupy.random.get_random_state()
    cupy.random.set_random_state(state)
    try:
        yield
    finally:
        cupy.random.set_random_state(previous)


@contextlib.contextmanager
def thread_random_state(seed):
    """Gives the current thread its own random state for the block.

    Args:
        seed (int, array or numpy.random.SeedSequence): Seed of the
            thread's ``numpy.random.RandomState``.
    """
    previous = getattr(_local, 'state', None)
    if isinstance(seed, numpy.random.SeedSequence):
        seed = numpy.random.MT19937(seed)
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
