"""Simulated iterations of ParallelUpdater (typical), Chainer's NCCL
updater, ChainerMN and CGDP: task graphs on the machine's resources, run by
:mod:`cgdp_chainer.costmodel.engine`."""
import dataclasses

from cgdp_chainer.costmodel import costs
from cgdp_chainer.costmodel import engine
from cgdp_chainer.costmodel import inputs
from cgdp_chainer.costmodel import topology


@dataclasses.dataclass
class SimulationResult:
    """What a simulation returns.

    Attributes:
        iteration_s (float): Steady-state seconds per iteration (the last
            iteration's end minus the one before, averaged).
        tasks (list of Task): Every task with its start and end.
        iteration_ends (list of float): When each iteration's last task
            ended.
        compute_s (float): Forward + backward seconds of one replica (as
            run in this configuration).
    """
    iteration_s: float
    tasks: list
    iteration_ends: list
    compute_s: float

    @property
    def exposed_s(self):
        """Iteration time not covered by one replica's compute."""
        return max(0.0, self.iteration_s - self.compute_s)

    def events(self, iteration=None):
        """Tasks as ``(iteration, device, kind, chunk, start, end)`` tuples,
        like :class:`cgdp_chainer.timeline.Event`."""
        return [(t.iteration, t.device, t.kind, t.chunk, t.start, t.end)
                for t in self.tasks
                if iteration is None or t.iteration == iteration]


def iteration_result(tasks, iterations, compute_s):
    ends = [0.0] * iterations
    for task in tasks:
        ends[task.iteration] = max(ends[task.iteration], task.end)
    if iterations == 1:
        period = ends[0]
    else:
        period = (ends[-1] - ends[0]) / (iterations - 1)
    return SimulationResult(period, tasks, ends, compute_s)


def add_transfer(sim, hardware, caps, kind, device, chunk, iteration, path,
                 n_bytes, arrays, deps, exclusive, extra_demands=None):
    """Adds a copy of ``n_bytes`` in ``arrays`` calls over ``path`` (one
    copy call per parameter array, as the runtime and Chainer issue them);
    ``extra_demands`` are other shared resources it uses (a CPU copy's
    core).
    """
    rate = topology.standalone_rate(hardware, caps, path)
    demands = {resource: rate * use for resource, use in path.items()}
    demands.update(extra_demands or {})
    latency = arrays * hardware.copy_latency_s if n_bytes > 0 else 0.0
    return sim.add(kind, device, chunk, iteration, n_bytes / rate, deps,
                   latency=latency, exclusive=exclusive, demands=demands)


def whole_model_gil_demands(workload, hardware, f_s, b_s):
    """The interpreter-lock demands of a whole-model forward and backward
    (see :func:`costs.chunk_gil_times`); empty when not modelled."""
    gil = costs.chunk_gil_times(workload, hardware,
                                [(0, workload.n_layers)])
    if gil is None:
        return None, None
    return (costs.gil_demand(None, gil[0][0], f_s),
            costs.gil_demand(None, gil[1][0], b_s))


