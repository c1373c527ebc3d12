"""CGDP on GPUs with both worker kinds (skipped where CuPy sees no GPU)."""
import copy

import pytest

import cgdp_chainer
import chainer
import chainer.functions as F
import chainer.links as L
import numpy

from cgdp_chainer import devices as devices_module

import equivalence
import staged_models


def _momentum(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return optimizer


@pytest.mark.gpu
@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_gpu_replicas_equal_one_device_on_the_whole_batch(workers):
    gpus = equivalence.two_gpu_replicas()
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


class _WideMLP(chainer.Chain):
    """Wide enough (about 50 MB of weights) that a copy of the weights not
    ordered before the first forward would be seen half done."""

    def __init__(self, width=2048, n_out=5):
        super(_WideMLP, self).__init__()
        rng = numpy.random.RandomState(0)
        with self.init_scope():
            self.l1 = L.Linear(6, width, initialW=rng.normal(
                0, 0.3, (width, 6)).astype(numpy.float32))
            self.l2 = L.Linear(width, width, initialW=rng.normal(
                0, 0.02, (width, width)).astype(numpy.float32))
            self.l3 = L.Linear(width, width, initialW=rng.normal(
                0, 0.02, (width, width)).astype(numpy.float32))
            self.l4 = L.Linear(width, n_out, initialW=rng.normal(
                0, 0.02, (n_out, width)).astype(numpy.float32))

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        h = F.relu(self.l3(h))
        return self.l4(h)


@pytest.mark.gpu
def test_thread_workers_first_step_uses_the_initial_weights():
    """The replica's weights reach its GPU before its first forward reads
    them (the copy runs on the replica's own stream)."""
    gpus = equivalence.two_gpu_replicas()
    base = L.Classifier(_WideMLP())
    expected = equivalence.train(copy.deepcopy(base), _momentum,
                                 equivalence.standard, iterations=1)
    actual = equivalence.train(copy.deepcopy(base), _momentum,
                               equivalence.cgdp(len(gpus), devices=gpus,
                                                workers='thread'),
                               iterations=1)
    equivalence.assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)


def _gpu_params(shapes, device_id):
    import cupy
    with cupy.cuda.Device(device_id):
        return {name: chainer.Parameter(cupy.zeros(shape, numpy.float32))
                for name, shape in shapes.items()}


@pytest.mark.gpu
def test_sync_events_carry_no_timing():
    """The events that only order copies are cheaper without timing (the
    chunked transfer's round trip is tested in test_cuda_transfer_counts)."""
    import cupy
    from cgdp_chainer.runtime.transport import transfer
    with cupy.cuda.Device(0):
        event = transfer.sync_event(cupy)
        event.record()
        event.synchronize()
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
            cupy.cuda.get_elapsed_time(event, event)


@pytest.mark.gpu
@pytest.mark.skipif(devices_module.gpu_count() < 2, reason='needs two GPUs')
def test_a_worker_for_gpu_1_creates_no_context_on_gpu_0():
    import cupy
    with cupy.cuda.Device(0):
        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # our own
        free_before = cupy.cuda.runtime.memGetInfo()[0]
    model = L.Classifier(staged_models.StagedMLP())
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, _momentum(model),
                                       ['@cupy:1'], workers='process')
    try:
        for _ in range(3):
            updater.update()
        with cupy.cuda.Device(0):
            free_after = cupy.cuda.runtime.memGetInfo()[0]
    finally:
        updater.finalize()
    # A context takes hundreds of MiB; allow for noise, not for one.
    assert free_before - free_after < 64 * 2 ** 20
