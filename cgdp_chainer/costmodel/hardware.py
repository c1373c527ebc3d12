"""Hardware presets for the cost model, each number with its public source.

A :class:`Hardware` describes one machine: the devices that hold the model
replicas, how they reach the host (the CPU sockets and their memory) and each
other, and how fast the host can reduce and update parameters. The cost model
(:mod:`cgdp_chainer.costmodel`) turns it into resources of a discrete-event
simulation:

* ``compute[i]``: device ``i``'s compute (runs forward and backward).
* ``copy_out[i]`` / ``copy_in[i]``: device ``i``'s copy engines, one each way
  (first come, first served, one transfer at a time each).
* ``link_up[g]`` / ``link_down[g]``: the device-to-socket link of link group
  ``g`` (``host_link_shared`` devices per group, 1 = a dedicated link).
* ``peer_out[i]`` / ``peer_in[i]``: device ``i``'s direct device-to-device
  port (NVLink), where ``peer_scope`` says the hardware has one.
* ``socket_link[s->t]``: the inter-socket link, one per direction.
* ``host_mem[s]``: socket ``s``'s memory bandwidth, shared by every DMA to or
  from that socket and by the host reduce/update threads.
* ``cores`` (CPU replicas only): the cores that the replicas, the copies and
  the host threads all share.
* ``gil`` (CPU replicas only): Python's global interpreter lock, capacity
  one, which the replica threads and the host threads of the process hold
  for the Python part of their work (see
  :func:`cgdp_chainer.costmodel.layer_gil_seconds`).

Compute time on a preset without a measured profile is, per Chainer
function of each layer
(:func:`cgdp_chainer.costmodel.inputs.gpu_function_seconds`; FLOPs and
bytes from :mod:`cgdp_chainer.costmodel.functions`), the longest of three: its arithmetic, its memory traffic at ``device_memory_bw``, and one
kernel launch (``kernel_launch_s``). A convolution or linear function of
``W`` FLOPs runs at the efficiency ``compute_efficiency x W / (W +
conv_half_flops)`` (Hockney's half-performance size ``n_1/2``: small layers
fill the GPU less well); any other function's FLOPs at
``compute_efficiency``, so that memory-bound functions (batch
normalization, activations, element-wise arithmetic) are priced by their
bytes. A layer takes at least its host-side time: ``calls x
(function_forward_s + kernel_launch_s)`` forward, ``calls x
(function_backward_s + backward_kernels_per_call x kernel_launch_s)``
backward, the Python a replica's interpreter spends to issue the layer's
Chainer functions (see :data:`MEASURED_HERE`). The efficiency factor of
each preset is documented at its definition; it was derived from whole
networks' throughput (memory-bound layers included), so with those layers
now priced by their bytes it is a conservative matrix-product rate.
Achieved bandwidths are given, not theoretical ones, where the preset says
"in practice".

The presets describe the machine as built (``physical_devices`` devices).
Asked for more devices, the model extrapolates: more sockets of the same
shape (``devices_per_socket`` devices each), reached over the same
inter-socket link. Predictions past ``physical_devices`` are hypothetical.

Several nodes (multi-node predictions) are joined by a :class:`Network`
(``'ib-edr'``, ``'ib-hdr'``), a separate preset: any machine preset can be
combined with any network. The cost model treats each node's port as one
more resource (``network``: one all-reduce at a time, in chunk order).
"""
import dataclasses
import math
import os

GB = 1e9
TFLOPS = 1e12

PEER_SCOPES = ('none', 'socket', 'all', 'pcie')

