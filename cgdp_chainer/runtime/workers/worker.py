"""One replica's iteration: forward, backward, hand-over per chunk.

:class:`ReplicaWorker` is the only code that runs a replica. The thread
runtime calls it from a thread of the user's process, the process runtime
from a worker process (see :mod:`cgdp_chainer.runtime.workers.channels`); what
differs between the two is given to it when it is built: the replica, its
transfer (how gradients leave and weights arrive) and its link to the host
(how a finished chunk is announced, and how it learns that it must stop).

Any ``chainer.Link`` runs the same way: an ordinary forward, then one
backward (:class:`~cgdp_chainer.runtime.replica.readiness.ReadinessBackward`) that
hands each chunk of layers to the host as soon as the gradients of all its
parameters are final. The first iteration forms no chunks: it hands the
whole model over after its backward and returns the order in which the
parameters became ready, from which the updater forms the
:class:`~cgdp_chainer.runtime.replica.readiness.ChunkPlan` that every later
iteration gets in its :class:`Job`.
"""
import collections
import threading
import time

import chainer
import numpy

from cgdp_chainer import devices as devices_module
from cgdp_chainer import randomness
from cgdp_chainer.runtime.host.accumulator import Aborted  # NOQA: one exception for all
from cgdp_chainer.runtime.replica import observations
from cgdp_chainer.runtime.replica import readiness
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.replica import static_graph_models
from cgdp_chainer.runtime.transport import input_staging

Job = collections.namedtuple(
    'Job', ('iteration', 'seed', 'plan', 'fingerprint', 'record_events',
            'send_persistents', 'persistents', 'config', 'loss_scale',
            'layout'),
    defaults=(None, None))
Job.__doc__ = """What a replica needs for one iteration.

Attributes:
    iteration (int): The updater's iteration.
    seed (cgdp_chainer.randomness.ReplicaSeed): What the replica's random
        streams are seeded from for the iteration (see
        :func:`cgdp_chainer.randomness.replica_streams`).
    plan (ChunkPlan or None): The chunks, sent when they change (the
        replica keeps them); ``None`` keeps the replica's current plan.
    fingerprint (str or None): The fingerprint of the plan to run with;
        ``None`` for the iteration that forms the plan, which hands the
        whole model over as one chunk and returns its ready order.
    record_events (bool): Whether to time forward and backward per chunk.
    send_persistents (bool): Whether to return the replica's persistent
        values (BatchNormalization statistics) after the iteration (asked
        of the first replica outside a Trainer's loop; in one, the updater
        fetches them only before the model may be read).
    persistents (dict or None): Persistent values to load first (after a
        snapshot was restored on the host, or user code changed the
        master's).
    config (dict): The caller's Chainer configuration (``train``,
        ``dtype``, ...; see :func:`caller_config`), applied for the
        iteration, so that ``with chainer.using_config('train', False):
        updater.update()`` means the same in every replica.
    loss_scale (float or None): The optimizer's loss scale this iteration:
        the backward starts from it, as ``loss.backward(loss_scale=...)``.
    layout (FlatLayout or None): The flat layout of the master's and the
        slots' buffers, sent when it changes (once the plan is formed, the
        layout follows its layers, so every chunk is one slice); ``None``
        keeps the current one.
"""

# Settings of chainer.config that a replica takes over from the caller;
# the others (enable_backprop, the recomputation flags, the reporter's
# graph keeping, use_static_graph: a replica runs @static_graph methods
# define-by-run) are the runtime's.
_SKIPPED_CONFIG = ('enable_backprop', 'in_recomputing', '_will_recompute',
                   'schedule_func', 'keep_graph_on_report',
                   'use_static_graph')


def caller_config():
    """The calling thread's effective Chainer configuration, picklable."""
    return {key: getattr(chainer.config, key)
            for key in chainer.global_config.__dict__
            if key not in _SKIPPED_CONFIG}

