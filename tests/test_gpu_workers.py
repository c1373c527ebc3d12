"""CGDP on GPUs with both worker kinds (skipped where CuPy sees no GPU)."""
import copy

import pytest

import cgdp_chainer
import chainer
import chainer.links as L

import equivalence
import staged_models


def _momentum(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return optimizer


@pytest.mark.gpu
@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_gpu_replicas_equal_one_device_on_the_whole_batch(workers):
    from cgdp_chainer import devices
    gpus = ['@cupy:{}'.format(i) for i in range(min(2, devices.gpu_count()))]
    base = L.Classifier(staged_models.StagedMLP())
    expected = equivalence.train(copy.deepcopy(base), _momentum,
                                 equivalence.standard)
    timeline = cgdp_chainer.Timeline()
    actual = equivalence.train(copy.deepcopy(base), _momentum,
                               equivalence.cgdp(len(gpus), devices=gpus,
                                                chunk_size=2,
                                                workers=workers,
                                                timeline=timeline))
    equivalence.assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)
    kinds = {(e.device, e.kind) for e in timeline.events}
    assert (0, 'backward') in kinds and ('host', 'update') in kinds
