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
from cgdp_chainer.runtime import device_view

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
    from cgdp_chainer import devices
    gpus = ['@cupy:{}'.format(i) for i in range(min(2, devices.gpu_count()))]
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
