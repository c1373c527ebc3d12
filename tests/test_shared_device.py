"""Several replicas on one device, as ParallelUpdater allows: a device
named twice is two replicas, each with its own model copy, streams and
transfer buffers, and they train as StandardUpdater on the same batches.

On the CPU the device named twice is '@numpy' in its forms (one Device
object given twice included); the GPU tests name '@cupy:0' twice, so that
a machine with one GPU runs the multi-replica GPU paths. The CUDA
transfers of two replicas on one GPU are checked on the CPU in
tests/test_cuda_transfer_counts.py."""
import copy

import chainer
import chainer.links as L
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import devices as devices_module

import equivalence
import staged_models

ITERATIONS = 3
BATCH = 6


def _train(model, make_updater):
    """Runs ``make_updater``'s updates; returns the parameters and the
    reported ``main/loss`` of every iteration."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = make_updater(iterator, optimizer)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    losses = []
    try:
        for _ in range(ITERATIONS):
            observation = {}
            with reporter.scope(observation):
                updater.update()
            losses.append(float(chainer.backends.cuda.to_cpu(
                chainer.as_array(observation['main/loss']))))
    finally:
        updater.finalize()
    params = {name: chainer.backends.cuda.to_cpu(param.array).copy()
              for name, param in model.namedparams()}
    return params, losses


def _assert_trains_as_standard(devices, workers):
    base = L.Classifier(staged_models.StagedMLP())
    expected_params, expected_losses = _train(copy.deepcopy(base),
                                              equivalence.standard)
    params, losses = _train(copy.deepcopy(base), equivalence.cgdp(
        len(devices), devices=devices, workers=workers, chunk_size=2))
    equivalence.assert_same_params(expected_params, params, rtol=1e-4,
                                   atol=1e-6)
    numpy.testing.assert_allclose(losses, expected_losses, rtol=1e-5)


ONE_DEVICE = chainer.get_device('@numpy')


@pytest.mark.parametrize('workers', [
    'thread', pytest.param('process', marks=pytest.mark.slow)])
@pytest.mark.parametrize('devices', [
    [ONE_DEVICE, ONE_DEVICE],  # the very same Device object
    ['@numpy', -1, '-1'],
])
def test_replicas_named_on_one_cpu_device_train_as_standard_updater(
        devices, workers):
    _assert_trains_as_standard(devices, workers)


def test_a_device_named_twice_is_two_replicas():
    # What the parser did with a GPU named twice (it refused it) is what it
    # does with any device named twice: two replicas in order.
    parsed = devices_module.parse_devices([ONE_DEVICE, ONE_DEVICE, -1])
    assert [devices_module.spec_of(d) for d in parsed] == ['@numpy'] * 3
    if devices_module.gpu_count() > 0:
        gpus = devices_module.parse_devices('0,0,@cupy:0')
        assert [devices_module.spec_of(d) for d in gpus] == ['@cupy:0'] * 3


@pytest.mark.gpu
@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('devices', [
    ['@cupy:0', '@cupy:0'],
    ['@cupy:0', '@numpy', '@cupy:0'],
])
def test_replicas_named_on_one_gpu_train_as_standard_updater(devices,
                                                             workers):
    _assert_trains_as_standard(devices, workers)
