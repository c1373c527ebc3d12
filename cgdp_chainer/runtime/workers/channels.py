"""Where replicas run and how they talk to the host: two strategies.

Both build the replicas from the master model, give the host accumulator
one port per replica (``slots``, ``wait_grads``, ``publish``), run an
iteration's jobs and hand back each replica's
:class:`~cgdp_chainer.runtime.workers.worker.IterationResult`:

- :class:`ProcessReplicas` (``workers='process'``, the default): one worker
  process per replica, so that Chainer's Python work runs in parallel, as
  in PyTorch DDP, Horovod and ChainerMN. The master's parameters and every
  replica's gradient slots live in shared memory, allocated once; sub-batches
  travel through shared memory too; pipes carry only small messages (a job,
  "chunk delivered", "chunk published", the result).
- :class:`ThreadReplicas` (``workers='thread'``): one thread per replica in
  the user's process; replicas then share the interpreter lock. Kept for
  debugging.

Both make each replica the same way, the master pickled by value with
cloudpickle (:mod:`~cgdp_chainer.runtime.workers.replica_copy`), so that a function
that captures the model captures its replica. Either way the code that runs
a replica is :class:`~cgdp_chainer.runtime.workers.worker.ReplicaWorker`.
"""
import atexit
import collections
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
import traceback
import warnings

import numpy

from cgdp_chainer import allocator
from cgdp_chainer import blas
from cgdp_chainer import devices as devices_module
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.workers import replica_copy
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.replica import static_graph_models
from cgdp_chainer.runtime.transport import transfer as transfer_module
from cgdp_chainer.runtime.workers import worker as worker_module
from cgdp_chainer.runtime.workers import worker_launch

WORKER_KINDS = ('process', 'thread')

# The updater's check at construction (the copy, and what it refers to).
check_replicable = replica_copy.check_replicable
START_METHODS = ('spawn', 'forkserver')

# How often waits wake up to look for failures, dead workers and a dead
# parent: short enough that a failure surfaces within a fraction of a second.
POLL_SECONDS = 0.05

# A worker process must import Chainer and unpickle its replica before its
# first iteration; a minute covers a loaded 2-core machine.
STARTUP_TIMEOUT_SECONDS = 120.0

# After stop, how long a worker may take to leave before it is killed.
STOP_TIMEOUT_SECONDS = 10.0


# What a worker that fails while it starts needs, for its error message.
_STARTUP_FAILURE_FIX = (
    "A worker does not run the script: the model's classes and functions "
    'defined in the script travel by value, those of other modules are '
    "imported by name with the script's sys.path, so such a module must "
    "import without error in a fresh process; or pass workers='thread'.")


class ReplicaError(RuntimeError):
    """An exception raised inside a worker process, with its traceback."""


