"""The input path (cgdp_chainer.runtime.input.input_path): the next batch read
ahead while an iteration computes leaves the iterator, the snapshots, the
random streams and the result exactly StandardUpdater's; each share is
converted once; errors in the background surface."""
import io
import os
import random
import sys
import threading
import traceback

import chainer
from chainer.dataset import convert
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer

from equivalence import assert_same_params
import semantics_models
import staged_models
from log_capture import said  # NOQA: the fixture

PROCESS = pytest.param('process', marks=pytest.mark.slow)
N_EXAMPLES = 12


class _Recording(chainer.dataset.DatasetMixin):
    """staged_models' dataset, recording the indices read."""

    def __init__(self, n=N_EXAMPLES, fail_at=None, draw=False):
        self.base = staged_models.dataset(n)
        self.read = []
        self.fail_at = fail_at
        self.draw = draw

    def __len__(self):
        return len(self.base)

    def get_example(self, i):
        self.read.append(int(i))
        if self.fail_at is not None and len(self.read) > self.fail_at:
            raise KeyError('example {} is missing'.format(i))
        x, t = self.base[i]
        if self.draw:  # augmentation from NumPy's global state
            x = x + numpy.float32(numpy.random.normal(0, 0.01))
        return x, t


class _OwnNext(chainer.iterators.SerialIterator):
    """A SerialIterator whose ``__next__`` is its own: not read ahead."""

    def __next__(self):
        return super(_OwnNext, self).__next__()

    next = __next__


def _serial(batch, shuffle=False, repeat=True):
    def make(dataset):
        return chainer.iterators.SerialIterator(dataset, batch,
                                                repeat=repeat, shuffle=shuffle)
    return make


def _multiprocess(n_processes):
    def make(dataset):
        return chainer.iterators.MultiprocessIterator(
            dataset, 4, shuffle=False, n_processes=n_processes)
    return make


def _visible(iterator):
    """What extensions and snapshots see of an iterator."""
    return (iterator.epoch, iterator.epoch_detail,
            iterator.previous_epoch_detail, iterator.is_new_epoch,
            getattr(iterator, 'current_position', None))


def _cgdp(workers, n=1, **kwargs):
    def make(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * n, workers=workers,
            reduction='mean', **kwargs)
    return make


def _standard(iterator, optimizer):
    return updaters.StandardUpdater(iterator, optimizer)


def _trace(make_updater, make_iterator, iterations, dataset=None, seed=0):
    """Trains; returns the iterator's visible state after every update,
    the parameters, the dataset's reads and the updater's input path."""
    numpy.random.seed(seed)
    model = semantics_models.CountingClassifier(sum_loss=False)
    optimizer = chainer.optimizers.MomentumSGD(0.1).setup(model)
    dataset = dataset if dataset is not None else _Recording()
    iterator = make_iterator(dataset)
    updater = make_updater(iterator, optimizer)
    states = []
    try:
        for _ in range(iterations):
            try:
                updater.update()
            except StopIteration:
                states.append('stop')
                break
            states.append(_visible(iterator))
    finally:
        path = getattr(updater, '_input_path', None)
        updater.finalize()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return states, params, dataset.read, path


@pytest.mark.parametrize('make_iterator, read_ahead', [
    (_serial(4), True), (_serial(5), True), (_serial(4, shuffle=True), True),
    (_serial(5, shuffle=True), True), (_serial(5, repeat=False), True),
    (_serial(3, repeat=False, shuffle=True), True),
    (lambda dataset: _OwnNext(dataset, 5), False),
    (_multiprocess(1), True), (_multiprocess(2), True)])
