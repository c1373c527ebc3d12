"""What the cost model takes in: checked arguments, profiles and the
per-layer workload one replica brings to one machine."""
import dataclasses
import json

from cgdp_chainer.costmodel import hardware as hardware_module

TYPICAL = 'typical'
CGDP = 'cgdp'
NCCL = 'nccl'

# How CGDP's replicas run: one process each (their Python runs in
# parallel) or threads of the user's process (their Python shares one
# interpreter lock with each other and with the host threads).
WORKERS = ('process', 'thread')
# Optimizers whose update the model costs (host rules measured by
# costmodel.profiler.measure_host_update; memory traffic per parameter
# byte in costs.UPDATE_TRAFFIC).
OPTIMIZERS = ('momentum_sgd', 'adam')
_OPTIMIZER_CLASSES = {'MomentumSGD': 'momentum_sgd', 'Adam': 'adam'}


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
            ``'ib-hdr'``) or a
            :class:`~cgdp_chainer.costmodel.hardware.Network`; ``None``
            means :data:`cgdp_chainer.costmodel.hardware.DEFAULT_NETWORK`.
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


def check_workers(workers):
    """Checks a worker kind.

    Raises:
        ValueError: ``workers`` is not one of :data:`WORKERS`.
    """
    if workers not in WORKERS:
        raise ValueError('workers must be one of {}, got {!r}'.format(
            ', '.join(repr(w) for w in WORKERS), workers))


def check_optimizer(optimizer):
    """The model's name of an optimizer.

    Args:
        optimizer (str or chainer.Optimizer): A name in :data:`OPTIMIZERS`
            or an optimizer instance (``MomentumSGD``, ``Adam``).

    Returns:
        str: The name.

    Raises:
        ValueError: Neither a known name nor a known optimizer.
    """
    if isinstance(optimizer, str):
        if optimizer in OPTIMIZERS:
            return optimizer
    else:
        name = _OPTIMIZER_CLASSES.get(type(optimizer).__name__)
        if name is not None:
            return name
    raise ValueError('optimizer must be one of {} (or a MomentumSGD or Adam '
                     'instance), got {!r}'.format(', '.join(OPTIMIZERS),
                                                  optimizer))


def check_chunk_size(chunk_size, n_layers):
    """Checks a chunking against the number of layers.

    A chunking is what the runtime forms: an int ``k`` (``chunk_size=k``,
    layers per chunk from the output end) or ``('bytes', n)``
    (``chunk_bytes=n``; the runtime's default is ``('bytes', 1 MiB)``).

    Raises:
        ValueError: ``chunk_size`` is neither an integer in
            ``1..n_layers`` nor ``('bytes', n)`` with a positive ``n``.
    """
    if isinstance(chunk_size, tuple) and len(chunk_size) == 2 and \
            chunk_size[0] == 'bytes' and isinstance(chunk_size[1], int) \
            and not isinstance(chunk_size[1], bool) and chunk_size[1] >= 1:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or \
            not 1 <= chunk_size <= n_layers:
        raise ValueError('chunk_size must be an integer from 1 to {} (the '
                         "number of layers) or ('bytes', n), got {!r}".format(
                             n_layers, chunk_size))


def plan_chunks(param_bytes, chunk_size):
    """The chunks the runtime forms, as layer ranges input side first.

    Mirrors :meth:`cgdp_chainer.runtime.replica.readiness.ChunkPlan.from_ready_order`
    on layers listed input side first (the reverse of its backward order).

    Args:
        param_bytes (list of int): Parameter bytes per layer, input side
            first.
        chunk_size (int or tuple): See :func:`check_chunk_size`.

    Returns:
        list of (int, int): ``(start, stop)`` layer ranges, input side first.
    """
    n = len(param_bytes)
    check_chunk_size(chunk_size, n)
    if isinstance(chunk_size, tuple):
        limit = chunk_size[1]
        starts = [0]  # in backward order: 0 is the output-side layer
        filled = 0
        for i in range(n):
            if filled >= limit:
                starts.append(i)
                filled = 0
            filled += param_bytes[n - 1 - i]
    else:
        starts = list(range(0, n, chunk_size))
    stops = starts[1:] + [n]
    return [(n - stop, n - start) for start, stop in zip(starts, stops)][::-1]


