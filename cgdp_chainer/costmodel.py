"""Iteration time of typical data parallel training and of CGDP, predicted.

Two training schemes are modelled on ``N`` devices with a fixed batch per
device (weak scaling):

* **typical**: what Chainer's ``ParallelUpdater`` does. Every replica runs
  its forward and backward; then, one replica at a time, its gradients are
  copied to device 0 (over a direct device-to-device link where the hardware
  has one, else staged through the host) and added there; device 0 updates;
  then, one replica at a time, the new parameters are copied back. On CPU
  replicas (``'@numpy'``) the updater drives every replica from one thread, so
  their forwards and backwards run one after another.
* **CGDP**: the backward runs chunk by chunk (a chunk = ``chunk_size``
  consecutive stages, grouped from the output end); when a chunk is done on a
  device its gradients are copied to the host (d2h) on the device's copy
  engine; once all devices have delivered it, a host thread sums and updates
  it; the new weights are copied back (h2d); a chunk's next forward waits for
  its own copy. Only the last (input-side) chunk's sync is exposed.

Across ``R`` nodes of ``N`` devices each (one process per node, nodes joined
by a :class:`~cgdp_chainer.hardware.Network`):

* **ChainerMN** (the baseline, :func:`simulate_chainermn`): the typical
  scheme's backward and local sum, then a ring all-reduce of all gradients
  across the nodes on the network, then the update and broadcast within the
  node (a hierarchical all-reduce);
* **multi-node CGDP** (``simulate_cgdp(..., n_nodes=R)``): per chunk, d2h,
  the local reduce on the host, a ring all-reduce of the chunk across the
  nodes on the node's network port (one at a time, in chunk order, while
  the backward of the chunks nearer the input still runs), the update on
  the host, h2d.

With ``R = 1`` both are exactly the single-node models; a ring all-reduce of
``n`` bytes takes ``2 (R - 1) / R x n / bandwidth + 2 (R - 1) x latency``
(:func:`ring_allreduce_seconds`). :func:`predict_multinode` gives both at
one point.

Each is computed twice:

* as a **closed form** (:func:`typical_closed_form`,
  :func:`cgdp_closed_form`): sums of phases, and for CGDP the max-plus
  recurrence of a four-stage flow line (backward, d2h, host, h2d), which for a
  single host thread equals the critical-path formula
  ``F + max over a<=b<=c<=d of (sum_{k<=a} bwd_k + sum_{a<=k<=b} d2h_k +
  sum_{b<=k<=c} host_k + sum_{c<=k<=d} h2d_k)`` (chunks in backward order);
  transfers that run at the same time share links at a fixed fair share;
* as a **discrete-event simulation** (:func:`simulate_typical`,
  :func:`simulate_cgdp`) of the tasks on resources: each device's compute,
  its copy engines (one each way, first come first served), the links (shared
  where the hardware shares them: a socket's memory, the inter-socket link,
  a switch uplink, a device's peer port), the host threads (a pool whose jobs
  compete for the socket's memory bandwidth) and, for CPU replicas, the cores
  that replicas, host threads and copies all share, and Python's global
  interpreter lock (GIL), which the replica threads and host threads of the
  one process hold for the Python part of their work (a stage's time
  outside BLAS, :func:`stage_gil_seconds`; a host operation's cost per
  array). Shared resources are
  divided by max-min fairness (fluid model); exclusive ones serve in order of
  arrival.

The inputs are a *profile* (per-stage forward and backward seconds measured
by ``experiments.profile``, or per-stage FLOPs from :mod:`cgdp_chainer.flops`;
per-stage parameter bytes and array counts), ``N``, the batch per device and a
:class:`~cgdp_chainer.hardware.Hardware`.

What the model leaves out is listed in :data:`LEFT_OUT`.
"""
import collections
import dataclasses
import heapq
import json
import math

from cgdp_chainer import chunking
from cgdp_chainer import hardware as hardware_module

LEFT_OUT = (
    'the cost of handing the GIL from one thread to another: the model '
    'gives each replica thread the GIL for its stages\' time outside BLAS '
    'and shares it fairly, but each hand-over also wakes the waiting '
    'thread (on the 2-core machine two threads of a tiny all-Python model '
    'took 2.5 to 5.5 times one alone, not 2); the time outside BLAS also '
    'counts NumPy loops that release the GIL; GPU replicas\' Python is not '
    'modelled (ParallelUpdater issues every GPU\'s kernels from one '
    'thread);',
    'data loading and batch conversion (0.2 ms per iteration for the '
    'experiment\'s in-memory examples at batch 4 and 64 px; decoding real '
    'images would not be negligible);',
    'CPU replicas: a replica is slowed evenly when it gets less than the '
    'cores it keeps busy (measured, with BLAS\'s spinning idle threads), '
    'though only its BLAS calls, which run at the pace of their slowest '
    'thread, slow down, and those more than evenly; more threads than '
    'cores cost more than their share (four one-thread replica processes '
    'on 2 cores took 2.2 times one alone, not 2); memory traffic of '
    'activations (only parameter traffic is shared), page-fault and '
    'allocator contention between replica threads, cache effects; other '
    'processes\' load, and the speed of a virtual machine\'s cores, are '
    'taken as constant at what the profile measured (effective cores): on '
    'the 2-core VM the median ResNet-152 iteration of one replica '
    '(StandardUpdater, batch 4, 64 px) was 0.61 s in one run and 0.83 s in '
    'another 15 minutes later;',
    'GPUs: device-memory contention between compute and copies;',
    'compute time scaled linearly with the batch (small batches fill a GPU '
    'less well than the FLOP count says; on CPUs, the Python part of a '
    'stage does not grow with the batch);',
    'GPU presets: layers other than convolution and linear are covered only '
    'by the efficiency factor;',
    'device counts beyond a preset\'s physical devices extrapolate with more '
    'sockets of the same shape;',
    'the closed forms leave out host-memory sharing between copies, host '
    'threads and CPU replicas, and the host threads\' GIL (the simulation '
    'includes them);',
    'multi-node: nodes are alike and the switch does not block (one node is '
    'modelled); the all-reduce is a ring at the port\'s data rate (no '
    'protocol loss, no tree or in-network reduction), without a per-call '
    'software cost (mpi4py, the communication thread\'s polling), without '
    'the host-memory traffic of MPI\'s own sums, and without sharing the '
    'PCIe/NVLink host links with the NIC; CGDP\'s host threads are free '
    'during a chunk\'s all-reduce (the runtime\'s pool thread waits for it, '
    'which matters only when all pool threads wait); the ChainerMN '
    'baseline\'s local sum and spread are the typical scheme\'s copies to '
    'and from device 0 (NCCL\'s ring within a node is faster with more than '
    'two devices).',
)

TYPICAL = 'typical'
CGDP = 'cgdp'

# Relative tolerance of the fluid simulation's level comparisons.
_EPS = 1e-12


# ----------------------------------------------------------------- input

def check_n_devices(n_devices):
    """Checks a device count.

    Raises:
        ValueError: ``n_devices`` is not an integer >= 1.
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) \
            or n_devices < 1:
        raise ValueError('n_devices must be an integer >= 1 (N = 1, 2, 4, '
                         '...), got {!r}'.format(n_devices))


def check_n_nodes(n_nodes):
    """Checks a node count.

    Raises:
        ValueError: ``n_nodes`` is not an integer >= 1.
    """
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) \
            or n_nodes < 1:
        raise ValueError('n_nodes must be an integer >= 1 (R = 1, 2, 4, '
                         '...), got {!r}'.format(n_nodes))


def resolve_network(network, n_nodes):
    """The network of a multi-node prediction, checked.

    Args:
        network (str, Network or None): A preset name (``'ib-edr'``,
            ``'ib-hdr'``) or a :class:`~cgdp_chainer.hardware.Network`;
            ``None`` means :data:`cgdp_chainer.hardware.DEFAULT_NETWORK`.
        n_nodes (int): Nodes (checked too).

    Returns:
        Network: The network (also for one node, where it is not used).

    Raises:
        ValueError: ``n_nodes`` is not an integer >= 1, the name is unknown
            or the network has an impossible bandwidth or latency.
    """
    check_n_nodes(n_nodes)
    if network is None:
        network = hardware_module.DEFAULT_NETWORK
    return hardware_module.get_network(network)


def check_batch(batch):
    """Checks a batch size per device.

    Raises:
        ValueError: ``batch`` is not an integer >= 1.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError('batch per device must be an integer >= 1, got '
                         '{!r}'.format(batch))


