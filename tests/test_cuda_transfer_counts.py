"""ChunkedCudaTransfer: one copy per chunk and direction, the right bytes.

The transfer's logic runs on the CPU with a NumPy stand-in for CuPy: host
arrays in place of device arrays, and streams that hold their work back
until an event recorded on them is waited for (or they are synchronized),
so that a copy ordered after the wrong event, or a ``ready`` that does not
cover its copy, shows as wrong bytes. The last test runs the real
:class:`CupyCopies` on a GPU (skipped without one).
"""
import collections
import contextlib

import chainer
import numpy
import pytest

import cgdp_chainer

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import cuda_transfer

# 7 arrays of mixed sizes and dtypes (several runs per chunk), 3 chunks.
SPECS = [('/l0/W', (4, 3), numpy.float32), ('/l0/b', (4,), numpy.float32),
         ('/l1/W', (5, 4), numpy.float16), ('/l1/b', (5,), numpy.float16),
         ('/l2/W', (2, 5), numpy.float64), ('/l2/b', (2,), numpy.float32),
         ('/l3/s', (), numpy.float32)]
CHUNKS = [['/l0/W', '/l0/b'], ['/l1/W', '/l1/b', '/l2/W'],
          ['/l2/b', '/l3/s']]


class _Stream(object):
    """A stand-in CUDA stream: its work runs, in order, when waited for."""

    def __init__(self, name):
        self.name = name
        self.work = []
        self.done = 0

    def run_until(self, position):
        while self.done < position:
            item = self.work[self.done]
            self.done += 1
            item()


class _Event(object):
    """A stand-in event: the position in its stream's work it marks."""

    def __init__(self, stream):
        self.stream = stream
        self.position = len(stream.work)

    def synchronize(self):
        self.stream.run_until(self.position)


class NumpyCopies(object):
    """CuPy's part of :class:`cuda_transfer.CupyCopies`, with NumPy; it
    tallies what it is asked to issue, independently of the transfer."""

    def __init__(self):
        self.compute = _Stream('compute')
        self.issued = collections.Counter()
        self.d2h_bytes = []
        self.h2d_bytes = []

    def device_scope(self):
        return contextlib.nullcontext()

    def new_stream(self):
        return _Stream('copy')

    def current_stream(self):
        return self.compute

    def device_buffer(self, n_bytes):
        return numpy.zeros(n_bytes, numpy.uint8)

    def pinned_buffer(self, n_bytes):
        return buffers.host_buffer(n_bytes)

    def d2h(self, source, destination, stream):
        self.issued['d2h'] += 1
        self.d2h_bytes.append(source.nbytes)
        stream.work.append(lambda: numpy.copyto(destination, source))

    def h2d(self, source, destination, stream):
        self.issued['h2d'] += 1
        self.h2d_bytes.append(source.nbytes)
        stream.work.append(lambda: numpy.copyto(destination, source))

    def record(self, stream):
        self.issued['event'] += 1
        return _Event(stream)

    def wait(self, stream, event):
        stream.work.append(event.synchronize)

    def gather(self, destination, grads, sizes):
        grads = list(grads)
        self.compute.work.append(lambda: cuda_transfer.gather_into(
            numpy, destination, grads, sizes))

    def timing_event(self, stream):
        return _Event(stream)

    def synchronize(self, stream):
        stream.run_until(len(stream.work))


def _layout():
    return buffers.FlatLayout(SPECS)


def _replica(layout, seed):
    rng = numpy.random.RandomState(seed)
    return collections.OrderedDict(
        (name, chainer.Parameter(rng.uniform(-1, 1, shape).astype(dtype)))
        for name, (_, shape, dtype) in layout.entries.items())


def _master_buffer(layout, seed):
    master = buffers.host_buffer(layout.capacity)
    rng = numpy.random.RandomState(seed)
    for view in layout.views(master).values():
        view[...] = rng.uniform(-1, 1, view.shape)
    return master


