"""Measures what the cost model needs about a network on a device.

A profile (saved as JSON by ``python -m experiments.profile``) holds:

- ``layers``: per layer (a link that directly owns parameters, the
  runtime's unit), input side first (the reverse of the runtime's ready
  order): forward and backward seconds (median of ``R`` repetitions after a
  warm-up; functions outside every layer, the loss among them, belong to
  the layer called before them; the backward is timed from the readiness
  backward's hand-overs, see :mod:`cgdp_chainer.costmodel.layers`); on
  ``'@numpy'`` also with one BLAS thread (for core sharing between
  replicas); parameter bytes and array counts;
- ``chunk_overhead``: zero (the runtime's chunks do not cut the graph);
  ``whole``: one pass's total, and on ``'@numpy'`` its ``busy_cores``: the
  process's CPU seconds per second during the passes (all BLAS threads),
  the cores one replica occupies;
- ``copy``: device-to-host and host-to-device bandwidth, from page-locked
  and from pageable host memory (on ``'@numpy'``: memcpy bandwidth) and the
  latency of a small copy;
- ``host``: the host accumulator's costs over the model's parameter arrays,
  each as ``per_array_s`` + ``per_byte_s``: the reduction of two slots into
  their mean, each further slot, a MomentumSGD update rule call, and
  ``ParallelUpdater``'s ``addgrads`` and ``copyparams`` per replica; and
  ``update_rules``: each optimizer's host update rule
  (:func:`measure_host_update`, MomentumSGD and Adam), and ``fused``: the
  runtime's fused reduce and update of each
  (:func:`measure_fused_host_update`), which the accumulator runs where
  it can;
- per layer also ``functions``: each forward function call's kind, FLOPs
  and bytes per image, its backward's, and the parameter bytes it reads
  (:mod:`cgdp_chainer.costmodel.functions`), their sums
  ``forward_flops`` and ``backward_flops``, ``counted_layers`` (matrix
  products), and ``forward_calls`` and ``backward_calls``: the Chainer
  function calls of its forward and backward;
- ``machine``: cores, the compute this process gets of them
  (``effective_cores``), ``function_call``: the host-side seconds of one
  Chainer function call forward and backward on this device
  (:func:`measure_function_overhead`), and, on ``'@numpy'``,
  ``blas_1t_flops``: one thread's matrix-product rate, from which the cost
  model tells a layer's arithmetic from the Python around it (which holds
  the GIL);
- on GPUs, ``device_update_s``: MomentumSGD on the device.

:func:`profile_model` and :func:`profile_replica` do the measuring for
callers (:class:`cgdp_chainer.costmodel.ModelChunkChooser` uses the
latter).
"""
import json
import os
import statistics
import time

import chainer
import chainer.links  # NOQA: profile_model checks for a Classifier
import numpy

from cgdp_chainer import blas
from cgdp_chainer import devices as devices_module
from cgdp_chainer.costmodel import hardware as hardware_module
from cgdp_chainer.costmodel import layers as layers_module

PROFILE_VERSION = 1
DEFAULT_REPS = 3
# Size of the copies that measure bandwidth: large enough to leave the
# caches, small enough for a busy machine.
COPY_BYTES = 64 * 2 ** 20


def _synchronizer(device):
    if devices_module.is_gpu(device):
        return device.device.synchronize
    return lambda: None


def _median_times(function, reps, sync):
    """Median seconds of ``function()`` over ``reps`` runs after a warm-up.
    """
    function()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


STATISTICS = {'median': statistics.median, 'min': min}


