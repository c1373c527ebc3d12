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
                 n_bytes, latency, deps, exclusive, extra_demands=None):
    """Adds a copy of ``n_bytes`` over ``path`` after a fixed ``latency``
    (its calls' ``copy_latency_s``: ``ParallelUpdater`` copies per array,
    CGDP once per chunk, see :func:`costs.per_array_copy_latency_seconds`
    and :func:`costs.cgdp_copy_latency_seconds`); ``extra_demands`` are other
    shared resources it uses (a CPU copy's core).
    """
    rate = topology.standalone_rate(hardware, caps, path)
    demands = {resource: rate * use for resource, use in path.items()}
    demands.update(extra_demands or {})
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
        self.latency = costs.per_array_copy_latency_seconds(
            hardware, self.arrays, self.n_bytes)

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
                self.latency, [backward[j], previous_add, previous_copy],
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
                self.latency, [previous], None)
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
    caps = topology.capacities(hardware, n_devices)
    # Before the simulation copies caps: a CPU replica's compute may raise
    # the cores' capacity (see costs.cpu_compute).
    chunk_costs = _CgdpCosts(workload, hardware, n_devices, chunk_size,
                             n_nodes, network, workers, caps)
    sim = engine.Simulation(caps, {'host': hardware.host_servers})
    graph = _CgdpGraph(sim, hardware, caps, n_devices, chunk_costs,
                       zero_copy=chunk_costs.cpu and workers == 'thread')
    for it in range(iterations):
        graph.add_iteration(it)
    sim.run()
    return iteration_result(sim.tasks, iterations,
                            sum(chunk_costs.forward_s)
                            + sum(chunk_costs.backward_s))