def _set_grads(replica, seed, none=()):
    rng = numpy.random.RandomState(seed)
    for name, param in replica.items():
        param.grad = None if name in none else rng.uniform(
            -1, 1, param.shape).astype(param.dtype)


def _transfer(staged=False, slot_buffer=None, layout=None, replica=None):
    layout = layout or _layout()
    copies = NumpyCopies()
    replica = replica if replica is not None else _replica(layout, 0)
    master = _master_buffer(layout, 1)
    port = cuda_transfer.ChunkedCudaTransfer(
        layout, master, slot_buffer, replica, chainer.get_device('@numpy'),
        staged=staged, copies=copies)
    return port, copies, replica, master


def _iterate(port, replica, chunks, seed):
    _set_grads(replica, seed)
    for index, names in enumerate(chunks):
        port.wait_params(index)
    for index, names in reversed(list(enumerate(chunks))):
        port.wait_grads(port.send_grads(names))
        port.publish(index, names)


@pytest.mark.parametrize('staged', [False, True])
def test_each_chunk_is_one_copy_each_way_per_iteration(staged):
    port, copies, replica, _ = _transfer(staged=staged)
    port.take_counts()
    layout = port.layout
    for iteration in range(3):
        copies.issued.clear()
        del copies.d2h_bytes[:], copies.h2d_bytes[:]
        _iterate(port, replica, CHUNKS, seed=iteration)
        counts = port.take_counts()
        n = len(CHUNKS)
        # Per chunk: the gather's event, the copy's event, the publish's.
        assert counts == collections.Counter(d2h=n, h2d=n, event=3 * n)
        assert counts == copies.issued  # the transfer counts honestly
        assert port.counts == collections.Counter()
        spans = [layout.span(names) for names in reversed(CHUNKS)]
        assert copies.d2h_bytes == [s.stop - s.start for s in spans]
        assert copies.h2d_bytes == copies.d2h_bytes


def test_the_timeline_says_how_many_copies_an_iteration_issued():
    port, _, replica, _ = _transfer()
    port.take_counts()
    timeline = cgdp_chainer.Timeline()
    for iteration in range(2):
        start = timeline.now()
        _iterate(port, replica, CHUNKS, seed=iteration)
        timeline.count_copies(iteration, 0, port.take_counts())
        timeline.end_iteration(iteration, start, timeline.now())
    n = len(CHUNKS)
    for summary in timeline.iteration_summaries:
        assert summary['copies'] == {'d2h': n, 'h2d': n, 'event': 3 * n}
    counters = [e for e in timeline.to_chrome_trace()['traceEvents']
                if e['ph'] == 'C']
    assert [(e['args']['iteration'], e['args']['d2h']) for e in counters] \
        == [(0, n), (1, n)]


@pytest.mark.parametrize('staged', [False, True])
def test_the_slot_buffer_receives_the_grads_and_zeros_for_none(staged):
    layout = _layout()
    # Plain host memory in the staged case, as unlocked shared memory.
    slot_buffer = buffers.host_buffer(layout.capacity)
    slot_buffer[...] = 0xAB
    port, copies, replica, _ = _transfer(staged=staged,
                                         slot_buffer=slot_buffer)
    _set_grads(replica, 7, none=('/l1/b',))
    names = CHUNKS[1]
    ready = port.send_grads(names)
    assert port.slots is not None
    port.wait_grads(ready)
    span = layout.span(names)
    slots = layout.views(slot_buffer)
    for name in names:
        expected = replica[name].grad
        if expected is None:
            expected = numpy.zeros(replica[name].shape, replica[name].dtype)
        numpy.testing.assert_array_equal(slots[name], expected)
        assert numpy.shares_memory(port.slots[name], slot_buffer)
    # Nothing outside the chunk's span was written.
    assert (slot_buffer[:span.start] == 0xAB).all()
    assert (slot_buffer[span.stop:] == 0xAB).all()