class ThreadReplicas(object):
    """Replicas as threads of the user's process.

    Args:
        master (chainer.Link): The master model, on the host.
        devices (list of chainer.backend.Device): One per replica.
        loss_func (callable or None): As for ``CGDPUpdater``. Each replica
            gets its own copy, made together with the replica, so that a
            loss function that refers to the model (a bound method, a
            callable object holding it) refers to that replica.
        failures (FailureBox): Shared with the host accumulator.
        blas_threads (int or None): BLAS threads while CPU replicas compute.
        device_copies (callable or None): Tests: ``device_copies(device)``
            stands in for CuPy's copies, and every replica takes the GPU
            path on its '@numpy' device.
    """

    kind = 'thread'

    def __init__(self, master, devices, loss_func, failures,
                 blas_threads=None, device_copies=None):
        self.devices = devices
        self.loss_func = loss_func
        self.failures = failures
        self._model = master
        self._device_copies = device_copies
        self.blas_limit = blas.threads_per_replica(
            devices_module.cpu_replica_count(devices), blas_threads)
        master_params = collections.OrderedDict(master.namedparams())
        layout = buffers.FlatLayout.of_arrays(
            {name: p.array for name, p in master_params.items()})
        # GPU replicas copy from pinned memory at full bandwidth.
        allocate = None
        if device_copies is not None:
            allocate = device_copies(None).pinned_buffer
        elif any(devices_module.is_gpu(d) for d in devices):
            allocate = transfer_module.pinned_bytes
        self.master = buffers.FlatMaster(
            master_params, layout,
            buffers.host_buffer(layout.capacity, allocate))
        self.replicas = []
        self.loss_funcs = []
        self.ports = []
        # Each moves to its device in its own thread (see _serve).
        for device, (replica, replica_loss) in zip(
                devices, replica_copy.thread_replicas(
                    master, loss_func, len(devices))):
            self.replicas.append(replica)
            self.loss_funcs.append(replica_loss)
            if devices_module.is_gpu(device) or device_copies is not None:
                self.ports.append(_GpuThreadPort(self.master, device_copies))
            else:
                self.ports.append(transfer_module.HostResidentTransfer(
                    self.master, dict(replica.namedparams())))
        self.notes = []  # nothing to say: see ProcessReplicas.notes
        self._threads = []
        self._jobs = [queue.Queue() for _ in devices]
        self._results = None
        self._pending = 0
        self._cond = threading.Condition()

    def start(self, deliver):
        """Starts one thread per replica.

        Args:
            deliver (callable): ``deliver(index, chunk, ready)``, the host
                accumulator's, called when a chunk's gradients are sent.
        """
        for index, (device, replica, loss_func, port) in enumerate(zip(
                self.devices, self.replicas, self.loss_funcs, self.ports)):
            link = _ThreadLink(index, deliver, self.failures)
            thread = threading.Thread(
                target=self._serve,
                name=worker_launch.WORKER_NAME.format(index),
                args=(index, device, replica, loss_func, port, link),
                daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, index, device, replica, loss_func, port, link):
        where = 'replica {} ({}) thread'.format(index, device)
        with worker_module.device_scope(device):
            try:
                # On the replica's own stream, which its forwards use: a
                # copy on the legacy default stream would not be ordered
                # before them (the replica's stream is non-blocking).
                replica.to_device(device)
                transfer = port
                if isinstance(port, _GpuThreadPort):
                    transfer = port.build(dict(replica.namedparams()),
                                          device)
                replica_worker = worker_module.ReplicaWorker(
                    index, device, replica, transfer, link, loss_func)
                if isinstance(port, _GpuThreadPort):
                    port.inputs = replica_worker.inputs
            except BaseException as error:
                self.failures.fail(error, where)
                return
            while True:
                job = self._jobs[index].get()
                if job is None:
                    return
                if job is _FETCH_PERSISTENTS:
                    self._fetch(replica, where)
                    continue
                job, in_arrays = job
                try:
                    if not self.failures.failed:
                        result = replica_worker.run(job, in_arrays)
                        with self._cond:
                            self._results[index] = result
                except worker_module.Aborted:
                    pass
                except BaseException as error:
                    self.failures.fail(error, where)
                finally:
                    with self._cond:
                        self._pending -= 1
                        self._cond.notify_all()

    def _fetch(self, replica, where):
        """Reads the replica's persistent values in its own thread (on a
        GPU, after its queued work, on its stream)."""
        try:
            values = worker_module.save_persistents(replica)
            with self._cond:
                self._results = values
        except BaseException as error:
            self.failures.fail(error, where)
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def fetch_persistents(self, index):
        """Replica ``index``'s persistent values, on the host (None if
        something failed)."""
        with self._cond:
            self._results = None
            self._pending = 1
        self._jobs[index].put(_FETCH_PERSISTENTS)
        with self._cond:
            while self._pending > 0 and not self.failures.failed:
                self._cond.wait(POLL_SECONDS)
        return None if self.failures.failed else self._results

    @property
    def stagers(self):
        """Per replica, what stages a share for its device ahead of its
        iteration (a GPU replica's ``stage(in_arrays)``), or None."""
        return [port.stage if isinstance(port, _GpuThreadPort) else None
                for port in self.ports]

    def run(self, jobs, inputs):
        """Runs one iteration on every replica and waits for them.

        Args:
            jobs (list of Job): One per replica.
            inputs (list): Each replica's converted share (a GPU replica's
                possibly staged already).

        Returns:
            list of IterationResult, or None if something failed.
        """
        with self._cond:
            self._results = [None] * len(jobs)
            self._pending = len(jobs)
        with blas.BlasLimit(self.blas_limit):
            for queue_, job, in_arrays in zip(self._jobs, jobs, inputs):
                queue_.put((job, in_arrays))
            with self._cond:
                while self._pending > 0 and not self.failures.failed:
                    self._cond.wait(POLL_SECONDS)
        return None if self.failures.failed else list(self._results)

    def close(self):
        for queue_ in self._jobs:
            queue_.put(None)
        for thread in self._threads:
            thread.join(timeout=60)
        for port in self.ports:
            port.close()
        release_master(self.master, self._model)

    def relayout(self, layout):
        """Moves the master's parameters to ``layout`` in their buffer
        (between iterations); each replica follows with its next job."""
        self.master.relayout(layout)


