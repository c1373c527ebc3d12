"""Closed forms: iteration times as sums of phases and max-plus
recurrences, without the event simulation."""
import heapq
import math

from cgdp_chainer.costmodel import costs
from cgdp_chainer.costmodel import engine
from cgdp_chainer.costmodel import inputs
from cgdp_chainer.costmodel import topology


def chainermn_closed_form(workload, hardware, n_devices, n_nodes,
                          network=None, iterations=2):
    """The ChainerMN baseline's iteration time from its phases (see
    :func:`typical_closed_form` and :func:`simulate_chainermn`).

    Returns:
        float: Seconds per iteration.
    """
    return typical_closed_form(workload, hardware, n_devices, iterations,
                               n_nodes=n_nodes, network=network)


def typical_closed_form(workload, hardware, n_devices, iterations=2,
                        n_nodes=1, network=None):
    """``ParallelUpdater``'s iteration time from its phases (and, with
    ``n_nodes > 1``, the ChainerMN baseline's: the ring all-reduce ``A`` of
    the whole model across the nodes runs between the local sum and the
    update, ``U' = t_{N-1} + A + u``; see :func:`simulate_chainermn`).

    CPU replicas (one thread drives all):
    ``N (F + B) + (N - 1) addgrads + update + (N - 1) copyparams``.

    GPUs: copies and kernels are queued asynchronously, so replica ``j``'s
    next forward starts as soon as its own broadcast ``c_j`` is done. With
    ``g_j`` the copy of replica ``j``'s gradients to device 0 and ``a`` the
    add there, the steady state follows the max-plus recurrence
    ``s_0 = U``, ``s_j = U + c_1 + ... + c_j`` (forward starts after the
    update ends at ``U``), ``t_0 = s_0 + F + B``,
    ``t_j = max(t_{j-1}, s_j + F + B) + g_j + a``, ``U' = t_{N-1} + u``; the
    iteration takes the time between two consecutive last broadcasts.
    Each phase's time is that of its copy alone on its path. One Python
    thread issues all replicas' kernels, so ``F + B`` is at least ``N``
    times a replica's host-side time ``H`` (:func:`inputs.launch_seconds`):
    ``F + B := max(F + B, N H)``.

    Returns:
        float: Seconds per iteration.
    """
    inputs.check_common(workload, hardware, n_devices)
    network = inputs.resolve_network(network, n_nodes)
    n_bytes, arrays = workload.total_bytes, workload.total_arrays
    net_s = costs.ring_allreduce_seconds(n_bytes, n_nodes, network)
    if hardware.kind == 'cpu':
        forward, backward, _ = costs.cpu_layer_times(workload, hardware,
                                                     hardware.cores)
        f_s, b_s = costs.whole_model_times(workload, hardware, forward,
                                           backward)
        ops = workload.host_ops
        return (n_devices * (f_s + b_s)
                + (n_devices - 1) * costs.op_cost(ops, 'addgrads', arrays,
                                                  n_bytes)
                + net_s
                + costs.host_update_seconds(workload, hardware, arrays,
                                            n_bytes)
                + (n_devices - 1) * costs.op_cost(ops, 'copyparams', arrays,
                                                  n_bytes))
    caps = topology.capacities(hardware, n_devices)
    latency = costs.per_array_copy_latency_seconds(hardware, arrays, n_bytes)
    f_s, b_s = costs.whole_model_times(workload, hardware, workload.forward_s,
                                       workload.backward_s)
    compute = f_s + b_s
    gil = costs.chunk_gil_times(workload, hardware, [(0, workload.n_layers)])
    if gil is not None:
        compute = max(compute, n_devices * (gil[0][0] + gil[1][0]))
    add_s = costs.device_op_seconds(workload, hardware, 'add', arrays, n_bytes)
    update_s = costs.device_op_seconds(workload, hardware, 'update', arrays,
                                       n_bytes)
    gather = [0.0] + [latency + n_bytes / topology.standalone_rate(
        hardware, caps, topology.peer_path(hardware, j, 0))
                      for j in range(1, n_devices)]
    broadcast = [0.0] + [latency + n_bytes / topology.standalone_rate(
        hardware, caps, topology.peer_path(hardware, 0, j))
                         for j in range(1, n_devices)]
    starts = [0.0] * n_devices
    ends = []
    for _ in range(max(1, iterations)):
        t = starts[0] + compute
        for j in range(1, n_devices):
            t = max(t, starts[j] + compute) + gather[j] + add_s
        update_end = t + net_s + update_s
        t = update_end
        starts = [update_end]
        for j in range(1, n_devices):
            t += broadcast[j]
            starts.append(t)
        ends.append(t)
    if len(ends) == 1:
        return ends[0]
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def nccl_phases(workload, hardware, n_devices):
    """Phase times of Chainer's ``MultiprocessParallelUpdater`` (see
    :func:`simulate.simulate_nccl`).

    Returns:
        dict: ``compute`` (forward + backward of one replica), ``pack``
        (one packing or unpacking kernel over all parameters), ``reduce``
        and ``bcast`` (the NCCL collectives, latency included) and
        ``update`` (device 0's update); with one device the collectives
        and packing are 0.
    """
    inputs.check_common(workload, hardware, n_devices)
    inputs.check_gpu(hardware, 'the NCCL baseline')
    caps = topology.capacities(hardware, n_devices)
    n_bytes, arrays = workload.total_bytes, workload.total_arrays
    f_s, b_s = costs.whole_model_times(workload, hardware,
                                       workload.forward_s,
                                       workload.backward_s)
    phases = {'compute': f_s + b_s,
              'update': costs.device_op_seconds(workload, hardware, 'update',
                                                arrays, n_bytes),
              'pack': 0.0, 'reduce': 0.0, 'bcast': 0.0}
    if n_devices > 1:
        phases['pack'] = costs.device_op_seconds(workload, hardware, 'pack',
                                                 1, n_bytes)
        for kind in ('reduce', 'bcast'):
            data, latency, _ = topology.collective(hardware, caps, n_devices,
                                                   n_bytes, 0, kind)
            phases[kind] = data + latency
    return phases