def test_iterator_is_standard_updaters_after_every_iteration(
        make_iterator, read_ahead):
    expected, expected_params, expected_reads, _ = _trace(
        _standard, make_iterator, 9)
    actual, params, reads, path = _trace(_cgdp('thread', 2), make_iterator,
                                         9)
    assert actual == expected
    assert_same_params(expected_params, params)
    if not isinstance(make_iterator(_Recording()),
                      chainer.iterators.MultiprocessIterator):
        # The same examples in one order, and at most the batch read
        # ahead for an iteration that did not run.
        assert reads[:len(expected_reads)] == expected_reads
        assert len(reads) - len(expected_reads) in ((0, 4, 5) if read_ahead
                                                    else (0,))
    assert path.reads_ahead == read_ahead
    assert (path.batches_read_ahead > 0) == read_ahead


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_read_ahead_with_either_worker_kind_is_standard_updaters(workers):
    make_iterator = _serial(5, shuffle=True)
    expected, expected_params, expected_reads, _ = _trace(
        _standard, make_iterator, 7)
    actual, params, reads, path = _trace(_cgdp(workers), make_iterator, 7)
    assert actual == expected
    assert reads[:len(expected_reads)] == expected_reads
    assert_same_params(expected_params, params)
    assert path.batches_read_ahead > 0


def test_iterators_that_are_not_read_ahead_say_why(said):
    _trace(_cgdp('thread', 2), lambda dataset: _OwnNext(dataset, 4), 2)
    assert "not read ahead (_OwnNext overrides SerialIterator.__next__): " \
        "each replica's share is converted in parallel" in \
        said()


def test_a_dataset_drawing_and_changing_itself_is_not_read_ahead(said):
    # _Recording appends to its list when read: a reader process's copy
    # would record the reads instead of it.
    make_iterator = _serial(5, shuffle=True)
    expected, expected_params, _, _ = _trace(
        _standard, make_iterator, 6, dataset=_Recording(draw=True))
    actual, params, _, path = _trace(
        _cgdp('thread', 2), make_iterator, 6, dataset=_Recording(draw=True))
    assert actual == expected
    assert_same_params(expected_params, params)
    assert path.batches_read_ahead == 0
    assert "get_example draws from NumPy's or Python's global random " \
        "state and its get_example changes the dataset's attributes" in \
        said()


def _snapshot_run(make_updater, tmp_path, before, after):
    """``before`` updates, a snapshot, then ``after`` updates of a fresh
    updater and model that load it; returns the parameters and the
    iterator's visible state at the end."""
    path = str(tmp_path / 'snapshot.npz')
    numpy.random.seed(0)
    model = semantics_models.CountingClassifier(sum_loss=False)
    initial = model.copy(mode='copy')
    iterator = chainer.iterators.SerialIterator(_Recording(), 5)
    updater = make_updater(iterator, chainer.optimizers.MomentumSGD(
        0.1).setup(model))
    try:
        for _ in range(before):
            updater.update()
        chainer.serializers.save_npz(path, updater)
        global_state = numpy.random.get_state()
    finally:
        updater.finalize()
    numpy.random.seed(7)  # this epoch's order must come from the snapshot
    model = initial
    iterator = chainer.iterators.SerialIterator(_Recording(), 5)
    updater = make_updater(iterator, chainer.optimizers.MomentumSGD(
        0.1).setup(model))
    chainer.serializers.load_npz(path, updater)
    # The next epoch's shuffle draws from the global state, as it would
    # have in the uninterrupted run (a script would seed it).
    numpy.random.set_state(global_state)
    try:
        for _ in range(after):
            updater.update()
    finally:
        updater.finalize()
    return ({name: p.array.copy() for name, p in model.namedparams()},
            _visible(iterator))


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_a_snapshot_mid_epoch_resumes_as_an_uninterrupted_run(
        workers, tmp_path):
    whole, whole_params, _, _ = _trace(_cgdp(workers, 2),
                                       _serial(5, shuffle=True), 6)
    standard, standard_params, _, _ = _trace(_standard,
                                             _serial(5, shuffle=True), 6)
    resumed_params, resumed_state = _snapshot_run(
        _cgdp(workers, 2), tmp_path, before=3, after=3)
    assert resumed_state == whole[-1] == standard[-1]
    assert_same_params(whole_params, resumed_params)
    assert_same_params(standard_params, resumed_params)


