"""One replica's iteration: forward, chunked backward, hand-over per chunk.

:class:`ReplicaWorker` is the only code that runs a replica. The thread
runtime calls it from a thread of the user's process, the process runtime
from a worker process (see :mod:`cgdp_chainer.runtime.channels`); what
differs between the two is given to it when it is built: the replica, its
transfer (how gradients leave and weights arrive) and its link to the host
(how a finished chunk is announced, and how it learns that it must stop).
"""
import collections
import threading
import time

import chainer
import numpy

from cgdp_chainer import chunking
from cgdp_chainer import devices as devices_module
from cgdp_chainer import randomness
from cgdp_chainer.accumulator import Aborted  # NOQA: one exception for all

Job = collections.namedtuple(
    'Job', ('iteration', 'seed', 'chunks', 'chunk_names', 'record_events',
            'send_persistents', 'persistents', 'config'))
Job.__doc__ = """What a replica needs for one iteration.

Attributes:
    iteration (int): The updater's iteration.
    seed (int): Seed of the replica's dropout random state.
    chunks (list of (int, int)): Stage ranges of the chunks, input side
        first.
    chunk_names (list of list of str): Parameter paths of each chunk.
    record_events (bool): Whether to time forward and backward per chunk.
    send_persistents (bool): Whether to return the replica's persistent
        values (BatchNormalization statistics) after the iteration.
    persistents (dict or None): Persistent values to load first (after a
        snapshot was restored on the host).
    config (dict): The caller's Chainer configuration (``train``,
        ``dtype``, ...; see :func:`caller_config`), applied for the
        iteration, so that ``with chainer.using_config('train', False):
        updater.update()`` means the same in every replica.
"""

# Settings of chainer.config that a replica takes over from the caller;
# the others (enable_backprop, the recomputation flags) are the runtime's.
_SKIPPED_CONFIG = ('enable_backprop', 'in_recomputing', '_will_recompute',
                   'schedule_func')


def caller_config():
    """The calling thread's effective Chainer configuration, picklable."""
    return {key: getattr(chainer.config, key)
            for key in chainer.global_config.__dict__
            if key not in _SKIPPED_CONFIG}

IterationResult = collections.namedtuple(
    'IterationResult', ('observation', 'events', 'persistents'))
IterationResult.__doc__ = """What a replica hands back after an iteration.

Attributes:
    observation (dict): Reported values (``main/loss``, ...) as floats.
    events (list): ``(kind, chunk, start, end)``, ``time.perf_counter``
        seconds (one monotonic clock for every process on the machine).
    persistents (dict or None): The replica's persistent values, if asked.
"""


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
            :mod:`cgdp_chainer.runtime.transfer`).
        host: Its link to the host: ``deliver(iteration, chunk, ready)``
            after a chunk's gradients are sent, and ``check()``, which
            raises :class:`Aborted` once the iteration must stop.
        loss_func (callable or None): As for ``CGDPUpdater``.
    """

    def __init__(self, index, device, replica, transfer, host,
                 loss_func=None):
        self.index = index
        self.device = device
        self.replica = replica
        self.transfer = transfer
        self.host = host
        self.loss_func = loss_func
        # Found once: the stage list and the loss head do not change.
        self.stages = chunking.find_stages(replica)
        self.head = (chunking.find_head(replica, loss_func)
                     if self.stages is not None else None)
        self.reporter = chainer.Reporter()
        self.reporter.add_observer('main', replica)
        self.reporter.add_observers('main', replica.namedlinks(skipself=True))

    def run(self, job, in_arrays):
        """One iteration on this replica's share of the batch.

        Args:
            job (Job): The iteration's plan.
            in_arrays: The converted sub-batch, in host memory.

        Returns:
            IterationResult: Its observation, events and persistents.
        """
        if job.persistents is not None:
            load_persistents(self.replica, job.persistents, self.device)
        clock = _Clock(job.record_events, self.transfer)
        replica = self.replica
        replica.cleargrads()
        in_arrays = self.device.send(in_arrays)
        observation = {}
        with _ConfigScope(job.config), _ReplicaScope(self.index), \
                randomness.thread_random_state(job.seed), \
                self.reporter.scope(observation), \
                chainer.using_config('enable_backprop', True):
            if self.stages is None:
                self._whole_model(job, in_arrays, clock)
            else:
                self._chunked(job, in_arrays, clock)
        return IterationResult(
            observation={
                key: float(chainer.backends.cuda.to_cpu(
                    getattr(value, 'array', value)))
                for key, value in observation.items()},
            events=clock.flush(),
            persistents=(save_persistents(replica)
                         if job.send_persistents else None))

    def _whole_model(self, job, in_arrays, clock):
        self.host.check()
        self.transfer.wait_params(0)
        token = clock.stamp()
        loss = _call_with(self.loss_func or self.replica, in_arrays)
        clock.add('forward', 0, token)
        token = clock.stamp()
        loss.backward()
        clock.add('backward', 0, token)
        self._hand_over(job, 0)

    def _chunked(self, job, in_arrays, clock):
        if not isinstance(in_arrays, tuple):
            in_arrays = (in_arrays,)
        chunked = chunking.ChunkedPass(self.stages, job.chunks, self.head)
        carry = in_arrays[0]
        last = len(job.chunks) - 1
        for c in range(len(job.chunks)):
            self.host.check()
            self.transfer.wait_params(c)
            token = clock.stamp()
            carry = chunked.forward_chunk(c, carry)
            if c == last:
                chunked.forward_head(in_arrays[1:])
            clock.add('forward', c, token)
        for c in range(last, -1, -1):
            self.host.check()
            token = clock.stamp()
            chunked.backward_chunk(c)
            clock.add('backward', c, token)
            self._hand_over(job, c)

    def _hand_over(self, job, chunk):
        ready = self.transfer.send_grads(job.chunk_names[chunk])
        self.host.deliver(job.iteration, chunk, ready)


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


def _call_with(func, in_arrays):
    if isinstance(in_arrays, tuple):
        return func(*in_arrays)
    if isinstance(in_arrays, dict):
        return func(**in_arrays)
    return func(in_arrays)


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


class device_scope(object):
    """Makes a GPU replica's device current, with its own compute stream,
    for the thread or process that runs it."""

    def __init__(self, device):
        self.device = device
        self._contexts = []

    def __enter__(self):
        if devices_module.is_gpu(self.device):
            import cupy
            gpu = cupy.cuda.Device(self.device.device.id)
            gpu.__enter__()
            stream = cupy.cuda.Stream(non_blocking=True)
            stream.__enter__()
            self._contexts = [stream, gpu]
        return self

    def __exit__(self, *exc):
        for context in self._contexts:
            context.__exit__(*exc)
        self._contexts = []
        return False