def nccl_closed_form(workload, hardware, n_devices):
    """``MultiprocessParallelUpdater``'s iteration time: every phase waits
    for the one before, so ``t = F + B + pack + R + unpack + u + pack + C +
    unpack``, with ``R = (N - 1) l + n / r_R`` the pipelined ring reduce
    onto device 0 and ``C`` the broadcast alike (``r``: the slowest ring
    hop's fair rate, ``l``: the copy latency per hop), ``u`` device 0's
    update. With one device, ``F + B + u``.

    Returns:
        float: Seconds per iteration.
    """
    p = nccl_phases(workload, hardware, n_devices)
    return (p['compute'] + 4 * p['pack'] + p['reduce'] + p['update']
            + p['bcast'])


def cgdp_phases(workload, hardware, n_devices, chunk_size, n_nodes=1,
                network=None, workers='process'):
    """Per-chunk phase times of CGDP in backward order (output end first).

    Copies that run at the same time on all devices get their max-min fair
    share of the links (the slowest device's rate); host memory is not
    shared between copies and host threads here. Thread workers that hold
    the interpreter lock for a share ``g`` of their compute stretch it by
    ``max(1, N g)``.

    Args:
        n_nodes (int): Nodes (multi-node CGDP when above 1).
        network (str, Network or None): See :func:`inputs.resolve_network`.
        workers (str): ``'process'`` or ``'thread'`` (see
            :func:`simulate.simulate_cgdp`).

    Returns:
        dict: ``forward`` (seconds of one replica's forward), lists
        ``backward`` (on GPUs with its gradients' gather, see
        :func:`costs.cgdp_chunk_times`), ``d2h``, ``host``, ``allreduce``
        (the chunk's ring all-reduce across the nodes; zeros for one
        node), ``h2d`` (one entry per chunk, output end first) and
        ``chunks`` (their layer ranges).
        With ``n_nodes > 1`` also ``reduce`` and ``update``, the two host
        jobs (see :func:`costs.host_job_parts`), and ``host`` is their sum.
    """
    inputs.check_common(workload, hardware, n_devices)
    inputs.check_chunk_size(chunk_size, workload.n_layers)
    inputs.check_workers(workers)
    network = inputs.resolve_network(network, n_nodes)
    chunks = inputs.plan_chunks(workload.param_bytes, chunk_size)
    forward, backward = _shared_layer_times(workload, hardware, n_devices,
                                            workers, chunks)
    rates = _concurrent_copy_rates(hardware, n_devices, workers)
    chunk_forward, chunk_backward = costs.cgdp_chunk_times(
        workload, hardware, forward, backward, chunks)
    phases = {'forward': sum(chunk_forward), 'backward': [], 'd2h': [],
              'host': [], 'allreduce': [], 'h2d': [], 'chunks': []}
    if n_nodes > 1:
        phases['reduce'] = []
        phases['update'] = []
    for index in range(len(chunks) - 1, -1, -1):
        _add_chunk_phases(phases, workload, hardware, n_devices, n_nodes,
                          network, chunks[index], chunk_backward[index],
                          rates)
    return phases


