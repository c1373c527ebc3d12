"""A CPU stand-in of CuPy's copies for a model trained through the GPU path.

:class:`HostDeviceCopies` offers what
:class:`cgdp_chainer.runtime.transport.cuda_transfer.CupyCopies` offers, with NumPy:
the "device" buffers are host arrays and the compute stream is the
caller's own program order (the model computes with NumPy, at once), while
the two copy streams hold their copies back until an event recorded after
them is waited for. So a forward that reads weights whose copy it was not
ordered after, or a host update that reads gradients its ``ready`` does not
cover, sees the wrong bytes, as it would on a GPU.

Pass ``device_copies=HostDeviceCopies`` to
``cgdp_chainer.create_multi_node_optimizer`` to train a '@numpy' model
through the GPU path (host shadow, ``ChunkedCudaTransfer``, copies).

What costs a GPU replica time is counted as it is issued
(:attr:`HostDeviceCopies.log`): every host-device copy, whether its host
side is page-locked (a buffer of :meth:`HostDeviceCopies.pinned_buffer`)
or pageable (which CUDA copies synchronously, through a bounce buffer, at
a seventh of the bandwidth), on which stream and from which thread; and
every wait that blocks the host (an event's or a stream's
``synchronize()``, a pageable copy). :class:`StandinDevice` is the
replica's device: what Chainer sends to it (``device.send``) is such a
pageable copy on the caller's stream.
"""
import collections
import contextlib
import threading
import weakref

import chainer
import numpy

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import cuda_transfer


Copy = collections.namedtuple(
    'Copy', ('kind', 'pageable', 'stream', 'thread', 'nbytes'))
Copy.__doc__ = """One host-device copy as issued.

Attributes:
    kind (str): ``'h2d'`` or ``'d2h'``.
    pageable (bool): Its host side is not page-locked memory.
    stream: The stream it was issued on (the stand-in's compute stream
        for the caller's own order).
    thread (int): ``threading.get_ident()`` of the issuing thread.
    nbytes (int): Its size.
"""

Wait = collections.namedtuple('Wait', ('what', 'thread'))
Wait.__doc__ = """A wait that blocked the host: ``what`` is ``'event'``,
``'stream'`` or ``'pageable copy'``; ``thread`` the waiting thread."""

# (start, stop) addresses of the page-locked buffers alive, each listed
# until its memory is freed.
_PINNED = {}
_PINNED_LOCK = threading.Lock()
# Keys of buffers freed, not yet dropped from _PINNED.
_FORGOTTEN = collections.deque()


def _address(array):
    return array.__array_interface__['data'][0]


def _register_pinned(buffer):
    owner = buffer if buffer.base is None else buffer.base
    key = object()
    with _PINNED_LOCK:
        _drop_forgotten()
        _PINNED[key] = (_address(buffer), _address(buffer) + buffer.nbytes)
    weakref.finalize(owner, _forget_pinned, key)


def _forget_pinned(key):
    # A finalizer runs wherever the garbage collector happens to run, also
    # inside this module's own locked sections: it only notes the key (an
    # atomic append), and the next look-up drops it under the lock.
    _FORGOTTEN.append(key)


def _drop_forgotten():
    """Drops the buffers freed since the last look-up (``_PINNED_LOCK``
    held)."""
    while _FORGOTTEN:
        _PINNED.pop(_FORGOTTEN.popleft(), None)


def is_pinned(array):
    """Whether ``array`` lies in a buffer of
    :meth:`HostDeviceCopies.pinned_buffer`."""
    start = _address(array)
    stop = start + array.nbytes
    with _PINNED_LOCK:
        _drop_forgotten()
        spans = list(_PINNED.values())
    return any(low <= start and stop <= high for low, high in spans)


class _CopyStream(object):
    """A stand-in copy stream: its work runs, in order, when waited for
    (from any thread)."""

    def __init__(self):
        self.work = []
        self.done = 0
        self._lock = threading.RLock()

    def append(self, item):
        with self._lock:
            self.work.append(item)
            return len(self.work)

    def run_until(self, position):
        with self._lock:
            while self.done < position:
                item = self.work[self.done]
                self.done += 1
                item()

    def end(self):
        """The position after the work issued so far."""
        with self._lock:
            return len(self.work)


