"""The user's model is the truth between iterations (edits reach the
replicas, a changed structure is refused), and the first replica's
BatchNormalization statistics come to the master only when it may be read."""
import copy
import os

import chainer
import chainer.links as L
from chainer.training import extensions
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.host import master as master_module
from equivalence import assert_same_params, cgdp, standard
import staged_models

# Worker processes take seconds to start: those runs are slow ones.
WORKERS = ['thread', pytest.param('process', marks=pytest.mark.slow)]


class BatchNormNet(chainer.Chain):
    """Linear, BatchNormalization, ReLU, Linear."""

    def __init__(self, seed=0):
        super(BatchNormNet, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.l1 = L.Linear(6, 8, initialW=rng.normal(
                0, 0.5, (8, 6)).astype(numpy.float32))
            self.bn = L.BatchNormalization(8)
            self.l2 = L.Linear(8, 5, initialW=rng.normal(
                0, 0.5, (5, 8)).astype(numpy.float32))

    def forward(self, x):
        return self.l2(chainer.functions.relu(self.bn(self.l1(x))))


def paired_dataset(n=12):
    """Every example twice in a row: each of two replicas' shares of a
    batch of 6 (``batch[i::2]``) holds the same examples as the whole batch,
    so BatchNormalization's batch statistics, and so the gradients, are the
    whole batch's on every replica."""
    x, t = staged_models.dataset(n=n)._datasets
    return chainer.datasets.TupleDataset(numpy.repeat(x, 2, axis=0),
                                         numpy.repeat(t, 2, axis=0))


def momentum(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return optimizer


def train_with_edits(model, make_updater, edits, data=None):
    """Runs an update, then each edit followed by an update; returns the
    parameters and persistent values."""
    optimizer = momentum(model)
    iterator = chainer.iterators.SerialIterator(
        data if data is not None else staged_models.dataset(), 6,
        shuffle=False)
    updater = make_updater(iterator, optimizer)
    try:
        updater.update()
        for edit in edits:
            edit(model)
            updater.update()
    finally:
        updater.finalize()
    values = {name: p.array.copy() for name, p in model.namedparams()}
    values.update(persistents(model))
    return values


def persistents(model):
    values = {}
    for path, link in model.namedlinks():
        for name in link._persistent:
            values[path + '/' + name] = numpy.array(getattr(link, name))
    return values


def clip_in_place(model):
    for param in model.params():
        numpy.clip(param.array, -0.3, 0.3, out=param.array)


def clip_by_replacing(model):
    # Weight clipping as scripts write it: a new array per parameter.
    for param in model.params():
        param.array = numpy.clip(param.array, -0.2, 0.2)


def scale_by_replacing(model):
    for param in model.params():
        param.array = param.array * numpy.float32(0.5)


def loader(path):
    def load(model):
        chainer.serializers.load_npz(path, model)
    return load


def copier(other):
    def copy_params(model):
        model.copyparams(other)
    return copy_params


@pytest.mark.parametrize('workers', WORKERS)
def test_edits_between_iterations_equal_standard_updater(tmp_path, workers):
    other = L.Classifier(staged_models.StagedMLP(seed=5))
    path = str(tmp_path / 'other.npz')
    chainer.serializers.save_npz(path, other)
    edits = [clip_in_place, clip_by_replacing, loader(path),
             scale_by_replacing, copier(L.Classifier(
                 staged_models.StagedMLP(seed=7))), scale_by_replacing]
    base = L.Classifier(staged_models.StagedMLP())
    expected = train_with_edits(copy.deepcopy(base), standard, edits)
    actual = train_with_edits(copy.deepcopy(base),
                              cgdp(2, workers=workers, chunk_size=1), edits)
    assert_same_params(expected, actual)
    # Not vacuous: without the edits, training ends elsewhere.
    unedited = train_with_edits(copy.deepcopy(base), standard,
                                [lambda model: None] * len(edits))
    assert any(not numpy.allclose(unedited[n], expected[n], atol=1e-3)
               for n in expected)


@pytest.mark.parametrize('workers', WORKERS)
def test_loading_other_weights_and_statistics_reaches_every_replica(
        tmp_path, workers):
    other = L.Classifier(BatchNormNet(seed=3))
    rng = numpy.random.RandomState(4)
    other.predictor.bn.avg_mean[...] = rng.normal(size=8)
    other.predictor.bn.avg_var[...] = rng.uniform(0.5, 2.0, size=8)
    other.predictor.bn.N = 17
    path = str(tmp_path / 'other.npz')
    chainer.serializers.save_npz(path, other)
    edits = [loader(path), clip_by_replacing]
    base = L.Classifier(BatchNormNet())
    expected = train_with_edits(copy.deepcopy(base), standard, edits,
                                data=paired_dataset())
    actual = train_with_edits(copy.deepcopy(base), cgdp(2, workers=workers),
                              edits, data=paired_dataset())
    # The running variance's unbiasing factor counts the examples of the
    # share (3) rather than of the batch (6): the one value that differs.
    del expected['/predictor/bn/avg_var'], actual['/predictor/bn/avg_var']
    assert_same_params(expected, actual)
    # Came back from replica 0 after two more iterations: it had it.
    assert actual['/predictor/bn/N'] == 17


class _Structure(object):
    """Changes of the model's structure, each with its undo."""

    def __init__(self, model):
        self.model = model
        self.net = model.predictor

    def replace_link(self):
        old = self.net.l2
        self._set_link(L.Linear(8, 5))
        return '/predictor/l2/', lambda: self._set_link(old)

    def _set_link(self, link):
        delattr(self.net, 'l2')
        with self.net.init_scope():
            self.net.l2 = link

    def add_parameter(self):
        with self.net.init_scope():
            self.net.extra = chainer.Parameter(numpy.zeros(3, 'f'))
        return '/predictor/extra', lambda: delattr(self.net, 'extra')

    def remove_parameter(self):
        old = self.net.l1.b
        delattr(self.net.l1, 'b')

        def undo():
            with self.net.l1.init_scope():
                self.net.l1.b = old
        return '/predictor/l1/b', undo

    def reshape(self):
        return self._replace_array(numpy.zeros((2, 3), 'f'))

    def retype(self):
        return self._replace_array(self.net.l1.W.array.astype(numpy.float64))

    def uninitialize(self):
        return self._replace_array(None)

    def _replace_array(self, array):
        param = self.net.l1.W
        old = param.array
        param.array = array

        def undo():
            param.array = old
        return '/predictor/l1/W', undo


@pytest.mark.parametrize('workers', WORKERS)
def test_a_changed_structure_is_refused_naming_the_parameter(workers):
    model = L.Classifier(BatchNormNet())
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6,
                                                shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, momentum(model),
                                       ['@numpy'] * 2, workers=workers)
    structure = _Structure(model)
    try:
        updater.update()
        for change in (structure.replace_link, structure.add_parameter,
                       structure.remove_parameter, structure.reshape,
                       structure.retype, structure.uninitialize):
            name, undo = change()
            with pytest.raises(ValueError) as info:
                updater.update()
            assert name in str(info.value), change.__name__
            undo()
            del undo  # it holds an array of the shared arena
        # Refused before any work: nothing was consumed or trained.
        assert updater.iteration == 1
        assert iterator.current_position == 6
        updater.update()
        assert updater.iteration == 2
    finally:
        updater.finalize()


class _Recorder(object):
    """An evaluation function that records what the evaluated model holds."""

    def __init__(self, updater, bn):
        self.updater = updater
        self.bn = bn
        self.seen = []

    def __call__(self, *in_arrays):
        self.seen.append((self.updater.iteration,
                          self.updater.persistents_fetches,
                          self.bn.avg_mean.copy()))


def _manual_statistics(workers, iterations):
    """The master's running mean after ``iterations`` updates outside a
    Trainer (fetched after every update, as before)."""
    model = L.Classifier(BatchNormNet())
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6,
                                                shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, momentum(model),
                                       ['@numpy'] * 2, workers=workers)
    means = []
    try:
        for _ in range(iterations):
            updater.update()
            means.append(model.predictor.bn.avg_mean.copy())
        assert updater.persistents_fetches == iterations
    finally:
        updater.finalize()
    return means


