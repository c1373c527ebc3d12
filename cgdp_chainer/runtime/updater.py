"""CGDPUpdater: CPU-GPU data parallel training as a Chainer updater."""
import collections
import copy
import numbers
import time
import warnings

import chainer
from chainer.dataset import convert
from chainer.training.updaters import standard_updater
import numpy

from cgdp_chainer import accumulator as accumulator_module
from cgdp_chainer import blas
from cgdp_chainer import chunking
from cgdp_chainer import devices as devices_module
from cgdp_chainer.runtime import channels
from cgdp_chainer.runtime import worker as worker_module

REDUCTIONS = ('mean', 'sum')
WORKER_KINDS = channels.WORKER_KINDS

# Named chunk-size policies that need more than the runtime: higher layers
# register them (the cost model registers 'model' in cgdp_chainer/__init__),
# so that the runtime never imports them. 'auto' is the runtime's own.
_CHUNK_SIZE_POLICIES = collections.OrderedDict()


def register_chunk_size_policy(name, make_chooser):
    """Makes ``chunk_size=name`` mean ``chunk_size=make_chooser()``.

    Args:
        name (str): The policy's name.
        make_chooser (callable): Returns a chooser (see ``CGDPUpdater``).
    """
    _CHUNK_SIZE_POLICIES[name] = make_chooser


def chunk_size_policies():
    """Names that ``chunk_size`` accepts as a string."""
    return ('auto',) + tuple(_CHUNK_SIZE_POLICIES)