def check_chunk_size(chunk_size, n_stages):
    """Checks a chunk size against the number of stages.

    Raises:
        ValueError: ``chunk_size`` is not an integer in ``1..n_stages``.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or \
            not 1 <= chunk_size <= n_stages:
        raise ValueError('chunk_size must be an integer from 1 to {} (the '
                         'number of stages), got {!r}'.format(
                             n_stages, chunk_size))


def load_profile(path):
    """Reads a profile JSON written by ``experiments.profile``."""
    with open(path) as f:
        return json.load(f)


def check_profile(profile):
    """Checks that a profile has what the model needs.

    Args:
        profile (dict): With a non-empty ``stages`` list; each stage has
            ``param_bytes`` and either measured ``forward_s`` and
            ``backward_s`` or ``forward_flops`` and ``backward_flops`` (per
            image).

    Raises:
        ValueError: A field is missing or negative.
    """
    if not isinstance(profile, dict) or not profile.get('stages'):
        raise ValueError('a profile is a dict with a non-empty "stages" list '
                         '(see experiments.profile or '
                         'costmodel.flops_profile)')
    for index, stage in enumerate(profile['stages']):
        has_times = 'forward_s' in stage and 'backward_s' in stage
        has_flops = 'forward_flops' in stage and 'backward_flops' in stage
        if not (has_times or has_flops):
            raise ValueError('stage {} of the profile has neither forward_s/'
                             'backward_s nor forward_flops/backward_flops'
                             .format(index))
        if 'param_bytes' not in stage:
            raise ValueError('stage {} of the profile lacks param_bytes'
                             .format(index))
        for key in ('forward_s', 'backward_s', 'forward_flops',
                    'backward_flops', 'param_bytes', 'param_arrays'):
            if key in stage and stage[key] is not None and stage[key] < 0:
                raise ValueError('stage {}: {} must not be negative, got '
                                 '{!r}'.format(index, key, stage[key]))


def flops_profile(net, image_size=224, n_classes=1000, cache_path=None):
    """A profile with per-stage FLOPs and parameter sizes, no measured times.

    Args:
        net (str): A name in ``models.NETWORKS``.
        image_size (int): Input side in pixels.
        n_classes (int): Classifier outputs.
        cache_path (str or None): FLOP cache file (see
            :func:`cgdp_chainer.flops.cached_stage_costs`).

    Returns:
        dict: A profile for :func:`predict` and friends.
    """
    from cgdp_chainer import flops
    stages = flops.cached_stage_costs(net, image_size, n_classes=n_classes,
                                      cache_path=cache_path)
    return {'net': net, 'device': None, 'batch': 1,
            'image_size': image_size, 'stages': stages}


# ----------------------------------------------------------- the workload

@dataclasses.dataclass
class Workload:
    """Costs of one replica at one batch on one machine, per stage.

    Attributes:
        forward_s, backward_s (list of float): Seconds per stage for one
            replica running alone (GPU) or with all cores (CPU); the loss
            belongs to the last stage.
        forward_1t_s, backward_1t_s (list of float or None): CPU replicas:
            the same with one BLAS thread (for core sharing).
        param_bytes, param_arrays (list of int): Per stage.
        host_ops (dict or None): Measured host costs: op name ->
            ``{'per_array_s', 'per_byte_s'}`` for ``reduce2`` (the mean of
            two slots), ``reduce_slot`` (each further slot), ``update`` (the
            update rule), ``addgrads`` and ``copyparams`` (what
            ``ParallelUpdater`` does per replica on CPU).
        copy (dict or None): Measured copies: ``d2h_bytes_per_s``,
            ``h2d_bytes_per_s``, ``latency_s``.
        device_update_s (float or None): Measured on-device update of the
            whole model.
        chunk_forward_overhead_s, chunk_backward_overhead_s (float or None):
            Measured fixed cost of each chunk (the stage times exclude it);
            ``None``: the hardware's ``chunk_overhead_s`` applies.
        busy_cores (float or None): CPU replicas: cores one replica keeps
            busy with all BLAS threads (measured: CPU seconds per second of
            a whole pass); ``None``: estimated from the stage times.
        forward_gil_s, backward_gil_s (list of float or None): CPU replicas:
            seconds per stage that hold Python's global interpreter lock
            (see :func:`stage_gil_seconds`); ``None``: not known, the GIL
            is not modelled.
        measured (bool): Compute times come from a measurement.
    """
    forward_s: list
    backward_s: list
    param_bytes: list
    param_arrays: list
    forward_1t_s: list = None
    backward_1t_s: list = None
    host_ops: dict = None
    copy: dict = None
    device_update_s: float = None
    chunk_forward_overhead_s: float = None
    chunk_backward_overhead_s: float = None
    forward_gil_s: list = None
    backward_gil_s: list = None
    busy_cores: float = None
    measured: bool = False

    @property
    def n_stages(self):
        return len(self.forward_s)

    @property
    def total_bytes(self):
        return sum(self.param_bytes)

    @property
    def total_arrays(self):
        return sum(self.param_arrays)


def _uses_measured_times(profile, hardware):
    stages = profile['stages']
    has_times = all(s.get('forward_s') is not None
                    and s.get('backward_s') is not None for s in stages)
    if not has_times:
        return False
    if hardware.kind == 'cpu':
        return True
    return profile.get('hardware') == hardware.name


def stage_gil_seconds(seconds_1t, flops, blas_1t_flops):
    """Seconds of a stage that hold the GIL, from its one-thread time.

    A CPU replica's stage spends its time in two kinds of work: arithmetic
    (the convolution and linear layers' matrix products, which BLAS runs
    without the GIL) and everything else, which Chainer's Python drives one
    NumPy call at a time: the interpreter, NumPy's dispatch and the small
    arrays' copies, padding and element-wise passes, whose time at this
    size is mostly dispatch. The second part is taken to hold the GIL: the
    stage's one-thread time beyond its arithmetic at the single-thread
    matrix-product rate, ``max(0, t_1t - FLOPs / blas_1t_flops)``.

    Args:
        seconds_1t (float): The stage's time with one BLAS thread.
        flops (float): Its arithmetic (FLOPs of the whole batch).
        blas_1t_flops (float): FLOP/s of a matrix product on one thread
            (:func:`cgdp_chainer.profiler.measure_blas_1t_flops`).

    Returns:
        float: Seconds.
    """
    return max(0.0, seconds_1t - flops / blas_1t_flops)


def _gil_times(profile, stages, scale, batch_per_device):
    """Per-stage GIL seconds of a measured CPU profile, or ``None`` when
    it lacks the one-thread times, the FLOPs or the BLAS rate."""
    rate = (profile.get('machine') or {}).get('blas_1t_flops')
    if not rate or rate <= 0:
        return None, None
    keys = ('forward_1t_s', 'backward_1t_s', 'forward_flops',
            'backward_flops')
    if not all(s.get(k) is not None for s in stages for k in keys):
        return None, None
    forward = [stage_gil_seconds(scale * s['forward_1t_s'],
                                 batch_per_device * s['forward_flops'], rate)
               for s in stages]
    backward = [stage_gil_seconds(scale * s['backward_1t_s'],
                                  batch_per_device * s['backward_flops'],
                                  rate)
                for s in stages]
    return forward, backward


def build_workload(profile, hardware, batch_per_device):
    """Turns a profile into per-stage seconds and bytes for one machine.

    Measured times are used where the profile was measured on this hardware
    (``this-cpu``, or a profile whose ``hardware`` field names the preset)
    and scaled linearly from the profile's batch; otherwise compute time is
    ``FLOPs x batch / hardware.achieved_flops``. CPU profiles with
    one-thread times, FLOPs and the machine's ``blas_1t_flops`` also give
    each stage's GIL seconds (:func:`stage_gil_seconds`).

    Args:
        profile (dict): See :func:`check_profile`.
        hardware (Hardware): The machine.
        batch_per_device (int): Images per replica.

    Returns:
        Workload: The costs.

    Raises:
        ValueError: The profile lacks what the hardware needs (a CPU preset
            needs measured times).
    """
    check_profile(profile)
    check_batch(batch_per_device)
    stages = profile['stages']
    measured = _uses_measured_times(profile, hardware)
    if hardware.kind == 'cpu' and not measured:
        raise ValueError("preset {!r} needs a profile with measured "
                         "forward_s/backward_s (experiments.profile)".format(
                             hardware.name))
    if measured:
        scale = batch_per_device / float(profile.get('batch') or 1)
        forward = [scale * s['forward_s'] for s in stages]
        backward = [scale * s['backward_s'] for s in stages]
        forward_1t = backward_1t = None
        if all(s.get('forward_1t_s') is not None for s in stages):
            forward_1t = [scale * s['forward_1t_s'] for s in stages]
            backward_1t = [scale * s['backward_1t_s'] for s in stages]
        forward_gil = backward_gil = None
        if hardware.kind == 'cpu':
            forward_gil, backward_gil = _gil_times(profile, stages, scale,
                                                   batch_per_device)
    else:
        if not all(s.get('forward_flops') is not None
                   and s.get('backward_flops') is not None for s in stages):
            raise ValueError(
                'preset {!r} has no measured times in this profile and the '
                'profile has no forward_flops/backward_flops to compute them '
                'from (see costmodel.flops_profile)'.format(hardware.name))
        rate = hardware.achieved_flops
        forward = [batch_per_device * s['forward_flops'] / rate
                   for s in stages]
        backward = [batch_per_device * s['backward_flops'] / rate
                    for s in stages]
        forward_1t = backward_1t = None
        forward_gil = backward_gil = None
    host_ops = profile.get('host', {}).get('ops') if measured else None
    copy = profile.get('copy') if measured else None
    device_update = profile.get('device_update_s') if measured else None
    overhead = profile.get('chunk_overhead') if measured else None
    overhead = overhead or {}
    busy_cores = None
    if measured and hardware.kind == 'cpu':
        busy_cores = (profile.get('whole') or {}).get('busy_cores')
    return Workload(
        forward_s=forward, backward_s=backward,
        param_bytes=[int(s['param_bytes']) for s in stages],
        param_arrays=[int(s.get('param_arrays', 1 if s['param_bytes'] else 0))
                      for s in stages],
        forward_1t_s=forward_1t, backward_1t_s=backward_1t,
        host_ops=host_ops, copy=copy, device_update_s=device_update,
        chunk_forward_overhead_s=overhead.get('forward_s'),
        chunk_backward_overhead_s=overhead.get('backward_s'),
        forward_gil_s=forward_gil, backward_gil_s=backward_gil,
        busy_cores=busy_cores, measured=measured)


# ----------------------------------------------- costs of the pieces

def _op_cost(ops, name, arrays, n_bytes):
    op = ops[name]
    return arrays * op['per_array_s'] + n_bytes * op['per_byte_s']


def host_job_seconds(workload, hardware, n_devices, arrays, n_bytes):
    """Seconds one host thread takes to reduce and update one chunk.

    One device's slot is lent as the sum (no reduction). With measured host
    costs: the mean of two slots, each further slot and the update rule,
    each ``arrays x per_array + bytes x per_byte``. Without: memory traffic
    over the thread's bandwidth plus per-array overheads; the runtime's
    blocked reduction reads ``N`` slots and writes the mean once (the
    scaling happens in cache), MomentumSGD reads parameter, gradient and
    velocity and writes two of them.

    Args:
        workload (Workload): The costs.
        hardware (Hardware): The machine.
        n_devices (int): Slots to reduce.
        arrays (int): Parameter arrays in the chunk.
        n_bytes (int): Parameter bytes in the chunk.

    Returns:
        float: Seconds.
    """
    if workload.host_ops is not None:
        ops = workload.host_ops
        seconds = (hardware.host_chunk_overhead_s
                   + _op_cost(ops, 'update', arrays, n_bytes))
        if n_devices > 1:
            seconds += (_op_cost(ops, 'reduce2', arrays, n_bytes)
                        + (n_devices - 2) * _op_cost(ops, 'reduce_slot',
                                                     arrays, n_bytes))
        return seconds
    traffic = host_traffic_bytes(n_devices, n_bytes)
    rate = min(hardware.host_thread_bw * _threads_per_server(hardware),
               hardware.host_memory_bw)
    reduce_calls = n_devices if n_devices > 1 else 0
    overhead = arrays * (reduce_calls * hardware.host_op_overhead_s
                         + hardware.host_update_overhead_s)
    return traffic / rate + overhead + hardware.host_chunk_overhead_s


def host_traffic_bytes(n_devices, n_bytes):
    """Host memory traffic of reducing ``n_devices`` slots of ``n_bytes`` and
    updating them with MomentumSGD (see :func:`host_job_seconds`)."""
    reduction = n_devices + 1 if n_devices > 1 else 0
    return n_bytes * (reduction + 5)


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


def host_traffic_parts(n_devices, n_bytes):
    """Host memory traffic of a chunk's two host jobs in multi-node CGDP.

    The reduce job reduces the slots (see :func:`host_traffic_bytes`) and
    packs the sum into the all-reduce buffer (read + write); the update job
    unpacks the result (read + write), scales it to the global mean (read +
    write) and runs MomentumSGD (5).

    Returns:
        tuple: ``(reduce bytes, update bytes)``.
    """
    reduction = n_devices + 1 if n_devices > 1 else 0
    return n_bytes * (reduction + 2), n_bytes * (5 + 2 + 2)


def host_job_parts(workload, hardware, n_devices, arrays, n_bytes):
    """Seconds of a chunk's two host jobs in multi-node CGDP.

    Between them the chunk is all-reduced across the nodes on the
    communication thread, and the host threads are free for other chunks.
    The reduce job carries the fixed cost of a host job. With measured host
    costs, packing, unpacking and scaling each cost one ``reduce_slot``
    (a pass that reads one array and updates another).

    Returns:
        tuple: ``(reduce seconds, update seconds)``.
    """
    if workload.host_ops is not None:
        ops = workload.host_ops
        one_pass = _op_cost(ops, 'reduce_slot', arrays, n_bytes)
        reduce_s = hardware.host_chunk_overhead_s + one_pass
        if n_devices > 1:
            reduce_s += (_op_cost(ops, 'reduce2', arrays, n_bytes)
                         + (n_devices - 2) * _op_cost(ops, 'reduce_slot',
                                                      arrays, n_bytes))
        update_s = _op_cost(ops, 'update', arrays, n_bytes) + 2 * one_pass
        return reduce_s, update_s
    reduce_traffic, update_traffic = host_traffic_parts(n_devices, n_bytes)
    rate = _host_rate(hardware)
    reduce_calls = n_devices if n_devices > 1 else 0
    op = hardware.host_op_overhead_s
    reduce_s = (reduce_traffic / rate + arrays * (reduce_calls + 1) * op
                + hardware.host_chunk_overhead_s)
    update_s = (update_traffic / rate
                + arrays * (hardware.host_update_overhead_s + 2 * op))
    return reduce_s, update_s


def host_job_gil_seconds(workload, hardware, n_devices, arrays,
                         part=None):
    """Seconds of a chunk's host job that hold the GIL (CPU replicas).

    A host operation's cost per array (``per_array_s`` of each measured
    operation: the update rule's Python, NumPy's dispatch) runs under the
    GIL; its cost per byte (NumPy's loops) does not. The job's fixed cost
    (waking the pool thread, the events) is Python too.

    Args:
        part (str or None): ``None`` for the single-node job;
            ``'reduce'`` or ``'update'`` for the multi-node jobs (see
            :func:`host_job_parts`).

    Returns:
        float: Seconds (0 without measured host costs).
    """
    ops = workload.host_ops
    if ops is None:
        return 0.0

    def per_array(name):
        return arrays * ops[name]['per_array_s']
    reduce_s = 0.0
    if n_devices > 1:
        reduce_s = per_array('reduce2') + (n_devices - 2) * per_array(
            'reduce_slot')
    if part == 'reduce':
        return (hardware.host_chunk_overhead_s + reduce_s
                + per_array('reduce_slot'))
    if part == 'update':
        return per_array('update') + 2 * per_array('reduce_slot')
    return hardware.host_chunk_overhead_s + reduce_s + per_array('update')


def _threads_per_server(hardware):
    return max(1, hardware.host_threads // hardware.host_servers)


def _host_rate(hardware):
    return min(hardware.host_thread_bw * _threads_per_server(hardware),
               hardware.host_memory_bw)


def device_op_seconds(workload, hardware, kind, arrays, n_bytes):
    """Seconds of an on-device operation of the typical baseline.

    Args:
        kind (str): ``'add'`` (gradient sum: 3 bytes of traffic per byte) or
            ``'update'`` (MomentumSGD: 5).
    """
    if kind == 'update' and workload.device_update_s is not None:
        return workload.device_update_s * (
            n_bytes / float(max(1, workload.total_bytes)))
    traffic = {'add': 3, 'update': 5}[kind] * n_bytes
    return traffic / hardware.device_memory_bw + \
        arrays * hardware.device_array_overhead_s


def cpu_threads_per_replica(hardware, n_devices):
    """BLAS threads of each CPU replica, as the CGDP runtime sets them: all
    cores for one replica, else cores divided by replicas (at least 1)."""
    if n_devices < 2:
        return hardware.cores
    return max(1, hardware.cores // n_devices)


def _amdahl(t_all, t_one, cores, threads):
    """Time of a stage with ``threads`` BLAS threads, from its measured
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


def cpu_stage_times(workload, hardware, threads):
    """Per-stage forward and backward seconds of a CPU replica with
    ``threads`` BLAS threads, and the cores it keeps busy: measured with
    all cores where the profile has it (``whole.busy_cores``, interpolated
    down to 1 for fewer threads), else the cores its BLAS work would keep
    busy by Amdahl's law.

    Returns:
        tuple: ``(forward list, backward list, cores busy)``.
    """
    forward, backward = [], []
    busy_time = work_time = 0.0
    for index in range(workload.n_stages):
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

    CPU replicas (measured): the sums of the stages plus the measured cost
    of a chunk. GPUs: the queued device work, but at least the
    hardware's ``chunk_overhead_s`` for a backward (Python must issue it).

    Args:
        forward, backward (list of float): Per-stage seconds.
        chunks (list of (int, int)): Stage ranges.

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

    The stages' GIL seconds (:func:`stage_gil_seconds`) plus the fixed cost
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
    stage times ``forward`` and ``backward`` (0 when unknown)."""
    gil = chunk_gil_times(workload, hardware, chunks)
    if gil is None:
        return 0.0
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    total = sum(chunk_forward) + sum(chunk_backward)
    if total <= 0:
        return 0.0
    return min(1.0, (sum(gil[0]) + sum(gil[1])) / total)


# -------------------------------------------------------- the topology

def socket_of(hardware, device):
    return device // hardware.devices_per_socket


def _link_group(hardware, device):
    return device // hardware.host_link_shared


def capacities(hardware, n_devices):
    """Shared resources of the simulation and their capacities (bytes/s, or
    cores for ``'cores'``)."""
    caps = {}
    n_sockets = max(1, socket_of(hardware, n_devices - 1) + 1)
    for g in range(_link_group(hardware, n_devices - 1) + 1):
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
        # One interpreter lock for the replica threads and host threads.
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
    group = _link_group(hardware, device)
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
    g_src = _link_group(hardware, source)
    g_dst = _link_group(hardware, destination)
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


# --------------------------------------------------- the event simulation

class Task(object):
    """One piece of work in the simulation.

    Attributes:
        kind (str): forward, backward, d2h, reduce_update, h2d, gather,
            add, update, broadcast (typical), addgrads, copyparams (CPU);
            multi-node: reduce, allreduce, update (CGDP), allreduce
            (ChainerMN).
        device (int or str): Replica index, ``'host'`` or ``'network'``.
        chunk (int or None): Chunk index (0 = input side).
        iteration (int): Iteration number.
        duration (float): Seconds of work at full speed.
        latency (float): Fixed seconds before the work starts (holds the
            exclusive resource, uses no bandwidth).
        exclusive (str or None): A first-come-first-served resource.
        demands (dict): Shared resource -> use per second at full speed.
        start, end (float): Filled in by :meth:`Simulation.run`.
    """

    __slots__ = ('index', 'kind', 'device', 'chunk', 'iteration', 'duration',
                 'latency', 'exclusive', 'demands', 'deps_left',
                 'dependents', 'start', 'end', 'remaining', 'speed')

    def __init__(self, index, kind, device, chunk, iteration, duration,
                 latency, exclusive, demands):
        self.index = index
        self.kind = kind
        self.device = device
        self.chunk = chunk
        self.iteration = iteration
        self.duration = max(0.0, float(duration))
        self.latency = max(0.0, float(latency))
        self.exclusive = exclusive
        self.demands = demands or {}
        self.deps_left = 0
        self.dependents = []
        self.start = None
        self.end = None
        self.remaining = 0.0
        self.speed = 1.0

    def __repr__(self):
        return 'Task({}, dev={}, chunk={}, it={}, {:.6g}-{:.6g})'.format(
            self.kind, self.device, self.chunk, self.iteration,
            self.start or 0.0, self.end or 0.0)


def fair_speeds(tasks, caps):
    """Max-min fair speeds (fractions of full speed) of running tasks.

    Progressive filling: every task's speed grows at the same pace until it
    reaches 1 or a shared resource it uses is full; tasks on a full
    resource keep their speed, the others go on growing.

    Args:
        tasks (list of Task): Running tasks; their ``speed`` is set.
        caps (dict): Resource -> capacity.
    """
    growing = []
    for task in tasks:
        if task.demands:
            growing.append(task)
        else:
            task.speed = 1.0
    if not growing:
        return
    residual = {}
    for task in growing:
        for resource in task.demands:
            residual[resource] = caps[resource]
    level = 0.0
    while growing:
        load = collections.defaultdict(float)
        for task in growing:
            for resource, use in task.demands.items():
                load[resource] += use
        step = 1.0 - level
        for resource, used in load.items():
            if used > 0:
                step = min(step, residual[resource] / used)
        step = max(step, 0.0)
        level += step
        for resource, used in load.items():
            residual[resource] -= used * step
        if level >= 1.0 - _EPS:
            for task in growing:
                task.speed = 1.0
            return
        full = {r for r, used in load.items()
                if used > 0 and residual[r] <= 1e-9 * caps[r]}
        still = []
        for task in growing:
            if any(r in full for r in task.demands):
                task.speed = level
            else:
                still.append(task)
        growing = still


class Simulation(object):
    """Discrete-event simulation of tasks with dependencies on resources.

    Args:
        caps (dict): Shared resource -> capacity (fluid, max-min fair).
        servers (dict): Exclusive resource -> number of servers.
    """

    def __init__(self, caps, servers=None):
        self.caps = dict(caps)
        self.servers = dict(servers or {})
        self.tasks = []

    def add(self, kind, device, chunk, iteration, duration, deps=(),
            latency=0.0, exclusive=None, demands=None):
        """Adds a task that starts once all of ``deps`` have ended.

        Returns:
            Task: The task.
        """
        for resource in (demands or {}):
            if resource not in self.caps:
                raise KeyError('unknown shared resource {!r}'.format(
                    resource))
        if exclusive is not None and exclusive not in self.servers:
            self.servers[exclusive] = 1
        task = Task(len(self.tasks), kind, device, chunk, iteration,
                    duration, latency, exclusive, demands)
        for dep in deps:
            if dep is None:
                continue
            task.deps_left += 1
            dep.dependents.append(task)
        self.tasks.append(task)
        return task

    def run(self):
        """Runs every task to its end.

        Returns:
            float: The time the last task ends.

        Raises:
            RuntimeError: Some tasks can never start (a dependency cycle).
        """
        now = 0.0
        free = dict(self.servers)
        queues = {resource: [] for resource in self.servers}
        in_latency = []
        working = []
        newly_ready = [t for t in self.tasks if t.deps_left == 0]
        finished = 0

        def finish(task):
            task.end = now
            if task.exclusive is not None:
                free[task.exclusive] += 1
            for dependent in task.dependents:
                dependent.deps_left -= 1
                if dependent.deps_left == 0:
                    newly_ready.append(dependent)

        while True:
            # Start whatever can start now; zero-time tasks end at once and
            # may make more tasks ready, hence the loop.
            while True:
                progressed = False
                while newly_ready:
                    task = newly_ready.pop()
                    progressed = True
                    if task.exclusive is None:
                        self._start(task, now, in_latency, working)
                    else:
                        heapq.heappush(queues[task.exclusive],
                                       (now, task.index, task))
                for resource, queue in queues.items():
                    while queue and free[resource] > 0:
                        _, _, task = heapq.heappop(queue)
                        free[resource] -= 1
                        progressed = True
                        self._start(task, now, in_latency, working)
                done_now = [t for t in working if t.remaining <= 0.0]
                if done_now:
                    working = [t for t in working if t.remaining > 0.0]
                    for task in done_now:
                        finish(task)
                        finished += 1
                    progressed = True
                if not progressed:
                    break
            if not working and not in_latency:
                break
            fair_speeds(working, self.caps)
            step = math.inf
            if in_latency:
                step = in_latency[0][0] - now
            for task in working:
                if task.speed > 0:
                    step = min(step, task.remaining / task.speed)
            if step == math.inf:
                raise RuntimeError('simulation stalled: running tasks get no '
                                   'capacity')
            step = max(step, 0.0)
            now += step
            for task in working:
                done_in = task.remaining / task.speed if task.speed > 0 \
                    else math.inf
                if done_in <= step * (1 + 1e-9) + 1e-15:
                    task.remaining = 0.0
                else:
                    task.remaining -= task.speed * step
            while in_latency and in_latency[0][0] <= now + 1e-15:
                _, _, task = heapq.heappop(in_latency)
                task.remaining = task.duration
                working.append(task)
        if finished != len(self.tasks):
            raise RuntimeError('{} of {} tasks never ran (a dependency '
                               'cycle)'.format(len(self.tasks) - finished,
                                               len(self.tasks)))
        return now

    @staticmethod
    def _start(task, now, in_latency, working):
        task.start = now
        if task.latency > 0:
            heapq.heappush(in_latency, (now + task.latency, task.index, task))
        else:
            task.remaining = task.duration
            working.append(task)


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


def _iteration_result(tasks, iterations, compute_s):
    ends = [0.0] * iterations
    for task in tasks:
        ends[task.iteration] = max(ends[task.iteration], task.end)
    if iterations == 1:
        period = ends[0]
    else:
        period = (ends[-1] - ends[0]) / (iterations - 1)
    return SimulationResult(period, tasks, ends, compute_s)


def _transfer(sim, hardware, caps, kind, device, chunk, iteration, path,
              n_bytes, arrays, deps, exclusive):
    """Adds a copy of ``n_bytes`` in ``arrays`` calls over ``path`` (one
    copy call per parameter array, as the runtime and Chainer issue them).
    """
    rate = standalone_rate(hardware, caps, path)
    demands = {resource: rate * use for resource, use in path.items()}
    latency = arrays * hardware.copy_latency_s if n_bytes > 0 else 0.0
    return sim.add(kind, device, chunk, iteration, n_bytes / rate, deps,
                   latency=latency, exclusive=exclusive, demands=demands)


def _check_common(workload, hardware, n_devices):
    check_n_devices(n_devices)
    hardware_module.validate(hardware)
    if workload.n_stages < 1:
        raise ValueError('the workload has no stages')


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


def _cpu_compute(workload, hardware, threads, caps=None):
    """Stage times and core demand of a CPU replica; raises the cores'
    capacity in ``caps`` to at least what one replica keeps busy, since its
    measured times already are those of a replica alone."""
    forward, backward, busy = cpu_stage_times(workload, hardware, threads)
    if caps is not None and 'cores' in caps:
        caps['cores'] = max(caps['cores'], busy)
    return forward, backward, {'cores': busy}


def _whole_model_times(workload, hardware, forward, backward):
    """Forward and backward seconds of the whole model as one chunk (what a
    non-chunked updater runs)."""
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, [(0, len(forward))])
    return chunk_forward[0], chunk_backward[0]


def simulate_typical(workload, hardware, n_devices, iterations=2,
                     n_nodes=1, network=None):
    """Simulates ``ParallelUpdater`` iterations (and, with ``n_nodes > 1``,
    the ChainerMN baseline; see :func:`simulate_chainermn`).

    Args:
        workload (Workload): Per-stage costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas (per node).
        iterations (int): Iterations to simulate (>= 1).
        n_nodes (int): Nodes; above 1, the gradient sum on device 0 is
            all-reduced across the nodes (a ring on the network) before the
            update.
        network (str, Network or None): See :func:`resolve_network`.

    Returns:
        SimulationResult: The timing.
    """
    _check_common(workload, hardware, n_devices)
    network = resolve_network(network, n_nodes)
    caps = capacities(hardware, n_devices)
    sim = Simulation(caps)
    n_bytes, arrays = workload.total_bytes, workload.total_arrays
    net_s = ring_allreduce_seconds(n_bytes, n_nodes, network)
    if hardware.kind == 'cpu':
        # One Python thread drives every replica: forwards, then backwards,
        # then addgrads, update and copyparams, one after another; BLAS has
        # every core (ParallelUpdater sets no limit).
        forward, backward, demands = _cpu_compute(workload, hardware,
                                                  hardware.cores, sim.caps)
        f_s, b_s = _whole_model_times(workload, hardware, forward, backward)
        ops = workload.host_ops
        last = None
        for it in range(iterations):
            for i in range(n_devices):
                last = sim.add('forward', i, None, it, f_s, [last],
                               demands=demands)
            for i in range(n_devices):
                last = sim.add('backward', i, None, it, b_s, [last],
                               demands=demands)
            for i in range(1, n_devices):
                last = sim.add('addgrads', i, None, it, _op_cost(
                    ops, 'addgrads', arrays, n_bytes), [last],
                    demands={'cores': 1.0})
            if n_nodes > 1:
                last = sim.add('allreduce', 'network', None, it, net_s,
                               [last], exclusive='network')
            last = sim.add('update', 0, None, it, _op_cost(
                ops, 'update', arrays, n_bytes), [last],
                demands={'cores': 1.0})
            for i in range(1, n_devices):
                last = sim.add('copyparams', i, None, it, _op_cost(
                    ops, 'copyparams', arrays, n_bytes), [last],
                    demands={'cores': 1.0})
        sim.run()
        return _iteration_result(sim.tasks, iterations, f_s + b_s)

    f_s, b_s = _whole_model_times(workload, hardware, workload.forward_s,
                                  workload.backward_s)
    add_s = device_op_seconds(workload, hardware, 'add', arrays, n_bytes)
    update_s = device_op_seconds(workload, hardware, 'update', arrays,
                                 n_bytes)
    ready = [None] * n_devices  # what each replica's next forward waits for
    for it in range(iterations):
        backward = []
        for i in range(n_devices):
            fwd = sim.add('forward', i, None, it, f_s, [ready[i]])
            backward.append(sim.add('backward', i, None, it, b_s, [fwd]))
        previous_add = backward[0]
        previous_copy = None
        for j in range(1, n_devices):
            copy = _transfer(sim, hardware, caps, 'gather', j, None, it,
                             peer_path(hardware, j, 0), n_bytes, arrays,
                             [backward[j], previous_add, previous_copy],
                             None)
            previous_copy = copy
            previous_add = sim.add('add', 0, None, it, add_s,
                                   [copy, previous_add])
        if n_nodes > 1:
            # The node's sum, all-reduced across the nodes; then every
            # device of every node holds the global sum (the update on
            # device 0 and the broadcast of the weights take as long as a
            # broadcast of the sum and an update on every device).
            previous_add = sim.add('allreduce', 'network', None, it, net_s,
                                   [previous_add], exclusive='network')
        update = sim.add('update', 0, None, it, update_s, [previous_add])
        ready[0] = update
        previous = update
        for j in range(1, n_devices):
            previous = _transfer(sim, hardware, caps, 'broadcast', j, None,
                                 it, peer_path(hardware, 0, j), n_bytes,
                                 arrays, [previous], None)
            ready[j] = previous
    sim.run()
    return _iteration_result(sim.tasks, iterations, f_s + b_s)


def simulate_cgdp(workload, hardware, n_devices, chunk_size, iterations=2,
                  n_nodes=1, network=None):
    """Simulates CGDP iterations with the chunk pipeline.

    With ``n_nodes > 1`` (multi-node CGDP, one rank per node) a chunk's host
    work is two jobs: the local reduce (and packing), then, after the
    chunk's ring all-reduce across the nodes on the node's ``network``
    resource (one all-reduce at a time, in chunk order, as the runtime's
    communication thread sends them by sequence number), the update. The
    host threads are free for other chunks during the all-reduce. Nodes are
    alike, so one node is simulated; the all-reduce's time
    (:func:`ring_allreduce_seconds`) accounts for the others.

    Args:
        workload (Workload): Per-stage costs.
        hardware (Hardware): The machine (one node).
        n_devices (int): Replicas (per node).
        chunk_size (int): Stages per chunk (grouped from the output end).
        iterations (int): Iterations to simulate (>= 1).
        n_nodes (int): Nodes; 1 is the single-node model, unchanged.
        network (str, Network or None): See :func:`resolve_network`.

    Returns:
        SimulationResult: The timing.
    """
    _check_common(workload, hardware, n_devices)
    check_chunk_size(chunk_size, workload.n_stages)
    network = resolve_network(network, n_nodes)
    multinode = n_nodes > 1
    chunks = chunking.plan_chunks(workload.n_stages, chunk_size)
    n_chunks = len(chunks)
    caps = capacities(hardware, n_devices)
    servers = {'host': hardware.host_servers}
    cpu = hardware.kind == 'cpu'
    if cpu:
        threads = cpu_threads_per_replica(hardware, n_devices)
        forward, backward, compute_demands = _cpu_compute(workload, hardware,
                                                          threads, caps)
        host_demands = {'cores': float(_threads_per_server(hardware))}
    else:
        forward, backward = workload.forward_s, workload.backward_s
        compute_demands = None
        host_demands = {'host_mem[0]': _host_rate(hardware)}
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    chunk_bytes = [sum(workload.param_bytes[a:b]) for a, b in chunks]
    chunk_arrays = [sum(workload.param_arrays[a:b]) for a, b in chunks]
    host_s = [host_job_seconds(workload, hardware, n_devices,
                               chunk_arrays[c], chunk_bytes[c])
              for c in range(n_chunks)]
    if multinode:
        parts = [host_job_parts(workload, hardware, n_devices,
                                chunk_arrays[c], chunk_bytes[c])
                 for c in range(n_chunks)]
        reduce_s = [p[0] for p in parts]
        update_s = [p[1] for p in parts]
        net_s = [ring_allreduce_seconds(chunk_bytes[c], n_nodes, network)
                 for c in range(n_chunks)]
    forward_demands = [compute_demands] * n_chunks
    backward_demands = [compute_demands] * n_chunks
    host_job_demands = [host_demands] * n_chunks
    reduce_demands = update_demands = host_job_demands
    if cpu:
        # CPU replicas, their gradients and the host threads all stream
        # through the same memory: each task uses the bandwidth its own
        # traffic needs at full speed (see cpu_memory_demand).
        forward_demands = [cpu_memory_demand(
            hardware, compute_demands, FORWARD_TRAFFIC * chunk_bytes[c],
            chunk_forward[c]) for c in range(n_chunks)]
        backward_demands = [cpu_memory_demand(
            hardware, compute_demands, BACKWARD_TRAFFIC * chunk_bytes[c],
            chunk_backward[c]) for c in range(n_chunks)]
        host_job_demands = [cpu_memory_demand(
            hardware, host_demands,
            host_traffic_bytes(n_devices, chunk_bytes[c]), host_s[c])
            for c in range(n_chunks)]
        if multinode:
            traffic = [host_traffic_parts(n_devices, chunk_bytes[c])
                       for c in range(n_chunks)]
            reduce_demands = [cpu_memory_demand(
                hardware, host_demands, traffic[c][0], reduce_s[c])
                for c in range(n_chunks)]
            update_demands = [cpu_memory_demand(
                hardware, host_demands, traffic[c][1], update_s[c])
                for c in range(n_chunks)]
        # The replica threads and the host threads run in one process:
        # their Python holds one interpreter lock (see stage_gil_seconds).
        gil = chunk_gil_times(workload, hardware, chunks)
        if gil is not None:
            forward_demands = [gil_demand(forward_demands[c], gil[0][c],
                                          chunk_forward[c])
                               for c in range(n_chunks)]
            backward_demands = [gil_demand(backward_demands[c], gil[1][c],
                                           chunk_backward[c])
                                for c in range(n_chunks)]
        host_job_demands = [gil_demand(host_job_demands[c],
                                       host_job_gil_seconds(
                                           workload, hardware, n_devices,
                                           chunk_arrays[c]), host_s[c])
                            for c in range(n_chunks)]
        if multinode:
            reduce_demands = [gil_demand(reduce_demands[c],
                                         host_job_gil_seconds(
                                             workload, hardware, n_devices,
                                             chunk_arrays[c], 'reduce'),
                                         reduce_s[c])
                              for c in range(n_chunks)]
            update_demands = [gil_demand(update_demands[c],
                                         host_job_gil_seconds(
                                             workload, hardware, n_devices,
                                             chunk_arrays[c], 'update'),
                                         update_s[c])
                              for c in range(n_chunks)]
    sim = Simulation(caps, servers)
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
                if cpu:
                    # Zero-copy hand-over: the host reads the replica's
                    # gradient arrays where they are.
                    delivered[c].append(previous)
                else:
                    delivered[c].append(_transfer(
                        sim, hardware, caps, 'd2h', i, c, it,
                        host_path(hardware, i, 'd2h'), chunk_bytes[c],
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
                    params_ready[i][c] = host
                else:
                    params_ready[i][c] = _transfer(
                        sim, hardware, caps, 'h2d', i, c, it,
                        host_path(hardware, i, 'h2d'), chunk_bytes[c],
                        chunk_arrays[c], [host], 'copy_in[{}]'.format(i))
    sim.run()
    return _iteration_result(sim.tasks, iterations,
                             sum(chunk_forward) + sum(chunk_backward))


def simulate_chainermn(workload, hardware, n_devices, n_nodes, network=None,
                       iterations=2):
    """Simulates the ChainerMN baseline on ``n_nodes`` nodes of
    ``n_devices`` devices each.

    After the whole backward, the gradients are all-reduced hierarchically:
    summed within the node over the device links (as
    :func:`simulate_typical` sums them on device 0), all-reduced across the
    nodes by a ring on the network (:func:`ring_allreduce_seconds` of the
    whole model), and spread within the node again; then every device
    updates its copy. With one node this is :func:`simulate_typical`
    exactly.

    Returns:
        SimulationResult: The timing.
    """
    return simulate_typical(workload, hardware, n_devices, iterations,
                            n_nodes=n_nodes, network=network)


def chainermn_closed_form(workload, hardware, n_devices, n_nodes,
                          network=None, iterations=2):
    """The ChainerMN baseline's iteration time from its phases (see
    :func:`typical_closed_form` and :func:`simulate_chainermn`).

    Returns:
        float: Seconds per iteration.
    """
    return typical_closed_form(workload, hardware, n_devices, iterations,
                               n_nodes=n_nodes, network=network)


# ------------------------------------------------------- the closed forms

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
        task = Task(index, 'copy', index, None, 0, 1.0, 0.0, None,
                    {r: rate * use for r, use in path.items()})
        tasks.append((task, rate))
    fair_speeds([t for t, _ in tasks], caps)
    return [task.speed * rate for task, rate in tasks]


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
    Each phase's time is that of its copy alone on its path.

    Returns:
        float: Seconds per iteration.
    """
    _check_common(workload, hardware, n_devices)
    network = resolve_network(network, n_nodes)
    n_bytes, arrays = workload.total_bytes, workload.total_arrays
    net_s = ring_allreduce_seconds(n_bytes, n_nodes, network)
    if hardware.kind == 'cpu':
        forward, backward, _ = cpu_stage_times(workload, hardware,
                                               hardware.cores)
        f_s, b_s = _whole_model_times(workload, hardware, forward, backward)
        ops = workload.host_ops
        return (n_devices * (f_s + b_s)
                + (n_devices - 1) * _op_cost(ops, 'addgrads', arrays, n_bytes)
                + net_s
                + _op_cost(ops, 'update', arrays, n_bytes)
                + (n_devices - 1) * _op_cost(ops, 'copyparams', arrays,
                                             n_bytes))
    caps = capacities(hardware, n_devices)
    latency = arrays * hardware.copy_latency_s
    f_s, b_s = _whole_model_times(workload, hardware, workload.forward_s,
                                  workload.backward_s)
    add_s = device_op_seconds(workload, hardware, 'add', arrays, n_bytes)
    update_s = device_op_seconds(workload, hardware, 'update', arrays,
                                 n_bytes)
    gather = [0.0] + [latency + n_bytes / standalone_rate(
        hardware, caps, peer_path(hardware, j, 0))
        for j in range(1, n_devices)]
    broadcast = [0.0] + [latency + n_bytes / standalone_rate(
        hardware, caps, peer_path(hardware, 0, j))
        for j in range(1, n_devices)]
    starts = [0.0] * n_devices
    ends = []
    for _ in range(max(1, iterations)):
        t = starts[0] + f_s + b_s
        for j in range(1, n_devices):
            t = max(t, starts[j] + f_s + b_s) + gather[j] + add_s
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


