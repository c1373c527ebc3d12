"""What the multi-node optimizer overlaps, and what it refuses, on 2 ranks.

Run: mpiexec -n 2 python tests/mpi_scripts/optimizer_overlap.py

* ``optimizer.update(lossfun, ...)``: the output-side layer's new weights
  are in the model before the backward reaches the input-side layer (a
  function hook there waits, boundedly, for them): its chunk was handed
  over, all-reduced and updated during the backward. The timeline has a
  ``backward`` event per chunk.
* ``loss.backward(); optimizer.update()``: nothing changes before
  ``update()`` (Chainer sets the gradients at the end of the backward),
  and the iteration has no ``backward`` events.
* A parameter reshaped after the first update is refused by name; a model
  whose parameters differ between the ranks is refused on every rank.
* The two ranks (one machine) share one host for MomentumSGD, keep a host
  each with ``node_host=False`` or with GradientClipping (which needs the
  whole gradient), and all three end with the same weights.
* A model trained through the GPU path (the CPU stand-in of CuPy's
  copies, tests/cuda_standin.py) on the shared node host: a chunk's new
  weights start to the device (the node's ``h2d`` on the timeline) before
  the backward reaches the input-side layer.
* Through the GPU path, on the shared node host and on a host per rank,
  every update's host-to-device copies (a chunk's mean gradient and new
  weights) are issued by the host's threads, chunk by chunk; none by the
  caller's thread in ``update()``.
"""
import os
import sys
import threading
import time

import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # NOQA: must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402

N_LAYERS = 4
WAIT_SECONDS = 20


class WaitBeforeInputLayer(chainer.FunctionHook):
    """Before the input-side layer's backward, waits until ``seen()`` is
    true (at most WAIT_SECONDS) and records whether it became so."""

    name = 'WaitBeforeInputLayer'

    def __init__(self, model, seen):
        self.input_weight = model.predictor[0].W
        self.seen = seen
        self.seen_in_time = None

    def backward_preprocess(self, function, in_data, out_grad):
        if not any(node is self.input_weight.node
                   for node in function.inputs):
            return
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            if self.seen():
                self.seen_in_time = True
                return
            time.sleep(0.005)
        self.seen_in_time = False


def make_model(seed=0):
    random = numpy.random.RandomState(seed)
    layers = [L.Linear(8, 8, initialW=random.normal(0, 0.3, (8, 8)).astype(
        numpy.float32)) for _ in range(N_LAYERS)]
    return L.Classifier(chainer.Sequential(*layers))


def batch(rank, step):
    random = numpy.random.RandomState(100 * rank + step)
    return (random.randn(6, 8).astype(numpy.float32),
            random.randint(0, 8, 6).astype(numpy.int32))


def check_overlap(comm, lines):
    model = make_model()
    timeline = cgdp_chainer.Timeline()
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.SGD(0.1), comm, chunk_size=1, timeline=timeline)
    optimizer.setup(model)
    optimizer.update(model, *batch(comm.rank, 0))  # broadcasts, no step
    output_weight = model.predictor[-1].W
    before = output_weight.array.copy()
    # The output-side layer's new weights are in the model.
    hook = WaitBeforeInputLayer(model, lambda: not numpy.array_equal(
        output_weight.array, before))
    with hook:
        optimizer.update(model, *batch(comm.rank, 1))
    assert hook.seen_in_time is True, hook.seen_in_time
    backward = [e for e in timeline.events_of(1) if e.kind == 'backward']
    assert sorted(e.chunk for e in backward) == list(range(N_LAYERS)), \
        backward
    lines.append('overlapped during optimizer.update(lossfun)')

    before = {name: p.array.copy() for name, p in model.namedparams()}
    model.cleargrads()
    loss = model(*batch(comm.rank, 2))
    loss.backward()
    assert not _common.parameters_changed(model, before)
    optimizer.update()
    assert _common.parameters_changed(model, before)
    assert not [e for e in timeline.events_of(2) if e.kind == 'backward']
    lines.append('handed over at update() after a user backward')
    return model, optimizer


def _import_standin():
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import cuda_standin
    return cuda_standin


def check_device_overlap(comm, lines):
    """Through the GPU path on the node's shared host, the chunks the
    backward has handed over go back to the device during it."""
    cuda_standin = _import_standin()
    timeline = cgdp_chainer.Timeline()
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.SGD(0.1), comm, chunk_size=1, timeline=timeline,
        device_copies=cuda_standin.HostDeviceCopies)
    model = make_model()
    optimizer.setup(model)
    optimizer.update(model, *batch(comm.rank, 0))  # broadcasts, no step
    assert optimizer.shares_node_host
    # A chunk of this iteration was sent to the device.
    hook = WaitBeforeInputLayer(model, lambda: any(
        event.kind == 'h2d' for event in timeline.events_of(1)))
    with hook:
        optimizer.update(model, *batch(comm.rank, 1))
    assert hook.seen_in_time is True, hook.seen_in_time
    published = [e for e in timeline.events_of(1) if e.kind == 'h2d']
    assert sorted(e.chunk for e in published) == list(range(N_LAYERS)), \
        published
    optimizer.close()
    lines.append('a device model\'s chunks published during the backward '
                 'on a node host')


