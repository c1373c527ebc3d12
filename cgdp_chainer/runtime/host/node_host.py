"""One host per node: the ranks of a machine share one master and split
its work.

Under the multi-node optimizer each rank is a process of its own. Where
several ranks run on one machine, they share, in one shared-memory segment
(:class:`NodeMemory`):

* the master's flat buffer, which every rank's model reads as its
  parameters (host models: the weights a chunk's update writes are the
  ones every rank's next forward reads, with no copy);
* the fused optimizer state and the reduced gradients, so that every
  rank's ``update_rule.state`` and ``param.grad`` are the node's (a
  snapshot taken on any rank holds the whole state);
* one gradient slot per rank, and two flags per chunk and rank: delivered
  (the rank's slot holds the chunk's gradients of this iteration) and
  published (the rank's part of the chunk is updated).

Each chunk's work is split by elements: rank ``l`` of ``L`` on the node
reduces the ``l``-th part of every fused run of the chunk over the ``L``
slots, sums that part across the nodes (with the ranks of the same local
rank elsewhere, so the links between nodes carry all parts at once) and
updates it. So the node's cores all work on the host update, and no byte
is reduced or updated twice on a node. A rank waits for the other local
ranks' delivered flags of a chunk before it reduces it, and, at the end of
``update()``, for every published flag, so that its next forward reads
the new weights everywhere. A model on a GPU reads its weights from its
device instead: as soon as every local rank has published a chunk, its
rank's host thread starts the chunk's copy to the device, while the
backward of earlier layers still runs.

The split needs every parameter to be updated by a fused rule (SGD,
MomentumSGD, CorrectedMomentumSGD, NesterovAG, Adam and its variants,
RMSprop, AdaGrad, AdaDelta, RMSpropGraves, and their subclasses that change
nothing of the update, with element-wise hooks; see
:mod:`~cgdp_chainer.runtime.host.fused_classes`), or to be frozen (its
gradient is reduced, and it is not updated). A rule's own hooks (ChainerCV's
``GradientScaling``, any callable) do not stop it: such a parameter is
reduced, hooked and updated whole by one rank of the node, the ranks taking
them in turn (a hook that keeps a state of its own sees only the
parameters its rank takes). An update rule of Chainer's own, though, keeps
its state in the process and updates whole arrays. Where a
model or an optimizer needs one, or a hook needs the whole gradient, or
loss scaling is dynamic, each rank keeps a host of its own instead
(:func:`node_host_refusal` says why, naming the class).
"""
import os
import platform
import time
import zlib

import numpy

from cgdp_chainer.runtime.host import accumulator as accumulator_module
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.host import host_update as host_update_module
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.host.reduction import reduce_sum

# Flag rows of NodeMemory.flags.
DELIVERED, PUBLISHED = 0, 1

# Seconds between two looks at the other ranks' flags: from the first to
# the last, doubling. A chunk's host work takes far longer than the first;
# a long wait (a rank still in its forward) does not spin a core.
POLL_SECONDS = (2e-5, 1e-3)

# Processors whose stores other processes see in program order (x86-64's
# total store order): a rank's gradients are in its slot before others see
# its delivered flag, with no fence. Elsewhere each rank keeps its own host.
ORDERED_STORE_MACHINES = ('x86_64', 'AMD64', 'i686', 'i386')

# Seconds a rank that sees another of its node stop on an error gives that
# rank's own words to arrive (the update-count watch polls every 0.05 s).
PEER_WORDS_SECONDS = 2.0

# Elements of a part start on a cache line: two ranks never write one.
_PART_ALIGN_BYTES = 64