IterationResult = collections.namedtuple(
    'IterationResult', ('observation', 'events', 'persistents', 'ready',
                        'copies'), defaults=(None,))
IterationResult.__doc__ = """What a replica hands back after an iteration.

Attributes:
    observation (dict or PendingObservation): Reported values
        (``main/loss``, ...) as the model reported them, made portable by
        :func:`~cgdp_chainer.runtime.replica.observations.portable` (a Variable as
        a ``VariableValue``, arrays in host memory); a GPU replica's are
        still being copied to the host, on its copy stream ahead of its
        gradients (:func:`~cgdp_chainer.runtime.replica.observations.settled`
        gives the dict; pickled, it is the dict). The updater combines them
        (:func:`~cgdp_chainer.runtime.replica.observations.combine_all`).
    events (list): ``(kind, chunk, start, end)``, ``time.perf_counter``
        seconds (one monotonic clock for every process on the machine).
    persistents (dict or None): The replica's persistent values, if asked.
    ready (BackwardReport or None): The ready order of the backward, in the
        iteration that forms the plan.
    copies (dict or None): What a GPU replica's transfer issued since its
        last result (``'d2h'``, ``'h2d'``, ``'event'`` counts), when events
        are recorded.
"""


def whole_model_plan(names):
    """The plan of the iteration that forms the real one: every layer in
    one chunk, handed over after the backward.

    Args:
        names (sequence of str): The model's parameter names.

    Returns:
        ChunkPlan: One chunk.
    """
    names = tuple(names)
    return readiness.ChunkPlan.from_ready_order(names,
                                                chunk_size=len(names))


def runtime_chunk(plan, index):
    """The runtime's index of a plan's chunk.

    A :class:`~cgdp_chainer.runtime.replica.readiness.ChunkPlan` counts chunks in
    backward order (0 is the output side); the host accumulator, the MPI
    sequence numbers and the timeline count from the input side (0 holds
    the first layers, whose sync is the exposed one).
    """
    return plan.n_chunks - 1 - index


def runtime_chunk_names(plan):
    """Parameter names per chunk in the runtime's order (input side
    first), for the host accumulator."""
    return [list(names) for names in reversed(plan.chunks)]


_running = threading.local()


def replica_index():
    """The index of the replica whose iteration runs in this thread (in a
    thread or a worker process), or None outside one. A model may use it,
    e.g. to log from one replica only."""
    return getattr(_running, 'index', None)


