"""Loss scaling (``loss_scale=``, ``optimizer.loss_scaling()``) and fp16
training with ``use_fp32_update`` against StandardUpdater: the same
parameters, gradients and loss scale after every iteration, and an
iteration whose gradient is not finite on any replica skipped."""
import warnings

import models  # NOQA: imports the compat module before Chainer
import chainer
from chainer import optimizer_hooks
from chainer.training import updaters
import chainer.links as L
import numpy
import pytest

import cgdp_chainer

import equivalence
import staged_models

BATCH = 6
ITERATIONS = 4
# Example 13 is in the third batch (0-based 2) at position 1: with two
# replicas (each takes batch[i::2]) it is replica 1's alone.
POISONED_EXAMPLE = 13

OPTIMIZERS = {
    'momentum': lambda: chainer.optimizers.MomentumSGD(lr=0.1),  # fused
    'adam': lambda: chainer.optimizers.Adam(alpha=0.01),          # fused
    'adagrad': lambda: chainer.optimizers.AdaGrad(lr=0.1),        # fused
    'smorms3': lambda: chainer.optimizers.SMORMS3(lr=0.01),       # Chainer's
}


def dataset(poisoned, dtype=numpy.float32):
    data = staged_models.dataset()
    x, t = data._datasets
    x = x.astype(dtype)
    if poisoned:
        # Overflows the first layer's output: the loss and every gradient of
        # that replica are not finite.
        x[POISONED_EXAMPLE] = numpy.finfo(dtype).max
    return chainer.datasets.TupleDataset(x, t)


def run(make_updater, optimizer_name, scaling, hooks=False, poisoned=False,
        dtype=None, fp32_update=False):
    """Trains a fresh StagedMLP; returns per iteration its parameters,
    gradients, the optimizer's loss scale and its rules' ``t``."""
    config = {} if dtype is None else {'dtype': dtype}
    with chainer.using_config('dtype', config.get('dtype',
                                                  chainer.config.dtype)):
        model = L.Classifier(staged_models.StagedMLP())
        optimizer = OPTIMIZERS[optimizer_name]()
        optimizer.setup(model)
        if fp32_update:
            optimizer.use_fp32_update()
        if hooks:
            optimizer.add_hook(optimizer_hooks.WeightDecay(1e-2))
            # Clips the scaled gradient, as Chainer's hooks see it.
            optimizer.add_hook(optimizer_hooks.GradientHardClipping(-2, 2))
        if scaling == 'dynamic':
            optimizer.loss_scaling(interval=2)
        iterator = chainer.iterators.SerialIterator(
            dataset(poisoned, numpy.float16 if dtype is not None
                    else numpy.float32), BATCH, shuffle=False)
        updater = make_updater(iterator, optimizer,
                               128.0 if scaling == 'static' else None)
        steps = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')  # non-finite, deferred
                for _ in range(ITERATIONS):
                    updater.update()
                    steps.append(snapshot(model, optimizer))
        finally:
            updater.finalize()
    return steps


def snapshot(model, optimizer):
    to_cpu = chainer.backends.cuda.to_cpu
    return {
        'params': {n: to_cpu(p.array).astype(numpy.float32)
                   for n, p in model.namedparams()},
        'grads': {n: to_cpu(p.grad).astype(numpy.float32)
                  for n, p in model.namedparams()},
        'dtypes': {n: p.dtype for n, p in model.namedparams()},
        'scale': optimizer._loss_scale,
        't': {n: p.update_rule.t for n, p in model.namedparams()},
        'optimizer_t': optimizer.t,
    }


def standard(iterator, optimizer, loss_scale):
    return updaters.StandardUpdater(iterator, optimizer,
                                    loss_scale=loss_scale)


def cgdp(n, workers):
    def make(iterator, optimizer, loss_scale):
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * n, chunk_size=1,
            workers=workers, loss_scale=loss_scale)
    return make