class NodeGroup(object):
    """This rank's place on its node, and the communicators of the split.

    Collective over ``comm``.

    Args:
        comm (mpi4py.MPI.Comm): Every rank.

    Attributes:
        local (mpi4py.MPI.Comm): The ranks of this machine.
        cross (mpi4py.MPI.Comm): The ranks of the same local rank on every
            machine (this rank's part of each chunk is summed over them).
        local_rank, local_size, world_size, n_nodes (int): As named.
        uniform (bool): Whether every machine runs as many ranks (the
            split needs it), the same on every rank.
    """

    def __init__(self, comm):
        from mpi4py import MPI
        rank = comm.Get_rank()
        self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        self.cross = comm.Split(color=self.local_rank, key=rank)
        self.world_size = comm.Get_size()
        self.n_nodes = self.cross.Get_size()
        self.uniform = comm.allreduce(self.local_size, op=MPI.MIN) == \
            comm.allreduce(self.local_size, op=MPI.MAX)

    def free(self):
        for comm in (self.local, self.cross):
            comm.Free()


def prepare_rule_states(optimizer):
    """Creates every update rule's state as its first update would (zeros
    of the parameter's shape), so that the fused rule takes every parameter
    from the first step on and the state can live in shared memory."""
    for param in optimizer.target.params():
        rule = param.update_rule
        if host_update_module.frozen(param) or rule.state is not None:
            continue  # Chainer creates no state for a frozen one either
        if rule._use_fp32_update and param.dtype == numpy.float16:
            # Chainer's first update creates this state from the rule's
            # float32 copy of the parameter: made here from the float16
            # one, it would stay float16 and change every step.
            continue
        rule._init_states(param)  # what Chainer's first update runs


def node_host_refusal(optimizer, check_params=True):
    """Why the ranks of a node cannot share one host for ``optimizer``, or
    None where they can.

    Args:
        optimizer (chainer.GradientMethod): Set up on the model, with every
            rule's state created (:func:`prepare_rule_states`).
        check_params (bool): Whether to look at every parameter's rule too
            (else only at the optimizer, its hooks and its loss scaling).
    """
    if platform.machine() not in ORDERED_STORE_MACHINES:
        return 'this processor ({}) may reorder stores between ' \
            'processes'.format(platform.machine())
    if accumulator_module.needs_whole_gradient(optimizer):
        return 'a hook needs the whole gradient'
    if getattr(optimizer, '_loss_scaling_is_dynamic', False):
        return 'loss scaling is dynamic'
    fused_rule = host_update_module.fused_rule_for(optimizer)
    if fused_rule is None:
        return host_update_module.optimizer_refusal(optimizer)
    if os.environ.get(host_update_module.BACKEND_VARIABLE) == 'off':
        return 'fused host updates are off ({}=off)'.format(
            host_update_module.BACKEND_VARIABLE)
    refusal = host_update_module.hook_refusal(
        *accumulator_module.optimizer_hooks(optimizer))
    if refusal is not None or not check_params:
        return refusal
    for name, param in sorted(optimizer.target.namedparams()):
        if host_update_module.frozen(param):
            continue  # not updated at all: its gradient is only reduced
        if not fused_rule.fuses_update(param):
            return 'parameter {} is not updated by a fused rule ({})'.format(
                name, _rule_named(param))
    return None


def _rule_named(param):
    """What a parameter's update rule is, for a refusal."""
    return 'its rule is {}'.format(type(param.update_rule).__name__)


def state_keys(optimizer):
    """The fused rule's state keys over every parameter, in a fixed order
    (Adam's ``'vhat'`` only with ``amsgrad``)."""
    fused_rule = host_update_module.fused_rule_for(optimizer)
    keys = set()
    for param in optimizer.target.params():
        if not host_update_module.frozen(param):
            keys.update(fused_rule.state_keys_of(param.update_rule))
    return sorted(keys)


