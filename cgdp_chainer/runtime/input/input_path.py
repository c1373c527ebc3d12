"""The input path: each iteration's batch drawn and converted, the next one
read ahead while the replicas compute where that is exact.

``StandardUpdater`` draws the batch (``iterator.next()``, which reads the
dataset) and converts it at the start of every iteration, while nothing
else runs. Here, for a :class:`~chainer.iterators.SerialIterator` (or a
subclass that keeps its ``__next__`` and ``serialize``), the batch of
iteration ``i + 1`` is read from the dataset and each replica's share of it
converted in background threads while iteration ``i`` computes
(:class:`SerialReadAhead`); the iterator itself moves only when iteration
``i + 1`` takes that batch, so that what extensions and snapshots see of it
(``epoch``, ``epoch_detail``, ``previous_epoch_detail``, ``is_new_epoch``,
``current_position``, what a snapshot saves) is at every moment what it is
under ``StandardUpdater``. The dataset's ``get_example`` then runs in a
background thread, as with :class:`~chainer.iterators.MultithreadIterator`,
in the order ``StandardUpdater`` reads it, and the converter too
(in ``chainer.config``'s defaults: that configuration is per thread).

A batch is read ahead only where that leaves every random stream as
``StandardUpdater`` leaves it: never across an epoch's end where the
iterator's order sampler would be called (it draws random numbers, usually
from NumPy's global state), never past the end of an iterator that does not
repeat, and not at all for a dataset found drawing from NumPy's or Python's
global random state while a batch is drawn on the caller's thread (the
first batch is always drawn there): those batches are drawn at their
iteration, as ``StandardUpdater`` draws them. A batch read ahead is used
only if nothing moved the iterator since (a resume, ``reset()``, an
extension's own ``next()``); otherwise it is dropped and the batch drawn
anew.

Other iterators (``MultiprocessIterator``, which prefetches in its own
processes, ``MultithreadIterator``, user iterators, one iterator per
device) are not read ahead; each replica's share of their batch is still
converted in parallel (:class:`ShareConverter`), and one line of the log
says so. Batches that are not lists of examples keep the path of
:mod:`~cgdp_chainer.runtime.input.batches`.
"""
import concurrent.futures
import random

import chainer
import numpy

from cgdp_chainer.runtime.input import batches as batches_module

_SerialIterator = chainer.iterators.SerialIterator
_statemachine = chainer.iterators._statemachine


class ShareConverter(object):
    """Converts each replica's share of a batch once, the shares in
    parallel (the first in the calling thread, the others in a pool).

    Args:
        convert (callable): ``convert(examples)``: the converter with the
            host device.
        n_shares (int): Replicas.
    """

    def __init__(self, convert, n_shares):
        self.convert = convert
        self._stagers = [None] * n_shares
        self._pool = None
        if n_shares > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                n_shares - 1, thread_name_prefix='cgdp-convert')

    def stage_with(self, stagers):
        """Has each converted share staged for its replica's device in the
        thread that converted it (see
        :mod:`~cgdp_chainer.runtime.transport.input_staging`).

        Args:
            stagers (list): Per replica, ``stage(in_arrays)`` or None (the
                share stays in host memory).
        """
        self._stagers = list(stagers)

    def _convert_share(self, index, share):
        converted = self.convert(share)
        stage = self._stagers[index] if index < len(self._stagers) else None
        return converted if stage is None else stage(converted)

    def convert_shares(self, shares):
        """Each share converted (and staged, see :meth:`stage_with`), in
        order.

        Raises:
            Exception: The first that a conversion raised.
        """
        if self._pool is None or len(shares) == 1:
            return [self._convert_share(index, share)
                    for index, share in enumerate(shares)]
        others = [self._pool.submit(self._convert_share, index, share)
                  for index, share in enumerate(shares) if index > 0]
        try:
            first = self._convert_share(0, shares[0])
        except BaseException:
            for future in others:
                future.cancel()
            raise
        return [first] + [future.result() for future in others]

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


class GlobalRandomWatch(object):
    """Tells whether code drew from NumPy's or Python's global random
    state (a dataset whose ``get_example`` augments with them)."""

    def __enter__(self):
        self._numpy = numpy.random.get_state()
        self._python = random.getstate()
        self.drew = False
        return self

    def __exit__(self, *exc):
        after = numpy.random.get_state()
        self.drew = (after[2] != self._numpy[2] or
                     not numpy.array_equal(after[1], self._numpy[1]) or
                     random.getstate() != self._python)
        return False


