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

A batch is read ahead from the global random states ``StandardUpdater``
would read it from: the caller's right after the last batch was drawn, and
where the step ends an epoch of a ``shuffle=True`` iterator, after its
shuffle, drawn ahead from them and the caller's states put back. A dataset
found drawing from NumPy's or Python's global random state while a batch
is drawn on the caller's thread (the first batch is always drawn there),
or while one is read ahead in the background thread (where every such
call is refused before it draws, by
:class:`~cgdp_chainer.runtime.input.global_random.DrawRefusal`, and the
batch drawn anew on the caller; where NumPy's draws cannot be refused,
NumPy 2's, a dataset not seen drawing is read in the reader process, and a
batch whose read there drew is drawn anew on the caller), as augmentations
do (Chainer's imagenet example, ChainerCV's transforms),
is read in a reader process from copies of those states
(:mod:`~cgdp_chainer.runtime.input.reader_process`); its batch is taken
only if nothing drew on the caller's states since, and the reader's states
after it then become the caller's: they are ``StandardUpdater``'s after
every ``update()``. A batch read ahead is used only if nothing moved the
iterator since (a resume, ``reset()``, an extension's own ``next()``) and,
where it draws or was shuffled ahead, nothing drew on the caller's states
(an extension); otherwise it is dropped and the batch drawn anew. Not read
ahead: past the end of an iterator that does not repeat, across an epoch's
end of an order sampler other than ``shuffle=True``'s, and a dataset that
draws and cannot be pickled or changes its attributes when read (a reader's
copy would change instead); one line of the log says so.

``MultiprocessIterator`` and ``MultithreadIterator`` read ahead in their
own processes and threads; their next batch is converted while an
iteration computes, and taken by their own ``next()`` at its iteration
(:mod:`~cgdp_chainer.runtime.input.prefetch_read_ahead`). Other iterators
(user iterators, one iterator per device) are not read ahead; each
replica's share of their batch is still converted in parallel
(:class:`ShareConverter`), and one line of the log says so. Batches that
are not lists of examples keep the path of
:mod:`~cgdp_chainer.runtime.input.batches`.
"""
import concurrent.futures

import chainer

from cgdp_chainer import log
from cgdp_chainer.runtime.input import batches as batches_module
from cgdp_chainer.runtime.input import global_random
from cgdp_chainer.runtime.input import prefetch_read_ahead
from cgdp_chainer.runtime.input import reader_process

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
        converted = batches_module.convert_share(self.convert, share)
        if converted is None:
            return None  # a share without examples (a short batch)
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


def why_not_read_ahead(iterator):
    """None where :class:`SerialReadAhead` can read ``iterator`` ahead
    exactly; otherwise the reason, in words."""
    kind = type(iterator)
    if not isinstance(iterator, _SerialIterator):
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


class _DrewInBackground(Exception):
    """A read ahead in the loader thread was refused a draw from the global
    random states: the batch is drawn anew on the caller."""


def _attribute_marks(dataset):
    """What shows that reading ``dataset`` changed it: each attribute's
    identity and, for a list, dict, set or bytearray, its length."""
    return {name: (id(value), len(value) if isinstance(
        value, (list, dict, set, bytearray)) else None)
        for name, value in getattr(dataset, '__dict__', {}).items()}


class _Prepared(object):
    """A batch read ahead: the iterator's state it was drawn from and the
    one it leads to, the caller's global random states it was read at
    (None where the batch draws nothing from them), its shares' sizes and the background work (which returns the examples, the
    converted shares and the global random states after the batch)."""

    def __init__(self, state, previous, next_state, states, counts, future):
        self.state = state
        self.previous = previous
        self.next_state = next_state
        self.states = states
        self.counts = counts
        self.future = future


class SerialReadAhead(object):
    """Reads a SerialIterator's next batch in the background, without
    moving the iterator or the global random states until that batch is
    taken.

    SerialIterator's ``__next__`` sets ``_previous_epoch_detail`` to its
    ``epoch_detail``, steps its ``_state`` (an immutable namedtuple) with
    ``_statemachine.iterator_statemachine`` and reads the dataset at the
    indices that gives: its whole visible state is those two attributes,
    which this class reads and, when the batch is taken, sets as
    ``__next__`` would (checked by :func:`why_not_read_ahead`).

    The batch is read from the global random states ``StandardUpdater``
    would read it from: the caller's right after the last batch was drawn
    (where the step ends an epoch of ``shuffle=True``, after the shuffle,
    drawn ahead and the caller's state put back). A dataset found drawing
    from them is read in a reader process
    (:mod:`~cgdp_chainer.runtime.input.reader_process`) from copies of
    those states; the batch is taken only if the caller's states are still
    those (nothing drew since), and the states after it become the
    caller's, as after ``StandardUpdater``'s ``next()``.

    Args:
        iterator (chainer.iterators.SerialIterator): The 'main' iterator.
        converter (ShareConverter): Converts the replicas' shares.
        n_shares (int): Replicas.
        loader (concurrent.futures.Executor): One thread: reads the
            dataset in order (or has the reader read it), then has the
            shares converted.
        say (callable): Logs a line of the run's log, as
            :func:`cgdp_chainer.log.say`.
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
        # Whether a dataset that draws is read ahead in a reader process;
        # its bytes until the reader has them.
        self.reads_in_process = False
        self._dataset_bytes = None
        self._reader = None  # made in the loader thread, at first use

    def next_batch(self):
        """This iteration's batch: the one read ahead if the iterator and
        the global random states are where it was left, else one drawn
        now.

        Returns:
            Batch: The replicas' shares (see
            :mod:`~cgdp_chainer.runtime.input.batches`).
        """
        prepared, self._prepared = self._prepared, None
        iterator = self.iterator
        if prepared is not None and iterator._state is prepared.state and \
                iterator._previous_epoch_detail is prepared.previous and (
                    prepared.states is None or
                    prepared.states.are_current()):
            return self._take(prepared)
        if prepared is not None:
            prepared.future.cancel()
        return self._draw_now()

    def _take(self, prepared):
        """The batch read ahead, the iterator moved as ``next()`` moves it;
        drawn now instead where the read was refused a draw."""
        iterator = self.iterator
        try:
            examples, shares, states = prepared.future.result()
        except _DrewInBackground:
            # Nothing moved: the refused draw was never made.
            return self._draw_now(seen_drawing=True)
        except BaseException:
            # What the dataset or the converter raised, with the iterator
            # moved as SerialIterator's next() leaves it.
            self._move(prepared)
            raise
        self._move(prepared)
        if prepared.states is not None:
            states.install()
        self.taken += 1
        return batches_module.from_read_ahead(
            prepared.counts, lambda: (examples, shares),
            self.converter.convert)

    def _move(self, prepared):
        iterator = self.iterator
        iterator._previous_epoch_detail = iterator.epoch_detail
        iterator._state = prepared.next_state

    def _draw_now(self, seen_drawing=False):
        """The batch drawn as StandardUpdater draws it, watching whether the
        dataset draws from the global random states (``seen_drawing``: a
        read ahead of it was refused a draw)."""
        sampled = self._would_sample()
        marks = _attribute_marks(self.iterator.dataset)
        with global_random.GlobalRandomWatch() as watch:
            examples = self.iterator.next()
        if (seen_drawing or not sampled) and self._dataset_draws is not True:
            first = self._dataset_draws is None
            self._dataset_draws = watch.drew or seen_drawing
            changed = marks != _attribute_marks(self.iterator.dataset)
            if self._dataset_draws and not self.reads_in_process:
                self._choose_reader(changed)
            elif first and not self._dataset_draws and \
                    not global_random.DrawRefusal.sees_every_draw():
                self._choose_reader(changed, proving=True)
        return batches_module.from_iterator_batch(
            examples, self.n_shares, self.converter.convert,
            self.converter.convert_shares)

    def _choose_reader(self, changed, proving=False):
        """For a dataset found drawing from the global random states (or,
        ``proving``, one not seen drawing where a thread's read could not
        be refused a draw): reads ahead in a reader process if its copy
        there reads as it does."""
        why = None
        if changed:
            why = ("its get_example changes the dataset's attributes, which "
                   "a reader process would change in its copy")
        else:
            self._dataset_bytes, why = reader_process.pickle_dataset(
                self.iterator.dataset)
        draws = ('may draw from NumPy\'s global random state (this NumPy\'s '
                 'draws cannot be refused in a thread)' if proving else
                 "draws from NumPy's or Python's global random state")
        if why is None:
            self.reads_in_process = True
            self._say(
                'CGDP input: get_example draws from the global random '
                'states: batches are read in a reader process',
                "the dataset's get_example {}: the next batch is read from "
                "the states StandardUpdater reads it from, and its states "
                "after become the caller's when the batch is used{}".format(
                    draws, ' (a batch that drew nothing is used as read)'
                    if proving else ''))
        elif proving:
            # Read in the thread still: its Python draws are refused, its
            # NumPy draws would go unseen (said here and in USAGE.md).
            self._say(
                'CGDP input: a NumPy draw in get_example would go unseen '
                '(read in a thread)',
                "the next batch is read in a background thread, where a "
                "draw from NumPy's global random state would go unseen with "
                "this NumPy (its draws cannot be refused in a thread), since "
                "{}: a dataset that draws from it must do so from its first "
                "batch on".format(why), log.NOTICE)
        else:
            self._say(
                'CGDP input: not read ahead (get_example draws from the '
                'global random states)',
                "the dataset's get_example {} and {}; each replica's share "
                "is converted in parallel".format(draws, why), log.NOTICE)

    def _would_sample(self):
        """Whether the next ``next()`` calls the order sampler."""
        try:
            self._advance(_refuse_to_sample)
        except _WouldSample:
            return True
        return False

    def _advance(self, sampler):
        """The iterator's next state and indices, without moving it."""
        iterator = self.iterator
        return _statemachine.iterator_statemachine(
            iterator._state, iterator.batch_size, iterator.repeat,
            sampler, len(iterator.dataset))

    def _step_ahead(self):
        """The iterator's next state, its indices, the caller's global
        random states now and the ones to read the batch from (after the
        shuffle where the step ends an epoch); None where the step would
        call an order sampler other than ``shuffle=True``'s."""
        states = global_random.RandomStates.now()
        try:
            next_state, indices = self._advance(_refuse_to_sample)
            return next_state, indices, states, states
        except _WouldSample:
            sampler = self.iterator.order_sampler
            if not global_random.draws_only_global_numpy(sampler):
                return None
        (next_state, indices), numpy_state = global_random.sample_ahead(
            lambda: self._advance(sampler))
        return next_state, indices, states, global_random.RandomStates(
            numpy_state, states.python_state)

    def read_ahead(self):
        """Starts reading the next batch in the background, where that is
        exact (see the module's docs)."""
        load = self._loader_function()
        if self._prepared is not None or load is None:
            return
        step = self._step_ahead()
        if step is None:
            return
        next_state, indices, states, read_from = step
        if indices is None or len(indices) < self.n_shares:
            return  # the end of an iterator that does not repeat
        n = self.n_shares
        iterator = self.iterator
        self._prepared = _Prepared(
            iterator._state, iterator._previous_epoch_detail, next_state,
            # A batch that draws nothing is the same whatever drew since.
            states if self._dataset_draws or read_from is not states
            else None,
            [len(indices[k::n]) for k in range(n)],
            self._loader.submit(load, indices, read_from))

    def _loader_function(self):
        """What reads the next batch in the loader thread; None where no
        batch is read ahead."""
        if self._dataset_draws is None:
            return None
        if self._dataset_draws:
            return self._load_in_reader if self.reads_in_process else None
        return self._load_proven if self.reads_in_process else self._load

    def _load_proven(self, indices, read_from):
        """In the loader thread: the examples read by the reader process,
        where that read drew nothing (else the batch is drawn anew)."""
        examples, shares, after = self._load_in_reader(indices, read_from)
        if not after.same_as(read_from):
            raise _DrewInBackground('a draw in the reader process')
        return examples, shares, after

    def _load(self, indices, read_from):
        """In the loader thread: the examples, in the order StandardUpdater
        reads them (the dataset draws nothing), and each share converted."""
        dataset = self.iterator.dataset
        # The dataset drew nothing so far, but may draw for any example:
        # a draw here would move the caller's states at another time than
        # StandardUpdater's, so it is refused and the batch drawn anew.
        refusal = global_random.DrawRefusal()
        try:
            with refusal:
                examples = [dataset[index] for index in indices]
        except BaseException:
            if refusal.refused is None:
                raise
        if refusal.refused is not None:  # raised, or swallowed
            raise _DrewInBackground(refusal.refused)
        return self._converted(examples, read_from)

    def _load_in_reader(self, indices, read_from):
        """In the loader thread: the examples read by the reader process
        from ``read_from``, each share converted, and its states after."""
        if self._reader is None:
            dataset_bytes, self._dataset_bytes = self._dataset_bytes, None
            self._reader = reader_process.DatasetReader(dataset_bytes)
        examples, after = self._reader.read(indices, read_from)
        return self._converted(examples, after)

    def _converted(self, examples, states):
        n = self.n_shares
        return examples, self.converter.convert_shares(
            [examples[k::n] for k in range(n)]), states

    def discard(self):
        """Drops the batch read ahead (a resume)."""
        if self._prepared is not None:
            self._prepared.future.cancel()
            self._prepared = None

    def close(self):
        """Drops the batch read ahead; the reader process ends once the
        loader thread's work under way is done."""
        self.discard()
        self._loader.submit(self._close_reader)

    def _close_reader(self):
        if self._reader is not None:
            self._reader.close()
            self._reader = None


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

    def close(self):
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
        say (callable): Logs a line of the run's log, as
            :func:`cgdp_chainer.log.say`.
    """

    def __init__(self, iterators, convert, n_shares, split, say):
        self.converter = ShareConverter(convert, n_shares)
        self._loader = None
        why = why_not_read_ahead(iterators[0]) if split else (
            'one iterator per device')
        peek = prefetch_read_ahead.peek_for(iterators[0]) if split else None
        if why is None or peek is not None:
            self._loader = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix='cgdp-read-ahead')
        if why is None:
            self._source = SerialReadAhead(
                iterators[0], self.converter, n_shares, self._loader, say)
        elif peek is not None:
            self._source = prefetch_read_ahead.PrefetchReadAhead(
                iterators[0], peek, self.converter, n_shares, self._loader)
        else:
            self._source = _DrawEach(iterators, self.converter, n_shares,
                                     split)
            say('CGDP input: not read ahead ({})'.format(why),
                "each replica's share is converted {}".format(
                    'in parallel' if n_shares > 1 else 'at its iteration'),
                log.NOTICE)

    @property
    def reads_ahead(self):
        """Whether batches may be read (or converted) ahead: a
        SerialIterator, MultiprocessIterator or MultithreadIterator."""
        return self._loader is not None

    @property
    def reads_in_process(self):
        """Whether batches are read ahead in a reader process (a dataset
        that draws from the global random states)."""
        return getattr(self._source, 'reads_in_process', False)

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
        """Stops the background threads and the reader process (waits for
        work under way)."""
        self._source.close()
        if self._loader is not None:
            self._loader.shutdown(wait=True)
        self.converter.close()
