"""A GPU replica's hand-over with one copy per chunk and direction.

:class:`ChunkedCudaTransfer` offers the interface of the transfers of
:mod:`~cgdp_chainer.runtime.transport.transfer`. The replica's parameters live in one
flat device buffer laid out by a :class:`~cgdp_chainer.runtime.transport.buffers.
FlatLayout` (each ``param.array`` is a view into it), as do its gradients
(a second flat device buffer), its host gradient slots and the master's
parameters on the host. A chunk is one contiguous byte span of each, so its
gradients leave in one device-to-host copy and its new weights arrive in one
host-to-device copy, rather than one copy per parameter array (about
2 x 467 small copies per iteration for ResNet-152).

Every CUDA operation the transfer issues goes through a ``copies`` object
(:class:`CupyCopies` by default), so that the transfer's logic runs on the
CPU with a NumPy stand-in and CuPy is imported only where a GPU is used.
"""
import collections
import math
import threading

import chainer
import numpy

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import transfer as transfer_module


def gather_into(xp, destination, grads, sizes):
    """Writes gradients one after another into a flat run of a buffer.

    Consecutive gradients are written by one ``concatenate`` into the run's
    slice: for many small arrays of one dtype CuPy does that in a single
    kernel, where per-array copies would launch one kernel each (CuPy itself
    falls back to per-array copies for large arrays, where launches do not
    matter). A gradient that is None (its parameter took no part in the
    loss) becomes zeros.

    Args:
        xp (module): ``numpy`` or ``cupy``, whichever holds the arrays.
        destination: A 1-D array of the run's dtype (a view of the buffer).
        grads (list): Each parameter's gradient, or None, in buffer order.
        sizes (list of int): Each parameter's number of elements.
    """
    position = 0
    segment, segment_start = [], 0
    for grad, size in zip(grads, sizes):
        if grad is None:
            _concatenate(xp, segment, destination[segment_start:position])
            destination[position:position + size].fill(0)
            segment, segment_start = [], position + size
        else:
            segment.append(grad.ravel())
        position += size
    _concatenate(xp, segment, destination[segment_start:position])


def _concatenate(xp, arrays, destination):
    if not arrays:
        return
    if len(arrays) == 1:
        destination[...] = arrays[0]
        return
    try:
        xp.concatenate(arrays, out=destination)
    except TypeError:  # a CuPy whose concatenate takes no `out`
        position = 0
        for array in arrays:
            destination[position:position + array.size] = array
            position += array.size


class CupyCopies(object):
    """The CUDA operations of a :class:`ChunkedCudaTransfer`, with CuPy.

    Streams and events are CuPy's; the transfer only passes them back in
    and calls ``synchronize()`` on events.

    Args:
        device_id (int): The replica's GPU.
    """

    def __init__(self, device_id):
        import cupy
        self._cupy = cupy
        self.device_id = device_id

    def device_scope(self):
        """A context in which the replica's GPU is the current device."""
        return self._cupy.cuda.Device(self.device_id)

    def is_device_array(self, array):
        """Whether ``array`` is in device memory (a CuPy array)."""
        return isinstance(array, self._cupy.ndarray)

    def new_stream(self):
        """A copy stream that does not synchronize with the legacy one."""
        return self._cupy.cuda.Stream(non_blocking=True)

    def current_stream(self):
        """The calling thread's current (compute) stream."""
        return self._cupy.cuda.get_current_stream()

    def device_buffer(self, n_bytes):
        """A flat ``uint8`` device array of ``n_bytes`` (zeros)."""
        return self._cupy.zeros(n_bytes, numpy.uint8)

    def device_empty(self, n_bytes, stream):
        """A flat ``uint8`` device array of ``n_bytes``, not initialized,
        from CuPy's pool for ``stream`` (whose work may reuse it once freed,
        in that stream's order)."""
        with stream:
            return self._cupy.empty(n_bytes, numpy.uint8)

    def pinned_buffer(self, n_bytes):
        """A flat ``uint8`` pinned host array of ``n_bytes`` (zeros)."""
        import cupyx
        return buffers.host_buffer(
            n_bytes, lambda size: cupyx.empty_pinned(size, numpy.uint8))

    def d2h(self, source, destination, stream):
        """Starts copying a device span into a host span on ``stream``."""
        try:
            source.get(stream=stream, out=destination, blocking=False)
        except TypeError:  # CuPy before 13 has no `blocking`
            source.get(stream=stream, out=destination)

    def h2d(self, source, destination, stream):
        """Starts copying a host span into a device span on ``stream``."""
        destination.set(source, stream=stream)

    def record(self, stream):
        """An event recorded on ``stream`` that only orders work."""
        return stream.record(transfer_module.sync_event(self._cupy))

    def wait(self, stream, event):
        """Makes ``stream``'s later work wait for ``event`` (the host does
        not block)."""
        stream.wait_event(event)

    def gather(self, destination, grads, sizes):
        """Writes gradients into a run of the gradient buffer, on the
        current stream (see :func:`gather_into`)."""
        gather_into(self._cupy, destination, grads, sizes)

    def timing_event(self, stream):
        """An event with timing recorded on ``stream`` (the timeline's
        clock)."""
        return stream.record()

    def synchronize(self, stream):
        """Blocks until ``stream``'s work is done."""
        stream.synchronize()


