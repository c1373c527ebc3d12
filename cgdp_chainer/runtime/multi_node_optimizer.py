"""CGDP under any training loop: ChainerMN's multi-node optimizer call.

``optimizer = cgdp_chainer.create_multi_node_optimizer(actual, comm)``
takes the place of ``chainermn.create_multi_node_optimizer(actual, comm)``
in a script launched with one process (rank) per device. The script's own
loop, updaters and backward calls stay as they are; underneath, the rank's
process is the one replica of the updater's machinery: the readiness
backward hands each chunk of layers over as soon as its gradients are
final, the host accumulator sums the chunk over the ranks (one all-reduce
per chunk), runs the actual optimizer's update rules and hooks on it, and
the model reads the new weights, all while the backward of earlier layers
goes on.

What is overlapped depends on who runs the backward:

* ``optimizer.update(lossfun, *args)``: the optimizer runs the backward
  (the readiness traversal, which sets exactly the gradients
  ``loss.backward()`` sets), so chunks leave during it, as in the updater;
* ``loss.backward(); optimizer.update()``: Chainer sets a leaf's gradient
  only at the end of ``Variable.backward()``, so every chunk leaves when
  ``update()`` is called; the chunks' all-reduces and updates still
  pipeline with each other, but not with the backward (the timeline marks
  such iterations with no ``backward`` events).

The arithmetic is ChainerMN's: the gradient is the mean over the ranks
(``param.grad`` holds it after ``update()``), the actual optimizer's rules
and hooks run on it, and the first ``update()`` broadcasts rank 0's weights
and takes no step.
"""
import atexit
import threading
import time

import chainer
import numpy

from cgdp_chainer import blas
from cgdp_chainer import log
from cgdp_chainer import timeline as timeline_module
from cgdp_chainer.runtime.host import accumulator as accumulator_module
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.chunks import chunking
from cgdp_chainer.runtime.replica import device_replica
from cgdp_chainer.runtime.host import host_update as host_update_module
from cgdp_chainer.runtime.host import master as master_module
from cgdp_chainer.runtime.host import node_host
from cgdp_chainer.runtime.replica import readiness
from cgdp_chainer.runtime.transport import transfer as transfer_module
from cgdp_chainer.runtime.workers import worker as worker_module

# The chunk_size values that the optimizer form takes besides layer counts
# and boundaries: none (the 'auto' search and the cost model's choice time
# or profile whole iterations, which only the updater drives).
_NO_POLICIES = ()

# Before the model is known, layer counts are checked for their type only.
_ANY_LAYER_COUNT = 1 << 30