def test_the_copy_waits_for_the_gather_and_ready_for_the_copy():
    port, copies, replica, _ = _transfer()
    _set_grads(replica, 3)
    ready = port.send_grads(CHUNKS[0])
    # Nothing has run yet: the stand-in's streams hold their work.
    assert not port.slots['/l0/W'].any()
    ready.synchronize()  # runs the copy stream, which waits for the gather
    numpy.testing.assert_array_equal(port.slots['/l0/W'],
                                     replica['/l0/W'].grad)


@pytest.mark.parametrize('staged', [False, True])
def test_publish_writes_exactly_its_chunk_into_the_replica(staged):
    port, copies, replica, master = _transfer(staged=staged)
    layout = port.layout
    before = {name: param.array.copy() for name, param in replica.items()}
    device_before = port.param_buffer.copy()
    port.publish(1, CHUNKS[1])
    # Not yet waited for: the replica still computes with its old values.
    numpy.testing.assert_array_equal(port.param_buffer, device_before)
    port.wait_params(1)
    copies.synchronize(copies.compute)
    master_views = layout.views(master)
    for name, param in replica.items():
        assert numpy.shares_memory(param.array, port.param_buffer)
        expected = master_views[name] if name in CHUNKS[1] else before[name]
        numpy.testing.assert_array_equal(param.array, expected)
    span = layout.span(CHUNKS[1])
    numpy.testing.assert_array_equal(port.param_buffer[:span.start],
                                     device_before[:span.start])
    numpy.testing.assert_array_equal(port.param_buffer[span.stop:],
                                     device_before[span.stop:])


@pytest.mark.parametrize('staged', [False, True])
def test_two_replicas_on_one_device_keep_their_own_streams_and_buffers(
        staged):
    # A GPU named twice: two transfers on one device (one CuPy stand-in),
    # over the one master buffer, their copies interleaved.
    layout = _layout()
    copies = NumpyCopies()
    master = _master_buffer(layout, 1)
    replicas = [_replica(layout, seed) for seed in (0, 7)]
    ports = [cuda_transfer.ChunkedCudaTransfer(
        layout, master, None, replica, chainer.get_device('@numpy'),
        staged=staged, copies=copies) for replica in replicas]
    streams = [stream for port in ports
               for stream in (port.d2h_stream, port.h2d_stream)]
    assert len(set(map(id, streams))) == 4
    for buffer in ('slot_buffer', 'param_buffer', 'grad_buffer'):
        assert not numpy.shares_memory(getattr(ports[0], buffer),
                                       getattr(ports[1], buffer)), buffer
    for index, names in enumerate(CHUNKS):
        for port in ports:
            port.wait_params(index)
    expected_grads = []
    for seed, replica in zip((3, 4), replicas):
        _set_grads(replica, seed)
        expected_grads.append({name: param.grad.copy()
                               for name, param in replica.items()})
    for index, names in reversed(list(enumerate(CHUNKS))):
        ready = [port.send_grads(names) for port in ports]
        for port, event in zip(ports, ready):
            port.wait_grads(event)
            port.publish(index, names)
    for port in ports:
        for index in range(len(CHUNKS)):
            port.wait_params(index)
    copies.synchronize(copies.compute)
    master_views = layout.views(master)
    for port, replica, grads in zip(ports, replicas, expected_grads):
        for name, param in replica.items():
            numpy.testing.assert_array_equal(port.slots[name], grads[name],
                                             err_msg=name)
            numpy.testing.assert_array_equal(param.array,
                                             master_views[name])
            assert numpy.shares_memory(param.array, port.param_buffer)


def test_the_replica_keeps_its_values_as_views_of_the_device_buffer():
    layout = _layout()
    replica = _replica(layout, 5)
    values = {name: param.array.copy() for name, param in replica.items()}
    port, _, replica, _ = _transfer(layout=layout, replica=replica)
    views = layout.views(port.param_buffer)
    for name, param in replica.items():
        assert param.array.base is not None
        assert numpy.shares_memory(param.array, views[name])
        numpy.testing.assert_array_equal(param.array, values[name])


