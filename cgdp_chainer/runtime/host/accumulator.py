"""The host accumulator: master weights, the optimizer, per-chunk updates."""
import concurrent.futures
import numbers
import os
import threading
import warnings

import numpy

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.host import host_update as host_update_module
from cgdp_chainer.runtime.host.reduction import reduce_sum, reduce_weighted  # NOQA: public here too


class FailureBox(object):
    """Holds the first exception raised by any CGDP thread.

    Every wait in the runtime polls :attr:`event`, so one failure stops all
    threads promptly and nothing waits forever. A thread that stops
    because of another's failure raises :class:`Aborted`, which is never
    the error a caller sees (:meth:`surfaced`).
    """

    # Seconds the caller gives the original failure to be recorded, where
    # an Aborted reached it first (a thread that saw the stop before the
    # failing one filed its error).
    RECORD_GRACE_SECONDS = 5.0

    def __init__(self):
        self.event = threading.Event()
        self._lock = threading.Condition()
        self.error = None

    def fail(self, error, where):
        """Records ``error`` (raised in ``where``) if it is the first, and
        stops every thread. An :class:`Aborted` is only a stop: it records
        nothing."""
        with self._lock:
            if self.error is None and not isinstance(error, Aborted):
                try:
                    error.add_note('(raised in the CGDP {})'.format(where))
                except AttributeError:
                    pass
                self.error = error
                self._lock.notify_all()
        self.event.set()

    @property
    def failed(self):
        return self.event.is_set()

    def words(self):
        """The recorded failure's type and message in words
        (:func:`describe_error`), or None: what a peer rank is told."""
        error = self.error
        return None if error is None else describe_error(error)

    def surfaced(self, caught=None):
        """The exception for the caller to raise: ``caught`` (what its own
        code raised), unless that is an :class:`Aborted`, for which the
        first recorded failure (its type, message, notes and the traceback
        of the thread that raised it), waited for a moment where it is not
        recorded yet.

        Args:
            caught (BaseException or None): None: the recorded failure.

        Returns:
            BaseException: Never an :class:`Aborted`.
        """
        if caught is not None and not isinstance(caught, Aborted):
            return caught
        with self._lock:
            self._lock.wait_for(lambda: self.error is not None,
                                self.RECORD_GRACE_SECONDS)
            if self.error is not None:
                return self.error
        return RuntimeError(
            'a CGDP thread stopped the iteration, but no failure was '
            'recorded within {} s (a bug of CGDP: please report it with '
            'this traceback)'.format(self.RECORD_GRACE_SECONDS))


def describe_error(error):
    """An error's type and the last line of its message, in words (a
    worker's error carries its traceback, whose last line names the
    exception)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return '{}: {}'.format(type(error).__name__, lines[-1].strip())


class Aborted(Exception):
    """Raised inside a CGDP thread that stops because another one failed."""


def check_host_threads(host_threads):
    """Raises ValueError unless ``host_threads`` is a positive integer or
    None (the ``host_threads=`` option of both front ends)."""
    if host_threads is not None and (
            isinstance(host_threads, bool) or
            not isinstance(host_threads, numbers.Integral) or
            host_threads < 1):
        raise ValueError(
            'host_threads must be a positive integer or None (CPU cores, '
            'at most 4); got {!r}'.format(host_threads))


def optimizer_hooks(optimizer):
    """The optimizer's ``(pre, post)`` update hooks in registration order."""
    hookable = optimizer._hookable
    if hookable is None:
        return [], []
    return (list(hookable._pre_update_hooks.values()),
            list(hookable._post_update_hooks.values()))


def needs_whole_gradient(optimizer):
    """Hooks that look at all gradients at once (e.g. global-norm clipping)
    rather than one parameter at a time."""
    pre, post = optimizer_hooks(optimizer)
    hooks = pre + post
    return [h for h in hooks if not getattr(h, 'call_for_each_param', False)]