def create_multi_node_optimizer(actual_optimizer, communicator,
                                double_buffering=False, zero_fill=True,
                                chunk_size=None, chunk_bytes=None,
                                host_threads=None, timeline=None,
                                node_host=True, device_copies=None):
    """CGDP's multi-node optimizer: ChainerMN's call, one process per device.

    A ChainerMN script switches by the module of this one call
    (``chainermn.create_multi_node_optimizer`` to
    ``cgdp_chainer.create_multi_node_optimizer``) and trains what it trained
    with ChainerMN, with each chunk's all-reduce and update overlapped with
    the backward of earlier layers (see :mod:`this module
    <cgdp_chainer.runtime.multi_node_optimizer>` for what is overlapped in
    each call form).

    Args:
        actual_optimizer (chainer.GradientMethod): The optimizer whose
            update rules and hooks run on the host, chunk by chunk.
        communicator: A ChainerMN communicator or an ``mpi4py`` one; the
            gradients are averaged over its ranks.
        double_buffering (bool): Refused if True (ChainerMN's double
            buffering updates with the previous iteration's gradients).
        zero_fill (bool): As in ChainerMN; only True is taken (a parameter
            that took no part in a rank's loss counts as a zero gradient
            there, as every rank's chunk must hold it).
        chunk_size (int, list or None): Layers per chunk, or the layer
            indices (in backward order) where chunks start, as for
            ``CGDPUpdater``; default: chunks of at least ``chunk_bytes``.
        chunk_bytes (int or None): Bytes per chunk instead (default: 1 MiB,
            as ``CGDPUpdater``).
        host_threads (int or None): Threads of this rank's host
            accumulator; default: CPU cores, at most 4.
        timeline (cgdp_chainer.Timeline or None): Records every update's
            events (host work per chunk; the backward per chunk where the
            optimizer runs it).
        node_host (bool): Whether the ranks of one machine share one host
            (one master, its state and the gradient slots in shared memory,
            each rank updating its part of every chunk) where the optimizer
            allows it; False: every rank keeps a host of its own.
        device_copies (callable or None): Tests: ``device_copies(device)``
            stands in for CuPy's copies, the model takes the GPU path.

    Returns:
        MultiNodeOptimizer: Use it as the actual optimizer. Where the
        communicator holds several ranks, an uncaught exception on any of
        them (in any thread) from now on prints its traceback and aborts
        the whole job (:func:`cgdp_chainer.mpi.install_abort_hooks`).

    Raises:
        ValueError: An option CGDP cannot honour, named with the fix.
    """
    from cgdp_chainer import mpi
    if double_buffering:
        raise ValueError(
            'double_buffering=True: ChainerMN\'s double buffering updates '
            'with the previous iteration\'s gradients, which CGDP does not '
            'reproduce; CGDP already overlaps each chunk\'s all-reduce and '
            'update with the backward: leave double_buffering out')
    if not zero_fill:
        raise ValueError(
            'zero_fill=False: CGDP all-reduces each chunk as one buffer, so '
            'a parameter without a gradient on a rank counts as zeros '
            'there (ChainerMN\'s zero_fill=True); leave zero_fill out')
    mpi.refuse_bypassed_update(actual_optimizer,
                               'create_multi_node_optimizer')
    options = _Options(chunk_size, chunk_bytes, host_threads, timeline,
                       node_host, device_copies)
    comm = mpi.as_mpi_comm(communicator)
    if not hasattr(comm, 'Get_size'):
        raise ValueError(
            'communicator must be a ChainerMN communicator or an mpi4py '
            'communicator; got {!r}'.format(communicator))
    _refuse_lone_rank(comm.Get_size(), mpi.launcher_size())
    if comm.Get_size() > 1:
        # An uncaught exception on one rank ends the job, with its
        # traceback: its peers would otherwise wait for it in the next
        # chunk's reduction forever (ChainerMN leaves this to
        # chainermn.global_except_hook, if the script installs it).
        mpi.install_abort_hooks(comm)
    return MultiNodeOptimizer(actual_optimizer, communicator, options)


def _refuse_lone_rank(size, launched):
    """Refuses a communicator of one process where the launcher started
    more: each process would train alone, silently."""
    if size == 1 and launched is not None and launched > 1:
        raise ValueError(
            'this process is one of {} ranks that an MPI launcher started, '
            'but its communicator holds it alone: the MPI library behind '
            'mpi4py is not the launcher\'s, so every process started MPI '
            'by itself and would train a model of its own. Launch with the '
            'mpiexec of mpi4py\'s MPI (the venv\'s .venv/bin/mpiexec; '
            'python -c "import mpi4py; print(mpi4py.get_config())" names '
            'it)'.format(launched))


class _Options(object):
    """The CGDP options of a multi-node optimizer, checked when given."""

    def __init__(self, chunk_size, chunk_bytes, host_threads, timeline,
                 node_host=True, device_copies=None):
        if callable(chunk_size) or isinstance(chunk_size, str):
            raise ValueError(
                'chunk_size={!r}: the multi-node optimizer takes a layer '
                'count, a list of boundaries or None (the \'auto\' search '
                'and choosers need CGDPUpdater, which drives the '
                'iterations)'.format(chunk_size))
        if isinstance(chunk_size, int) and not isinstance(chunk_size, bool) \
                and chunk_size < 1:
            raise ValueError('chunk_size={} is out of range: give 1 or more '
                             'layers per chunk'.format(chunk_size))
        # The layer count is checked against the model at the first
        # update; everything else now, before any work.
        chunking.parse_chunking(chunk_size, chunk_bytes, _ANY_LAYER_COUNT,
                                _NO_POLICIES)
        accumulator_module.check_host_threads(host_threads)
        timeline_module.check_timeline(timeline)
        self.chunk_size = chunk_size
        self.chunk_bytes = chunk_bytes
        self.host_threads = host_threads
        self.timeline = timeline
        self.node_host = bool(node_host)
        # Read now: a bad $CGDP_UPDATE_PATIENCE is refused before any work.
        from cgdp_chainer.mpi import update_counts
        self.update_patience = update_counts.patience_seconds()
        if device_copies is not None and not callable(device_copies):
            raise ValueError('device_copies must be callable as '
                             'device_copies(device)')
        self.device_copies = device_copies


