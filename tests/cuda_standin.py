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
"""
import contextlib
import threading

import numpy

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import cuda_transfer


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

    def append(self, item):
        item()
        return 0

    def run_until(self, position):
        pass


class _Event(object):
    def __init__(self, stream, position):
        self.stream = stream
        self.position = position

    def synchronize(self):
        self.stream.run_until(self.position)


class HostDeviceCopies(object):
    """CuPy's part of ``CupyCopies`` on the CPU (see the module).

    Args:
        device (chainer.backend.Device): The model's device ('@numpy').
    """

    def __init__(self, device=None):
        self.device = device
        self.compute = _ComputeStream()
        self.copy_streams = []
        self.issued = {'d2h': 0, 'h2d': 0}
        self._lock = threading.Lock()

    def device_scope(self):
        return contextlib.nullcontext()

    def new_stream(self):
        stream = _CopyStream()
        self.copy_streams.append(stream)
        return stream

    def current_stream(self):
        return self.compute

    def device_buffer(self, n_bytes):
        return numpy.zeros(n_bytes, numpy.uint8)

    def pinned_buffer(self, n_bytes):
        return buffers.host_buffer(n_bytes)

    def _issue(self, kind, stream, source, destination):
        with self._lock:
            self.issued[kind] += 1
        stream.append(lambda: numpy.copyto(destination, source))

    def d2h(self, source, destination, stream):
        self._issue('d2h', stream, source, destination)

    def h2d(self, source, destination, stream):
        self._issue('h2d', stream, source, destination)

    def record(self, stream):
        if isinstance(stream, _ComputeStream):
            return _Event(stream, 0)
        return _Event(stream, stream.end())

    def wait(self, stream, event):
        stream.append(event.synchronize)

    def gather(self, destination, grads, sizes):
        grads = list(grads)
        self.compute.append(lambda: cuda_transfer.gather_into(
            numpy, destination, grads, sizes))

    def timing_event(self, stream):
        return self.record(stream)

    def synchronize(self, stream):
        if isinstance(stream, _CopyStream):
            stream.run_until(stream.end())