@pytest.mark.parametrize('workers', WORKERS)
def test_statistics_come_back_only_when_the_model_is_read(tmp_path, workers):
    expected = _manual_statistics(workers, 4)
    model = L.Classifier(BatchNormNet())
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6,
                                                shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, momentum(model),
                                       ['@numpy'] * 2, workers=workers)
    trainer = chainer.training.Trainer(updater, (4, 'iteration'),
                                       out=str(tmp_path))
    recorder = _Recorder(updater, model.predictor.bn)
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    trainer.extend(extensions.snapshot_object(
        model, 'model_{.updater.iteration}'), trigger=(2, 'iteration'))
    trainer.extend(extensions.Evaluator(
        chainer.iterators.SerialIterator(staged_models.dataset(n=2), 2,
                                         repeat=False, shuffle=False),
        model, eval_func=recorder), trigger=(3, 'iteration'))
    trainer.run()
    # Iteration 1 (before the Trainer's loop is known) fetches as before;
    # then only the snapshot (2), the evaluation (3) and finalize (after 4)
    # read the model: nothing is transferred for iteration 2's LogReport
    # alone or in iteration 4 before the end.
    assert [(i, f) for i, f, _ in recorder.seen] == [(3, 3)]
    assert updater.persistents_fetches == 4
    numpy.testing.assert_array_equal(recorder.seen[0][2], expected[2])
    snapshot = numpy.load(os.path.join(str(tmp_path), 'model_2'))
    numpy.testing.assert_array_equal(snapshot['predictor/bn/avg_mean'],
                                     expected[1])
    numpy.testing.assert_array_equal(model.predictor.bn.avg_mean,
                                     expected[3])
    assert not numpy.array_equal(expected[3], expected[2])


