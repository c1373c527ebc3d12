"""Multi-node CGDP: the pieces that talk to MPI.

In multi-node CGDP every rank (process) keeps master weights and the
optimizer on its host. A rank's accumulator first sums a chunk's gradients
over its local devices, then sums that chunk across the ranks with
:class:`ChunkAllreducer`, and every rank applies the same update. The
module also holds what a multi-node run needs around that:

* :class:`ChunkAllreducer`: sums host arrays across ranks on ONE
  communication thread that owns every MPI call it makes, so accumulator
  threads can start chunk reductions while earlier chunks' backward still
  runs.
* :func:`check_consistency`: all ranks must train the same model with the
  same optimizer; a difference raises ``ValueError`` on every rank.
* :func:`broadcast_parameters`: rank ``root``'s weights to every rank.
* :func:`abort_on_exception` / :func:`install_abort_hooks`: an exception on
  one rank prints its traceback and aborts the whole job, so no rank waits
  forever in a collective that its peer will never join.
* :func:`shard_dataset`: each rank's part of the dataset; the global batch
  is the union of the ranks' batches.
* :func:`make_chainermn_updater`: the ChainerMN baseline.
* :func:`launched_with_mpi` / :func:`world` / :func:`node_ranks`: whether an
  MPI launcher started this process (from its environment, without
  starting MPI), the world communicator then, and the ranks sharing this
  machine. The experiment scripts switch to their multi-rank modes by them.

Thread support. :class:`ChunkAllreducer` calls MPI from its own thread,
which is not the thread that initialized MPI. ``MPI_THREAD_FUNNELED`` is
therefore NOT enough (it allows MPI calls from the main thread only);
``MPI_THREAD_SERIALIZED`` is the minimum, and is enough while the other
threads make no MPI call during the allreducer's lifetime.
``MPI_THREAD_MULTIPLE`` (mpi4py's default request, and what MPICH gives) is
needed when the main thread also communicates while the allreducer runs,
for example :func:`check_consistency` or a ChainerMN evaluator. The
allreducer works on its own duplicate of the communicator, so its
collectives never match anybody else's.

``mpi4py.MPI`` is imported lazily, inside the functions, so that importing
this module does not start MPI in single-process runs.
"""
import atexit
import collections
import os
import queue
import sys
import threading
import time
import traceback

import numpy

# dtypes that MPI can sum and the project reduces: gradients (float32,
# float64) and the integer/float scalars of allreduce_int/allreduce_scalar.
SUPPORTED_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64),
                    numpy.dtype(numpy.int32), numpy.dtype(numpy.int64))

_OP_NAMES = ('sum', 'max', 'min')

# Returned by the queue to wake the communication thread for closing.
_STOP = object()


def as_mpi_comm(comm):
    """The mpi4py communicator behind ``comm``.

    Args:
        comm: An ``mpi4py.MPI.Comm`` or a ChainerMN communicator (which
            carries its mpi4py communicator as ``mpi_comm``).

    Returns:
        mpi4py.MPI.Comm: The communicator.
    """
    return getattr(comm, 'mpi_comm', comm)


def thread_level_name(level):
    """``'MPI_THREAD_MULTIPLE'`` and so on for an MPI thread level."""
    from mpi4py import MPI
    names = {MPI.THREAD_SINGLE: 'MPI_THREAD_SINGLE',
             MPI.THREAD_FUNNELED: 'MPI_THREAD_FUNNELED',
             MPI.THREAD_SERIALIZED: 'MPI_THREAD_SERIALIZED',
             MPI.THREAD_MULTIPLE: 'MPI_THREAD_MULTIPLE'}
    return names.get(level, str(level))


