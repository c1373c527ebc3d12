"""ChunkAllreducer: sums host arrays across ranks on one communication
thread that owns every MPI call it makes, so accumulator threads can start
chunk reductions while earlier chunks' backward still runs.

Thread support. :class:`ChunkAllreducer` calls MPI from its own thread,
which is not the thread that initialized MPI. ``MPI_THREAD_FUNNELED`` is
therefore NOT enough (it allows MPI calls from the main thread only);
``MPI_THREAD_SERIALIZED`` is the minimum, and is enough while the other
threads make no MPI call during the allreducer's lifetime.
``MPI_THREAD_MULTIPLE`` (mpi4py's default request, and what MPICH gives) is
needed when the main thread also communicates while the allreducer runs,
for example :func:`~cgdp_chainer.mpi.check_consistency` or a ChainerMN
evaluator. The allreducer works on its own duplicate of the communicator,
so its collectives never match anybody else's.
"""
import atexit
import collections
import queue
import threading
import time

import numpy

from cgdp_chainer.mpi.launch import as_mpi_comm
from cgdp_chainer.mpi.launch import check_thread_support

# dtypes the project reduces: gradients (float16, float32, float64) and
# the integer/float scalars of allreduce_int/allreduce_scalar.
SUPPORTED_DTYPES = (numpy.dtype(numpy.float16), numpy.dtype(numpy.float32),
                    numpy.dtype(numpy.float64), numpy.dtype(numpy.int32),
                    numpy.dtype(numpy.int64))

# MPI has no half-precision sum: float16 arrays travel and are summed as
# float32, and the sum is rounded back once, as ChainerMN's communicators
# do (``_multi_node_mean``), so a float16 model's mean gradient is theirs.
WIRE_DTYPES = {numpy.dtype(numpy.float16): numpy.dtype(numpy.float32)}

_OP_NAMES = ('sum', 'max', 'min')

# Returned by the queue to wake the communication thread for closing.
_STOP = object()


class AllreduceHandle(object):
    """A started all-reduce: wait on it for the summed arrays.

    Made by :meth:`ChunkAllreducer.start`; not created directly.

    Attributes:
        arrays (list of numpy.ndarray): The arrays being reduced in place.
        request_id (int): Position of the request in the start order
            (0, 1, 2, ... per allreducer, the same on every rank).
    """

    def __init__(self, arrays, request_id):
        self.arrays = arrays
        self.request_id = request_id
        self._finished = threading.Event()
        self._error = None

    def done(self):
        """True once the reduction finished (or failed)."""
        return self._finished.is_set()

    def wait(self, timeout=None):
        """Blocks until the arrays hold the sums over all ranks.

        Args:
            timeout (float): Seconds to wait at most; ``None`` waits until
                the reduction finishes, fails, or the allreducer closes.

        Returns:
            list of numpy.ndarray: :attr:`arrays`, now reduced.

        Raises:
            TimeoutError: Not finished within ``timeout``.
            Exception: The error that the communication thread met for
                this request (an MPI error, a stall, or the allreducer
                closing first).
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(
                'all-reduce request #{} did not finish within {} s'.format(
                    self.request_id, timeout))
        if self._error is not None:
            raise self._error
        return self.arrays

    def _finish(self, error=None):
        self._error = error
        self._finished.set()


class _PackedRequest(object):
    """The arrays of one start() call, laid out for MPI.

    Arrays of one dtype travel in one contiguous buffer: one collective per
    dtype instead of one per array. A lone contiguous array is reduced in
    place with no copy. float16 arrays travel as float32 (see
    :data:`WIRE_DTYPES`).

    Args:
        arrays (list of numpy.ndarray): Arrays to reduce in place.
        op_name (str): ``'sum'``, ``'max'`` or ``'min'``.
        nonblocking (bool): ``MPI_Iallreduce`` (polled) or, if ``False``,
            ``MPI_Allreduce`` (finished when :meth:`start` returns).
    """

    def __init__(self, arrays, op_name, nonblocking=True):
        self.handle = None      # set by ChunkAllreducer.start
        self.nonblocking = nonblocking
        self.op_name = op_name
        self.mpi_requests = []
        self.started_at = None
        by_dtype = collections.OrderedDict()
        for array in arrays:
            if array.size:
                by_dtype.setdefault(array.dtype, []).append(array)
        # (buffer, arrays to copy the result back into; [] when the buffer
        # is the array itself)
        self.buffers = []
        for dtype, group in by_dtype.items():
            wire = WIRE_DTYPES.get(dtype, dtype)
            if len(group) == 1 and group[0].flags.c_contiguous and \
                    wire == dtype:
                self.buffers.append((group[0].reshape(-1), []))
                continue
            # Packing here, on the caller's thread, keeps the copies off the
            # communication thread, which only drives MPI.
            buffer = numpy.concatenate(
                [array.reshape(-1) for array in group]).astype(wire,
                                                              copy=False)
            self.buffers.append((buffer, group))

    def start(self, comm):
        """Starts one collective per buffer (comm thread)."""
        from mpi4py import MPI
        op = {'sum': MPI.SUM, 'max': MPI.MAX, 'min': MPI.MIN}[self.op_name]
        self.started_at = time.monotonic()
        for buffer, _ in self.buffers:
            if self.nonblocking:
                self.mpi_requests.append(
                    comm.Iallreduce(MPI.IN_PLACE, buffer, op=op))
            else:
                comm.Allreduce(MPI.IN_PLACE, buffer, op=op)

    def test(self):
        """True once every collective finished (comm thread)."""
        from mpi4py import MPI
        return MPI.Request.Testall(self.mpi_requests)

    def unpack(self):
        """Copies the reduced buffers back into the caller's arrays."""
        for buffer, group in self.buffers:
            offset = 0
            for array in group:
                array[...] = buffer[offset:offset + array.size].reshape(
                    array.shape)
                offset += array.size


