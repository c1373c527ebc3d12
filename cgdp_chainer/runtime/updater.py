"""CGDPUpdater: CPU-GPU data parallel training as a Chainer updater."""
import contextlib
import time

import chainer
from chainer.dataset import convert
from chainer.training.updaters import standard_updater

from cgdp_chainer.runtime import call_forms
from cgdp_chainer.runtime.host import accumulator as accumulator_module
from cgdp_chainer import blas
from cgdp_chainer import devices as devices_module
from cgdp_chainer import log
from cgdp_chainer.runtime.workers import channels
from cgdp_chainer.runtime.workers import replica_persistents
from cgdp_chainer.runtime.chunks import chunk_choice
from cgdp_chainer.runtime.chunks import plan_in_use
from cgdp_chainer.runtime.chunks import chunking
from cgdp_chainer.runtime.replica import batch_statistics
from cgdp_chainer.runtime.replica import device_view
from cgdp_chainer.runtime.input import input_path
from cgdp_chainer.runtime.host import master as master_module
from cgdp_chainer.runtime.replica import loss_reduction
from cgdp_chainer.runtime.replica import observations
from cgdp_chainer.runtime.replica import random_streams
from cgdp_chainer.runtime.replica import readiness
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.replica import static_graph_models
from cgdp_chainer.runtime.workers import worker as worker_module

REDUCTIONS = call_forms.REDUCTIONS
WORKER_KINDS = channels.WORKER_KINDS

DEFAULT_CHUNK_BYTES = chunking.DEFAULT_CHUNK_BYTES