def why_not_read_ahead(iterator):
    """None where :class:`SerialReadAhead` can read ``iterator`` ahead
    exactly; otherwise the reason, in words."""
    kind = type(iterator)
    if not isinstance(iterator, _SerialIterator):
        if isinstance(iterator, chainer.iterators.MultiprocessIterator):
            return 'MultiprocessIterator prefetches in its own processes'
        return ('a {} is not a SerialIterator, whose state can be advanced '
                'without moving it'.format(kind.__name__))
    for name in ('__next__', 'next', 'serialize'):
        if getattr(kind, name) is not getattr(_SerialIterator, name):
            return ('{} overrides SerialIterator.{}'.format(
                kind.__name__, name))
    return None


class _WouldSample(Exception):
    """The state machine would call the order sampler."""


def _refuse_to_sample(order, position):
    raise _WouldSample()


class _Prepared(object):
    """A batch read ahead: the iterator's state it was drawn from and the
    one it leads to, its shares' sizes and the background work."""

    def __init__(self, state, previous, next_state, counts, future):
        self.state = state
        self.previous = previous
        self.next_state = next_state
        self.counts = counts
        self.future = future


class SerialReadAhead(object):
    """Reads a SerialIterator's next batch in the background, without
    moving the iterator until that batch is taken.

    SerialIterator's ``__next__`` sets ``_previous_epoch_detail`` to its
    ``epoch_detail``, steps its ``_state`` (an immutable namedtuple) with
    ``_statemachine.iterator_statemachine`` and reads the dataset at the
    indices that gives: its whole visible state is those two attributes,
    which this class reads and, when the batch is taken, sets as
    ``__next__`` would (checked by :func:`why_not_read_ahead`).

    Args:
        iterator (chainer.iterators.SerialIterator): The 'main' iterator.
        converter (ShareConverter): Converts the replicas' shares.
        n_shares (int): Replicas.
        loader (concurrent.futures.Executor): One thread: reads the
            dataset in order, then has the shares converted.
        say (callable): Prints a line of the run's log.
    """

    def __init__(self, iterator, converter, n_shares, loader, say):
        self.iterator = iterator
        self.converter = converter
        self.n_shares = n_shares
        self._loader = loader
        self._say = say
        self._prepared = None
        self.taken = 0  # batches read ahead and used
        # None until a batch drawn on the caller's thread told whether the
        # dataset draws from the global random states.
        self._dataset_draws = None

    def next_batch(self):
        """This iteration's batch: the one read ahead if the iterator is
        where it was left, else one drawn now.

        Returns:
            Batch: The replicas' shares (see
            :mod:`~cgdp_chainer.runtime.input.batches`).
        """
        prepared, self._prepared = self._prepared, None
        iterator = self.iterator
        if prepared is not None and iterator._state is prepared.state and \
                iterator._previous_epoch_detail is prepared.previous:
            iterator._previous_epoch_detail = iterator.epoch_detail
            iterator._state = prepared.next_state
            self.taken += 1
            return batches_module.from_read_ahead(
                prepared.counts, prepared.future.result,
                self.converter.convert)
        if prepared is not None:
            prepared.future.cancel()
        return self._draw_now()

    def _draw_now(self):
        """The batch drawn as StandardUpdater draws it, watching whether the
        dataset draws from the global random states."""
        sampled = self._would_sample()
        with GlobalRandomWatch() as watch:
            examples = self.iterator.next()
        if not sampled and self._dataset_draws is not True:
            self._dataset_draws = watch.drew
            if watch.drew:
                self._say(
                    "CGDP input: not read ahead: the dataset's get_example "
                    "draws from NumPy's or Python's global random state, "
                    'whose stream reading it in the background would '
                    'change; each replica\'s share is converted in '
                    'parallel')
        return batches_module.from_iterator_batch(
            examples, self.n_shares, self.converter.convert,
            self.converter.convert_shares)

    def _would_sample(self):
        """Whether the next ``next()`` calls the order sampler."""
        try:
            self._advance()
        except _WouldSample:
            return True
        return False

    def _advance(self):
        """The iterator's next state and indices, without moving it; raises
        :class:`_WouldSample` where that would call the order sampler."""
        iterator = self.iterator
        return _statemachine.iterator_statemachine(
            iterator._state, iterator.batch_size, iterator.repeat,
            _refuse_to_sample, len(iterator.dataset))

    def read_ahead(self):
        """Starts reading the next batch in the background, where that is
        exact (see the module's docs)."""
        if self._prepared is not None or self._dataset_draws is not False:
            return
        iterator = self.iterator
        try:
            next_state, indices = self._advance()
        except _WouldSample:
            return
        if indices is None or len(indices) < self.n_shares:
            return  # the end of an iterator that does not repeat
        n = self.n_shares
        self._prepared = _Prepared(
            iterator._state, iterator._previous_epoch_detail, next_state,
            [len(indices[k::n]) for k in range(n)],
            self._loader.submit(self._load, iterator.dataset, indices))

    def _load(self, dataset, indices):
        """In the loader thread: the examples, in the order StandardUpdater
        reads them, and each share converted."""
        examples = [dataset[index] for index in indices]
        n = self.n_shares
        return examples, self.converter.convert_shares(
            [examples[k::n] for k in range(n)])

    def discard(self):
        """Drops the batch read ahead (a resume)."""
        if self._prepared is not None:
            self._prepared.future.cancel()
            self._prepared = None