def simulate_nccl(workload, hardware, n_devices, iterations=2):
    """Simulates Chainer's ``MultiprocessParallelUpdater`` iterations.

    What Chainer 7.8.1 does (``chainer/training/updaters/
    multiprocess_parallel_updater.py``): one process per GPU runs its
    forward and backward; each packs its gradients into one buffer (one
    kernel, ``gather_grads``); an NCCL reduce sums the buffers onto device
    0 (a pipelined ring, :func:`topology.collective`); device 0 unpacks
    them (``scatter_grads``), updates its model and packs its parameters
    (``gather_params``); an NCCL broadcast sends them to every device, and
    each other device unpacks them (``scatter_params``) before its next
    forward. Each process issues its own kernels (no shared interpreter).
    With one device it is ``StandardUpdater``: forward, backward, update.

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine (a GPU preset).
        n_devices (int): GPUs.
        iterations (int): Iterations to simulate (>= 1).

    Returns:
        SimulationResult: The timing.

    Raises:
        ValueError: A CPU preset (the baseline needs NCCL and GPUs).
    """
    inputs.check_common(workload, hardware, n_devices)
    inputs.check_gpu(hardware, 'the NCCL baseline')
    caps = topology.capacities(hardware, n_devices)
    sim = engine.Simulation(caps)
    n_bytes, arrays = workload.total_bytes, workload.total_arrays
    f_s, b_s = costs.whole_model_times(workload, hardware,
                                       workload.forward_s,
                                       workload.backward_s)
    pack_s = costs.device_op_seconds(workload, hardware, 'pack', 1, n_bytes)
    update_s = costs.device_op_seconds(workload, hardware, 'update', arrays,
                                       n_bytes)
    reduce = topology.collective(hardware, caps, n_devices, n_bytes, 0,
                                 'reduce')
    bcast = topology.collective(hardware, caps, n_devices, n_bytes, 0,
                                'bcast')
    ready = [None] * n_devices
    for it in range(iterations):
        packed = []
        for i in range(n_devices):
            fwd = sim.add('forward', i, None, it, f_s, [ready[i]])
            bwd = sim.add('backward', i, None, it, b_s, [fwd])
            if n_devices > 1:
                bwd = sim.add('pack', i, None, it, pack_s, [bwd])
            packed.append(bwd)
        if n_devices == 1:
            ready[0] = sim.add('update', 0, None, it, update_s, packed)
            continue
        summed = sim.add('reduce', 'nccl', None, it, reduce[0], packed,
                         latency=reduce[1], demands=reduce[2])
        unpacked = sim.add('unpack', 0, None, it, pack_s, [summed])
        updated = sim.add('update', 0, None, it, update_s, [unpacked])
        params = sim.add('pack', 0, None, it, pack_s, [updated])
        sent = sim.add('bcast', 'nccl', None, it, bcast[0], [params],
                       latency=bcast[1], demands=bcast[2])
        ready[0] = sent
        for j in range(1, n_devices):
            ready[j] = sim.add('unpack', j, None, it, pack_s, [sent])
    sim.run()
    return iteration_result(sim.tasks, iterations, f_s + b_s)


def simulate_typical(workload, hardware, n_devices, iterations=2,
                     n_nodes=1, network=None):
    """Simulates ``ParallelUpdater`` iterations (and, with ``n_nodes > 1``,
    the ChainerMN baseline; see :func:`simulate_chainermn`).

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas (per node).
        iterations (int): Iterations to simulate (>= 1).
        n_nodes (int): Nodes; above 1, the gradient sum on device 0 is
            all-reduced across the nodes (a ring on the network) before the
            update.
        network (str, Network or None): See :func:`inputs.resolve_network`.

    Returns:
        SimulationResult: The timing.
    """
    inputs.check_common(workload, hardware, n_devices)
    network = inputs.resolve_network(network, n_nodes)
    caps = topology.capacities(hardware, n_devices)
    sim = engine.Simulation(caps)
    net_s = costs.ring_allreduce_seconds(workload.total_bytes, n_nodes,
                                         network)
    graph = _TypicalGraph(sim, workload, hardware, caps, n_devices, n_nodes,
                          net_s)
    if hardware.kind == 'cpu':
        compute_s = graph.add_cpu_iterations(iterations)
    else:
        compute_s = graph.add_gpu_iterations(iterations)
    sim.run()
    return iteration_result(sim.tasks, iterations, compute_s)