def check_device_copies_leave_the_callers_thread(comm, lines):
    """Through the GPU path, each update's copies to the device are issued
    by the host's threads as each chunk is done (two per chunk: its mean
    gradient and its weights), on a shared node host and on a host per
    rank; the caller's thread issues none."""
    cuda_standin = _import_standin()
    caller = threading.get_ident()
    for options, shared in (({}, True), ({'node_host': False}, False)):
        made = []

        def copies(device):
            made.append(cuda_standin.HostDeviceCopies(device))
            return made[-1]

        optimizer = cgdp_chainer.create_multi_node_optimizer(
            chainer.optimizers.MomentumSGD(0.1), comm, chunk_size=1,
            device_copies=copies, **options)
        model = make_model()
        optimizer.setup(model)
        optimizer.update(model, *batch(comm.rank, 0))  # broadcasts
        assert optimizer.shares_node_host is shared, options
        standin, = made
        for step in range(1, 4):
            standin.take_log()
            optimizer.update(model, *batch(comm.rank, step))
            to_device = [entry for entry in standin.take_log()
                         if isinstance(entry, cuda_standin.Copy) and
                         entry.kind == 'h2d']
            assert len(to_device) == 2 * N_LAYERS, (options, to_device)
            assert [copy for copy in to_device
                    if copy.thread == caller] == [], (options, to_device)
        optimizer.close()
    lines.append('a device model\'s chunks issued back by the host\'s '
                 'threads, none by update()\'s caller, on both host kinds')


def check_host_kinds(comm, lines):
    """Two ranks of one machine share one host for a fused optimizer,
    keep one each with node_host=False or a whole-gradient hook, and all
    three train the same weights."""
    trained = []
    for options, hook, shared in (({}, None, True),
                                  ({'node_host': False}, None, False),
                                  ({}, chainer.optimizer_hooks.
                                   GradientClipping(100.0), False)):
        model = make_model()
        optimizer = cgdp_chainer.create_multi_node_optimizer(
            chainer.optimizers.MomentumSGD(0.1), comm, **options)
        optimizer.setup(model)
        if hook is not None:
            optimizer.add_hook(hook)
        for step in range(4):
            optimizer.update(model, *batch(comm.rank, step))
        assert optimizer.shares_node_host is shared, (options, hook)
        trained.append({name: p.array.copy()
                        for name, p in model.namedparams()})
        optimizer.close()
    for other in trained[1:]:
        for name, array in trained[0].items():
            numpy.testing.assert_array_equal(other[name], array, name)
    lines.append('a shared node host, a host per rank and a deferred '
                 'update train alike')


def check_structure_change(model, optimizer, lines):
    layer = model.predictor[0]
    original = layer.W.array
    layer.W.array = numpy.zeros((8, 9), numpy.float32)
    try:
        optimizer.update(model, *batch(0, 3))
    except ValueError as error:
        assert 'predictor/0/W' in str(error), str(error)
        lines.append('reshaped parameter refused')
    else:
        raise AssertionError('a reshaped parameter was not refused')
    finally:
        layer.W.array = original


def check_replaced_array_on_a_node_host(comm, lines):
    """A replaced array is refused where the ranks share one host (each
    rank's new values would overwrite the others'), and taken where each
    rank keeps its own."""
    for options, refused in (({}, True), ({'node_host': False}, False)):
        model = make_model()
        optimizer = cgdp_chainer.create_multi_node_optimizer(
            chainer.optimizers.MomentumSGD(0.1), comm, **options)
        optimizer.setup(model)
        optimizer.update(model, *batch(comm.rank, 0))
        weight = model.predictor[0].W
        weight.array = weight.array * 0.5
        try:
            optimizer.update(model, *batch(comm.rank, 1))
        except ValueError as error:
            assert refused and 'node_host=False' in str(error), str(error)
        else:
            assert not refused, 'a replaced array on a node host was taken'
        optimizer.close()
    lines.append('a replaced array refused on a node host, taken by a '
                 'host per rank')


def check_differing_models(comm, lines):
    model = make_model()
    if comm.rank == 1:
        model.predictor.append(L.Linear(8, 8))
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.SGD(0.1), comm).setup(model)
    try:
        optimizer.update(model, *batch(comm.rank, 0))
    except ValueError as error:
        assert 'ranks differ' in str(error), str(error)
        lines.append('differing models refused')
    else:
        raise AssertionError('differing models were not refused')


def main():
    comm = _common.start_mpi()
    lines = []
    with cgdp_mpi.abort_on_exception(comm):
        model, optimizer = check_overlap(comm, lines)
        check_structure_change(model, optimizer, lines)
        optimizer.close()
        check_differing_models(comm, lines)
        check_device_overlap(comm, lines)
        check_device_copies_leave_the_callers_thread(comm, lines)
        check_host_kinds(comm, lines)
        check_replaced_array_on_a_node_host(comm, lines)
    _common.report_ok(comm, 'optimizer-overlap', lines)


if __name__ == '__main__':
    main()