class NodeMemory(object):
    """The node's shared buffers, created by local rank 0 and attached by
    the others. Collective over the node's ranks.

    Args:
        group (NodeGroup): This rank's node.
        layout (FlatLayout): The master's flat layout.
        state_keys (sequence of str): The fused rule's state keys.
        n_chunks (int): Chunks of the plan (for the flags).
    """

    def __init__(self, group, layout, state_keys, n_chunks):
        self.group = group
        size = (layout.capacity,)
        specs = [('master', size, numpy.uint8), ('grads', size, numpy.uint8)]
        specs += [('slot{}'.format(i), size, numpy.uint8)
                  for i in range(group.local_size)]
        specs += [('state/' + key, size, numpy.uint8) for key in state_keys]
        specs += [('flags', (2, n_chunks, group.local_size), numpy.int64),
                  ('failed', (1,), numpy.int64)]
        if group.local_rank == 0:
            self.arena = shared.SharedArena.create(specs, prefix='cgdp-node')
            group.local.bcast(self.arena.layout, root=0)
        else:
            self.arena = shared.SharedArena.attach(
                group.local.bcast(None, root=0))
        arrays = self.arena.arrays
        self.master = arrays['master']
        self.grads = arrays['grads']
        self.slots = [arrays['slot{}'.format(i)]
                      for i in range(group.local_size)]
        self.flags = arrays['flags']
        self.failed = arrays['failed']
        self.state = buffers.FlatState(
            layout, lambda key: arrays['state/' + key])

    def attached_everywhere(self):
        """After every local rank attached (a barrier): the segment's name
        goes, so that nothing is left in ``/dev/shm`` however the ranks
        end."""
        self.group.local.Barrier()
        if self.group.local_rank == 0:
            self.arena.unlink_name()

    def mark_failed(self):
        """Tells the node's other ranks that this one stopped on an error
        (its local rank, plus one)."""
        self.failed[0] = self.group.local_rank + 1

    def close(self):
        """Unmaps the segment; every view of it must be gone by then (the
        optimizer's state is released here)."""
        self.state.release()
        self.master = self.grads = self.flags = self.failed = None
        self.slots = []
        self.arena.close()


