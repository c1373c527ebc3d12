"""Seconds of the pieces of an iteration: host jobs, on-device operations,
ring all-reduces, a CPU replica's layers at a BLAS-thread count, chunks
and the shares of the interpreter lock they hold."""
import dataclasses


# Memory traffic of one update per parameter byte: MomentumSGD reads the
# parameter, gradient and velocity and writes two of them; Adam reads the
# parameter, gradient and both moments and writes three.
UPDATE_TRAFFIC = {'momentum_sgd': 5, 'adam': 7}


@dataclasses.dataclass(frozen=True)
class ChunkCalls:
    """The calls CGDP's runtime issues for one chunk, per replica and
    iteration (see :func:`cgdp_chunk_calls`).

    Attributes:
        gathers (int): Device-side gathers of the chunk's gradient arrays
            into its flat gradient buffer, per replica (GPUs only: see
            :func:`cgdp_gather_seconds`).
        copies (int): Copies per direction per replica (the gradients to
            the host, the new weights back), each paying
            ``hardware.copy_latency_s`` once.
        host_calls (int): The host's fused reduce and update calls over
            the chunk's flat buffers, each paying the per-call (in the
            profile: ``per_array_s``) costs once.
    """
    gathers: int
    copies: int
    host_calls: int


def cgdp_chunk_calls(arrays):
    """How many gathers, copies and host calls a CGDP chunk of ``arrays``
    parameter arrays issues: the one place the closed forms and the
    simulation read these counts from.

    Each chunk lives in one contiguous slice of flat buffers
    (``runtime/transport/buffers.py``'s ``FlatLayout``): its hand-over is one copy per
    direction, after one gather of the replica's gradients (Chainer
    allocates them anew each backward, so they are not views of the flat
    buffer; the replica's parameters are, so the weights need no scatter),
    and the host reduces and updates it in one fused call per run of one
    dtype. The profile does not record dtypes, so a chunk is taken as one
    run (what float32 models have). None of it grows with the number of
    arrays; the baselines (Chainer's updaters, ChainerMN) still copy and
    update per array and do not use this.

    Args:
        arrays (int): Parameter arrays in the chunk.

    Returns:
        ChunkCalls: The counts; all 0 for a chunk without parameters
        (nothing to copy, reduce or update).
    """
    calls = 1 if arrays > 0 else 0
    return ChunkCalls(gathers=calls, copies=calls, host_calls=calls)


def cgdp_gather_seconds(workload, hardware, arrays, n_bytes):
    """Seconds of the device-side gather of a CGDP chunk's gradients into
    its flat buffer, before its one copy to the host.

    On GPUs a packing kernel per gather (:func:`device_op_seconds`
    ``'pack'``: the chunk's bytes read and written at device memory
    bandwidth plus the per-call overhead), run on the replica's stream
    after the chunk's backward, so the next chunk's backward and the
    chunk's copy wait for it. On CPU replicas there is no separate gather:
    a worker process's one copy into its shared flat slot is the gather
    (priced as the copy), and thread workers hand the arrays over by
    reference.

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        arrays (int): Parameter arrays in the chunk.
        n_bytes (int): Parameter bytes in the chunk.

    Returns:
        float: Seconds.
    """
    gathers = cgdp_chunk_calls(arrays).gathers
    if hardware.kind == 'cpu' or gathers == 0 or n_bytes <= 0:
        return 0.0
    return gathers * device_op_seconds(workload, hardware, 'pack', 1,
                                       n_bytes)


def cgdp_copy_latency_seconds(hardware, arrays, n_bytes):
    """The fixed cost of one direction of a CGDP chunk's hand-over: its
    copies (:func:`cgdp_chunk_calls`) times ``hardware.copy_latency_s``;
    0 when there are no bytes to copy."""
    if n_bytes <= 0:
        return 0.0
    return cgdp_chunk_calls(arrays).copies * hardware.copy_latency_s


