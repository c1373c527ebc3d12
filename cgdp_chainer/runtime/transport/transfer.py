"""Moving gradient chunks to the host and new weights back, per device kind.

The transfer classes share one interface, so the replica workers and the
host accumulator never branch on the device kind or the worker kind:

Every replica's gradient slots are one flat buffer laid out as the
master's parameters (:mod:`~cgdp_chainer.runtime.transport.buffers`), so a chunk is
one slice of each:

- :class:`HostResidentTransfer` for ``'@numpy'`` replicas in threads of the
  user's process: replicas read the master's arrays directly and gather
  each chunk's gradients into their slot buffer.
- :class:`SharedSlotTransfer` for ``'@numpy'`` replicas in worker processes:
  replicas' parameters are views of the master's shared buffer; each chunk's
  gradients are gathered into their shared slot buffer.
- :class:`~cgdp_chainer.runtime.transport.cuda_transfer.ChunkedCudaTransfer` for
  ``'@cupy:N'`` replicas, in a thread or a worker process: one device
  buffer of parameters, one copy per chunk each way, and CUDA events so
  that the copies overlap the next chunk's backward and a chunk's next
  forward waits for its own parameters only.

On the host side of a worker process, :class:`WorkerPort` offers the same
``slot_buffer`` / ``wait_grads`` / ``publish`` to the accumulator.
"""
import numpy

from cgdp_chainer.runtime.transport import buffers


class HostResidentTransfer(object):
    """Hand-over for replicas that live in host memory, in threads of the
    user's process.

    The replica reads the master's arrays (no copy); its gradients are
    gathered into a flat slot buffer of its own, laid out as the master's,
    so that the host reduces and updates each chunk as one slice.

    Args:
        master (cgdp_chainer.runtime.transport.buffers.FlatMaster): The master's
            parameters as views of their flat buffer.
        replica_params (dict): Parameter path -> the replica's parameter.
        slot_buffer (numpy.ndarray or None): The flat slot buffer, where
            it is shared (a rank's slot in its node's host); default: a
            private one.
    """

    is_gpu = False

    def __init__(self, master, replica_params, slot_buffer=None):
        self.master = master
        self.replica_params = replica_params
        self.layout = master.layout
        self.slot_buffer = slot_buffer if slot_buffer is not None else \
            buffers.host_buffer(self.layout.capacity)
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
        layout (cgdp_chainer.runtime.transport.buffers.FlatLayout): The layout of
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


def host_register(region):
    """Page-locks a shared region in place for CUDA's asynchronous copies.

    Raises:
        PageLockError: CUDA refused (the caller falls back to staging).
    """
    import cupy
    try:
        cupy.cuda.runtime.hostRegister(region.ctypes.data, region.nbytes, 0)
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise PageLockError(str(error)) from error