def assert_same_steps(want, got, rtol=1e-5, atol=1e-6, grad_atol=None):
    assert len(want) == len(got)
    for step, (w, g) in enumerate(zip(want, got)):
        assert g['scale'] == w['scale'], step
        assert g['t'] == w['t'], step
        assert g['optimizer_t'] == w['optimizer_t'], step
        for key in ('params', 'grads'):
            for name in w[key]:
                numpy.testing.assert_allclose(
                    g[key][name], w[key][name], rtol=rtol,
                    atol=grad_atol if key == 'grads' and grad_atol else atol,
                    err_msg='{} {} after update {}'.format(key, name,
                                                           step + 1))


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('optimizer', sorted(OPTIMIZERS))
def test_static_loss_scale_trains_as_standard_updater(workers, optimizer):
    want = run(standard, optimizer, 'static', hooks=True)
    got = run(cgdp(2, workers), optimizer, 'static', hooks=True)
    assert_same_steps(want, got)
    assert got[-1]['scale'] == 128.0


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('optimizer', ['momentum', 'smorms3'])
def test_dynamic_loss_scaling_skips_a_non_finite_iteration(workers,
                                                           optimizer):
    want = run(standard, optimizer, 'dynamic', hooks=True, poisoned=True)
    got = run(cgdp(2, workers), optimizer, 'dynamic', hooks=True,
              poisoned=True)
    # The poisoned third iteration is skipped: parameters and rules' t as
    # after the second; the scale halves there and grows otherwise.
    for steps in (want, got):
        assert [s['scale'] for s in steps] == [2.0, 4.0, 2.0, 2.0 ** 1.5]
        for name in steps[1]['params']:
            numpy.testing.assert_array_equal(steps[2]['params'][name],
                                             steps[1]['params'][name])
        assert steps[2]['t'] == steps[1]['t']
    # The skipped iteration's gradients are left scaled and not finite.
    assert not numpy.isfinite(got[2]['grads']['/predictor/layers/0/W']).any()
    assert_same_steps(want, got)


@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_fp32_update_with_mixed16_trains_as_standard_updater(workers):
    want = run(standard, 'momentum', 'static', dtype=chainer.mixed16,
               fp32_update=True)
    got1 = run(cgdp(1, workers), 'momentum', 'static',
               dtype=chainer.mixed16, fp32_update=True)
    got2 = run(cgdp(2, workers), 'momentum', 'static',
               dtype=chainer.mixed16, fp32_update=True)
    for steps in (want, got1, got2):
        assert set(steps[-1]['dtypes'].values()) == {
            numpy.dtype(numpy.float16)}
    # One replica computes what StandardUpdater does, operation by
    # operation; two sum two half-batch gradients in float16. The float16
    # param.grad stays scaled (use_fp32_update divides its float32 copy),
    # so its tolerance is the scale's (128) times the parameters'.
    assert_same_steps(want, got1)
    assert_same_steps(want, got2, rtol=2e-2, atol=2e-3, grad_atol=0.25)


@pytest.mark.gpu
@pytest.mark.parametrize('scaling', ['static', 'dynamic'])
def test_loss_scaling_on_gpus(scaling):
    def gpus(iterator, optimizer, loss_scale):
        # Two replicas on GPU 0 (a device named twice): the poisoned
        # example is replica 1's alone, as on two GPUs.
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@cupy:0', '@cupy:0'], chunk_size=1,
            loss_scale=loss_scale)

    def standard_on_gpu(iterator, optimizer, loss_scale):
        optimizer.target.to_device('@cupy:0')
        return updaters.StandardUpdater(iterator, optimizer,
                                        device='@cupy:0',
                                        loss_scale=loss_scale)
    want = run(standard_on_gpu, 'momentum', scaling, hooks=True,
               poisoned=scaling == 'dynamic')
    got = run(gpus, 'momentum', scaling, hooks=True,
              poisoned=scaling == 'dynamic')
    assert_same_steps(want, got, rtol=1e-4, atol=1e-5)
