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


class HostResidentTransfer(object):
    """Zero-copy hand-over for replicas that live in host memory.

    Args:
        master_params (dict): Parameter path -> master ``chainer.Parameter``.
        replica_params (dict): Parameter path -> the replica's parameter.
    """

    is_gpu = False

    def __init__(self, master_params, replica_params):
        self.master_params = master_params
        self.replica_params = replica_params
        self.slots = {}
        self.publish(None, list(master_params))

    def send_grads(self, names):
        """Exposes the replica's gradients of ``names`` to the host.

        Returns:
            None: the gradients are ready at once.
        """
        for name in names:
            grad = self.replica_params[name].grad
            if grad is None:  # the parameter took no part in this loss
                grad = numpy.zeros_like(self.master_params[name].array)
            self.slots[name] = grad
        return None

    def wait_grads(self, ready):
        """Blocks until the gradients sent with ``ready`` are in the slots."""

    def publish(self, chunk, names):
        """Makes the replica use the master's current values for ``names``."""
        for name in names:
            master = self.master_params[name].array
            replica = self.replica_params[name]
            if replica.array is not master:
                # Update rules that rebind instead of updating in place.
                replica.array = master

    def wait_params(self, chunk):
        """Makes the replica's next forward of ``chunk`` see its new values."""

    def record(self):
        """A timestamp token on this device's compute order (host clock)."""
        return None

    def close(self):
        self.slots = {}


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
    """A ``'@numpy'`` replica in a worker process: it reads the master's
    shared arrays (its parameters are views of them) and copies each chunk's
    gradients into its shared slots.

    Args:
        replica_params (dict): Parameter path -> the replica's parameter.
        slots (dict): Parameter path -> this replica's shared gradient slot.
    """

    is_gpu = False

    def __init__(self, replica_params, slots):
        self.replica_params = replica_params
        self.slots = slots

    def send_grads(self, names):
        """Copies the gradients of ``names`` into the slots (zeros for a
        parameter that took no part in the loss). Returns None: done."""
        for name in names:
            grad = self.replica_params[name].grad
            if grad is None:
                self.slots[name].fill(0)
            else:
                numpy.copyto(self.slots[name], grad)
        return None

    def publish(self, chunk, names):
        """Nothing to copy: the replica reads the master's shared arrays."""

    def wait_params(self, chunk):
        """The host publishes a chunk before the next iteration starts."""

    def record(self):
        return None

    def close(self):
        self.slots = {}


class SharedMaster(object):
    """The master's parameter arrays as views of one shared arena.

    Update rules that rebind a parameter's array instead of writing in place
    are followed by :meth:`sync`, which copies the new values back into the
    arena, so workers always read the current weights; so is user code that
    replaced an array between iterations (the updater syncs every parameter
    at the start of each ``update()``).

    Args:
        master_params (dict): Parameter path -> master parameter.
        arrays (dict): Parameter path -> its shared array.
    """

    def __init__(self, master_params, arrays):
        self.master_params = master_params
        self.arrays = arrays
        for name, param in master_params.items():
            shared = arrays[name]
            shared[...] = param.array
            param.array = shared

    def sync(self, names):
        for name in names:
            param = self.master_params[name]
            shared = self.arrays[name]
            if param.array is not shared:
                shared[...] = param.array
                param.array = shared

    def release(self):
        """Gives the master private copies of its arrays again (before the
        arena is closed: the user keeps the trained model)."""
        for name, param in self.master_params.items():
            if param.array is self.arrays[name]:
                param.array = param.array.copy()
            if param.grad is not None and param.grad.base is not None:
                # A replica's shared slot lent as the gradient (one device).
                param.grad = param.grad.copy()
        self.arrays = {}


class WorkerPort(object):
    """The host's side of one worker process, for the host accumulator.

    Args:
        slots (dict): Parameter path -> the worker's shared gradient slot,
            as mapped in the user's process.
        master (SharedMaster): The master's shared arrays.
        send (callable or None): Sends a message to the worker; given for
            GPU workers, which copy a chunk in as soon as it is published.
    """

    def __init__(self, slots, master, send=None):
        self.slots = slots
        self._master = master
        self._send = send
        # A GPU worker holds device copies of the master's values.
        self.is_gpu = send is not None

    def wait_grads(self, ready):
        """The worker announced the chunk after its copy was complete."""

    def publish(self, chunk, names):
        """Makes the new values of ``names`` visible to the worker."""
        self._master.sync(names)
        if self._send is not None:
            self._send(('published', chunk, list(names)))

    def close(self):
        self.slots = {}


def pin_master(master_params):
    """Moves the master's parameter arrays into pinned host memory, so that
    host-to-device copies run asynchronously at full bandwidth."""
    import cupyx
    for param in master_params.values():
        pinned = cupyx.empty_pinned(param.array.shape, param.array.dtype)
        pinned[...] = param.array
        param.array = pinned


def make_transfer(device, master_params, replica_params):
    """The transfer class for ``device``'s kind."""
    if device.xp is numpy:
        return HostResidentTransfer(master_params, replica_params)
    return CudaTransfer(master_params, replica_params, device)