class MultiNodeOptimizer(object):
    """The optimizer that :func:`create_multi_node_optimizer` returns.

    Reads and writes of any other attribute go to the actual optimizer
    (``lr``, ``t``, ``add_hook``, ``new_epoch``, ``target``, ...), as with
    ChainerMN's.

    Args:
        actual_optimizer (chainer.GradientMethod): Set up on the model, or
            set up later through :meth:`setup`.
        communicator: The ChainerMN (or mpi4py) communicator.
        options (_Options): The CGDP options.
    """

    def __init__(self, actual_optimizer, communicator, options):
        own = super(MultiNodeOptimizer, self).__setattr__
        own('actual_optimizer', actual_optimizer)
        own('communicator', communicator)
        own('_options', options)
        own('_rank', None)      # the _RankTraining, from the first update
        # A rank that ends before its first update() is named to its peers
        # (armed after the abort hooks, so that it tells them first).
        from cgdp_chainer import mpi
        mpi.first_update.arm(communicator)

    def setup(self, link):
        """Sets up the actual optimizer on ``link``; returns this one."""
        if self._rank is not None:
            raise RuntimeError(
                'this multi-node optimizer has trained already; make a new '
                'one (with a new actual optimizer) for another model')
        self.actual_optimizer.setup(link)
        return self

    def update(self, lossfun=None, *args, **kwds):
        """One step, as ChainerMN's: the gradient averaged over the ranks.

        Args:
            lossfun (callable or None): Called as ``lossfun(*args,
                **kwds)``; its loss is backpropagated here, handing chunks
                over during the backward. None: the gradients are already
                in ``param.grad`` (``loss.backward()`` ran in user code);
                they are handed over now.
            args, kwds: For ``lossfun``.
        """
        target = self.target
        if self._rank is not None:
            self._rank.check_model()  # before any work
        loss = None
        if lossfun is not None:
            try:
                loss = lossfun(*args, **kwds)
            except BaseException as error:
                if self._rank is not None:
                    self._rank.fail_outside(error)
                raise
            # cleargrads also where ChainerMN zero-fills (_use_cleargrads
            # False): zeros plus the gradient is the gradient.
            target.cleargrads()
        if self._rank is None:
            self._start(loss)
            return
        self._rank.step(loss)

    def _start(self, loss):
        """ChainerMN's first update: the backward, then rank 0's weights
        to every rank and no step; CGDP also forms its chunks here."""
        actual = self.actual_optimizer
        target = actual.target
        names = [name for name, _ in target.namedparams()]
        if loss is not None:
            order = readiness.ReadinessBackward(
                target.namedparams()).backward(
                    loss, lambda name, used: None,
                    loss_scale=actual._loss_scale)
        else:
            # The backward ran in user code: without its ready order, the
            # chunks follow the layers' registration, reversed (a
            # sequential model's backward order). What leaves when is then
            # only the host's pipelining order; the result is the same.
            order = readiness.BackwardReport(tuple(reversed(names)), ())
        replica = _device_replica(actual, self._options)
        rank = _RankTraining(actual, self.communicator, self._options, order,
                             replica)
        super(MultiNodeOptimizer, self).__setattr__('_rank', rank)

    @property
    def target(self):
        """The user's model (for a model on a GPU, the actual optimizer
        runs on its host shadow from the first update on)."""
        if self._rank is not None and self._rank.replica is not None:
            return self._rank.replica.model
        return self.actual_optimizer.target

    def serialize(self, serializer):
        """Saves or loads the actual optimizer's state; after loading, the
        host's flat buffers take the restored values."""
        self.actual_optimizer.serialize(serializer)
        if self._rank is not None and isinstance(
                serializer, chainer.serializer.Deserializer):
            self._rank.restored()

    @property
    def chunk_plan(self):
        """The :class:`~cgdp_chainer.runtime.replica.readiness.ChunkPlan` in use
        (None before the first update)."""
        return None if self._rank is None else self._rank.plan

    @property
    def shares_node_host(self):
        """Whether the ranks of this machine share one host for this
        optimizer (see ``node_host``); None before the first update."""
        return None if self._rank is None else self._rank.node is not None

    def close(self):
        """Stops this optimizer's host threads and all-reducer; the model
        keeps its trained weights. Training with it afterwards raises."""
        if self._rank is not None:
            self._rank.close()

    def __getattr__(self, name):
        return getattr(self.actual_optimizer, name)

    def __setattr__(self, name, value):
        setattr(self.actual_optimizer, name, value)