def cgdp_phases(workload, hardware, n_devices, chunk_size, n_nodes=1,
                network=None):
    """Per-chunk phase times of CGDP in backward order (output end first).

    Copies that run at the same time on all devices get their max-min fair
    share of the links (the slowest device's rate); host memory is not
    shared between copies and host threads here.

    Args:
        n_nodes (int): Nodes (multi-node CGDP when above 1).
        network (str, Network or None): See :func:`resolve_network`.

    Returns:
        dict: ``forward`` (seconds of one replica's forward), lists
        ``backward``, ``d2h``, ``host``, ``allreduce`` (the chunk's ring
        all-reduce across the nodes; zeros for one node), ``h2d`` (one entry
        per chunk, output end first) and ``chunks`` (their stage ranges).
        With ``n_nodes > 1`` also ``reduce`` and ``update``, the two host
        jobs (see :func:`host_job_parts`), and ``host`` is their sum.
    """
    _check_common(workload, hardware, n_devices)
    check_chunk_size(chunk_size, workload.n_stages)
    network = resolve_network(network, n_nodes)
    chunks = chunking.plan_chunks(workload.n_stages, chunk_size)
    if hardware.kind == 'cpu':
        threads = cpu_threads_per_replica(hardware, n_devices)
        forward, backward, busy = cpu_stage_times(workload, hardware,
                                                  threads)
        # Replicas that compute at once share the cores (a replica alone
        # runs at its measured speed) and the interpreter lock: N replicas
        # that each hold it for a share g of their compute need N x g.
        gil_share = replica_gil_share(workload, hardware, forward, backward,
                                      chunks)
        slowdown = max(1.0, n_devices * busy / max(
            cpu_capacity(hardware), busy), n_devices * gil_share)
        forward = [slowdown * t for t in forward]
        backward = [slowdown * t for t in backward]
    else:
        forward, backward = workload.forward_s, workload.backward_s
    caps = capacities(hardware, n_devices)
    if hardware.kind == 'cpu':
        d2h_rate = h2d_rate = math.inf
    else:
        d2h_rate = min(concurrent_rates(hardware, caps, [
            host_path(hardware, i, 'd2h') for i in range(n_devices)]))
        h2d_rate = min(concurrent_rates(hardware, caps, [
            host_path(hardware, i, 'h2d') for i in range(n_devices)]))
    chunk_forward, chunk_backward = chunk_compute_times(
        workload, hardware, forward, backward, chunks)
    phases = {'forward': sum(chunk_forward), 'backward': [], 'd2h': [],
              'host': [], 'allreduce': [], 'h2d': [], 'chunks': []}
    if n_nodes > 1:
        phases['reduce'] = []
        phases['update'] = []
    for index in range(len(chunks) - 1, -1, -1):
        a, b = chunks[index]
        n_bytes = sum(workload.param_bytes[a:b])
        arrays = sum(workload.param_arrays[a:b])
        latency = arrays * hardware.copy_latency_s if (
            n_bytes > 0 and hardware.kind != 'cpu') else 0.0
        phases['chunks'].append((a, b))
        phases['backward'].append(chunk_backward[index])
        phases['d2h'].append(latency + n_bytes / d2h_rate)
        if n_nodes > 1:
            reduce_s, update_s = host_job_parts(workload, hardware,
                                                n_devices, arrays, n_bytes)
            phases['reduce'].append(reduce_s)
            phases['update'].append(update_s)
            phases['host'].append(reduce_s + update_s)
        else:
            phases['host'].append(host_job_seconds(
                workload, hardware, n_devices, arrays, n_bytes))
        phases['allreduce'].append(ring_allreduce_seconds(
            n_bytes, n_nodes, network))
        phases['h2d'].append(latency + n_bytes / h2d_rate)
    return phases