class _ComputeStream(object):
    """The caller's program order: work runs when it is issued."""

    done = 0

    def append(self, item):
        item()
        return 0

    def run_until(self, position):
        pass


class _Event(object):
    """A point in a stream's work; ``synchronize()`` is the host's wait
    (counted), :meth:`reach` a stream's (not)."""

    def __init__(self, stream, position, waited):
        self.stream = stream
        self.position = position
        self._waited = waited

    @property
    def done(self):
        """Whether the work before it ran (CUDA's event query: no wait)."""
        return self.stream.done >= self.position

    def reach(self):
        self.stream.run_until(self.position)

    def synchronize(self):
        self._waited('event')
        self.reach()


class HostDeviceCopies(object):
    """CuPy's part of ``CupyCopies`` on the CPU (see the module).

    Args:
        device (chainer.backend.Device): The model's device ('@numpy').

    Attributes:
        log (list): :class:`Copy` and :class:`Wait` records, in issue
            order (:meth:`take_log` empties it).
    """

    def __init__(self, device=None):
        self.device = device
        self.compute = _ComputeStream()
        self.copy_streams = []
        self.issued = {'d2h': 0, 'h2d': 0}
        self.log = []
        self._lock = threading.Lock()

    def take_log(self):
        """The records since the last call."""
        with self._lock:
            log, self.log = self.log, []
        return log

    def _waited(self, what):
        with self._lock:
            self.log.append(Wait(what, threading.get_ident()))

    def device_scope(self):
        return contextlib.nullcontext()

    def is_device_array(self, array):
        """The stand-in device's arrays are NumPy's."""
        return isinstance(array, numpy.ndarray)

    def new_stream(self):
        stream = _CopyStream()
        self.copy_streams.append(stream)
        return stream

    def current_stream(self):
        return self.compute

    def device_buffer(self, n_bytes):
        return numpy.zeros(n_bytes, numpy.uint8)

    def device_empty(self, n_bytes, stream):
        return numpy.empty(n_bytes, numpy.uint8)

    def pinned_buffer(self, n_bytes):
        buffer = buffers.host_buffer(n_bytes)
        _register_pinned(buffer)
        return buffer

    def _issue(self, kind, stream, host, source, destination):
        pageable = not is_pinned(host)
        with self._lock:
            self.issued[kind] += 1
            self.log.append(Copy(kind, pageable, stream,
                                 threading.get_ident(), host.nbytes))
        if pageable:  # CUDA returns once the bytes have left the host
            self._waited('pageable copy')
        stream.append(lambda: numpy.copyto(destination, source))

    def d2h(self, source, destination, stream):
        self._issue('d2h', stream, destination, source, destination)

    def h2d(self, source, destination, stream):
        self._issue('h2d', stream, source, source, destination)

    def send_pageable(self, array):
        """What ``cupy.asarray`` of a host array does on the caller's
        stream: a copy from pageable memory, the host waiting for it."""
        device_array = numpy.empty_like(array)
        self._issue('h2d', self.compute, array, array, device_array)
        return device_array

    def record(self, stream):
        if isinstance(stream, _ComputeStream):
            return _Event(stream, 0, self._waited)
        return _Event(stream, stream.end(), self._waited)

    def wait(self, stream, event):
        stream.append(event.reach)

    def gather(self, destination, grads, sizes):
        grads = list(grads)
        self.compute.append(lambda: cuda_transfer.gather_into(
            numpy, destination, grads, sizes))

    def timing_event(self, stream):
        return self.record(stream)

    def synchronize(self, stream):
        self._waited('stream')
        if isinstance(stream, _CopyStream):
            stream.run_until(stream.end())


class StandinDevice(chainer.backend.CpuDevice):
    """A replica's device in the stand-in: it computes with NumPy, and an
    array Chainer sends to it (``device.send``) is a pageable copy on the
    caller's stream, logged by ``copies`` as ``cupy.asarray`` would cost
    it.

    Args:
        copies (HostDeviceCopies): Logs the copies.
    """

    def __init__(self, copies):
        super(StandinDevice, self).__init__()
        self.copies = copies

    def send_array(self, array):
        if isinstance(array, numpy.ndarray):
            return self.copies.send_pageable(array)
        return super(StandinDevice, self).send_array(array)