class _TypicalGraph(object):
    """Builds ``ParallelUpdater``'s task graph, iteration by iteration.

    Args:
        sim (Simulation): Where the tasks go.
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine.
        caps (dict): The machine's shared resources (for the copies' rates).
        n_devices (int): Replicas (per node).
        n_nodes (int): Nodes (an all-reduce before the update above 1).
        net_s (float): Seconds of the whole model's all-reduce across the
            nodes.
    """

    def __init__(self, sim, workload, hardware, caps, n_devices, n_nodes,
                 net_s):
        self.sim = sim
        self.workload = workload
        self.hardware = hardware
        self.caps = caps
        self.n_devices = n_devices
        self.n_nodes = n_nodes
        self.net_s = net_s
        self.n_bytes = workload.total_bytes
        self.arrays = workload.total_arrays

    def add_cpu_iterations(self, iterations):
        """CPU replicas: one Python thread drives every replica, forwards,
        then backwards, then addgrads, update and copyparams, one after
        another; BLAS has every core (ParallelUpdater sets no limit).

        Args:
            iterations (int): Iterations to add.

        Returns:
            float: One replica's forward + backward seconds.
        """
        workload, hardware, sim = self.workload, self.hardware, self.sim
        n_devices, arrays, n_bytes = self.n_devices, self.arrays, self.n_bytes
        forward, backward, demands = costs.cpu_compute(
            workload, hardware, hardware.cores, sim.caps)
        f_s, b_s = costs.whole_model_times(workload, hardware, forward,
                                           backward)
        ops = workload.host_ops
        addgrads_s = costs.op_cost(ops, 'addgrads', arrays, n_bytes) \
            if n_devices > 1 else None
        update_s = costs.host_update_seconds(workload, hardware, arrays,
                                             n_bytes)
        copyparams_s = costs.op_cost(ops, 'copyparams', arrays, n_bytes) \
            if n_devices > 1 else None
        last = None
        for it in range(iterations):
            for i in range(n_devices):
                last = sim.add('forward', i, None, it, f_s, [last],
                               demands=demands)
            for i in range(n_devices):
                last = sim.add('backward', i, None, it, b_s, [last],
                               demands=demands)
            for i in range(1, n_devices):
                last = sim.add('addgrads', i, None, it, addgrads_s, [last],
                               demands={'cores': 1.0})
            if self.n_nodes > 1:
                last = sim.add('allreduce', 'network', None, it, self.net_s,
                               [last], exclusive='network')
            last = sim.add('update', 0, None, it, update_s, [last],
                           demands={'cores': 1.0})
            for i in range(1, n_devices):
                last = sim.add('copyparams', i, None, it, copyparams_s,
                               [last], demands={'cores': 1.0})
        return f_s + b_s

    def add_gpu_iterations(self, iterations):
        """GPUs: one Python thread issues every replica's kernels (their
        host-side time shares one interpreter); device 0 gathers and adds
        the gradients, updates and broadcasts the weights.

        Args:
            iterations (int): Iterations to add.

        Returns:
            float: One replica's forward + backward seconds.
        """
        workload, hardware = self.workload, self.hardware
        f_s, b_s = costs.whole_model_times(workload, hardware,
                                           workload.forward_s,
                                           workload.backward_s)
        demands = whole_model_gil_demands(workload, hardware, f_s, b_s)
        add_s = costs.device_op_seconds(workload, hardware, 'add',
                                        self.arrays, self.n_bytes)
        update_s = costs.device_op_seconds(workload, hardware, 'update',
                                           self.arrays, self.n_bytes)
        # What each replica's next forward waits for.
        ready = [None] * self.n_devices
        for it in range(iterations):
            backward = self._add_gpu_compute(it, ready, f_s, b_s, demands)
            summed = self._add_gather_and_add(it, backward, add_s)
            self._add_update_and_broadcast(it, summed, update_s, ready)
        return f_s + b_s

    def _add_gpu_compute(self, it, ready, f_s, b_s, demands):
        """Each replica's forward and backward; returns the backwards."""
        backward = []
        for i in range(self.n_devices):
            fwd = self.sim.add('forward', i, None, it, f_s, [ready[i]],
                               demands=demands[0])
            backward.append(self.sim.add('backward', i, None, it, b_s,
                                         [fwd], demands=demands[1]))
        return backward

    def _add_gather_and_add(self, it, backward, add_s):
        """Each other replica's gradients copied to device 0 and added
        there, one after another; across nodes, then all-reduced. Returns
        the task after which device 0 holds the sum."""
        previous_add = backward[0]
        previous_copy = None
        for j in range(1, self.n_devices):
            copy = add_transfer(
                self.sim, self.hardware, self.caps, 'gather', j, None, it,
                topology.peer_path(self.hardware, j, 0), self.n_bytes,
                self.arrays, [backward[j], previous_add, previous_copy],
                None)
            previous_copy = copy
            previous_add = self.sim.add('add', 0, None, it, add_s,
                                        [copy, previous_add])
        if self.n_nodes > 1:
            # The node's sum, all-reduced across the nodes; then every
            # device of every node holds the global sum (the update on
            # device 0 and the broadcast of the weights take as long as a
            # broadcast of the sum and an update on every device).
            previous_add = self.sim.add('allreduce', 'network', None, it,
                                        self.net_s, [previous_add],
                                        exclusive='network')
        return previous_add

    def _add_update_and_broadcast(self, it, summed, update_s, ready):
        """Device 0's update and the weights' copies to each other replica,
        one after another; sets what each replica's next forward waits
        for in ``ready``."""
        update = self.sim.add('update', 0, None, it, update_s, [summed])
        ready[0] = update
        previous = update
        for j in range(1, self.n_devices):
            previous = add_transfer(
                self.sim, self.hardware, self.caps, 'broadcast', j, None, it,
                topology.peer_path(self.hardware, 0, j), self.n_bytes,
                self.arrays, [previous], None)
            ready[j] = previous


