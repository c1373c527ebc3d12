"""The input path (cgdp_chainer.runtime.input.input_path): the next batch read
ahead while an iteration computes leaves the iterator, the snapshots, the
random streams and the result exactly StandardUpdater's; each share is
converted once; errors in the background surface."""
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
    (_multiprocess(1), False), (_multiprocess(2), False)])
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


def test_iterators_that_are_not_read_ahead_say_why(capsys):
    _trace(_cgdp('thread'), _multiprocess(1), 2)
    _trace(_cgdp('thread', 2), lambda dataset: _OwnNext(dataset, 4), 2)
    out = capsys.readouterr().out
    assert 'not read ahead (MultiprocessIterator prefetches in its own ' \
        'processes)' in out
    assert "not read ahead (_OwnNext overrides SerialIterator.__next__); " \
        "each replica's share is converted in parallel" in out


def test_a_dataset_drawing_from_the_global_state_is_not_read_ahead(capsys):
    make_iterator = _serial(5, shuffle=True)
    expected, expected_params, _, _ = _trace(
        _standard, make_iterator, 6, dataset=_Recording(draw=True))
    actual, params, _, path = _trace(
        _cgdp('thread', 2), make_iterator, 6, dataset=_Recording(draw=True))
    assert actual == expected
    assert_same_params(expected_params, params)
    assert path.batches_read_ahead == 0
    assert "get_example draws from NumPy's or Python's global random " \
        'state' in capsys.readouterr().out


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