@pytest.mark.parametrize('staged', [False, True])
def test_adopt_layout_moves_the_values_and_later_copies_use_its_spans(
        staged):
    port, copies, replica, master = _transfer(staged=staged)
    # Every chunk published in the old layout, none waited for yet: the
    # replica's current values are the master's.
    _iterate(port, replica, CHUNKS, seed=0)
    values = {name: view.copy()
              for name, view in port.layout.views(master).items()}
    new_names = list(reversed(port.layout.names))
    new_layout = port.layout.reordered(new_names)
    new_chunks = [list(reversed(names)) for names in reversed(CHUNKS)]
    assert new_layout.span(new_chunks[0]) != port.layout.span(new_chunks[0])
    # The host lays the master out anew (FlatMaster.relayout) while the
    # last publishes may still be under way, then the replica adopts.
    for name, view in new_layout.views(master).items():
        view[...] = values[name]
    port.take_counts()
    port.adopt_layout(new_layout)
    # One copy of the whole buffer takes every parameter again.
    assert port.take_counts() == collections.Counter(h2d=1, event=1)
    copies.synchronize(copies.compute)
    old_master = values
    for name, view in new_layout.views(master).items():
        view[...] = -old_master[name]
    new_views = new_layout.views(port.param_buffer)
    for name, param in replica.items():
        assert numpy.shares_memory(param.array, new_views[name])
        numpy.testing.assert_array_equal(param.array, values[name])
    # Gradients land at the new spans of the slot buffer.
    _set_grads(replica, 11, none=('/l3/s',))
    port.wait_grads(port.send_grads(new_chunks[0]))
    slots = new_layout.views(port.slot_buffer)
    assert all(numpy.shares_memory(port.slots[name], slots[name])
               for name in new_names)
    for name in new_chunks[0]:
        expected = replica[name].grad
        if expected is None:
            expected = numpy.zeros(replica[name].shape, replica[name].dtype)
        numpy.testing.assert_array_equal(slots[name], expected)
    # Publishing reads the new spans of the master buffer.
    port.publish(0, new_chunks[0])
    port.wait_params(0)
    copies.synchronize(copies.compute)
    for name, param in replica.items():
        expected = -old_master[name] if name in new_chunks[0] \
            else values[name]
        numpy.testing.assert_array_equal(param.array, expected)
    assert copies.d2h_bytes[-1] == copies.h2d_bytes[-1] == \
        new_layout.span(new_chunks[0]).stop - \
        new_layout.span(new_chunks[0]).start


def test_a_replaced_array_is_taken_back_into_the_device_buffer():
    port, copies, replica, master = _transfer()
    replaced = numpy.full(replica['/l0/b'].shape, 9, numpy.float32)
    replica['/l0/b'].array = replaced
    _set_grads(replica, 2)
    port.wait_grads(port.send_grads(CHUNKS[0]))
    assert numpy.shares_memory(replica['/l0/b'].array, port.param_buffer)
    numpy.testing.assert_array_equal(replica['/l0/b'].array, replaced)
    port.publish(0, CHUNKS[0])
    port.wait_params(0)
    copies.synchronize(copies.compute)
    numpy.testing.assert_array_equal(replica['/l0/b'].array,
                                     port.layout.views(master)['/l0/b'])


@pytest.mark.parametrize('grads_none', [(), (0,), (2,), (0, 3, 4), (0, 1)])
def test_gather_into_writes_the_grads_in_order_and_zeros_for_none(
        grads_none):
    sizes = [3, 1, 4, 2, 5]
    rng = numpy.random.RandomState(4)
    grads = [None if i in grads_none else
             rng.uniform(-1, 1, size).astype(numpy.float32).reshape(size, 1)
             for i, size in enumerate(sizes)]
    destination = numpy.full(sum(sizes), 7, numpy.float32)
    cuda_transfer.gather_into(numpy, destination, grads, sizes)
    expected = numpy.concatenate([
        numpy.zeros(size, numpy.float32) if grad is None else grad.ravel()
        for grad, size in zip(grads, sizes)])
    numpy.testing.assert_array_equal(destination, expected)


