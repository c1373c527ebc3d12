"""Models that refer to themselves through functions (Chainer's memnn
example: ``self.W = lambda u: F.linear(u, self.embeds[-1].W)``), a
``loss_func`` that captures the model, what a copy cannot fix, and
``@static_graph`` models (trained define-by-run, equal to StandardUpdater's
static schedule): with both worker kinds."""
import functools
import re
import threading
import weakref

import numpy
import pytest

import cgdp_chainer
import chainer
import chainer.functions as F
import chainer.links as L
from chainer.graph_optimizations.static_graph import static_graph

import equivalence
from log_capture import said  # NOQA: the fixture
from equivalence import WORKERS, assert_same_params, cgdp, standard  # NOQA
from cgdp_chainer.runtime.workers import replica_copy
from cgdp_chainer.runtime.replica import static_graph_models

N_VOCAB = 12
N_UNITS = 6
MAX_MEMORY = 4
SENTENCE = 5


def bow_encode(embed, sentences):
    return F.sum(embed(sentences), axis=-2)


class Memory(object):
    """A plain object that holds links of the model (as memnn's does)."""

    def __init__(self, A, C, TA, TC, encoder):
        self.A, self.C, self.TA, self.TC = A, C, TA, TC
        self.encoder = encoder

    def register_all(self, sentences):
        self.m = self.encoder(self.A, sentences)
        self.c = self.encoder(self.C, sentences)

    def query(self, u):
        inds = numpy.arange(self.m.shape[1] - 1, -1, -1, dtype=numpy.int32)
        tm = F.broadcast_to(self.TA(inds), self.m.shape)
        tc = F.broadcast_to(self.TC(inds), self.c.shape)
        p = F.softmax(F.matmul(self.m + tm, F.expand_dims(u, -1)))
        o = F.squeeze(F.matmul(F.swapaxes(self.c + tc, 2, 1), p), -1)
        return o + u


class MemNN(chainer.Chain):
    """memnn.MemNN's structure: links shared between hops through plain
    attributes, and the answer matrix a lambda over the model."""

    def __init__(self, hops=2):
        super(MemNN, self).__init__()
        with self.init_scope():
            self.embeds = chainer.ChainList()
            self.temporals = chainer.ChainList()
        normal = chainer.initializers.Normal()
        for _ in range(hops + 1):
            self.embeds.append(L.EmbedID(N_VOCAB, N_UNITS, initialW=normal))
            self.temporals.append(L.EmbedID(MAX_MEMORY, N_UNITS,
                                            initialW=normal))
        self.memories = [
            Memory(self.embeds[i], self.embeds[i + 1], self.temporals[i],
                   self.temporals[i + 1], bow_encode) for i in range(hops)]
        self.B = self.embeds[0]
        self.W = lambda u: F.linear(u, self.embeds[-1].W)

    def forward(self, sentences, question):
        for memory in self.memories:
            memory.register_all(sentences)
        u = bow_encode(self.B, question)
        for memory in self.memories:
            u = memory.query(u)
        return self.W(u)


def memnn_data(n=24, seed=0):
    rng = numpy.random.RandomState(seed)
    return [{'sentences': rng.randint(0, N_VOCAB, (MAX_MEMORY, SENTENCE))
             .astype(numpy.int32),
             'question': rng.randint(0, N_VOCAB, SENTENCE).astype(
                 numpy.int32),
             'answer': numpy.int32(rng.randint(0, N_VOCAB))}
            for _ in range(n)]


class Head(object):
    """A callable object (not a link) that holds a link of the model."""

    def __init__(self, link):
        self.link = link

    def __call__(self, h):
        return self.link(h)


def _closure_over(link):
    def apply(h):
        return F.tanh(link(h))
    return apply