class NodeAccumulator(accumulator_module.HostAccumulator):
    """The host accumulator's work on one rank of a shared node host: this
    rank's part of every chunk (see the module).

    Args:
        optimizer (chainer.GradientMethod): Set up on this rank's model,
            whose parameters are views of ``memory.master``.
        port (HostResidentTransfer): This rank's hand-over, whose slot
            buffer is its slot in ``memory``.
        chunk_names (list of list of str): As for ``HostAccumulator``.
        failures (FailureBox): This rank's.
        master (FlatMaster): The model's parameters on ``memory.master``.
        memory (NodeMemory): The node's shared buffers.
        allreducer (ChunkAllreducer or None): Over ``group.cross`` where
            there are several nodes.
        n_threads (int or None): Host threads of this rank.
        timeline (Timeline or None): As for ``HostAccumulator``.
        to_device (bool): The port is a device model's
            (:class:`~cgdp_chainer.runtime.replica.device_replica.DevicePort`):
            each chunk, once the node has updated all of it, is published
            to the device, and counts as done only then.
    """

    def __init__(self, optimizer, port, chunk_names, failures, master,
                 memory, allreducer=None, n_threads=None, timeline=None,
                 to_device=False):
        super(NodeAccumulator, self).__init__(
            optimizer, [port], chunk_names, 'mean', failures, master,
            n_threads=n_threads, timeline=timeline, allreducer=allreducer,
            grad_buffer=memory.grads, state=memory.state,
            block_threads=n_threads)
        group = memory.group
        self.memory = memory
        self._local_rank = group.local_rank
        self._scale = 1.0 / group.world_size
        self._iteration_flag = 0
        self._parts = {}
        self._to_device = to_device

    def start_iteration(self, iteration, shares, write_grads=True,
                        revalidate=True):
        refusal = node_host_refusal(self.optimizer, check_params=False)
        if refusal is not None:
            raise ValueError(
                'the ranks of this node share one host, which needs every '
                'parameter updated by a fused rule, but now {}; build the '
                'optimizer with node_host=False to give every rank a host '
                'of its own'.format(refusal))
        super(NodeAccumulator, self).start_iteration(
            iteration, shares, write_grads=True, revalidate=revalidate)
        self._iteration_flag += 1

    def deliver(self, device_index, chunk, ready):
        """This rank's slot holds the chunk: says so to the node, then
        updates this rank's part of it once every local rank has. A copy
        still under way (``ready`` of a device model's transfer) is waited
        for in a host thread first."""
        if ready is not None:
            self._pool.submit(self._guarded, self._deliver_copied, chunk,
                              ready)
            return
        self.memory.flags[DELIVERED, chunk, self._local_rank] = \
            self._iteration_flag
        self._pool.submit(self._guarded, self._process_part, chunk)

    def _deliver_copied(self, chunk, ready):
        self.transfers[0].wait_grads(ready)
        self.memory.flags[DELIVERED, chunk, self._local_rank] = \
            self._iteration_flag
        self._process_part(chunk)

    def wait(self, poll_seconds=0.05):
        """Blocks until this rank's parts are done and every local rank
        has published every chunk (or something failed)."""
        super(NodeAccumulator, self).wait(poll_seconds)
        if self.failures.failed:
            return
        try:
            for chunk in range(len(self.chunk_names)):
                self._await_flags(PUBLISHED, chunk)
        except BaseException as error:
            self.failures.fail(error, 'wait for the node\'s other ranks')

    def _guarded(self, task, *args):
        super(NodeAccumulator, self)._guarded(task, *args)
        if self.failures.failed:
            self.memory.mark_failed()

    def _await_flags(self, row, chunk):
        flags = self.memory.flags[row, chunk]
        target = self._iteration_flag
        pause, longest = POLL_SECONDS
        while (flags < target).any():
            if self.memory.failed[0]:
                # Its own words come through the update-count watch, if
                # it hears them in time.
                if self.failures.event.wait(PEER_WORDS_SECONDS):
                    raise accumulator_module.Aborted()
                raise RuntimeError(
                    'local rank {} of this node stopped on an error while '
                    'the node\'s host was updating chunk {}; its own error '
                    'is on its output'.format(
                        int(self.memory.failed[0]) - 1, chunk))
            if self._stopping.is_set() or self.failures.failed:
                raise accumulator_module.Aborted()
            time.sleep(pause)
            pause = min(longest, pause * 2)

    def _process_part(self, chunk):
        names = self.chunk_names[chunk]
        with self._span('d2h', chunk):
            self._await_flags(DELIVERED, chunk)
        program = self._program(chunk, names)
        if program.unfused:
            raise RuntimeError(
                'parameters {} are no longer updated by a fused rule; the '
                'node\'s shared host cannot update them (build the '
                'optimizer with node_host=False)'.format(program.unfused))
        self._own_grads(names)
        with self._span('update', chunk):
            self._update_part(chunk, program)
        self.memory.flags[PUBLISHED, chunk, self._local_rank] = \
            self._iteration_flag
        if self._to_device:
            # A task of its own: a part of an earlier-layer chunk that is
            # already delivered goes first, while the other ranks finish
            # theirs of this one.
            self._pool.submit(self._guarded, self._publish_whole, chunk)
            return
        self._finish_one()

    def _publish_whole(self, chunk):
        """Once every local rank has updated its part of ``chunk``, its
        new weights (and gradient) start to this rank's device."""
        self._await_flags(PUBLISHED, chunk)
        with self._span('h2d', chunk):
            self.transfers[0].publish(chunk, self.chunk_names[chunk])
        self._finish_one()

    def _update_part(self, chunk, program):
        """Reduces, sums across the nodes and updates this rank's part of
        every run of the chunk (one fused call per run); this rank's part
        of every frozen run is reduced (``param.grad`` is the mean, as
        with Chainer) and not updated. A parameter whose rule has hooks of
        its own is one rank's whole (its hooks see the whole gradient, as
        with Chainer), the ranks taking such parameters in turn."""
        fused_rule = self._host_update.fused_rule
        mine = [self._owns(run) for run, _ in program.hooked]
        whole = [part[:3] + ((), None) for part in (
            self._part_of(run, whole=True)
            for (run, _), own in zip(program.hooked, mine) if own)
            if part is not None]
        self._reduce_and_update(chunk, fused_rule, program.runs,
                                program.frozen, whole)
        self._update_hooked(program.hooked, self._grad_buffer, mine)

    def _reduce_and_update(self, chunk, fused_rule, runs, frozen, whole):
        """This rank's parts of the fused runs, reduced and updated; of the
        frozen runs and of the ``whole`` parameters (hooked, this rank's),
        reduced."""
        parts = []
        for run, rules in runs:
            scalars = fused_rule.advance_run(rules)  # every rank: rule.t
            part = self._part_of(run)
            if part is not None:
                state = tuple(self._state.typed(key, run)[part[-1]] for key
                              in fused_rule.kernel_state_keys(rules[0]))
                parts.append(part[:3] + (state, scalars))
        still = [part[:3] + ((), None) for part in map(self._part_of, frozen)
                 if part is not None]
        if not parts and not still and not whole:
            return
        weights = [self._scale]
        if self.allreducer is not None:
            parts = self._sum_across_nodes(chunk, parts + still + whole)
            parts = parts[:len(parts) - len(still) - len(whole)]
            weights = [1.0]
        else:
            for _, slots, grads, _, _ in still + whole:
                reduce_sum(grads, slots, self._scale)
        for p, _, grads, _, _ in still:
            host_update_module.apply_hooks(p, grads, self._frozen_program)
        self._host_update.update_runs(parts, weights, False,
                                      self._hook_program, True)
        with self._lock:
            self.fused_calls += len(parts)

    def _owns(self, run):
        """Whether this rank updates the whole of a hooked parameter's run
        (the same local rank on every node, from its name)."""
        return zlib.crc32(run.names[0].encode('utf-8')) % \
            self.memory.group.local_size == self._local_rank

    def _part_of(self, run, whole=False):
        """This rank's part of ``run`` (``whole``: all of it) in the
        master, the slots and the gradients, and its slice: ``(master,
        slots, grads, slice)``; None where the part is empty."""
        if whole:
            begin, end = 0, (run.stop - run.start) // run.dtype.itemsize
        else:
            begin, end = self._part(run)
        if begin == end:
            return None
        part = slice(begin, end)
        return (buffers.typed(self.master.buffer, run)[part],
                [buffers.typed(s, run)[part] for s in self.memory.slots],
                buffers.typed(self._grad_buffer, run)[part], part)

    def _sum_across_nodes(self, chunk, parts):
        """The parts' mean over every rank: summed over this node's slots,
        then over the nodes; the fused update then reads it."""
        reduced = []
        for _, slots, grads, _, _ in parts:
            reduce_sum(grads, slots)
            reduced.append(grads)
        sequence = self._sequence_base + len(self.chunk_names) - 1 - chunk
        with self._span('allreduce', chunk,
                        thread=self.allreducer.thread_name):
            self._wait_for(self.allreducer.start(reduced, sequence=sequence))
        for grads in reduced:
            grads *= grads.dtype.type(self._scale)
        return [(p, [grads], grads, state, scalars)
                for p, _, grads, state, scalars in parts]

    def _part(self, run):
        """This rank's elements ``[begin, end)`` of a run."""
        bounds = self._parts.get(run)
        if bounds is None:
            n = (run.stop - run.start) // run.dtype.itemsize
            align = max(1, _PART_ALIGN_BYTES // run.dtype.itemsize)
            size = self.memory.group.local_size
            cuts = [min(n, -(-n * i // size // align) * align)
                    for i in range(size + 1)]
            cuts[-1] = n
            bounds = self._parts[run] = (cuts[self._local_rank],
                                         cuts[self._local_rank + 1])
        return bounds

    def close(self):
        """Stops the host threads and drops this rank's views of the
        node's memory (the model's arrays and gradients are released by
        the master first, see ``FlatMaster.release``)."""
        super(NodeAccumulator, self).close()
        self._grads = {}
        self._grad_buffer = None
        self._state = None

    def release_memory(self):
        """Unmaps the node's memory, after :meth:`close` and the
        master's release."""
        memory, self.memory = self.memory, None
        if memory is not None:
            memory.close()
