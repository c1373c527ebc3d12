"""Iteration time of data parallel training and of CGDP, predicted.

Three single-node schemes on ``N`` devices with a fixed batch per device
(weak scaling): Chainer's ``ParallelUpdater`` (typical), Chainer's
``MultiprocessParallelUpdater`` (NCCL) and CGDP; across nodes, ChainerMN and
multi-node CGDP. Each is computed as a discrete-event simulation and as a
closed form. docs/COSTMODEL.md describes the model, its inputs, formulas and
what it leaves out.

The package, along its seams:

* :mod:`~cgdp_chainer.costmodel.inputs`: argument checks, profiles and the
  per-layer :class:`Workload` of one replica on one machine;
* :mod:`~cgdp_chainer.costmodel.profiler`,
  :mod:`~cgdp_chainer.costmodel.layers`,
  :mod:`~cgdp_chainer.costmodel.functions`: measured per-layer profiles
  and per-function FLOPs and bytes of any model (they import Chainer; the
  rest does not);
* :mod:`~cgdp_chainer.costmodel.hardware`: machine and network presets;
* :mod:`~cgdp_chainer.costmodel.costs`: seconds of each operation;
* :mod:`~cgdp_chainer.costmodel.topology`: shared resources and copy paths;
* :mod:`~cgdp_chainer.costmodel.engine`: a generic discrete-event engine;
* :mod:`~cgdp_chainer.costmodel.simulate`: the schemes as task graphs;
* :mod:`~cgdp_chainer.costmodel.closed`: the closed forms;
* :mod:`~cgdp_chainer.costmodel.predictions`: predictions at one point;
* :mod:`~cgdp_chainer.costmodel.choose`: the chunk size for
  ``CGDPUpdater(chunk_size='model')``.

The names below are the public interface; import them from here.
"""
from cgdp_chainer.costmodel.inputs import (  # NOQA
    CGDP, NCCL, OPTIMIZERS, TYPICAL, WORKERS, Workload, build_workload,
    check_batch, check_chunk_size, check_n_devices, check_n_nodes,
    check_optimizer, check_profile, check_workers, describe_chunking,
    flops_profile, plan_chunks,
    load_profile, resolve_network, layer_gil_seconds)
from cgdp_chainer.costmodel.costs import (  # NOQA
    BACKWARD_TRAFFIC, FORWARD_TRAFFIC, ChunkCalls, cgdp_chunk_calls,
    cgdp_chunk_times, cgdp_copy_latency_seconds, cgdp_gather_seconds,
    chunk_compute_times, chunk_gil_times, cpu_layer_times,
    cpu_threads_per_replica, device_op_seconds,
    gil_demand, host_job_gil_seconds, host_job_parts, host_job_seconds,
    host_traffic_bytes, host_traffic_parts, per_array_copy_latency_seconds,
    replica_gil_share, ring_allreduce_seconds)
from cgdp_chainer.costmodel.topology import (  # NOQA
    capacities, collective, concurrent_rates, host_path, peer_path,
    ring_hops, standalone_rate)
from cgdp_chainer.costmodel.engine import (  # NOQA
    Simulation, Task, fair_speeds)
from cgdp_chainer.costmodel.simulate import (  # NOQA
    SimulationResult, simulate_cgdp, simulate_chainermn, simulate_nccl,
    simulate_typical)
from cgdp_chainer.costmodel.closed import (  # NOQA
    cgdp_closed_form, cgdp_critical_path, cgdp_phases, chainermn_closed_form,
    nccl_closed_form, nccl_phases, typical_closed_form)
from cgdp_chainer.costmodel.predictions import (  # NOQA
    best_chunk_size, candidate_chunk_sizes, hardware_from_profile, predict,
    predict_mode, predict_multinode)
from cgdp_chainer.costmodel.choose import (  # NOQA
    ModelChunkChooser, choose_chunk_size, choose_chunk_size_for_replica)