class SelfReferring(chainer.Chain):
    """Every kind of function that captures the model or its links, kept
    outside init_scope: a closure, a bound method of a child, a bound
    method of the model, a callable object, a lambda with a default."""

    def __init__(self):
        super(SelfReferring, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 8)
            self.l2 = L.Linear(8, 8)
            self.l3 = L.Linear(8, 8)
            self.l4 = L.Linear(8, 3)
        self.first = _closure_over(self.l1)
        self.second = self.l2.forward
        self.third = self._third
        self.head = Head(self.l4)
        self.scale = lambda h, link=self.l1: h * F.sum(link.b) * 0 + h

    def _third(self, h):
        return F.relu(self.l3(h))

    def loss(self, x, t):
        return F.softmax_cross_entropy(self(x), t)

    def forward(self, x):
        h = self.scale(self.first(x))
        return self.head(self.third(F.relu(self.second(h))))


def vector_data(n=24, seed=1):
    rng = numpy.random.RandomState(seed)
    x = rng.uniform(-1, 1, (n, 4)).astype(numpy.float32)
    t = rng.randint(0, 3, n).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def _adam(model):
    optimizer = chainer.optimizers.Adam(alpha=0.01)
    optimizer.setup(model)
    return optimizer


def _fresh(make, seed=0):
    """Two calls give equal models. Not copy.deepcopy: it copies functions
    by reference, so a copy's lambdas would still use the original's links
    (the very problem CGDP's copies avoid)."""
    numpy.random.seed(seed)
    return make()


def _initial(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def _assert_trained(initial, trained):
    assert all(not numpy.array_equal(initial[n], trained[n])
               for n in initial if n.endswith('/W'))


@pytest.mark.parametrize('workers', WORKERS)
def test_memnn_shaped_model_equals_standard_updater(workers):
    def make():
        return L.Classifier(MemNN(), label_key='answer')
    data = memnn_data()
    expected = equivalence.train(_fresh(make), _adam, standard, data=data)
    actual = equivalence.train(_fresh(make), _adam, cgdp(2, workers=workers),
                               data=data)
    assert_same_params(expected, actual)
    _assert_trained(_initial(_fresh(make)), expected)


@pytest.mark.parametrize('workers', WORKERS)
def test_closures_bound_methods_callables_equal_standard_updater(workers):
    def make():
        return L.Classifier(SelfReferring())
    expected = equivalence.train(_fresh(make), _adam, standard,
                                 data=vector_data())
    actual = equivalence.train(_fresh(make), _adam, cgdp(2, workers=workers),
                               data=vector_data())
    assert_same_params(expected, actual)
    _assert_trained(_initial(_fresh(make)), expected)


@pytest.mark.parametrize('workers', WORKERS)
def test_a_sequential_with_a_lambda_layer_equals_standard_updater(workers):
    # chainer.Sequential refuses to be pickled with a lambda among its
    # layers (the standard pickle could not carry it; cloudpickle does).
    def make():
        return L.Classifier(
            chainer.Sequential(L.Linear(4, 6), lambda h: F.relu(h) * 2,
                               L.Linear(6, 3)),
            lossfun=lambda y, t: F.softmax_cross_entropy(y, t))
    expected = equivalence.train(_fresh(make), _adam, standard,
                                 data=vector_data())
    actual = equivalence.train(_fresh(make), _adam, cgdp(2, workers=workers),
                               data=vector_data())
    assert_same_params(expected, actual)
    _assert_trained(_initial(_fresh(make)), expected)


def _train_with_loss(model, make_loss, make_updater):
    """Trains ``model`` with ``loss_func=make_loss(model)`` given to the
    updater (as a script passes one that names its model)."""
    def make(iterator, optimizer):
        return make_updater(iterator, optimizer, make_loss(model))
    return equivalence.train(model, _adam, make, data=vector_data())


def _lambda_over(model):
    return lambda x, t: F.softmax_cross_entropy(model.predictor(x), t)


def _bound_method_of(model):
    return model.predictor.loss


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('make_loss', [_lambda_over, _bound_method_of])
def test_a_loss_func_over_the_model_equals_standard_updater(workers,
                                                            make_loss):
    def make():
        return L.Classifier(SelfReferring())
    expected = _train_with_loss(
        _fresh(make), make_loss,
        lambda it, opt, loss: chainer.training.updaters.StandardUpdater(
            it, opt, loss_func=loss))
    actual = _train_with_loss(
        _fresh(make), make_loss,
        lambda it, opt, loss: cgdp_chainer.CGDPUpdater(
            it, opt, ['@numpy'] * 2, loss_func=loss, workers=workers))
    assert_same_params(expected, actual)
    _assert_trained(_initial(_fresh(make)), expected)


def test_thread_replicas_share_the_master_arrays_and_own_the_rest():
    master = L.Classifier(MemNN())
    copies = replica_copy.thread_replicas(master, None, 2)
    assert copies[0][0] is not copies[1][0]
    for replica, loss_func in copies:
        assert loss_func is None
        for (name, mine), (_, theirs) in zip(replica.namedparams(),
                                            master.namedparams()):
            assert mine is not theirs
            assert mine.array is theirs.array, name  # no copy of the weights
            assert mine.grad is None and mine.update_rule is None
        network = replica.predictor
        # The lambda and the memories refer to the replica's own links.
        assert network.W.__closure__[0].cell_contents is network
        assert network.memories[0].A is network.embeds[0]
        assert network.memories[1].C is network.embeds[2]


# -- what a copy cannot fix: refused before any work, naming it ------------

_SCRIPT_MODEL = []


def loss_through_a_global(x, t):
    """A module-level function of an importable module: copied by
    reference, so its global is the master model in every replica."""
    return F.softmax_cross_entropy(_SCRIPT_MODEL[0].predictor(x), t)


def _updater(model, workers, **kwargs):
    optimizer = _adam(model)
    iterator = chainer.iterators.SerialIterator(vector_data(), 6,
                                                shuffle=False)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                    workers=workers, **kwargs)


