"""One flat buffer per model, each chunk a slice: the layout, the master's
views, and the runtime's use of them (one fused call per chunk)."""
import copy

import chainer
import chainer.links as L
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.replica import readiness

import equivalence
from models import examples

SPECS = [('/a', (3, 4), numpy.float32), ('/b', (5,), numpy.float32),
         ('/c', (2, 2), numpy.float16), ('/d', (7,), numpy.float32)]


def test_parameters_of_one_dtype_follow_each_other_without_gaps():
    layout = buffers.FlatLayout(SPECS)
    a, b, c, d = (layout.entries[name][0] for name in ('/a', '/b', '/c', '/d'))
    assert b == a + 12 * 4
    # A change of dtype starts a new cache line.
    assert c % 64 == 0 and c >= b + 5 * 4
    assert d % 64 == 0 and d >= c + 4 * 2
    assert layout.nbytes == d + 7 * 4
    for names in (list(layout.names), list(reversed(layout.names))):
        assert layout.reordered(names).nbytes <= layout.capacity


def test_a_span_is_its_runs_of_one_dtype():
    layout = buffers.FlatLayout(SPECS)
    span = layout.span(['/b', '/a', '/c'])
    assert [run.names for run in span.runs] == [('/a', '/b'), ('/c',)]
    assert (span.start, span.stop) == (0, layout.entries['/c'][0] + 8)
    flat = numpy.arange(layout.capacity, dtype=numpy.uint8)
    views = layout.views(flat)
    first = buffers.typed(flat, span.runs[0])
    assert first.dtype == numpy.float32 and first.size == 17
    numpy.testing.assert_array_equal(first[:12], views['/a'].reshape(-1))
    with pytest.raises(ValueError, match='next to each other'):
        layout.span(['/a', '/c'])


def test_the_layer_order_makes_every_plan_of_the_same_layers_slices():
    model = L.Classifier(examples.ManyArrays(n_blocks=6, width=4))
    x = numpy.zeros((2, 3, 2, 2), numpy.float32)
    t = numpy.zeros(2, numpy.int32)
    names = [n for n, _ in model.namedparams()]
    chunks = readiness.ChunkReadiness(
        readiness.ChunkPlan.from_ready_order(names, chunk_size=len(names)),
        lambda index: None)
    chunks.start()
    report = readiness.ReadinessBackward(model.namedparams()).backward(
        model(x, t), chunks)
    plans = [readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, chunk_size=size) for size in (1, 2, 3)]
    layout = buffers.FlatLayout.of_arrays(
        {name: p.array for name, p in model.namedparams()})
    layout = layout.reordered(buffers.layer_order(plans[0]))
    for plan in plans:
        for names in plan.chunks:
            assert layout.contiguous(names)


def test_the_master_keeps_its_values_through_a_relayout():
    params = {name: chainer.Parameter(
        numpy.random.RandomState(i).uniform(size=shape).astype(dtype))
        for i, (name, shape, dtype) in enumerate(SPECS)}
    values = {name: p.array.copy() for name, p in params.items()}
    layout = buffers.FlatLayout(SPECS)
    master = buffers.FlatMaster(params, layout,
                                buffers.host_buffer(layout.capacity))
    params['/b'].array = numpy.full(5, 9, numpy.float32)  # replaced
    master.sync(['/b'])
    values['/b'] = numpy.full(5, 9, numpy.float32)
    master.relayout(layout.reordered(['/d', '/c', '/b', '/a']))
    views = master.layout.views(master.buffer)
    for name, param in params.items():
        assert param.array is master.arrays[name]
        numpy.testing.assert_array_equal(views[name], values[name])
    master.release()
    for name, param in params.items():
        assert param.array.base is None
        numpy.testing.assert_array_equal(param.array, values[name])


class _Ladder(chainer.ChainList):
    """Many small layers (two arrays each), no batch statistics: replicas
    train as one device on the whole batch."""

    def __init__(self, n_layers=10, width=6, n_classes=5):
        rng = numpy.random.RandomState(0)
        layers = [L.Linear(12, width, initialW=rng.normal(
            0, 0.3, (width, 12)).astype(numpy.float32))]
        layers += [L.Linear(width, width, initialW=rng.normal(
            0, 0.3, (width, width)).astype(numpy.float32))
            for _ in range(n_layers - 2)]
        layers.append(L.Linear(width, n_classes))
        super(_Ladder, self).__init__(*layers)

    def forward(self, x):
        h = x
        for layer in self[:-1]:
            h = chainer.functions.tanh(layer(h))
        return self[-1](h)


def _many_arrays():
    return L.Classifier(_Ladder())


@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_each_chunk_is_one_slice_and_one_fused_call(workers):
    base = _many_arrays()
    # Initializes nothing lazily: every parameter exists.
    dataset = [(numpy.random.RandomState(i).uniform(
        size=(3, 2, 2)).astype(numpy.float32), numpy.int32(i % 5))
        for i in range(16)]
    expected = copy.deepcopy(base)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9)
    optimizer.setup(expected)
    reference = chainer.training.updaters.StandardUpdater(
        chainer.iterators.SerialIterator(dataset, 4, shuffle=False),
        optimizer)
    model = copy.deepcopy(base)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9)
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(
        chainer.iterators.SerialIterator(dataset, 4, shuffle=False),
        optimizer, ['@numpy'] * 2, chunk_size=3, workers=workers)
    try:
        for _ in range(4):
            reference.update()
            updater.update()
        calls_before = updater._accumulator.fused_calls
        reference.update()
        updater.update()
        n_chunks = updater.chunk_plan.n_chunks
        assert n_chunks > 2
        # One fused call per chunk, whatever its array count.
        assert updater._accumulator.fused_calls - calls_before == n_chunks
        addresses = {name: p.array.ctypes.data
                     for name, p in model.namedparams()}
        for names in updater.chunks:
            ordered = sorted(names, key=addresses.__getitem__)
            params = dict(model.namedparams())
            ends = [addresses[n] + params[n].array.nbytes for n in ordered]
            assert all(end == addresses[n]
                       for end, n in zip(ends, ordered[1:]))
    finally:
        updater.finalize()
    equivalence.assert_same_params(
        {n: p.array for n, p in expected.namedparams()},
        {n: p.array for n, p in model.namedparams()})