def per_array_copy_latency_seconds(hardware, arrays, n_bytes):
    """The fixed cost of copying ``n_bytes`` one parameter array at a time,
    as Chainer's updaters (``ParallelUpdater``, ChainerMN's local sum and
    spread) do: ``arrays x copy_latency_s``; 0 when there are no bytes."""
    if n_bytes <= 0:
        return 0.0
    return arrays * hardware.copy_latency_s


def cgdp_chunk_times(workload, hardware, forward, backward, chunks):
    """CGDP's per-chunk forward and backward seconds: those of
    :func:`chunk_compute_times`, each backward followed by its gradients'
    gather (:func:`cgdp_gather_seconds`).

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        forward, backward (list of float): Per-layer seconds.
        chunks (list of (int, int)): Layer ranges.

    Returns:
        tuple of list: ``(forward per chunk, backward per chunk)``.
    """
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    chunk_backward = [t + cgdp_gather_seconds(
        workload, hardware, sum(workload.param_arrays[a:b]),
        sum(workload.param_bytes[a:b]))
                      for t, (a, b) in zip(chunk_backward, chunks)]
    return chunk_forward, chunk_backward


def op_cost(ops, name, calls, n_bytes):
    """Seconds of a measured operation: ``calls x per_array_s + n_bytes x
    per_byte_s`` of ``ops[name]`` (``per_array_s`` is measured per call on
    one array: the baselines make one call per array, CGDP one per chunk,
    see :func:`cgdp_chunk_calls`)."""
    return cost_of(ops[name], calls, n_bytes)


def cost_of(op, calls, n_bytes):
    return calls * op['per_array_s'] + n_bytes * op['per_byte_s']


def host_update_overhead(hardware, optimizer):
    """A preset's fixed host cost per array of one update rule call."""
    if optimizer == 'adam':
        return hardware.host_adam_overhead_s
    return hardware.host_update_overhead_s


def host_update_seconds(workload, hardware, calls, n_bytes):
    """Seconds of the workload's optimizer updating ``n_bytes`` of
    parameters on the host in ``calls`` update calls: measured where the
    profile has Chainer's rules, else the update's traffic over one host
    thread plus the preset's cost per call.

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        calls (int): Update calls: one per parameter array for Chainer's
            rules (``ParallelUpdater``), the chunk's host calls for CGDP
            (:func:`cgdp_chunk_calls`: one update over a flat buffer costs
            about what one rule call over one array does, beyond its
            bytes).
        n_bytes (int): Parameter bytes updated.

    Returns:
        float: Seconds.
    """
    if workload.update_op() is not None:
        return cost_of(workload.update_op(), calls, n_bytes)
    traffic = UPDATE_TRAFFIC[workload.optimizer] * n_bytes
    return traffic / hardware.host_thread_bw + calls * host_update_overhead(
        hardware, workload.optimizer)