def test_a_resume_into_a_running_updater_drops_the_batch_read_ahead(
        tmp_path):
    path = str(tmp_path / 'snapshot.npz')
    numpy.random.seed(0)
    model = semantics_models.CountingClassifier(sum_loss=False)
    iterator = chainer.iterators.SerialIterator(_Recording(), 5,
                                                shuffle=False)
    updater = _cgdp('thread')(iterator, chainer.optimizers.SGD().setup(
        model))
    try:
        updater.update()
        chainer.serializers.save_npz(path, updater)
        updater.update()  # reads the batch at 10 ahead
        chainer.serializers.load_npz(path, updater)
        assert iterator.current_position == 5
        reads = len(iterator.dataset.read)
        updater.update()  # the batch at 5 again, not the one read ahead
    finally:
        updater.finalize()
    assert iterator.current_position == 10
    assert iterator.dataset.read[reads:reads + 5] == [5, 6, 7, 8, 9]


class _CountingConverter(object):
    def __init__(self):
        self.sizes = []

    def __call__(self, batch, device=None):
        self.sizes.append(len(batch))
        return convert.concat_examples(batch, device)


@pytest.mark.parametrize('workers', ['thread', PROCESS])
@pytest.mark.parametrize('iterator_list', [False, True])
def test_each_share_is_converted_once(workers, iterator_list):
    numpy.random.seed(0)
    model = semantics_models.CountingClassifier(sum_loss=False)
    converter = _CountingConverter()
    if iterator_list:
        iterator = [chainer.iterators.SerialIterator(_Recording(), 2)
                    for _ in range(3)]
    else:
        iterator = chainer.iterators.SerialIterator(_Recording(), 6)
    updater = _cgdp(workers, 3, converter=converter)(
        iterator, chainer.optimizers.SGD().setup(model))
    try:
        updater.update()
        del converter.sizes[:]
        for _ in range(4):
            updater.update()
    finally:
        updater.finalize()
    assert converter.sizes == [2] * 12


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_an_error_in_get_example_surfaces_with_its_traceback(workers):
    # The second batch is read ahead: the error is raised in the
    # background, and by the update that uses the batch.
    model = semantics_models.CountingClassifier(sum_loss=False)
    iterator = chainer.iterators.SerialIterator(_Recording(fail_at=6), 4,
                                                shuffle=False)
    before = threading.active_count()
    updater = _cgdp(workers)(iterator, chainer.optimizers.SGD().setup(
        model))
    try:
        updater.update()
        assert iterator.current_position == 4
        with pytest.raises(KeyError, match='example 6 is missing') as info:
            updater.update()
        # Every thread of the updater ended with the error, before
        # finalize(): the background ones too.
        assert threading.active_count() == before
    finally:
        updater.finalize()
    frames = [frame.name for frame in traceback.extract_tb(info.tb)]
    assert 'get_example' in frames
    assert iterator.current_position == 8  # as SerialIterator leaves it


def test_a_gpu_replicas_reader_gives_views_of_the_segment_once():
    from cgdp_chainer.runtime.transport import shared
    buffer, reader = shared.BatchBuffer(), shared.BatchReader()
    small = (numpy.arange(6, dtype=numpy.float32).reshape(2, 3),
             numpy.array([1, 2], numpy.int32))
    try:
        x, t = reader.read(buffer.write(small), copy=False)
        numpy.testing.assert_array_equal(x, small[0])
        numpy.testing.assert_array_equal(t, small[1])
        # Views of the segment, not copies (the replica's device copies).
        assert not x.flags.owndata and not x.flags.writeable
        copied, _ = reader.read(buffer.write(small))
        assert copied.flags.owndata
        del x, t, copied
        # A larger batch moves to a new segment: the old one is unmapped.
        large = numpy.arange(1 << 16, dtype=numpy.float64)
        back = reader.read(buffer.write(large), copy=False)
        numpy.testing.assert_array_equal(back, large)
        del back
    finally:
        reader.close()
        buffer.close()


# -- the pipelines Chainer's users have -------------------------------------


class _Augmented(chainer.dataset.DatasetMixin):
    """staged_models' dataset augmented as Chainer's imagenet example's
    PreprocessedDataset augments: a shift and a flip drawn from Python's
    ``random``, noise from NumPy's global state."""

    def __init__(self, n=N_EXAMPLES, fail_at=None):
        self.base = staged_models.dataset(n)
        self.fail_at = fail_at

    def __len__(self):
        return len(self.base)

    def get_example(self, i):
        if i == self.fail_at:
            raise KeyError('example {} is missing'.format(i))
        x, t = self.base[i]
        x = numpy.roll(x, random.randint(0, 2))
        if random.randint(0, 1):
            x = x[::-1]
        noise = numpy.random.normal(0, 0.01, x.shape).astype(numpy.float32)
        return x + noise, t


