"""A GPU replica's share of the batch on its way to the device.

``device.send`` of a converted share (what ``StandardUpdater`` does, and
what a replica did) copies each array from pageable host memory on the
compute stream: CUDA copies pageable memory through a bounce buffer, at a
seventh of the bandwidth of page-locked memory (7.7 against 55 GB/s on an
H200), and the thread that sends waits for each copy. :class:`InputStaging`
instead packs the share's arrays into one page-locked buffer and copies it
in one piece on a stream of the replica's own; the compute stream is
ordered after that copy, the host is not. It may stage from any thread:
the input path stages a share read ahead in its background thread, while
the last iteration computes (see
:mod:`~cgdp_chainer.runtime.input.input_path`).
"""
import threading

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import shared


class _HostBuffer(object):
    """Page-locked memory a share is packed into, and its last copy."""

    def __init__(self):
        self.array = None
        self.copied = None


class InputStaging(object):
    """Stages a replica's converted shares into page-locked memory and
    copies them to its device on a stream of its own.

    Each share gets device memory of its own (from CuPy's pool, allocated
    on the input stream), as ``device.send`` gives it, so a model may keep
    its input arrays. Memory that an earlier share's iteration read may
    come back from the pool: every copy waits, on the device, for the last
    iteration released (:meth:`StagedInputs.release`), and so, the compute
    stream being in order, for all before it.

    Args:
        copies (CupyCopies): The replica's CUDA operations (its transfer's;
            a stand-in on the CPU).
        depth (int): Page-locked buffers used in turn: a share is packed
            while the copies of the ``depth - 1`` before it may still run.

    Attributes:
        stream: The input stream.
    """

    def __init__(self, copies, depth=2):
        self.copies = copies
        with copies.device_scope():
            self.stream = copies.new_stream()
        self._host = [_HostBuffer() for _ in range(depth)]
        self._next = 0
        self._released = None
        # The input path's threads stage (a batch dropped may still be
        # staging while the next is), the replica's thread releases.
        self._lock = threading.Lock()

    def stage(self, in_arrays):
        """Starts a share's copy to the device.

        Args:
            in_arrays: The converter's output for the share, in host memory
                (any nesting; see
                :func:`~cgdp_chainer.runtime.transport.shared.flatten_inputs`).

        Returns:
            StagedInputs: The share on the device, once a stream waits for
            it.
        """
        structure, arrays = shared.flatten_inputs(in_arrays)
        if not arrays:
            return StagedInputs(self, None, in_arrays, in_arrays)
        layout = buffers.FlatLayout(
            [(str(i), array.shape, array.dtype)
             for i, array in enumerate(arrays)])
        copies = self.copies
        with self._lock, copies.device_scope():
            host = self._host[self._next]
            self._next = (self._next + 1) % len(self._host)
            self._make_room(host, layout.capacity)
            host_views = layout.views(host.array)
            for i, array in enumerate(arrays):
                host_views[str(i)][...] = array
            device = copies.device_empty(max(layout.capacity, 1),
                                         self.stream)
            # Read after the allocation (see the class).
            if self._released is not None:
                copies.wait(self.stream, self._released)
            if layout.nbytes:
                copies.h2d(host.array[:layout.nbytes],
                           device[:layout.nbytes], self.stream)
            host.copied = copies.record(self.stream)
        device_views = layout.views(device)
        return StagedInputs(self, host.copied, shared.unflatten_inputs(
            structure, [device_views[str(i)] for i in range(len(arrays))]),
            in_arrays)

    def _make_room(self, host, n_bytes):
        """Makes ``host`` free to pack ``n_bytes`` into: its last copy done
        (it is, unless shares are staged faster than copied), large
        enough."""
        if host.copied is not None and not host.copied.done:
            host.copied.synchronize()
        if host.array is None or host.array.size < n_bytes:
            host.array = self.copies.pinned_buffer(max(n_bytes, 1))

    def released(self, event):
        """Takes the event after the latest iteration released (what
        :meth:`StagedInputs.release` calls)."""
        with self._lock:
            self._released = event


class StagedInputs(object):
    """A share whose copy to the device was started by
    :meth:`InputStaging.stage`.

    Args:
        staging (InputStaging): Where it was staged.
        copied: The copy's event (None: the share holds no array).
        in_arrays: The share, its arrays on the device.
        host_inputs: The share as converted, in host memory.

    Attributes:
        host_inputs: The share as converted, in host memory: what work on
            the host reads (the comparisons that confirm a reduction found,
            see :func:`host_side`).
    """

    def __init__(self, staging, copied, in_arrays, host_inputs):
        self._staging = staging
        self._copied = copied
        self.host_inputs = host_inputs
        # Held until the iteration is released: the pool must not hand the
        # device memory to the next share while this one may be read.
        self._in_arrays = in_arrays

    def on_device(self):
        """The share, for work on the calling thread's current stream,
        which is ordered after its copy (the host does not wait).

        Returns:
            The converter's output with device arrays.
        """
        if self._copied is not None:
            copies = self._staging.copies
            copies.wait(copies.current_stream(), self._copied)
        return self._in_arrays

    def release(self):
        """Marks the end of the work that reads the share: the next copies
        wait for the work issued so far on the current stream."""
        copies = self._staging.copies
        self._staging.released(copies.record(copies.current_stream()))


def host_side(share):
    """A converted share in host memory, staged (:class:`StagedInputs`) or
    not."""
    return share.host_inputs if isinstance(share, StagedInputs) else share