def host_job_seconds(workload, hardware, n_devices, arrays, n_bytes):
    """Seconds one host thread takes to reduce and update one chunk.

    The runtime reduces and updates a chunk's flat slices in
    ``c = cgdp_chunk_calls(arrays).host_calls`` fused calls (one per
    chunk), so the fixed costs below are paid ``c`` times, not once per
    array; the profile's ``per_array_s`` of each operation, measured per
    call on one-element arrays, is that cost per call. One device's slot
    is lent as the sum (no reduction). With the runtime's fused reduce and
    update measured (``workload.host_fused``): ``c x per_array + bytes x
    (per_byte + N x per_slot_byte)``. Else, with measured host costs: the
    mean of two slots, each further slot and the update rule, each ``c x
    per_array + bytes x per_byte``. Without: memory traffic over the
    thread's bandwidth plus per-call overheads; the runtime's blocked
    reduction reads ``N`` slots and writes the mean once (the scaling
    happens in cache), and the update moves :data:`UPDATE_TRAFFIC` bytes
    per byte.

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        n_devices (int): Slots to reduce.
        arrays (int): Parameter arrays in the chunk.
        n_bytes (int): Parameter bytes in the chunk.

    Returns:
        float: Seconds.
    """
    calls = cgdp_chunk_calls(arrays).host_calls
    if workload.host_fused is not None:
        # The runtime's fused pass: the slots summed block by block into
        # the update (one device's slot is read as the gradient).
        fused = workload.host_fused
        return (hardware.host_chunk_overhead_s
                + calls * fused['per_array_s']
                + n_bytes * (fused['per_byte_s']
                             + n_devices * fused['per_slot_byte_s']))
    if workload.host_ops is not None:
        ops = workload.host_ops
        seconds = (hardware.host_chunk_overhead_s
                   + host_update_seconds(workload, hardware, calls,
                                         n_bytes))
        if n_devices > 1:
            seconds += (op_cost(ops, 'reduce2', calls, n_bytes)
                        + (n_devices - 2) * op_cost(ops, 'reduce_slot',
                                                    calls, n_bytes))
        return seconds
    traffic = host_traffic_bytes(n_devices, n_bytes, workload.optimizer)
    rate = min(hardware.host_thread_bw * threads_per_server(hardware),
               hardware.host_memory_bw)
    reduce_calls = n_devices if n_devices > 1 else 0
    overhead = calls * (reduce_calls * hardware.host_op_overhead_s
                         + host_update_overhead(hardware,
                                                workload.optimizer))
    return traffic / rate + overhead + hardware.host_chunk_overhead_s


def host_traffic_bytes(n_devices, n_bytes, optimizer='momentum_sgd'):
    """Host memory traffic of reducing ``n_devices`` slots of ``n_bytes`` and
    updating them (see :func:`host_job_seconds` and
    :data:`UPDATE_TRAFFIC`)."""
    reduction = n_devices + 1 if n_devices > 1 else 0
    return n_bytes * (reduction + UPDATE_TRAFFIC[optimizer])


def ring_allreduce_seconds(n_bytes, n_nodes, network):
    """Seconds of a ring all-reduce of ``n_bytes`` across ``n_nodes`` nodes.

    Reduce-scatter then all-gather, ``2 (R - 1)`` steps, each moving
    ``n_bytes / R`` to the next node while receiving as much from the
    previous one (full duplex): ``2 (R - 1) / R x n_bytes / bandwidth +
    2 (R - 1) x latency``. Zero for one node or no bytes (the runtime skips
    the call then).

    Args:
        n_bytes (int): Bytes of every node's buffer.
        n_nodes (int): Nodes ``R``.
        network (Network): The network.

    Returns:
        float: Seconds.
    """
    if n_nodes <= 1 or n_bytes <= 0:
        return 0.0
    steps = 2 * (n_nodes - 1)
    return (steps / float(n_nodes) * n_bytes / network.bandwidth
            + steps * network.latency_s)


def host_traffic_parts(n_devices, n_bytes, optimizer='momentum_sgd'):
    """Host memory traffic of a chunk's two host jobs in multi-node CGDP.

    The reduce job reduces the slots (see :func:`host_traffic_bytes`) and
    packs the sum into the all-reduce buffer (read + write); the update job
    unpacks the result (read + write), scales it to the global mean (read +
    write) and runs the update (:data:`UPDATE_TRAFFIC`).

    Returns:
        tuple: ``(reduce bytes, update bytes)``.
    """
    reduction = n_devices + 1 if n_devices > 1 else 0
    return (n_bytes * (reduction + 2),
            n_bytes * (UPDATE_TRAFFIC[optimizer] + 2 + 2))