def _process_cpu_seconds():
    """CPU seconds (user + system) of every thread of this process."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed_passes(target, in_arrays, loss_func, sync, links, reps, configs,
                  progress):
    """:func:`measure_layers`'s passes: a warm-up and ``reps`` timed
    repetitions, each with every BLAS thread count of ``configs``.

    Returns:
        tuple: ``(samples, busy)``: per thread count (``None``: all), the
        timed passes' :func:`layers_module.run_pass` results; and the
        busy cores (CPU over wall seconds) of the all-thread passes.
    """
    samples = {threads: [] for threads in configs}
    busy = []
    for rep in range(reps + 1):
        if progress is not None:
            progress('timing forward and backward {}/{}{}'.format(
                rep + 1, reps + 1, ' (warm-up)' if rep == 0 else ''))
        for threads in configs:
            with blas.BlasLimit(threads or None):
                cpu_start = _process_cpu_seconds()
                start = time.perf_counter()
                result = layers_module.run_pass(target, in_arrays, loss_func,
                                                sync, links)
                wall = time.perf_counter() - start
                cpu = _process_cpu_seconds() - cpu_start
            if rep > 0:  # the first repetition warms up
                samples[threads].append(result)
                if threads is None and wall > 0:
                    busy.append(cpu / wall)
    return samples, busy


def measure_layers(target, device, in_arrays, loss_func=None,
                   reps=DEFAULT_REPS, one_thread=None, statistic='median',
                   progress=None):
    """Per-layer forward and backward seconds of any model.

    Each pass is one ordinary forward and one readiness backward
    (:func:`cgdp_chainer.costmodel.layers.run_pass`); repetitions with all
    BLAS threads and, on CPUs, with one thread are interleaved, so a change
    of the machine's load touches both alike.

    Args:
        target (chainer.Link): The model on ``device``, its parameters
            initialised.
        device (chainer.backend.Device): Its device.
        in_arrays (tuple): ``(x, labels...)`` on ``device``.
        loss_func (callable or None): ``loss_func(*in_arrays)``; default
            the target.
        reps (int): Timed repetitions after one warm-up pass.
        one_thread (bool or None): Also time with one BLAS thread; default:
            on CPU devices.
        statistic (str): ``'median'`` of the repetitions, or ``'min'``.
        progress (callable or None): ``progress(text)`` is told each pass
            as it starts.

    Returns:
        dict: ``layers`` (records input side first: ``index``, ``name``
        (the layer's path), ``forward_s``, ``backward_s``,
        ``forward_calls``, ``backward_calls`` and on CPUs
        ``forward_1t_s``, ``backward_1t_s``) and ``whole`` (the pass's
        total seconds, and on CPUs ``busy_cores``).
    """
    sync = _synchronizer(device)
    links = layers_module.own_layers(target)
    if one_thread is None:
        one_thread = not devices_module.is_gpu(device)
    configs = [None, 1] if one_thread else [None]
    samples, busy = _timed_passes(target, in_arrays, loss_func, sync, links,
                                  reps, configs, progress)
    target.cleargrads()
    summary = STATISTICS[statistic]
    passes = samples[None]
    order = list(reversed(passes[0]['order']))

    def per_layer(runs, key, path):
        return summary([run[key].get(path, 0.0) for run in runs])
    records = []
    for index, path in enumerate(order):
        record = {'index': index, 'name': path,
                  'forward_s': per_layer(passes, 'forward_s', path),
                  'backward_s': per_layer(passes, 'backward_s', path),
                  'forward_calls': passes[0]['forward_calls'].get(path, 0),
                  'backward_calls': passes[0]['backward_calls'].get(path, 0)}
        if one_thread:
            record['forward_1t_s'] = per_layer(samples[1], 'forward_s', path)
            record['backward_1t_s'] = per_layer(samples[1], 'backward_s',
                                                path)
        records.append(record)
    whole = {'forward_s': summary([sum(p['forward_s'].values())
                                   for p in passes]),
             'backward_s': summary([sum(p['backward_s'].values())
                                    for p in passes])}
    if not devices_module.is_gpu(device) and busy:
        # Cores the replica keeps busy with all its BLAS threads: more than
        # its BLAS share, since OpenBLAS's idle threads spin between calls.
        whole['busy_cores'] = statistics.median(busy)
    return {'layers': records, 'whole': whole}


def measure_copies(device, n_bytes=COPY_BYTES, reps=DEFAULT_REPS):
    """Copy bandwidth between ``device`` and the host, and copy latency.

    On ``'@numpy'`` both directions are a memcpy in host memory. On GPUs the
    host side is pinned memory, as the runtime uses; the same copies from
    and to pageable memory (what a NumPy batch sent by ``device.send`` goes
    through) are measured beside them.

    Returns:
        dict: ``d2h_bytes_per_s``, ``h2d_bytes_per_s`` (page-locked host
        memory), ``d2h_pageable_bytes_per_s``,
        ``h2d_pageable_bytes_per_s``, ``latency_s``,
        ``memory_bytes_per_s`` (host memory traffic of a memcpy, read plus
        write) and, on GPUs, ``device_bytes_per_s``.
    """
    count = max(1, n_bytes // 4)
    host_a = numpy.ones(count, dtype=numpy.float32)
    host_b = numpy.empty_like(host_a)
    memcpy = _median_times(lambda: numpy.copyto(host_b, host_a), reps,
                           lambda: None)
    tiny_a = numpy.ones(1, dtype=numpy.float32)
    tiny_b = numpy.empty_like(tiny_a)
    result = {'memory_bytes_per_s': 2.0 * host_a.nbytes / memcpy}
    if not devices_module.is_gpu(device):
        latency = _median_times(lambda: numpy.copyto(tiny_b, tiny_a),
                                max(reps, 20), lambda: None)
        result.update({'d2h_bytes_per_s': host_a.nbytes / memcpy,
                       'h2d_bytes_per_s': host_a.nbytes / memcpy,
                       'd2h_pageable_bytes_per_s': host_a.nbytes / memcpy,
                       'h2d_pageable_bytes_per_s': host_a.nbytes / memcpy,
                       'latency_s': latency})
        return result
    import cupy
    import cupyx
    sync = _synchronizer(device)
    with cupy.cuda.Device(device.device.id):
        pinned = cupyx.empty_pinned((count,), numpy.float32)
        pinned[...] = 1
        on_device = cupy.ones(count, dtype=numpy.float32)
        other = cupy.empty_like(on_device)
        d2h = _median_times(lambda: on_device.get(out=pinned), reps, sync)
        h2d = _median_times(lambda: on_device.set(pinned), reps, sync)
        # host_b is ordinary (pageable) memory: the driver stages it.
        d2h_pageable = _median_times(lambda: on_device.get(out=host_b),
                                     reps, sync)
        h2d_pageable = _median_times(lambda: on_device.set(host_b), reps,
                                     sync)
        d2d = _median_times(lambda: cupy.copyto(other, on_device), reps,
                            sync)
        tiny_pinned = cupyx.empty_pinned((1,), numpy.float32)
        tiny_device = cupy.ones(1, dtype=numpy.float32)
        latency = _median_times(lambda: tiny_device.get(out=tiny_pinned),
                                max(reps, 20), sync)
    result.update({'d2h_bytes_per_s': pinned.nbytes / d2h,
                   'h2d_bytes_per_s': pinned.nbytes / h2d,
                   'd2h_pageable_bytes_per_s': host_b.nbytes / d2h_pageable,
                   'h2d_pageable_bytes_per_s': host_b.nbytes / h2d_pageable,
                   'device_bytes_per_s': 2.0 * pinned.nbytes / d2d,
                   'latency_s': latency})
    return result


def _time_over(arrays_per_name, body, reps):
    """Median seconds of ``body(i)`` for every parameter ``i``."""
    def run():
        for i in range(len(arrays_per_name)):
            body(i)
    return _median_times(run, reps, lambda: None)


# Arrays larger than this are measured on their first this-many elements:
# the cost per byte is the same, and VGG-16's 400 MB layer would otherwise
# need gigabytes of scratch memory.
MAX_MEASURED_ELEMENTS = 1 << 24


def _host_arrays(shapes, dtypes, value):
    return [numpy.full(s, value, dtype=d) for s, d in zip(shapes, dtypes)]


def _host_op_costs(shapes, dtypes, reps):
    """Seconds of each host operation over arrays of ``shapes``."""
    from cgdp_chainer.runtime.host import accumulator
    master = [chainer.Parameter(a) for a in _host_arrays(shapes, dtypes,
                                                         0.5)]
    for p in master:
        p.grad = numpy.zeros_like(p.array)
    slots = [_host_arrays(shapes, dtypes, 0.25 / (k + 1)) for k in range(3)]
    other = [chainer.Parameter(a) for a in slots[0]]
    for p, g in zip(other, slots[1]):
        p.grad = g
    bodies = {
        # The accumulator's reduction (its own function) of two and of
        # three slots into the mean: one device lends its slot instead.
        'reduce2': lambda i: accumulator.reduce_sum(
            master[i].grad, [slots[0][i], slots[1][i]], 0.5),
        'reduce3': lambda i: accumulator.reduce_sum(
            master[i].grad, [slots[0][i], slots[1][i], slots[2][i]],
            1.0 / 3),
        # What ParallelUpdater does per replica.
        'addgrads': lambda i: master[i].addgrad(other[i]),
        'copyparams': lambda i: other[i].copydata(master[i]),
    }
    return {name: _time_over(master, body, reps)
            for name, body in bodies.items()}


def _momentum_sgd_rule():
    return chainer.optimizers.momentum_sgd.MomentumSGDRule(lr=1e-6,
                                                           momentum=0.9)


def _adam_rule():
    return chainer.optimizers.adam.AdamRule(alpha=1e-6)


# The host update rules the cost model knows, by the name it uses
# (costmodel.inputs.OPTIMIZERS): Chainer's own rules, as the accumulator
# runs them today. The fused host rules (the runtime's host_update module)
# are measured here instead once they exist, behind the same function.
HOST_UPDATE_RULES = {'momentum_sgd': _momentum_sgd_rule, 'adam': _adam_rule}


def _update_rule_seconds(make_rule, shapes, dtypes, reps):
    params = [chainer.Parameter(a) for a in _host_arrays(shapes, dtypes,
                                                         0.5)]
    for p in params:
        p.grad = numpy.full_like(p.array, 1e-3)
        p.update_rule = make_rule()
        p.update_rule.update(p)  # allocates the state once
    return _time_over(params, lambda i: params[i].update(), reps)


def measure_host_update(optimizer_name, shapes, dtypes=None,
                        reps=DEFAULT_REPS):
    """Seconds of one optimizer's host update rule, per array and per byte.

    The rule runs over arrays of ``shapes`` and over as many one-element
    arrays: the second gives the fixed cost per array (Python, dispatch),
    the difference the cost per byte (NumPy's passes over the parameter,
    gradient and state).

    Args:
        optimizer_name (str): A key of :data:`HOST_UPDATE_RULES`
            (``'momentum_sgd'``, ``'adam'``).
        shapes (list of tuple): Parameter shapes (cut large ones to
            :data:`MAX_MEASURED_ELEMENTS` elements first).
        dtypes (list or None): Their dtypes (default float32).
        reps (int): Timed repetitions (median).

    Returns:
        dict: ``per_array_s`` and ``per_byte_s``.

    Raises:
        ValueError: Unknown optimizer name, or no shapes.
    """
    if optimizer_name not in HOST_UPDATE_RULES:
        raise ValueError('optimizer_name must be one of {}, got {!r}'.format(
            ', '.join(HOST_UPDATE_RULES), optimizer_name))
    if not shapes:
        raise ValueError('shapes must list at least one parameter shape')
    if dtypes is None:
        dtypes = [numpy.dtype(numpy.float32)] * len(shapes)
    make_rule = HOST_UPDATE_RULES[optimizer_name]
    n_bytes = sum(int(numpy.prod(s)) * numpy.dtype(d).itemsize
                  for s, d in zip(shapes, dtypes))
    full = _update_rule_seconds(make_rule, shapes, dtypes, reps)
    tiny = _update_rule_seconds(make_rule, [(1,)] * len(shapes), dtypes,
                                reps)
    return {'per_array_s': tiny / len(shapes),
            'per_byte_s': max(0.0, full - tiny) / max(1, n_bytes)}


# Elements of the arrays a fused update is timed on: its cost per byte is
# the same for any size beyond the caches, and the slots, parameter and
# state of a whole large network would need gigabytes.
MAX_FUSED_ELEMENTS = 1 << 22


def measure_fused_host_update(optimizer_name, shapes, reps=DEFAULT_REPS):
    """Seconds of the runtime's fused host reduce and update of one
    optimizer, per array, per byte and per byte of each summed slot.

    The accumulator sums a chunk's slots and updates its parameters in one
    blocked pass (:mod:`cgdp_chainer.runtime.host.host_update`); its cost with
    ``S`` slots is ``arrays x per_array_s + bytes x (per_byte_s + S x
    per_slot_byte_s)``. Timed on one thread (the model gives each host job
    its threads), with 1 and 2 slots on arrays of ``shapes`` (cut to
    :data:`MAX_FUSED_ELEMENTS` elements in all) and with one slot on as
    many one-element arrays.

    Args:
        optimizer_name (str): ``'momentum_sgd'`` or ``'adam'``.
        shapes (list of tuple): Parameter shapes (float32).
        reps (int): Timed repetitions (the best).

    Returns:
        dict or None: ``per_array_s``, ``per_byte_s`` and
        ``per_slot_byte_s``; ``None`` where the runtime has no fused rule
        for the optimizer (it then runs Chainer's, see
        :func:`measure_host_update`).
    """
    from cgdp_chainer.runtime.host import host_update
    if optimizer_name not in HOST_UPDATE_RULES:
        raise ValueError('optimizer_name must be one of {}, got {!r}'.format(
            ', '.join(HOST_UPDATE_RULES), optimizer_name))
    if not shapes:
        raise ValueError('shapes must list at least one parameter shape')
    timed, left = [], MAX_FUSED_ELEMENTS
    for shape in shapes:
        size = int(numpy.prod(shape))
        if left <= 0:
            break
        timed.append(shape if size <= left else (left,))
        left -= min(size, left)
    n_bytes = 4 * sum(int(numpy.prod(s)) for s in timed)
    full = host_update.FusedBench(optimizer_name, 2, timed, n_threads=1)
    tiny = host_update.FusedBench(optimizer_name, 1,
                                  [(1,)] * len(shapes), n_threads=1)
    try:
        if full.host_update is None:
            return None
        one = full.best_seconds(reps, n_slots=1)
        two = full.best_seconds(reps, n_slots=2)
        fixed = tiny.best_seconds(reps)
    finally:
        full.close()
        tiny.close()
    per_slot = max(0.0, two - one) / n_bytes
    return {'per_array_s': fixed / len(shapes),
            'per_byte_s': max(0.0, (one - fixed * len(timed) / len(shapes))
                              / n_bytes - per_slot),
            'per_slot_byte_s': per_slot}


def _measured_shapes(target):
    params = [p for p in target.params() if p.array is not None]
    shapes = [p.array.shape if p.array.size <= MAX_MEASURED_ELEMENTS
              else (MAX_MEASURED_ELEMENTS,) for p in params]
    dtypes = [numpy.dtype(p.array.dtype) for p in params]
    return shapes, dtypes


def measure_host_ops(target, reps=DEFAULT_REPS):
    """The host accumulator's and ``ParallelUpdater``'s costs on CPU.

    Each operation is timed over arrays of the target's parameter shapes
    (the largest cut to :data:`MAX_MEASURED_ELEMENTS` elements) and over as
    many one-element arrays; the second gives the fixed cost per array, the
    difference the cost per byte.

    Args:
        target (chainer.Link): The model (any device; only shapes are used).
        reps (int): Timed repetitions (median).

    Returns:
        dict: Operation -> ``{'per_array_s', 'per_byte_s'}``: ``reduce2``
        (the mean of two slots), ``reduce_slot`` (each further slot),
        ``update`` (a MomentumSGD update rule call, see
        :func:`measure_host_update`), ``addgrads`` and ``copyparams``.
    """
    shapes, dtypes = _measured_shapes(target)
    if not shapes:
        raise ValueError('{} has no initialised parameters to measure the '
                         'host operations on'.format(type(target).__name__))
    n_bytes = sum(int(numpy.prod(s)) * d.itemsize
                  for s, d in zip(shapes, dtypes))
    arrays = len(shapes)
    full = _host_op_costs(shapes, dtypes, reps)
    tiny = _host_op_costs([(1,)] * len(shapes), dtypes, reps)
    costs = {}
    for name in full:
        per_array = tiny[name] / arrays
        per_byte = max(0.0, full[name] - tiny[name]) / max(1, n_bytes)
        costs[name] = {'per_array_s': per_array, 'per_byte_s': per_byte}
    three = costs.pop('reduce3')
    costs['reduce_slot'] = {
        key: max(0.0, three[key] - costs['reduce2'][key])
        for key in ('per_array_s', 'per_byte_s')}
    costs['update'] = measure_host_update('momentum_sgd', shapes, dtypes,
                                          reps)
    return costs


def _check_optimizer_names(names):
    names = tuple(HOST_UPDATE_RULES) if names is None else tuple(names)
    unknown = [n for n in names if n not in HOST_UPDATE_RULES]
    if unknown or not names:
        raise ValueError('optimizers must name some of {}, got {!r}'.format(
            ', '.join(HOST_UPDATE_RULES), names))
    return names


def measure_host_updates(target, reps=DEFAULT_REPS, optimizers=None):
    """:func:`measure_host_update` of some optimizers over the target's
    parameter shapes.

    Args:
        optimizers (sequence of str or None): Names (default: all of
            :data:`HOST_UPDATE_RULES`).

    Returns:
        dict: Optimizer name -> ``{'per_array_s', 'per_byte_s'}``.
    """
    names = _check_optimizer_names(optimizers)
    shapes, dtypes = _measured_shapes(target)
    return {name: measure_host_update(name, shapes, dtypes, reps)
            for name in names}


def measure_fused_host_updates(target, reps=DEFAULT_REPS, optimizers=None):
    """:func:`measure_fused_host_update` of some optimizers over the
    target's float32 parameter shapes.

    Args:
        optimizers (sequence of str or None): Names (default: all of
            :data:`HOST_UPDATE_RULES`).

    Returns:
        dict: Optimizer name -> costs, for those the runtime fuses.
    """
    names = _check_optimizer_names(optimizers)
    shapes = [p.array.shape for p in target.params()
              if p.array is not None and p.array.dtype == numpy.float32]
    if not shapes:
        return {}
    costs = {}
    for name in names:
        cost = measure_fused_host_update(name, shapes, reps)
        if cost is not None:
            costs[name] = cost
    return costs


def measure_function_overhead(device=None, units=50, reps=DEFAULT_REPS):
    """Host-side seconds of one Chainer function call, forward and backward.

    Runs a chain of ``units`` blocks of the calls a convolutional network
    makes (a 1x1 convolution, batch normalization, ReLU and a residual
    add) on one-element arrays, so the time is the per-call cost: Chainer's
    Python (graph building, type checks, hooks) plus the array library's
    dispatch; on CuPy arrays it includes launching each kernel (the device
    is synchronized only at the end of a pass, so queued kernels overlap
    the Python and do not count).

    Args:
        device (chainer.backend.Device or None): Default ``'@numpy'``.
        units (int): Blocks of four calls per pass.
        reps (int): Timed repetitions (median).

    Returns:
        dict: ``forward_s`` and ``backward_s`` per call.
    """
    import chainer.functions as F
    if device is None:
        device = chainer.get_device('@numpy')
    sync = _synchronizer(device)

    def param(value):
        return chainer.Parameter(device.send(numpy.full(
            (1, 1, 1, 1) if value == 'w' else (1,), 0.5,
            dtype=numpy.float32)))
    w, gamma, beta = param('w'), param('g'), param('b')
    x = chainer.Variable(device.send(numpy.ones((2, 1, 1, 1),
                                                dtype=numpy.float32)))
    calls = 4 * units
    times = {'forward': [], 'backward': []}
    with chainer.using_config('train', True), \
            chainer.using_config('enable_backprop', True):
        for rep in range(reps + 1):
            sync()
            start = time.perf_counter()
            h = x
            for _ in range(units):
                y = F.convolution_2d(h, w)
                y = F.batch_normalization(y, gamma, beta)
                h = F.relu(y) + h
            loss = F.sum(h)
            sync()
            middle = time.perf_counter()
            loss.backward()
            sync()
            end = time.perf_counter()
            for p in (w, gamma, beta):
                p.cleargrad()
            if rep > 0:
                times['forward'].append((middle - start) / calls)
                times['backward'].append((end - middle) / calls)
    return {'forward_s': statistics.median(times['forward']),
            'backward_s': statistics.median(times['backward'])}


def measure_device_update(target, device, reps=DEFAULT_REPS):
    """Seconds of MomentumSGD over the target's parameters on a GPU."""
    xp = device.xp
    params = []
    rule_cls = chainer.optimizers.momentum_sgd.MomentumSGDRule
    for p in target.params():
        if p.array is None:
            continue
        param = chainer.Parameter(xp.array(p.array, copy=True))
        param.grad = xp.zeros_like(param.array)
        param.update_rule = rule_cls(lr=1e-6, momentum=0.9)
        params.append(param)

    def run():
        for param in params:
            param.update()
    return _median_times(run, reps, _synchronizer(device))


def measure_effective_cores(seconds=0.3, trials=3):
    """How many cores' worth of compute this process gets right now.

    Runs the same single-threaded matrix products alone and then in one
    thread per core at once: with the machine to itself, ``k`` threads
    finish in the time of one; other processes on the cores stretch that.
    ``effective = k x time alone / time together`` (at most ``k``).

    Args:
        seconds (float): About how long one run alone should take.
        trials (int): Measurements; the largest is kept, since a passing
            disturbance (a process that is just exiting) can only lower
            one, and a single low one skews every prediction of replicas
            that compute side by side.

    Returns:
        float: Effective cores, between 1/k-ish and ``k``.
    """
    return max(_effective_cores_once(seconds) for _ in range(trials))


def _effective_cores_once(seconds):
    import threading
    cores = hardware_module.available_cores()
    a = numpy.random.RandomState(0).rand(192, 192).astype(numpy.float32)
    with blas.BlasLimit(1):
        start = time.perf_counter()
        numpy.dot(a, a)
        once = max(1e-6, time.perf_counter() - start)
        repeats = max(3, int(seconds / once))

        def work():
            for _ in range(repeats):
                numpy.dot(a, a)
        start = time.perf_counter()
        work()
        alone = time.perf_counter() - start
        threads = [threading.Thread(target=work) for _ in range(cores)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        together = time.perf_counter() - start
    return min(float(cores), cores * alone / together)


# Sides of the square float32 matrix products that measure one thread's
# BLAS rate: from the size of a ResNet layer's product at batch 4 and 64 px
# to one large enough to reach BLAS's peak.
BLAS_SIZES = (256, 512, 1024)


def measure_blas_1t_flops(sizes=BLAS_SIZES, reps=DEFAULT_REPS):
    """FLOP/s of a float32 matrix product on one BLAS thread.

    Each size is timed ``reps`` times after a warm-up (median); the
    fastest size's rate is returned: the rate at which one core does a
    layer's arithmetic, so that the rest of the layer's one-thread time is
    the part that does not run in BLAS (see
    :func:`cgdp_chainer.costmodel.layer_gil_seconds`).

    Returns:
        float: FLOP/s.
    """
    rng = numpy.random.RandomState(0)
    best = 0.0
    with blas.BlasLimit(1):
        for n in sizes:
            a = rng.rand(n, n).astype(numpy.float32)
            b = rng.rand(n, n).astype(numpy.float32)
            out = numpy.empty((n, n), dtype=numpy.float32)
            seconds = _median_times(lambda: numpy.dot(a, b, out=out), reps,
                                    lambda: None)
            best = max(best, 2.0 * n ** 3 / max(seconds, 1e-9))
    return best


def machine_info(device):
    """What the profile records about the machine."""
    info = {'cores': hardware_module.available_cores(),
            'cpu_count': os.cpu_count(),
            'effective_cores': measure_effective_cores(),
            'load_average': list(os.getloadavg())
            if hasattr(os, 'getloadavg') else None}
    if not devices_module.is_gpu(device):
        info['blas_1t_flops'] = measure_blas_1t_flops()
    try:
        import threadpoolctl
        info['blas'] = [{'api': i.get('internal_api'),
                         'threads': i.get('num_threads')}
                        for i in threadpoolctl.threadpool_info()]
    except ImportError:  # pragma: no cover
        pass
    if devices_module.is_gpu(device):
        info['gpus'] = devices_module.gpu_count()
        info['gpu'] = devices_module.describe(device)
    return info


def profile_replica(target, device, in_arrays, loss_func=None,
                    host_threads=None, reps=DEFAULT_REPS, statistic='median',
                    optimizers=None, progress=None):
    """Profiles any model already on its device, on a given batch.

    The target's persistent values (BatchNormalization statistics) and
    NumPy's global random state are restored afterwards, and its gradients
    cleared, so training is left as it was.

    Args:
        target (chainer.Link): The model (e.g. a classifier) on ``device``.
        device (chainer.backend.Device): Its device.
        in_arrays (tuple): ``(x, labels...)`` on ``device``.
        loss_func (callable or None): ``loss_func(*in_arrays)`` as the
            updater's; default the target.
        host_threads (int or None): The accumulator's threads (default: as
            the runtime, CPU count up to 4).
        reps (int): Timed repetitions.
        statistic (str): ``'median'`` or ``'min'`` of the repetitions of
            the layer times.
        optimizers (sequence of str or None): The optimizers whose host
            update to measure (default: all of :data:`HOST_UPDATE_RULES`).
        progress (callable or None): ``progress(text)`` is told each stage
            (each timed pass, the copies, the host, the machine).

    Returns:
        dict: The profile (see the module docstring).
    """
    optimizers = _check_optimizer_names(optimizers)
    progress = progress or (lambda text: None)
    if not isinstance(in_arrays, tuple):
        in_arrays = (in_arrays,)
    measured = _measure_layers_leaving_no_trace(
        target, device, in_arrays, loss_func, reps, statistic, progress)
    if host_threads is None:
        host_threads = max(1, min(4, os.cpu_count() or 1))
    spec = '@numpy' if not devices_module.is_gpu(device) else \
        '@cupy:{}'.format(device.device.id)
    profile = {
        'version': PROFILE_VERSION,
        'device': spec,
        'hardware': 'this-cpu' if spec == '@numpy' else 'this-gpu',
        'batch': int(in_arrays[0].shape[0]),
        'image_size': int(in_arrays[0].shape[-1]) if
        in_arrays[0].ndim == 4 else None,
        'reps': reps,
        'statistic': statistic,
        'layers': measured['layers'],
        # The runtime's chunks do not cut the graph: one more chunk costs
        # the device nothing (its host-side costs are the host's).
        'chunk_overhead': {'forward_s': 0.0, 'backward_s': 0.0},
        'whole': measured['whole']}
    progress('timing copies between the device and the host')
    profile['copy'] = measure_copies(device, reps=reps)
    progress('timing the host\'s reductions and updates')
    profile['host'] = {
        'threads': host_threads, 'ops': measure_host_ops(target, reps=reps),
        'update_rules': measure_host_updates(target, reps, optimizers),
        'fused': measure_fused_host_updates(target, reps, optimizers)}
    progress('measuring the machine: cores, BLAS, a function call')
    profile['machine'] = machine_info(device)
    profile['machine']['function_call'] = measure_function_overhead(
        device, reps=reps)
    if devices_module.is_gpu(device):
        profile['device_update_s'] = measure_device_update(target, device,
                                                           reps=reps)
    _add_achieved_flops(profile)
    return profile


def _measure_layers_leaving_no_trace(target, device, in_arrays, loss_func,
                                     reps, statistic, progress=None):
    """:func:`measure_layers` with each layer's function costs, restoring
    the target's persistent values and NumPy's global random state and
    clearing its gradients afterwards, even if measuring fails.

    Args:
        target (chainer.Link): The model on ``device``.
        device (chainer.backend.Device): Its device.
        in_arrays (tuple): ``(x, labels...)`` on ``device``.
        loss_func (callable or None): As the updater's; default the target.
        reps (int): Timed repetitions.
        statistic (str): ``'median'`` or ``'min'``.
        progress (callable or None): As :func:`measure_layers`'s.

    Returns:
        dict: What :func:`measure_layers` returns.
    """
    saved_persistents = _save_persistents(target)
    saved_random = numpy.random.get_state()
    try:
        measured = measure_layers(target, device, in_arrays,
                                  loss_func=loss_func, reps=reps,
                                  statistic=statistic, progress=progress)
        layers_module.add_function_costs(measured['layers'], target,
                                         in_arrays, loss_func)
    finally:
        _restore_persistents(target, saved_persistents)
        numpy.random.set_state(saved_random)
        target.cleargrads()
    return measured


def _add_achieved_flops(profile):
    """Adds the FLOP/s achieved on the counted layers to the profile's
    machine, as a comparison with the presets (none if no time was
    measured)."""
    seconds = sum(s['forward_s'] + s['backward_s']
                  for s in profile['layers'])
    work = profile['batch'] * sum(s['forward_flops'] + s['backward_flops']
                                  for s in profile['layers'])
    if seconds > 0:
        profile['machine']['achieved_flops'] = work / seconds


def _save_persistents(target):
    saved = []
    for _, link in target.namedlinks():
        for name in link._persistent:
            value = link.__dict__[name]
            saved.append((link, name, value.copy() if hasattr(
                value, 'copy') else value))
    return saved


def _restore_persistents(target, saved):
    for link, name, value in saved:
        current = link.__dict__[name]
        if hasattr(current, 'shape') and hasattr(value, 'shape') and \
                current.shape == value.shape:
            current[...] = value
        else:
            setattr(link, name, value)


def synthetic_inputs(device, batch, image_size, n_classes=1000, seed=0):
    """Random images and labels on ``device`` for profiling."""
    rng = numpy.random.RandomState(seed)
    x = rng.uniform(-1, 1, (batch, 3, image_size, image_size)).astype(
        numpy.float32)
    t = rng.randint(0, n_classes, batch).astype(numpy.int32)
    return device.send(x), device.send(t)


def profile_model(model, device, batch, image_size, reps=DEFAULT_REPS,
                  n_classes=None, host_threads=None, statistic='median',
                  progress=None):
    """Profiles any model at a batch size and image size.

    Args:
        model (chainer.Link or ProbedModel): A classifier (any link taking
            ``(x, t)`` and returning the loss), or a network mapping images
            to class scores, which is profiled inside the project's
            classifier (:class:`models.Classifier`); or a model that passed
            :func:`cgdp_chainer.costmodel.samples.probe_model`, profiled on
            its own input shape (``image_size`` and ``n_classes`` do not
            apply). It is moved to ``device``.
        device (str or chainer.backend.Device): ``'@numpy'`` or
            ``'@cupy:N'``.
        batch (int): Images per pass.
        image_size (int): Image side in pixels.
        reps (int): Timed repetitions.
        n_classes (int or None): Label range (default 1000, or the
            predictor's output size when it has ``n_classes``).
        host_threads (int or None): Host accumulator threads to record.
        statistic (str): ``'median'`` or ``'min'`` of the repetitions.
        progress (callable or None): ``progress(text)`` is told each stage
            (see :func:`profile_replica`).

    Returns:
        dict: The profile.
    """
    from cgdp_chainer.costmodel import samples
    if isinstance(device, str):
        device = devices_module.parse_device(device)
    if batch < 1 or image_size < 1:
        raise ValueError('batch and image_size must be >= 1, got {} and '
                         '{}'.format(batch, image_size))
    if isinstance(model, samples.ProbedModel):
        target = model.loss_chain
        target.to_device(device)
        in_arrays = model.in_arrays(batch, device)
    else:
        target = model
        if not isinstance(target, chainer.links.Classifier):
            from cgdp_chainer import models
            target = models.Classifier(target)
        target.to_device(device)
        if n_classes is None:
            predictor = getattr(target, 'predictor', target)
            n_classes = int(getattr(predictor, 'n_classes', 1000))
        in_arrays = synthetic_inputs(device, batch, image_size, n_classes)
    profile = profile_replica(target, device, in_arrays, reps=reps,
                              host_threads=host_threads, statistic=statistic,
                              progress=progress)
    if isinstance(model, samples.ProbedModel):
        profile.update(input_shape=list(model.input_shape),
                       n_outputs=model.n_outputs, user_loss=model.user_loss)
    else:
        profile['image_size'] = image_size
    return profile


def save_profile(profile, path):
    """Writes a profile as JSON (creating the folder)."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, 'w') as f:
        json.dump(profile, f, indent=1)