class _GpuThreadPort(object):
    """The host's side of a GPU replica thread. Its transfer is built in
    that thread, once the replica is on its device (on the replica's own
    stream); the pinned slot buffer exists before, for the accumulator.

    Args:
        master (cgdp_chainer.runtime.transport.buffers.FlatMaster): The master, in
            pinned memory.
        device_copies (callable or None): ``device_copies(device)``, the
            stand-in of CuPy's copies (tests); None: CuPy's.
    """

    is_gpu = True

    def __init__(self, master, device_copies=None):
        self.master = master
        self._device_copies = device_copies
        self.slot_buffer = buffers.host_buffer(
            master.layout.capacity, transfer_module.pinned_bytes
            if device_copies is None else device_copies(None).pinned_buffer)
        self.transfer = None
        # The replica's InputStaging, once its thread has built it.
        self.inputs = None

    def stage(self, in_arrays):
        """Starts a share's copy to the replica's device (from any thread);
        before the replica is built, the share as it is (its thread
        stages it)."""
        inputs = self.inputs
        return in_arrays if inputs is None else inputs.stage(in_arrays)

    def build(self, replica_params, device):
        """Makes the replica's transfer (in its thread, its GPU current)."""
        from cgdp_chainer.runtime.transport import cuda_transfer
        copies = None if self._device_copies is None else \
            self._device_copies(device)
        self.transfer = cuda_transfer.ChunkedCudaTransfer(
            self.master.layout, self.master.buffer, self.slot_buffer,
            replica_params, device, copies=copies)
        return self.transfer

    def wait_grads(self, ready):
        self.transfer.wait_grads(ready)

    def publish(self, chunk, names):
        self.transfer.publish(chunk, names)

    def close(self):
        if self.transfer is not None:
            self.transfer.close()


# Asks a replica's thread or worker process for its persistent values.
_FETCH_PERSISTENTS = 'persistents'


class _ThreadLink(object):
    """A replica thread's link to the host accumulator."""

    def __init__(self, index, deliver, failures):
        self._index = index
        self._deliver = deliver
        self._failures = failures

    def deliver(self, iteration, chunk, ready):
        self._deliver(self._index, chunk, ready)

    def check(self):
        if self._failures.failed:
            raise worker_module.Aborted()