class _DrawEach(object):
    """Draws every batch at its iteration (no read-ahead), converting the
    shares in parallel.

    Args:
        iterators (list): The 'main' iterator, or one per device.
        converter (ShareConverter): Converts the replicas' shares.
        n_shares (int): Replicas.
        split (bool): Whether the devices split one iterator's batch.
    """

    def __init__(self, iterators, converter, n_shares, split):
        self.iterators = iterators
        self.converter = converter
        self.n_shares = n_shares
        self.split = split

    def next_batch(self):
        if self.split:
            return batches_module.from_iterator_batch(
                self.iterators[0].next(), self.n_shares,
                self.converter.convert, self.converter.convert_shares)
        return batches_module.from_device_batches(
            [iterator.next() for iterator in self.iterators],
            self.converter.convert, self.converter.convert_shares)

    def read_ahead(self):
        pass

    def discard(self):
        pass


class InputPath(object):
    """Gives each iteration its batch, split over the replicas and
    converted; reads the next one ahead where that is exact.

    Args:
        iterators (list): The 'main' iterator (the devices split its
            batch), or one iterator per device (``split`` False).
        convert (callable): ``convert(examples)``: the converter with the
            host device.
        n_shares (int): Replicas.
        split (bool): Whether the devices split one iterator's batch.
        say (callable): Prints a line of the run's log.
    """

    def __init__(self, iterators, convert, n_shares, split, say):
        self.converter = ShareConverter(convert, n_shares)
        self._loader = None
        why = why_not_read_ahead(iterators[0]) if split else (
            'one iterator per device')
        if why is None:
            self._loader = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix='cgdp-read-ahead')
            self._source = SerialReadAhead(
                iterators[0], self.converter, n_shares, self._loader, say)
        else:
            self._source = _DrawEach(iterators, self.converter, n_shares,
                                     split)
            say('CGDP input: not read ahead ({}); each replica\'s share '
                'is converted {}'.format(why, 'in parallel' if n_shares > 1
                                         else 'at its iteration'))

    @property
    def reads_ahead(self):
        """Whether batches may be read ahead (SerialIterator)."""
        return self._loader is not None

    @property
    def batches_read_ahead(self):
        """How many batches so far were read ahead and used."""
        return getattr(self._source, 'taken', 0)

    def next_batch(self):
        """This iteration's :class:`~cgdp_chainer.runtime.input.batches.Batch`."""
        return self._source.next_batch()

    def stage_with(self, stagers):
        """Stages each share for its replica's device where it is converted
        (a batch read ahead: in the background, while the last iteration
        computes); see :meth:`ShareConverter.stage_with`."""
        self.converter.stage_with(stagers)

    def read_ahead(self):
        """Starts the next batch's reading, where it is exact; call it once
        this iteration's batch is taken, before the replicas run."""
        self._source.read_ahead()

    def discard(self):
        """Drops a batch read ahead (the iterator was restored)."""
        self._source.discard()

    def close(self):
        """Stops the background threads (waits for work under way)."""
        self._source.discard()
        if self._loader is not None:
            self._loader.shutdown(wait=True, cancel_futures=True)
        self.converter.close()