def test_wrong_buffers_and_parameters_are_refused():
    layout = _layout()
    copies = NumpyCopies()
    device = chainer.get_device('@numpy')
    master = _master_buffer(layout, 1)
    with pytest.raises(ValueError, match='layout.capacity'):
        cuda_transfer.ChunkedCudaTransfer(
            layout, master[:layout.nbytes], None, _replica(layout, 0),
            device, copies=copies)
    with pytest.raises(ValueError, match='flat uint8'):
        cuda_transfer.ChunkedCudaTransfer(
            layout, numpy.zeros(layout.capacity, numpy.float32), None,
            _replica(layout, 0),
            device, copies=copies)
    replica = _replica(layout, 0)
    del replica['/l3/s']
    with pytest.raises(ValueError, match=r"missing \['/l3/s'\]"):
        cuda_transfer.ChunkedCudaTransfer(layout, master, None, replica,
                                          device, copies=copies)
    replica = _replica(layout, 0)
    replica['/l0/b'] = chainer.Parameter(numpy.zeros(5, numpy.float32))
    with pytest.raises(ValueError, match='/l0/b'):
        cuda_transfer.ChunkedCudaTransfer(layout, master, None, replica,
                                          device, copies=copies)


def test_chunks_and_layouts_that_do_not_fit_are_refused():
    port, _, _, _ = _transfer()
    with pytest.raises(ValueError, match='next to each other'):
        port.send_grads(['/l0/W', '/l1/b'])
    with pytest.raises(ValueError, match='not in the transfer'):
        port.publish(0, ['/l0/W', '/nope'])
    other = buffers.FlatLayout(SPECS[:-1] + [('/l3/s', (2,), numpy.float32)])
    with pytest.raises(ValueError, match='same parameters'):
        port.adopt_layout(other)


@pytest.mark.gpu
@pytest.mark.parametrize('staged', [False, True])
def test_cupy_copies_one_copy_per_chunk_and_the_bytes_on_a_gpu(staged):
    import cupy
    import cupyx
    layout = _layout()
    device = chainer.get_device('@cupy:0')
    with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True):
        replica = _replica(layout, 0)
        for param in replica.values():
            param.to_device(device)
        if staged:  # not page-locked: plain host memory
            master = _master_buffer(layout, 1)
            slot_buffer = buffers.host_buffer(layout.capacity)
        else:
            master = buffers.host_buffer(
                layout.capacity,
                lambda n: cupyx.empty_pinned(n, numpy.uint8))
            master[...] = _master_buffer(layout, 1)
            slot_buffer = None
        port = cuda_transfer.ChunkedCudaTransfer(
            layout, master, slot_buffer, replica, device, staged=staged)
        assert isinstance(port.copies, cuda_transfer.CupyCopies)
        host_params = _replica(layout, 0)
        _set_grads(host_params, 3, none=('/l1/b',))
        for name, param in replica.items():
            grad = host_params[name].grad
            param.grad = None if grad is None else cupy.asarray(grad)
        port.take_counts()
        for index, names in reversed(list(enumerate(CHUNKS))):
            port.wait_grads(port.send_grads(names))
            port.publish(index, names)
        n = len(CHUNKS)
        assert port.take_counts() == collections.Counter(
            d2h=n, h2d=n, event=3 * n)
        for name, param in replica.items():
            expected = numpy.zeros(param.shape, param.dtype) \
                if param.grad is None else cupy.asnumpy(param.grad)
            numpy.testing.assert_array_equal(port.slots[name], expected)
        for index in range(n):
            port.wait_params(index)
        cupy.cuda.get_current_stream().synchronize()
        master_views = layout.views(master)
        for name, param in replica.items():
            start = port.param_buffer.data.ptr
            assert start <= param.array.data.ptr < start + \
                port.param_buffer.nbytes
            numpy.testing.assert_array_equal(cupy.asnumpy(param.array),
                                             master_views[name])
        port.close()