def _shared_layer_times(workload, hardware, n_devices, workers, chunks):
    """Per-layer forward and backward seconds of one replica while all
    ``n_devices`` compute at once: CPU replicas share the cores, thread
    workers the interpreter lock.

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas.
        workers (str): ``'process'`` or ``'thread'``.
        chunks (list of tuple): The chunks' layer ranges.

    Returns:
        tuple: ``(forward, backward)`` lists of seconds.
    """
    slowdown = 1.0
    if hardware.kind == 'cpu':
        threads = costs.cpu_threads_per_replica(hardware, n_devices)
        forward, backward, busy = costs.cpu_layer_times(workload, hardware,
                                                        threads)
        # Replicas that compute at once share the cores (a replica alone
        # runs at its measured speed).
        slowdown = max(1.0, n_devices * busy / max(
            topology.cpu_capacity(hardware), busy))
    else:
        forward, backward = workload.forward_s, workload.backward_s
    if workers == 'thread':
        # ... and thread workers the interpreter lock: N replicas that
        # each hold it for a share g of their compute need N x g.
        gil_share = costs.replica_gil_share(workload, hardware, forward,
                                            backward, chunks)
        slowdown = max(slowdown, n_devices * gil_share)
    return [slowdown * t for t in forward], [slowdown * t for t in backward]


def _concurrent_copy_rates(hardware, n_devices, workers):
    """Rates of the gradients' and the weights' copies when every replica
    copies at once (the slowest device's), ``inf`` where there is no copy.

    Args:
        hardware (Hardware): The machine.
        n_devices (int): Replicas.
        workers (str): ``'process'`` or ``'thread'``.

    Returns:
        tuple: ``(d2h bytes/s, h2d bytes/s)``.
    """
    caps = topology.capacities(hardware, n_devices)
    if hardware.kind == 'cpu' and workers == 'thread':
        return math.inf, math.inf
    d2h_rate = min(topology.concurrent_rates(hardware, caps, [
        topology.host_path(hardware, i, 'd2h') for i in range(n_devices)]))
    if hardware.kind == 'cpu':
        # Worker processes copy gradients into shared slots and read the
        # weights in place (see simulate.simulate_cgdp).
        return d2h_rate, math.inf
    h2d_rate = min(topology.concurrent_rates(hardware, caps, [
        topology.host_path(hardware, i, 'h2d') for i in range(n_devices)]))
    return d2h_rate, h2d_rate