def check_thread_support(required=None):
    """Raises unless MPI was started with at least ``required`` threading.

    Args:
        required (int): An ``MPI.THREAD_*`` level; ``None`` means
            ``MPI.THREAD_SERIALIZED``, what :class:`ChunkAllreducer` needs.

    Returns:
        int: The level MPI provides (``MPI.Query_thread()``).

    Raises:
        RuntimeError: MPI provides less.
    """
    from mpi4py import MPI
    if required is None:
        required = MPI.THREAD_SERIALIZED
    provided = MPI.Query_thread()
    if provided < required:
        raise RuntimeError(
            'MPI was started with {}, but a communication thread needs at '
            'least {}. Set mpi4py.rc.thread_level = "multiple" (mpi4py\'s '
            'default) before the first "from mpi4py import MPI", or call '
            'cgdp_chainer.mpi.init_mpi() first.'.format(
                thread_level_name(provided), thread_level_name(required)))
    return provided


def init_mpi(thread_level='multiple'):
    """Starts MPI with thread support (if not started yet) and checks it.

    Args:
        thread_level (str): mpi4py's name of the level to ask for:
            ``'multiple'`` (default) or ``'serialized'``.

    Returns:
        module: ``mpi4py.MPI``.

    Raises:
        RuntimeError: MPI was started before with too little thread
            support, or the library cannot give ``MPI_THREAD_SERIALIZED``.
    """
    import mpi4py
    if 'mpi4py.MPI' not in sys.modules:
        mpi4py.rc.thread_level = thread_level
    from mpi4py import MPI
    if not MPI.Is_initialized():
        levels = {'multiple': MPI.THREAD_MULTIPLE,
                  'serialized': MPI.THREAD_SERIALIZED}
        MPI.Init_thread(levels[thread_level])
    check_thread_support()
    return MPI


# -- launch ------------------------------------------------------------------

# Variables that MPI launchers put into every rank's environment: MPICH's and
# Intel MPI's Hydra ``mpiexec`` and Slurm's ``srun --mpi=pmi2`` (PMI_SIZE;
# Hydra also MPI_LOCALNRANKS), Open MPI's ``mpirun`` (OMPI_COMM_WORLD_SIZE)
# and PMIx launchers (PMIX_RANK).
LAUNCH_VARIABLES = ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE', 'MPI_LOCALNRANKS',
                    'PMIX_RANK')


def launched_with_mpi(environ=None):
    """True when an MPI launcher (``mpiexec``, ``mpirun``, ``srun``) started
    this process, with any number of ranks (``mpiexec -n 1`` too).

    Looks at environment variables only (:data:`LAUNCH_VARIABLES`), so a
    plain ``python ...`` run never starts MPI. This is the one test of "am
    I under MPI" that the experiment scripts use.

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.

    Returns:
        bool: Whether a launcher's variable is set.
    """
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in LAUNCH_VARIABLES)


def world(environ=None):
    """``MPI.COMM_WORLD`` under an MPI launch, ``None`` otherwise.

    Under a launch (see :func:`launched_with_mpi`) MPI is started with
    thread support (:func:`init_mpi`); otherwise MPI is not touched.

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.

    Returns:
        mpi4py.MPI.Comm or None: The world communicator.
    """
    if not launched_with_mpi(environ):
        return None
    return init_mpi().COMM_WORLD