def describe_chunking(chunk_size):
    """How the runtime is asked for a chunking: ``chunk_size=k`` or
    ``chunk_bytes=n``."""
    if isinstance(chunk_size, tuple):
        return 'chunk_bytes={}'.format(chunk_size[1])
    return 'chunk_size={}'.format(chunk_size)


def check_common(workload, hardware, n_devices):
    """Checks the arguments every simulation and closed form takes.

    Raises:
        ValueError: Bad device count, impossible hardware or no layers.
    """
    check_n_devices(n_devices)
    hardware_module.validate(hardware)
    if workload.n_layers < 1:
        raise ValueError('the workload has no layers')


def check_gpu(hardware, what):
    """Raises ValueError unless ``hardware`` is a GPU machine."""
    if hardware.kind != 'gpu':
        raise ValueError('{} needs a GPU preset ({}), got {!r}'.format(
            what, ', '.join(hardware_module.GPU_PRESETS), hardware.name))


def load_profile(path):
    """Reads a profile JSON written by ``experiments.profile``."""
    with open(path) as f:
        return json.load(f)


def check_profile(profile):
    """Checks that a profile has what the model needs.

    Args:
        profile (dict): With a non-empty ``layers`` list; each layer has
            ``param_bytes`` and either measured ``forward_s`` and
            ``backward_s`` or ``forward_flops`` and ``backward_flops`` (per
            image).

    Raises:
        ValueError: A field is missing or negative.
    """
    if not isinstance(profile, dict) or not profile.get('layers'):
        raise ValueError('a profile is a dict with a non-empty "layers" list '
                         '(see experiments.profile or '
                         'costmodel.flops_profile)')
    for index, layer in enumerate(profile['layers']):
        has_times = 'forward_s' in layer and 'backward_s' in layer
        has_flops = 'forward_flops' in layer and 'backward_flops' in layer
        if not (has_times or has_flops):
            raise ValueError('layer {} of the profile has neither forward_s/'
                             'backward_s nor forward_flops/backward_flops'
                             .format(index))
        if 'param_bytes' not in layer:
            raise ValueError('layer {} of the profile lacks param_bytes'
                             .format(index))
        for key in ('forward_s', 'backward_s', 'forward_flops',
                    'backward_flops', 'param_bytes', 'param_arrays'):
            if key in layer and layer[key] is not None and layer[key] < 0:
                raise ValueError('layer {}: {} must not be negative, got '
                                 '{!r}'.format(index, key, layer[key]))


def flops_profile(net, image_size=224, n_classes=1000, cache_path=None,
                  progress=None):
    """A profile with per-layer function costs, no measured times.

    Args:
        net (str, chainer.Link or ProbedModel): A name in
            ``models.NETWORKS``, a network mapping images to class scores,
            or any model that passed
            :func:`cgdp_chainer.costmodel.samples.probe_model` (counted on
            its own input shape and loss; ``image_size`` and ``n_classes``
            do not apply).
        image_size (int): Input side in pixels.
        n_classes (int): Classifier outputs.
        cache_path (str or None): Cache file for named networks (see
            :func:`cgdp_chainer.costmodel.layers.cached_layer_costs`).
        progress (callable or None): ``progress(text)`` is told each
            counting stage of a probed model.

    Returns:
        dict: A profile for :func:`predict` and friends; a probed model's
        also has ``input_shape``, ``n_outputs`` and ``user_loss``.
    """
    from cgdp_chainer.costmodel import layers
    from cgdp_chainer.costmodel import samples
    if isinstance(net, samples.ProbedModel):
        shape = net.input_shape
        return {'net': net.name, 'device': None, 'batch': 1,
                'image_size': shape[-1] if len(shape) == 3 else None,
                'input_shape': list(shape), 'n_outputs': net.n_outputs,
                'user_loss': net.user_loss,
                'layers': layers.probed_layer_costs(net, progress)}
    records = layers.cached_layer_costs(net, image_size, n_classes=n_classes,
                                        cache_path=cache_path)
    return {'net': net if isinstance(net, str) else type(net).__name__,
            'device': None, 'batch': 1, 'image_size': image_size,
            'layers': records}


