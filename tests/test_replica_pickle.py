"""What the replicas' pickle carries by reference (modules, lazily loaded
module objects such as ``six.moves``, anything ``sys.modules`` holds) and
by value, and what it refuses, naming the path to it."""
import copy
import sys
import threading
import types

import chainer
import chainer.functions as F
import numpy
import pytest
import six

from cgdp_chainer.runtime.workers import replica_copy

import staged_models
from equivalence import assert_same_params, cgdp, standard, train


def _copied(model):
    """A replica of ``model`` as a worker process unpickles it."""
    params = dict(model.namedparams())
    replica, _ = replica_copy.load_replica(
        replica_copy.pickle_replica(model, None, params),
        {name: p.array for name, p in params.items()})
    return replica


def test_six_moves_is_a_module_object_of_a_class_of_its_own():
    # What the by-reference rule is for: neither exactly a module (which
    # cloudpickle pickles by reference) nor picklable by value.
    assert type(six.moves) is not types.ModuleType
    assert sys.modules['six.moves'] is six.moves


def test_objects_that_sys_modules_holds_travel_by_reference(monkeypatch):
    class Lazy(types.ModuleType):
        """A lazily loaded module object, of a class of its own."""

    lazy = Lazy('cgdp_test_lazy')
    lazy.value = threading.Lock()  # by value it could not travel
    monkeypatch.setitem(sys.modules, 'cgdp_test_lazy', lazy)
    model = staged_models.StagedMLP()
    model.moves = six.moves
    model.urllib = six.moves.urllib
    model.lazy = lazy
    model.relu = F.relu  # a function of an importable module
    replica = _copied(model)
    assert replica.moves is six.moves
    assert replica.urllib is six.moves.urllib
    assert replica.lazy is lazy
    assert replica.relu is F.relu
    # The model itself travelled by value.
    assert replica is not model and replica.layers[0] is not model.layers[0]


def test_a_module_object_that_cannot_be_imported_is_refused_by_its_path():
    class Lazy(types.ModuleType):
        pass

    model = chainer.links.Classifier(staged_models.StagedMLP())
    model.predictor.helpers = {'lazy': Lazy('nowhere_to_import_it_from')}
    with pytest.raises(ValueError, match="cannot be pickled for "
                                         "workers='process'") as info:
        replica_copy.check_replicable(model, None, 'process')
    assert "at the model.predictor.helpers['lazy'], a Lazy" in \
        str(info.value)


def test_an_unpicklable_object_is_refused_by_its_path():
    model = chainer.links.Classifier(staged_models.StagedMLP())
    model.predictor.cache = [0, {'guard': threading.Lock()}]
    with pytest.raises(ValueError) as info:
        replica_copy.check_replicable(model, None, 'process')
    assert "at the model.predictor.cache[1]['guard'], a lock" in \
        str(info.value)


def _six_tagger():
    """A classifier defined here, in a function, so that cloudpickle
    carries it by value, with its forward's globals: ``six``, and
    ``six.moves``, which it reaches through them."""
    class Tagger(staged_models.StagedMLP):

        def forward(self, x, t):
            y = super(Tagger, self).forward(x)
            correct = 0
            for row, label in six.moves.zip(y.array, t):
                correct += int(row.argmax() == label)
            chainer.report({'correct': correct}, self)
            return F.softmax_cross_entropy(y, t)

    return Tagger()


def test_a_forward_that_loops_over_six_moves_zip_trains_in_processes():
    model = _six_tagger()

    def setup(link):
        optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
        optimizer.setup(link)
        return optimizer

    expected = train(copy.deepcopy(model), setup, standard)
    actual = train(model, setup, cgdp(2, workers='process'))
    assert_same_params(expected, actual)
    assert not all(numpy.array_equal(expected[name], p.array) for name, p in
                   _six_tagger().namedparams())


def test_the_replica_carries_no_forward_leftovers():
    # The master's first forward (lazy layers) leaves its outputs on
    # Classifier (y, loss, accuracy): the replica's pickle leaves them out,
    # and keeps what the model holds that no forward made.
    model = chainer.links.Classifier(chainer.links.Linear(None, 2000))
    model.constant = numpy.arange(3, dtype=numpy.float32)
    model.constant_variable = chainer.Variable(model.constant * 2)

    def pickled_size():
        return len(replica_copy.pickle_replica(
            model, None, dict(model.namedparams())))
    built = pickled_size()
    model(numpy.ones((4, 5), numpy.float32), numpy.zeros(4, numpy.int32))
    assert model.y.shape == (4, 2000)
    # The replica's parameters come from shared memory: a few bytes more
    # for the initialized weights' shapes, not the forward's 32 KB output.
    assert pickled_size() < built + 1000
    replica = _copied(model)
    assert (replica.y, replica.loss, replica.accuracy) == (None, None, None)
    numpy.testing.assert_array_equal(replica.constant, model.constant)
    numpy.testing.assert_array_equal(replica.constant_variable.array,
                                     model.constant * 2)
    assert model.y is not None  # the master keeps its own
