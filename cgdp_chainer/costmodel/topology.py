"""The machine as shared resources: links, memories, peer ports, cores and
interpreter locks, and the paths copies and collectives take over them."""
from cgdp_chainer.costmodel import engine
def socket_of(hardware, device):
    return device // hardware.devices_per_socket


def link_group(hardware, device):
    return device // hardware.host_link_shared


def capacities(hardware, n_devices):
    """Shared resources of the simulation and their capacities (bytes/s, or
    cores for ``'cores'``)."""
    caps = {}
    n_sockets = max(1, socket_of(hardware, n_devices - 1) + 1)
    for g in range(link_group(hardware, n_devices - 1) + 1):
        caps['link_up[{}]'.format(g)] = hardware.host_link_bw
        caps['link_down[{}]'.format(g)] = hardware.host_link_bw
    for s in range(n_sockets):
        caps['host_mem[{}]'.format(s)] = hardware.host_memory_bw
        for t in range(n_sockets):
            if s != t:
                caps['socket_link[{}->{}]'.format(s, t)] = \
                    hardware.socket_link_bw
    if hardware.peer_scope != 'none':
        for i in range(n_devices):
            caps['peer_out[{}]'.format(i)] = hardware.peer_bw
            caps['peer_in[{}]'.format(i)] = hardware.peer_bw
    if hardware.kind == 'cpu':
        caps['cores'] = cpu_capacity(hardware)
    # The user's process's interpreter lock: its replica threads (thread
    # workers, ParallelUpdater's one thread) and its host threads hold it.
    caps['gil'] = 1.0
    return caps


def cpu_capacity(hardware):
    """Cores' worth of compute the CPU replicas share."""
    return float(hardware.effective_cores or hardware.cores)


def host_path(hardware, device, direction):
    """Resources a copy between ``device`` and the master weights (on
    socket 0) crosses, with bytes of use per byte moved.

    Args:
        direction (str): ``'d2h'`` or ``'h2d'``.
    """
    group = link_group(hardware, device)
    socket = socket_of(hardware, device)
    if direction == 'd2h':
        path = {'link_up[{}]'.format(group): 1.0}
        if socket != 0:
            path['socket_link[{}->0]'.format(socket)] = 1.0
    else:
        path = {'link_down[{}]'.format(group): 1.0}
        if socket != 0:
            path['socket_link[0->{}]'.format(socket)] = 1.0
    path['host_mem[0]'] = 1.0
    return path


def peer_path(hardware, source, destination):
    """Resources a device-to-device copy crosses (bytes of use per byte)."""
    s_src = socket_of(hardware, source)
    s_dst = socket_of(hardware, destination)
    scope = hardware.peer_scope
    if scope == 'all' or (scope == 'socket' and s_src == s_dst):
        return {'peer_out[{}]'.format(source): 1.0,
                'peer_in[{}]'.format(destination): 1.0}
    g_src = link_group(hardware, source)
    g_dst = link_group(hardware, destination)
    if scope == 'pcie' and s_src == s_dst:
        if g_src == g_dst:  # behind one switch: the uplink is not crossed
            return {}
        return {'link_up[{}]'.format(g_src): 1.0,
                'link_down[{}]'.format(g_dst): 1.0}
    # Staged through a pinned buffer in the source's socket: written and
    # read once there.
    path = {'link_up[{}]'.format(g_src): 1.0,
            'host_mem[{}]'.format(s_src): 2.0,
            'link_down[{}]'.format(g_dst): 1.0}
    if s_src != s_dst:
        path['socket_link[{}->{}]'.format(s_src, s_dst)] = 1.0
    return path


def standalone_rate(hardware, caps, path):
    """Bytes/s of a copy over ``path`` with nothing else running."""
    rate = hardware.copy_engine_bw
    for resource, use in path.items():
        rate = min(rate, caps[resource] / use)
    return rate


def concurrent_rates(hardware, caps, paths):
    """Max-min fair rates of copies that all run at once (bytes/s each).

    Args:
        paths (list of dict): Each copy's path (see :func:`host_path`).

    Returns:
        list of float: Each copy's rate.
    """
    tasks = []
    for index, path in enumerate(paths):
        rate = standalone_rate(hardware, caps, path)
        task = engine.Task(index, 'copy', index, None, 0, 1.0, 0.0, None,
                           {r: rate * use for r, use in path.items()})
        tasks.append((task, rate))
    engine.fair_speeds([t for t, _ in tasks], caps)
    return [task.speed * rate for task, rate in tasks]


def ring_hops(n_devices, root, kind):
    """The device-to-device hops of an NCCL ring collective.

    NCCL orders the ring by device index here (0 -> 1 -> ... -> N-1 -> 0);
    a reduce flows from the root's successor around the ring into the
    root, a broadcast from the root around to its predecessor: ``N - 1``
    hops either way, all busy at once as the data is pipelined through.

    Args:
        n_devices (int): Devices in the ring.
        root (int): The root device.
        kind (str): ``'reduce'`` or ``'bcast'``.

    Returns:
        list of (int, int): ``(source, destination)`` per hop.
    """
    order = [(root + k) % n_devices for k in range(n_devices)]
    if kind == 'reduce':
        order = order[1:] + order[:1]
    elif kind != 'bcast':
        raise ValueError("kind must be 'reduce' or 'bcast', got {!r}".format(
            kind))
    return list(zip(order[:-1], order[1:]))


def collective(hardware, caps, n_devices, n_bytes, root=0, kind='reduce'):
    """Time and resource use of a pipelined ring reduce or broadcast.

    Every hop carries all ``n_bytes`` (in pipelined pieces), all hops at
    once, so the collective runs at the slowest hop's max-min fair rate
    ``r`` among them: ``hops x copy_latency_s + n_bytes / r``.

    Returns:
        tuple: ``(seconds of data at full speed, latency seconds, demands
        dict for the simulation)``.
    """
    hops = ring_hops(n_devices, root, kind)
    if not hops or n_bytes <= 0:
        return 0.0, 0.0, {}
    paths = [peer_path(hardware, a, b) for a, b in hops]
    rate = min(concurrent_rates(hardware, caps, paths))
    demands = {}
    for path in paths:
        for resource, use in path.items():
            demands[resource] = demands.get(resource, 0.0) + rate * use
    return n_bytes / rate, len(hops) * hardware.copy_latency_s, demands