class ChunkedCudaTransfer(object):
    """Moves a GPU replica's chunks to and from the host in one copy each.

    The replica's parameters become views of one flat device buffer laid
    out by ``layout``; its gradients are gathered, per chunk, into a second
    one; the host's buffers follow the same layout. A chunk is one byte span
    of each (``layout.span(names)``), copied in one piece. Must be created
    and used with the replica's GPU current and its compute stream as the
    current stream (the device worker's thread); :meth:`publish` may come
    from another thread.

    Args:
        layout (FlatLayout): Where each parameter lies in every buffer.
        master_buffer (numpy.ndarray): Flat ``uint8`` host memory of at
            least ``layout.capacity`` bytes that holds the master's
            parameters by ``layout`` (pinned, or page-locked shared memory;
            if neither, ``staged`` must be true).
        slot_buffer (numpy.ndarray or None): Flat ``uint8`` host memory of
            at least ``layout.capacity`` bytes for this replica's gradients
            (page-locked shared memory in a worker process); None: pinned
            memory of its own.
        replica_params (dict): Parameter path -> the replica's
            ``chainer.Parameter``, already on ``device``; each is moved into
            the flat device buffer and its array rebound to a view of it.
        device (chainer.backend.GpuDevice): The replica's GPU.
        staged (bool): Whether ``master_buffer`` and ``slot_buffer`` are
            not page-locked: each copy then goes through a pinned staging
            buffer of this replica's own, one per direction (one more host
            copy of the span, still one device copy per chunk).
        copies (CupyCopies or None): Issues the CUDA operations; None:
            ``CupyCopies(device.device.id)``.

    Attributes:
        counts (collections.Counter): What was issued since the last
            :meth:`take_counts`: ``'d2h'`` and ``'h2d'`` copies and
            ``'event'`` (events recorded to order copies; timing events of
            :meth:`record` are not counted).
        slots (dict): Parameter path -> its view of the slot buffer.
        slot_buffer (numpy.ndarray): The host gradient buffer.
        param_buffer: The flat device buffer of the replica's parameters.
        grad_buffer: The flat device buffer its gradients are gathered in.
    """

    is_gpu = True

    def __init__(self, layout, master_buffer, slot_buffer, replica_params,
                 device, staged=False, copies=None):
        _check_buffer('master_buffer', master_buffer, layout)
        if slot_buffer is not None:
            _check_buffer('slot_buffer', slot_buffer, layout)
        _check_params(layout, replica_params)
        if copies is None:
            copies = CupyCopies(device.device.id)
        self.copies = copies
        self.device = device
        self.layout = layout
        self.master_buffer = master_buffer
        self.replica_params = replica_params
        self.staged = bool(staged)
        self.counts = collections.Counter()
        # publish() runs in the host's (or a receiver) thread, send_grads()
        # in the replica's: both count events.
        self._count_lock = threading.Lock()
        self._params_ready = {}
        # (start, stop, event) of the latest copy out of / into each span.
        self._grads_copied = []
        self._params_copied = []
        capacity = layout.capacity
        with copies.device_scope():
            self.d2h_stream = copies.new_stream()
            self.h2d_stream = copies.new_stream()
            self.slot_buffer = copies.pinned_buffer(capacity) \
                if slot_buffer is None else slot_buffer
            self._grad_staging = copies.pinned_buffer(capacity) \
                if self.staged else None
            self._param_staging = copies.pinned_buffer(capacity) \
                if self.staged else None
            self.param_buffer = copies.device_buffer(capacity)
            self.grad_buffer = copies.device_buffer(capacity)
            self._bind(layout, {name: param.array
                                for name, param in replica_params.items()})
            # The moves ran on the current stream; a publish's copy on the
            # copy stream must not overtake them.
            copies.synchronize(copies.current_stream())

    def _bind(self, layout, values):
        """Writes ``values`` into ``layout``'s place in the device buffer
        (on the current stream) and makes the parameters views of it."""
        self.layout = layout
        self._views = layout.views(self.param_buffer)
        self._sizes = {name: math.prod(shape) for name, (_, shape, _)
                       in layout.entries.items()}
        for name, param in self.replica_params.items():
            self._views[name][...] = values[name]
            param.array = self._views[name]
        self.slots = layout.views(self.slot_buffer)

    def _count(self, kind):
        with self._count_lock:
            self.counts[kind] += 1

    def take_counts(self):
        """What was issued since the last call (see :attr:`counts`).

        Returns:
            collections.Counter: The counts; :attr:`counts` starts anew.
        """
        with self._count_lock:
            counts, self.counts = self.counts, collections.Counter()
        return counts

    def _span(self, names):
        unknown = [name for name in names if name not in self.layout.entries]
        if unknown:
            raise ValueError('parameters {} are not in the transfer\'s '
                             'layout; its parameters are {}'.format(
                                 unknown, list(self.layout.names)))
        return self.layout.span(names)

    def send_grads(self, names):
        """Starts copying the gradients of ``names`` (one chunk) to the
        host slot buffer: on the compute stream, a gather into the device
        gradient buffer (zeros for a gradient that is None); then, on the
        copy stream, one copy of the chunk's span.

        Returns:
            An event recorded on the copy stream after the copy (where
            ``staged``, a :class:`~cgdp_chainer.runtime.transport.transfer.StagedCopy`
            whose ``synchronize()`` also moves the span on into the slots).

        Raises:
            ValueError: ``names`` are not in the layout or not one span.
        """
        span = self._span(names)
        copies = self.copies
        with copies.device_scope():
            compute = copies.current_stream()
            self._rebind(span)
            # The previous copy out of this span must be done before the
            # gather overwrites it (the host's order already implies it;
            # the wait is free on the device where it does).
            for event in _overlapping(self._grads_copied, span):
                copies.wait(compute, event)
            for run in span.runs:
                copies.gather(buffers.typed(self.grad_buffer, run),
                              [self.replica_params[name].grad
                               for name in run.names],
                              [self._sizes[name] for name in run.names])
            gathered = copies.record(compute)
            self._count('event')
            copies.wait(self.d2h_stream, gathered)
            slot = self.slot_buffer[span.start:span.stop]
            target = slot if self._grad_staging is None else \
                self._grad_staging[span.start:span.stop]
            copies.d2h(self.grad_buffer[span.start:span.stop], target,
                       self.d2h_stream)
            self._count('d2h')
            copied = copies.record(self.d2h_stream)
            self._count('event')
        _replace(self._grads_copied, span, copied)
        if self._grad_staging is not None:
            return transfer_module.StagedCopy(copied, [(target, slot)])
        return copied

    def read_back(self, arrays):
        """Starts copying small device arrays (the values a replica
        reported) into page-locked host memory, on the gradients' copy
        stream, after the work issued so far on the compute stream.

        Issued before a chunk's gradients, the copies are done once the
        host has waited for that chunk's: reading them then waits for
        nothing more.

        Args:
            arrays (list): Device arrays.

        Returns:
            tuple: ``(host arrays, event)``: page-locked arrays of the same
            shapes and dtypes, which hold the values once ``event`` is
            reached (see ``event.done``).
        """
        copies = self.copies
        hosts = []
        with copies.device_scope():
            xp = chainer.backend.get_array_module(self.grad_buffer)
            sources = [xp.ascontiguousarray(array) for array in arrays]
            computed = copies.record(copies.current_stream())
            self._count('event')
            copies.wait(self.d2h_stream, computed)
            for source in sources:
                host = copies.pinned_buffer(max(source.nbytes, 1))[
                    :source.nbytes].view(source.dtype).reshape(source.shape)
                if source.nbytes:
                    copies.d2h(source, host, self.d2h_stream)
                    self._count('d2h')
                hosts.append(host)
            copied = copies.record(self.d2h_stream)
            self._count('event')
        return hosts, copied

    def _rebind(self, span):
        """Takes back into the device buffer any parameter of ``span``
        whose array was replaced (it computed with those values), so that
        later publishes reach it."""
        for run in span.runs:
            for name in run.names:
                param = self.replica_params[name]
                view = self._views[name]
                if param.array is not view:
                    view[...] = param.array
                    param.array = view

    def wait_grads(self, ready):
        """Blocks until the gradients sent with ``ready`` are in the
        slots."""
        if ready is not None:
            ready.synchronize()

    def publish(self, chunk, names):
        """Starts copying the master's values of ``names`` (one chunk) from
        the master buffer into the device buffer: one copy of the span.

        Args:
            chunk (int): The runtime's index of the chunk, for
                :meth:`wait_params`.
            names (sequence of str): Its parameters.
        """
        self._copy_in(chunk, self._span(names))

    def _copy_in(self, chunk, span):
        """One host-to-device copy of ``span`` of the master buffer, and its
        event for :meth:`wait_params` of ``chunk``."""
        copies = self.copies
        with copies.device_scope():
            source = self.master_buffer[span.start:span.stop]
            if self._param_staging is not None:
                # The last copy from this staging span is done (the
                # gradients that led to these values were computed after
                # it); waiting costs nothing then, and guards a publish of
                # a span twice in a row.
                for event in _overlapping(self._params_copied, span):
                    event.synchronize()
                staging = self._param_staging[span.start:span.stop]
                numpy.copyto(staging, source)
                source = staging
            copies.h2d(source, self.param_buffer[span.start:span.stop],
                       self.h2d_stream)
            self._count('h2d')
            event = copies.record(self.h2d_stream)
            self._count('event')
        _replace(self._params_copied, span, event)
        self._params_ready[chunk] = event

    def wait_params(self, chunk):
        """Orders the current stream after ``chunk``'s parameter copy,
        without blocking the host (nothing if it was not published since
        the last wait)."""
        event = self._params_ready.pop(chunk, None)
        if event is not None:
            self.copies.wait(self.copies.current_stream(), event)

    def adopt_layout(self, layout):
        """Views the buffers by ``layout`` and takes every parameter again
        from the master buffer, which the host has already laid out by it
        (``FlatLayout.relayout``, between iterations, when the master holds
        every chunk's last published values).

        Copies of the last iteration may still be reading the master
        buffer (in its old layout, while the host moved it): they are
        waited for first, and what they wrote is overwritten by one copy of
        the whole buffer.

        Args:
            layout (FlatLayout): The same parameters in another order.

        Raises:
            ValueError: ``layout`` holds other parameters, shapes or
                dtypes, or needs more bytes than the buffers hold.
        """
        _check_same_parameters(self.layout, layout)
        _check_buffer('master_buffer', self.master_buffer, layout)
        _check_buffer('slot_buffer', self.slot_buffer, layout)
        copies = self.copies
        with copies.device_scope():
            copies.synchronize(self.h2d_stream)
            copies.synchronize(self.d2h_stream)
            self.layout = layout
            self._views = layout.views(self.param_buffer)
            self._sizes = {name: math.prod(shape) for name, (_, shape, _)
                           in layout.entries.items()}
            for name, param in self.replica_params.items():
                param.array = self._views[name]
            self.slots = layout.views(self.slot_buffer)
            self._params_ready = {}
            self._grads_copied = []
            self._params_copied = []
            self._copy_in(None, buffers.Span(0, layout.nbytes, ()))
            # The next forward reads every parameter.
            self.wait_params(None)

    def record(self):
        """A timing event (the timeline's clock), on the compute stream."""
        return self.copies.timing_event(self.copies.current_stream())

    def close(self):
        """Waits for the copies under way."""
        with self.copies.device_scope():
            self.copies.synchronize(self.d2h_stream)
            self.copies.synchronize(self.h2d_stream)
        self._params_ready = {}
        self._grads_copied = []
        self._params_copied = []


