"""Evaluation on the first device (Evaluator(..., device=devices[0]), as
scripts written for ParallelUpdater do) and the DeviceView behind it."""
import copy
import pickle

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import extensions
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.replica import device_view

import equivalence
import staged_models

BATCH = 6
ITERATIONS = 3


def _momentum(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return optimizer


def _validation_losses(model, make_updater, device, tmp_path):
    """Trains with a Trainer whose Evaluator sends batches to ``device``;
    returns the validation loss after every iteration."""
    data = staged_models.dataset()
    iterator = chainer.iterators.SerialIterator(data, BATCH, shuffle=False)
    updater = make_updater(iterator, _momentum(model))
    trainer = chainer.training.Trainer(updater, (ITERATIONS, 'iteration'),
                                       out=str(tmp_path))
    trainer.extend(extensions.Evaluator(
        chainer.iterators.SerialIterator(data, BATCH, repeat=False,
                                         shuffle=False),
        model, device=device), trigger=(1, 'iteration'))
    log = extensions.LogReport(trigger=(1, 'iteration'))
    trainer.extend(log)
    trainer.run()
    return [float(entry['validation/main/loss']) for entry in log.log]


@pytest.mark.parametrize('workers', [
    'thread', pytest.param('process', marks=pytest.mark.slow)])
def test_evaluation_on_the_first_numpy_device_equals_standard_updater(
        workers, tmp_path):
    base = L.Classifier(staged_models.StagedMLP())
    expected = _validation_losses(copy.deepcopy(base), equivalence.standard,
                                  '@numpy', tmp_path / 'standard')
    actual = _validation_losses(
        copy.deepcopy(base), equivalence.cgdp(2, workers=workers), '@numpy',
        tmp_path / 'cgdp')
    assert len(actual) == ITERATIONS
    numpy.testing.assert_allclose(actual, expected, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_evaluation_on_the_first_gpu_equals_standard_updater(workers,
                                                             tmp_path):
    gpus = equivalence.two_gpu_replicas()
    base = L.Classifier(staged_models.StagedMLP())
    expected = _validation_losses(copy.deepcopy(base), equivalence.standard,
                                  '@numpy', tmp_path / 'standard')
    model = copy.deepcopy(base)
    actual = _validation_losses(
        model, equivalence.cgdp(len(gpus), devices=gpus, workers=workers),
        gpus[0], tmp_path / 'cgdp')
    numpy.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
    # The model stays in host memory, hook-free, after training.
    assert all(isinstance(p.array, numpy.ndarray) for p in model.params())
    assert device_view.DeviceView.name not in model.local_link_hooks


class _Net(chainer.Chain):
    """A Linear layer and a BatchNormalization (persistent values)."""

    def __init__(self):
        super(_Net, self).__init__()
        with self.init_scope():
            self.fc = L.Linear(3, 4, initialW=numpy.arange(
                12, dtype=numpy.float32).reshape(4, 3) / 10)
            self.bn = L.BatchNormalization(4)
        self.seen = []

    def forward(self, x):
        # Which W array the forward used, and what the links say.
        self.seen.append((self.fc.W.array, self.fc.xp.__name__,
                          self.bn.avg_mean))
        return F.sum(self.bn(self.fc(x)))


def _viewed(version):
    net = _Net()
    net.bn.avg_mean[...] = 0.5
    view = device_view.DeviceView(net, chainer.get_device('@numpy'),
                                  lambda: version[0])
    view.install()
    return net, view


def _evaluate(net, x):
    with chainer.using_config('train', False), \
            chainer.no_backprop_mode():
        return float(net(x).array)


X = numpy.linspace(-1, 1, 6, dtype=numpy.float32).reshape(2, 3)


def test_the_view_runs_on_copies_and_puts_the_host_arrays_back():
    version = [0]
    net, view = _viewed(version)
    plain = copy.deepcopy(net)  # gets an inert view: a plain model
    W, mean = net.fc.W.array, net.bn.avg_mean
    grad = numpy.ones_like(W)
    net.fc.W.grad = grad
    assert _evaluate(net, X) == pytest.approx(_evaluate(plain, X))
    used_W, xp, used_mean = net.seen[-1]
    assert used_W is not W and used_mean is not mean
    assert xp == "numpy"
    assert net.fc.W.array is W and net.bn.avg_mean is mean
    assert net.fc.W.grad is grad


def test_the_view_copies_the_weights_only_when_the_master_changed():
    version = [0]
    net, view = _viewed(version)
    _evaluate(net, X)
    _evaluate(net, X)
    assert view.refreshes == 1
    # Training changed the master in place: a new iteration.
    net.fc.W.array[...] += 1
    net.bn.avg_mean[...] = -2
    version[0] += 1
    changed = copy.deepcopy(net)
    assert _evaluate(net, X) == pytest.approx(_evaluate(changed, X))
    assert view.refreshes == 2
    # An array replaced by the user's code, in the same iteration.
    net.fc.W.array = net.fc.W.array * 3
    replaced = copy.deepcopy(net)
    assert _evaluate(net, X) == pytest.approx(_evaluate(replaced, X))
    assert view.refreshes == 3
    view.invalidate()
    _evaluate(net, X)
    assert view.refreshes == 4


def test_a_forward_that_raised_leaves_the_host_arrays_after_restore():
    net, view = _viewed([0])
    W = net.fc.W.array
    with pytest.raises(Exception):
        _evaluate(net, numpy.zeros((2, 5), numpy.float32))
    assert net.fc.W.array is not W  # Chainer calls no hook after a raise
    view.restore()  # as the next update() does
    assert net.fc.W.array is W
    _evaluate(net, X)  # and the next evaluation works
    assert net.fc.W.array is W


def test_copies_of_the_master_get_an_inert_view():
    net, view = _viewed([0])
    for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        W = other.fc.W.array
        _evaluate(other, X)
        assert other.seen[-1][0] is W  # no copy: the copy is a plain model
    uninstalled = view.refreshes
    view.uninstall()
    assert device_view.DeviceView.name not in net.local_link_hooks
    _evaluate(net, X)
    assert view.refreshes == uninstalled


@pytest.mark.parametrize('values, found', [
    ((X,), True),
    (({'x': [chainer.Variable(X)]},), True),
    (((1, 'a', None),), False),
])
def test_the_view_looks_for_inputs_on_its_device(values, found):
    assert device_view._on_device(values, chainer.get_device('@numpy')) \
        is found


def test_an_updater_on_numpy_devices_leaves_the_model_unhooked():
    model = L.Classifier(staged_models.StagedMLP())
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, _momentum(model),
                                       ['@numpy', '@numpy'],
                                       workers='thread')
    try:
        assert device_view.DeviceView.name not in model.local_link_hooks
    finally:
        updater.finalize()


class _LazyNet(chainer.Chain):
    """Chainer's MNIST example's MLP in small: every Linear infers its
    input size at the first forward; ``spare`` (if asked for) is never
    called."""

    def __init__(self, spare=False):
        super(_LazyNet, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 8)
            self.l2 = L.Linear(None, 5)
            if spare:
                self.spare = L.Linear(None, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _lazy_inputs():
    return numpy.random.RandomState(3).normal(
        size=(4, 6)).astype(numpy.float32)


def test_the_view_leaves_a_lazy_models_gradients_as_a_plain_model_would():
    # Evaluator(..., call_before_training=True) calls the master before
    # any update: its parameters are uninitialized, and Chainer raises on
    # reading their ``grad`` until a forward or cleargrads() sets one.
    net = _LazyNet(spare=True)
    plain = copy.deepcopy(net)
    view = device_view.DeviceView(net, chainer.get_device('@numpy'),
                                  lambda: 0)
    view.install()
    x = _lazy_inputs()
    outputs = []
    for model in (plain, net):
        numpy.random.seed(0)  # the initializers draw from it
        with chainer.using_config('train', False):
            outputs.append(model(x).array)
    numpy.testing.assert_array_equal(outputs[1], outputs[0])
    assert view.refreshes == 1
    for (name, expected), (_, actual) in zip(plain.namedparams(),
                                             net.namedparams()):
        assert actual.is_initialized == expected.is_initialized, name
        if not expected.is_initialized:
            # The spare's gradients are as unreadable as before.
            with pytest.raises(RuntimeError, match='Variable.grad'):
                actual.grad
            continue
        numpy.testing.assert_array_equal(actual.array, expected.array)
        # NaN-filled, as Chainer initializes them, on the host.
        assert isinstance(actual.grad, numpy.ndarray)
        numpy.testing.assert_array_equal(actual.grad, expected.grad)
    # Gradients set since come back as they are; the spare's still raise.
    grad = numpy.ones_like(net.l1.W.array)
    net.l1.W.grad = grad
    net.l2.cleargrads()
    with chainer.using_config('train', False):
        net(x)
    assert view.refreshes == 2  # the arrays initialized since
    assert net.l1.W.grad is grad and net.l2.W.grad is None
    with pytest.raises(RuntimeError, match='Variable.grad'):
        net.spare.W.grad


def _lazy_example_run(make_updater, out, view_on):
    """The MNIST example's shape in small: a lazy model, an Evaluator
    called before training and after every iteration, snapshots and logs.
    ``view_on``: the device a DeviceView on the master is built for (the
    updater's own on a GPU), or None. Returns the validation losses and
    the trained model."""
    numpy.random.seed(0)
    model = L.Classifier(_LazyNet())
    data = staged_models.dataset()
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    updater = make_updater(
        chainer.iterators.SerialIterator(data, BATCH, shuffle=False),
        optimizer)
    if view_on is not None:
        device_view.DeviceView(model, chainer.get_device(view_on),
                               lambda: updater.iteration).install()
    trainer = chainer.training.Trainer(updater, (ITERATIONS, 'iteration'),
                                       out=str(out))
    trainer.extend(extensions.Evaluator(
        chainer.iterators.SerialIterator(data, BATCH, repeat=False,
                                         shuffle=False),
        model, device='@numpy'), trigger=(1, 'iteration'),
        call_before_training=True)
    trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(n_retains=1),
                   trigger=(ITERATIONS, 'iteration'))
    log = extensions.LogReport(trigger=(1, 'iteration'))
    trainer.extend(log, call_before_training=True)
    trainer.run()
    params = {name: param.array.copy()
              for name, param in model.namedparams()}
    return [float(entry['validation/main/loss']) for entry in log.log], params


@pytest.mark.parametrize('workers', [
    'thread', pytest.param('process', marks=pytest.mark.slow)])
def test_a_viewed_lazy_model_evaluated_before_training_trains_as_standard(
        workers, tmp_path):
    # A CPU stand-in of the GPU run: the view is built for '@numpy', so
    # that every evaluation swaps the master's arrays as on a GPU.
    expected, standard_params = _lazy_example_run(
        equivalence.standard, tmp_path / 'standard', None)
    actual, params = _lazy_example_run(
        equivalence.cgdp(2, workers=workers), tmp_path / 'cgdp', '@numpy')
    assert len(actual) == ITERATIONS + 1  # and once before training
    numpy.testing.assert_allclose(actual, expected, rtol=1e-5)
    equivalence.assert_same_params(standard_params, params)
    assert (tmp_path / 'cgdp' / 'cg.dot').exists()
    assert (tmp_path / 'cgdp' / 'snapshot_iter_3').exists()
