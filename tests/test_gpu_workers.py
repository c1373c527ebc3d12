"""CGDP on GPUs with both worker kinds (skipped where CuPy sees no GPU)."""
import copy

import numpy
import pytest

import cgdp_chainer
import chainer
import chainer.links as L
from chainer.training import updaters

import staged_models


def _train(model, make_updater, iterations=3):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = make_updater(iterator, optimizer)
    try:
        for _ in range(iterations):
            updater.update()
    finally:
        updater.finalize()
    return {n: chainer.backends.cuda.to_cpu(p.array).copy()
            for n, p in model.namedparams()}


@pytest.mark.gpu
@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_gpu_replicas_equal_one_device_on_the_whole_batch(workers):
    from cgdp_chainer import devices
    gpus = ['@cupy:{}'.format(i) for i in range(min(2, devices.gpu_count()))]
    base = L.Classifier(staged_models.StagedMLP())
    expected = _train(copy.deepcopy(base),
                      lambda i, o: updaters.StandardUpdater(i, o))
    timeline = cgdp_chainer.Timeline()
    actual = _train(copy.deepcopy(base), lambda i, o: cgdp_chainer.CGDPUpdater(
        i, o, gpus, chunk_size=2, workers=workers, timeline=timeline))
    for name in expected:
        numpy.testing.assert_allclose(actual[name], expected[name],
                                      rtol=1e-4, atol=1e-5, err_msg=name)
    kinds = {(e.device, e.kind) for e in timeline.events}
    assert (0, 'backward') in kinds and ('host', 'update') in kinds