def node_ranks(comm):
    """This rank's place among the ranks on its own machine. Collective.

    Ranks that share a machine share its cores (and GPUs): the experiment
    scripts divide them by this.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.

    Returns:
        tuple of int: ``(local_rank, local_size)``.
    """
    from mpi4py import MPI
    comm = as_mpi_comm(comm)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


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
    place with no copy.

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
            if len(group) == 1 and group[0].flags.c_contiguous:
                self.buffers.append((group[0].reshape(-1), []))
                continue
            # Packing here, on the caller's thread, keeps the copies off the
            # communication thread, which only drives MPI.
            buffer = numpy.concatenate([array.reshape(-1) for array in group])
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
    """

    def __init__(self, comm, stall_timeout=None, max_poll_interval=2e-4,
                 nonblocking=True, name='cgdp-allreduce'):
        check_thread_support()
        comm = as_mpi_comm(comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
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
        buffer = numpy.array([value], dtype=numpy.float64)
        self.allreduce([buffer], op, timeout)
        return float(buffer[0])

    def allreduce_int(self, value, op='sum', timeout=None):
        """Reduces one integer across ranks (through the same thread).

        Args:
            value (int): This rank's value.
            op (str): ``'sum'``, ``'max'`` or ``'min'``.
            timeout (float): As for :meth:`AllreduceHandle.wait`.

        Returns:
            int: The reduced value, the same on every rank.
        """
        buffer = numpy.array([value], dtype=numpy.int64)
        self.allreduce([buffer], op, timeout)
        return int(buffer[0])

    def close(self, timeout=10.0):
        """Finishes started requests, then stops the thread.

        Requests already started keep going until ``timeout``; the ones
        still unfinished then fail with ``RuntimeError``, so nobody waits
        on them forever. Safe to call more than once.

        Args:
            timeout (float): Seconds to let started requests finish.
        """
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


# -- consistency of the ranks' set-up ---------------------------------------

def describe_setup(model, optimizer):
    """What has to match between the ranks, in a picklable form.

    Args:
        model (chainer.Link): The model.
        optimizer (chainer.Optimizer): Its optimizer (a ChainerMN
            multi-node optimizer is looked through).

    Returns:
        dict: ``parameters``: list of ``(name, shape, dtype)`` sorted by
        name (shape ``None`` while uninitialized); ``optimizer``: class
        name; ``hyperparameters``: dict of name to ``repr`` of the value;
        ``hooks``: list of hook names.
    """
    parameters = []
    for name, param in sorted(model.namedparams()):
        if param.array is None:
            parameters.append((name, None, None))
        else:
            parameters.append((name, tuple(param.shape),
                               str(param.array.dtype)))
    actual = getattr(optimizer, 'actual_optimizer', optimizer)
    # repr keeps the comparison exact and the message readable.
    hyperparameters = {
        key: repr(value)
        for key, value in sorted(actual.hyperparam.get_dict().items())}
    hooks = []
    for attribute in ('_pre_update_hooks', '_post_update_hooks'):
        # None until the optimizer is set up or a hook is added.
        hooks.extend(getattr(actual, attribute, None) or {})
    return {'parameters': parameters,
            'optimizer': type(actual).__name__,
            'hyperparameters': hyperparameters,
            'hooks': hooks}


def _shape_text(shape):
    return 'uninitialized' if shape is None else str(shape)


def first_difference(reference, other, reference_rank, other_rank):
    """The first way ``other`` differs from ``reference``, in words.

    Args:
        reference (dict): :func:`describe_setup` of ``reference_rank``.
        other (dict): :func:`describe_setup` of ``other_rank``.
        reference_rank (int): Rank that ``reference`` comes from.
        other_rank (int): Rank that ``other`` comes from.

    Returns:
        str or None: A sentence naming the difference; ``None`` if equal.
    """
    ref, oth = 'rank {}'.format(reference_rank), 'rank {}'.format(other_rank)
    ref_params = {name: (shape, dtype)
                  for name, shape, dtype in reference['parameters']}
    oth_params = {name: (shape, dtype)
                  for name, shape, dtype in other['parameters']}
    for name in sorted(set(ref_params) | set(oth_params)):
        if name not in oth_params:
            return '{} has no parameter {}, {} has it (shape {})'.format(
                oth, name, ref, _shape_text(ref_params[name][0]))
        if name not in ref_params:
            return '{} has parameter {} (shape {}), {} does not'.format(
                oth, name, _shape_text(oth_params[name][0]), ref)
        (ref_shape, ref_dtype), (oth_shape, oth_dtype) = (
            ref_params[name], oth_params[name])
        if ref_shape != oth_shape:
            return '{} has parameter {} of shape {}, {} has {}'.format(
                oth, name, _shape_text(oth_shape), ref,
                _shape_text(ref_shape))
        if ref_dtype != oth_dtype:
            return '{} has parameter {} of dtype {}, {} has {}'.format(
                oth, name, oth_dtype, ref, ref_dtype)
    if reference['optimizer'] != other['optimizer']:
        return '{} uses optimizer {}, {} uses {}'.format(
            oth, other['optimizer'], ref, reference['optimizer'])
    ref_hyper, oth_hyper = (reference['hyperparameters'],
                            other['hyperparameters'])
    for key in sorted(set(ref_hyper) | set(oth_hyper)):
        if key not in oth_hyper:
            return ('{} has no optimizer hyperparameter {}, {} has {}={}'
                    .format(oth, key, ref, key, ref_hyper[key]))
        if key not in ref_hyper:
            return ('{} has optimizer hyperparameter {}={}, {} does not'
                    .format(oth, key, oth_hyper[key], ref))
        if ref_hyper[key] != oth_hyper[key]:
            return ('{} has optimizer hyperparameter {}={}, {} has {}={}'
                    .format(oth, key, oth_hyper[key], ref, key,
                            ref_hyper[key]))
    if reference['hooks'] != other['hooks']:
        return '{} has optimizer hooks {}, {} has {}'.format(
            oth, other['hooks'], ref, reference['hooks'])
    return None


def check_consistency(comm, model, optimizer):
    """Checks that every rank trains the same model with the same optimizer.

    Compares parameter names, shapes and dtypes, the optimizer's class,
    hyperparameters and hooks. Collective: call it on every rank, from the
    main thread, before training (before a :class:`ChunkAllreducer` runs,
    unless MPI gives ``MPI_THREAD_MULTIPLE``).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        model (chainer.Link): This rank's model.
        optimizer (chainer.Optimizer): This rank's optimizer.

    Raises:
        ValueError: On EVERY rank when any rank differs from rank 0; the
            message names the first difference of the lowest such rank,
            e.g. ``rank 1 has parameter /predictor/fc8/W of shape
            (10, 4096), rank 0 has (1000, 4096)``.
    """
    comm = as_mpi_comm(comm)
    descriptions = comm.allgather(describe_setup(model, optimizer))
    # Every rank compares all descriptions the same way, so every rank
    # reaches the same verdict and raises the same message.
    for rank in range(1, len(descriptions)):
        difference = first_difference(descriptions[0], descriptions[rank],
                                      0, rank)
        if difference is not None:
            raise ValueError(
                'the ranks differ in model or optimizer: {} (every rank '
                'must build the same model and optimizer)'.format(difference))


def broadcast_parameters(comm, model, root=0):
    """Copies rank ``root``'s parameter values to every rank, in place.

    Collective. Ranks that built their models with different random
    initializations start from the same weights afterwards.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        model (chainer.Link): The model, with host (numpy) parameters, all
            initialized.

    Raises:
        TypeError: A parameter is not a numpy array (move the model to
            the host first).
    """
    comm = as_mpi_comm(comm)
    for name, param in sorted(model.namedparams()):
        if not isinstance(param.array, numpy.ndarray):
            raise TypeError('parameter {} is {}, not a host numpy array'
                            .format(name, type(param.array).__name__))
        array = param.array
        if array.flags.c_contiguous:
            comm.Bcast(array, root=root)
        else:
            buffer = numpy.ascontiguousarray(array)
            comm.Bcast(buffer, root=root)
            array[...] = buffer


# -- faults ------------------------------------------------------------------

def abort_job(comm, exc_type, exc_value, exc_traceback, exit_code=1,
              where='', abort_grace=10.0):
    """Prints this rank's traceback to stderr and aborts the whole MPI job.

    Does not return. ``MPI_Abort`` makes the process manager kill every
    rank; if it has not ended this process within ``abort_grace`` seconds,
    the process exits by itself.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exc_type, exc_value, exc_traceback: The exception.
        exit_code (int): Exit status of the job.
        where (str): Where it happened, e.g. ``" in thread accumulator"``.
        abort_grace (float): Seconds before the fallback exit.
    """
    comm = as_mpi_comm(comm)
    try:
        rank, size = comm.Get_rank(), comm.Get_size()
    except Exception:
        rank, size = '?', '?'
    lines = traceback.format_exception(exc_type, exc_value, exc_traceback)
    # Ranks share the job's stderr: the prefix keeps interleaved lines
    # attributable.
    prefix = '[rank {}] '.format(rank)
    text = ''.join(prefix + line + '\n'
                   for chunk in lines for line in chunk.rstrip('\n').split(
                       '\n'))
    message = ('{prefix}Uncaught exception on rank {rank} of {size}{where}; '
               'aborting the MPI job.\n{text}{prefix}Calling MPI_Abort({code})'
               '.\n'.format(prefix=prefix, rank=rank, size=size, where=where,
                            text=text, code=exit_code))
    try:
        sys.stderr.write(message)
        sys.stderr.flush()
    except Exception:
        pass
    # If MPI_Abort hangs or returns, this timer still ends the process.
    fallback = threading.Timer(abort_grace, os._exit, (exit_code,))
    fallback.daemon = True
    fallback.start()
    try:
        comm.Abort(exit_code)
    finally:
        os._exit(exit_code)


def _is_clean_exit(exc_type, exc_value):
    return (exc_type is SystemExit and
            (exc_value is None or exc_value.code in (None, 0)))


def _exit_code_of(exc_value, default):
    if isinstance(exc_value, SystemExit) and isinstance(exc_value.code, int):
        return exc_value.code
    return default


class AbortOnException(object):
    """Context manager: an exception leaving the block aborts the MPI job.

    The rank's traceback goes to stderr first. ``SystemExit`` with status 0
    passes through; any other exception, ``KeyboardInterrupt`` included,
    aborts: a rank that stops early would leave the others waiting in a
    collective forever.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.
    """

    def __init__(self, comm, exit_code=1):
        self.comm = comm
        self.exit_code = exit_code

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, exc_traceback):
        if exc_type is None or _is_clean_exit(exc_type, exc_value):
            return False
        abort_job(self.comm, exc_type, exc_value, exc_traceback,
                  _exit_code_of(exc_value, self.exit_code))


def abort_on_exception(comm, exit_code=1):
    """``with abort_on_exception(comm): train()`` (see AbortOnException).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.

    Returns:
        AbortOnException: The context manager.
    """
    return AbortOnException(comm, exit_code)


def install_abort_hooks(comm, exit_code=1):
    """Makes uncaught exceptions, in any thread, abort the whole MPI job.

    Replaces ``sys.excepthook`` (the main thread) and
    ``threading.excepthook`` (other threads: an accumulator thread that
    dies would otherwise leave its rank, and so every rank, waiting).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        exit_code (int): Exit status of the aborted job.
    """
    def main_thread_hook(exc_type, exc_value, exc_traceback):
        if _is_clean_exit(exc_type, exc_value):
            return
        abort_job(comm, exc_type, exc_value, exc_traceback,
                  _exit_code_of(exc_value, exit_code))

    def other_thread_hook(args):
        if _is_clean_exit(args.exc_type, args.exc_value):
            return
        name = args.thread.name if args.thread is not None else '?'
        abort_job(comm, args.exc_type, args.exc_value, args.exc_traceback,
                  _exit_code_of(args.exc_value, exit_code),
                  where=' in thread {}'.format(name))

    sys.excepthook = main_thread_hook
    threading.excepthook = other_thread_hook


# -- data --------------------------------------------------------------------

def shard_range(n_examples, rank, size):
    """``(begin, end)`` of rank ``rank``'s shard, ChainerMN's way.

    Every shard has ``ceil(n_examples / size)`` examples (equal lengths keep
    the ranks' iterators in step); when ``size`` does not divide
    ``n_examples`` neighbouring shards overlap by a few examples.

    Args:
        n_examples (int): Length of the dataset.
        rank (int): The rank.
        size (int): Number of ranks.

    Returns:
        tuple of int: Begin (inclusive) and end (exclusive).
    """
    shard_length = (n_examples + size - 1) // size
    begin = n_examples * rank // size
    return begin, begin + shard_length


def shard_dataset(dataset, comm, shuffle=False, seed=0):
    """This rank's part of ``dataset``, like ``chainermn.scatter_dataset``.

    Every rank passes the same dataset (each loads it itself; nothing is
    sent). With a per-rank batch of ``B / size`` examples, iteration ``i``
    on the ranks together covers a global batch of ``B`` examples: the
    union of the ranks' batches.

    Args:
        dataset: A dataset (list, array, ``TupleDataset``, ...).
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        shuffle (bool): Permute the examples (the same permutation on every
            rank) before splitting.
        seed (int): Seed of the permutation; ``None``: rank 0 draws one.

    Returns:
        chainer.datasets.SubDataset: The shard.

    Raises:
        ValueError: The ranks' datasets have different lengths.
    """
    import chainer
    comm = as_mpi_comm(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    lengths = comm.allgather(len(dataset))
    if len(set(lengths)) != 1:
        raise ValueError('the ranks pass datasets of different lengths {}; '
                         'every rank must pass the same dataset'.format(
                             lengths))
    order = None
    if shuffle:
        if seed is None:
            seed = comm.bcast(
                int(numpy.random.randint(2 ** 31)) if rank == 0 else None,
                root=0)
        order = numpy.random.RandomState(seed).permutation(len(dataset))
    begin, end = shard_range(len(dataset), rank, size)
    return chainer.datasets.SubDataset(dataset, begin, end, order)


# -- the ChainerMN baseline ---------------------------------------------------

def make_chainermn_updater(iterator, optimizer, comm, device,
                           converter=None, loss_func=None):
    """A ChainerMN data parallel updater: the multi-node baseline.

    One device per rank. Gradients are averaged over the ranks (ChainerMN's
    ``multi_node_mean_grad``), so with each rank's loss a mean over its
    batch, the update equals one process's update with the mean loss over
    the global batch. Uses ChainerMN's ``'naive'`` communicator (MPI on
    host arrays) for ``'@numpy'`` and ``'pure_nccl'`` for ``'@cupy:N'``.

    ChainerMN's multi-node optimizer spends its first ``update`` on
    broadcasting rank 0's weights instead of updating. This function does
    that broadcast now, so every iteration updates, as in single-process
    training and CGDP (parameters that are still uninitialized get their
    broadcast at the first update, ChainerMN's way).

    Args:
        iterator: This rank's iterator (see :func:`shard_dataset`).
        optimizer (chainer.Optimizer): Set up with the model.
        comm: ``mpi4py.MPI.Comm``, or a ChainerMN communicator to use as
            it is.
        device: Device specifier or ``chainer.backend.Device``.
        converter: Batch converter; ``None``: ``concat_examples``.
        loss_func: Loss function; ``None``: the model.

    Returns:
        chainer.training.updaters.StandardUpdater: The updater; its
        optimizer is the multi-node optimizer, whose ``communicator`` is
        the ChainerMN communicator.

    Raises:
        ValueError: The optimizer has not been set up with a model.
    """
    import chainer
    import chainermn
    if optimizer.target is None:
        raise ValueError('set the optimizer up with the model first '
                         '(optimizer.setup(model))')
    device = chainer.get_device(device)
    if isinstance(comm, chainermn.CommunicatorBase):
        communicator = comm
    else:
        name = 'naive' if device.xp is numpy else 'pure_nccl'
        if device.xp is not numpy:
            device.use()
        communicator = chainermn.create_communicator(name, mpi_comm=comm)
    multi_node_optimizer = chainermn.create_multi_node_optimizer(
        optimizer, communicator)
    if converter is None:
        converter = chainer.dataset.concat_examples
    # The updater moves the model to ``device``; broadcast afterwards.
    updater = chainer.training.updaters.StandardUpdater(
        iterator, multi_node_optimizer, converter=converter, device=device,
        loss_func=loss_func)
    model = optimizer.target
    communicator.bcast_data(model)
    # Records the parameter set, so the first update is not taken for a
    # change of the model (which would broadcast instead of update).
    multi_node_optimizer.is_changed(model)
    return updater