class CGDPUpdater(standard_updater.StandardUpdater):
    """Data parallel updater with master weights and optimizer on the host.

    Each device holds a replica of the optimizer's target and computes the
    gradients of its share of the batch with an ordinary forward and one
    backward. As soon as the gradients of a chunk of layers are final on a
    device, they go to the host, which sums the chunk over the devices,
    runs the optimizer's update rules for it and sends the new weights
    back, while the devices go on with the backward of earlier layers. Only
    the last chunk's sync (the first layers') is exposed, and the next
    forward of a layer waits only for its own chunk's new weights.

    It takes the call forms of Chainer's updaters, so that switching a
    script is one line, and the switched script trains what it trained
    before (parameters, ``param.grad``, reported values, random streams,
    resume); the optimizer's target (the user's model) is the master, in
    host memory, and holds the trained parameters whenever extensions run.
    docs/USAGE.md says how each of these holds, and what is refused::

        updater = cgdp_chainer.CGDPUpdater(   # was: StandardUpdater(...)
            train_iter, optimizer, devices=['@cupy:0', '@cupy:1'])
        trainer = chainer.training.Trainer(updater, (20, 'epoch'))

    Args:
        iterator: Dataset iterator for the training dataset (or a dict with
            a ``'main'`` one), as for ``StandardUpdater``, whose batch is
            split over the devices; or a list or tuple of iterators, one
            per device, as for ``MultiprocessParallelUpdater``.
        optimizer (chainer.GradientMethod): Set up on the model to train;
            its hooks and state live on the host.
        devices (str, sequence or dict): The devices, one per replica: a
            list or tuple, a comma-separated string, or a dict with a
            ``'main'`` key (main first, then the others in the dict's
            order). Each is ``'@numpy'`` or a negative integer (a CPU
            replica; may repeat), ``'@cupy:N'`` or an integer ``N >= 0``
            (GPU ``N``), integers also as strings (``'-1'``), or a
            ``chainer.backend.Device`` of those kinds. ChainerX and iDeep
            devices are refused.
        chunk_size (int, sequence, str, callable or None): Layers per chunk,
            counted in backward order from the output end (a shorter
            remainder is the input-side chunk); or the layer indices, in
            backward order (0 is the output-side layer), at which chunks
            start; or ``'auto'`` (the runtime search times iterations with
            doubling chunk sizes and keeps the fastest) or ``'model'``
            (chosen by the cost model from a profile of the first batch);
            or a chooser, ``chooser(replica, device, in_arrays, n_devices,
            loss_func, host_threads, workers) -> int`` (layers per chunk; a
            value above the number of layers means one chunk), called once
            before the first iteration on a copy of the model. Default:
            chunks of about :data:`DEFAULT_CHUNK_BYTES` (see
            ``chunk_bytes``).
        chunk_bytes (int or None): Instead of ``chunk_size``: consecutive
            layers join a chunk until it holds at least this many bytes of
            parameters (PyTorch DDP's buckets).
        reduction (str or None): ``'mean'``: the devices' gradients are
            averaged, weighted by each device's share of the examples (a
            loss that is a mean over the examples then trains as
            ``StandardUpdater`` on the whole batch); ``'sum'``: they are
            summed (a loss that adds up over the examples; ``ParallelUpdater``
            sums them). ``None`` (default): ``'sum'`` for a dict of devices,
            otherwise found from the loss at the first iteration, before
            any update (:mod:`~cgdp_chainer.runtime.replica.loss_reduction`;
            a line of the log says what was found), or refused with the
            values measured where it cannot be told; a mean found is
            compared again before later updates until two more batches
            show it, and a batch that does not is refused before its
            update. ``updater.reduction`` holds the choice.
        converter: Converter for each device's share of the batch, called
            in this process with the CPU device (any nesting of arrays,
            tuples, lists and dicts; a batch that is not a list of examples
            is converted whole and split along the first axis, see
            :mod:`~cgdp_chainer.runtime.input.batches`). With a
            ``SerialIterator`` the next batch is read and converted in a
            background thread while an iteration computes (see
            :mod:`~cgdp_chainer.runtime.input.input_path`).
        loss_func (callable): ``loss_func(*in_arrays)`` returns the loss,
            as in ``StandardUpdater``; by default the target itself.
        loss_scale (float or None): Loss scaling factor, as in
            ``StandardUpdater`` (``optimizer.set_loss_scale(loss_scale)``);
            ``optimizer.loss_scaling()`` (dynamic) works too.
        timeline (cgdp_chainer.Timeline): Records every event if given.
        blas_threads (int or None): BLAS threads of each ``'@numpy'``
            replica; default: CPU cores divided by the CPU replicas.
        host_threads (int or None): Threads of the host accumulator;
            default: CPU cores, at most 4.
        mpi_comm: An mpi4py (or ChainerMN) communicator: chunks are also
            summed across ranks (one process per node), see
            :mod:`cgdp_chainer.mpi`. An optimizer made by ChainerMN's
            ``create_multi_node_optimizer(optimizer, comm)`` does the same
            over ``comm`` (CGDP then runs ``optimizer`` on the host; the
            first ``update()`` broadcasts, as ChainerMN's).
        auto_new_epoch (bool): As in ``StandardUpdater``.
        workers (str): ``'process'`` or ``'thread'``.
        start_method (str): How worker processes start: ``'spawn'`` or
            ``'forkserver'``.
        report_kinds (dict or None): Reported keys (``'main/total'``) to
            ``'sum'`` or ``'mean'``: how they combine over the devices,
            over what the first iteration found (keys it could not tell,
            or that first appear later, go by type: integers add up,
            anything else is a mean).
        device_copies (callable or None): Tests: ``device_copies(device)``
            stands in for CuPy's copies, and ``'@numpy'`` thread replicas
            take the GPU path (as for ``create_multi_node_optimizer``).
        device: Refused: StandardUpdater's keyword for its one device;
            the TypeError names ``devices=[device, device]``.
    """

    # The batches' source (made at the first update).
    _input_path = None
    # The ReductionFinder while 'mean' found awaits later batches.
    _reduction_finder = None

    def __init__(self, iterator, optimizer, devices=None, chunk_size=None,
                 reduction=None, converter=convert.concat_examples,
                 loss_func=None, timeline=None, blas_threads=None,
                 host_threads=None, mpi_comm=None, auto_new_epoch=True,
                 workers='process', start_method='spawn', chunk_bytes=None,
                 loss_scale=None, report_kinds=None, device_copies=None,
                 device=None):
        call_forms.check_devices_keyword(devices, device)
        call_forms.check_arguments(reduction, timeline, blas_threads, host_threads,
                         workers, start_method, converter, loss_func)
        call_forms.check_device_copies(device_copies, workers, timeline)
        self._device_copies = device_copies
        self._report_kinds = observations.ReportKinds(report_kinds)
        self._devices = devices_module.parse_devices(devices)
        # One iterator per device (MultiprocessParallelUpdater's form), or
        # None: the devices split the 'main' iterator's batch.
        self._device_iterators = call_forms.device_iterators(iterator,
                                                   len(self._devices))
        if self._device_iterators is not None:
            iterator = call_forms.iterator_names(self._device_iterators)
        super(CGDPUpdater, self).__init__(
            iterator, optimizer, converter=converter, loss_func=loss_func,
            loss_scale=loss_scale, auto_new_epoch=auto_new_epoch)
        self.reduction = reduction if reduction is not None else \
            call_forms.default_reduction(devices, self._device_iterators is not None)
        self.timeline = timeline
        self.workers = workers
        self._start_method = start_method
        self._blas_threads = blas_threads
        self._host_threads = host_threads or max(1, min(4, blas.cpu_cores()))
        if self._device_iterators is None:
            call_forms.check_batch_size(self.get_iterator('main'), len(self._devices))
        optimizer = self.get_optimizer('main')
        master = optimizer.target
        self._take_master(master, chunk_size, chunk_bytes)

        # A ChainerMN multi-node optimizer trains across its communicator:
        # CGDP runs the optimizer it wraps (see cgdp_chainer.mpi).
        from cgdp_chainer import mpi
        self._ranks = mpi.UpdaterRanks(
            optimizer, mpi_comm,
            lambda error: self._failures.fail(error, 'update count watch'))
        self._optimizers['main'] = self._ranks.optimizer
        if loss_scale is not None:  # the one CGDP runs
            self._ranks.optimizer.set_loss_scale(loss_scale)
        channels.check_replicable(master, loss_func, workers)
        self._batch_statistics = batch_statistics.BatchStatisticsNotice(
            master, len(self._devices), 'CGDPUpdater')
        # Said at the first update, once per run (on rank 0 under MPI).
        self._static_graph_methods = static_graph_models.decorated_methods(
            master, loss_func)
        self._failures = accumulator_module.FailureBox()
        self._streams = random_streams.ReplicaStreams(self._devices, workers)
        self._replicas = None
        # Worker processes launched ahead (see _iterate) until the replicas
        # take them.
        self._launched = None
        self._accumulator = None
        self._persistents = replica_persistents.ReplicaPersistents(master)
        self._structure = None    # MasterStructure, once replicas exist
        self._watch = master_module.TrainerWatch(self.sync_persistents)
        self._closed = False
        # Evaluator(..., device=devices[0]) evaluates there, as with
        # ParallelUpdater (the model itself stays in host memory).
        self._device_view = None
        if devices_module.is_gpu(self._devices[0]):
            self._device_view = device_view.DeviceView(
                master, self._devices[0], lambda: self.iteration)
            self._device_view.install()

    def _take_master(self, master, chunk_size, chunk_bytes):
        """Moves the master to the host and sets up its chunking; a model
        without parameters is refused."""
        master.to_device('@numpy')
        self._names = [name for name, _ in master.namedparams()]
        if not self._names:
            raise ValueError('{} has no parameters: there is nothing to '
                             'train'.format(type(master).__name__))
        self._n_layers = readiness.count_layers(master)
        self._plans = plan_in_use.PlanInUse(
            chunk_choice.ChunkChoice(chunk_size, chunk_bytes,
                                     self._n_layers),
            master)

    def connect_trainer(self, trainer):
        """Follows ``trainer``'s extensions: replica 0's BatchNormalization
        statistics come to the master before one that may read the model
        runs, rather than after every iteration."""
        super(CGDPUpdater, self).connect_trainer(trainer)
        self._watch.connect(trainer)

    # -- chunking ---------------------------------------------------------

    @property
    def n_layers(self):
        """Layers of the model: links that directly own parameters."""
        return self._n_layers

    @property
    def chunk_plan(self):
        """The :class:`~cgdp_chainer.runtime.replica.readiness.ChunkPlan` in use,
        or None until the first iteration has formed it."""
        return self._plans.plan

    @property
    def chunks(self):
        """Parameter names of each chunk, input side first (the first
        iteration, before the plan is formed, runs one chunk)."""
        return [list(names) for names in self._plans.chunk_names]

    @property
    def chunk_size(self):
        """Layers per chunk in use (``None`` for boundaries or bytes)."""
        return self._plans.chunking.chunk_size

    @property
    def chunking_description(self):
        """The chunking in use in words, e.g. ``'129 chunks of >= 1 MiB'``
        (for figures and logs)."""
        return self._plans.describe()

    @property
    def chunk_size_settled(self):
        """False while ``chunk_size='auto'`` is still trying sizes."""
        return self._plans.chunking.settled

    @property
    def chunk_size_search(self):
        """The ``'auto'`` search (its ``history`` and ``best``), or None."""
        return self._plans.chunking.search

    @property
    def random_base(self):
        """The base seed of the replicas' random streams (rank 0's under
        MPI, once the first update agreed on it; snapshots keep it)."""
        return self._streams.base

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

    # -- the iteration ----------------------------------------------------

    def update_core(self):
        if self._closed:
            error = self._failures.error
            raise RuntimeError(
                'this CGDPUpdater was finalized or stopped after an error{}; '
                'build a new one to train on'.format(
                    '' if error is None else ' ({})'.format(
                        accumulator_module.describe_error(error))))
        in_loop, edited = self._watch.start_update()
        if self._structure is not None and edited:
            # Refused before any work, so the updater stays usable once
            # the user undoes the change. Where no code but the updater's
            # and extensions known not to write the model ran since the
            # last update, nothing can have changed.
            self._structure.check(self.get_optimizer('main').target)
        try:
            self._ranks.begin_update()
            self._iterate(in_loop, edited)
        except BaseException as error:
            # Whatever failed (the converter, a hand-over, a worker, Ctrl-C
            # while waiting), the workers end and the shared memory is
            # freed now: a script that catches the error and exits without
            # finalize() neither hangs nor leaks.
            self._failures.fail(error, 'caller')
            self._stop_replicas()
            surfaced = self._failures.surfaced(error)
            if surfaced is error:
                raise
            raise surfaced from None
        self._ranks.end_update()

    def _iterate(self, in_loop, edited):
        """One iteration, as the algorithm goes: take the user's edits,
        draw the batch (read and converted while the last iteration
        computed), start the next one's reading, run the replicas (each
        hands its chunks over during its backward; the host reduces,
        updates and publishes each chunk meanwhile), then report the
        whole batch's values and settle the chunking."""
        if self._device_view is not None:
            self._device_view.restore()  # after an evaluation that raised
        broadcast = self._ranks.first_broadcast()
        if broadcast is not None:
            self._broadcast_instead(broadcast)
            return
        if self._replicas is not None:
            self._take_user_edits(edited)
        elif self.workers == 'process' and self._launched is None:
            # They boot (an interpreter, Chainer) while the first batch is
            # read and the master's first forwards run.
            self._launched = channels.launch_workers(self._start_method,
                                                     len(self._devices))
        batch = self._next_batches()
        first_reports = None
        if self._replicas is None:
            # The master's forwards at the first iteration run
            # define-by-run, as the replicas do: none builds a static
            # schedule on the master that training would leave unfinished.
            with static_graph_models.define_by_run():
                first_reports = self._start(batch)
        elif self._reduction_finder is not None:
            self._confirm_reduction(batch)
        self._batch_statistics.check(here=self._ranks.speaks)
        self._input_path.read_ahead()
        forming = self._plans.plan is None
        results, seconds = self._run_replicas(batch, forming, in_loop,
                                              edited)
        self._persistents.keep(results[0])
        # A GPU replica's values were copied to the host on its copy
        # stream, before its gradients, which the host has waited for.
        self._report([observations.settled(r.observation) for r in results],
                     batch.counts, first_reports)
        self._plans.settle([r.ready for r in results], forming, seconds,
                           self._ranks.allreducer)
        self._new_epoch_if_due()

    def _new_epoch_if_due(self):
        if self.auto_new_epoch and self.get_iterator('main').is_new_epoch:
            self.get_optimizer('main').new_epoch(auto=True)

    def _broadcast_instead(self, broadcast):
        """A multi-node optimizer's first update(), as ChainerMN's: the
        master's forward and backward on the batch (reporting as
        StandardUpdater does), rank 0's weights to every rank, no step
        (see :class:`~cgdp_chainer.mpi.chainermn_optimizer.
        BroadcastingFirstUpdate`)."""
        batch = self._next_batches()
        optimizer = self.get_optimizer('main')
        with static_graph_models.define_by_run():
            loss = shared.call_with(self.loss_func or optimizer.target,
                                    batch.whole_inputs)
            broadcast.run(optimizer.target, loss, optimizer._loss_scale)
        self._new_epoch_if_due()

    def _confirm_reduction(self, batch):
        """Compares the batch's loss with its shares' before its update,
        while ``'mean'`` found at the first iteration awaits confirmation
        (see :mod:`~cgdp_chainer.runtime.replica.loss_reduction`); raises
        where the batch does not show it."""
        finder = self._reduction_finder
        with static_graph_models.define_by_run():
            finder.confirm(batch, self.iteration + 1)
        if not finder.confirming:
            self._reduction_finder = None

    def _run_replicas(self, batch, forming, in_loop, edited):
        """Runs every replica's forward and backward on its share while the
        host reduces, updates and publishes each chunk; returns once the
        last chunk is published.

        Returns:
            tuple: The replicas' results and the seconds they took.
        """
        timeline = self.timeline
        start = timeline.now() if timeline is not None else None
        jobs = self._jobs(len(self._devices), forming,
                          send_persistents=not in_loop)
        # Each device's weight in 'mean': its fraction of the examples (the
        # iterators of the list form may give batches of different sizes).
        self._accumulator.start_iteration(
            self.iteration, batch.shares,
            write_grads=self._watch.gradients_wanted(
                in_loop, self.iteration + 1, self.epoch_detail),
            revalidate=edited)
        began = time.perf_counter()
        with self._streams.scope(self.iteration) as shared_random:
            results = self._replicas.run(jobs, batch.inputs)
        self._streams.check_shared_draws(shared_random)
        if not self._failures.failed:
            self._accumulator.wait()
        seconds = time.perf_counter() - began
        sync_end = timeline.now() if timeline is not None else None
        if self._failures.failed:
            self._stop_replicas()
            raise self._failures.surfaced()
        if timeline is not None:
            timeline.record_replicas(self.iteration, results, start,
                                     sync_end)
        return results, seconds

    def _jobs(self, n, forming, send_persistents):
        """The iteration's :class:`~cgdp_chainer.runtime.workers.worker.Job` of
        each replica.

        Args:
            n (int): Replicas.
            forming (bool): Whether this iteration forms the chunk plan.
            send_persistents (bool): Whether replica 0 returns its
                persistent values after the iteration.
        """
        seeds = [self._streams.seed(i, self.iteration) for i in range(n)]
        refresh = self._persistents.for_job()
        config = worker_module.caller_config()
        plan, fingerprint, layout = self._plans.for_job(forming)
        return [worker_module.Job(
            iteration=self.iteration, seed=seeds[i], plan=plan,
            fingerprint=fingerprint,
            record_events=self.timeline is not None,
            send_persistents=(i == 0 and self._persistents.present and
                              send_persistents),
            persistents=refresh, config=config,
            loss_scale=self.get_optimizer('main')._loss_scale,
            layout=layout)
            for i in range(n)]

    def _take_user_edits(self, edited):
        """Makes the replicas train from the master as user code left it
        since the last ``update()``, before any work of this one.

        Args:
            edited (bool): Whether user code may have changed the master
                (see :meth:`TrainerWatch.start_update`); its structure was
                checked in :meth:`update_core`.
        """
        if not edited:
            return
        # Host replicas read the master's flat buffer: arrays that user
        # code replaced are copied into it. GPU replicas hold copies: they
        # take every chunk again whenever the master may have been
        # written, in place or not.
        self._replicas.master.sync(self._names)
        self._publish_to_gpus()
        self._persistents.after_edit()

    def _publish_to_gpus(self):
        """Sends every chunk of the master to the GPU replicas, which hold
        copies (host replicas read the master's buffer)."""
        if self._plans.layout_unsent is not None:
            # Adopting the new layout takes the whole buffer again; the
            # replicas' spans are still the old layout's.
            return
        for port in self._replicas.ports:
            if port.is_gpu:
                for chunk, names in enumerate(self._plans.chunk_names):
                    port.publish(chunk, names)

    def sync_persistents(self):
        """Copies the first replica's persistent values (BatchNormalization
        statistics) into the master, if it has newer ones.

        Inside a Trainer's loop they come only before an extension that may
        read the model runs (and in :meth:`serialize` and :meth:`finalize`);
        outside one, after every ``update()``. Call this before reading the
        master's statistics from other code within a Trainer's loop.
        """
        if not self._persistents.stale or self._replicas is None or \
                self._closed:
            return
        values = self._replicas.fetch_persistents(0)
        if self._failures.failed:
            self._stop_replicas()
            raise self._failures.surfaced()
        self._persistents.load(values)

    @contextlib.contextmanager
    def unattended(self):
        """A block of ``update()`` calls between which no code reads or
        writes the user's model (a timing loop, for example): GPU replicas
        then keep their copies rather than take the master's values again at
        each ``update()``, and the first replica's BatchNormalization
        statistics come to the master once, when the block ends. The first
        ``update()`` of the block still takes what code before it changed.
        """
        self._watch.set_unattended(True)
        try:
            yield self
        finally:
            self._watch.set_unattended(False)
        self.sync_persistents()

    @property
    def grads_written(self):
        """How many ``update()`` calls left their gradient in the master's
        ``param.grad`` (those after which anything may read it)."""
        if self._accumulator is None:
            return 0
        return self._accumulator.grads_written

    @property
    def persistents_fetches(self):
        """How many times the first replica's persistent values were
        copied into the master."""
        return self._persistents.fetches

    def _next_batches(self):
        """This iteration's examples: the 'main' iterator's batch split over
        the devices, or each iterator's batch in the list form, in any form
        the iterators return (see :mod:`~cgdp_chainer.runtime.input.batches`),
        read ahead where that is exact (see
        :mod:`~cgdp_chainer.runtime.input.input_path`).

        Returns:
            Batch: Each device's converted share, its examples and the
            whole batch.
        """
        if self._input_path is None:
            host = chainer.get_device('@numpy')

            def convert_on_host(examples):
                return convert._call_converter(self.converter, examples, host)

            split = self._device_iterators is None
            self._input_path = input_path.InputPath(
                [self.get_iterator('main')] if split else
                self._device_iterators, convert_on_host, len(self._devices),
                split, self._say)
        return self._input_path.next_batch()

    def _start(self, batch):
        """Initializes lazy parameters, checks the MPI ranks, finds how
        reported values combine and (unless given) the reduction, chooses
        the chunk size if a chooser is waiting, then builds the replicas,
        the host accumulator and starts the workers.

        Args:
            batch (Batch): The first batch.

        Returns:
            dict: Values with their graphs to report for the first iteration
            (from the master's forward on the whole batch), or None.
        """
        call_forms.check_first_batch(batch.counts)
        optimizer = self.get_optimizer('main')
        master = optimizer.target
        first_reports = None
        if readiness.has_uninitialized_params(master) or \
                chainer.config.keep_graph_on_report:
            first_reports = self._forward_on_master(batch.whole_inputs)
            master.to_device('@numpy')
            readiness.refuse_uninitialized(master)
        self._ranks.join(master, optimizer)
        if self._ranks.allreducer is not None:
            # Every rank derives its replicas' streams from rank 0's seed.
            self._streams.agree(self._ranks.allreducer)
        if self._static_graph_methods:
            self._say(*static_graph_models.describe(
                self._static_graph_methods), level=log.NOTICE)
        finder = loss_reduction.ReductionFinder(
            master, self.loss_func, len(self._devices), self._report_kinds,
            self._ranks.allreducer, self._streams.base, self._say)
        self.reduction = finder.find(batch, self.reduction)
        if finder.confirming:
            self._reduction_finder = finder
        if self.timeline is not None:
            self.timeline.name_tracks(
                ['replica {} {}'.format(index, devices_module.spec_of(device))
                 for index, device in enumerate(self._devices)],
                rank=self._ranks.rank)
        if self._plans.chunking.chooser is not None:
            self._plans.resize(self._plans.chunking.ask_chooser(
                master, self._devices[0],
                shared.copied_inputs(batch.inputs[0]), len(self._devices),
                self.loss_func, self._host_threads, self.workers, optimizer,
                self._ranks.allreducer))
        self._structure = master_module.MasterStructure(master)
        self._persistents.start()
        replicas = self._make_replicas(master)
        try:
            self._accumulator = accumulator_module.HostAccumulator(
                optimizer, replicas.ports, self._plans.chunk_names,
                self.reduction, self._failures, replicas.master,
                n_threads=self._host_threads, timeline=self.timeline,
                allreducer=self._ranks.allreducer)
            self._replicas = replicas
            self._plans.attach(replicas, self._accumulator)
            replicas.start(self._accumulator.deliver)
            # A GPU replica's share is staged where it is converted.
            self._input_path.stage_with(replicas.stagers)
            if self.timeline is not None:
                for note in replicas.notes:
                    self.timeline.note(note)
        except BaseException:
            self._replicas = replicas
            self._stop_replicas()
            raise
        return first_reports

    def _make_replicas(self, master):
        """The replicas, each in a worker process (those launched ahead,
        see :meth:`_iterate`) or a thread, copied from ``master``."""
        if self.workers == 'process':
            replicas = channels.ProcessReplicas(
                master, self._devices, self.loss_func, self._failures,
                blas_threads=self._blas_threads,
                start_method=self._start_method, launched=self._launched)
            self._launched = None  # the replicas own them now
            return replicas
        return channels.ThreadReplicas(
            master, self._devices, self.loss_func, self._failures,
            blas_threads=self._blas_threads,
            device_copies=self._device_copies)

    def _forward_on_master(self, in_arrays):
        """StandardUpdater's first forward on the master: initializes lazy
        parameters with exactly its values and gives the loss with its
        graph. The master's running statistics stay as they were
        (:class:`~cgdp_chainer.runtime.host.master.StatisticsKept`), so that the
        replicas' first forward is the only one counted."""
        master = self.get_optimizer('main').target
        reporter = chainer.Reporter()
        reporter.add_observer('main', master)
        reporter.add_observers('main', master.namedlinks(skipself=True))
        observation = {}
        with reporter.scope(observation), \
                master_module.StatisticsKept(master):
            loss = readiness.initialize_from_first_batch(
                self.loss_func or master, in_arrays)
        graphs = {key: value for key, value in observation.items()
                  if isinstance(value, chainer.Variable) and
                  value.creator is not None}
        if chainer.config.keep_graph_on_report and 'main/loss' not in graphs:
            graphs['main/loss'] = loss
        return graphs

    def _say(self, summary, details=None, level=log.INFO):
        """Logs a line (once, on rank 0 under MPI): :func:`log.say`."""
        if self._ranks.speaks:
            log.say(summary, details, level)

    def _report(self, reported, counts, graphs=None):
        """Reports the replicas' observations as the whole batch's.

        Args:
            reported (list of dict): Each replica's observation.
            counts (list of int): Each replica's examples.
            graphs (dict or None): At the first iteration, the values the
                master's forward reported with their graphs; they are
                reported holding the replicas' values.
        """
        combined = observations.combine_all(reported, counts,
                                            self._report_kinds)
        chainer.report(observations.with_graphs(combined, graphs or {}))

    # -- state ------------------------------------------------------------

    def serialize(self, serializer):
        """Saves or restores the master weights, persistents, optimizer
        state, iterator, iteration and the base seed of the replicas'
        random streams; restoring also refreshes every replica from the
        master."""
        if not isinstance(serializer, chainer.serializer.Deserializer):
            self.sync_persistents()
        super(CGDPUpdater, self).serialize(serializer)
        self._streams.serialize(serializer)
        if isinstance(serializer, chainer.serializer.Deserializer) and \
                self._replicas is not None:
            self._replicas.master.sync(self._names)
            # The restored state and counts form the fused runs anew.
            self._accumulator.forget_programs()
            self._publish_to_gpus()
            self._persistents.master_wins()
        if isinstance(serializer, chainer.serializer.Deserializer) and \
                self._device_view is not None:
            self._device_view.invalidate()
        if isinstance(serializer, chainer.serializer.Deserializer) and \
                self._input_path is not None:
            self._input_path.discard()  # read from the old position

    def finalize(self):
        """Copies the first replica's BatchNormalization statistics into the
        master, then stops every CGDP thread and worker process and closes
        the iterators."""
        try:
            if not self._failures.failed:
                self.sync_persistents()
        finally:
            self._stop_replicas()
            if self._device_view is not None:
                self._device_view.uninstall()
            super(CGDPUpdater, self).finalize()

    def _stop_replicas(self):
        if self._closed:
            return
        self._closed = True
        # First: a peer waiting in a later update() hears it at once.
        self._ranks.stop_counting(self._failures.words())
        if self._input_path is not None:
            self._input_path.close()  # its threads end with the workers
        # The host threads end first: they read the replicas' buffers,
        # which closing the replicas frees.
        if self._accumulator is not None:
            self._accumulator.close()
        if self._replicas is not None:
            self._replicas.close()
        if self._launched is not None:  # the first iteration failed first
            self._launched.close()
        self._ranks.close(abandon=self._failures.failed)
