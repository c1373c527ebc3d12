"""The host accumulator: master weights, the optimizer, per-chunk updates."""
import concurrent.futures
import os
import threading
import warnings

import numpy

from cgdp_chainer.runtime import host_update as host_update_module
from cgdp_chainer.runtime.reduction import reduce_sum, reduce_weighted  # NOQA: public here too


class FailureBox(object):
    """Holds the first exception raised by any CGDP thread.

    Every wait in the runtime polls :attr:`event`, so one failure stops all
    threads promptly and nothing waits forever.
    """

    def __init__(self):
        self.event = threading.Event()
        self._lock = threading.Lock()
        self.error = None

    def fail(self, error, where):
        with self._lock:
            if self.error is None:
                try:
                    error.add_note('(raised in the CGDP {})'.format(where))
                except AttributeError:
                    pass
                self.error = error
        self.event.set()

    @property
    def failed(self):
        return self.event.is_set()


class Aborted(Exception):
    """Raised inside a CGDP thread that stops because another one failed."""


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

    Where the optimizer has a fused host rule (SGD, MomentumSGD, NesterovAG,
    Adam and its variants, with the hooks ``WeightDecay``, ``Lasso`` and
    ``GradientHardClipping``; see :mod:`cgdp_chainer.runtime.host_update`),
    the reduction and the update of a parameter are one pass over its slots,
    the parameter and its state, split across the host's cores. Under MPI
    the chunk is reduced and all-reduced first and the fused update reads
    the result. Everything else runs Chainer's own update rule on the
    reduced ``param.grad``.

    After an iteration started with ``write_grads=True`` every master
    ``param.grad`` holds the gradient its update used, as
    ``StandardUpdater`` leaves it: reduced over the devices with the
    reduction's weights (and over the MPI ranks), after the optimizer's
    pre-update hooks, divided by the loss scale where one is set. The
    arrays are the accumulator's own (never a device's slot). With
    ``write_grads=False`` the fused update does not write them, and
    ``param.grad`` may be a device's slot or an earlier gradient.

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
        transfers (list): One transfer object per device
            (see :mod:`cgdp_chainer.transfer`).
        chunk_names (list of list of str): Parameter paths per chunk.
        reduction (str): ``'mean'`` (weighted by each device's share of the
            batch) or ``'sum'``.
        failures (FailureBox): Shared with the device workers.
        n_threads (int or None): Host threads; default: CPU count, at most 4.
        timeline (Timeline or None): Records reduce, update, h2d and d2h.
        allreducer (object or None): Sums chunks across MPI ranks (see
            :mod:`cgdp_chainer.mpi`) after the local reduction.
    """

    def __init__(self, optimizer, transfers, chunk_names, reduction,
                 failures, n_threads=None, timeline=None, allreducer=None):
        self.optimizer = optimizer
        self.transfers = transfers
        self.chunk_names = chunk_names
        self.reduction = reduction
        self.failures = failures
        self.timeline = timeline
        self.allreducer = allreducer
        self.master_params = dict(optimizer.target.namedparams())
        for name, param in self.master_params.items():
            if param.array is None:
                raise ValueError(
                    'parameter {} is not initialized: run one forward pass '
                    'of the model (or give its layers input sizes) before '
                    'building the updater'.format(name))
            grad = param.grad
            if type(grad) is not numpy.ndarray or \
                    grad.shape != param.array.shape or \
                    grad.dtype != param.array.dtype or \
                    not grad.flags.c_contiguous:
                param.grad = numpy.zeros_like(param.array)
        # The master's own gradient arrays, never a device's slot, so that
        # what an update leaves in param.grad stays until the next one.
        self._grads = {name: param.grad
                       for name, param in self.master_params.items()}
        self._whole_gradient = bool(needs_whole_gradient(optimizer))
        self.deferred_update = self._whole_gradient
        self._warned_dynamic = False
        self._write_grads = True
        self._loss_scale = None
        self.grads_written = 0
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
            host_update_module.make_host_update(optimizer)
        self._lock = threading.Condition()
        self._delivered = None
        self._ready_events = None
        self._remaining = 0
        self.iteration = None
        self._weights = None
        self._sequence_base = 0
        self._sequence_next = 0
        self._stopping = threading.Event()

    def start_iteration(self, iteration, shares, write_grads=True):
        """Prepares for a new iteration.

        Args:
            iteration (int): Its number, for the timeline.
            shares (list of float): Each device's fraction of the global
                batch; used by ``reduction='mean'``.
            write_grads (bool): Whether the master's ``param.grad`` must
                hold the update's gradient afterwards (something may read
                it); False spares the fused update that write.
        """
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
                self._reduce(names, sequence, chunk)
            with self._lock:
                self._remaining -= 1
                # Exactly one thread sees the count reach 1: all reduced.
                last = self._remaining == 1
                self._lock.notify_all()
            if last:
                self._update_whole_model()
            return
        if self.allreducer is None:
            # Fused parameters are reduced inside their update.
            fused, unfused, inputs = self._partition(names, from_slots=True)
            with self._span('reduce', chunk):
                self._reduce(unfused)
        else:
            # The cross-rank sum needs every reduced gradient first.
            with self._span('reduce', chunk):
                self._reduce(names, sequence, chunk)
            fused, unfused, inputs = self._partition(names, from_slots=False)
        with self._span('update', chunk):
            self._update(unfused)
            if fused:
                self._fused_update(fused, *inputs)
        with self._span('h2d', chunk):
            for transfer in self.transfers:
                transfer.publish(chunk, names)
        self._finish_one()

    def _reduce(self, names, sequence=None, chunk=None):
        transfers = self.transfers
        weights = self._weights
        equal = all(w == weights[0] for w in weights)
        # Local weights wait until after the cross-rank sum when equal, so
        # that the global mean is one scaling of the global sum.
        scale = weights[0] if equal and self.allreducer is None else None
        reduced = []
        for name in names:
            param = self.master_params[name]
            slots = [t.slots[name] for t in transfers]
            if not self._write_grads and len(slots) == 1 and \
                    scale in (None, 1.0) and \
                    slots[0].shape == param.shape and \
                    slots[0].dtype == param.dtype and \
                    slots[0].flags.c_contiguous:
                # One device: its slot is the sum; lend it, copy nothing.
                param.grad = slots[0]
                reduced.append(slots[0])
                continue
            out = param.grad = self._grads[name]
            if equal:
                reduce_sum(out, slots, scale)
            else:
                reduce_weighted(out, slots, weights)
            reduced.append(out)
        if self.allreducer is not None:
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

    def _partition(self, names, from_slots):
        """Splits ``names`` into (fused, unfused, fused update's inputs).

        Args:
            names (list of str): The chunk's parameters.
            from_slots (bool): Whether the fused update sums the devices'
                slots (no all-reducer) or reads the reduced ``param.grad``.
        """
        host_update = self._host_update
        if host_update is None or not names:
            return [], names, None
        program = host_update.hooks(*optimizer_hooks(self.optimizer),
                                    loss_scale=self._loss_scale)
        if program is None:
            return [], names, None
        params = {name: self.master_params[name] for name in names}
        if from_slots:
            slots = {name: [t.slots[name] for t in self.transfers]
                     for name in names}
            weights = self._weights
            weighted = not all(w == weights[0] for w in weights)
            if not weighted:
                weights = weights[:1]
        else:
            slots = {name: [param.grad] for name, param in params.items()}
            weights, weighted = [1.0], False
        fused, unfused = host_update.partition(params, slots)
        return fused, unfused, ([slots[name] for name in fused], weights,
                                weighted, program)

    def _fused_update(self, names, slots, weights, weighted, program):
        params = [self.master_params[n] for n in names]
        grads = None
        if self._write_grads:
            grads = [self._grads[n] for n in names]
            for param, grad in zip(params, grads):
                param.grad = grad
        self._host_update.update(params, slots, weights, weighted, program,
                                 grads=grads)

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
        with self._span('h2d', None):
            for chunk, names in enumerate(self.chunk_names):
                for transfer in self.transfers:
                    transfer.publish(chunk, names)
        self._finish_one()

    def _finish_one(self):
        with self._lock:
            self._remaining -= 1
            self._lock.notify_all()


class _NullSpan(object):

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