def cgdp_closed_form(workload, hardware, n_devices, chunk_size, n_nodes=1,
                     network=None):
    """CGDP's iteration time from the flow-line recurrence.

    With chunks in backward order ``k = 1..K``: the backward of chunk ``k``
    ends at ``b_k = F + sum_{j<=k} bwd_j``; its d2h at
    ``d_k = max(b_k, d_{k-1}) + d2h_k``; its host job on the first free of
    ``host_servers`` threads at ``h_k = max(d_k, free) + host_k``; its h2d at
    ``u_k = max(h_k, u_{k-1}) + h2d_k``. The next forward starts with chunk
    K (input side), whose copy is the last, so the iteration takes ``u_K``.

    Multi-node (``n_nodes = R > 1``): the host job splits into a reduce
    ending at ``r_k`` and an update ending at ``p_k``; between them the ring
    all-reduce ``A_k`` (:func:`ring_allreduce_seconds`) on the network, in
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
                         n_nodes, network)
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


def cgdp_critical_path(workload, hardware, n_devices, chunk_size):
    """The critical-path formula of CGDP for one host thread.

    ``F + max over a<=b<=c<=d=K of sum_{k<=a} bwd_k + sum_{a<=k<=b} d2h_k +
    sum_{b<=k<=c} host_k + sum_{c<=k<=K} h2d_k`` (chunks in backward
    order). Equals :func:`cgdp_closed_form` when ``host_servers == 1``.

    Returns:
        float: Seconds per iteration.
    """
    phases = cgdp_phases(workload, hardware, n_devices, chunk_size)
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


# ------------------------------------------------------------ predictions

def candidate_chunk_sizes(n_stages):
    """Chunk sizes tried: powers of two below ``n_stages``, and
    ``n_stages`` (one chunk), as the runtime search does."""
    sizes = []
    size = 1
    while size < n_stages:
        sizes.append(size)
        size *= 2
    sizes.append(n_stages)
    return sizes


def best_chunk_size(workload, hardware, n_devices, candidates=None,
                    method='simulate', iterations=2, n_nodes=1,
                    network=None):
    """The chunk size with the shortest predicted CGDP iteration.

    Args:
        workload (Workload): Per-stage costs.
        hardware (Hardware): The machine.
        n_devices (int): Replicas.
        candidates (list of int or None): Sizes to try (default:
            :func:`candidate_chunk_sizes`).
        method (str): ``'simulate'`` or ``'closed'``.
        iterations (int): Simulated iterations per size.
        n_nodes (int): Nodes (multi-node CGDP when above 1).
        network (str, Network or None): See :func:`resolve_network`.

    Returns:
        tuple: ``(best size, {size: seconds})``; ties go to the smaller size.
    """
    if method not in ('simulate', 'closed'):
        raise ValueError("method must be 'simulate' or 'closed', got "
                         "{!r}".format(method))
    candidates = candidates or candidate_chunk_sizes(workload.n_stages)
    times = {}
    for size in candidates:
        if method == 'simulate':
            times[size] = simulate_cgdp(workload, hardware, n_devices, size,
                                        iterations, n_nodes=n_nodes,
                                        network=network).iteration_s
        else:
            times[size] = cgdp_closed_form(workload, hardware, n_devices,
                                           size, n_nodes=n_nodes,
                                           network=network)
    best = min(candidates, key=lambda s: (times[s], s))
    return best, times


def predict(profile, hardware, n_devices, batch_per_device, chunk_size=None,
            method='simulate', single=None):
    """Predicted iteration times, speedup and efficiencies at one point.

    Args:
        profile (dict): See :func:`check_profile`.
        hardware (str or Hardware): A preset name or a description.
        n_devices (int): Replicas.
        batch_per_device (int): Images per replica.
        chunk_size (int or None): CGDP chunk size; ``None`` picks the best.
        method (str): ``'simulate'`` or ``'closed'``.
        single (dict or None): The prediction at ``n_devices=1`` (to save
            work in sweeps); computed when needed and not given.

    Returns:
        dict: ``t_typical``, ``t_cgdp``, ``speedup`` (typical over CGDP),
        ``eff_typical`` and ``eff_cgdp`` (weak-scaling efficiency within
        each mode, ``t(1) / t(N)``, as in ``experiments.results``),
        ``best_chunk_size``, ``chunk_times`` and the closed forms
        ``t_typical_closed`` and ``t_cgdp_closed``.
    """
    hw = hardware_module.get_hardware(hardware, profile)
    check_n_devices(n_devices)
    workload = build_workload(profile, hw, batch_per_device)
    if chunk_size is None:
        size, chunk_times = best_chunk_size(workload, hw, n_devices,
                                            method=method)
    else:
        check_chunk_size(chunk_size, workload.n_stages)
        size, chunk_times = chunk_size, {}
    if method == 'simulate':
        t_typical = simulate_typical(workload, hw, n_devices).iteration_s
        t_cgdp = chunk_times.get(size) or simulate_cgdp(
            workload, hw, n_devices, size).iteration_s
    else:
        t_typical = typical_closed_form(workload, hw, n_devices)
        t_cgdp = chunk_times.get(size) or cgdp_closed_form(
            workload, hw, n_devices, size)
    result = {
        't_typical': t_typical, 't_cgdp': t_cgdp,
        'speedup': t_typical / t_cgdp, 'best_chunk_size': size,
        'chunk_times': chunk_times,
        't_typical_closed': typical_closed_form(workload, hw, n_devices),
        't_cgdp_closed': cgdp_closed_form(workload, hw, n_devices, size),
    }
    if n_devices == 1:
        single = result
    elif single is None:
        single = predict(profile, hw, 1, batch_per_device,
                         chunk_size=chunk_size, method=method)
    result['eff_typical'] = single['t_typical'] / t_typical
    result['eff_cgdp'] = single['t_cgdp'] / t_cgdp
    return result


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
    net = resolve_network(network, n_nodes)
    check_n_devices(devices_per_node)
    if method not in ('simulate', 'closed'):
        raise ValueError("method must be 'simulate' or 'closed', got "
                         "{!r}".format(method))
    workload = build_workload(profile, hw, batch_per_device)
    n = devices_per_node
    if chunk_size is None:
        size, chunk_times = best_chunk_size(workload, hw, n, method=method,
                                            n_nodes=n_nodes, network=net)
    else:
        check_chunk_size(chunk_size, workload.n_stages)
        size, chunk_times = chunk_size, {}
    closed_mn = chainermn_closed_form(workload, hw, n, n_nodes, net)
    closed_cgdp = cgdp_closed_form(workload, hw, n, size, n_nodes, net)
    if method == 'simulate':
        t_chainermn = simulate_chainermn(workload, hw, n, n_nodes,
                                         net).iteration_s
        t_cgdp = chunk_times.get(size) or simulate_cgdp(
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
        'allreduce_s': ring_allreduce_seconds(workload.total_bytes, n_nodes,
                                              net),
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
    peer links assumed, measured host costs).

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
        host_servers=threads, sources='measured by experiments.profile')


def choose_chunk_size(stage_profile, n_devices, hardware=None,
                      batch_per_device=None):
    """The chunk size the cost model predicts to be fastest.

    Used by ``CGDPUpdater(chunk_size='model')``.

    Args:
        stage_profile (dict): A profile (see :func:`check_profile`).
        n_devices (int): Replicas.
        hardware (str, Hardware or None): The machine; ``None`` means the
            machine the profile was measured on.
        batch_per_device (int or None): Default: the profile's batch.

    Returns:
        int: The chunk size.
    """
    check_n_devices(n_devices)
    if hardware is None:
        hw = hardware_from_profile(stage_profile)
    else:
        hw = hardware_module.get_hardware(hardware, stage_profile)
    batch = batch_per_device or int(stage_profile.get('batch') or 1)
    workload = build_workload(stage_profile, hw, batch)
    size, _ = best_chunk_size(workload, hw, n_devices)
    return size


def choose_chunk_size_for_updater(updater, sample_batch):
    """Profiles the updater's first replica on a batch and picks a chunk size.

    Called by ``CGDPUpdater`` for ``chunk_size='model'`` before its first
    iteration. The replica's persistent values (BatchNormalization
    statistics) and NumPy's global random state are restored afterwards, so
    the profile leaves training as it was.

    Args:
        updater (cgdp_chainer.CGDPUpdater): The updater.
        sample_batch (list): Device 0's examples of the first batch.

    Returns:
        int: The chunk size.
    """
    from cgdp_chainer import profiler as profile_module
    replica = updater._replicas[0]
    device = updater._devices[0]
    in_arrays = updater.converter(sample_batch, device)
    host_threads = getattr(updater._accumulator._pool, '_max_workers', 1)
    profile = profile_module.profile_replica(
        replica, device, in_arrays, loss_func=updater.loss_func,
        host_threads=host_threads, reps=2)
    profile['hardware'] = 'this-gpu' if device.xp.__name__ == 'cupy' \
        else 'this-cpu'
    size = choose_chunk_size(profile, len(updater._devices))
    return size