# Host-side costs measured on the project's 2-core VM (x86-64, Python 3.11,
# Chainer 7.8.1, NumPy 1.26; load average 0.2) with
# cgdp_chainer.costmodel.profiler.measure_function_overhead() (a chain of
# 1x1 convolution, batch normalization, ReLU and add on one-element arrays:
# Chainer's Python and the array library's dispatch per call, medians of 7
# passes) and measure_host_update(name, [(1,)] * 300) (Chainer's update
# rules on one-element arrays: their Python per array). The GPU presets use
# them as the host-side cost of their CPUs, which is an assumption: Python
# on a POWER8 or Grace core is not this VM's. A profile measured on the
# machine itself (experiments.profile) records its own.
MEASURED_HERE = {
    'function_forward_s': 96e-6,
    'function_backward_s': 147e-6,
    'update_momentum_sgd_per_array_s': 13e-6,
    'update_adam_per_array_s': 44e-6,
}
# The CUDA runtime's cost to launch one kernel from the host: about 4 us
# (NVIDIA Developer Blog, A. Gray, "Getting Started with CUDA Graphs",
# 2019: back-to-back launches of a short kernel took 3.8 us each without
# graphs). CuPy's own Python per kernel call is in the measured per-call
# cost above (NumPy's dispatch stands in for it; no GPU was lent to measure
# it: measure_function_overhead on a '@cupy' device measures both at once).
KERNEL_LAUNCH_S = 4e-6


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One machine as the cost model sees it.

    Bandwidths are bytes per second per direction; times are seconds.

    Args:
        name: Preset name.
        description: One line for humans.
        kind: ``'gpu'`` or ``'cpu'`` (CPU replicas that share the cores).
        physical_devices: Devices the machine really has.
        peak_flops: fp32 peak of one device, FLOP/s.
        compute_efficiency: Achieved fraction of ``peak_flops`` on
            convolution/linear functions (and the rate of any other
            function's FLOPs).
        device_memory_bw: One device's memory bandwidth: what a function's
            bytes take, the on-device gradient sum and update of the
            typical data parallel baseline and CGDP's gather of a chunk's
            gradients into its flat buffer.
        device_array_overhead_s: Fixed cost per parameter array per on-device
            operation (Chainer's Python dispatch plus a kernel launch); a
            packing kernel over a flat buffer (NCCL's, CGDP's gather) pays
            it once.
        devices_per_socket: Devices attached to each CPU socket.
        host_link_bw: Device-to-socket link bandwidth per direction.
        host_link_shared: Devices that share one device-to-socket link (a
            PCIe switch uplink); 1 means a dedicated link.
        copy_latency_s: Fixed cost of one copy call: the baselines make
            one per parameter array, CGDP one per chunk and direction
            (``costs.cgdp_chunk_calls``).
        copy_engine_bw: Bandwidth cap of one copy engine per direction.
        peer_scope: Direct device-to-device links: ``'none'`` (copies are
            staged through the host), ``'socket'`` (only devices on the same
            socket are linked), ``'all'`` (every pair, e.g. NVSwitch) or
            ``'pcie'`` (peer-to-peer over the PCIe links of one socket).
        peer_bw: Bandwidth of a device's peer port per direction.
        socket_link_bw: Inter-socket link bandwidth per direction.
        host_memory_bw: Sustained memory bandwidth of one socket.
        host_threads: Host threads that reduce and update parameters.
        host_thread_bw: Streaming bandwidth one host thread achieves.
        host_servers: Chunk jobs that the host runs at the same time (each
            with ``host_threads / host_servers`` threads). The GPU presets
            model the paper's design, one chunk at a time split over all
            host threads (``host_servers = 1``); the project's runtime gives
            each chunk to one pool thread (``this-cpu`` models that, with
            ``host_servers == host_threads``).
        host_chunk_overhead_s: Fixed cost of one host job (a pool thread
            wakes, waits for the chunk's copies, issues the copies back).
        chunk_overhead_s: Fixed device-side cost of one more chunk in the
            backward (Python: the cut, the backward call, the hand-over).
            GPU work is queued asynchronously, so on GPUs it only counts when
            it exceeds the queued work; it is added to each chunk's backward
            as a lower bound of its duration.
        host_op_overhead_s: Fixed cost of one NumPy call on the host
            (copy, add, scale in the reduction): CGDP makes one per chunk
            over its flat slice (``costs.cgdp_chunk_calls``).
        host_update_overhead_s: Fixed cost of one Chainer MomentumSGD
            update rule call on the host (Python dispatch): one per
            parameter array for Chainer's updaters; CGDP's host job, one
            update over the chunk's flat slice, pays it once.
        host_adam_overhead_s: The same for Adam.
        function_forward_s, function_backward_s: Host-side seconds of one
            Chainer function call in the forward and in the backward
            (Python and dispatch, without the kernel launch).
        kernel_launch_s: Host-side seconds to launch one kernel (GPUs).
        backward_kernels_per_call: Kernels a function's backward launches
            (a convolution's: data and filter gradients).
        conv_half_flops: FLOPs of a layer that runs at half of the
            preset's large-layer efficiency (0: every layer at
            ``compute_efficiency``).
        cores: Cores shared by CPU replicas (``kind == 'cpu'`` only); the
            runtime divides its BLAS threads by this number.
        effective_cores: The compute capacity those cores give this
            process (less than ``cores`` while other processes run); 0
            means ``cores``.
        sources: Where the numbers come from.
    """
    name: str
    description: str
    kind: str
    physical_devices: int
    peak_flops: float
    compute_efficiency: float
    device_memory_bw: float
    device_array_overhead_s: float
    devices_per_socket: int
    host_link_bw: float
    host_link_shared: int
    copy_latency_s: float
    copy_engine_bw: float
    peer_scope: str
    peer_bw: float
    socket_link_bw: float
    host_memory_bw: float
    host_threads: int
    host_thread_bw: float
    host_servers: int = 1
    host_op_overhead_s: float = 2e-6
    host_update_overhead_s: float = MEASURED_HERE[
        'update_momentum_sgd_per_array_s']
    host_adam_overhead_s: float = MEASURED_HERE['update_adam_per_array_s']
    function_forward_s: float = MEASURED_HERE['function_forward_s']
    function_backward_s: float = MEASURED_HERE['function_backward_s']
    kernel_launch_s: float = KERNEL_LAUNCH_S
    backward_kernels_per_call: int = 2
    conv_half_flops: float = 0.0
    host_chunk_overhead_s: float = 50e-6
    chunk_overhead_s: float = 100e-6
    cores: int = 0
    effective_cores: float = 0.0
    sources: str = ''

    def __post_init__(self):
        validate(self)

    @property
    def achieved_flops(self):
        """FLOP/s one device achieves on the counted layers."""
        return self.peak_flops * self.compute_efficiency

    def replace(self, **changes):
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)


def validate(hardware):
    """Checks a :class:`Hardware` for impossible values.

    Args:
        hardware (Hardware): The description to check.

    Raises:
        ValueError: A bandwidth, count or time is negative or zero where it
            must be positive, or a choice is unknown; the message names the
            field and what is allowed.
    """
    if hardware.kind not in ('gpu', 'cpu'):
        raise ValueError("hardware {!r}: kind {!r} is unknown; use 'gpu' or "
                         "'cpu'".format(hardware.name, hardware.kind))
    if hardware.peer_scope not in PEER_SCOPES:
        raise ValueError('hardware {!r}: peer_scope {!r} is unknown; use one '
                         'of {}'.format(hardware.name, hardware.peer_scope,
                                        ', '.join(PEER_SCOPES)))
    positive = ('peak_flops', 'compute_efficiency', 'device_memory_bw',
                'host_link_bw', 'copy_engine_bw', 'socket_link_bw',
                'host_memory_bw', 'host_thread_bw')
    for field in positive:
        value = getattr(hardware, field)
        if not (isinstance(value, (int, float)) and value > 0
                and not math.isnan(value)):
            raise ValueError(
                'hardware {!r}: {} must be a positive number (bytes/s, '
                'FLOP/s or a fraction), got {!r}'.format(
                    hardware.name, field, value))
    if hardware.compute_efficiency > 1:
        raise ValueError('hardware {!r}: compute_efficiency is a fraction of '
                         'peak in (0, 1], got {!r}'.format(
                             hardware.name, hardware.compute_efficiency))
    if hardware.peer_scope != 'none' and not hardware.peer_bw > 0:
        raise ValueError('hardware {!r}: peer_bw must be positive when '
                         'peer_scope is {!r}, got {!r}'.format(
                             hardware.name, hardware.peer_scope,
                             hardware.peer_bw))
    if hardware.peer_bw < 0:
        raise ValueError('hardware {!r}: peer_bw must not be negative, got '
                         '{!r}'.format(hardware.name, hardware.peer_bw))
    non_negative = ('device_array_overhead_s', 'copy_latency_s',
                    'host_op_overhead_s',
                    'host_update_overhead_s', 'host_chunk_overhead_s',
                    'chunk_overhead_s', 'host_adam_overhead_s',
                    'function_forward_s', 'function_backward_s',
                    'kernel_launch_s', 'conv_half_flops')
    for field in non_negative:
        value = getattr(hardware, field)
        if not (isinstance(value, (int, float)) and value >= 0):
            raise ValueError('hardware {!r}: {} must be a time >= 0 seconds, '
                             'got {!r}'.format(hardware.name, field, value))
    counts = ('physical_devices', 'devices_per_socket', 'host_link_shared',
              'host_threads', 'host_servers', 'backward_kernels_per_call')
    for field in counts:
        value = getattr(hardware, field)
        if not (isinstance(value, int) and value >= 1):
            raise ValueError('hardware {!r}: {} must be an integer >= 1, got '
                             '{!r}'.format(hardware.name, field, value))
    if hardware.kind == 'cpu' and not (isinstance(hardware.cores, int)
                                       and hardware.cores >= 1):
        raise ValueError('hardware {!r}: a CPU preset needs cores >= 1, got '
                         '{!r}'.format(hardware.name, hardware.cores))


# --- IBM Power System S822LC for HPC ("Minsky"), the paper's machine -------
# Sources: IBM Redpaper REDP-5405 "IBM Power System S822LC for High
# Performance Computing Introduction and Technical Overview" (2016); NVIDIA
# "Tesla P100 data center accelerator" datasheet and the Pascal P100
# whitepaper (2016).
MINSKY = Hardware(
    name='minsky',
    description='IBM S822LC for HPC: 2 POWER8 + 4 P100 SXM2, NVLink 1.0',
    kind='gpu',
    physical_devices=4,
    # P100 SXM2: 10.6 TFLOP/s fp32 (NVIDIA P100 datasheet).
    peak_flops=10.6 * TFLOPS,
    # About half of peak: public tf_cnn_benchmarks runs train ResNet-50 at
    # about 220 images/s fp32 on a P100 SXM2 = 220 x 3 x 7.7 GFLOP = 5.1
    # TFLOP/s = 0.48 x peak. Chainer 7 with cuDNN is in the same range.
    # Taken as the large-layer rate; small layers pay conv_half_flops.
    compute_efficiency=0.5,
    # Half-performance layer size: an estimate, not a published figure: a
    # cuDNN convolution on a P100 has a fixed cost of a few kernel
    # launches and tail effects, tens of microseconds; 0.2 GFLOP is 38 us
    # at 0.5 x 10.6 TFLOP/s (a 3x3, 64-channel, 56x56 layer at batch 1 is
    # 0.23 GFLOP).
    conv_half_flops=0.2e9,
    # P100: 16 GB HBM2 at 732 GB/s (datasheet); elementwise kernels reach
    # about 75% of it.
    device_memory_bw=0.75 * 732 * GB,
    # Chainer dispatches one update kernel per parameter array from Python
    # (about 20 us of Python plus launch; an estimate, not a published value).
    device_array_overhead_s=20e-6,
    # REDP-5405: each POWER8 socket connects to two P100s; each GPU has two
    # NVLink 1.0 bricks to its CPU and two to the other GPU of its socket.
    devices_per_socket=2,
    # NVLink 1.0: 20 GB/s per direction per link (P100 whitepaper); two links
    # = 40 GB/s per direction. bandwidthTest on S822LC reports about 33-35
    # GB/s host<->device; 34 GB/s is used as the achieved figure.
    host_link_bw=34 * GB,
    host_link_shared=1,
    # cudaMemcpyAsync issue + DMA set-up: about 10 us per copy (typical
    # measured small-copy latency on P100 systems).
    copy_latency_s=10e-6,
    copy_engine_bw=34 * GB,
    peer_scope='socket',
    peer_bw=34 * GB,
    # REDP-5405: the two sockets are joined by the SMP X-bus at 38.4 GB/s.
    socket_link_bw=38.4 * GB,
    # REDP-5405: up to 115 GB/s sustained memory bandwidth per socket.
    host_memory_bw=115 * GB,
    # 2 x 10 POWER8 cores (REDP-5405, the 20-core configuration); one
    # reduce/update thread per core of socket 0.
    host_threads=10,
    # One POWER8 core streams about 10 GB/s (STREAM triad per core on POWER8
    # is 8-12 GB/s); an estimate.
    host_thread_bw=10 * GB,
    sources='IBM REDP-5405; NVIDIA P100 datasheet and whitepaper',
)

# --- 4 x P100 PCIe on a dual-socket x86 server -----------------------------
# Sources: NVIDIA Tesla P100 PCIe datasheet; PCI-SIG PCIe 3.0 (8 GT/s x 16
# lanes, 128b/130b = 15.75 GB/s per direction); Intel Xeon E5-2600 v4 product
# brief (4 x DDR4-2400 channels = 76.8 GB/s per socket; 2 QPI links at
# 9.6 GT/s = 19.2 GB/s per direction each).
PCIE3 = Hardware(
    name='pcie3',
    description='4 P100 PCIe on PCIe 3.0 x16, dual-socket Xeon E5 v4 host',
    kind='gpu',
    physical_devices=4,
    # P100 PCIe: 9.3 TFLOP/s fp32 (datasheet).
    peak_flops=9.3 * TFLOPS,
    # The same achieved fraction and half-performance size as the SXM2 part
    # (see MINSKY).
    compute_efficiency=0.5,
    conv_half_flops=0.2e9,
    # P100 PCIe 16 GB: 732 GB/s HBM2 (datasheet); 75% achieved.
    device_memory_bw=0.75 * 732 * GB,
    device_array_overhead_s=20e-6,
    # Two x16 slots per socket (40 lanes per E5 v4 socket).
    devices_per_socket=2,
    # PCIe 3.0 x16: 15.75 GB/s theoretical; about 12 GB/s with pinned memory
    # in practice (CUDA bandwidthTest).
    host_link_bw=12 * GB,
    host_link_shared=1,
    copy_latency_s=10e-6,
    copy_engine_bw=12 * GB,
    # Peer-to-peer over PCIe works between the GPUs of one root complex; a
    # copy between sockets is staged through host memory.
    peer_scope='pcie',
    peer_bw=12 * GB,
    # 2 QPI links x 19.2 GB/s per direction, about 70% achieved.
    socket_link_bw=0.7 * 2 * 19.2 * GB,
    # 76.8 GB/s peak per socket; STREAM reaches about 60 GB/s.
    host_memory_bw=60 * GB,
    # 14 cores per socket (E5-2680 v4); one update thread per core.
    host_threads=14,
    # One Broadwell core streams about 8 GB/s (STREAM per core); estimate.
    host_thread_bw=8 * GB,
    sources='NVIDIA P100 PCIe datasheet; PCI-SIG PCIe 3.0; Intel E5 v4',
)

# --- 4 x H100 SXM with PCIe Gen5 to the host, NVLink 4 between GPUs ---------
# Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM: 67 TFLOP/s fp32,
# 3.35 TB/s HBM3, NVLink 900 GB/s bidirectional = 450 GB/s per direction);
# PCI-SIG PCIe 5.0 (32 GT/s x 16 = 63 GB/s per direction); Intel Xeon
# Platinum 8480+ (8 x DDR5-4800 = 307 GB/s per socket, 4 UPI links at 16 GT/s).
H100_PCIE5 = Hardware(
    name='h100-pcie5',
    description='4 H100 SXM, PCIe Gen5 x16 to a dual Xeon 8480+, NVLink 4',
    kind='gpu',
    physical_devices=4,
    peak_flops=67 * TFLOPS,
    # Plain fp32 (no TF32 tensor cores assumed: Chainer 7 does not enable
    # them for cuBLAS); a fraction of 0.5 as for P100. On H100 small per-GPU
    # batches rarely fill the GPU, so this is optimistic for batch 16.
    compute_efficiency=0.5,
    # Half-performance size scaled from the P100's (see MINSKY) by the
    # FLOP rate (6.3x): the same fixed time per layer, about 30 us.
    conv_half_flops=1.0e9,
    device_memory_bw=0.75 * 3350 * GB,
    device_array_overhead_s=20e-6,
    devices_per_socket=2,
    # PCIe 5.0 x16: 63 GB/s theoretical, about 55 GB/s per direction in
    # practice (bandwidthTest on H100 SXM systems).
    host_link_bw=55 * GB,
    # Some chassis put two GPUs behind one PCIe switch uplink; set 2 then.
    host_link_shared=1,
    copy_latency_s=8e-6,
    copy_engine_bw=55 * GB,
    # HGX H100 boards connect every GPU pair (NVSwitch on 8-GPU boards); 450
    # GB/s per direction per GPU, about 80% achieved by cudaMemcpyPeer.
    peer_scope='all',
    peer_bw=0.8 * 450 * GB,
    # 4 UPI 2.0 links at 16 GT/s, about 32 GB/s per direction each
    # theoretical; about 70% achieved.
    socket_link_bw=0.7 * 4 * 32 * GB,
    # 307 GB/s peak per socket, STREAM about 240 GB/s.
    host_memory_bw=240 * GB,
    # 56 cores per socket; 28 threads reduce and update (half a socket, the
    # rest runs the data loader and the Python driver).
    host_threads=28,
    # One Sapphire Rapids core streams about 12 GB/s; estimate.
    host_thread_bw=12 * GB,
    sources='NVIDIA H100 datasheet; PCI-SIG PCIe 5.0; Intel Xeon 8480+',
)

# --- GH200 Grace Hopper superchips -----------------------------------------
# Sources: NVIDIA GH200 Grace Hopper Superchip datasheet (H100 with 67 TFLOP/s
# fp32 and 4 TB/s HBM3; NVLink-C2C 900 GB/s bidirectional = 450 GB/s per
# direction; LPDDR5X up to 480 GB at up to 500 GB/s; 72 Neoverse V2 cores);
# NVIDIA Grace CPU whitepaper.
GH200 = Hardware(
    name='gh200',
    description='GH200 superchips: H100 + Grace over NVLink-C2C, LPDDR5X',
    kind='gpu',
    physical_devices=4,
    peak_flops=67 * TFLOPS,
    compute_efficiency=0.5,
    conv_half_flops=1.0e9,  # as H100_PCIE5
    device_memory_bw=0.75 * 4000 * GB,
    device_array_overhead_s=20e-6,
    # One GPU per Grace; a 4-superchip node (e.g. quad GH200 blades) is the
    # physical configuration assumed.
    devices_per_socket=1,
    # NVLink-C2C: 450 GB/s per direction; host<->device copies reach about
    # 85% of it (published bandwidthTest results on GH200, about 380-420).
    host_link_bw=0.85 * 450 * GB,
    host_link_shared=1,
    copy_latency_s=8e-6,
    copy_engine_bw=0.85 * 450 * GB,
    # Quad-GH200 nodes link the Hoppers all-to-all with NVLink 4 (6 links,
    # 150 GB/s per direction, per pair); port bandwidth taken as that.
    peer_scope='all',
    peer_bw=0.8 * 150 * GB,
    # Grace-to-Grace traffic in a quad node also crosses NVLink between the
    # superchips: 150 GB/s per direction per pair, about 80% achieved; an
    # assumption about the node, not a datasheet figure.
    socket_link_bw=0.8 * 150 * GB,
    # LPDDR5X up to 500 GB/s (datasheet); STREAM on Grace about 400 GB/s.
    host_memory_bw=400 * GB,
    host_threads=36,
    # One Neoverse V2 core streams about 15 GB/s; estimate.
    host_thread_bw=15 * GB,
    sources='NVIDIA GH200 datasheet; NVIDIA Grace whitepaper',
)

GPU_PRESETS = {hw.name: hw for hw in (MINSKY, PCIE3, H100_PCIE5, GH200)}
CPU_PRESET = 'this-cpu'
PRESET_NAMES = tuple(GPU_PRESETS) + (CPU_PRESET,)


# --- Networks between nodes (multi-node predictions) ------------------------


@dataclasses.dataclass(frozen=True)
class Network:
    """The network that joins the nodes, as the multi-node cost model sees it.

    Every node has one port of this kind (one NIC, full duplex), the nodes
    are alike, and the switch between them is non-blocking (a fat tree), so
    in a ring all-reduce every node sends to one neighbour and receives from
    the other at the port's full bandwidth at once. A ring all-reduce of
    ``n`` bytes over ``R`` nodes takes ``2 (R - 1) / R x n / bandwidth +
    2 (R - 1) x latency_s``
    (:func:`cgdp_chainer.costmodel.ring_allreduce_seconds`).

    Args:
        name: Preset name.
        description: One line for humans.
        bandwidth: Bytes per second per direction of one node's port.
        latency_s: Seconds of one step of the ring (one message to the
            neighbour: the MPI small-message latency).
        sources: Where the numbers come from.
    """
    name: str
    description: str
    bandwidth: float
    latency_s: float
    sources: str = ''

    def __post_init__(self):
        validate_network(self)

    def replace(self, **changes):
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and not math.isnan(value)


def validate_network(network):
    """Checks a :class:`Network` for impossible values.

    Raises:
        ValueError: The bandwidth is not a finite number > 0 (bytes/s), or
            the latency not a finite number >= 0 (seconds); the message
            names the network and the field.
    """
    if not isinstance(network, Network):
        raise ValueError('a network is a hardware.Network or one of the '
                         'preset names {}, got {!r}'.format(
                             ', '.join(NETWORK_PRESETS), network))
    value = network.bandwidth
    if not (_is_number(value) and 0 < value < math.inf):
        raise ValueError('network {!r}: bandwidth must be a finite number of '
                         'bytes/s > 0 (per direction of one node\'s port), '
                         'got {!r}'.format(network.name, value))
    value = network.latency_s
    if not (_is_number(value) and 0 <= value < math.inf):
        raise ValueError('network {!r}: latency_s must be a finite time >= 0 '
                         'seconds, got {!r}'.format(network.name, value))


# InfiniBand EDR (4x): InfiniBand Trade Association, InfiniBand Architecture
# Specification and roadmap: 4 lanes x 25.78125 Gb/s signalling with 64b/66b
# encoding = 100 Gb/s of data per direction = 12.5 GB/s. MPI reaches about
# 95% of it on large messages (OSU micro-benchmarks osu_bw with MVAPICH2 on
# ConnectX-4 EDR), which the model does not charge. Latency: OSU osu_latency
# (MVAPICH2 / Open MPI, ConnectX-4 EDR) reports about 1 to 1.5 us for small
# messages; 1.2 us per ring step. The interconnect of the paper's era
# (Minsky clusters shipped with ConnectX-4/5 EDR).
IB_EDR = Network(
    name='ib-edr',
    description='InfiniBand EDR 4x, 100 Gb/s per direction',
    bandwidth=100e9 / 8,
    latency_s=1.2e-6,
    sources='IBTA InfiniBand roadmap (EDR 4x); OSU micro-benchmarks on '
            'ConnectX-4 EDR')

# InfiniBand HDR (4x): IBTA roadmap: 4 lanes x 50 Gb/s (PAM4) = 200 Gb/s of
# data per direction = 25 GB/s (NVIDIA ConnectX-6 and Quantum HDR product
# briefs). Latency: OSU osu_latency on ConnectX-6 HDR reports about 1 us for
# small messages (the adapter itself is quoted at under 0.6 us).
IB_HDR = Network(
    name='ib-hdr',
    description='InfiniBand HDR 4x, 200 Gb/s per direction',
    bandwidth=200e9 / 8,
    latency_s=1.0e-6,
    sources='IBTA InfiniBand roadmap (HDR 4x); NVIDIA ConnectX-6 product '
            'brief; OSU micro-benchmarks on ConnectX-6 HDR')

NETWORK_PRESETS = {net.name: net for net in (IB_EDR, IB_HDR)}
DEFAULT_NETWORK = IB_EDR.name


def get_network(name_or_network):
    """Resolves a network preset name (or passes a :class:`Network` through).

    Args:
        name_or_network (str or Network): ``'ib-edr'`` or ``'ib-hdr'``.

    Returns:
        Network: The network (checked).

    Raises:
        ValueError: The name is unknown (the message lists the presets), or
            the network has an impossible value.
    """
    if isinstance(name_or_network, Network):
        validate_network(name_or_network)
        return name_or_network
    if isinstance(name_or_network, str) and \
            name_or_network in NETWORK_PRESETS:
        return NETWORK_PRESETS[name_or_network]
    raise ValueError('unknown network preset {!r}; choose one of {}'.format(
        name_or_network, ', '.join(NETWORK_PRESETS)))


def available_cores():
    """Cores this process may run on (its affinity mask where known)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def this_cpu(profile):
    """The ``this-cpu`` preset: CPU replicas on this machine's cores.

    Compute times, copy bandwidth and the host accumulator's throughput come
    from the measured profile (see ``experiments.profile``), not from this
    object; it carries what the simulation needs about sharing: the replicas,
    their copies and the host threads all run on ``cores`` cores (of which
    this process got ``effective_cores`` while profiling), and, being
    threads of one process, share one interpreter lock (the simulation's
    ``gil`` resource; the profile gives each layer's share of it).

    Args:
        profile (dict): A profile measured on this machine with
            ``device == '@numpy'``.

    Returns:
        Hardware: The preset.

    Raises:
        ValueError: The profile was not measured on CPU replicas or lacks
            the copy and host measurements.
    """
    if profile is None:
        raise ValueError("preset 'this-cpu' needs a measured profile (run "
                         "python -m experiments.profile --device @numpy)")
    if profile.get('device') != '@numpy':
        raise ValueError("preset 'this-cpu' needs a profile measured on "
                         "'@numpy', got device {!r}".format(
                             profile.get('device')))
    for key in ('copy', 'host', 'machine'):
        if key not in profile:
            raise ValueError("preset 'this-cpu': the profile lacks its {!r} "
                             "section; measure it again with "
                             "experiments.profile".format(key))
    needed = ('reduce2', 'reduce_slot', 'update', 'addgrads', 'copyparams')
    ops = profile['host'].get('ops') or {}
    missing = [op for op in needed if op not in ops]
    if missing:
        raise ValueError("preset 'this-cpu': the profile lacks the host "
                         "costs {} (host.ops; an older profile?); measure it "
                         "again with experiments.profile".format(
                             ', '.join(missing)))
    copy = profile['copy']
    machine = profile['machine']
    cores = int(machine.get('cores', available_cores()))
    # Measured while profiling: other processes on the cores leave this
    # process less than all of them, and the replicas share what is left.
    effective = float(machine.get('effective_cores') or cores)
    bandwidth = float(copy['h2d_bytes_per_s'])
    return Hardware(
        name=CPU_PRESET,
        description='CPU replicas sharing {} core(s) of this machine'.format(
            cores),
        kind='cpu',
        physical_devices=max(1, cores),
        # Not used for compute (the profile has measured times), but
        # describes the machine: FLOP/s measured on the profiled layers.
        peak_flops=float(machine.get('achieved_flops', 1e10)) or 1e10,
        compute_efficiency=1.0,
        device_memory_bw=bandwidth,
        device_array_overhead_s=0.0,
        # One memory for every replica, however many there are.
        devices_per_socket=max(1024, cores),
        host_link_bw=bandwidth,
        host_link_shared=1,
        copy_latency_s=float(copy.get('latency_s', 0.0)),
        copy_engine_bw=bandwidth,
        peer_scope='none',
        peer_bw=0.0,
        socket_link_bw=bandwidth,
        host_memory_bw=float(copy.get('memory_bytes_per_s', 4 * bandwidth)),
        host_threads=int(profile['host'].get('threads', 1)),
        host_thread_bw=bandwidth,
        host_servers=int(profile['host'].get('threads', 1)),
        cores=cores,
        effective_cores=min(float(cores), max(0.25, effective)),
        host_chunk_overhead_s=float(profile['host'].get(
            'job_overhead_s', 50e-6)),
        sources='measured by experiments.profile on this machine',
    )


def get_hardware(name_or_hardware, profile=None):
    """Resolves a preset name (or passes a :class:`Hardware` through).

    Args:
        name_or_hardware (str or Hardware): ``'minsky'``, ``'pcie3'``,
            ``'h100-pcie5'``, ``'gh200'`` or ``'this-cpu'``.
        profile (dict): Needed for ``'this-cpu'``.

    Returns:
        Hardware: The preset.

    Raises:
        ValueError: The name is unknown (the message lists the presets).
    """
    if isinstance(name_or_hardware, Hardware):
        return name_or_hardware
    if name_or_hardware in GPU_PRESETS:
        return GPU_PRESETS[name_or_hardware]
    if name_or_hardware == CPU_PRESET:
        return this_cpu(profile)
    raise ValueError('unknown hardware preset {!r}; choose one of {}'.format(
        name_or_hardware, ', '.join(PRESET_NAMES)))
