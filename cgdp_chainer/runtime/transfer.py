"""Moving gradient chunks to the host and new weights back, per device kind.

The transfer classes share one interface, so the replica workers and the
host accumulator never branch on the device kind or the worker kind:

- :class:`HostResidentTransfer` for ``'@numpy'`` replicas in threads of the
  user's process: gradients are handed over by reference and replicas read
  the master's parameter arrays directly, so no bytes are copied.
- :class:`SharedSlotTransfer` for ``'@numpy'`` replicas in worker processes:
  replicas read the master's arrays, which live in shared memory, and copy
  each chunk's gradients into their own shared slots.
- :class:`CudaTransfer` for ``'@cupy:N'`` replicas, in a thread or a worker
  process: pinned (or page-locked shared) host buffers allocated once
  (where the shared ones cannot be page-locked, copies go through pinned
  staging buffers of the replica's own), one copy stream each way, and CUDA events so that the copies overlap the next
  chunk's backward and a chunk's next forward waits for its own parameters
  only.

On the host side of a worker process, :class:`WorkerPort` offers the same
``slots`` / ``wait_grads`` / ``publish`` to the accumulator.
"""
import numpy

from cgdp_chainer.runtime import buffers


class HostResidentTransfer(object):
    """Hand-over for replicas that live in host memory, in threads of the
    user's process.

    The replica reads the master's arrays (no copy); its gradients are
    gathered into a flat slot buffer of its own, laid out as the master's,
    so that the host reduces and updates each chunk as one slice.

    Args:
        master (cgdp_chainer.runtime.buffers.FlatMaster): The master's
            parameters as views of their flat buffer.
        replica_params (dict): Parameter path -> the replica's parameter.
    """

    is_gpu = False

    def __init__(self, master, replica_params):
        self.master = master
        self.replica_params = replica_params
        self.layout = master.layout
        self.slot_buffer = buffers.host_buffer(self.layout.capacity)
        self.slots = self.layout.views(self.slot_buffer)
        self.publish(None, list(replica_params))

    def send_grads(self, names):
        """Gathers the replica's gradients of ``names`` into the slots
        (zeros for a parameter that took no part in the loss).

        Returns:
            None: the gradients are ready at once.
        """
        _gather(self.replica_params, self.slots, names)
        return None

    def wait_grads(self, ready):
        """Blocks until the gradients sent with ``ready`` are in the slots."""

    def publish(self, chunk, names):
        """Makes the replica use the master's current arrays for ``names``
        (the master's may have been replaced: :meth:`FlatMaster.sync`)."""
        arrays = self.master.arrays
        for name in names:
            master = arrays[name]
            replica = self.replica_params[name]
            if replica.array is not master:
                replica.array = master

    def adopt_layout(self, layout):
        """Follows the master into a new flat layout (between iterations)."""
        if layout == self.layout:
            return
        self.layout = layout
        self.slots = layout.views(self.slot_buffer)
        self.publish(None, list(self.replica_params))

    def wait_params(self, chunk):
        """Makes the replica's next forward of ``chunk`` see its new values."""

    def record(self):
        """A timestamp token on this device's compute order (host clock)."""
        return None

    def close(self):
        self.slots = {}


def _gather(replica_params, slots, names):
    """Copies the replica's gradients of ``names`` into their slots."""
    for name in names:
        grad = replica_params[name].grad
        if grad is None:  # the parameter took no part in this loss
            slots[name].fill(0)
        else:
            numpy.copyto(slots[name], grad)