class ReplicaWorker(object):
    """Runs the iterations of one replica.

    Args:
        index (int): The replica's index.
        device (chainer.backend.Device): Its device.
        replica (chainer.Link): Its copy of the model, on ``device``.
        transfer: Moves its gradients out and weights in (see
            :mod:`cgdp_chainer.runtime.transport.transfer`).
        host: Its link to the host: ``deliver(iteration, chunk, ready)``
            after a chunk's gradients are sent, and ``check()``, which
            raises :class:`Aborted` once the iteration must stop.
        loss_func (callable or None): ``loss_func(*in_arrays)`` returns the
            loss, as in ``StandardUpdater``; by default the replica itself.
    """

    def __init__(self, index, device, replica, transfer, host,
                 loss_func=None):
        self.index = index
        self.device = device
        self.replica = replica
        self.transfer = transfer
        self.host = host
        self.loss_func = loss_func
        self.backward = readiness.ReadinessBackward(replica.namedparams())
        self._forming_plan = whole_model_plan(self.backward.names)
        self._plan = None
        self._uses = None
        self._early = ()
        self._hook = None
        self._ran_chunks = 0
        self.reporter = chainer.Reporter()
        self.reporter.add_observer('main', replica)
        self.reporter.add_observers('main', replica.namedlinks(skipself=True))
        # A GPU replica's shares go to its device from page-locked memory
        # on a stream of their own.
        self.inputs = input_staging.InputStaging(transfer.copies) \
            if transfer.is_gpu else None

    def run(self, job, in_arrays):
        """One iteration on this replica's share of the batch.

        Args:
            job (Job): The iteration's plan.
            in_arrays: The converted sub-batch, in host memory (or, for a
                GPU replica, already staged by :attr:`inputs`).

        Returns:
            IterationResult: Its observation, events, persistents and, when
            the job forms the plan, the ready order.

        Raises:
            RuntimeError: The job's plan is not the one this replica holds.
        """
        if job.layout is not None:
            self.transfer.adopt_layout(job.layout)
        if job.plan is not None:
            self._adopt(job.plan)
        forming = job.fingerprint is None
        if forming:
            plan = self._forming_plan
        else:
            plan = self._plan
            if plan is None or plan.fingerprint != job.fingerprint:
                raise RuntimeError(
                    'replica {} holds the chunk plan {!r}, but iteration {} '
                    'runs with {!r}; every replica must use the same '
                    'chunks'.format(self.index, getattr(
                        plan, 'fingerprint', None), job.iteration,
                        job.fingerprint))
        if job.persistents is not None:
            load_persistents(self.replica, job.persistents, self.device)
        clock = _Clock(job.record_events, self.transfer)
        replica = self.replica
        replica.cleargrads()
        staged = self._to_device(in_arrays)
        observation = {}
        # A GPU replica's values start to the host with each hand-over,
        # ahead of its gradients on the copy stream.
        pending = observations.PendingObservation(
            self.transfer.read_back, self.transfer.copies.is_device_array) \
            if self.transfer.is_gpu else None
        try:
            with _ConfigScope(job.config), _ReplicaScope(self.index), \
                    randomness.replica_streams(job.seed, self.device), \
                    self.reporter.scope(observation), \
                    chainer.using_config('enable_backprop', True), \
                    static_graph_models.define_by_run():
                # Define-by-run, so that the readiness backward sees each
                # parameter's last use (a static schedule's backward is
                # one node); the values are the schedule's.
                report = self._iterate(
                    job, plan, staged.on_device(), clock, forming,
                    _reads(pending, observation))
        finally:
            staged.release()
        self._ran_chunks = plan.n_chunks
        if pending is not None:
            pending.take(observation)  # values reported after the last
        return IterationResult(
            observation=pending if pending is not None else {
                key: observations.portable(value)
                for key, value in observation.items()},
            events=clock.flush(),
            persistents=(save_persistents(replica)
                         if job.send_persistents else None),
            ready=report if forming else None,
            copies=self._copy_counts() if job.record_events else None)

    def _to_device(self, in_arrays):
        """The share on this replica's device: staged (a GPU replica's, if
        not staged already), or sent as ``StandardUpdater`` sends it."""
        if isinstance(in_arrays, input_staging.StagedInputs):
            return in_arrays
        if self.inputs is not None:
            return self.inputs.stage(in_arrays)
        return _Sent(send_inputs(self.device, in_arrays))

    def _copy_counts(self):
        take = getattr(self.transfer, 'take_counts', None)
        return None if take is None else dict(take())

    def _iterate(self, job, plan, in_arrays, clock, forming, read_reports):
        self.host.check()
        for chunk in self._early:
            self.transfer.wait_params(chunk)
        token = clock.stamp()
        if forming:
            # The first forward also finds the parameters used outside
            # their own link, for the chunk waits of the next forwards.
            with readiness.ParameterUses(self.replica) as uses:
                loss = self._loss(in_arrays)
            self._uses = uses
        else:
            loss = self._loss(in_arrays)
        clock.add('forward', None, token)

        started = [clock.stamp()]

        def hand_over(index):
            self.host.check()
            chunk = runtime_chunk(plan, index)
            clock.add('backward', chunk, started[0])
            read_reports()
            ready = self.transfer.send_grads(plan.chunks[index])
            self.host.deliver(job.iteration, chunk, ready)
            started[0] = clock.stamp()

        chunks = readiness.ChunkReadiness(plan, hand_over)
        chunks.start()
        report = self.backward.backward(loss, chunks,
                                        loss_scale=job.loss_scale)
        if not chunks.complete:  # every parameter is reported once
            raise RuntimeError('the readiness backward left chunks '
                               'undelivered')
        return report

    def _loss(self, in_arrays):
        if in_arrays is None:
            # A share without examples (a batch shorter than the replicas):
            # no forward, so nothing reported; a loss without a graph hands
            # every parameter over unused (zeros, weighed 0 in 'mean').
            with chainer.using_device(self.device):
                return chainer.Variable(
                    self.device.xp.zeros((), numpy.float32))
        loss = shared.call_with(self.loss_func or self.replica, in_arrays)
        if not isinstance(loss, chainer.Variable):
            raise ValueError(
                'the loss function must return a chainer.Variable, not '
                '{}'.format(type(loss).__name__))
        return loss

    def _adopt(self, plan):
        """Takes a new plan: the next forwards wait per chunk."""
        if self._hook is not None:
            self._hook.uninstall()
        # The last publishes were per chunk of the plan that ran; with new
        # chunks, the next forward waits for all of them first (on a GPU,
        # ordering the compute stream after every copy; free on the CPU).
        for chunk in range(self._ran_chunks):
            self.transfer.wait_params(chunk)
        outside = dict(self._uses.outside) if self._uses is not None else {}
        # A parameter used while no link of the replica is being called
        # (in a loss_func outside the model) waits before the forward.
        self._early = tuple(sorted({
            runtime_chunk(plan, plan.chunk_of[name])
            for name, path in outside.items() if path is None}))
        self._plan = plan
        if not self.transfer.is_gpu:
            # A host replica's chunks are published before the next
            # iteration starts: no forward waits, and a link hook would
            # cost every link call of the forward.
            self._hook = None
            return
        uses = _Uses({name: path for name, path in outside.items()
                      if path is not None})
        self._hook = readiness.ChunkWaitHook(
            self.replica, plan,
            lambda index: self.transfer.wait_params(
                runtime_chunk(plan, index)), uses=uses)
        self._hook.install()