class _CgdpCosts(object):
    """Per-chunk seconds and shared-resource demands of CGDP's tasks.

    Args:
        workload (Workload): Per-layer costs.
        hardware (Hardware): The machine (one node).
        n_devices (int): Replicas (per node).
        chunk_size (int): Stages per chunk.
        n_nodes (int): Nodes (the host job is a reduce and an update
            around the all-reduce above 1).
        network (Network or None): The network between the nodes.
        workers (str): ``'process'`` or ``'thread'``.
        caps (dict): The node's shared resources; a CPU replica's compute
            may raise the cores' capacity (see :func:`costs.cpu_compute`).

    Attributes:
        chunks (list of tuple): Layer ranges, input side first.
        n_chunks (int): Their number.
        cpu (bool): CPU replicas.
        multinode (bool): More than one node.
        forward_s, backward_s, host_s (list of float): Per chunk (on GPUs
            the backward includes its gradients' gather, see
            :func:`costs.cgdp_chunk_times`).
        copy_latency_s (list of float): The fixed cost of each direction
            of a chunk's hand-over (one copy per chunk).
        reduce_s, update_s, net_s (list of float or None): Multi-node:
            the host job's two parts and the chunk's all-reduce.
        chunk_bytes, chunk_arrays (list of int): Per chunk.
        forward_demands, backward_demands, host_demands, reduce_demands,
            update_demands (list of dict or None): Per chunk.
    """

    def __init__(self, workload, hardware, n_devices, chunk_size, n_nodes,
                 network, workers, caps):
        self.workload = workload
        self.hardware = hardware
        self.n_devices = n_devices
        self.cpu = hardware.kind == 'cpu'
        self.multinode = n_nodes > 1
        self.chunks = inputs.plan_chunks(workload.param_bytes, chunk_size)
        self.n_chunks = len(self.chunks)
        compute_demands, host_demands = self._compute_times(caps)
        self._host_times(n_nodes, network)
        self.forward_demands = [compute_demands] * self.n_chunks
        self.backward_demands = [compute_demands] * self.n_chunks
        self.host_demands = [host_demands] * self.n_chunks
        self.reduce_demands = self.update_demands = self.host_demands
        if self.cpu:
            self._add_memory_demands(compute_demands, host_demands)
        self._add_gil_demands(workers)

    def _compute_times(self, caps):
        """Sets each chunk's forward and backward seconds, bytes and
        arrays; returns the compute's and the host jobs' demands."""
        workload, hardware = self.workload, self.hardware
        if self.cpu:
            threads = costs.cpu_threads_per_replica(hardware, self.n_devices)
            forward, backward, compute_demands = costs.cpu_compute(
                workload, hardware, threads, caps)
            host_demands = {
                'cores': float(costs.threads_per_server(hardware))}
        else:
            forward, backward = workload.forward_s, workload.backward_s
            compute_demands = None
            host_demands = {'host_mem[0]': costs.host_rate(hardware)}
        self.forward_s, self.backward_s = costs.cgdp_chunk_times(
            workload, hardware, forward, backward, self.chunks)
        self.chunk_bytes = [sum(workload.param_bytes[a:b])
                            for a, b in self.chunks]
        self.chunk_arrays = [sum(workload.param_arrays[a:b])
                             for a, b in self.chunks]
        self.copy_latency_s = [costs.cgdp_copy_latency_seconds(
            hardware, arrays, n_bytes) for arrays, n_bytes in zip(
                self.chunk_arrays, self.chunk_bytes)]
        return compute_demands, host_demands

    def _host_times(self, n_nodes, network):
        """Sets the host job's seconds per chunk, and across nodes its two
        parts and the chunk's all-reduce."""
        workload, hardware, n = self.workload, self.hardware, self.n_devices
        chunks = range(self.n_chunks)
        self.host_s = [costs.host_job_seconds(workload, hardware, n,
                                              self.chunk_arrays[c],
                                              self.chunk_bytes[c])
                       for c in chunks]
        self.reduce_s = self.update_s = self.net_s = None
        if self.multinode:
            parts = [costs.host_job_parts(workload, hardware, n,
                                          self.chunk_arrays[c],
                                          self.chunk_bytes[c])
                     for c in chunks]
            self.reduce_s = [p[0] for p in parts]
            self.update_s = [p[1] for p in parts]
            self.net_s = [costs.ring_allreduce_seconds(self.chunk_bytes[c],
                                                       n_nodes, network)
                          for c in chunks]

    def _add_memory_demands(self, compute_demands, host_demands):
        """CPU replicas, their gradients and the host threads all stream
        through the same memory: each task uses the bandwidth its own
        traffic needs at full speed (see costs.cpu_memory_demand)."""
        hardware, chunk_bytes = self.hardware, self.chunk_bytes
        chunks = range(self.n_chunks)
        self.forward_demands = [costs.cpu_memory_demand(
            hardware, compute_demands, costs.FORWARD_TRAFFIC * chunk_bytes[c],
            self.forward_s[c]) for c in chunks]
        self.backward_demands = [costs.cpu_memory_demand(
            hardware, compute_demands, costs.BACKWARD_TRAFFIC * chunk_bytes[c],
            self.backward_s[c]) for c in chunks]
        self.host_demands = [costs.cpu_memory_demand(
            hardware, host_demands,
            costs.host_traffic_bytes(self.n_devices, chunk_bytes[c],
                                     self.workload.optimizer), self.host_s[c])
                             for c in chunks]
        if self.multinode:
            traffic = [costs.host_traffic_parts(self.n_devices,
                                                chunk_bytes[c],
                                                self.workload.optimizer)
                       for c in chunks]
            self.reduce_demands = [costs.cpu_memory_demand(
                hardware, host_demands, traffic[c][0], self.reduce_s[c])
                                   for c in chunks]
            self.update_demands = [costs.cpu_memory_demand(
                hardware, host_demands, traffic[c][1], self.update_s[c])
                                   for c in chunks]

    def _add_gil_demands(self, workers):
        """Python holds an interpreter lock: thread workers share the
        user's process's with each other and with the host threads; process
        workers have one each, and the host threads share the user's
        process's (see inputs.layer_gil_seconds, inputs.launch_seconds)."""
        workload, hardware, n = self.workload, self.hardware, self.n_devices
        chunks = range(self.n_chunks)
        gil = costs.chunk_gil_times(workload, hardware, self.chunks)
        if gil is not None and workers == 'thread':
            self.forward_demands = [costs.gil_demand(
                self.forward_demands[c], gil[0][c], self.forward_s[c])
                                    for c in chunks]
            self.backward_demands = [costs.gil_demand(
                self.backward_demands[c], gil[1][c], self.backward_s[c])
                                     for c in chunks]
        self.host_demands = [costs.gil_demand(
            self.host_demands[c], costs.host_job_gil_seconds(
                workload, hardware, n, self.chunk_arrays[c]), self.host_s[c])
                             for c in chunks]
        if self.multinode:
            self.reduce_demands = [costs.gil_demand(
                self.reduce_demands[c], costs.host_job_gil_seconds(
                    workload, hardware, n, self.chunk_arrays[c], 'reduce'),
                self.reduce_s[c]) for c in chunks]
            self.update_demands = [costs.gil_demand(
                self.update_demands[c], costs.host_job_gil_seconds(
                    workload, hardware, n, self.chunk_arrays[c], 'update'),
                self.update_s[c]) for c in chunks]