@pytest.mark.parametrize('workers', WORKERS)
def test_a_loss_func_that_reaches_the_master_through_a_global_is_refused(
        workers):
    model = L.Classifier(SelfReferring())
    _SCRIPT_MODEL[:] = [model]
    try:
        with pytest.raises(ValueError) as info:
            _updater(model, workers, loss_func=loss_through_a_global)
    finally:
        _SCRIPT_MODEL[:] = []
    message = str(info.value)
    assert "global '_SCRIPT_MODEL'" in message
    assert 'loss_func (function loss_through_a_global' in message
    assert "the master's link '/'" in message
    assert 'pass the model to it as an argument' in message


class HoldsAWeakReference(SelfReferring):
    """A weak reference cannot be pickled; a deep copy keeps it pointing at
    the master's link."""

    def __init__(self):
        super(HoldsAWeakReference, self).__init__()
        self.last = weakref.ref(self.l4)


def test_a_weak_reference_to_a_link_is_refused_with_both_workers():
    with pytest.raises(ValueError, match="workers='process'.*weakref"):
        _updater(L.Classifier(HoldsAWeakReference()), 'process')
    with pytest.raises(ValueError) as info:
        _updater(L.Classifier(HoldsAWeakReference()), 'thread')
    message = str(info.value)
    assert 'the model.predictor.last (weakly referred)' in message
    assert "the master's link '/predictor/l4'" in message


class _Elsewhere(object):
    pass


_ELSEWHERE = _Elsewhere()


class UnpicklableAndSelfReferring(SelfReferring):
    """Cannot be pickled (a weak reference to something outside the model),
    so thread workers deep-copy it; the deep copy shares the closures."""

    def __init__(self):
        super(UnpicklableAndSelfReferring, self).__init__()
        self.note = weakref.ref(_ELSEWHERE)


def test_a_deep_copy_that_keeps_closures_over_the_master_is_refused():
    with pytest.raises(ValueError) as info:
        _updater(L.Classifier(UnpicklableAndSelfReferring()), 'thread')
    message = str(info.value)
    assert re.search(r"^after copying the model for a replica, the model"
                     r"\.predictor\.(first|scale) \(function ", message)
    assert "the master's link '/predictor/l1'" in message
    assert 'thread workers copied it with copy.deepcopy' in message