def _reads(pending, observation):
    """What each hand-over calls: starts the copies of the values reported
    so far (nothing for a host replica)."""
    if pending is None:
        return lambda: None
    return lambda: pending.take(observation)


class _Sent(object):
    """A share sent to a host device (the interface of
    :class:`~cgdp_chainer.runtime.transport.input_staging.StagedInputs`)."""

    def __init__(self, in_arrays):
        self._in_arrays = in_arrays

    def on_device(self):
        return self._in_arrays

    def release(self):
        pass


class _Uses(object):
    """Parameters used outside their own link, as ChunkWaitHook reads them
    from a :class:`~cgdp_chainer.runtime.replica.readiness.ParameterUses`."""

    def __init__(self, outside):
        self.outside = outside


class _ConfigScope(object):
    """Applies the caller's configuration in this thread for a block."""

    def __init__(self, settings):
        self._scopes = [chainer.using_config(key, value)
                        for key, value in settings.items()]

    def __enter__(self):
        for scope in self._scopes:
            scope.__enter__()
        return self

    def __exit__(self, *exc):
        for scope in reversed(self._scopes):
            scope.__exit__(*exc)
        return False


class _ReplicaScope(object):
    """Sets :func:`replica_index` for the duration of an iteration."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        _running.index = self.index
        return self

    def __exit__(self, *exc):
        _running.index = None
        return False


def send_inputs(device, in_arrays):
    """A converter's output on a replica's device: each of its arrays sent,
    in containers of the same types.

    ``Device.send`` takes one array or a flat tuple or list of them; a
    converter may return dicts and lists of arrays of different lengths,
    nested (see :func:`~cgdp_chainer.runtime.transport.shared.flatten_inputs`).

    Args:
        device (chainer.backend.Device): The replica's device.
        in_arrays: The converted sub-batch, in host memory.
    """
    return shared.map_arrays(device.send_array, in_arrays)


def save_persistents(link):
    """A link's persistent values by path, on the host (for pickling)."""
    values = {}
    for path, sublink in link.namedlinks():
        for name in sublink._persistent:
            value = sublink.__dict__[name]
            if hasattr(value, 'shape'):
                value = chainer.backends.cuda.to_cpu(value)
            values[path + '/' + name] = value
    return values