class ChunkAllreducer(object):
    """Sums host arrays across MPI ranks on one communication thread.

    Any thread may call :meth:`start`; only the allreducer's own thread
    calls MPI. Requests go to MPI in the order they were started, and that
    order must be the same on every rank (MPI matches collectives by
    order): the caller guarantees it, by starting chunks in chunk order,
    or by numbering them (``start(arrays, sequence=k)``), which makes the
    allreducer send them in number order whatever the order of the calls.
    Several reductions may be in flight at once
    (``MPI_Iallreduce``), and the thread polls them with a short back-off,
    so it neither blocks new requests nor holds a core when idle.

    Constructing one is collective (it duplicates ``comm``): every rank
    must construct its allreducer at the same point of the program.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        stall_timeout (float): A request still unfinished this many seconds
            after it went to MPI fails (with ``TimeoutError``), and so does
            the allreducer: a peer has died or started requests in another
            order. ``None``: no limit.
        max_poll_interval (float): Longest sleep, in seconds, between two
            polls of in-flight requests. MPI progresses only inside MPI
            calls, so this bounds the added latency.
        nonblocking (bool): ``True`` (default): ``MPI_Iallreduce``, several
            requests in flight, stalls detected. ``False``: one blocking
            ``MPI_Allreduce`` at a time on the thread; MPICH's blocking
            algorithm was about twice as fast for MB-sized buffers on one
            node, but a stall then blocks the thread until the job ends
            (callers' waits and :meth:`close` stay bounded by their
            timeouts).
        name (str): Name of the communication thread.

    Attributes:
        rank (int): This process's rank.
        size (int): Number of ranks.
        thread_name (str): Name of the communication thread.
    """

    def __init__(self, comm, stall_timeout=None, max_poll_interval=2e-4,
                 nonblocking=True, name='cgdp-allreduce'):
        check_thread_support()
        comm = as_mpi_comm(comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.thread_name = name
        self.stall_timeout = stall_timeout
        self.max_poll_interval = max_poll_interval
        self.nonblocking = nonblocking
        # Our own communicator: these collectives can never be matched
        # with collectives that other code runs on ``comm``.
        self._comm = comm.Dup()
        self._queue = queue.Queue()
        self._lock = threading.Lock()   # orders request ids with the queue
        self._next_request_id = 0
        self._next_sequence = 0     # see start(sequence=)
        self._held = {}             # sequence -> request waiting its turn
        self._closing = False       # no new requests
        self._close_called = False
        self._failure = None
        self._thread = threading.Thread(target=self._run, name=name,
                                        daemon=True)
        self._thread.start()
        # mpi4py finalizes MPI at exit; the thread must be gone by then.
        # atexit runs handlers last-in first-out, and mpi4py registered its
        # own when it was imported, before this one.
        atexit.register(self.close)

    # -- the callers' side ------------------------------------------------

    def start(self, arrays, op='sum', sequence=None):
        """Starts summing ``arrays`` in place across all ranks.

        Args:
            arrays (list of numpy.ndarray): Writable host arrays, float32,
                float64, int32 or int64 (they may mix). Do not touch them
                until the handle is done.
            op (str): ``'sum'`` (default), ``'max'`` or ``'min'``.
            sequence (int or None): This request's place in an order that
                is the same on every rank. Requests with sequence numbers go
                to MPI as 0, 1, 2, ... (numbered over the allreducer's
                lifetime), whichever thread calls :meth:`start` first; a
                request waits until all lower numbers were started. Use it
                when several threads start requests in an order that may
                differ between ranks. Every number must be started, even
                with an empty ``arrays`` (a chunk without parameters),
                or the later ones wait forever. ``None``: the request goes
                to MPI in call order (then the callers must order their
                calls).

        Returns:
            AllreduceHandle: Wait on it for the result.

        Raises:
            TypeError: An array is not a numpy array of a supported dtype.
            ValueError: An array is read-only, ``op`` is unknown, or
                ``sequence`` was used before.
            RuntimeError: The allreducer is closed or failed before.
        """
        arrays = list(arrays)
        _check_arrays(arrays)
        if op not in _OP_NAMES:
            raise ValueError('unknown op {!r}; use one of {}'.format(
                op, ', '.join(_OP_NAMES)))
        # Packing copies: outside the lock, so callers pack in parallel.
        request = None
        if self.size > 1:
            request = _PackedRequest(arrays, op, self.nonblocking)
        with self._lock:
            if self._failure is not None:
                raise RuntimeError(
                    'the allreducer failed earlier: {!r}'.format(
                        self._failure)) from self._failure
            if self._closing:
                raise RuntimeError('the allreducer is closed')
            if sequence is not None and (
                    sequence < self._next_sequence or
                    sequence in self._held):
                raise ValueError(
                    'sequence number {} was used before (the next expected '
                    'is {})'.format(sequence, self._next_sequence))
            handle = AllreduceHandle(arrays, self._next_request_id)
            self._next_request_id += 1
            if request is None or not request.buffers:
                # Nothing to sum with, or nothing to sum (every rank has the
                # same shapes, so every rank skips it): done at once. Its
                # sequence number is used up all the same.
                handle._finish()
                if sequence is not None:
                    self._held[sequence] = None
                    self._release_held_in_order()
                return handle
            request.handle = handle
            if sequence is None:
                self._queue.put(request)
            else:
                self._held[sequence] = request
                self._release_held_in_order()
        return handle

    def _release_held_in_order(self):
        # Called with self._lock held.
        while self._next_sequence in self._held:
            request = self._held.pop(self._next_sequence)
            if request is not None:
                self._queue.put(request)
            self._next_sequence += 1

    def allreduce(self, arrays, op='sum', timeout=None):
        """:meth:`start` and wait.

        Args:
            arrays (list of numpy.ndarray): As for :meth:`start`.
            op (str): ``'sum'``, ``'max'`` or ``'min'``.
            timeout (float): As for :meth:`AllreduceHandle.wait`.

        Returns:
            list of numpy.ndarray: ``arrays``, reduced.
        """
        return self.start(arrays, op).wait(timeout)

    def allreduce_scalar(self, value, op='sum', timeout=None):
        """Reduces one float across ranks (through the same thread).

        Args:
            value (float): This rank's value.
            op (str): ``'sum'``, ``'max'`` or ``'min'``.
            timeout (float): As for :meth:`AllreduceHandle.wait`.

        Returns:
            float: The reduced value, the same on every rank.
        """
        return float(self._allreduce_one(value, numpy.float64, op, timeout))

    def allreduce_int(self, value, op='sum', timeout=None):
        """Reduces one integer across ranks (through the same thread).

        Args:
            value (int): This rank's value.
            op (str): ``'sum'``, ``'max'`` or ``'min'``.
            timeout (float): As for :meth:`AllreduceHandle.wait`.

        Returns:
            int: The reduced value, the same on every rank.
        """
        return int(self._allreduce_one(value, numpy.int64, op, timeout))

    def _allreduce_one(self, value, dtype, op, timeout):
        buffer = numpy.array([value], dtype=dtype)
        self.allreduce([buffer], op, timeout)
        return buffer[0]

    def close(self, timeout=10.0, abandon=False):
        """Finishes started requests, then stops the thread.

        Requests already started keep going until ``timeout``; the ones
        still unfinished then fail with ``RuntimeError``, so nobody waits
        on them forever. Safe to call more than once.

        Args:
            timeout (float): Seconds to let started requests finish.
            abandon (bool): Fail started requests at once instead (after a
                failure: a peer, stopped or gone, may never join them).
        """
        if abandon:
            timeout = 0.0
        with self._lock:
            if self._close_called:
                return
            self._close_called = True
            never_started = self._take_held()
            if not self._closing:
                self._closing = True
                self._close_deadline = time.monotonic() + timeout
                self._queue.put(_STOP)
        for request in never_started:
            request.handle._finish(RuntimeError(
                'the allreducer was closed while request #{} waited for '
                'lower sequence numbers'.format(request.handle.request_id)))
        atexit.unregister(self.close)
        self._thread.join(timeout + 1.0)
        if not self._thread.is_alive() and self._failure is None:
            # Only a communicator without unfinished requests may be freed;
            # the thread ended cleanly, so there are none.
            self._comm.Free()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    # -- the communication thread -----------------------------------------

    def _run(self):
        in_flight = collections.deque()
        stopping = False
        poll_interval = 0.0
        while True:
            try:
                progressed = False
                if not stopping:
                    stopping, progressed = self._take_new_requests(in_flight)
                progressed = self._complete_finished(in_flight) or progressed
                self._check_stall(in_flight)
            except Exception as error:  # an MPI error or a stall
                self._fail_everything(in_flight, error)
                return
            if stopping:
                if not in_flight:
                    return
                if time.monotonic() > self._close_deadline:
                    self._fail_everything(in_flight, RuntimeError(
                        'the allreducer was closed before request #{} '
                        'finished'.format(in_flight[0].handle.request_id)))
                    return
            if progressed:
                poll_interval = 0.0
            elif in_flight:
                # MPI progresses only inside MPI calls: poll again soon, but
                # back off so a long wait does not hold a core.
                time.sleep(poll_interval)
                poll_interval = min(max(poll_interval * 2, 1e-5),
                                    self.max_poll_interval)

    def _take_new_requests(self, in_flight):
        """Starts queued requests. Returns (stop seen, took any)."""
        took = False
        while True:
            try:
                if in_flight or took:
                    item = self._queue.get_nowait()
                else:
                    # Nothing to poll: sleep on the queue itself.
                    item = self._queue.get(timeout=0.5)
            except queue.Empty:
                return False, took
            if item is _STOP:
                return True, took
            try:
                item.start(self._comm)
            except Exception as error:
                item.handle._finish(error)
                raise
            in_flight.append(item)
            took = True

    def _complete_finished(self, in_flight):
        progressed = False
        for request in list(in_flight):
            if request.test():
                request.unpack()
                in_flight.remove(request)
                request.handle._finish()
                progressed = True
        return progressed

    def _check_stall(self, in_flight):
        if self.stall_timeout is None or not in_flight:
            return
        oldest = in_flight[0]
        waited = time.monotonic() - oldest.started_at
        if waited > self.stall_timeout:
            raise TimeoutError(
                'all-reduce request #{} on rank {} has not finished after '
                '{:.1f} s: another rank may have died, or started its '
                'requests in a different order'.format(
                    oldest.handle.request_id, self.rank, waited))

    def _take_held(self):
        # Called with self._lock held: requests whose turn never came.
        held = [request for request in self._held.values()
                if request is not None]
        self._held.clear()
        return held

    def _fail_everything(self, in_flight, error):
        # The communicator's state is unknown after a failed or abandoned
        # collective: fail what is pending and refuse new requests.
        with self._lock:
            self._failure = error
            self._closing = True
            pending = list(in_flight) + self._take_held()
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    pending.append(item)
        for request in pending:
            request.handle._finish(error)


def _check_arrays(arrays):
    for index, array in enumerate(arrays):
        if not isinstance(array, numpy.ndarray):
            raise TypeError(
                'array {} is a {}, not a host numpy array; copy device '
                'arrays to the host first'.format(index, type(array).__name__))
        if array.dtype not in SUPPORTED_DTYPES:
            raise TypeError('array {} has dtype {}; supported: {}'.format(
                index, array.dtype,
                ', '.join(str(dtype) for dtype in SUPPORTED_DTYPES)))
        if not array.flags.writeable:
            raise ValueError('array {} is read-only; the all-reduce writes '
                             'its result in place'.format(index))
