"""CGDPUpdater: CPU-GPU data parallel training as a Chainer updater."""
import copy
import os
import queue
import threading
import time
import warnings

import chainer
from chainer.dataset import convert
from chainer.training.updaters import standard_updater
import numpy

from cgdp_chainer import accumulator as accumulator_module
from cgdp_chainer import chunking
from cgdp_chainer import devices as devices_module
from cgdp_chainer import randomness
from cgdp_chainer.runtime import transfer as transfer_module

REDUCTIONS = ('mean', 'sum')
CHUNK_SIZE_MODES = ('auto', 'model')


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

    Chunks come from the ``stages`` of the target, or of its ``predictor``
    for a :class:`~chainer.links.Classifier` (see ``docs/INTERFACES.md``).
    A target without stages is one chunk: it trains correctly, without
    overlap. On ``'@numpy'`` replicas the hand-over costs no copy (replicas
    read the master's arrays and lend their gradient arrays); each replica
    thread then gets ``blas_threads`` BLAS threads, since replicas that all
    use every core slow each other down.

    Args:
        iterator: Dataset iterator for the training dataset (or a dict with
            a ``'main'`` one), as for ``StandardUpdater``.
        optimizer (chainer.GradientMethod): Set up on the model to train;
            its hooks and state live on the host.
        devices (str or sequence): Device specifiers, one per replica:
            ``'@numpy'`` (may repeat) or ``'@cupy:N'``.
        chunk_size (int, sequence, str): Stages per chunk; or the stage
            indices at which chunks start; or ``'auto'`` (the runtime search
            times the first iterations with growing chunk sizes and keeps the
            fastest) or ``'model'`` (chosen by the cost model from a profile
            of the first batch).
        reduction (str): ``'mean'``: the result equals one device training
            on the whole batch (``StandardUpdater``); ``'sum'``: it equals
            ``ParallelUpdater``.
        converter: Converter for each device's share of the batch.
        loss_func (callable): For a staged target: ``loss_func(y, *labels)``
            computes the loss from the last stage's output (defaults to the
            target's ``head`` or its Classifier loss). For a target without
            stages: ``loss_func(*in_arrays)``, as in ``StandardUpdater``.
        timeline (cgdp_chainer.Timeline): Records every event if given.
        blas_threads (int or None): BLAS threads while ``'@numpy'`` replicas
            compute; default: CPU cores divided by the number of replicas.
        host_threads (int or None): Threads of the host accumulator.
        mpi_comm: An mpi4py communicator: chunks are also summed across
            ranks (one process per node), see :mod:`cgdp_chainer.mpi`.
        auto_new_epoch (bool): As in ``StandardUpdater``.
    """

    def __init__(self, iterator, optimizer, devices, chunk_size=1,
                 reduction='mean', converter=convert.concat_examples,
                 loss_func=None, timeline=None, blas_threads=None,
                 host_threads=None, mpi_comm=None, auto_new_epoch=True):
        super(CGDPUpdater, self).__init__(
            iterator, optimizer, converter=converter, loss_func=loss_func,
            auto_new_epoch=auto_new_epoch)
        self._devices = devices_module.parse_devices(devices)
        if reduction not in REDUCTIONS:
            raise ValueError('unknown reduction {!r}; valid: {}'.format(
                reduction, ', '.join(REDUCTIONS)))
        self.reduction = reduction
        self.timeline = timeline
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
            self._head = None
        else:
            self._head = chunking.find_head(master, loss_func)
            if len(self._stages) == 0:
                raise ValueError('{} has an empty stage list'.format(
                    type(master).__name__))
        self._search = None
        self._requested_chunk_size = chunk_size
        self._set_chunk_size(self._initial_chunk_size(chunk_size))

        allreducer = None
        self._mpi_comm = mpi_comm
        if mpi_comm is not None:
            from cgdp_chainer import mpi
            mpi.check_consistency(mpi_comm, master, optimizer)
            # Every rank starts from rank 0's weights, before replicas are
            # copied from the master.
            mpi.broadcast_parameters(mpi_comm, master)
            allreducer = mpi.ChunkAllreducer(mpi_comm)
        self._allreducer = allreducer

        self._failures = accumulator_module.FailureBox()
        self._replicas = []
        self._transfers = []
        master_params = dict(master.namedparams())
        if any(devices_module.is_gpu(d) for d in self._devices):
            transfer_module.pin_master(master_params)
        for device in self._devices:
            replica = copy.deepcopy(master)
            replica.to_device(device)
            self._replicas.append(replica)
            self._transfers.append(transfer_module.make_transfer(
                device, master_params, dict(replica.namedparams())))
        self._accumulator = accumulator_module.HostAccumulator(
            optimizer, self._transfers, self._chunk_names, reduction,
            self._failures, n_threads=host_threads, timeline=timeline,
            allreducer=allreducer)
        self._blas_limiter = _BlasLimiter(self._devices, blas_threads)
        self._workers = [
            _DeviceWorker(i, device, replica, transfer, self)
            for i, (device, replica, transfer) in enumerate(
                zip(self._devices, self._replicas, self._transfers))]
        self._started = False
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

    def _initial_chunk_size(self, chunk_size):
        if isinstance(chunk_size, str):
            if chunk_size not in CHUNK_SIZE_MODES:
                raise ValueError(
                    'unknown chunk_size {!r}; use an int from 1 to {}, a '
                    'list of chunk boundaries, or one of {}'.format(
                        chunk_size, self.n_stages,
                        ', '.join(CHUNK_SIZE_MODES)))
            if self._stages is None:
                return 1
            if chunk_size == 'auto':
                from cgdp_chainer import chunk_search
                self._search = chunk_search.ChunkSizeSearch(self.n_stages)
                return self._search.current_size
            return 1  # 'model': chosen from the first batch
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
        if self._stages is None:
            self._chunk_names = [[n for n, _ in
                                  self.get_optimizer('main')
                                  .target.namedparams()]]
        else:
            self._chunk_names = chunking.assign_parameters(
                self.get_optimizer('main').target, self._stages,
                self._chunks)
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
        shares_batches = [batch[i::n] for i in range(n)]
        shares = [len(b) / len(batch) for b in shares_batches]
        if self._requested_chunk_size == 'model' and \
                self._stages is not None and not getattr(
                    self, '_model_chosen', False):
            self._choose_chunk_size_from_model(shares_batches[0])
        if not self._started:
            for worker in self._workers:
                worker.start()
            self._started = True

        timeline = self.timeline
        start = timeline.now() if timeline is not None else None
        plan = _IterationPlan(self.iteration, self._chunks,
                              self._chunk_names, len(self._workers))
        # Drawn here, in the calling thread, so that a seeded run (and its
        # resume) gives every replica the same dropout masks again.
        plan.seeds = numpy.random.randint(0, 2 ** 31 - 1, size=n).tolist()
        self._accumulator.start_iteration(self.iteration, shares)
        try:
            with self._blas_limiter:
                for worker, sub_batch in zip(self._workers, shares_batches):
                    worker.jobs.put((plan, sub_batch))
                plan.wait_workers(self._failures)
                if not self._failures.failed:
                    self._accumulator.wait()
        except BaseException as interruption:  # Ctrl-C while waiting
            # Every thread stops at its next check; the caller gets the
            # interruption and finalize() ends the threads.
            self._failures.fail(interruption, 'caller')
            raise
        sync_end = timeline.now() if timeline is not None else None
        if self._failures.failed:
            self._stop_threads()
            raise self._failures.error

        self._copy_persistents_to_master()
        self._report(plan.observations, shares)
        if timeline is not None:
            end = timeline.now()
            timeline.end_iteration(self.iteration, start, end, sync_end)
        if self._search is not None:
            # The size this iteration ran with; LogReport keeps the trail.
            chainer.report({'cgdp/chunk_size': self._chunk_size})
            if not self._search.done:
                self._advance_search(plan)

        if self.auto_new_epoch and iterator.is_new_epoch:
            self.get_optimizer('main').new_epoch(auto=True)

    def _report(self, observations, shares):
        totals = {}
        for observation, share in zip(observations, shares):
            for key, value in observation.items():
                totals[key] = totals.get(key, 0.0) + share * value
        chainer.report(totals)

    def _copy_persistents_to_master(self):
        _copy_persistents(self._replicas[0],
                          self.get_optimizer('main').target,
                          chainer.get_device('@numpy'))

    def _choose_chunk_size_from_model(self, sample_batch):
        from cgdp_chainer import costmodel
        # The profile runs the first replica's loss, which reports to its
        # own observers; a private reporter keeps that out of the Trainer's.
        reporter = chainer.Reporter()
        replica = self._replicas[0]
        reporter.add_observer('main', replica)
        reporter.add_observers('main', replica.namedlinks(skipself=True))
        with reporter.scope({}):
            size = costmodel.choose_chunk_size_for_updater(self, sample_batch)
        if self._allreducer is not None:
            # Ranks profile separately; all must cut the model alike.
            size = self._allreducer.allreduce_int(
                size if self._allreducer.rank == 0 else 0, op='max')
        self._model_chosen = True
        self._set_chunk_size(size)

    def _advance_search(self, plan):
        seconds = plan.duration()
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
        if isinstance(serializer, chainer.serializer.Deserializer):
            self._broadcast_master()

    def _broadcast_master(self):
        master = self.get_optimizer('main').target
        for transfer in self._transfers:
            for chunk, names in enumerate(self._chunk_names):
                transfer.publish(chunk, names)
        for replica, device in zip(self._replicas, self._devices):
            _copy_persistents(master, replica, device)

    def finalize(self):
        """Stops every CGDP thread and closes the iterators."""
        self._stop_threads()
        super(CGDPUpdater, self).finalize()

    def _stop_threads(self):
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.jobs.put(None)
        for worker in self._workers:
            if worker.is_alive():
                worker.join(timeout=60)
        self._accumulator.close()
        if self._allreducer is not None:
            self._allreducer.close()
        for transfer in self._transfers:
            transfer.close()


def _copy_persistents(source, destination, device):
    """Copies persistent values (BatchNorm statistics and the like) between
    two copies of one model, sending arrays to ``device``."""
    destination_links = dict(destination.namedlinks())
    for path, link in source.namedlinks():
        target = destination_links[path]
        for name in link._persistent:
            value = link.__dict__[name]
            current = target.__dict__[name]
            if value is None or numpy.isscalar(value) or not hasattr(
                    value, 'shape'):
                setattr(target, name, copy.copy(value))
                continue
            value = device.send(value)
            if value is current:
                continue
            if getattr(current, 'shape', None) == value.shape and \
                    type(current) is type(value):
                current[...] = value
            else:
                setattr(target, name, value.copy())


class _IterationPlan(object):
    """What every worker needs for one iteration, and their completion."""

    def __init__(self, iteration, chunks, chunk_names, n_workers):
        self.iteration = iteration
        self.chunks = chunks
        self.chunk_names = chunk_names
        self.observations = [{} for _ in range(n_workers)]
        self._pending = n_workers
        self._cond = threading.Condition()
        self._start = None
        self._end = None

    def worker_done(self):
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()

    def wait_workers(self, failures, poll_seconds=0.05):
        self._start = time.perf_counter()
        with self._cond:
            while self._pending > 0 and not failures.failed:
                self._cond.wait(poll_seconds)

    def duration(self):
        return time.perf_counter() - self._start


class _DeviceWorker(threading.Thread):
    """The thread that runs one replica's forward and chunked backward."""

    def __init__(self, index, device, replica, transfer, updater):
        super(_DeviceWorker, self).__init__(
            name='cgdp-device-{}'.format(index), daemon=True)
        self.index = index
        self.device = device
        self.replica = replica
        self.transfer = transfer
        self.jobs = queue.Queue()
        self._updater = updater
        self._where = 'device worker {} ({})'.format(index, device)

    def run(self):
        with _device_scope(self.device):
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                plan, sub_batch = job
                try:
                    if not self._updater._failures.failed:
                        with randomness.thread_random_state(
                                plan.seeds[self.index]):
                            self._iterate(plan, sub_batch)
                except accumulator_module.Aborted:
                    pass
                except BaseException as error:
                    self._updater._failures.fail(error, self._where)
                finally:
                    plan.worker_done()

    def _check(self):
        if self._updater._failures.failed:
            raise accumulator_module.Aborted()

    def _iterate(self, plan, sub_batch):
        updater = self._updater
        replica = self.replica
        clock = _Clock(updater.timeline, self.transfer, plan.iteration,
                       self.index)
        replica.cleargrads()
        in_arrays = convert._call_converter(
            updater.converter, sub_batch, self.device)
        reporter = chainer.Reporter()
        reporter.add_observer('main', replica)
        reporter.add_observers('main', replica.namedlinks(skipself=True))
        observation = {}
        accumulator = updater._accumulator
        with reporter.scope(observation), \
                chainer.using_config('enable_backprop', True):
            if updater._stages is None:
                token = clock.stamp()
                loss_func = updater.loss_func or replica
                loss = _call_with(loss_func, in_arrays)
                clock.add('forward', 0, token)
                token = clock.stamp()
                loss.backward()
                clock.add('backward', 0, token)
                accumulator.deliver(self.index, 0, self.transfer.send_grads(
                    plan.chunk_names[0]))
            else:
                if not isinstance(in_arrays, tuple):
                    in_arrays = (in_arrays,)
                stages = chunking.find_stages(replica)
                head = chunking.find_head(replica, updater.loss_func)
                chunked = chunking.ChunkedPass(stages, plan.chunks, head)
                carry = in_arrays[0]
                last = len(plan.chunks) - 1
                for c in range(len(plan.chunks)):
                    self._check()
                    self.transfer.wait_params(c)
                    token = clock.stamp()
                    carry = chunked.forward_chunk(c, carry)
                    if c == last:
                        chunked.forward_head(in_arrays[1:])
                    clock.add('forward', c, token)
                for c in range(last, -1, -1):
                    self._check()
                    token = clock.stamp()
                    chunked.backward_chunk(c)
                    clock.add('backward', c, token)
                    accumulator.deliver(
                        self.index, c,
                        self.transfer.send_grads(plan.chunk_names[c]))
        plan.observations[self.index] = {
            key: float(chainer.backends.cuda.to_cpu(
                getattr(value, 'array', value)))
            for key, value in observation.items()}
        clock.flush()


def _call_with(func, in_arrays):
    if isinstance(in_arrays, tuple):
        return func(*in_arrays)
    if isinstance(in_arrays, dict):
        return func(**in_arrays)
    return func(in_arrays)


class _Clock(object):
    """Timestamps on a device's own order of work: the host clock for CPU
    replicas; CUDA events, converted to the host clock afterwards, for GPUs
    (host-side times would only show when work was queued)."""

    def __init__(self, timeline, transfer, iteration, device_index):
        self.timeline = timeline
        self.iteration = iteration
        self.device_index = device_index
        self.gpu = transfer.is_gpu and timeline is not None
        self._transfer = transfer
        self._pending = []
        if self.gpu:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            self._base_event = transfer.record()
            self._base_event.synchronize()
            self._base_time = timeline.now()

    def stamp(self):
        if self.timeline is None:
            return None
        if self.gpu:
            return self._transfer.record()
        return self.timeline.now()

    def add(self, kind, chunk, start_token):
        if self.timeline is None:
            return
        self._pending.append((kind, chunk, start_token, self.stamp()))

    def flush(self):
        if self.timeline is None:
            return
        if self.gpu:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
        for kind, chunk, start, end in self._pending:
            if self.gpu:
                start = self._base_time + cupy.cuda.get_elapsed_time(
                    self._base_event, start) / 1000.0
                end = self._base_time + cupy.cuda.get_elapsed_time(
                    self._base_event, end) / 1000.0
            self.timeline.record(self.iteration, self.device_index, kind,
                                 chunk, start, end)
        self._pending = []


class _device_scope(object):
    """Makes the worker's GPU current, with its own compute stream."""

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
        return False


class _BlasLimiter(object):
    """Limits BLAS threads while CPU replicas compute side by side."""

    def __init__(self, devices, blas_threads):
        cpu_replicas = sum(1 for d in devices if not devices_module.is_gpu(d))
        if blas_threads is None:
            if cpu_replicas < 2:
                self._limit = None
            else:
                self._limit = max(1, (os.cpu_count() or 1) // cpu_replicas)
        else:
            if blas_threads < 1:
                raise ValueError(
                    'blas_threads must be at least 1; got {}'.format(
                        blas_threads))
            self._limit = blas_threads
        self._controller = None
        self._active = None
        if self._limit is not None:
            import threadpoolctl
            self._controller = threadpoolctl.ThreadpoolController()

    @property
    def limit(self):
        return self._limit

    def __enter__(self):
        if self._controller is not None:
            self._active = self._controller.limit(
                limits=self._limit, user_api='blas')
        return self

    def __exit__(self, *exc):
        if self._active is not None:
            self._active.restore_original_limits()
            self._active = None
        return False