def load_persistents(link, values, device):
    """Sets persistent values saved by :func:`save_persistents`, in place
    where an array of the same shape and kind is there already."""
    links = dict(link.namedlinks())
    for key, value in values.items():
        path, name = key.rsplit('/', 1)
        target = links[path or '/']
        copy_persistent(target, name, value, device)


def copy_persistents(source, destination, device):
    """Copies the persistent values of one copy of a model into another."""
    destination_links = dict(destination.namedlinks())
    for path, link in source.namedlinks():
        target = destination_links[path]
        for name in link._persistent:
            copy_persistent(target, name, link.__dict__[name], device)


def copy_persistent(target, name, value, device):
    """Sets ``target``'s persistent ``name`` to ``value`` on ``device``."""
    current = target.__dict__[name]
    if value is None or numpy.isscalar(value) or not hasattr(value, 'shape'):
        setattr(target, name, value)
        return
    value = device.send(value)
    if value is current:
        return
    if getattr(current, 'shape', None) == value.shape and \
            type(current) is type(value):
        current[...] = value
    else:
        setattr(target, name, value.copy())


class _Clock(object):
    """Timestamps on a device's own order of work: the host clock for CPU
    replicas; CUDA events, converted to the host clock afterwards, for GPUs
    (host-side times would only show when work was queued)."""

    def __init__(self, enabled, transfer):
        self.enabled = enabled
        self.gpu = enabled and transfer.is_gpu
        self._transfer = transfer
        self._pending = []
        if self.gpu:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            self._base_event = transfer.record()
            self._base_event.synchronize()
            self._base_time = time.perf_counter()

    def stamp(self):
        if not self.enabled:
            return None
        if self.gpu:
            return self._transfer.record()
        return time.perf_counter()

    def add(self, kind, chunk, start_token):
        if self.enabled:
            self._pending.append((kind, chunk, start_token, self.stamp()))

    def flush(self):
        """The recorded ``(kind, chunk, start, end)`` in host seconds."""
        if not self.enabled:
            return []
        if self.gpu:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            elapsed = cupy.cuda.get_elapsed_time
            base_event, base = self._base_event, self._base_time
            events = [(kind, chunk,
                       base + elapsed(base_event, start) / 1000.0,
                       base + elapsed(base_event, end) / 1000.0)
                      for kind, chunk, start, end in self._pending]
        else:
            events = list(self._pending)
        self._pending = []
        return events


def use_device(device):
    """Makes a GPU replica's device current in the calling thread for the
    rest of its life (nothing for a CPU device).

    Not a ``with cupy.cuda.Device(N)`` block: leaving one makes current the
    device that was current before, GPU 0 in a new thread, and making a
    device current creates its context there (about 0.5 GB, and refused on
    a GPU in exclusive-process mode). With N current for good, the device
    blocks that CuPy and Chainer open inside the thread return to N.

    Args:
        device (chainer.backend.Device): The replica's device.
    """
    if devices_module.is_gpu(device):
        import cupy
        cupy.cuda.runtime.setDevice(device.device.id)


class device_scope(object):
    """Makes a GPU replica's device current (for good, see
    :func:`use_device`), with its own compute stream, for the thread or
    process that runs it."""

    def __init__(self, device):
        self.device = device
        self._stream = None

    def __enter__(self):
        if devices_module.is_gpu(self.device):
            import cupy
            use_device(self.device)
            self._stream = cupy.cuda.Stream(non_blocking=True)
            self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        if self._stream is not None:
            self._stream.__exit__(*exc)
        self._stream = None
        return False