def _own_shuffle():
    """An order sampler with a stream of its own: an iterator that
    prefetches in the background then shuffles as repeatably as the
    updater draws (``shuffle=True`` draws from NumPy's global state
    whenever its prefetch runs)."""
    return chainer.iterators.ShuffleOrderSampler(numpy.random.RandomState(5))


PIPELINES = {
    'serial-augmented': lambda: chainer.iterators.SerialIterator(
        _Augmented(), 5, shuffle=True),
    'multiprocess': lambda: chainer.iterators.MultiprocessIterator(
        staged_models.dataset(N_EXAMPLES), 4, order_sampler=_own_shuffle(),
        n_processes=2),
    'multithread': lambda: chainer.iterators.MultithreadIterator(
        staged_models.dataset(N_EXAMPLES), 4, order_sampler=_own_shuffle(),
        n_threads=2),
}
PIPELINES_AND_WORKERS = [
    pytest.param(pipeline, workers, marks=[pytest.mark.slow] if
                 workers == 'process' else [])
    for pipeline in PIPELINES for workers in ('thread', 'process')]


def _global_states():
    """NumPy's and Python's global random states, comparable with ==."""
    name, keys, position, has_gauss, cached = numpy.random.get_state()
    return (name, keys.tolist(), position, has_gauss, cached,
            random.getstate())


def _params(model):
    return {name: p.array.copy() for name, p in model.namedparams()}


def _updater_for(make_updater, make_iterator, seed=0):
    model = semantics_models.CountingClassifier(sum_loss=False, seed=seed)
    iterator = make_iterator()
    updater = make_updater(iterator, chainer.optimizers.MomentumSGD(
        0.1).setup(model))
    return updater, iterator, model


def _train(make_updater, make_iterator, iterations, between=None):
    """Trains from seeded global random states, calling
    ``between(iteration, iterator)`` after every update as an extension
    would; returns the iterator's visible state and the global random
    states after every update, the parameters and the input path."""
    numpy.random.seed(0)
    random.seed(0)
    updater, iterator, model = _updater_for(make_updater, make_iterator)
    trace = []
    try:
        for iteration in range(iterations):
            updater.update()
            trace.append((_visible(iterator), _global_states()))
            if between is not None:
                between(iteration, iterator)
    finally:
        path = getattr(updater, '_input_path', None)
        updater.finalize()
    return trace, _params(model), path


@pytest.mark.parametrize('pipeline, workers', PIPELINES_AND_WORKERS)
def test_a_users_pipeline_read_ahead_is_standard_updaters(pipeline,
                                                          workers):
    make_iterator = PIPELINES[pipeline]
    expected, expected_params, _ = _train(_standard, make_iterator, 7)
    actual, params, path = _train(_cgdp(workers, 2), make_iterator, 7)
    assert [state for state, _ in actual] == [
        state for state, _ in expected]
    assert actual == expected  # the global random states too
    assert_same_params(expected_params, params)
    # Every batch after the first was read ahead but those whose draw an
    # epoch's end of a prefetching iterator made (none here).
    assert path.batches_read_ahead == 6
    assert path.reads_in_process == (pipeline == 'serial-augmented')


def _draw_on_odd_iterations(iteration, iterator):
    if iteration % 2:
        random.random()
        numpy.random.uniform()


def _next_at_the_third(iteration, iterator):
    if iteration == 2:
        iterator.next()


def _snapshot_at_the_third(iteration, iterator):
    # Saving restarts a MultiprocessIterator's prefetch at its state.
    if iteration == 2:
        chainer.serializers.save_npz(io.BytesIO(), iterator)


