"""Predictions at one point: both baselines and CGDP at the best chunk
size, their speedups and weak-scaling efficiencies."""
from cgdp_chainer.costmodel import closed
from cgdp_chainer.costmodel import costs
from cgdp_chainer.costmodel import hardware as hardware_module
from cgdp_chainer.costmodel import inputs
from cgdp_chainer.costmodel import simulate


# The smallest candidate gives at most this many chunks, as the runtime's
# 'auto' search starts (cgdp_chainer.runtime.chunks.chunk_choice.AUTO_SEARCH_MAX_CHUNKS):
# a deep network has hundreds of layers, and each chunk costs a message and
# a host task, so one-layer chunks are never the best there.
MAX_CANDIDATE_CHUNKS = 64


def candidate_chunk_sizes(n_layers):
    """Chunk sizes tried (layers per chunk): doubling from the size that
    gives at most :data:`MAX_CANDIDATE_CHUNKS` chunks, and ``n_layers``
    (one chunk), as the runtime's search does."""
    sizes = []
    size = max(1, -(-n_layers // MAX_CANDIDATE_CHUNKS))
    while size < n_layers:
        sizes.append(size)
        size *= 2
    sizes.append(n_layers)
    return sizes


def best_chunk_size(workload, hardware, n_devices, candidates=None,
                    method='simulate', iterations=2, n_nodes=1,
                    network=None, workers='process'):
    """The chunk size with the shortest predicted CGDP iteration.

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas.
        candidates (list of int or None): Sizes to try (default:
            :func:`candidate_chunk_sizes`).
        method (str): ``'simulate'`` or ``'closed'``.
        iterations (int): Simulated iterations per size.
        n_nodes (int): Nodes (multi-node CGDP when above 1).
        network (str, Network or None): See :func:`inputs.resolve_network`.
        workers (str): ``'process'`` or ``'thread'`` (see
            :func:`simulate.simulate_cgdp`).

    Returns:
        tuple: ``(best size, {size: seconds})``; ties go to the smaller size.
    """
    check_method(method)
    candidates = candidates or candidate_chunk_sizes(workload.n_layers)
    times = {}
    for size in candidates:
        if method == 'simulate':
            times[size] = simulate.simulate_cgdp(
                workload, hardware, n_devices, size, iterations,
                n_nodes=n_nodes, network=network,
                workers=workers).iteration_s
        else:
            times[size] = closed.cgdp_closed_form(
                workload, hardware, n_devices, size, n_nodes=n_nodes,
                network=network, workers=workers)
    best = min(candidates, key=lambda s: (times[s], s))
    return best, times


def predict(profile, hardware, n_devices, batch_per_device, chunk_size=None,
            method='simulate', single=None, workers='process',
            optimizer='momentum_sgd'):
    """Predicted iteration times, speedups and efficiencies at one point.

    Args:
        profile (dict): See :func:`inputs.check_profile`.
        hardware (str or Hardware): A preset name or a description.
        n_devices (int): Replicas.
        batch_per_device (int): Images per replica.
        chunk_size (int or None): CGDP chunk size; ``None`` picks the best.
        method (str): ``'simulate'`` or ``'closed'``.
        single (dict or None): The prediction at ``n_devices=1`` with the
            same other arguments (to save work in sweeps); computed when
            needed and not given.
        workers (str): CGDP's worker kind, ``'process'`` or ``'thread'``
            (the baselines' are fixed: ParallelUpdater drives every device
            from one thread, MultiprocessParallelUpdater runs a process per
            device).
        optimizer (str): ``'momentum_sgd'`` or ``'adam'``.

    Returns:
        dict: ``t_typical`` (ParallelUpdater), ``t_nccl``
        (MultiprocessParallelUpdater; ``None`` on CPU presets), ``t_cgdp``,
        ``speedup`` (typical over CGDP), ``speedup_vs_nccl``,
        ``eff_typical``, ``eff_nccl`` and ``eff_cgdp`` (weak-scaling
        efficiency within each scheme, ``t(1) / t(N)``, as in
        ``experiments.results``), ``best_chunk_size``, ``chunk_times`` and
        the closed forms ``t_typical_closed``, ``t_nccl_closed`` and
        ``t_cgdp_closed``.

    Raises:
        ValueError: A bad argument (named in the message).
    """
    hw = hardware_module.get_hardware(hardware, profile)
    inputs.check_n_devices(n_devices)
    inputs.check_workers(workers)
    check_method(method)
    workload = inputs.build_workload(profile, hw, batch_per_device,
                                     optimizer)
    if chunk_size is None:
        size, chunk_times = best_chunk_size(workload, hw, n_devices,
                                            method=method, workers=workers)
    else:
        inputs.check_chunk_size(chunk_size, workload.n_layers)
        size, chunk_times = chunk_size, {}
    result = _scheme_times(workload, hw, n_devices, size, chunk_times,
                           method, workers)
    if n_devices == 1:
        single = result
    elif single is None:
        single = predict(profile, hw, 1, batch_per_device,
                         chunk_size=chunk_size, method=method,
                         workers=workers, optimizer=optimizer)
    gpu = hw.kind == 'gpu'
    result['eff_typical'] = single['t_typical'] / result['t_typical']
    result['eff_cgdp'] = single['t_cgdp'] / result['t_cgdp']
    result['eff_nccl'] = single['t_nccl'] / result['t_nccl'] if gpu \
        else None
    return result


def _scheme_times(workload, hw, n_devices, size, chunk_times, method,
                  workers):
    """The three schemes' seconds per iteration at one point, simulated or
    closed, and CGDP's speedups.

    Args:
        workload (Workload): Per-layer costs.
        hw (Hardware): The machine.
        n_devices (int): Replicas.
        size (int): CGDP's chunk size.
        chunk_times (dict): ``{size: seconds}`` of the sizes tried (empty
            for a given size).
        method (str): ``'simulate'`` or ``'closed'``.
        workers (str): CGDP's worker kind.

    Returns:
        dict: :func:`predict`'s result without the efficiencies.
    """
    gpu = hw.kind == 'gpu'
    t_typical_closed = closed.typical_closed_form(workload, hw, n_devices)
    t_cgdp_closed = closed.cgdp_closed_form(workload, hw, n_devices, size,
                                            workers=workers)
    t_nccl_closed = closed.nccl_closed_form(workload, hw, n_devices) \
        if gpu else None
    if method == 'simulate':
        t_typical = simulate.simulate_typical(workload, hw,
                                              n_devices).iteration_s
        t_cgdp = chunk_times.get(size) or simulate.simulate_cgdp(
            workload, hw, n_devices, size, workers=workers).iteration_s
        t_nccl = simulate.simulate_nccl(workload, hw, n_devices).iteration_s \
            if gpu else None
    else:
        t_typical = t_typical_closed
        t_cgdp = chunk_times.get(size) or t_cgdp_closed
        t_nccl = t_nccl_closed
    return {
        't_typical': t_typical, 't_nccl': t_nccl, 't_cgdp': t_cgdp,
        'speedup': t_typical / t_cgdp,
        'speedup_vs_nccl': t_nccl / t_cgdp if gpu else None,
        'best_chunk_size': size, 'chunk_times': chunk_times,
        't_typical_closed': t_typical_closed,
        't_nccl_closed': t_nccl_closed, 't_cgdp_closed': t_cgdp_closed,
    }


MODES = (inputs.TYPICAL, inputs.NCCL, inputs.CGDP)


def predict_mode(profile, hardware, mode, n_devices, batch_per_device,
                 chunk_size=None, workers='process', optimizer='momentum_sgd',
                 method='simulate'):
    """Predicted seconds per iteration of one scheme at one point: what
    a measured point of ``make experiment`` or ``make validate-model`` is
    compared with.

    Args:
        profile (dict): See :func:`inputs.check_profile`.
        hardware (str or Hardware): A preset name or a description.
        mode (str): ``'typical'``, ``'nccl'`` or ``'cgdp'``.
        n_devices (int): Replicas.
        batch_per_device (int): Images per replica.
        chunk_size (int or None): CGDP's chunk size (the one the measured
            run resolved); ``None`` picks the best.
        workers (str): CGDP's worker kind.
        optimizer (str or chainer.Optimizer): See
            :func:`inputs.check_optimizer`.
        method (str): ``'simulate'`` or ``'closed'``.

    Returns:
        tuple: ``(seconds, chunk size or None)``.

    Raises:
        ValueError: A bad argument (named in the message).
    """
    if mode not in MODES:
        raise ValueError('mode must be one of {}, got {!r}'.format(
            ', '.join(MODES), mode))
    check_method(method)
    inputs.check_workers(workers)
    hw = hardware_module.get_hardware(hardware, profile)
    inputs.check_n_devices(n_devices)
    workload = inputs.build_workload(profile, hw, batch_per_device,
                                     optimizer)
    simulated = method == 'simulate'
    if mode == inputs.TYPICAL:
        if simulated:
            return simulate.simulate_typical(workload, hw,
                                             n_devices).iteration_s, None
        return closed.typical_closed_form(workload, hw, n_devices), None
    if mode == inputs.NCCL:
        if simulated:
            return simulate.simulate_nccl(workload, hw,
                                          n_devices).iteration_s, None
        return closed.nccl_closed_form(workload, hw, n_devices), None
    if chunk_size is None:
        size, times = best_chunk_size(workload, hw, n_devices, method=method,
                                      workers=workers)
        return times[size], size
    inputs.check_chunk_size(chunk_size, workload.n_layers)
    if simulated:
        return simulate.simulate_cgdp(workload, hw, n_devices, chunk_size,
                                      workers=workers).iteration_s, \
            chunk_size
    return closed.cgdp_closed_form(workload, hw, n_devices, chunk_size,
                                   workers=workers), chunk_size


def check_method(method):
    """Raises ValueError unless ``method`` is ``'simulate'`` or
    ``'closed'``."""
    if method not in ('simulate', 'closed'):
        raise ValueError("method must be 'simulate' or 'closed', got "
                         "{!r}".format(method))


def predict_multinode(profile, hardware, network, n_nodes, devices_per_node,
                      batch_per_device, chunk_size=None, method='simulate',
                      single=None):
    """Predicted iteration times of the ChainerMN baseline and multi-node
    CGDP on ``n_nodes`` nodes of ``devices_per_node`` devices each.

    Args:
        profile (dict): See :func:`check_profile`.
        hardware (str or Hardware): One node (a preset name or a
            description).
        network (str or Network): The network between the nodes
            (``'ib-edr'``, ``'ib-hdr'`` or a description).
        n_nodes (int): Nodes ``R``.
        devices_per_node (int): Devices per node ``N``.
        batch_per_device (int): Images per device (weak scaling: the global
            batch is ``R x N x batch_per_device``).
        chunk_size (int or None): CGDP chunk size; ``None`` picks the best.
        method (str): ``'simulate'`` or ``'closed'``.
        single (dict or None): The prediction at one node of one device
            (to save work in sweeps); computed when needed and not given.

    Returns:
        dict: ``t_chainermn``, ``t_cgdp``, ``speedup`` (ChainerMN over
        CGDP), ``eff_chainermn`` and ``eff_cgdp`` (weak-scaling efficiency
        within each method against one device on one node, ``t(1 x 1) /
        t(R x N)``), ``best_chunk_size``, ``chunk_times``, the closed forms
        ``t_chainermn_closed`` and ``t_cgdp_closed``, and ``allreduce_s``
        (the ring all-reduce of the whole model across the nodes). With
        ``n_nodes == 1`` the times equal :func:`predict`'s ``t_typical`` and
        ``t_cgdp``.

    Raises:
        ValueError: A count, the batch, the network or the hardware is
            invalid.
    """
    hw = hardware_module.get_hardware(hardware, profile)
    net = inputs.resolve_network(network, n_nodes)
    inputs.check_n_devices(devices_per_node)
    if method not in ('simulate', 'closed'):
        raise ValueError("method must be 'simulate' or 'closed', got "
                         "{!r}".format(method))
    workload = inputs.build_workload(profile, hw, batch_per_device)
    n = devices_per_node
    if chunk_size is None:
        size, chunk_times = best_chunk_size(workload, hw, n, method=method,
                                            n_nodes=n_nodes, network=net)
    else:
        inputs.check_chunk_size(chunk_size, workload.n_layers)
        size, chunk_times = chunk_size, {}
    closed_mn = closed.chainermn_closed_form(workload, hw, n, n_nodes, net)
    closed_cgdp = closed.cgdp_closed_form(workload, hw, n, size, n_nodes, net)
    if method == 'simulate':
        t_chainermn = simulate.simulate_chainermn(workload, hw, n, n_nodes,
                                                  net).iteration_s
        t_cgdp = chunk_times.get(size) or simulate.simulate_cgdp(
            workload, hw, n, size, n_nodes=n_nodes,
            network=net).iteration_s
    else:
        t_chainermn = closed_mn
        t_cgdp = chunk_times.get(size) or closed_cgdp
    result = {
        't_chainermn': t_chainermn, 't_cgdp': t_cgdp,
        'speedup': t_chainermn / t_cgdp, 'best_chunk_size': size,
        'chunk_times': chunk_times, 't_chainermn_closed': closed_mn,
        't_cgdp_closed': closed_cgdp,
        'allreduce_s': costs.ring_allreduce_seconds(
            workload.total_bytes, n_nodes, net),
    }
    if n_nodes == 1 and n == 1:
        single = result
    elif single is None:
        single = predict_multinode(profile, hw, net, 1, 1, batch_per_device,
                                   chunk_size=chunk_size, method=method)
    result['eff_chainermn'] = single['t_chainermn'] / t_chainermn
    result['eff_cgdp'] = single['t_cgdp'] / t_cgdp
    return result


def hardware_from_profile(profile):
    """A :class:`Hardware` for the machine a profile was measured on.

    ``'@numpy'`` profiles give ``this-cpu``; GPU profiles give ``this-gpu``,
    whose copy bandwidth and latency are the measured ones (one socket, no
    peer links assumed, measured host costs), and whose host-side cost per
    function call is the measured one on CuPy arrays (launches included).

    Raises:
        ValueError: The profile lacks its copy measurements.
    """
    device = profile.get('device')
    if device == '@numpy':
        return hardware_module.this_cpu(profile)
    copy = profile.get('copy')
    if not copy:
        raise ValueError('the profile has no copy measurements; measure it '
                         'with experiments.profile')
    machine = profile.get('machine', {})
    d2h = float(copy['d2h_bytes_per_s'])
    h2d = float(copy['h2d_bytes_per_s'])
    threads = int(profile.get('host', {}).get('threads', 1))
    calls = machine.get('function_call') or {}
    launch = {}
    if calls:
        launch = {'function_forward_s': float(calls['forward_s']),
                  'function_backward_s': float(calls['backward_s']),
                  'kernel_launch_s': 0.0}
    return hardware_module.Hardware(
        name='this-gpu', description='the GPU machine profiled',
        kind='gpu', physical_devices=int(machine.get('gpus', 1)) or 1,
        peak_flops=float(machine.get('achieved_flops', 1e12)) or 1e12,
        compute_efficiency=1.0,
        device_memory_bw=float(copy.get('device_bytes_per_s', 500e9)),
        device_array_overhead_s=20e-6,
        devices_per_socket=max(1, int(machine.get('gpus', 1))),
        host_link_bw=min(d2h, h2d), host_link_shared=1,
        copy_latency_s=float(copy.get('latency_s', 10e-6)),
        copy_engine_bw=max(d2h, h2d), peer_scope='none', peer_bw=0.0,
        socket_link_bw=min(d2h, h2d),
        host_memory_bw=float(copy.get('memory_bytes_per_s', 50e9)),
        host_threads=threads, host_thread_bw=float(
            copy.get('memory_bytes_per_s', 10e9)),
        host_servers=threads, sources='measured by experiments.profile',
        **launch)