class CudaTransfer(object):
    """Asynchronous copies between a GPU replica and pinned host buffers.

    Must be created and used with the replica's GPU as the current device
    (the device worker's thread).

    Args:
        master_params (dict): Parameter path -> master parameter, whose
            arrays :func:`pin_master` has placed in pinned memory.
        replica_params (dict): Parameter path -> the replica's parameter.
        device (chainer.backend.GpuDevice): The replica's GPU.
        slots (dict or None): Parameter path -> host gradient slot
            (page-locked shared memory in a worker process); None:
            pinned slots of its own.
        staged (bool): Whether ``slots`` and the master's arrays are not
            page-locked: copies then go through pinned staging buffers.
    """

    is_gpu = True

    def __init__(self, master_params, replica_params, device, slots=None,
                 staged=False):
        import cupy
        self._cupy = cupy
        self.device = device
        self.master_params = master_params
        self.replica_params = replica_params
        with cupy.cuda.Device(device.device.id):
            self.d2h_stream = cupy.cuda.Stream(non_blocking=True)
            self.h2d_stream = cupy.cuda.Stream(non_blocking=True)
            if slots is None:
                slots = _pinned_like(master_params)
            self.slots = slots
            # Where the given slots and master arrays are not page-locked:
            # copies go through pinned buffers of this replica's own.
            self._grad_staging = _pinned_like(master_params) if staged \
                else None
            self._param_staging = _pinned_like(master_params) if staged \
                else None
        self._params_ready = {}

    def send_grads(self, names):
        """Starts copying the gradients of ``names`` into the pinned slots.

        Returns:
            cupy.cuda.Event: Recorded on the copy stream after the copies.
        """
        cupy = self._cupy
        with cupy.cuda.Device(self.device.device.id):
            backward_done = cupy.cuda.get_current_stream().record(
                sync_event(cupy))
            self.d2h_stream.wait_event(backward_done)
            staged = []
            for name in names:
                grad = self.replica_params[name].grad
                slot = self.slots[name]
                if grad is None:
                    slot.fill(0)
                    continue
                if self._grad_staging is not None:
                    staged.append((self._grad_staging[name], slot))
                    slot = self._grad_staging[name]
                try:
                    grad.get(stream=self.d2h_stream, out=slot, blocking=False)
                except TypeError:  # CuPy before 13 has no `blocking`
                    grad.get(stream=self.d2h_stream, out=slot)
            copied = self.d2h_stream.record(sync_event(cupy))
            if self._grad_staging is not None:
                return StagedCopy(copied, staged)
            return copied

    def wait_grads(self, ready):
        if ready is not None:
            ready.synchronize()

    def publish(self, chunk, names):
        """Starts copying the master's values of ``names`` to the GPU."""
        cupy = self._cupy
        with cupy.cuda.Device(self.device.device.id):
            for name in names:
                source = self.master_params[name].array
                if self._param_staging is not None:
                    # The previous copy from this buffer is complete: the
                    # gradients that led to these values were computed
                    # after it.
                    numpy.copyto(self._param_staging[name], source)
                    source = self._param_staging[name]
                self.replica_params[name].array.set(
                    source, stream=self.h2d_stream)
            self._params_ready[chunk] = self.h2d_stream.record(
                sync_event(cupy))

    def wait_params(self, chunk):
        """Orders the current stream after ``chunk``'s parameter copy,
        without blocking the host."""
        event = self._params_ready.pop(chunk, None)
        if event is not None:
            self._cupy.cuda.get_current_stream().wait_event(event)

    def record(self):
        """A timing event (the timeline's clock), on the compute stream."""
        return self._cupy.cuda.get_current_stream().record()

    def close(self):
        self.d2h_stream.synchronize()
        self.h2d_stream.synchronize()
        self._params_ready = {}


class StagedCopy(object):
    """The ``ready`` of a gradient copy through staging buffers: waiting
    for it also moves the gradients on into the host's slots.

    Args:
        copied: What the device-to-host copies recorded (a CUDA event);
            anything with ``synchronize()``.
        pairs (list): ``(staging, slot)`` host arrays.
    """

    def __init__(self, copied, pairs):
        self.copied = copied
        self.pairs = pairs

    def synchronize(self):
        self.copied.synchronize()
        for staging, slot in self.pairs:
            numpy.copyto(slot, staging)


class PageLockError(OSError):
    """The shared memory could not be page-locked for the GPU."""