@pytest.mark.parametrize('pipeline, extension, workers', [
    (pipeline, extension, 'thread') for pipeline in PIPELINES
    for extension in (_draw_on_odd_iterations, _next_at_the_third,
                      _snapshot_at_the_third)] + [
    pytest.param(pipeline, extension, 'process', marks=pytest.mark.slow)
    for pipeline in ('serial-augmented', 'multiprocess')
    for extension in (_draw_on_odd_iterations, _next_at_the_third)])
def test_an_extension_that_draws_or_moves_the_iterator_trains_equal(
        pipeline, extension, workers):
    make_iterator = PIPELINES[pipeline]
    expected, expected_params, _ = _train(_standard, make_iterator, 7,
                                          extension)
    actual, params, path = _train(_cgdp(workers, 2), make_iterator, 7,
                                  extension)
    assert actual == expected
    assert_same_params(expected_params, params)
    if extension is _draw_on_odd_iterations and \
            pipeline != 'serial-augmented':
        # A prefetching iterator's batches do not depend on the global
        # random states: all are converted ahead.
        assert path.batches_read_ahead == 6
    else:
        # The batch after an extension that drew or moved the iterator is
        # drawn at its iteration; the others are read ahead.
        assert 3 <= path.batches_read_ahead < 6


def _resumed(make_updater, make_iterator, tmp_path, before, after):
    """``before`` updates, a snapshot, then ``after`` updates of a fresh
    updater, model and iterator that load it (the global random states
    put back as they were, as a script seeding them would); returns the
    iterator's visible state and the global states after every update
    of the resumed run, and the parameters."""
    path = str(tmp_path / 'snapshot.npz')
    numpy.random.seed(0)
    random.seed(0)
    updater, iterator, model = _updater_for(make_updater, make_iterator)
    initial = model.copy(mode='copy')
    try:
        for _ in range(before):
            updater.update()
        chainer.serializers.save_npz(path, updater)
        numpy_state, python_state = numpy.random.get_state(), \
            random.getstate()
    finally:
        updater.finalize()
    numpy.random.seed(7)
    updater, iterator, model = _updater_for(make_updater, make_iterator)
    model.copyparams(initial)
    chainer.serializers.load_npz(path, updater)
    numpy.random.set_state(numpy_state)
    random.setstate(python_state)
    trace = []
    try:
        for _ in range(after):
            updater.update()
            trace.append((_visible(iterator), _global_states()))
    finally:
        updater.finalize()
    return trace, _params(model)


@pytest.mark.parametrize('pipeline, workers', PIPELINES_AND_WORKERS)
def test_a_users_pipeline_resumes_mid_epoch_as_standard_updater(
        pipeline, workers, tmp_path):
    make_iterator = PIPELINES[pipeline]
    expected, expected_params, _ = _train(_standard, make_iterator, 6)
    resumed, params = _resumed(_cgdp(workers, 2), make_iterator, tmp_path,
                               before=3, after=3)
    assert resumed == expected[3:]
    assert_same_params(expected_params, params)


def _children():
    """The process ids of this process's children."""
    import glob
    found = set()
    for path in glob.glob('/proc/self/task/*/children'):
        with open(path) as listing:
            found.update(int(pid) for pid in listing.read().split())
    return found


def test_an_error_in_the_reader_process_surfaces_and_it_ends():
    numpy.random.seed(0)
    model = semantics_models.CountingClassifier(sum_loss=False)
    iterator = chainer.iterators.SerialIterator(_Augmented(fail_at=6), 4,
                                                shuffle=False)
    before = _children()
    updater = _cgdp('thread')(iterator, chainer.optimizers.SGD().setup(
        model))
    try:
        updater.update()  # drawn here: the dataset draws
        assert updater._input_path.reads_in_process
        assert _children() - before  # the reader
        with pytest.raises(KeyError, match='example 6 is missing') as info:
            updater.update()  # read ahead by the reader
    finally:
        updater.finalize()
    # The reader's traceback travels with the error.
    assert 'get_example' in str(info.value.__cause__)
    assert iterator.current_position == 8  # as SerialIterator leaves it
    assert not _children() - before


class _DiesInTheReader(_Augmented):
    """Exits when read in another process than the one that made it."""

    def __init__(self):
        super(_DiesInTheReader, self).__init__()
        self.home = os.getpid()

    def get_example(self, i):
        if os.getpid() != self.home:
            os._exit(3)
        return super(_DiesInTheReader, self).get_example(i)