class HoldsALock(SelfReferring):

    def __init__(self):
        super(HoldsALock, self).__init__()
        self.lock = threading.Lock()


@pytest.mark.parametrize('workers', WORKERS)
def test_a_model_that_cannot_be_copied_at_all_is_refused(workers):
    with pytest.raises(ValueError, match="_thread.lock"):
        _updater(L.Classifier(HoldsALock()), workers)


# -- @static_graph ----------------------------------------------------------

class StaticMLP(chainer.Chain):
    """The shape of Chainer's static_graph_optimizations/mnist model:
    lazy layers, ``chainer.static_graph`` on ``__call__``."""

    def __init__(self):
        super(StaticMLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 8)
            self.l2 = L.Linear(None, 3)

    @chainer.static_graph
    def __call__(self, x):
        return self.l2(F.relu(self.l1(x)))


class StaticWithOptions(chainer.Chain):

    def __init__(self):
        super(StaticWithOptions, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 3)

    @static_graph(verbosity_level=0)
    def forward(self, x):
        return self.l1(x)


def _static_reference(make, iterations, evaluate=False):
    """StandardUpdater's run of a fresh ``make()``, and its model (whose
    static schedule ran)."""
    model = _fresh(make)
    params = _train_evaluating(model, standard, iterations, evaluate)
    return model, params


def _train_evaluating(model, make_updater, iterations, evaluate):
    """Trains ``model``; with ``evaluate``, also runs it in test mode after
    every update (as an Evaluator does) and returns those losses too."""
    optimizer = _adam(model)
    iterator = chainer.iterators.SerialIterator(vector_data(), 6,
                                                shuffle=False)
    x, t = chainer.dataset.concat_examples(vector_data(n=10, seed=7))
    updater = make_updater(iterator, optimizer)
    losses = []
    try:
        for _ in range(iterations):
            updater.update()
            if evaluate:
                with chainer.using_config('train', False), \
                        chainer.no_backprop_mode():
                    losses.append(float(model(x, t).array))
    finally:
        updater.finalize()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return (params, losses) if evaluate else params


def _initialized(make):
    """The first weights of a fresh ``make()``: lazy layers initialized by
    a first forward, as the updaters' first forward initializes them."""
    model = _fresh(make)
    model(*chainer.dataset.concat_examples(vector_data()[:6]))
    return _initial(model)


def _schedules(link, mode):
    """The non-empty static schedules of ``link`` for ``mode`` ('train' or
    'test') that its @static_graph method built."""
    manager = getattr(link, 'schedule_manager', None)
    if manager is None:
        return []
    return [schedule for key, schedules in manager.schedules.items()
            if key.startswith(mode + ':') for schedule in schedules
            if not schedule.is_empty()]


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('net, method', [(StaticMLP, 'StaticMLP.__call__'),
                                         (StaticWithOptions,
                                          'StaticWithOptions.forward')])