class _RankTraining(object):
    """One rank's CGDP for one optimizer: its flat master, its hand-over
    port, its host accumulator and its all-reducer.

    The model is its own and only replica: its parameters are views of the
    flat master buffer that the host updates in place, so the weights a
    chunk's update writes are the ones the next forward reads, with no
    copy; each chunk's gradients are gathered into a slot buffer laid out
    alike. Where several ranks share a machine, they share one master, its
    state and the slots, and split each chunk's host work
    (:mod:`~cgdp_chainer.runtime.host.node_host`); otherwise every rank reduces
    and updates the whole chunk after its all-reduce.

    Args:
        optimizer (chainer.GradientMethod): The actual optimizer, set up on
            the model.
        communicator: The ranks' communicator.
        options (_Options): The CGDP options.
        order (BackwardReport): The first backward's ready order.
        replica (_DeviceModel or None): The user's model on its device,
            whose host shadow is ``optimizer.target``; None: the target is
            the user's model, in host memory.
    """

    def __init__(self, optimizer, communicator, options, order,
                 replica=None):
        from cgdp_chainer import mpi
        model = optimizer.target
        _refuse_device_arrays(model)
        self.optimizer = optimizer
        self.replica = replica
        user_model = model if replica is None else replica.model
        # The weights the script wrote into a device model are taken into
        # the master at the next update (after a load, say).
        self._pull_all = False
        self.timeline = options.timeline
        comm = mpi.as_mpi_comm(communicator)
        mpi.FirstUpdateGate(comm).wait()  # a peer that ended is named
        mpi.check_consistency(comm, model, optimizer)
        # Every rank has passed MPI_Init and a collective, so every process
        # of the node maps MPICH's segment: its name can go now, and a rank
        # killed outright (no MPI_Finalize anywhere) leaves nothing behind.
        from cgdp_chainer.mpi import shm
        shm.unlink_mapped_segments()
        n_layers = readiness.count_layers(model)
        spec = chunking.parse_chunking(
            options.chunk_size, options.chunk_bytes, n_layers, _NO_POLICIES)
        self.allreducer = mpi.ChunkAllreducer(comm)
        self.plan = chunking.plan_from(spec, order, model.namedparams(),
                                       n_layers)
        chunking.check_same_on_every_rank(self.plan, self.allreducer)
        self.chunk_names = worker_module.runtime_chunk_names(self.plan)
        # ChainerMN's first update: every rank starts from rank 0's weights.
        mpi.broadcast_parameters(comm, model)
        self.failures = accumulator_module.FailureBox()
        group = _shared_node(comm, optimizer, options, self.allreducer)
        self.node = group
        if group is None:
            self._build_own_host(options)
        else:
            self._build_node_host(group, options)
        if replica is not None:
            # Every rank's device model starts from rank 0's weights.
            self.port.publish_weights(self.chunk_names)
        self.structure = master_module.MasterStructure(user_model)
        self.backward = readiness.ReadinessBackward(user_model.namedparams())
        self.iteration = 0
        self._lock = threading.Lock()
        self._closed = False
        # A peer that stops calling update() before this rank does fails
        # this rank's waiting update() with both counts.
        self.update_counts = mpi.UpdateCountWatch(
            comm, lambda error: self.failures.fail(error,
                                                   'update count watch'),
            patience=options.update_patience)
        # The first update() (this one) counts: it broadcast the weights.
        self.update_counts.begin_update()
        self.update_counts.end_update()
        # Before mpi4py finalizes MPI (atexit runs the last registered
        # first): the threads end, the node's memory is unmapped cleanly.
        atexit.register(self.close)

    def _build_own_host(self, options):
        """A host of this rank's own: the whole of every chunk, after its
        sum over the ranks."""
        model = self.optimizer.target
        replica = self.replica
        if replica is None:
            self.master = _flat_master(model, self.plan)
            self.port = transfer_module.HostResidentTransfer(
                self.master, dict(model.namedparams()))
        else:
            self.master = _flat_master(
                model, self.plan, device_replica.pinned_master_buffer(
                    _plan_layout(model, self.plan).capacity,
                    replica.device_copies))
            self.port = replica.port(self.master.layout, self.master.buffer,
                                     None, model)
        self.accumulator = accumulator_module.HostAccumulator(
            self.optimizer, [self.port], self.chunk_names, 'mean',
            self.failures, self.master, n_threads=options.host_threads,
            timeline=self.timeline, allreducer=self.allreducer)

    def _build_node_host(self, group, options):
        """This rank's part of the node's shared host (collective over the
        node's ranks, and over every rank where there are several nodes)."""
        model = self.optimizer.target
        params = dict(model.namedparams())
        layout = _plan_layout(model, self.plan)
        memory = node_host.NodeMemory(
            group, layout, node_host.state_keys(self.optimizer),
            len(self.chunk_names))
        ordered = {name: params[name] for name in layout.names}
        first = group.local_rank == 0
        if first:
            self.master = buffers.FlatMaster(ordered, layout, memory.master)
        _bind_state(self.optimizer, memory.state, layout, write=first)
        memory.attached_everywhere()
        if not first:
            self.master = buffers.FlatMaster.attached(ordered, layout,
                                                      memory.master)
        if self.replica is None:
            self.port = transfer_module.HostResidentTransfer(
                self.master, params,
                slot_buffer=memory.slots[group.local_rank])
        else:
            self.port = self.replica.port(
                layout, memory.master, memory.slots[group.local_rank], model,
                shared_regions=[memory.arena.as_bytes()])
        # The start-up's all-reducer is done; across nodes, each rank sums
        # its own part with the ranks of its local rank elsewhere.
        self.allreducer.close()
        self.allreducer = None
        if group.n_nodes > 1:
            from cgdp_chainer import mpi
            self.allreducer = mpi.ChunkAllreducer(group.cross)
        threads = options.host_threads or max(
            1, min(4, blas.cpu_cores() // group.local_size))
        self.accumulator = node_host.NodeAccumulator(
            self.optimizer, self.port, self.chunk_names, self.failures,
            self.master, memory, allreducer=self.allreducer,
            n_threads=threads, timeline=self.timeline,
            to_device=self.replica is not None)

    def check_model(self):
        """Anything may have run since the last update: a changed
        structure is refused by name, a replaced array copied into the
        flat buffer (a device model's values written in place, at the
        first hand-over: see :meth:`_deliver`)."""
        if self.replica is None:
            self.structure.check(self.optimizer.target)
            if self.node is not None:
                _refuse_replaced_on_node(self.master)
            self.master.sync(list(self.master.master_params))
            return
        self.structure.check(self.replica.model)
        replaced = self.port.check_arrays()
        if self._pull_all:
            replaced = list(self.master.master_params)
            self._pull_all = False
        if replaced:
            self.port.pull(replaced)

    def step(self, loss):
        """One update: hands the chunks over during the backward of
        ``loss`` (or, for None, all at once), waits for the host, raises
        what any thread raised."""
        if self._closed:
            raise RuntimeError(
                'this multi-node optimizer was closed{}; make a new one to '
                'train on'.format('' if self.failures.error is None else
                                  ' after an error ({!r})'.format(
                                      self.failures.error)))
        self.iteration += 1
        timeline = self.timeline
        start = timeline.now() if timeline is not None else None
        try:
            self.update_counts.begin_update()
            self.accumulator.start_iteration(self.iteration, [1.0])
            if loss is None:
                self._hand_over_all()
            else:
                self._backward(loss)
            self.accumulator.wait()
        except BaseException as error:
            self.failures.fail(error, 'caller')
            self.close()
            surfaced = self.failures.surfaced(error)
            if surfaced is error:
                raise
            raise surfaced from None
        if self.failures.failed:
            self.close()
            raise self.failures.surfaced()
        if self.replica is not None:
            self.port.finish(len(self.chunk_names))
        if timeline is not None:
            timeline.end_iteration(self.iteration, start, timeline.now())
        self.update_counts.end_update()

    def fail_outside(self, error):
        """The loss function that ``update()`` called raised: this update
        counts as failed, so that a peer waiting in it names this rank and
        its error, and this rank trains no more."""
        if self._closed:
            return
        try:
            self.update_counts.begin_update()
        except Exception:
            pass  # a peer stopped first: the error at hand goes out
        self.failures.fail(error, 'caller (the loss function)')
        self.close()

    def _backward(self, loss):
        plan = self.plan
        clock = _BackwardClock(self.timeline, self.iteration)

        def hand_over(index):
            chunk = worker_module.runtime_chunk(plan, index)
            clock.chunk_done(chunk)
            self._deliver(chunk)

        chunks = readiness.ChunkReadiness(plan, hand_over)
        chunks.start()
        self.backward.backward(loss, chunks,
                               loss_scale=self.optimizer._loss_scale)

    def _hand_over_all(self):
        """Every chunk, output side first, as the backward would have."""
        for chunk in reversed(range(len(self.chunk_names))):
            self._deliver(chunk)

    def _deliver(self, chunk):
        if self.failures.failed:
            raise accumulator_module.Aborted()
        if self.replica is not None:
            # Before the host reads any chunk of the master: values the
            # script wrote in place since the last update (check_model
            # started the comparison; its answer has landed by now).
            written = self.port.written_in_place()
            if written:
                self.port.pull(written)
        ready = self.port.send_grads(self.chunk_names[chunk])
        self.accumulator.deliver(0, chunk, ready)

    def restored(self):
        """After the optimizer's or the model's state was loaded: the flat
        buffer takes the loaded arrays, the fused runs form anew."""
        self.master.sync(list(self.master.master_params))
        self.accumulator.forget_programs()
        # A device model's weights may have been loaded too (in either
        # order): the next update takes them into the master.
        self._pull_all = self.replica is not None

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # A closed optimizer is not kept alive until exit (a study that
        # builds many, say).
        atexit.unregister(self.close)
        # First: a peer waiting in a later update() hears it at once.
        self.update_counts.close(self.failures.words())
        self.accumulator.close()
        if self.allreducer is not None:
            self.allreducer.close(abandon=self.failures.failed)
        # The model keeps its trained weights and gradients, the optimizer
        # its state, in private arrays.
        self.master.release()
        self.port.close()
        self.port.slot_buffer = None
        if self.node is not None:
            self.accumulator.release_memory()
            self.node.free()


def _refuse_device_arrays(model):
    _refuse_uninitialized(model)
    for name, param in model.namedparams():
        if not isinstance(param.array, numpy.ndarray):
            raise ValueError(
                'parameter {} is a {} array: the multi-node optimizer '
                'trains models in host memory (\'@numpy\') or on a CuPy '
                'GPU (\'@cupy:N\'); move the model with '
                'model.to_device(...)'.format(
                    name, type(param.array).__module__.split('.')[0]))


class _DeviceModel(object):
    """The user's model on its device, while the actual optimizer runs
    on its host shadow.

    Args:
        model (chainer.Link): The user's model.
        device (chainer.backend.Device): Its device.
        device_copies (callable or None): The stand-in of CUDA's copies
            (tests), or None for CuPy's.
    """

    def __init__(self, model, device, device_copies):
        self.model = model
        self.device = device
        self.device_copies = device_copies

    def port(self, layout, master_buffer, slot_buffer, shadow,
             shared_regions=()):
        """The model's :class:`~cgdp_chainer.runtime.replica.device_replica.
        DevicePort` over the master's buffer (``shadow``'s parameters are
        its views)."""
        with chainer.using_device(self.device):
            return device_replica.build_port(
                layout, master_buffer, slot_buffer,
                dict(shadow.namedparams()), dict(self.model.namedparams()),
                self.device, self.device_copies, shared_regions)


def _device_replica(actual, options):
    """For a model on a GPU (or any model, given the stand-in of CUDA's
    copies): points the actual optimizer at a host shadow of the model and
    returns the :class:`_DeviceModel`; None for a host model."""
    model = actual.target
    _refuse_uninitialized(model)
    device = device_replica.model_device(model, options.device_copies)
    if device is None:
        return None
    # The update rules (hyperparameters, hooks, state) go with the shadow,
    # so the actual optimizer's state serializes under the model's paths.
    actual.target = device_replica.host_shadow(model)
    return _DeviceModel(model, device, options.device_copies)


def _refuse_uninitialized(model):
    for name, param in model.namedparams():
        if param.array is None:
            raise ValueError(
                'parameter {} is not initialized at the first update(); '
                'CGDP lays every parameter out in one flat buffer then: '
                'run a forward that uses it (or give its link an input '
                'size) first'.format(name))


def _plan_layout(model, plan):
    """The flat layout of the model's parameters in the plan's layer order,
    so that every chunk is one slice."""
    params = dict(model.namedparams())
    return buffers.FlatLayout.of_arrays(
        {name: params[name].array for name in buffers.layer_order(plan)})


def _flat_master(model, plan, buffer=None):
    """The model's parameters as views of one flat host buffer (default:
    a new one), laid out by :func:`_plan_layout`."""
    params = dict(model.namedparams())
    layout = _plan_layout(model, plan)
    ordered = {name: params[name] for name in layout.names}
    if buffer is None:
        buffer = buffers.host_buffer(layout.capacity)
    return buffers.FlatMaster(ordered, layout, buffer)


def _refuse_replaced_on_node(master):
    """Raises ValueError naming a parameter whose array the script replaced
    where the ranks of a machine share one copy of the weights: each rank
    would write its own new values over the others', where under ChainerMN
    each rank's model keeps its own."""
    replaced = master.replaced(list(master.master_params))
    if replaced:
        raise ValueError(
            'the array of parameter {} was replaced since the last update, '
            'but the ranks of this machine share one copy of the weights '
            '(node_host=True), so one rank\'s new values would be every '
            'rank\'s: write the same values in place on every rank (as '
            'load_npz does), or give create_multi_node_optimizer('
            '..., node_host=False), where each rank keeps its own'.format(
                ', '.join(replaced)))


def _shared_node(comm, optimizer, options, allreducer):
    """The :class:`~cgdp_chainer.runtime.host.node_host.NodeGroup` whose ranks
    share one host, or None where each rank keeps its own (one rank per
    machine, ``node_host=False``, or an optimizer the split cannot run;
    every rank decides alike). Collective."""
    if not options.node_host:
        return None
    group = node_host.NodeGroup(comm)
    refusal = None
    if group.local_size < 2 or not group.uniform:
        refusal = 'one rank per machine' if group.local_size < 2 else \
            'machines run different numbers of ranks'
    else:
        node_host.prepare_rule_states(optimizer)
        refusal = node_host.node_host_refusal(optimizer)
    if allreducer.allreduce_int(0 if refusal else 1, op='min'):
        return group
    group.free()
    if refusal is not None and group.local_size > 1 and \
            allreducer.rank == 0:
        log.notice('CGDP multi-node optimizer: every rank keeps a host of '
                   'its own ({})'.format(refusal))
    return None


def _bind_state(optimizer, state, layout, write):
    """Makes every fused rule's state arrays views of the node's shared
    state buffers; ``write``: this rank writes their values (local rank 0;
    the others read them)."""
    fused_rule = host_update_module.fused_rule_for(optimizer)
    params = dict(optimizer.target.namedparams())
    for name in layout.names:
        if host_update_module.frozen(params[name]):
            continue  # no state, as with Chainer
        rule = params[name].update_rule
        state.bind(name, rule, fused_rule.state_keys_of(rule), copy=write)


class _BackwardClock(object):
    """Times the backward per chunk on the timeline (nothing without one)."""

    def __init__(self, timeline, iteration):
        self.timeline = timeline
        self.iteration = iteration
        self._last = time.perf_counter()

    def chunk_done(self, chunk):
        if self.timeline is None:
            return
        now = time.perf_counter()
        origin = self.timeline.origin
        self.timeline.record(self.iteration, 0, 'backward', chunk,
                             self._last - origin, now - origin)
        self._last = now