def test_a_reader_process_that_dies_surfaces_in_the_update():
    model = semantics_models.CountingClassifier(sum_loss=False)
    iterator = chainer.iterators.SerialIterator(_DiesInTheReader(), 4)
    updater = _cgdp('thread')(iterator, chainer.optimizers.SGD().setup(
        model))
    try:
        updater.update()
        with pytest.raises(RuntimeError, match=r'reader process died \(exit '
                           r'code 3\)'):
            updater.update()
    finally:
        updater.finalize()


class _Unpicklable(_Augmented):
    def __init__(self):
        super(_Unpicklable, self).__init__()
        self.lock = threading.Lock()


def test_a_dataset_that_draws_and_cannot_be_pickled_is_not_read_ahead(
        said):
    def make_iterator():
        return chainer.iterators.SerialIterator(_Unpicklable(), 5,
                                                shuffle=True)
    expected, expected_params, _ = _train(_standard, make_iterator, 4)
    actual, params, path = _train(_cgdp('thread'), make_iterator, 4)
    assert actual == expected
    assert_same_params(expected_params, params)
    assert path.batches_read_ahead == 0
    assert 'the dataset cannot be pickled (TypeError' in \
        said()


class _DrawsNowAndThen(_Augmented):
    """Draws only for some examples past the first batch (a crop only for
    large images): the first batch, drawn on the caller, draws nothing."""

    def get_example(self, i):
        if i < 6 or i % 2 == 0:
            return self.base[i]
        if i == 7:  # NumPy's state alone
            x, t = self.base[i]
            return x + numpy.random.normal(0, 0.01, x.shape).astype(
                numpy.float32), t
        return super(_DrawsNowAndThen, self).get_example(i)


class _DrawingExtension(object):
    """Draws from both global states after every other update, as an
    extension would, and keeps what it drew: a dataset's draw made at
    another time comes before or after these in the wrong order, and they
    differ."""

    def __init__(self):
        self.drawn = []

    def __call__(self, iteration, iterator):
        if iteration % 2:
            self.drawn.append((random.random(), numpy.random.uniform()))


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_a_dataset_that_draws_only_now_and_then_is_standard_updaters(
        workers):
    def make_iterator():
        return chainer.iterators.SerialIterator(_DrawsNowAndThen(), 4,
                                                shuffle=False)
    standard, cgdp = _DrawingExtension(), _DrawingExtension()
    expected, expected_params, _ = _train(_standard, make_iterator, 7,
                                          standard)
    actual, params, path = _train(_cgdp(workers, 2), make_iterator, 7,
                                  cgdp)
    assert actual == expected  # the global random states after every update
    assert cgdp.drawn == standard.drawn
    assert_same_params(expected_params, params)
    # The second batch, read ahead, was found drawing and drawn anew on
    # the caller; the later ones were read in the reader process, and
    # taken where the extension drew nothing since (iterations 2 and 4).
    assert path.reads_in_process
    assert path.batches_read_ahead == 2


def test_a_refused_draw_is_never_made_even_where_it_is_swallowed():
    from cgdp_chainer.runtime.input import global_random

    def swallowing():
        try:
            random.random()
        except BaseException:
            pass
        return 'read'

    reads = [(lambda: random.randint(0, 9), 'getrandbits'),
             (swallowing, 'random'), (lambda: 'read', None)]
    # NumPy 2's global functions are Cython methods, which a profile
    # function does not see: the input path then proves each read in the
    # reader process instead (test_a_dataset_that_draws_only_now_and_then).
    sees_numpy = global_random.DrawRefusal.sees_every_draw()
    assert sees_numpy == numpy.__version__.startswith('1.')
    if sees_numpy:
        reads.append((lambda: numpy.random.uniform(), 'uniform'))
    numpy.random.seed(3)
    random.seed(3)
    before = _global_states()
    for read, expected in reads:
        refusal = global_random.DrawRefusal()
        try:
            with refusal:
                read()
        except global_random.GlobalDrawRefused:
            pass
        assert sys.getprofile() is None
        assert _global_states() == before
        assert refusal.refused == expected