@dataclasses.dataclass
class Workload:
    """Costs of one replica at one batch on one machine, per layer.

    Attributes:
        forward_s, backward_s (list of float): Seconds per layer for one
            replica running alone (GPU) or with all cores (CPU); the loss
            belongs to the last layer.
        forward_1t_s, backward_1t_s (list of float or None): CPU replicas:
            the same with one BLAS thread (for core sharing).
        param_bytes, param_arrays (list of int): Per layer.
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
            Measured fixed cost of each chunk (the layer times exclude it);
            ``None``: the hardware's ``chunk_overhead_s`` applies.
        busy_cores (float or None): CPU replicas: cores one replica keeps
            busy with all BLAS threads (measured: CPU seconds per second of
            a whole pass); ``None``: estimated from the layer times.
        forward_gil_s, backward_gil_s (list of float or None): Host-side
            seconds per layer that hold the replica's interpreter lock: on
            CPU replicas its time outside BLAS (see
            :func:`layer_gil_seconds`), on GPUs the launch-bound host time
            of its function calls (see :func:`launch_seconds`); ``None``:
            not known, the lock is not modelled.
        optimizer (str): The optimizer whose update is costed (one of
            :data:`OPTIMIZERS`).
        host_update (dict or None): Measured host update rule costs
            (``per_array_s``, ``per_byte_s``) of ``optimizer``.
        host_fused (dict or None): Measured costs of the runtime's fused
            reduce and update of ``optimizer`` (``per_array_s``,
            ``per_byte_s``, ``per_slot_byte_s``), which CGDP's host jobs
            run where the profile has them (``per_array_s`` is measured per
            call on one-element arrays; CGDP makes one call per chunk, see
            ``costs.cgdp_chunk_calls``).
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
    optimizer: str = 'momentum_sgd'
    host_update: dict = None
    host_fused: dict = None
    measured: bool = False

    @property
    def n_layers(self):
        return len(self.forward_s)

    def update_op(self):
        """The measured host update rule costs of the optimizer
        (``per_array_s``, ``per_byte_s``), or ``None`` if not measured."""
        if self.host_update is not None:
            return self.host_update
        if self.optimizer == 'momentum_sgd' and self.host_ops and \
                'update' in self.host_ops:
            return self.host_ops['update']
        return None

    @property
    def total_bytes(self):
        return sum(self.param_bytes)

    @property
    def total_arrays(self):
        return sum(self.param_arrays)


def _uses_measured_times(profile, hardware):
    layers = profile['layers']
    has_times = all(s.get('forward_s') is not None
                    and s.get('backward_s') is not None for s in layers)
    if not has_times:
        return False
    if hardware.kind == 'cpu':
        return True
    return profile.get('hardware') == hardware.name


def layer_gil_seconds(seconds_1t, flops, blas_1t_flops):
    """Seconds of a layer that hold the GIL, from its one-thread time.

    A CPU replica's layer spends its time in two kinds of work: arithmetic
    (the convolution and linear layers' matrix products, which BLAS runs
    without the GIL) and everything else, which Chainer's Python drives one
    NumPy call at a time: the interpreter, NumPy's dispatch and the small
    arrays' copies, padding and element-wise passes, whose time at this
    size is mostly dispatch. The second part is taken to hold the GIL: the
    layer's one-thread time beyond its arithmetic at the single-thread
    matrix-product rate, ``max(0, t_1t - FLOPs / blas_1t_flops)``.

    Args:
        seconds_1t (float): The layer's time with one BLAS thread.
        flops (float): Its arithmetic (FLOPs of the whole batch).
        blas_1t_flops (float): FLOP/s of a matrix product on one thread
            (:func:`cgdp_chainer.costmodel.profiler.measure_blas_1t_flops`).

    Returns:
        float: Seconds.
    """
    return max(0.0, seconds_1t - flops / blas_1t_flops)


def _gil_times(profile, layers, scale, batch_per_device):
    """Per-layer GIL seconds of a measured CPU profile, or ``None`` when
    it lacks the one-thread times, the FLOPs or the BLAS rate."""
    rate = (profile.get('machine') or {}).get('blas_1t_flops')
    if not rate or rate <= 0:
        return None, None
    keys = ('forward_1t_s', 'backward_1t_s', 'forward_flops',
            'backward_flops')
    if not all(s.get(k) is not None for s in layers for k in keys):
        return None, None
    forward = [layer_gil_seconds(scale * s['forward_1t_s'],
                                 batch_per_device * blas_flops(s), rate)
               for s in layers]
    backward = [layer_gil_seconds(scale * s['backward_1t_s'],
                                  batch_per_device * blas_flops(s, True),
                                  rate)
                for s in layers]
    return forward, backward


def blas_flops(record, backward=False):
    """FLOPs per image of a layer's matrix products (what BLAS runs, outside
    the GIL): of its ``functions`` where the record lists them, else its
    ``forward_flops`` or ``backward_flops``."""
    key = 'backward_flops' if backward else 'forward_flops'
    functions = record.get('functions')
    if functions is None:
        return record[key]
    key = 'backward_flops' if backward else 'flops'
    return sum(f[key] for f in functions if f['kind'] == 'matmul')


def gpu_flops_seconds(flops_per_image, layers, batch, hardware):
    """Device seconds of a layer on a GPU preset from its FLOPs alone, for
    a profile record without per-function costs.

    Each of its ``layers`` matrix products runs at the efficiency
    ``compute_efficiency x W / (W + conv_half_flops)`` for its ``W`` FLOPs,
    so the layer takes ``(batch x FLOPs + layers x conv_half_flops) /
    achieved_flops``.

    Args:
        flops_per_image (float): The layer's FLOPs per image.
        layers (int): Its convolution and linear functions.
        batch (int): Images per replica.
        hardware (Hardware): The preset.

    Returns:
        float: Seconds.
    """
    work = batch * flops_per_image
    if work <= 0:
        return 0.0
    return (work + layers * hardware.conv_half_flops) / \
        hardware.achieved_flops


def gpu_function_seconds(function, batch, hardware, backward=False):
    """Device seconds of one function call on a GPU preset.

    The longest of its arithmetic, its memory traffic and one kernel
    launch: ``max(FLOPs / rate, bytes / device_memory_bw,
    kernel_launch_s)``, where a matrix product of ``W`` FLOPs runs at
    ``compute_efficiency x W / (W + conv_half_flops)`` of peak (so takes
    ``(W + conv_half_flops) / achieved_flops``) and anything else at the
    preset's ``compute_efficiency``: memory-bound functions (batch
    normalization, activations, element-wise arithmetic) are priced by
    their bytes, not their FLOPs.

    Args:
        function (dict): A record of the profile's ``functions`` (per
            image, see :func:`cgdp_chainer.costmodel.layers.function_records`).
        batch (int): Images per replica.
        hardware (Hardware): The preset.
        backward (bool): The call's backward instead of its forward.

    Returns:
        float: Seconds.
    """
    prefix = 'backward_' if backward else ''
    flops = batch * function[prefix + 'flops']
    moved = batch * function[prefix + 'bytes'] + function['param_bytes'] * (
        2 if backward else 1)
    if flops <= 0 and moved <= 0:
        return 0.0
    if function['kind'] == 'matmul' and flops > 0:
        compute = (flops + hardware.conv_half_flops) / hardware.achieved_flops
    else:
        compute = flops / hardware.achieved_flops
    return max(compute, moved / hardware.device_memory_bw,
               hardware.kernel_launch_s)


def gpu_layer_seconds(record, batch, hardware, backward=False):
    """Device seconds of a layer on a GPU preset: the sum of its functions'
    (:func:`gpu_function_seconds`), or from its FLOPs alone
    (:func:`gpu_flops_seconds`) for a record without ``functions``."""
    functions = record.get('functions')
    if functions is None:
        key = 'backward_flops' if backward else 'forward_flops'
        return gpu_flops_seconds(record[key], record.get('counted_layers', 0),
                                 batch, hardware)
    return sum(gpu_function_seconds(f, batch, hardware, backward)
               for f in functions)


def launch_seconds(calls, hardware, backward_calls=None):
    """Host-side seconds to issue a layer's function calls on a GPU.

    ``calls x (function_forward_s + kernel_launch_s)`` in the forward and
    ``backward_calls x (function_backward_s + backward_kernels_per_call x
    kernel_launch_s)`` in the backward.

    Args:
        calls (int): Function calls in the forward.
        hardware (Hardware): The machine.
        backward_calls (int or None): In the backward (measured profiles
            count them); ``None``: one per forward call.

    Returns:
        tuple: ``(forward seconds, backward seconds)``.
    """
    if backward_calls is None:
        backward_calls = calls
    forward = calls * (hardware.function_forward_s
                       + hardware.kernel_launch_s)
    backward = backward_calls * (hardware.function_backward_s
                                 + hardware.backward_kernels_per_call
                                 * hardware.kernel_launch_s)
    return forward, backward


def _launch_times(layers, hardware):
    """Per-layer host-side seconds on a GPU, or ``None`` when the profile
    has no function counts."""
    if not all(s.get('forward_calls') is not None for s in layers):
        return None, None
    pairs = [launch_seconds(s['forward_calls'], hardware,
                            s.get('backward_calls')) for s in layers]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _host_update(profile, optimizer, measured):
    """The measured host update rule costs of ``optimizer``, if any."""
    if not measured:
        return None
    host = profile.get('host') or {}
    rules = host.get('update_rules') or {}
    if optimizer in rules:
        return rules[optimizer]
    ops = host.get('ops') or {}
    if optimizer == 'momentum_sgd' and 'update' in ops:
        return ops['update']
    if ops:
        raise ValueError('the profile has no measured {} host update '
                         '(host.update_rules; an older profile?): measure '
                         'it again with experiments.profile'.format(
                             optimizer))
    return None


def build_workload(profile, hardware, batch_per_device,
                   optimizer='momentum_sgd'):
    """Turns a profile into per-layer seconds and bytes for one machine.

    Measured times are used where the profile was measured on this hardware
    (``this-cpu``, or a profile whose ``hardware`` field names the preset)
    and scaled linearly from the profile's batch; otherwise compute time is
    ``FLOPs x batch / hardware.achieved_flops``. CPU profiles with
    one-thread times, FLOPs and the machine's ``blas_1t_flops`` also give
    each layer's GIL seconds (:func:`layer_gil_seconds`). On GPUs a
    layer's time is at least its host-side time (:func:`launch_seconds`,
    from the profile's function counts), which is also what holds the
    replica's interpreter lock; presets compute with
    :func:`gpu_flops_seconds`.

    Args:
        profile (dict): See :func:`check_profile`.
        hardware (Hardware): The machine.
        batch_per_device (int): Images per replica.
        optimizer (str or chainer.Optimizer): See :func:`check_optimizer`.

    Returns:
        Workload: The costs.

    Raises:
        ValueError: The profile lacks what the hardware needs (a CPU preset
            needs measured times).
    """
    check_profile(profile)
    check_batch(batch_per_device)
    optimizer = check_optimizer(optimizer)
    layers = profile['layers']
    measured = _uses_measured_times(profile, hardware)
    if hardware.kind == 'cpu' and not measured:
        raise ValueError("preset {!r} needs a profile with measured "
                         "forward_s/backward_s (experiments.profile)".format(
                             hardware.name))
    if measured:
        times = _measured_layer_times(profile, hardware, batch_per_device)
    else:
        times = _preset_layer_times(layers, hardware, batch_per_device)
    if hardware.kind == 'gpu':
        _add_launch_times(times, layers, hardware)
    return Workload(
        param_bytes=[int(s['param_bytes']) for s in layers],
        param_arrays=[int(s.get('param_arrays', 1 if s['param_bytes'] else 0))
                      for s in layers],
        optimizer=optimizer, measured=measured,
        **times, **_measured_host_costs(profile, hardware, optimizer,
                                        measured))


def _measured_layer_times(profile, hardware, batch):
    """Per-layer seconds of a profile measured on ``hardware``, scaled
    linearly from the profile's batch.

    Args:
        profile (dict): The profile.
        hardware (Hardware): The machine it was measured on.
        batch (int): Images per replica.

    Returns:
        dict: :class:`Workload`'s ``forward_s``, ``backward_s``,
        ``forward_1t_s``, ``backward_1t_s`` (``None`` unless every layer
        has one-thread times), ``forward_gil_s`` and ``backward_gil_s``
        (CPUs; see :func:`layer_gil_seconds`).
    """
    layers = profile['layers']
    scale = batch / float(profile.get('batch') or 1)
    times = {'forward_s': [scale * s['forward_s'] for s in layers],
             'backward_s': [scale * s['backward_s'] for s in layers],
             'forward_1t_s': None, 'backward_1t_s': None,
             'forward_gil_s': None, 'backward_gil_s': None}
    if all(s.get('forward_1t_s') is not None for s in layers):
        times['forward_1t_s'] = [scale * s['forward_1t_s'] for s in layers]
        times['backward_1t_s'] = [scale * s['backward_1t_s'] for s in layers]
    if hardware.kind == 'cpu':
        times['forward_gil_s'], times['backward_gil_s'] = _gil_times(
            profile, layers, scale, batch)
    return times


def _preset_layer_times(layers, hardware, batch):
    """Per-layer seconds on a GPU preset, from the layers' function costs
    (:func:`gpu_layer_seconds`).

    Args:
        layers (list of dict): The profile's layers.
        hardware (Hardware): The preset.
        batch (int): Images per replica.

    Returns:
        dict: As :func:`_measured_layer_times` (no one-thread or GIL
        times).

    Raises:
        ValueError: The layers have no FLOPs.
    """
    if not all(s.get('forward_flops') is not None
               and s.get('backward_flops') is not None for s in layers):
        raise ValueError(
            'preset {!r} has no measured times in this profile and the '
            'profile has no forward_flops/backward_flops to compute them '
            'from (see costmodel.flops_profile)'.format(hardware.name))
    return {'forward_s': [gpu_layer_seconds(s, batch, hardware)
                          for s in layers],
            'backward_s': [gpu_layer_seconds(s, batch, hardware,
                                             backward=True) for s in layers],
            'forward_1t_s': None, 'backward_1t_s': None,
            'forward_gil_s': None, 'backward_gil_s': None}


def _add_launch_times(times, layers, hardware):
    """On a GPU: sets the layers' host-side seconds (which hold the
    replica's interpreter lock) as their GIL times in ``times``, and makes
    them the least each layer takes (the device cannot run a layer faster
    than the host issues it)."""
    forward_gil, backward_gil = _launch_times(layers, hardware)
    times['forward_gil_s'], times['backward_gil_s'] = forward_gil, \
        backward_gil
    if forward_gil is not None:
        times['forward_s'] = [max(t, h) for t, h in zip(times['forward_s'],
                                                        forward_gil)]
        times['backward_s'] = [max(t, h) for t, h in
                               zip(times['backward_s'], backward_gil)]


def _measured_host_costs(profile, hardware, optimizer, measured):
    """The host's, copies' and chunks' measured costs that
    :class:`Workload` takes, all ``None`` where the profile was not
    measured on ``hardware``.

    Args:
        profile (dict): The profile.
        hardware (Hardware): The machine.
        optimizer (str): The optimizer's name.
        measured (bool): Whether the profile was measured on ``hardware``.

    Returns:
        dict: Keyword arguments of :class:`Workload`.
    """
    host_ops = profile.get('host', {}).get('ops') if measured else None
    copy = profile.get('copy') if measured else None
    device_update = profile.get('device_update_s') if measured else None
    overhead = profile.get('chunk_overhead') if measured else None
    overhead = overhead or {}
    busy_cores = None
    if measured and hardware.kind == 'cpu':
        busy_cores = (profile.get('whole') or {}).get('busy_cores')
    return dict(
        host_ops=host_ops, copy=copy, device_update_s=device_update,
        chunk_forward_overhead_s=overhead.get('forward_s'),
        chunk_backward_overhead_s=overhead.get('backward_s'),
        busy_cores=busy_cores,
        host_update=_host_update(profile, optimizer, measured),
        host_fused=((profile.get('host') or {}).get('fused') or {}).get(
            optimizer) if measured else None)