def _add_chunk_phases(phases, workload, hardware, n_devices, n_nodes,
                      network, chunk, backward_s, rates):
    """Appends one chunk's phases to ``phases``.

    Args:
        phases (dict): See :func:`cgdp_phases`.
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas.
        n_nodes (int): Nodes.
        network (Network or None): The network between the nodes.
        chunk (tuple): Its layer range ``(a, b)``.
        backward_s (float): Its backward's seconds.
        rates (tuple): See :func:`_concurrent_copy_rates`.
    """
    d2h_rate, h2d_rate = rates
    a, b = chunk
    n_bytes = sum(workload.param_bytes[a:b])
    arrays = sum(workload.param_arrays[a:b])
    # One copy per direction per chunk, whatever its array count.
    latency = costs.cgdp_copy_latency_seconds(hardware, arrays, n_bytes) \
        if math.isfinite(d2h_rate) else 0.0
    d2h_s = latency + n_bytes / d2h_rate
    h2d_s = (latency + n_bytes / h2d_rate) if math.isfinite(
        h2d_rate) else 0.0
    if hardware.kind == 'cpu':
        # The replica copies before its next backward: one sequence.
        backward_s += d2h_s
        d2h_s = 0.0
    phases['chunks'].append((a, b))
    phases['backward'].append(backward_s)
    phases['d2h'].append(d2h_s)
    if n_nodes > 1:
        reduce_s, update_s = costs.host_job_parts(
            workload, hardware, n_devices, arrays, n_bytes)
        phases['reduce'].append(reduce_s)
        phases['update'].append(update_s)
        phases['host'].append(reduce_s + update_s)
    else:
        phases['host'].append(costs.host_job_seconds(
            workload, hardware, n_devices, arrays, n_bytes))
    phases['allreduce'].append(costs.ring_allreduce_seconds(
        n_bytes, n_nodes, network))
    phases['h2d'].append(h2d_s)


def cgdp_closed_form(workload, hardware, n_devices, chunk_size, n_nodes=1,
                     network=None, workers='process'):
    """CGDP's iteration time from the flow-line recurrence.

    With chunks in backward order ``k = 1..K``: the backward of chunk ``k``
    ends at ``b_k = F + sum_{j<=k} bwd_j``; its d2h at
    ``d_k = max(b_k, d_{k-1}) + d2h_k``; its host job on the first free of
    ``host_servers`` threads at ``h_k = max(d_k, free) + host_k``; its h2d at
    ``u_k = max(h_k, u_{k-1}) + h2d_k``. The next forward starts with chunk
    K (input side), whose copy is the last, so the iteration takes ``u_K``.

    Multi-node (``n_nodes = R > 1``): the host job splits into a reduce
    ending at ``r_k`` and an update ending at ``p_k``; between them the ring
    all-reduce ``A_k`` (:func:`costs.ring_allreduce_seconds`) on the
    network, in
    chunk order: ``a_k = max(r_k, a_{k-1}) + A_k``; the update is ready at
    ``a_k`` and ``u_k = max(p_k, u_{k-1}) + h2d_k``. Reduces and updates
    share the host threads first come, first served (see
    :func:`_multinode_host_schedule`). Special cases: one chunk gives
    ``F + B + d2h + reduce + A + update + h2d``; a network that is the
    bottleneck gives ``F + bwd_1 + d2h_1 + reduce_1 + sum_k A_k +
    update_K + h2d_K``. Like the single-node form, it equals the
    simulation for one host server (``host_servers == 1``, the GPU
    presets) where host memory is not a bottleneck shared with the copies;
    with several servers, updates can end out of chunk order and
    iterations overlap, which the recurrence leaves out.

    Returns:
        float: Seconds per iteration.
    """
    phases = cgdp_phases(workload, hardware, n_devices, chunk_size,
                         n_nodes, network, workers)
    if n_nodes > 1:
        return _multinode_closed_form(phases, hardware.host_servers)
    backward_end = phases['forward']
    d2h_end = h2d_end = 0.0
    free = [0.0] * hardware.host_servers
    for bwd, d2h, host, h2d in zip(phases['backward'], phases['d2h'],
                                   phases['host'], phases['h2d']):
        backward_end += bwd
        d2h_end = max(backward_end, d2h_end) + d2h
        server_free = heapq.heappop(free)
        host_end = max(d2h_end, server_free) + host
        heapq.heappush(free, host_end)
        h2d_end = max(host_end, h2d_end) + h2d
    return h2d_end


