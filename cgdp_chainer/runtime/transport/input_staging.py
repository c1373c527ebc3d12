"""A GPU replica's share of the batch on its way to the device.

``device.send`` of a converted share (what ``StandardUpdater`` does, and
what a replica did) copies each array from pageable host memory on the
compute stream: CUDA copies pageable memory through a bounce buffer, at a
seventh of the bandwidth of page-locked memory (7.7 against 55 GB/s on an
H200), and the replica's thread waits for each copy. :class:`InputStaging`
instead packs the share's arrays into one page-locked buffer and copies it
in one piece on a stream of the replica's own; the compute stream is
ordered after that copy, the host is not. Two buffers alternate on each
side, so that a share may be staged while the last one is computed on.
"""
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import shared


class _Slot(object):
    """One pair of buffers: page-locked host memory and device memory, with
    the events of their last use."""

    def __init__(self):
        self.host = None
        self.device = None
        self.copied = None    # the copy into ``device`` (input stream)
        self.consumed = None  # the iteration that read ``device`` (compute)


class InputStaging(object):
    """Stages a replica's converted shares into page-locked memory and
    copies them to its device on a stream of its own.

    Args:
        copies (CupyCopies): The replica's CUDA operations (its transfer's;
            a stand-in on the CPU).
        depth (int): Buffers on each side, used in turn: a share may be
            staged while ``depth - 1`` earlier ones are still in use.

    Attributes:
        stream: The input stream.
    """

    def __init__(self, copies, depth=2):
        self.copies = copies
        with copies.device_scope():
            self.stream = copies.new_stream()
        self._slots = [_Slot() for _ in range(depth)]
        self._next = 0

    def stage(self, in_arrays):
        """Starts a share's copy to the device (from any thread).

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
            return StagedInputs(self, None, in_arrays)
        layout = buffers.FlatLayout(
            [(str(i), array.shape, array.dtype)
             for i, array in enumerate(arrays)])
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        copies = self.copies
        with copies.device_scope():
            self._make_room(slot, layout.capacity)
            if slot.copied is not None and not slot.copied.done:
                # Its last copy is still reading the host buffer (a share
                # staged ``depth`` iterations ahead).
                slot.copied.synchronize()
            host_views = layout.views(slot.host)
            for i, array in enumerate(arrays):
                host_views[str(i)][...] = array
            if slot.consumed is not None:
                # The device buffer is free once the iteration that read
                # it is done (the device waits, the host does not).
                copies.wait(self.stream, slot.consumed)
                slot.consumed = None
            if layout.nbytes:
                copies.h2d(slot.host[:layout.nbytes],
                           slot.device[:layout.nbytes], self.stream)
            slot.copied = copies.record(self.stream)
        device_views = layout.views(slot.device)
        return StagedInputs(self, slot, shared.unflatten_inputs(
            structure, [device_views[str(i)] for i in range(len(arrays))]))

    def _make_room(self, slot, n_bytes):
        n_bytes = max(n_bytes, 1)
        if slot.host is not None and slot.host.size >= n_bytes:
            return
        copies = self.copies
        if slot.copied is not None:
            slot.copied.synchronize()  # the old host buffer is in use
        slot.host = copies.pinned_buffer(n_bytes)
        slot.device = copies.device_buffer(n_bytes)
        # Allocated (and zeroed) on this thread's current stream: the
        # input stream's copy must not overtake that (once per size).
        copies.synchronize(copies.current_stream())
        slot.copied = slot.consumed = None


class StagedInputs(object):
    """A share whose copy to the device was started by
    :meth:`InputStaging.stage`.

    Args:
        staging (InputStaging): Where it was staged.
        slot (_Slot or None): Its buffers (None: it holds no array).
        in_arrays: The share, its arrays views of the device buffer.
    """

    def __init__(self, staging, slot, in_arrays):
        self._staging = staging
        self._slot = slot
        self._in_arrays = in_arrays

    def on_device(self):
        """The share, for work on the calling thread's current stream,
        which is ordered after its copy (the host does not wait).

        Returns:
            The converter's output with device arrays.
        """
        if self._slot is not None:
            copies = self._staging.copies
            copies.wait(copies.current_stream(), self._slot.copied)
        return self._in_arrays

    def release(self):
        """Marks the share's device buffer free once the work issued so far
        on the current stream (the iteration that read it) is done."""
        if self._slot is not None:
            copies = self._staging.copies
            self._slot.consumed = copies.record(copies.current_stream())
            self._slot = None
