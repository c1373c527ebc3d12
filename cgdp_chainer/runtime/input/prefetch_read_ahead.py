"""The next batch of an iterator that prefetches (``MultiprocessIterator``,
``MultithreadIterator``) converted while an iteration computes.

Such an iterator reads its next batch in its own processes or threads
already; what ``StandardUpdater`` still does on the critical path is to
wait for it and convert it. Here a background thread waits until the
batch the iterator's next ``next()`` will return is in its prefetch
(``MultiprocessIterator``: the head of its queue; ``MultithreadIterator``:
its pending read), looks at it without taking it, and converts each
replica's share. The iterator itself is not moved: at the next iteration
its own ``next()`` is called, where ``StandardUpdater`` calls it, and the
shares converted ahead are used only if it returned those very examples
(each the same object). So the iterator's visible state, its snapshots,
its epoch-end shuffles, and whatever an extension does to it (``next()``,
``serialize``, ``reset()``) are exactly ``StandardUpdater``'s; a batch
that is not the one converted ahead is converted at its iteration.
"""
import threading
import time
import warnings

import chainer

from cgdp_chainer.runtime.input import batches as batches_module

# How often a wait for the prefetch looks whether the path is closing.
POLL_SECONDS = 0.05


def peek_for(iterator):
    """The function that waits for ``iterator``'s next batch in its
    prefetch and returns it without taking it (None where there is none
    to wait for), or None for an iterator that does not prefetch."""
    if isinstance(iterator, chainer.iterators.MultiprocessIterator):
        return _peek_multiprocess
    if isinstance(iterator, chainer.iterators.MultithreadIterator):
        return _peek_multithread
    return None


def _peek_multiprocess(iterator, stopping):
    # Chainer's _Communicator: next() pops the head of ``_batch_queue``
    # under ``_lock``; its prefetch thread appends and notifies
    # ``_not_empty_cond``.
    comm = iterator._comm
    if comm is None:
        return None
    stalled = _StallWarning(iterator.dataset_timeout)
    with comm._lock:
        while not comm._batch_queue:
            if stopping.is_set() or iterator._comm is not comm:
                return None  # closing, or the iterator was finalized
            comm._not_empty_cond.wait(POLL_SECONDS)
            stalled.check()
        return comm._batch_queue[0][0]


class _StallWarning(object):
    """Warns as ``MultiprocessIterator.next()`` does while it waits (a
    dataset that stalls, or whose error ended the prefetch), once every
    ``timeout`` seconds (None: never)."""

    def __init__(self, timeout):
        self._timeout = timeout
        self._since = time.monotonic()

    def check(self):
        if self._timeout is None or \
                time.monotonic() - self._since <= self._timeout:
            return
        self._since = time.monotonic()
        warnings.warn(
            'Stalled dataset is detected (CGDP waits for the '
            "MultiprocessIterator's next batch). See the documentation of "
            'MultiprocessIterator for common causes and workarounds',
            chainer.iterators.MultiprocessIterator.TimeoutWarning)


def _peek_multithread(iterator, stopping):
    # MultithreadIterator: next() returns the list of ``_next``'s values
    # (a multiprocessing.pool.AsyncResult) and starts the next read.
    pending = iterator._next
    if pending is None:
        return None
    while not pending.ready():
        if stopping.is_set():
            return None
        pending.wait(POLL_SECONDS)
    if not pending.successful():
        return None  # next() raises it, where StandardUpdater would
    return list(pending.get())


def _same_examples(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class PrefetchReadAhead(object):
    """Converts the shares of a prefetching iterator's next batch while an
    iteration computes (see the module's docs).

    Args:
        iterator: The 'main' iterator.
        peek (callable): ``peek(iterator, stopping)``, from
            :func:`peek_for`.
        converter (ShareConverter): Converts the replicas' shares.
        n_shares (int): Replicas.
        loader (concurrent.futures.Executor): One thread: waits for the
            prefetch, then has the shares converted.
    """

    def __init__(self, iterator, peek, converter, n_shares, loader):
        self.iterator = iterator
        self.converter = converter
        self.n_shares = n_shares
        self._peek = peek
        self._loader = loader
        self._stopping = threading.Event()
        self._prepared = None
        self.taken = 0  # batches converted ahead and used

    def next_batch(self):
        """This iteration's batch, taken by the iterator's own ``next()``;
        its shares are the ones converted ahead if it is that batch."""
        prepared, self._prepared = self._prepared, None
        peeked = None
        if prepared is not None:
            try:
                peeked = prepared.result()
            except Exception:
                peeked = None  # the conversion's error: converted again
        examples = self.iterator.next()
        if peeked is not None and isinstance(examples, list) and \
                _same_examples(peeked[0], examples):
            self.taken += 1
            n = self.n_shares
            return batches_module.from_read_ahead(
                [len(examples[k::n]) for k in range(n)],
                lambda: (examples, peeked[1]), self.converter.convert)
        return batches_module.from_iterator_batch(
            examples, self.n_shares, self.converter.convert,
            self.converter.convert_shares)

    def read_ahead(self):
        """Starts waiting for the next batch and converting it."""
        if self._prepared is None:
            self._prepared = self._loader.submit(self._convert_next)

    def _convert_next(self):
        """In the loader thread: the next batch's examples and converted
        shares, or None (no batch, or not a list of enough examples)."""
        examples = self._peek(self.iterator, self._stopping)
        n = self.n_shares
        if not isinstance(examples, list) or len(examples) < n:
            return None
        return examples, self.converter.convert_shares(
            [examples[k::n] for k in range(n)])

    def discard(self):
        """Nothing to drop: the shares are used only for the batch that
        ``next()`` returns."""

    def close(self):
        """Stops a wait for the prefetch."""
        self._stopping.set()
        if self._prepared is not None:
            self._prepared.cancel()
            self._prepared = None