def host_job_parts(workload, hardware, n_devices, arrays, n_bytes):
    """Seconds of a chunk's two host jobs in multi-node CGDP.

    Between them the chunk is all-reduced across the nodes on the
    communication thread, and the host threads are free for other chunks.
    The reduce job carries the fixed cost of a host job. With measured host
    costs, packing, unpacking and scaling each cost one ``reduce_slot``
    (a pass that reads one array and updates another). Every pass is over
    the chunk's flat slices: its fixed costs are paid once per host call
    (:func:`cgdp_chunk_calls`), not per array.

    Returns:
        tuple: ``(reduce seconds, update seconds)``.
    """
    calls = cgdp_chunk_calls(arrays).host_calls
    if workload.host_ops is not None:
        ops = workload.host_ops
        one_pass = op_cost(ops, 'reduce_slot', calls, n_bytes)
        reduce_s = hardware.host_chunk_overhead_s + one_pass
        if n_devices > 1:
            reduce_s += (op_cost(ops, 'reduce2', calls, n_bytes)
                         + (n_devices - 2) * op_cost(ops, 'reduce_slot',
                                                     calls, n_bytes))
        update_s = host_update_seconds(workload, hardware, calls,
                                       n_bytes) + 2 * one_pass
        return reduce_s, update_s
    reduce_traffic, update_traffic = host_traffic_parts(
        n_devices, n_bytes, workload.optimizer)
    rate = host_rate(hardware)
    reduce_calls = n_devices if n_devices > 1 else 0
    op = hardware.host_op_overhead_s
    reduce_s = (reduce_traffic / rate + calls * (reduce_calls + 1) * op
                + hardware.host_chunk_overhead_s)
    update_s = (update_traffic / rate
                + calls * (host_update_overhead(hardware, workload.optimizer)
                            + 2 * op))
    return reduce_s, update_s


def host_job_gil_seconds(workload, hardware, n_devices, arrays,
                         part=None):
    """Seconds of a chunk's host job that hold the GIL.

    A host operation's cost per call (``per_array_s`` of each measured
    operation: the update rule's Python, NumPy's dispatch; on presets their
    ``host_op_overhead_s`` and update overhead), paid once per host call
    of the chunk (:func:`cgdp_chunk_calls`), runs under the GIL; its cost
    per byte (NumPy's loops) does not. The job's fixed cost (waking the
    pool thread, the events) is Python too.

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        n_devices (int): Slots to reduce.
        arrays (int): Parameter arrays in the chunk.

    Args:
        part (str or None): ``None`` for the single-node job;
            ``'reduce'`` or ``'update'`` for the multi-node jobs (see
            :func:`host_job_parts`).

    Returns:
        float: Seconds.
    """
    ops = workload.host_ops
    calls = cgdp_chunk_calls(arrays).host_calls

    def per_call(name):
        if name == 'update':
            if workload.update_op() is not None:
                return calls * workload.update_op()['per_array_s']
            return calls * host_update_overhead(hardware,
                                                workload.optimizer)
        if ops is None:
            passes = 2 if name == 'reduce2' else 1
            return calls * passes * hardware.host_op_overhead_s
        return calls * ops[name]['per_array_s']
    reduce_s = 0.0
    if n_devices > 1:
        reduce_s = per_call('reduce2') + (n_devices - 2) * per_call(
            'reduce_slot')
    if part == 'reduce':
        return (hardware.host_chunk_overhead_s + reduce_s
                + per_call('reduce_slot'))
    if part == 'update':
        return per_call('update') + 2 * per_call('reduce_slot')
    if workload.host_fused is not None:
        # The fused kernels release the GIL; their Python per call holds
        # it.
        return (hardware.host_chunk_overhead_s
                + calls * workload.host_fused['per_array_s'])
    return hardware.host_chunk_overhead_s + reduce_s + per_call('update')