class _WatchedUpdater(chainer.training.updaters.StandardUpdater):
    """A StandardUpdater that records what a TrainerWatch tells each
    update(): the logic that decides when GPU replicas take the master's
    values again and when statistics are fetched, without a GPU."""

    def __init__(self, iterator, optimizer):
        super(_WatchedUpdater, self).__init__(iterator, optimizer)
        self.reads = []
        self.told = []
        self.watch = master_module.TrainerWatch(
            lambda: self.reads.append(self.iteration))

    def connect_trainer(self, trainer):
        self.watch.connect(trainer)

    def update_core(self):
        self.told.append(self.watch.start_update())
        super(_WatchedUpdater, self).update_core()


def _clip_master(trainer):
    clip_by_replacing(trainer.updater.get_optimizer('main').target)


def test_trainer_watch_tells_when_the_master_may_be_read_or_written(
        tmp_path):
    model = L.Classifier(staged_models.StagedMLP())
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6,
                                                shuffle=False)
    updater = _WatchedUpdater(iterator, momentum(model))
    trainer = chainer.training.Trainer(updater, (5, 'iteration'),
                                       out=str(tmp_path))
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    trainer.extend(extensions.snapshot_object(model, 'model'),
                   trigger=(2, 'iteration'))
    trainer.extend(_clip_master, trigger=(3, 'iteration'))
    trainer.run()
    # (in the Trainer's loop, master may have been written): unknown before
    # the loop is seen; the snapshot only reads; a function may do both.
    assert updater.told == [(False, True), (True, False), (True, False),
                            (True, True), (True, False)]
    assert updater.reads == [2, 3, 4]


@pytest.mark.parametrize('workers', WORKERS)
def test_an_extension_replacing_arrays_equals_standard_updater(tmp_path,
                                                               workers):
    def run(make_updater):
        model = L.Classifier(staged_models.StagedMLP())
        iterator = chainer.iterators.SerialIterator(
            staged_models.dataset(), 6, shuffle=False)
        trainer = chainer.training.Trainer(
            make_updater(iterator, momentum(model)), (4, 'iteration'),
            out=str(tmp_path))
        trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
        trainer.extend(_clip_master, trigger=(2, 'iteration'))
        trainer.run()
        return {name: p.array.copy() for name, p in model.namedparams()}

    assert_same_params(run(standard), run(cgdp(2, workers=workers)))


def test_an_unattended_block_fetches_statistics_once_at_its_end():
    expected = _manual_statistics('thread', 4)
    model = L.Classifier(BatchNormNet())
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6,
                                                shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, momentum(model),
                                       ['@numpy'] * 2, workers='thread')
    try:
        updater.update()
        with updater.unattended():
            for _ in range(3):
                updater.update()
            # The first update of the block takes what came before it.
            assert updater.persistents_fetches == 2
        assert updater.persistents_fetches == 3
        numpy.testing.assert_array_equal(model.predictor.bn.avg_mean,
                                         expected[3])
        updater.update()  # after the block: fetched after each update
        assert updater.persistents_fetches == 4
    finally:
        updater.finalize()