def test_a_static_graph_model_equals_standard_updater(workers, net, method,
                                                      said):
    # StandardUpdater replays the static schedule from the second
    # iteration on; 5 iterations run it 4 times.
    def make():
        return L.Classifier(net())
    reference, expected = _static_reference(make, 5)
    assert _schedules(reference.predictor, 'train')  # the schedule ran
    model = _fresh(make)
    actual = _train_evaluating(model, cgdp(2, workers=workers), 5,
                               evaluate=False)
    assert_same_params(expected, actual)
    _assert_trained(_initialized(make), expected)
    # The master ran define-by-run too: no schedule left unfinished on it.
    assert _schedules(model.predictor, 'train') == []
    lines = [line for line in said().splitlines()
             if line.startswith('CGDP @static_graph')]
    assert len(lines) == 1
    assert "{} (the model's link '/predictor')".format(method) in lines[0]
    assert 'define-by-run' in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_the_masters_own_static_schedule_evaluates_as_standard_updater(
        workers):
    # Evaluated in test mode after every update, the master builds a test
    # schedule at the first and replays it while CGDP moves and updates
    # its arrays (and gives them back at finalize).
    def make():
        return L.Classifier(StaticMLP())
    reference = _fresh(make)
    expected, expected_losses = _train_evaluating(reference, standard, 5,
                                                  evaluate=True)
    model = _fresh(make)
    actual, losses = _train_evaluating(model, cgdp(2, workers=workers), 5,
                                       evaluate=True)
    assert _schedules(model.predictor, 'test')  # replayed by the master
    assert_same_params(expected, actual)
    numpy.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert len(set(expected_losses)) == 5  # each evaluated new weights
    # Afterwards the master's schedule follows its own (private) arrays.
    for schedule in _schedules(model.predictor, 'test'):
        for index, (param_index, where) in schedule.param_hooks:
            if where == 'data':
                assert schedule.unique_arrays[index] is \
                    schedule.params_list[param_index].array


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_a_master_that_already_holds_a_static_schedule_trains(workers):
    # Evaluated (or trained by StandardUpdater) before the updater is
    # built, the master holds schedules with weak references and its own
    # parameters: the replicas' copies leave them out.
    def make():
        model = L.Classifier(StaticMLP())
        x, t = chainer.dataset.concat_examples(vector_data(n=6, seed=3))
        model(x, t).backward()  # a train schedule, its backward built
        with chainer.using_config('train', False):
            model(x, t)  # and a test schedule
        model.cleargrads()
        return model
    expected = _train_evaluating(_fresh(make), standard, 4, evaluate=False)
    model = _fresh(make)
    assert _schedules(model.predictor, 'train')
    actual = _train_evaluating(model, cgdp(2, workers=workers), 4,
                               evaluate=False)
    assert_same_params(expected, actual)


class LossChain(chainer.Chain):
    """A loss_func link over the model's @static_graph predictor."""

    def __init__(self, model):
        super(LossChain, self).__init__()
        with self.init_scope():
            self.model = model

    def forward(self, x, t):
        return F.softmax_cross_entropy(self.model(x), t)


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_a_loss_func_link_over_a_static_graph_model_trains(workers):
    def make():
        return L.Classifier(StaticMLP())

    def loss_chain(model):
        return LossChain(model.predictor)
    expected = _train_with_loss(
        _fresh(make), loss_chain,
        lambda it, opt, loss: chainer.training.updaters.StandardUpdater(
            it, opt, loss_func=loss))
    actual = _train_with_loss(
        _fresh(make), loss_chain,
        lambda it, opt, loss: cgdp_chainer.CGDPUpdater(
            it, opt, ['@numpy'] * 2, loss_func=loss, workers=workers))
    assert_same_params(expected, actual)


def test_static_graph_methods_are_found_where_they_are():
    model = L.Classifier(StaticMLP())
    assert static_graph_models.decorated_methods(model) == [
        "StaticMLP.__call__ (the model's link '/predictor')"]
    # Through a loss_func link: named once, where the model holds it.
    assert static_graph_models.decorated_methods(
        model, LossChain(model.predictor)) == [
        "StaticMLP.__call__ (the model's link '/predictor')"]
    assert static_graph_models.decorated_methods(
        SelfReferring(), LossChain(StaticMLP())) == [
        "StaticMLP.__call__ (loss_func's link '/model')"]
    assert static_graph_models.decorated_methods(
        L.Classifier(StaticWithOptions())) == [
        "StaticWithOptions.forward (the model's link '/predictor')"]


def test_plain_models_have_no_static_graph_methods():
    assert static_graph_models.decorated_methods(L.Classifier(MemNN())) == []
    assert static_graph_models.decorated_methods(
        L.Classifier(SelfReferring()), functools.partial(F.sum)) == []


def test_the_replica_pickle_leaves_the_weights_out():
    # ResNet-50's 25 M parameters (100 MB) are not in the bytes that each
    # worker process unpickles (nor copied for thread replicas, above).
    model = L.Classifier(L.ResNet50Layers(pretrained_model=None))
    params = dict(model.namedparams())
    replica_bytes = replica_copy.pickle_replica(model, None, params)
    weights = sum(p.array.nbytes for p in params.values())
    assert len(replica_bytes) < weights / 100