class ProcessReplicas(object):
    """Replicas in worker processes, one each, with shared-memory buffers.

    The master's parameter arrays are moved into a shared arena here (the
    master keeps using them; :meth:`close` gives it private copies back).
    Processes start in :meth:`start` and stay alive across iterations.

    Args:
        master (chainer.Link): The master model, on the host.
        devices (list of chainer.backend.Device): One per replica.
        loss_func (callable or None): As for ``CGDPUpdater``; must be
            picklable by cloudpickle. It travels in one pickle with the
            replica, so that one that refers to the model refers to the
            worker's replica.
        failures (FailureBox): Shared with the host accumulator.
        blas_threads (int or None): BLAS threads of each CPU worker.
        start_method (str): ``'spawn'`` or ``'forkserver'`` (CUDA forbids
            ``fork`` once it is initialized).
        launched (LaunchedWorkers or None): Worker processes started
            ahead by :func:`launch_workers`, one per device; None: they
            start in :meth:`start`.

    Raises:
        ValueError: The model or ``loss_func`` cannot be pickled, or its
            copy would still refer to the master.
    """

    kind = 'process'

    def __init__(self, master, devices, loss_func, failures,
                 blas_threads=None, start_method='spawn', launched=None):
        if start_method not in START_METHODS:
            raise ValueError('start_method must be one of {}; got {!r}'.format(
                ', '.join(START_METHODS), start_method))
        self.devices = devices
        self.failures = failures
        self._model = master
        self.start_method = start_method
        self._launched = launched
        self.blas_limit = blas.threads_per_replica(
            devices_module.cpu_replica_count(devices), blas_threads)
        master_params = dict(master.namedparams())
        replica_bytes = replica_copy.pickle_replica(
            master, loss_func, master_params)
        # The copy in the parent shares the master's arrays: cheap, and
        # functions copied by reference resolve their globals as here.
        replica_copy.check_no_master_references(
            master, *replica_copy.load_replica(
                replica_bytes,
                {name: p.array for name, p in master_params.items()}))
        # The workers read the replica from shared memory once they are up:
        # a pipe would block the writer until a worker reads, and forever
        # if the worker died first.
        self._replica_arena = shared.SharedArena.create(
            [('pickle', (len(replica_bytes),), numpy.uint8)])
        self._replica_arena.arrays['pickle'][:] = numpy.frombuffer(
            replica_bytes, dtype=numpy.uint8)
        layout = buffers.FlatLayout.of_arrays(
            {name: p.array for name, p in master_params.items()})
        flat = [('flat', (layout.capacity,), numpy.uint8)]
        self._master_arena = shared.SharedArena.create(flat)
        self.master = buffers.FlatMaster(
            master_params, layout, self._master_arena.arrays['flat'])
        self._slot_arenas = [shared.SharedArena.create(flat)
                             for _ in devices]
        self._batches = [shared.BatchBuffer() for _ in devices]
        self._conns = [None] * len(devices)
        self._send_locks = [threading.Lock() for _ in devices]
        self.ports = []
        for index, (device, arena) in enumerate(zip(devices,
                                                    self._slot_arenas)):
            send = None
            if devices_module.is_gpu(device):
                send = self._sender(index)
            self.ports.append(transfer_module.WorkerPort(
                arena.arrays['flat'], send))
        self._processes = []
        self._monitor = None
        self._stopping = threading.Event()
        self._cond = threading.Condition()
        self._results = None
        self._pending = 0
        self._iteration = None
        self._deliver = None
        self._pongs = {}
        self._closed = False
        self._all_ready = False
        self.startup_seconds = None
        # What the workers said when they started, for the timeline.
        self.notes = []

    # -- start-up ---------------------------------------------------------

    def start(self, deliver):
        """Starts the worker processes and waits until each is ready.

        Args:
            deliver (callable): ``deliver(index, chunk, ready)``, the host
                accumulator's, called when a worker announces a chunk.

        Raises:
            RuntimeError: A worker died or failed while starting; the
                message says why and how to fix it.
        """
        started = time.perf_counter()
        self._deliver = deliver
        launched, self._launched = self._launched, None
        if launched is None:
            launched = launch_workers(self.start_method, len(self.devices))
        self._processes, self._conns = launched.hand_over()
        # A script that ends without finalize() (after catching an error,
        # say) must not hang in multiprocessing's exit handler, which joins
        # the workers, and must not leave its segments behind: this runs
        # before that handler (exit handlers run last registered first).
        atexit.register(self.close)
        for index, device in enumerate(self.devices):
            # Small (layouts), so the send does not wait for the worker.
            self._send(index, _WorkerInit(
                index=index, device_spec=devices_module.spec_of(device),
                replica_layout=self._replica_arena.layout,
                master_layout=self._master_arena.layout,
                slot_layout=self._slot_arenas[index].layout,
                flat_layout=self.master.layout,
                blas_threads=self.blas_limit, parent_pid=os.getpid()))
        self.notes = [note for note in self._await_ready(started) if note]
        # Every worker has its replica: the pickle's memory can go.
        self._replica_arena.close()
        self._all_ready = True
        if self.notes:
            warnings.warn('\n'.join(self.notes), RuntimeWarning)
        self.startup_seconds = time.perf_counter() - started
        self._monitor = threading.Thread(
            target=self._watch, name='cgdp-worker-monitor', daemon=True)
        self._monitor.start()

    def _await_ready(self, started):
        """Waits for every worker's 'ready', watching all of them at once:
        the first that fails or dies raises at once, whichever it is.

        Returns:
            list: Each worker's warning (a sentence), or None.
        """
        notes = {}
        waiting = {conn: index for index, conn in enumerate(self._conns)}
        waiting.update((process.sentinel, index)
                       for index, process in enumerate(self._processes))
        deadline = started + STARTUP_TIMEOUT_SECONDS
        while len(notes) < len(self._conns):
            left = deadline - time.perf_counter()
            if left <= 0:
                late = [index for index in range(len(self._conns))
                        if index not in notes]
                raise RuntimeError(
                    'CGDP worker process for replica {} ({}) did not start '
                    'within {:.0f} s'.format(late[0], self.devices[late[0]],
                                             STARTUP_TIMEOUT_SECONDS))
            ready = multiprocessing.connection.wait(
                list(waiting), timeout=min(left, 1.0))
            # A worker's error message before its exit, which says less.
            ready.sort(key=lambda handle: handle not in self._conns)
            for handle in ready:
                index = waiting.pop(handle)
                if handle is self._conns[index]:
                    notes[index] = self._take_ready(index)
                elif index not in notes:
                    self._raise_died_while_starting(index)
        return [notes[index] for index in range(len(self._conns))]

    def _take_ready(self, index):
        """Worker ``index``'s first message: its warning or None if it is
        'ready'; raises if it is an error or the pipe closed."""
        try:
            message = self._conns[index].recv()
        except EOFError:
            self._raise_died_while_starting(index)
        if message[0] == 'error':
            raise ReplicaError(
                'CGDP worker process for replica {} ({}) failed while '
                'starting:\n{}\n{}'.format(
                    index, self.devices[index], message[2].rstrip(),
                    _STARTUP_FAILURE_FIX))
        return message[2]

    def _raise_died_while_starting(self, index):
        process = self._processes[index]
        process.join(timeout=1.0)
        raise RuntimeError(
            'CGDP worker process for replica {} ({}, pid {}) {} while '
            'starting (its error, if any, is above): it was importing '
            'Chainer or loading its replica. If the system killed it for '
            "memory, train with fewer replicas or with workers='thread'; "
            'otherwise {}'.format(
                index, self.devices[index], process.pid,
                describe_exit(process.exitcode),
                _STARTUP_FAILURE_FIX[0].lower() + _STARTUP_FAILURE_FIX[1:]))

    # -- the iteration ----------------------------------------------------

    def relayout(self, layout):
        """Moves the master's parameters to ``layout`` in their shared
        buffer (between iterations: no CPU worker reads it then, and a GPU
        worker takes the whole buffer again when it adopts the layout with
        its next job)."""
        self.master.relayout(layout)

    @property
    def stagers(self):
        """None per replica: shares reach the workers through shared
        memory (a GPU worker stages its own from there)."""
        return [None] * len(self.devices)

    def run(self, jobs, inputs):
        """Runs one iteration in every worker and waits for the results.

        Returns:
            list of IterationResult, or None if something failed.
        """
        # Every sub-batch is handed over before any job is sent: one that
        # cannot be raises here, with no worker started on the iteration.
        descriptions = [batch.write(in_arrays)
                        for batch, in_arrays in zip(self._batches, inputs)]
        with self._cond:
            self._results = [None] * len(jobs)
            self._pending = len(jobs)
            self._iteration = jobs[0].iteration
        for index, (job, description) in enumerate(zip(jobs, descriptions)):
            self._send(index, ('run', job, description))
        with self._cond:
            while self._pending > 0 and not self.failures.failed:
                self._cond.wait(POLL_SECONDS)
        return None if self.failures.failed else list(self._results)

    def fetch_persistents(self, index):
        """Worker ``index``'s persistent values, through its pipe (None if
        something failed)."""
        with self._cond:
            self._results = None
            self._pending = 1
        self._send(index, (_FETCH_PERSISTENTS,))
        with self._cond:
            while self._pending > 0 and not self.failures.failed:
                self._cond.wait(POLL_SECONDS)
        return None if self.failures.failed else self._results

    def round_trip_seconds(self, repeats=100):
        """Median time of a message to every worker and its answer back
        (the cost of one chunk signal each way)."""
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            with self._cond:
                self._pongs = {}
            for index in range(len(self._conns)):
                self._send(index, ('ping', start))
            with self._cond:
                while len(self._pongs) < len(self._conns) and \
                        not self.failures.failed:
                    self._cond.wait(POLL_SECONDS)
            times.append((time.perf_counter() - start))
        return float(numpy.median(times))

    def _sender(self, index):
        def send(message):
            self._send(index, message)
        return send

    def _send(self, index, message):
        conn = self._conns[index]
        if conn is None:
            return
        with self._send_locks[index]:
            try:
                conn.send(message)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                pass  # the monitor reports the dead worker

    def _watch(self):
        """Reads every worker's messages and notices dead workers."""
        conns = {conn: index for index, conn in enumerate(self._conns)}
        sentinels = {p.sentinel: index
                     for index, p in enumerate(self._processes)}
        while not self._stopping.is_set():
            try:
                ready = multiprocessing.connection.wait(
                    list(conns) + list(sentinels), timeout=POLL_SECONDS * 4)
            except OSError:
                return
            for handle in ready:
                if handle in conns:
                    index = conns[handle]
                    try:
                        while handle.poll():
                            self._handle(index, handle.recv())
                    except (EOFError, OSError):
                        del conns[handle]
                        self._worker_died(index)
                    except Exception as error:
                        # A message that does not unpickle here, or a
                        # hand-over that fails: the caller must hear of
                        # it rather than wait for messages never read.
                        self.failures.fail(error, 'worker monitor')
                        self._broadcast(('abort',))
                        with self._cond:
                            self._cond.notify_all()
                        return
                elif handle in sentinels:
                    index = sentinels.pop(handle)
                    self._worker_died(index)

    def _handle(self, index, message):
        kind = message[0]
        if kind == 'delivered':
            _, iteration, chunk = message
            if iteration == self._iteration and not self.failures.failed:
                self._deliver(index, chunk, None)
        elif kind == 'done':
            _, iteration, result = message
            with self._cond:
                self._results[index] = result
                self._pending -= 1
                self._cond.notify_all()
        elif kind == 'error':
            _, iteration, text = message
            error = ReplicaError(
                'replica {} ({}) raised in its worker process:\n{}'.format(
                    index, self.devices[index], text.rstrip()))
            self.failures.fail(error, 'replica {} ({}) worker process'.format(
                index, self.devices[index]))
            self._broadcast(('abort',))
            with self._cond:
                self._cond.notify_all()
        elif kind == _FETCH_PERSISTENTS:
            with self._cond:
                self._results = message[1]
                self._pending -= 1
                self._cond.notify_all()
        elif kind == 'pong':
            with self._cond:
                self._pongs[index] = message[1]
                self._cond.notify_all()

    def _worker_died(self, index):
        if self._stopping.is_set():
            return
        process = self._processes[index]
        process.join(timeout=1.0)
        error = RuntimeError(
            'CGDP worker process of replica {} ({}, pid {}) {}'.format(
                index, self.devices[index], process.pid,
                describe_exit(process.exitcode)))
        self.failures.fail(error, 'worker monitor')
        self._broadcast(('abort',))
        with self._cond:
            self._cond.notify_all()

    def _broadcast(self, message):
        for index in range(len(self._conns)):
            self._send(index, message)

    # -- the end ----------------------------------------------------------

    def close(self):
        """Stops every worker process (killing any that does not leave),
        frees the shared memory and gives the master its arrays back.
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._launched is not None:  # never started
            self._launched.close()
        atexit.unregister(self.close)
        self._stopping.set()
        self._broadcast(('stop',))
        # After a failure or Ctrl-C, workers hold nothing worth waiting for;
        # one still starting does not read 'stop' until it is up.
        deadline = time.monotonic() + (
            STOP_TIMEOUT_SECONDS if self._all_ready and
            not self.failures.failed else 1.0)
        for process in self._processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        if self._monitor is not None:
            self._monitor.join(timeout=5.0)
        for conn in self._conns:
            if conn is not None:
                conn.close()
        self._conns = [None] * len(self._conns)
        release_master(self.master, self._model)
        for port in self.ports:
            port.close()
        for arena in [self._master_arena, self._replica_arena] + \
                self._slot_arenas:
            arena.close()
        for batch in self._batches:
            batch.close()


def launch_workers(start_method, count):
    """Starts ``count`` worker processes ahead of their replicas: each
    boots while the caller goes on, and serves the replica that
    :class:`ProcessReplicas` later hands it.

    Args:
        start_method (str): ``'spawn'`` or ``'forkserver'``.
        count (int): How many.

    Returns:
        LaunchedWorkers: For :class:`ProcessReplicas` (``launched=``).
    """
    return worker_launch.LaunchedWorkers(start_method, count, process_main)


def release_master(flat_master, model):
    """Gives the master private copies of its arrays again, before their
    flat buffer is freed, and points the static schedules that its own
    calls built (an Evaluator's) at them.

    Args:
        flat_master (FlatMaster): The master's arrays in the flat buffer.
        model (chainer.Link): The master model.
    """
    flat_master.release()
    static_graph_models.follow_parameters(model)


def describe_exit(exitcode):
    """Words for a process's exit code (negative: the killing signal)."""
    if exitcode is None:
        return 'is still running'
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = 'signal {}'.format(-exitcode)
        return 'was killed by {}'.format(name)
    return 'exited with status {}'.format(exitcode)


class _WorkerInit(object):
    """What a worker process gets when it starts (picklable)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


# ---------------------------------------------------------------- the worker

def process_main(conn):
    """Entry point of a worker process: waits for what it serves (a
    :class:`_WorkerInit`: where its replica, its device and the shared
    layouts are), then serves iterations until stopped.

    Args:
        conn (multiprocessing.connection.Connection): Its pipe to the host.
    """
    # Ctrl-C in a terminal (or a SIGTERM to the job's process group)
    # reaches every process: the user's process decides, and stops its
    # workers; they must not die under it mid-iteration.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    try:
        init = conn.recv()
    except (EOFError, OSError):
        return  # the first iteration failed before it had a replica
    sender = _LockedSender(conn)
    try:
        server = _WorkerServer(init, sender)
    except BaseException:
        sender.send(('error', None, traceback.format_exc()))
        return
    sender.send(('ready', os.getpid(), server.warning))
    server.serve(conn)


def _exit_with_parent():
    """Asks Linux to kill this process when its parent dies."""
    if not sys.platform.startswith('linux'):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class _LockedSender(object):
    """Sends from the worker's threads without interleaving messages."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message):
        with self._lock:
            try:
                self._conn.send(message)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass


class _WorkerServer(object):
    """The worker process: its replica, transfer and link, and its loop."""

    def __init__(self, init, sender):
        from cgdp_chainer import devices as devices_
        self.index = init.index
        self.parent_pid = init.parent_pid
        self.sender = sender
        self.device = devices_.parse_device(init.device_spec)
        self._blas = blas.BlasLimit(
            None if devices_module.is_gpu(self.device) else
            init.blas_threads)
        self._blas.__enter__()  # for the life of the process
        # The step's temporaries reuse the pages the last step freed.
        allocator.keep_freed_memory()
        self.master_arena = shared.SharedArena.attach(init.master_layout)
        self.slot_arena = shared.SharedArena.attach(init.slot_layout)
        master_buffer = self.master_arena.arrays['flat']
        slot_buffer = self.slot_arena.arrays['flat']
        replica_arena = shared.SharedArena.attach(init.replica_layout)
        replica_bytes = replica_arena.arrays['pickle'].tobytes()
        replica_arena.close()
        replica, loss_func = replica_copy.load_replica(
            replica_bytes, init.flat_layout.views(master_buffer))
        self.scope = worker_module.device_scope(self.device)
        self.scope.__enter__()
        replica_params = dict(replica.namedparams())
        # Why the shared memory is not page-locked, for the parent's
        # warning (None: it is, or no GPU).
        self.warning = None
        if devices_module.is_gpu(self.device):
            replica.to_device(self.device)
            replica_params = dict(replica.namedparams())
            why = transfer_module.page_lock(
                [self.master_arena.as_bytes(), self.slot_arena.as_bytes()],
                transfer_module.host_register)
            if why is not None:
                self.warning = (
                    'CGDP replica {} ({}): the shared memory could not be '
                    'page-locked ({}); its copies go through pinned '
                    'buffers of its own, one more host copy per chunk each '
                    'way'.format(init.index, self.device, why))
            from cgdp_chainer.runtime.transport import cuda_transfer
            self.transfer = cuda_transfer.ChunkedCudaTransfer(
                init.flat_layout, master_buffer, slot_buffer,
                replica_params, self.device, staged=why is not None)
        else:
            self.transfer = transfer_module.SharedSlotTransfer(
                replica_params, init.flat_layout, master_buffer, slot_buffer)
        self.abort = threading.Event()
        self.link = _PipeLink(
            sender, self.abort,
            self.device if self.transfer.is_gpu else None)
        self.worker = worker_module.ReplicaWorker(
            init.index, self.device, replica, self.transfer, self.link,
            loss_func)
        self.batches = shared.BatchReader()
        self.jobs = queue.Queue()

    def serve(self, conn):
        receiver = threading.Thread(target=self._receive, args=(conn,),
                                    name='cgdp-worker-receiver', daemon=True)
        receiver.start()
        while True:
            item = self.jobs.get()
            if item is None:
                break
            if item == _FETCH_PERSISTENTS:
                self._send_persistents()
                continue
            job, description = item
            self.abort.clear()
            try:
                # A GPU replica stages its share into page-locked memory
                # at once: views of the segment save a pass over it.
                in_arrays = self.batches.read(
                    description, copy=not self.transfer.is_gpu)
                result = self.worker.run(job, in_arrays)
                in_arrays = None  # no view outlives the iteration
                self.link.flush()
                self.sender.send(('done', job.iteration, result))
            except worker_module.Aborted:
                self.sender.send(('done', job.iteration, None))
            except BaseException:
                self.sender.send(('error', job.iteration,
                                  traceback.format_exc()))
        self.link.close()
        self.batches.close()

    def _send_persistents(self):
        try:
            values = worker_module.save_persistents(self.worker.replica)
        except BaseException:
            self.sender.send(('error', None, traceback.format_exc()))
            return
        self.sender.send((_FETCH_PERSISTENTS, values))

    def _receive(self, conn):
        try:
            worker_module.use_device(self.device)  # for publish's copies
        except BaseException:
            self.sender.send(('error', None, traceback.format_exc()))
            conn = None
        while conn is not None:
            try:
                if not conn.poll(0.5):
                    if os.getppid() != self.parent_pid:
                        break  # the user's process is gone
                    continue
                message = conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == 'run':
                self.jobs.put((message[1], message[2]))
            elif kind == 'published':
                self.transfer.publish(message[1], message[2])
            elif kind == _FETCH_PERSISTENTS:
                # In the serving thread, after the iteration's work.
                self.jobs.put(_FETCH_PERSISTENTS)
            elif kind == 'abort':
                self.abort.set()
            elif kind == 'ping':
                self.sender.send(('pong', message[1]))
            elif kind == 'stop':
                break
        self.abort.set()
        self.jobs.put(None)


class _PipeLink(object):
    """A worker process's link to the host: chunk announcements over the
    pipe; for GPUs from a thread that first waits for the chunk's copy.

    Args:
        sender (_LockedSender): The pipe to the host.
        abort (threading.Event): Set when the iteration must stop.
        device (chainer.backend.Device or None): The device whose copies
            the notifier thread waits for; None: no thread, a chunk is
            announced when it is delivered.
    """

    def __init__(self, sender, abort, device=None):
        self._sender = sender
        self._abort = abort
        self._pending = None
        self._notifier = None
        self._error = None  # the notifier's traceback, once it failed
        if device is not None:
            self._pending = queue.Queue()
            self._notifier = threading.Thread(
                target=self._notify, args=(device,),
                name='cgdp-d2h-notifier', daemon=True)
            self._notifier.start()

    def deliver(self, iteration, chunk, ready):
        if self._pending is None or ready is None:
            self._sender.send(('delivered', iteration, chunk))
        else:
            self._pending.put((iteration, chunk, ready))

    def _notify(self, device):
        try:
            worker_module.use_device(device)
        except BaseException:
            self._error = 'the notifier thread could not use {}:\n{}'.format(
                device, traceback.format_exc())
        while True:
            item = self._pending.get()
            if item is None:
                return
            if item[0] == 'flush':
                item[1].set()
                continue
            iteration, chunk, ready = item
            if self._error is not None:
                continue  # the iteration failed; flush() says so
            try:
                ready.synchronize()
            except BaseException:
                # Kept for flush(), which raises it in the worker's main
                # thread: reported to the host as any failure of the
                # iteration, and the queue is still served.
                self._error = (
                    'waiting for the device-to-host copy of chunk {} of '
                    'iteration {} failed:\n{}'.format(
                        chunk, iteration, traceback.format_exc()))
                continue
            self._sender.send(('delivered', iteration, chunk))

    def flush(self):
        """Waits until every announcement of the iteration is sent.

        Raises:
            RuntimeError: Waiting for a copy failed (its traceback in the
                message); the chunk was not announced.
        """
        if self._pending is not None:
            done = threading.Event()
            self._pending.put(('flush', done))
            done.wait()
            if self._error is not None:
                raise RuntimeError(self._error)

    def check(self):
        if self._abort.is_set():
            raise worker_module.Aborted()

    def close(self):
        if self._pending is not None:
            self._pending.put(None)