class CGDPUpdater(standard_updater.StandardUpdater):
    """Data parallel updater whose master weights and optimizer live on the host.

    Each device holds a replica of the optimizer's target and computes the
    gradients of its share of the batch. The backward runs chunk by chunk
    from the output end; as soon as a chunk is done on a device, its
    gradients go to the host accumulator, which sums the chunk over the
    devices, runs the optimizer's update rules for it and sends the new
    weights back, while the devices go on with the backward of earlier
    chunks. Only the last chunk's sync (the first layers') is exposed.

    Usable wherever :class:`~chainer.training.updaters.ParallelUpdater` is.
    The optimizer's target (the user's model) is the master: it is moved to
    host memory, and it holds the trained parameters whenever trainer
    extensions run and after training. BatchNormalization statistics stay
    per device; after each iteration those of the first device are copied
    to the master, so evaluation and snapshots use the first replica's, as
    with ``ParallelUpdater``, whose main model is the first device's.

    By default every replica runs in a worker process of its own
    (``workers='process'``), so that Chainer's Python work runs in parallel;
    the master's parameters and the gradient slots live in shared memory.
    The model (and ``loss_func``) must then be picklable, and a script that
    trains must guard its code with ``if __name__ == '__main__':``, since
    the workers import the script's module. ``workers='thread'`` runs the
    replicas as threads of this process instead (they then share the
    interpreter lock). Worker processes start at the first ``update()``
    and stay until :meth:`finalize`.

    Chunks come from the ``stages`` of the target, or of its ``predictor``
    for a :class:`~chainer.links.Classifier` (see ``docs/INTERFACES.md``).
    A target without stages is one chunk: it trains correctly, without
    overlap. ``'@numpy'`` replicas read the master's arrays; each gets
    ``blas_threads`` BLAS threads, since replicas that all use every core
    slow each other down.

    Args:
        iterator: Dataset iterator for the training dataset (or a dict with
            a ``'main'`` one), as for ``StandardUpdater``.
        optimizer (chainer.GradientMethod): Set up on the model to train;
            its hooks and state live on the host.
        devices (str or sequence): Device specifiers, one per replica:
            ``'@numpy'`` (may repeat) or ``'@cupy:N'``.
        chunk_size (int, sequence, str or callable): Stages per chunk; or
            the stage indices at which chunks start; or ``'auto'`` (the
            runtime search times the first iterations with growing chunk
            sizes and keeps the fastest) or ``'model'`` (chosen by the cost
            model from a profile of the first batch); or a chooser,
            ``chooser(replica, device, in_arrays, n_devices, loss_func,
            host_threads, workers) -> int``, called once before the first
            iteration on a copy of the model.
        reduction (str): ``'mean'``: the result equals one device training
            on the whole batch (``StandardUpdater``); ``'sum'``: it equals
            ``ParallelUpdater``.
        converter: Converter for each device's share of the batch; it is
            called in this process with the CPU device, and the arrays are
            sent to the replica's device there.
        loss_func (callable): For a staged target: ``loss_func(y, *labels)``
            computes the loss from the last stage's output (defaults to the
            target's ``head`` or its Classifier loss). For a target without
            stages: ``loss_func(*in_arrays)``, as in ``StandardUpdater``.
        timeline (cgdp_chainer.Timeline): Records every event if given.
        blas_threads (int or None): BLAS threads of each ``'@numpy'``
            replica; default: CPU cores divided by the CPU replicas.
        host_threads (int or None): Threads of the host accumulator;
            default: CPU cores, at most 4.
        mpi_comm: An mpi4py communicator: chunks are also summed across
            ranks (one process per node), see :mod:`cgdp_chainer.mpi`.
        auto_new_epoch (bool): As in ``StandardUpdater``.
        workers (str): ``'process'`` or ``'thread'``.
        start_method (str): How worker processes start: ``'spawn'`` or
            ``'forkserver'``.
    """

    def __init__(self, iterator, optimizer, devices, chunk_size=1,
                 reduction='mean', converter=convert.concat_examples,
                 loss_func=None, timeline=None, blas_threads=None,
                 host_threads=None, mpi_comm=None, auto_new_epoch=True,
                 workers='process', start_method='spawn'):
        _check_arguments(devices, reduction, timeline, blas_threads,
                         host_threads, workers, start_method, converter,
                         loss_func)
        super(CGDPUpdater, self).__init__(
            iterator, optimizer, converter=converter, loss_func=loss_func,
            auto_new_epoch=auto_new_epoch)
        self._devices = devices_module.parse_devices(devices)
        self.reduction = reduction
        self.timeline = timeline
        self.workers = workers
        self._start_method = start_method
        self._blas_threads = blas_threads
        self._host_threads = host_threads or max(1, min(4, blas.cpu_cores()))
        batch_size = getattr(self.get_iterator('main'), 'batch_size', None)
        if batch_size is not None and batch_size < len(self._devices):
            raise ValueError(
                'batch size {} is smaller than the number of devices ({}): '
                'every device needs at least one example'.format(
                    batch_size, len(self._devices)))
        optimizer = self.get_optimizer('main')
        master = optimizer.target
        master.to_device('@numpy')
        self._stages = chunking.find_stages(master)
        if self._stages is None:
            warnings.warn(
                '{} has no stages: CGDP trains it as one chunk, so the '
                'sync cannot overlap the backward'.format(
                    type(master).__name__), stacklevel=2)
        else:
            chunking.find_head(master, loss_func)  # fails early if none
            if len(self._stages) == 0:
                raise ValueError('{} has an empty stage list'.format(
                    type(master).__name__))
        self._search = None
        self._chooser = None
        self._set_chunk_size(self._initial_chunk_size(chunk_size))

        self._allreducer = None
        if mpi_comm is not None:
            from cgdp_chainer import mpi
            mpi.check_consistency(mpi_comm, master, optimizer)
            # Every rank starts from rank 0's weights, before replicas are
            # copied from the master.
            mpi.broadcast_parameters(mpi_comm, master)
            self._allreducer = mpi.ChunkAllreducer(mpi_comm)

        if workers == 'process':
            channels.check_picklable(master, loss_func)
        self._failures = accumulator_module.FailureBox()
        self._replicas = None
        self._accumulator = None
        self._refresh_persistents = False
        self._has_persistents = any(
            link._persistent for _, link in master.namedlinks())
        self._closed = False

    # -- chunking ---------------------------------------------------------

    @property
    def n_stages(self):
        return 1 if self._stages is None else len(self._stages)

    @property
    def chunks(self):
        """``(start, stop)`` stage ranges of the current chunks."""
        return list(self._chunks)

    @property
    def chunk_size(self):
        """The chunk size in use (``None`` when given as boundaries)."""
        return self._chunk_size

    @property
    def chunk_size_settled(self):
        """False while ``chunk_size='auto'`` is still trying sizes."""
        return self._search is None or self._search.done

    @property
    def chunk_size_search(self):
        """The ``'auto'`` search (its ``history`` and ``best``), or None."""
        return self._search

    @property
    def startup_seconds(self):
        """Seconds the worker processes took to start (None for threads,
        or before the first update)."""
        return getattr(self._replicas, 'startup_seconds', None)

    def signal_round_trip_seconds(self, repeats=100):
        """Median seconds of a message to every worker process and back: the
        cost of the per-chunk signals (None for thread workers, or before
        the first update)."""
        if self._replicas is None or self.workers != 'process':
            return None
        return self._replicas.round_trip_seconds(repeats)

    def _initial_chunk_size(self, chunk_size):
        if isinstance(chunk_size, str):
            if chunk_size != 'auto' and chunk_size not in \
                    _CHUNK_SIZE_POLICIES:
                raise ValueError(
                    'unknown chunk_size {!r}; use an int from 1 to {}, a '
                    'list of chunk boundaries, a chooser, or one of {}'.format(
                        chunk_size, self.n_stages,
                        ', '.join(chunk_size_policies())))
            if self._stages is None:
                return 1
            if chunk_size == 'auto':
                from cgdp_chainer import chunk_search
                self._search = chunk_search.ChunkSizeSearch(self.n_stages)
                return self._search.current_size
            self._chooser = _CHUNK_SIZE_POLICIES[chunk_size]()
            return 1  # until the chooser has seen the first batch
        if callable(chunk_size):
            if self._stages is not None:
                self._chooser = chunk_size
            return 1
        if self._stages is None:
            if chunk_size not in (1, [0], (0,)):
                raise ValueError(
                    'chunk_size={!r} needs a model with stages; this one '
                    'has none, so it is one chunk'.format(chunk_size))
            return 1
        return chunk_size

    def _set_chunk_size(self, chunk_size):
        self._chunks = chunking.plan_chunks(self.n_stages, chunk_size)
        self._chunk_size = chunk_size if isinstance(chunk_size, int) else None
        master = self.get_optimizer('main').target
        if self._stages is None:
            self._chunk_names = [[n for n, _ in master.namedparams()]]
        else:
            self._chunk_names = chunking.assign_parameters(
                master, self._stages, self._chunks)
        if getattr(self, '_accumulator', None) is not None:
            self._accumulator.chunk_names = self._chunk_names

    # -- the iteration ----------------------------------------------------

    def update_core(self):
        if self._closed:
            raise RuntimeError(
                'this CGDPUpdater was finalized or stopped after an error')
        iterator = self.get_iterator('main')
        batch = iterator.next()
        n = len(self._devices)
        if len(batch) < n:
            raise ValueError(
                'the batch has {} examples, fewer than the {} devices'.format(
                    len(batch), n))
        host = chainer.get_device('@numpy')
        inputs = [convert._call_converter(self.converter, batch[i::n], host)
                  for i in range(n)]
        shares = [len(batch[i::n]) / len(batch) for i in range(n)]
        if self._replicas is None:
            self._start(inputs[0])

        timeline = self.timeline
        start = timeline.now() if timeline is not None else None
        # Drawn here, in the calling thread, so that a seeded run (and its
        # resume) gives every replica the same dropout masks again.
        seeds = numpy.random.randint(0, 2 ** 31 - 1, size=n).tolist()
        refresh = (worker_module.save_persistents(
            self.get_optimizer('main').target)
            if self._refresh_persistents else None)
        self._refresh_persistents = False
        config = worker_module.caller_config()
        jobs = [worker_module.Job(
            iteration=self.iteration, seed=seeds[i], chunks=self._chunks,
            chunk_names=self._chunk_names,
            record_events=timeline is not None,
            send_persistents=(i == 0 and self._has_persistents),
            persistents=refresh, config=config) for i in range(n)]
        self._accumulator.start_iteration(self.iteration, shares)
        search_start = time.perf_counter()
        try:
            results = self._replicas.run(jobs, inputs)
            if not self._failures.failed:
                self._accumulator.wait()
        except BaseException as interruption:  # Ctrl-C while waiting
            # Every thread and worker stops at its next check; the caller
            # gets the interruption and finalize() ends them.
            self._failures.fail(interruption, 'caller')
            raise
        seconds = time.perf_counter() - search_start
        sync_end = timeline.now() if timeline is not None else None
        if self._failures.failed:
            self._stop_replicas()
            raise self._failures.error

        master = self.get_optimizer('main').target
        if results[0].persistents is not None:
            worker_module.load_persistents(master, results[0].persistents,
                                           host)
        self._report([r.observation for r in results], shares)
        if timeline is not None:
            for index, result in enumerate(results):
                for kind, chunk, begin, end in result.events:
                    timeline.record(self.iteration, index, kind, chunk,
                                    begin - timeline.origin,
                                    end - timeline.origin)
            timeline.end_iteration(self.iteration, start, timeline.now(),
                                   sync_end)
        if self._search is not None:
            # The size this iteration ran with; LogReport keeps the trail.
            chainer.report({'cgdp/chunk_size': self._chunk_size})
            if not self._search.done:
                self._advance_search(seconds)

        if self.auto_new_epoch and iterator.is_new_epoch:
            self.get_optimizer('main').new_epoch(auto=True)

    def _start(self, sample_inputs):
        """Chooses the chunk size if a chooser is waiting, then builds the
        replicas, the host accumulator and starts the workers."""
        optimizer = self.get_optimizer('main')
        master = optimizer.target
        if self._chooser is not None:
            self._choose_chunk_size(master, sample_inputs)
        if self.workers == 'process':
            replicas = channels.ProcessReplicas(
                master, self._devices, self.loss_func, self._failures,
                blas_threads=self._blas_threads,
                start_method=self._start_method)
        else:
            replicas = channels.ThreadReplicas(
                master, self._devices, self.loss_func, self._failures,
                blas_threads=self._blas_threads)
        try:
            self._accumulator = accumulator_module.HostAccumulator(
                optimizer, replicas.ports, self._chunk_names,
                self.reduction, self._failures,
                n_threads=self._host_threads, timeline=self.timeline,
                allreducer=self._allreducer)
            self._replicas = replicas
            replicas.start(self._accumulator.deliver)
        except BaseException:
            self._replicas = replicas
            self._stop_replicas()
            raise

    def _report(self, observations, shares):
        totals = {}
        for observation, share in zip(observations, shares):
            for key, value in observation.items():
                totals[key] = totals.get(key, 0.0) + share * value
        chainer.report(totals)

    def _choose_chunk_size(self, master, sample_inputs):
        device = self._devices[0]
        replica = copy.deepcopy(master)
        replica.to_device(device)
        # The profile runs the replica's loss, which reports to its own
        # observers; a private reporter keeps that out of the Trainer's.
        reporter = chainer.Reporter()
        reporter.add_observer('main', replica)
        reporter.add_observers('main', replica.namedlinks(skipself=True))
        with reporter.scope({}):
            size = self._chooser(
                replica, device, device.send(sample_inputs),
                len(self._devices), self.loss_func,
                self._host_threads,
                self.workers)
        del replica
        if self._allreducer is not None:
            # Ranks profile separately; all must cut the model alike.
            size = self._allreducer.allreduce_int(
                size if self._allreducer.rank == 0 else 0, op='max')
        self._chooser = None
        self._set_chunk_size(size)

    def _advance_search(self, seconds):
        if self._allreducer is not None:
            # Every rank must pick the same size: judge by the slowest.
            seconds = self._allreducer.allreduce_scalar(seconds, op='max')
        self._search.record(seconds)
        if self._search.done:
            print('CGDP chunk-size search: chose {} from (size, seconds) {}'
                  .format(self._search.best, self._search.history),
                  flush=True)
        self._set_chunk_size(self._search.current_size)

    # -- state ------------------------------------------------------------

    def serialize(self, serializer):
        """Saves or restores the master weights, persistents, optimizer
        state, iterator and iteration; restoring also refreshes every
        replica from the master."""
        super(CGDPUpdater, self).serialize(serializer)
        if isinstance(serializer, chainer.serializer.Deserializer) and \
                self._replicas is not None:
            for port in self._replicas.ports:
                for chunk, names in enumerate(self._chunk_names):
                    port.publish(chunk, names)
            self._refresh_persistents = True

    def finalize(self):
        """Stops every CGDP thread and worker process and closes the
        iterators."""
        self._stop_replicas()
        super(CGDPUpdater, self).finalize()

    def _stop_replicas(self):
        if self._closed:
            return
        self._closed = True
        if self._replicas is not None:
            self._replicas.close()
        if self._accumulator is not None:
            self._accumulator.close()
        if self._allreducer is not None:
            self._allreducer.close()