class HostAccumulator(object):
    """Sums each chunk over the devices and updates it on the host.

    The optimizer's target is the master model. Device workers call
    :meth:`deliver` when a chunk's gradients are on their way; once all
    devices have delivered chunk ``c``, a host thread waits for those copies,
    reduces them into the master's gradients, runs the update rule of each of
    the chunk's parameters (with the optimizer's per-parameter hooks) and
    publishes the new values to every device.

    Where the optimizer has a fused host rule (SGD, MomentumSGD,
    CorrectedMomentumSGD, NesterovAG, Adam and its variants, RMSprop,
    AdaGrad, AdaDelta, RMSpropGraves, with the hooks ``WeightDecay``,
    ``Lasso`` and ``GradientHardClipping``, and subclasses of these that
    change nothing of the update; see
    :mod:`cgdp_chainer.runtime.host.host_update`),
    the reduction and the update of a parameter are one pass over its slots,
    the parameter and its state, split across the host's cores. The
    parameters, the devices' slots, the master's gradients and the fused
    state are views of flat buffers laid out alike
    (:mod:`~cgdp_chainer.runtime.transport.buffers`), so a chunk whose rules share
    their scalars is one call over one slice of each. Under MPI
    the chunk is reduced and all-reduced first and the fused update reads
    the result. A frozen parameter (``Link.disable_update()``) is reduced
    into ``param.grad`` and not updated, as Chainer leaves it. Everything
    else runs Chainer's own update rule on the reduced ``param.grad``.

    After an iteration started with ``write_grads=True`` every master
    ``param.grad`` holds the gradient its update used, as
    ``StandardUpdater`` leaves it: reduced over the devices with the
    reduction's weights (and over the MPI ranks), after the optimizer's
    pre-update hooks, divided by the loss scale where one is set, in an
    array that nothing writes before the next ``update()`` starts. Without
    MPI that array is a view of the first device's slot: the reduction
    writes the gradient over the slot's values as it reads them (no second
    buffer to fetch into the cache), and where the slot already is the
    gradient (one device, no hook or loss scale that changes it in a fused
    run) nothing is written at all. A replica writes its slots only while
    an ``update()`` runs, so the view holds until the next one starts,
    where ``StandardUpdater``'s ``cleargrads()`` would drop its gradient
    too. Under MPI the arrays are the accumulator's own. With
    ``write_grads=False`` the fused update does not write the gradient,
    and ``param.grad`` may be a device's slot or an earlier gradient.

    If the optimizer has a hook that needs the whole gradient (such as
    :class:`chainer.optimizer_hooks.GradientClipping`), or uses dynamic loss
    scaling (``optimizer.loss_scaling()``: an iteration with a non-finite
    gradient anywhere is skipped for every parameter), chunks are only
    reduced as they arrive and the update runs once after the last chunk,
    as ``optimizer.update()``: the same result, with the update exposed.
    A static loss scale divides the reduced gradient after the hooks, as
    Chainer's update rules do; the devices' backward starts from the scale.

    Args:
        optimizer (chainer.GradientMethod): Set up on the master model.
        transfers (list): One port per device (see
            :mod:`cgdp_chainer.runtime.transport.transfer`), each with a flat
            ``slot_buffer`` laid out as ``master``'s.
        chunk_names (list of list of str): Parameter paths per chunk, each
            chunk next to each other in ``master``'s layout.
        reduction (str): ``'mean'`` (weighted by each device's share of the
            batch) or ``'sum'``.
        failures (FailureBox): Shared with the device workers.
        master (cgdp_chainer.runtime.transport.buffers.FlatMaster): The optimizer's
            target's parameters as views of their flat buffer.
        n_threads (int or None): Host threads; default: CPU count, at most 4.
        timeline (Timeline or None): Records reduce, update, h2d and d2h.
        allreducer (object or None): Sums chunks across MPI ranks (see
            :mod:`cgdp_chainer.mpi`) after the local reduction.
        grad_buffer (numpy.ndarray or None): The flat buffer of the
            master's gradients, where other processes share it (the ranks
            of a node); default: a private one, which takes over the
            gradients the parameters hold.
        state (cgdp_chainer.runtime.transport.buffers.FlatState or None): The fused
            rules' state buffers, where shared; default: private ones.
        block_threads (int or None): Threads that split one fused call
            (default: the CPU count; fewer where ranks share the cores).
    """

    def __init__(self, optimizer, transfers, chunk_names, reduction,
                 failures, master, n_threads=None, timeline=None,
                 allreducer=None, grad_buffer=None, state=None,
                 block_threads=None):
        self.optimizer = optimizer
        self.transfers = transfers
        self.reduction = reduction
        self.failures = failures
        self.timeline = timeline
        self.allreducer = allreducer
        self.master = master
        self.master_params = dict(optimizer.target.namedparams())
        for name, param in self.master_params.items():
            if param.array is None:
                raise ValueError(
                    'parameter {} is not initialized: run one forward pass '
                    'of the model (or give its layers input sizes) before '
                    'building the updater'.format(name))
        self._layout = master.layout
        # The master's own gradient arrays: param.grad until the first
        # update and after a relayout (later, without MPI, the first slot
        # holds it), and under MPI the cross-rank sum's buffer.
        if grad_buffer is None:
            self._grad_buffer = buffers.host_buffer(self._layout.capacity)
            self._grads = self._layout.views(self._grad_buffer)
            self._take_grads()
        else:
            # Shared with other processes, which may be writing it: the
            # gradients are taken chunk by chunk as they are reduced.
            self._grad_buffer = grad_buffer
            self._grads = self._layout.views(self._grad_buffer)
        self._slot_views = [self._layout.views(t.slot_buffer)
                            for t in transfers]
        self._state = state or buffers.FlatState(self._layout)
        self._programs = {}
        self._chunk_names = chunk_names
        self._whole_gradient = bool(needs_whole_gradient(optimizer))
        self.deferred_update = self._whole_gradient
        self._warned_dynamic = False
        self._write_grads = True
        # Whether the one device's slot is the reduced gradient (before
        # the hooks and the loss scale): set by start_iteration.
        self._slot_is_sum = False
        self._loss_scale = None
        self._hook_program = None
        # The same without the loss scale's division: what the hooks do to
        # a frozen parameter's gradient.
        self._frozen_program = None
        self.grads_written = 0
        # Fused update calls so far: one per run of a chunk's slice.
        self.fused_calls = 0
        # Those of them that stored their gradient (for param.grad).
        self.fused_grad_writes = 0
        if self._whole_gradient:
            warnings.warn(
                'optimizer hook(s) {} need the whole gradient: CGDP reduces '
                'chunks as they arrive but updates only after the last one, '
                'which leaves the update on the critical path'.format(
                    [getattr(h, 'name', type(h).__name__) for h in
                     needs_whole_gradient(optimizer)]), stacklevel=3)
        if n_threads is None:
            n_threads = max(1, min(4, os.cpu_count() or 1))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            n_threads, thread_name_prefix='cgdp-host')
        # The whole-gradient hooks run in optimizer.update(): nothing fuses.
        self._host_update = None if self._whole_gradient else \
            host_update_module.make_host_update(optimizer, block_threads)
        self._lock = threading.Condition()
        self._delivered = None
        self._ready_events = None
        self._remaining = 0
        self.iteration = None
        self._weights = None
        self._sequence_base = 0
        self._sequence_next = 0
        self._stopping = threading.Event()

    def _take_grads(self):
        """Makes every ``param.grad`` the accumulator's view, keeping the
        values a gradient already held."""
        for name, param in self.master_params.items():
            grad = param.grad
            if grad is not None and getattr(grad, 'shape', None) == \
                    param.shape and type(grad) is numpy.ndarray:
                self._grads[name][...] = grad
            param.grad = self._grads[name]

    @property
    def chunk_names(self):
        """Parameter paths per chunk (input side first)."""
        return self._chunk_names

    @chunk_names.setter
    def chunk_names(self, chunk_names):
        self._chunk_names = chunk_names
        self._programs = {}

    def forget_programs(self):
        """Forms every chunk's fused runs anew at its next update (after
        the optimizer's state was restored, say)."""
        self._programs = {}

    def relayout(self, layout):
        """Follows the master (already moved by
        :meth:`FlatMaster.relayout`) into ``layout``: the gradients and the
        fused state move too, and the slots are viewed by it (between
        iterations)."""
        if layout == self._layout:
            return
        self._state.relayout(layout)
        self._layout = layout
        # The last update's gradients, wherever they are (a lent slot is
        # viewed by the old layout until the slots are viewed anew below).
        self._grads = buffers.place(
            layout, self._grad_buffer,
            {name: self._gradient_of(name).copy()
             for name in self.master_params})
        for name, param in self.master_params.items():
            param.grad = self._grads[name]
        self._slot_views = [layout.views(t.slot_buffer)
                            for t in self.transfers]
        self._programs = {}

    def start_iteration(self, iteration, shares, write_grads=True,
                        revalidate=True):
        """Prepares for a new iteration.

        Args:
            iteration (int): Its number, for the timeline.
            shares (list of float): Each device's fraction of the global
                batch; used by ``reduction='mean'``.
            write_grads (bool): Whether the master's ``param.grad`` must
                hold the update's gradient afterwards (something may read
                it); False spares the fused update that write.
            revalidate (bool): Whether code other than the updater may have
                touched the master, its update rules or their state since
                the last iteration (then every chunk's fused runs are
                formed again; else those of the last iteration hold).
        """
        if revalidate:
            self.forget_programs()
        n_chunks = len(self.chunk_names)
        self._start_loss_scale()
        self._write_grads = bool(write_grads)
        if self._write_grads or self.deferred_update:
            self.grads_written += 1
        with self._lock:
            self.iteration = iteration
            self._delivered = [0] * n_chunks
            self._ready_events = [[None] * len(self.transfers)
                                  for _ in range(n_chunks)]
            self._remaining = n_chunks + (1 if self.deferred_update else 0)
            self._sequence_base = self._sequence_next
            self._sequence_next += n_chunks
        if self.reduction == 'sum':
            self._weights = [1.0] * len(self.transfers)
        else:
            self._weights = list(shares)
        self._slot_is_sum = (len(self.transfers) == 1 and
                             self.allreducer is None and
                             self._weights[0] == 1.0)
        self._hook_program = self._frozen_program = None
        if self._host_update is not None:
            hooks = optimizer_hooks(self.optimizer)
            self._hook_program = self._host_update.hooks(
                *hooks, loss_scale=self._loss_scale)
            self._frozen_program = self._host_update.hooks(
                *hooks, loss_scale=self._loss_scale, divide=False)
        if not self.deferred_update:
            # Chainer's GradientMethod.update advances t once per update.
            self.optimizer.t += 1

    def _start_loss_scale(self):
        """Takes the optimizer's loss scale of this iteration (dynamic
        scaling changes it after each update)."""
        optimizer = self.optimizer
        dynamic = bool(getattr(optimizer, '_loss_scaling_is_dynamic', False))
        self.deferred_update = self._whole_gradient or dynamic
        if dynamic and not self._whole_gradient and not self._warned_dynamic:
            self._warned_dynamic = True
            warnings.warn(
                'dynamic loss scaling skips an iteration whose gradient is '
                'not finite anywhere: CGDP reduces chunks as they arrive but '
                'updates only after the last one, with Chainer\'s update '
                'rules, which leaves the update on the critical path',
                stacklevel=4)
        # Chainer has no public getter for the scale (7.8.1).
        scale = getattr(optimizer, '_loss_scale', None)
        if scale is not None or self._loss_scale is not None:
            # As the backward from the scale sets it on each parameter;
            # Chainer's update rules and WeightDecay read it there.
            for param in self.master_params.values():
                param._loss_scale = scale
        self._loss_scale = scale

    def deliver(self, device_index, chunk, ready):
        """Called by a device worker after sending chunk ``chunk``.

        Args:
            device_index (int): The worker's device.
            chunk (int): The chunk whose gradients were sent.
            ready: What the transfer's ``wait_grads`` waits on.
        """
        with self._lock:
            self._ready_events[chunk][device_index] = ready
            self._delivered[chunk] += 1
            complete = self._delivered[chunk] == len(self.transfers)
        if complete:
            self._pool.submit(self._guarded, self._process_chunk, chunk)

    def wait(self, poll_seconds=0.05):
        """Blocks until every chunk of the iteration is updated and
        published, or a thread has failed (then returns; the caller raises).
        """
        with self._lock:
            while self._remaining > 0 and not self.failures.failed:
                self._lock.wait(poll_seconds)

    def close(self):
        """Stops the host threads (waits for running tasks to end; a task
        waiting for other ranks gives up within a fraction of a second)."""
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._host_update is not None:
            self._host_update.close()
        # The slots may be shared memory that the replicas free next.
        self._slot_views = []

    def _guarded(self, task, *args):
        try:
            if self.failures.failed:
                return
            task(*args)
        except Aborted:
            pass
        except BaseException as error:
            self.failures.fail(error, 'host accumulator')
        finally:
            with self._lock:
                self._lock.notify_all()

    def _span(self, kind, chunk, thread=None):
        if self.timeline is None:
            return _NullSpan()
        return self.timeline.span(self.iteration, 'host', kind, chunk,
                                  thread=thread)

    def _process_chunk(self, chunk):
        names = self.chunk_names[chunk]
        with self._span('d2h', chunk):
            for transfer, ready in zip(self.transfers,
                                       self._ready_events[chunk]):
                transfer.wait_grads(ready)
        sequence = self._sequence_base + len(self.chunk_names) - 1 - chunk
        if self.deferred_update:
            with self._span('reduce', chunk):
                if self.allreducer is None:
                    self._reduce(names)
                else:
                    self._reduce_across_ranks(names, sequence, chunk)
            with self._lock:
                self._remaining -= 1
                # Exactly one thread sees the count reach 1: all reduced.
                last = self._remaining == 1
                self._lock.notify_all()
            if last:
                self._update_whole_model()
            return
        if self.allreducer is None:
            # Fused runs are reduced inside their update.
            program = self._program(chunk, names)
            with self._span('reduce', chunk):
                self._reduce(program.unfused + program.frozen_names())
        else:
            # The cross-rank sum needs every reduced gradient first.
            with self._span('reduce', chunk):
                self._reduce_across_ranks(names, sequence, chunk)
            program = self._program(chunk, names)
        with self._span('update', chunk):
            # A frozen parameter's update is nothing; the optimizer's hooks
            # still change its gradient, as Chainer's do.
            self._update(program.unfused + program.frozen_names())
            if program.runs:
                self._fused_update(program.runs,
                                   from_slots=self.allreducer is None)
            if self.allreducer is None:
                self._update_hooked(program.hooked,
                                    self.transfers[0].slot_buffer,
                                    from_slots=True)
            else:
                self._update_hooked(program.hooked, self._grad_buffer)
        if program.unfused:
            # Chainer's rules may rebind arrays, and their first update
            # creates the state that lets the next iteration fuse.
            self.master.sync(program.unfused)
            self._programs.pop(chunk, None)
        with self._span('h2d', chunk):
            for transfer in self.transfers:
                transfer.publish(chunk, names)
        self._finish_one()

    def _program(self, chunk, names):
        """The chunk's fused runs and unfused parameters (formed again after
        anything but the updater may have touched the master)."""
        program = self._programs.get(chunk)
        if program is None:
            program = self._programs[chunk] = self._form_program(names)
        return program

    def _form_program(self, names):
        """Splits a chunk into runs that one fused call updates and the
        parameters that Chainer's rules update.

        A run is a stretch of the chunk's slice whose parameters the fused
        rule takes (see :meth:`FusedRule.fuses`) with equal scalars
        (:meth:`FusedRule.run_key`); their state is moved into the flat
        state buffers.
        """
        host_update = self._host_update
        if host_update is None or self._hook_program is None or not names:
            return _ChunkProgram([], list(names), [])
        fused_rule = host_update.fused_rule
        runs, unfused, frozen, hooked = [], [], [], []
        for run in self._layout.span(names).runs:
            group, key, still = [], None, []
            for name in run.names:
                param = self.master_params[name]
                rule = param.update_rule
                if host_update_module.frozen(param):
                    # Reduced (param.grad is the mean), never updated.
                    still.append(name)
                    runs.append(group)
                    group, key = [], None
                    continue
                if still:
                    frozen.append(still)
                    still = []
                if not fused_rule.fuses_update(param):
                    unfused.append(name)
                    runs.append(group)
                    group, key = [], None
                    continue
                if host_update_module.rule_hooks(rule):
                    # Its own hooks run between the gradient and the update.
                    self._state.bind(name, rule,
                                     fused_rule.state_keys_of(rule))
                    hooked.append((self._layout.run_of([name]), [rule]))
                    runs.append(group)
                    group, key = [], None
                    continue
                this_key = fused_rule.run_key(rule)
                if group and this_key != key:
                    runs.append(group)
                    group = []
                key = this_key
                self._state.bind(name, rule, fused_rule.state_keys_of(rule))
                group.append(name)
            runs.append(group)
            frozen.append(still)
        return _ChunkProgram(
            [(self._layout.run_of(group),
              [self.master_params[name].update_rule for name in group])
             for group in runs if group], unfused,
            [self._layout.run_of(still) for still in frozen if still],
            hooked)

    def _own_grads(self, names):
        """Makes ``param.grad`` of ``names`` the accumulator's views again
        (where a slot was lent, or user code set another array)."""
        self._point_grads(names, self._grads)

    def _point_grads(self, names, views):
        """Makes ``param.grad`` of ``names`` their arrays of ``views``
        (the accumulator's gradients or a slot's views)."""
        params = self.master_params
        for name in names:
            param, view = params[name], views[name]
            # Chainer's setter checks the array: skip it where it is set.
            if param.grad is not view:
                param.grad = view

    def _slot_is_gradient(self):
        """Whether the first device's slot already holds the gradient a
        fused update uses: one device with weight 1 (no MPI), and no hook
        or loss scale that changes it."""
        return self._slot_is_sum and self._hook_program[0].size == 0

    def _gradient_of(self, name):
        """The array that holds the last update's gradient of ``name``:
        ``param.grad`` where it is an array of the parameter's shape and
        dtype (a lent slot, or what Chainer's rule left), else the
        accumulator's own."""
        param = self.master_params[name]
        grad, own = param.grad, self._grads[name]
        if type(grad) is numpy.ndarray and grad.shape == own.shape and \
                grad.dtype == own.dtype:
            return grad
        return own

    def fused_parameters(self):
        """The parameters that the next update of each chunk fuses (the
        rest go through Chainer's rules), in chunk order."""
        names = []
        for chunk, chunk_names in enumerate(self.chunk_names):
            program = self._program(chunk, chunk_names)
            names += [name for run, _ in program.runs + program.hooked
                      for name in run.names]
        return names

    def _reduce(self, names):
        """Reduces the devices' slots of ``names`` into the first device's
        slot, which becomes ``param.grad`` (the parameters that Chainer's
        rules update; their hooks and the loss scale's division then
        change it in place, as they would any gradient)."""
        first = self._slot_views[0]
        self._point_grads(names, first)
        if self._slot_is_sum:
            return  # one device: its slot is the sum already
        weights = self._weights
        equal = all(w == weights[0] for w in weights)
        scale = weights[0] if equal else None
        for name in names:
            out = first[name]
            # Element by element in place: each element of the first slot
            # is read before it is written.
            slots = [views[name] for views in self._slot_views]
            if equal:
                reduce_sum(out, slots, scale)
            else:
                reduce_weighted(out, slots, weights)

    def _reduce_across_ranks(self, names, sequence, chunk):
        """Reduces the chunk's slice over the devices into the master's
        gradients, then sums it across MPI ranks (one request per run)."""
        weights = self._weights
        equal = all(w == weights[0] for w in weights)
        # Local weights wait until after the cross-rank sum when equal, so
        # that the global mean is one scaling of the global sum.
        reduced = []
        if names:
            for run in self._layout.span(names).runs:
                out = buffers.typed(self._grad_buffer, run)
                slots = [buffers.typed(t.slot_buffer, run)
                         for t in self.transfers]
                if equal:
                    reduce_sum(out, slots)
                else:
                    reduce_weighted(out, slots, weights)
                reduced.append(out)
        self._own_grads(names)
        # Even a chunk without parameters takes its sequence number.
        # Host threads may finish chunks in any order; numbering them
        # from the output end makes every rank send them alike.
        # The trace shows the cross-rank sum on the communication
        # thread's track, from the request to its completion.
        with self._span('allreduce', chunk,
                        thread=self.allreducer.thread_name):
            handle = self.allreducer.start(reduced, sequence=sequence)
            self._wait_for(handle)
        if self.reduction == 'mean':
            scale = (weights[0] if equal else 1.0) / self.allreducer.size
            for out in reduced:
                out *= out.dtype.type(scale)

    def _wait_for(self, handle):
        while True:
            # Bounded waits: a peer rank that stopped (Ctrl-C, a failure)
            # must not keep this thread, and so close(), waiting.
            try:
                handle.wait(timeout=0.2)
                return
            except TimeoutError:
                if self.failures.failed or self._stopping.is_set():
                    raise Aborted()

    def _fused_update(self, runs, from_slots):
        """One fused call per run: from the devices' slots (no all-reducer)
        or from the reduced gradients (which it overwrites in place).

        Where ``param.grad`` must hold the gradient afterwards, the kernel
        writes each block's final gradient over the first device's slot,
        just read (no second buffer to fetch into the cache), and
        ``param.grad`` is that slot's view; where that slot already is the
        gradient (:meth:`_slot_is_gradient`), nothing is written.
        """
        fused_rule = self._host_update.fused_rule
        write = self._write_grads
        if write and from_slots:
            for run, _ in runs:
                self._point_grads(run.names, self._slot_views[0])
            write = not self._slot_is_gradient()
        weights, weighted = self._weights, False
        if from_slots:
            weighted = not all(w == weights[0] for w in weights)
            if not weighted:
                weights = weights[:1]
        else:
            weights = [1.0]
        calls = []
        for run, rules in runs:
            if from_slots:
                slots = [buffers.typed(t.slot_buffer, run)
                         for t in self.transfers]
            else:
                slots = [buffers.typed(self._grad_buffer, run)]
            state = tuple(self._state.typed(key, run) for key in
                          fused_rule.kernel_state_keys(rules[0]))
            calls.append((buffers.typed(self.master.buffer, run), slots,
                          slots[0], state, fused_rule.advance_run(rules)))
        self._host_update.update_runs(calls, weights, weighted,
                                      self._hook_program, write)
        with self._lock:
            self.fused_calls += len(calls)
            if write:
                self.fused_grad_writes += len(calls)

    def _update_hooked(self, hooked, grad_buffer, parts=None,
                       from_slots=False):
        """Updates parameters whose rules have hooks of their own, each as
        ``UpdateRule.update`` does, with the fused kernel: the gradient
        (reduced into ``grad_buffer``, which ``param.grad`` views) goes
        through the optimizer's hooks and the loss scale's division, then
        the rule's pre-update hooks (any callable, run here as Chainer runs
        them), the fused update with no hooks, and the rule's post-update
        hooks.

        Args:
            hooked (list): ``(Run, [rule])`` per parameter.
            grad_buffer (numpy.ndarray): The flat buffer holding their
                reduced gradients (``from_slots``: where they go, the first
                device's slot).
            parts (list or None): Per parameter, whether this process
                updates it (the node's ranks share the work); None: all.
            from_slots (bool): Reduce the devices' slots first, in one pass
                with the optimizer's hooks.
        """
        if not hooked:
            return
        fused_rule = self._host_update.fused_rule
        no_hooks = host_update_module.hook_program([], [])
        for index, (run, rules) in enumerate(hooked):
            # Every rank of a node advances t; one updates.
            scalars = fused_rule.advance_run(rules)
            if parts is not None and not parts[index]:
                continue
            rule, (name,) = rules[0], run.names
            param = self.master_params[name]
            p = buffers.typed(self.master.buffer, run)
            grad = buffers.typed(grad_buffer, run)
            if from_slots:
                self._hooked_gradient(p, grad, run)
            else:
                host_update_module.apply_hooks(p, grad, self._hook_program)
            view = grad.reshape(param.shape)
            host_update_module.call_rule_hooks(rule, param, 'pre', view)
            state = tuple(self._state.typed(key, run) for key in
                          fused_rule.kernel_state_keys(rule))
            self._host_update.update_runs(
                [(p, [grad], grad, state, scalars)], [1.0], False, no_hooks,
                False)
            host_update_module.call_rule_hooks(rule, param, 'post', view)
        with self._lock:
            self.fused_calls += len(hooked)

    def _hooked_gradient(self, p, grad, run):
        """The devices' slots of ``run``, reduced with their weights and
        put through the optimizer's hooks in one pass into ``grad``."""
        weights = self._weights
        weighted = not all(w == weights[0] for w in weights)
        self._host_update.gradient(
            p, [buffers.typed(t.slot_buffer, run) for t in self.transfers],
            weights if weighted else weights[:1], weighted,
            self._hook_program, grad)

    def _update(self, names):
        optimizer = self.optimizer
        pre, post = optimizer_hooks(optimizer)
        for name in names:
            param = self.master_params[name]
            for hook in pre:
                hook(param.update_rule, param)
            param.update()
            for hook in post:
                hook(param.update_rule, param)

    def _update_whole_model(self):
        with self._span('update', None):
            self.optimizer.update()
            self.master.sync(list(self.master_params))
        with self._span('h2d', None):
            for chunk, names in enumerate(self.chunk_names):
                for transfer in self.transfers:
                    transfer.publish(chunk, names)
        self._finish_one()

    def _finish_one(self):
        with self._lock:
            self._remaining -= 1
            self._lock.notify_all()


class _ChunkProgram(object):
    """How one chunk is updated: its fused runs, as ``(Run, rules)``, the
    parameters left to Chainer's rules, the runs of frozen parameters
    (:func:`~cgdp_chainer.runtime.host.host_update.frozen`), whose
    gradient is reduced and which are not updated, and the parameters
    whose rules have hooks of their own, as ``(Run, [rule])`` each
    (updated fused, their hooks run in between)."""

    def __init__(self, runs, unfused, frozen, hooked=()):
        self.runs = runs
        self.unfused = unfused
        self.frozen = frozen
        self.hooked = list(hooked)

    def frozen_names(self):
        return [name for run in self.frozen for name in run.names]

    def hooked_names(self):
        return [name for run, _ in self.hooked for name in run.names]


class _NullSpan(object):

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