def simulate_cgdp(workload, hardware, n_devices, chunk_size, iterations=2,
                  n_nodes=1, network=None, workers='process'):
    """Simulates CGDP iterations with the chunk pipeline.

    With ``n_nodes > 1`` (multi-node CGDP, one rank per node) a chunk's host
    work is two jobs: the local reduce (and packing), then, after the
    chunk's ring all-reduce across the nodes on the node's ``network``
    resource (one all-reduce at a time, in chunk order, as the runtime's
    communication thread sends them by sequence number), the update. The
    host threads are free for other chunks during the all-reduce. Nodes are
    alike, so one node is simulated; the all-reduce's time
    (:func:`costs.ring_allreduce_seconds`) accounts for the others.

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine (one node).
        n_devices (int): Replicas (per node).
        chunk_size (int): Stages per chunk (grouped from the output end).
        iterations (int): Iterations to simulate (>= 1).
        n_nodes (int): Nodes; 1 is the single-node model, unchanged.
        network (str, Network or None): See :func:`inputs.resolve_network`.
        workers (str): ``'process'`` (one process per replica: their
            host-side time runs in parallel; CPU replicas copy their
            gradients into shared slots and read the master's weights
            there) or ``'thread'`` (threads
            of one process: their host-side time shares one interpreter
            lock with each other and the host threads; CPU replicas hand
            gradients over by reference).

    Returns:
        SimulationResult: The timing.
    """
    inputs.check_common(workload, hardware, n_devices)
    inputs.check_chunk_size(chunk_size, workload.n_layers)
    inputs.check_workers(workers)
    network = inputs.resolve_network(network, n_nodes)
    multinode = n_nodes > 1
    chunks = inputs.plan_chunks(workload.param_bytes, chunk_size)
    n_chunks = len(chunks)
    caps = topology.capacities(hardware, n_devices)
    servers = {'host': hardware.host_servers}
    cpu = hardware.kind == 'cpu'
    zero_copy = cpu and workers == 'thread'
    if cpu:
        threads = costs.cpu_threads_per_replica(hardware, n_devices)
        forward, backward, compute_demands = costs.cpu_compute(
            workload, hardware, threads, caps)
        host_demands = {'cores': float(costs.threads_per_server(hardware))}
    else:
        forward, backward = workload.forward_s, workload.backward_s
        compute_demands = None
        host_demands = {'host_mem[0]': costs.host_rate(hardware)}
    chunk_forward, chunk_backward = costs.chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    chunk_bytes = [sum(workload.param_bytes[a:b]) for a, b in chunks]
    chunk_arrays = [sum(workload.param_arrays[a:b]) for a, b in chunks]
    host_s = [costs.host_job_seconds(workload, hardware, n_devices,
                                     chunk_arrays[c], chunk_bytes[c])
              for c in range(n_chunks)]
    if multinode:
        parts = [costs.host_job_parts(workload, hardware, n_devices,
                                      chunk_arrays[c], chunk_bytes[c])
                 for c in range(n_chunks)]
        reduce_s = [p[0] for p in parts]
        update_s = [p[1] for p in parts]
        net_s = [costs.ring_allreduce_seconds(chunk_bytes[c], n_nodes, network)
                 for c in range(n_chunks)]
    forward_demands = [compute_demands] * n_chunks
    backward_demands = [compute_demands] * n_chunks
    host_job_demands = [host_demands] * n_chunks
    reduce_demands = update_demands = host_job_demands
    if cpu:
        # CPU replicas, their gradients and the host threads all stream
        # through the same memory: each task uses the bandwidth its own
        # traffic needs at full speed (see costs.cpu_memory_demand).
        forward_demands = [costs.cpu_memory_demand(
            hardware, compute_demands, costs.FORWARD_TRAFFIC * chunk_bytes[c],
            chunk_forward[c]) for c in range(n_chunks)]
        backward_demands = [costs.cpu_memory_demand(
            hardware, compute_demands, costs.BACKWARD_TRAFFIC * chunk_bytes[c],
            chunk_backward[c]) for c in range(n_chunks)]
        host_job_demands = [costs.cpu_memory_demand(
            hardware, host_demands,
            costs.host_traffic_bytes(n_devices, chunk_bytes[c],
                                     workload.optimizer), host_s[c])
                            for c in range(n_chunks)]
        if multinode:
            traffic = [costs.host_traffic_parts(n_devices, chunk_bytes[c],
                                                workload.optimizer)
                       for c in range(n_chunks)]
            reduce_demands = [costs.cpu_memory_demand(
                hardware, host_demands, traffic[c][0], reduce_s[c])
                              for c in range(n_chunks)]
            update_demands = [costs.cpu_memory_demand(
                hardware, host_demands, traffic[c][1], update_s[c])
                              for c in range(n_chunks)]
    # Python holds an interpreter lock: thread workers share the user's
    # process's with each other and with the host threads; process workers
    # have one each, and the host threads share the user's process's (see
    # inputs.layer_gil_seconds, inputs.launch_seconds).
    gil = costs.chunk_gil_times(workload, hardware, chunks)
    if gil is not None and workers == 'thread':
        forward_demands = [costs.gil_demand(forward_demands[c], gil[0][c],
                                            chunk_forward[c])
                           for c in range(n_chunks)]
        backward_demands = [costs.gil_demand(backward_demands[c],
                                             gil[1][c], chunk_backward[c])
                            for c in range(n_chunks)]
    host_job_demands = [costs.gil_demand(host_job_demands[c],
                                         costs.host_job_gil_seconds(
                                             workload, hardware, n_devices,
                                             chunk_arrays[c]), host_s[c])
                        for c in range(n_chunks)]
    if multinode:
        reduce_demands = [costs.gil_demand(reduce_demands[c],
                                           costs.host_job_gil_seconds(
                                               workload, hardware, n_devices,
                                               chunk_arrays[c], 'reduce'),
                                           reduce_s[c])
                          for c in range(n_chunks)]
        update_demands = [costs.gil_demand(update_demands[c],
                                           costs.host_job_gil_seconds(
                                               workload, hardware, n_devices,
                                               chunk_arrays[c], 'update'),
                                           update_s[c])
                          for c in range(n_chunks)]
    sim = engine.Simulation(caps, servers)
    params_ready = [[None] * n_chunks for _ in range(n_devices)]
    last_backward = [None] * n_devices
    for it in range(iterations):
        delivered = [[] for _ in range(n_chunks)]
        for i in range(n_devices):
            previous = last_backward[i]
            for c in range(n_chunks):
                previous = sim.add('forward', i, c, it, chunk_forward[c],
                                   [previous, params_ready[i][c]],
                                   demands=forward_demands[c])
            for c in range(n_chunks - 1, -1, -1):
                previous = sim.add('backward', i, c, it, chunk_backward[c],
                                   [previous], demands=backward_demands[c])
                if zero_copy:
                    # Zero-copy hand-over: the host reads the replica's
                    # gradient arrays where they are.
                    delivered[c].append(previous)
                elif cpu:
                    # A worker process copies the chunk's gradients into
                    # its shared slots itself, on its core, before its next
                    # backward.
                    previous = add_transfer(
                        sim, hardware, caps, 'd2h', i, c, it,
                        topology.host_path(hardware, i, 'd2h'),
                        chunk_bytes[c], chunk_arrays[c], [previous],
                        'copy_out[{}]'.format(i), {'cores': 1.0})
                    delivered[c].append(previous)
                else:
                    delivered[c].append(add_transfer(
                        sim, hardware, caps, 'd2h', i, c, it,
                        topology.host_path(hardware, i, 'd2h'), chunk_bytes[c],
                        chunk_arrays[c], [previous],
                        'copy_out[{}]'.format(i)))
            last_backward[i] = previous
        previous_net = None
        for c in range(n_chunks - 1, -1, -1):
            if multinode:
                # Created in this order (reduce, all-reduce, update per
                # chunk) so that an update ready at the same moment as a
                # later chunk's reduce goes first, as cgdp_closed_form has it.
                reduced = sim.add('reduce', 'host', c, it, reduce_s[c],
                                  delivered[c], exclusive='host',
                                  demands=reduce_demands[c])
                previous_net = sim.add('allreduce', 'network', c, it,
                                       net_s[c], [reduced, previous_net],
                                       exclusive='network')
                host = sim.add('update', 'host', c, it, update_s[c],
                               [previous_net], exclusive='host',
                               demands=update_demands[c])
            else:
                host = sim.add('reduce_update', 'host', c, it, host_s[c],
                               delivered[c], exclusive='host',
                               demands=host_job_demands[c])
            for i in range(n_devices):
                if cpu:
                    # Threads read the master's arrays; worker processes
                    # read them in shared memory: no copy back.
                    params_ready[i][c] = host
                else:
                    params_ready[i][c] = add_transfer(
                        sim, hardware, caps, 'h2d', i, c, it,
                        topology.host_path(hardware, i, 'h2d'), chunk_bytes[c],
                        chunk_arrays[c], [host], 'copy_in[{}]'.format(i))
    sim.run()
    return iteration_result(sim.tasks, iterations,
                            sum(chunk_forward) + sum(chunk_backward))


def simulate_chainermn(workload, hardware, n_devices, n_nodes, network=None,
                       iterations=2):
    """Simulates the ChainerMN baseline on ``n_nodes`` nodes of
    ``n_devices`` devices each.

    After the whole backward, the gradients are all-reduced hierarchically:
    summed within the node over the device links (as
    :func:`simulate_typical` sums them on device 0), all-reduced across the
    nodes by a ring on the network (:func:`costs.ring_allreduce_seconds` of the
    whole model), and spread within the node again; then every device
    updates its copy. With one node this is :func:`simulate_typical`
    exactly.

    Returns:
        SimulationResult: The timing.
    """
    return simulate_typical(workload, hardware, n_devices, iterations,
                            n_nodes=n_nodes, network=network)