def _overlapping(copies_by_span, span):
    return [event for start, stop, event in copies_by_span
            if start < span.stop and span.start < stop]


def _replace(copies_by_span, span, event):
    """Keeps ``event`` as the latest copy of ``span``, dropping the copies
    of spans it overlaps (waiting for it implies them: one stream)."""
    copies_by_span[:] = [
        entry for entry in copies_by_span
        if not (entry[0] < span.stop and span.start < entry[1])]
    copies_by_span.append((span.start, span.stop, event))


def _check_buffer(what, buffer, layout):
    if getattr(buffer, 'dtype', None) != numpy.uint8 or buffer.ndim != 1:
        raise ValueError('{} must be a flat uint8 array (see '
                         'buffers.host_buffer), not {} of dtype {}'.format(
                             what, type(buffer).__name__,
                             getattr(buffer, 'dtype', None)))
    if buffer.size < layout.capacity:
        raise ValueError('{} holds {} bytes; the layout needs {} '
                         '(layout.capacity)'.format(what, buffer.size,
                                                    layout.capacity))


def _check_params(layout, replica_params):
    if sorted(replica_params) != sorted(layout.names):
        missing = sorted(set(layout.names) - set(replica_params))
        extra = sorted(set(replica_params) - set(layout.names))
        raise ValueError('the replica\'s parameters must be the layout\'s: '
                         'missing {}, not in the layout {}'.format(
                             missing, extra))
    for name, param in replica_params.items():
        _, shape, dtype = layout.entries[name]
        array = param.array
        if array is None:
            raise ValueError('parameter {} is not initialized; run a '
                             'forward first'.format(name))
        if tuple(array.shape) != shape or array.dtype != dtype:
            raise ValueError(
                'parameter {} is {} {}; the layout has it as {} {}'.format(
                    name, array.dtype, tuple(array.shape), dtype, shape))


def _check_same_parameters(current, layout):
    if not isinstance(layout, buffers.FlatLayout):
        raise ValueError('adopt_layout takes a FlatLayout, not {}'.format(
            type(layout).__name__))
    ours = {name: entry[1:] for name, entry in current.entries.items()}
    theirs = {name: entry[1:] for name, entry in layout.entries.items()}
    if ours != theirs:
        raise ValueError('a new layout must hold the same parameters with '
                         'the same shapes and dtypes (see '
                         'FlatLayout.reordered)')