def _check_arguments(devices, reduction, timeline, blas_threads,
                     host_threads, workers, start_method, converter,
                     loss_func):
    """Raises ValueError naming the first wrong argument of CGDPUpdater."""
    if devices is None or not isinstance(devices, (str, list, tuple)):
        raise ValueError(
            'devices must be a list of device specifiers, one per replica '
            "(such as ['@numpy', '@numpy'] or ['@cupy:0', '@cupy:1']) or a "
            "comma-separated string; got {!r}".format(devices))
    if reduction not in REDUCTIONS:
        raise ValueError('unknown reduction {!r}; valid: {}'.format(
            reduction, ', '.join(REDUCTIONS)))
    if workers not in WORKER_KINDS:
        raise ValueError('unknown workers {!r}; valid: {}'.format(
            workers, ', '.join(WORKER_KINDS)))
    if start_method not in channels.START_METHODS:
        raise ValueError('unknown start_method {!r}; valid: {}'.format(
            start_method, ', '.join(channels.START_METHODS)))
    blas.threads_per_replica(2, blas_threads)  # raises on a bad value
    if host_threads is not None and (
            isinstance(host_threads, bool) or
            not isinstance(host_threads, numbers.Integral) or
            host_threads < 1):
        raise ValueError(
            'host_threads must be a positive integer or None (CPU cores, '
            'at most 4); got {!r}'.format(host_threads))
    if timeline is not None and not all(
            hasattr(timeline, name) for name in
            ('record', 'span', 'end_iteration', 'now')):
        raise ValueError(
            'timeline must be a cgdp_chainer.Timeline or None; got '
            '{!r}'.format(timeline))
    if not callable(converter):
        raise ValueError('converter must be callable; got {!r}'.format(
            converter))
    if loss_func is not None and not callable(loss_func):
        raise ValueError('loss_func must be callable or None; got '
                         '{!r}'.format(loss_func))