def page_lock(regions, register):
    """Page-locks host regions for asynchronous copies, or says why not.

    Args:
        regions (list of numpy.ndarray): Byte views of the regions.
        register (callable): ``register(region)``; raises
            :class:`OSError` (e.g. :class:`PageLockError`) where the region
            cannot be locked (a sandboxed kernel, a limit on locked memory).

    Returns:
        str or None: None if every region is locked, else why not (the
        first failure; the copies must then be staged).
    """
    for region in regions:
        try:
            register(region)
        except OSError as error:
            return '{}: {}'.format(type(error).__name__, error)
    return None


def _pinned_like(params):
    import cupyx
    return {name: cupyx.empty_pinned(p.array.shape, p.array.dtype)
            for name, p in params.items()}


def sync_event(cupy):
    """A CUDA event used only to order work or wait for it.

    Timing is off (cheaper to record and wait on) and a host thread that
    waits on it sleeps instead of spinning a core: a waiting receiver or
    notifier thread would otherwise compete with the host update.

    Args:
        cupy (module): CuPy.
    """
    return cupy.cuda.Event(block=True, disable_timing=True)


class SharedSlotTransfer(object):
    """A ``'@numpy'`` replica in a worker process: its parameters are views
    of the master's shared flat buffer, and each chunk's gradients are
    gathered into its shared slot buffer, laid out alike.

    Args:
        replica_params (dict): Parameter path -> the replica's parameter.
        layout (cgdp_chainer.runtime.buffers.FlatLayout): The layout of
            both buffers.
        master_buffer (numpy.ndarray): The master's flat buffer (shared).
        slot_buffer (numpy.ndarray): This replica's flat slot buffer
            (shared).
    """

    is_gpu = False

    def __init__(self, replica_params, layout, master_buffer, slot_buffer):
        self.replica_params = replica_params
        self.layout = None
        self.master_buffer = master_buffer
        self.slot_buffer = slot_buffer
        self.adopt_layout(layout)

    def send_grads(self, names):
        """Gathers the gradients of ``names`` into the slots (zeros for a
        parameter that took no part in the loss). Returns None: done."""
        _gather(self.replica_params, self.slots, names)
        return None

    def adopt_layout(self, layout):
        """Views the buffers by ``layout`` (the host moved the master's
        values there between iterations)."""
        if layout == self.layout:
            return
        self.layout = layout
        self.slots = layout.views(self.slot_buffer)
        for name, array in layout.views(self.master_buffer).items():
            self.replica_params[name].array = array

    def publish(self, chunk, names):
        """Nothing to copy: the replica reads the master's shared arrays."""

    def wait_params(self, chunk):
        """The host publishes a chunk before the next iteration starts."""

    def record(self):
        return None

    def close(self):
        self.slots = {}


class WorkerPort(object):
    """The host's side of one worker process, for the host accumulator.

    Args:
        slot_buffer (numpy.ndarray): The worker's flat shared slot buffer,
            as mapped in the user's process.
        send (callable or None): Sends a message to the worker; given for
            GPU workers, which copy a chunk in as soon as it is published.
    """

    def __init__(self, slot_buffer, send=None):
        self.slot_buffer = slot_buffer
        self._send = send
        # A GPU worker holds device copies of the master's values.
        self.is_gpu = send is not None

    def wait_grads(self, ready):
        """The worker announced the chunk after its copy was complete."""

    def publish(self, chunk, names):
        """Tells a GPU worker that the new values of ``chunk`` are in the
        master's buffer (a CPU worker reads them there)."""
        if self._send is not None:
            self._send(('published', chunk, list(names)))

    def close(self):
        self.slot_buffer = None


def pinned_bytes(n_bytes):
    """A flat ``uint8`` array of pinned host memory (for a master buffer
    that GPU replicas copy from at full bandwidth)."""
    import cupyx
    return cupyx.empty_pinned((n_bytes,), numpy.uint8)


def make_transfer(device, master, replica_params):
    """The transfer class for ``device``'s kind, in a thread of the user's
    process.

    Args:
        device (chainer.backend.Device): The replica's device.
        master (cgdp_chainer.runtime.buffers.FlatMaster): The master.
        replica_params (dict): Parameter path -> the replica's parameter.
    """
    if device.xp is numpy:
        return HostResidentTransfer(master, replica_params)
    return CudaTransfer(master.master_params, replica_params, device)