def _multinode_host_schedule(ready_reduce, reduce_s, allreduce_s, update_s,
                             servers):
    """End times of the reduce, all-reduce and update of each chunk.

    The host threads (``servers`` of them) serve reduces and updates in the
    order they become ready (an update ready at the same time as a reduce
    first); the network serves all-reduces in chunk order. Jobs are picked
    in order of readiness: the next reduce is ready when its copies have
    landed, the next update when its all-reduce has ended; a job starts on
    the first free thread, not before it is ready.

    Args:
        ready_reduce (list of float): When each chunk's d2h copies end
            (backward order, non-decreasing).
        reduce_s, allreduce_s, update_s (list of float): Per chunk.
        servers (int): Host jobs that run at once.

    Returns:
        tuple of list: ``(reduce ends, all-reduce ends, update ends)``.
    """
    n = len(ready_reduce)
    reduce_end = [0.0] * n
    net_end = [0.0] * n
    update_end = [0.0] * n
    free = [0.0] * servers
    next_reduce = next_update = 0
    network_free = 0.0
    while next_update < n:
        take_update = next_update < next_reduce and (
            next_reduce == n
            or net_end[next_update] <= ready_reduce[next_reduce])
        server_free = heapq.heappop(free)
        if take_update:
            k = next_update
            end = max(net_end[k], server_free) + update_s[k]
            update_end[k] = end
            next_update += 1
        else:
            k = next_reduce
            end = max(ready_reduce[k], server_free) + reduce_s[k]
            reduce_end[k] = end
            network_free = max(end, network_free) + allreduce_s[k]
            net_end[k] = network_free
            next_reduce += 1
        heapq.heappush(free, end)
    return reduce_end, net_end, update_end


def _multinode_closed_form(phases, servers):
    backward_end = phases['forward']
    d2h_end = 0.0
    ready = []
    for bwd, d2h in zip(phases['backward'], phases['d2h']):
        backward_end += bwd
        d2h_end = max(backward_end, d2h_end) + d2h
        ready.append(d2h_end)
    _, _, update_end = _multinode_host_schedule(
        ready, phases['reduce'], phases['allreduce'], phases['update'],
        servers)
    h2d_end = 0.0
    for end, h2d in zip(update_end, phases['h2d']):
        h2d_end = max(end, h2d_end) + h2d
    return h2d_end


def cgdp_critical_path(workload, hardware, n_devices, chunk_size,
                       workers='process'):
    """The critical-path formula of CGDP for one host thread.

    ``F + max over a<=b<=c<=d=K of sum_{k<=a} bwd_k + sum_{a<=k<=b} d2h_k +
    sum_{b<=k<=c} host_k + sum_{c<=k<=K} h2d_k`` (chunks in backward
    order). Equals :func:`cgdp_closed_form` when ``host_servers == 1``.

    Returns:
        float: Seconds per iteration.
    """
    phases = cgdp_phases(workload, hardware, n_devices, chunk_size,
                         workers=workers)
    stages = [phases['backward'], phases['d2h'], phases['host'],
              phases['h2d']]
    # best[s][k]: the longest path that ends in stage s at chunk k.
    n = len(stages[0])
    best_prev = [0.0] * n
    for s, times in enumerate(stages):
        best = [0.0] * n
        for k in range(n):
            from_left = best[k - 1] if k > 0 else -math.inf
            from_below = best_prev[k] if s > 0 else -math.inf
            if s == 0 and k == 0:
                start = 0.0
            else:
                start = max(from_left, from_below)
            best[k] = start + times[k]
        best_prev = best
    return phases['forward'] + best_prev[-1]