def threads_per_server(hardware):
    return max(1, hardware.host_threads // hardware.host_servers)


def host_rate(hardware):
    return min(hardware.host_thread_bw * threads_per_server(hardware),
               hardware.host_memory_bw)


def device_op_seconds(workload, hardware, kind, arrays, n_bytes):
    """Seconds of an on-device operation of the typical baseline.

    Args:
        kind (str): ``'add'`` (gradient sum: 3 bytes of traffic per byte),
            ``'update'`` (the workload's optimizer, see
            :data:`UPDATE_TRAFFIC`) or ``'pack'`` (a copy into or out of a
            packed buffer: 2).
    """
    if kind == 'update' and workload.device_update_s is not None and \
            workload.optimizer == 'momentum_sgd':
        return workload.device_update_s * (
            n_bytes / float(max(1, workload.total_bytes)))
    per_byte = {'add': 3, 'pack': 2,
                'update': UPDATE_TRAFFIC[workload.optimizer]}[kind]
    traffic = per_byte * n_bytes
    return traffic / hardware.device_memory_bw + \
        arrays * hardware.device_array_overhead_s


def cpu_threads_per_replica(hardware, n_devices):
    """BLAS threads of each CPU replica, as the CGDP runtime sets them: all
    cores for one replica, else cores divided by replicas (at least 1)."""
    if n_devices < 2:
        return hardware.cores
    return max(1, hardware.cores // n_devices)


def _amdahl(t_all, t_one, cores, threads):
    """Time of a layer with ``threads`` BLAS threads, from its measured
    times with all ``cores`` and with one thread, and the cores it keeps
    busy alone (its work rate in one-thread units).

    Between the two measured points, Amdahl's law with the serial share
    that the two measurements imply.
    """
    if t_one is None or t_one <= 0 or t_all <= 0:
        return t_all, 1.0
    if threads >= cores:
        return t_all, t_one / t_all
    if threads <= 1:
        return t_one, 1.0
    serial_share = min(1.0, max(0.0, 1.0 - (1.0 - t_all / t_one)
                                / (1.0 - 1.0 / cores)))
    time = t_one * (serial_share + (1.0 - serial_share) / threads)
    return time, t_one / time


def cpu_layer_times(workload, hardware, threads):
    """Per-layer forward and backward seconds of a CPU replica with
    ``threads`` BLAS threads, and the cores it keeps busy: measured with
    all cores where the profile has it (``whole.busy_cores``, interpolated
    down to 1 for fewer threads), else the cores its BLAS work would keep
    busy by Amdahl's law.

    Returns:
        tuple: ``(forward list, backward list, cores busy)``.
    """
    forward, backward = [], []
    busy_time = work_time = 0.0
    for index in range(workload.n_layers):
        pairs = ((workload.forward_s, workload.forward_1t_s, forward),
                 (workload.backward_s, workload.backward_1t_s, backward))
        for all_cores, one, out in pairs:
            t_one = one[index] if one is not None else None
            t, busy = _amdahl(all_cores[index], t_one, hardware.cores,
                              threads)
            out.append(t)
            busy_time += t * busy
            work_time += t
    busy = busy_time / work_time if work_time > 0 else 1.0
    if workload.busy_cores is not None and threads > 1:
        # Measured: OpenBLAS's idle threads spin between calls, so a
        # replica occupies all its BLAS threads' cores, not just its BLAS
        # share; fewer threads than cores occupy proportionally fewer.
        cores = max(1, hardware.cores)
        if threads >= cores or cores == 1:
            busy = workload.busy_cores
        else:
            busy = 1.0 + (workload.busy_cores - 1.0) * (threads - 1) / (
                cores - 1.0)
    return forward, backward, busy


def chunk_compute_times(workload, hardware, forward, backward, chunks):
    """Forward and backward seconds of each chunk, with the per-chunk cost.

    CPU replicas (measured): the sums of the layers plus the measured cost
    of a chunk. GPUs: the queued device work, but at least the
    hardware's ``chunk_overhead_s`` for a backward (Python must issue it).

    Args:
        forward, backward (list of float): Per-layer seconds.
        chunks (list of (int, int)): Layer ranges.

    Returns:
        tuple of list: ``(forward per chunk, backward per chunk)``.
    """
    chunk_forward = [sum(forward[a:b]) for a, b in chunks]
    chunk_backward = [sum(backward[a:b]) for a, b in chunks]
    if workload.chunk_backward_overhead_s is not None:
        chunk_forward = [t + (workload.chunk_forward_overhead_s or 0.0)
                         for t in chunk_forward]
        chunk_backward = [t + workload.chunk_backward_overhead_s
                          for t in chunk_backward]
    elif hardware.kind == 'cpu':
        chunk_backward = [t + hardware.chunk_overhead_s
                          for t in chunk_backward]
    else:
        chunk_backward = [max(t, hardware.chunk_overhead_s)
                          for t in chunk_backward]
    return chunk_forward, chunk_backward


def chunk_gil_times(workload, hardware, chunks):
    """GIL seconds of each chunk's forward and backward (CPU replicas).

    The layers' GIL seconds (:func:`layer_gil_seconds`) plus the fixed cost
    of a chunk, which is Python (the cut, the backward call, the hand-over).

    Returns:
        tuple of list or None: ``(forward per chunk, backward per chunk)``,
        or ``None`` when the workload has no GIL seconds.
    """
    if workload.forward_gil_s is None or workload.backward_gil_s is None:
        return None
    forward_overhead = workload.chunk_forward_overhead_s or 0.0
    if workload.chunk_backward_overhead_s is not None:
        backward_overhead = workload.chunk_backward_overhead_s
    else:
        backward_overhead = hardware.chunk_overhead_s
    forward = [sum(workload.forward_gil_s[a:b]) + forward_overhead
               for a, b in chunks]
    backward = [sum(workload.backward_gil_s[a:b]) + backward_overhead
                for a, b in chunks]
    return forward, backward


def gil_demand(demands, gil_seconds, seconds):
    """Adds a task's share of the GIL to its demands: the GIL seconds it
    needs over its duration at full speed, at most 1."""
    demands = dict(demands or {})
    if gil_seconds > 0 and seconds > 0:
        demands['gil'] = min(1.0, gil_seconds / seconds)
    return demands


def replica_gil_share(workload, hardware, forward, backward, chunks):
    """The fraction of a CPU replica's compute that holds the GIL, at the
    layer times ``forward`` and ``backward`` (0 when unknown)."""
    gil = chunk_gil_times(workload, hardware, chunks)
    if gil is None:
        return 0.0
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    total = sum(chunk_forward) + sum(chunk_backward)
    if total <= 0:
        return 0.0
    return min(1.0, (sum(gil[0]) + sum(gil[1])) / total)


# Memory traffic of a CPU replica's chunk per parameter byte: the forward
# reads the weights; the backward reads them again, writes the weight
# gradient and first has the kernel zero its freshly allocated pages
# (Chainer allocates gradients anew each iteration after cleargrads).
# Activations are left out.
FORWARD_TRAFFIC = 1
BACKWARD_TRAFFIC = 3


def cpu_memory_demand(hardware, demands, traffic_bytes, seconds):
    """Adds a CPU task's memory bandwidth use to its demands.

    The use at full speed is its traffic over its measured time, capped at
    the memory's capacity (the measured time already includes running
    alone at that bandwidth).
    """
    demands = dict(demands or {})
    if seconds > 0 and traffic_bytes > 0:
        demands['host_mem[0]'] = min(hardware.host_memory_bw,
                                     traffic_bytes / seconds)
    return demands


def cpu_compute(workload, hardware, threads, caps=None):
    """Layer times and core demand of a CPU replica; raises the cores'
    capacity in ``caps`` to at least what one replica keeps busy, since its
    measured times already are those of a replica alone."""
    forward, backward, busy = cpu_layer_times(workload, hardware, threads)
    if caps is not None and 'cores' in caps:
        caps['cores'] = max(caps['cores'], busy)
    return forward, backward, {'cores': busy}


def whole_model_times(workload, hardware, forward, backward):
    """Forward and backward seconds of the whole model as one chunk (what a
    non-chunked updater runs)."""
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, [(0, len(forward))])
    return chunk_forward[0], chunk_backward[0]