class _CgdpGraph(object):
    """Builds CGDP's task graph, iteration by iteration: each replica's
    chunked forward and backward with its gradients' hand-over, then each
    chunk's host job(s) and the weights' way back.

    Args:
        sim (Simulation): Where the tasks go.
        hardware (Hardware): The machine (one node).
        caps (dict): The node's shared resources (for the copies' rates).
        n_devices (int): Replicas (per node).
        chunk_costs (_CgdpCosts): The tasks' seconds and demands.
        zero_copy (bool): CPU thread workers: the host reads the gradients
            where they are.
    """

    def __init__(self, sim, hardware, caps, n_devices, chunk_costs,
                 zero_copy):
        self.sim = sim
        self.hardware = hardware
        self.caps = caps
        self.n_devices = n_devices
        self.costs = chunk_costs
        self.zero_copy = zero_copy
        n_chunks = chunk_costs.n_chunks
        # What each replica's forward of each chunk waits for.
        self.params_ready = [[None] * n_chunks for _ in range(n_devices)]
        # Each replica's last backward task (or its copy after it).
        self.last_backward = [None] * n_devices

    def add_iteration(self, it):
        """Adds iteration ``it``'s tasks."""
        delivered = [[] for _ in range(self.costs.n_chunks)]
        for i in range(self.n_devices):
            self._add_replica(it, i, delivered)
        self._add_host_jobs(it, delivered)

    def _add_replica(self, it, i, delivered):
        """Replica ``i``'s forward and backward, chunk by chunk, each
        chunk's gradients handed to the host (appended to
        ``delivered[chunk]``)."""
        sim, chunk_costs = self.sim, self.costs
        previous = self.last_backward[i]
        for c in range(chunk_costs.n_chunks):
            previous = sim.add('forward', i, c, it, chunk_costs.forward_s[c],
                               [previous, self.params_ready[i][c]],
                               demands=chunk_costs.forward_demands[c])
        for c in range(chunk_costs.n_chunks - 1, -1, -1):
            previous = sim.add('backward', i, c, it,
                               chunk_costs.backward_s[c], [previous],
                               demands=chunk_costs.backward_demands[c])
            previous = self._hand_over(it, i, c, previous, delivered[c])
        self.last_backward[i] = previous

    def _hand_over(self, it, i, c, backward, delivered):
        """Hands chunk ``c``'s gradients of replica ``i`` to the host;
        returns what the replica's next backward waits for."""
        if self.zero_copy:
            # Zero-copy hand-over: the host reads the replica's gradient
            # arrays where they are.
            delivered.append(backward)
            return backward
        path = topology.host_path(self.hardware, i, 'd2h')
        n_bytes = self.costs.chunk_bytes[c]
        latency = self.costs.copy_latency_s[c]
        if self.costs.cpu:
            # A worker process copies the chunk's gradients into its shared
            # flat slot itself, on its core, before its next backward.
            copy = add_transfer(self.sim, self.hardware, self.caps, 'd2h', i,
                                c, it, path, n_bytes, latency, [backward],
                                'copy_out[{}]'.format(i), {'cores': 1.0})
            delivered.append(copy)
            return copy
        delivered.append(add_transfer(
            self.sim, self.hardware, self.caps, 'd2h', i, c, it, path,
            n_bytes, latency, [backward], 'copy_out[{}]'.format(i)))
        return backward

    def _add_host_jobs(self, it, delivered):
        """Each chunk's host job(s), output end first, and the weights'
        way back to each replica."""
        sim, chunk_costs = self.sim, self.costs
        previous_net = None
        for c in range(chunk_costs.n_chunks - 1, -1, -1):
            if chunk_costs.multinode:
                # Created in this order (reduce, all-reduce, update per
                # chunk) so that an update ready at the same moment as a
                # later chunk's reduce goes first, as cgdp_closed_form has it.
                reduced = sim.add('reduce', 'host', c, it,
                                  chunk_costs.reduce_s[c], delivered[c],
                                  exclusive='host',
                                  demands=chunk_costs.reduce_demands[c])
                previous_net = sim.add('allreduce', 'network', c, it,
                                       chunk_costs.net_s[c],
                                       [reduced, previous_net],
                                       exclusive='network')
                host = sim.add('update', 'host', c, it,
                               chunk_costs.update_s[c], [previous_net],
                               exclusive='host',
                               demands=chunk_costs.update_demands[c])
            else:
                host = sim.add('reduce_update', 'host', c, it,
                               chunk_costs.host_s[c], delivered[c],
                               exclusive='host',
                               demands=chunk_costs.host_demands[c])
            self._add_weights_back(it, c, host)

    def _add_weights_back(self, it, c, host):
        """What each replica's next forward of chunk ``c`` waits for: the
        host job itself on CPUs (threads read the master's arrays; worker
        processes read them in shared memory: no copy back), else the
        copy of the chunk's weights to the device."""
        for i in range(self.n_devices):
            if self.costs.cpu:
                self.params_ready[i][c] = host
            else:
                self.params_ready[i][c] = add_transfer(
                    self.sim, self.hardware, self.caps, 'h2d', i, c, it,
                    topology.host_path(self.hardware, i, 'h2d'),
                    self.costs.chunk_bytes[c], self.costs.copy_latency_s[c],
                    [host], 'copy_in[{}]'.format(i))


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
