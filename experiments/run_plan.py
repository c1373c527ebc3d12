"""The plan of a weak-scaling run: what runs, with which settings, checked.

:func:`make_plan` turns the command line into a :class:`Plan` and refuses
bad input before any mode runs (exit status 2, one ``error:`` line, see
:func:`experiments.cli.fail`): too many GPUs, an image too small for a
network, a chunk size larger than a network's layers, a run in which no
mode can run (nothing to measure), or an ``--out`` that cannot be written.
It also holds the defaults of a run on GPUs and on CPU replicas
(:data:`GPU_DEFAULTS`, :data:`CPU_DEFAULTS`) and the estimate of a CPU
run's time that those defaults were chosen by (:func:`estimate_seconds`).
"""
import argparse
import collections
import os
import tempfile

from cgdp_chainer import devices as devices_module
from experiments import cli
from experiments import modes as modes_module
from experiments import results
from experiments import train
from experiments.progress import minutes
import models

ALL = results.ALL_NETS
DEFAULT_DEVICE_COUNTS = (1, 2, 4)
DEFAULT_OUT = 'results'

# Budget of the CPU defaults: `make experiment NET=resnet152` without a GPU
# must finish within 15 minutes on a 2-core machine (set-up excluded).
CPU_BUDGET_SECONDS = 15 * 60

# Forward + backward seconds per image of each network on one '@numpy'
# replica at 64 px, measured on the project's 2-core AMD EPYC machine with
# batch 4 (ResNet-152: 0.55 s per batch). Only used to estimate run times.
CPU_SECONDS_PER_IMAGE_64PX = {
    'alexnet': 0.035,
    'googlenet': 0.038,
    'vgg16': 0.20,
    'resnet152': 0.14,
}

# What an iteration costs beyond forward + backward on CPU replicas: the
# gradient reduction, the optimizer update and the parameter copies (about
# 30% for ResNet-152; more for VGG-16's 138M parameters).
CPU_OVERHEAD_FACTOR = {
    'alexnet': 1.6,
    'googlenet': 1.3,
    'vgg16': 1.6,
    'resnet152': 1.3,
}

# Seconds to build a model and its replicas, per run, on the CPU.
CPU_SETUP_SECONDS = {'alexnet': 3, 'googlenet': 2, 'vgg16': 8,
                     'resnet152': 6}

Settings = collections.namedtuple(
    'Settings', ('image_size', 'batch', 'iterations', 'warmup'))

# Defaults on GPUs: the paper's ImageNet set-up (224 px, the classifiers'
# native size) and a batch of 32 per GPU.
GPU_DEFAULTS = {net: Settings(image_size=224, batch=32, iterations=50,
                              warmup=10) for net in models.NETWORKS}

# Defaults on CPU replicas. 64 px is the smallest size every network takes
# with real feature maps (models.common.MIN_IMAGE_SIZE); a batch of 4 per
# replica keeps a ResNet-152 iteration at N=4 near 3 s on 2 cores; the
# iteration counts make each network's run fit CPU_BUDGET_SECONDS (see
# estimate_seconds) with room for a busy machine. Checked: the ResNet-152
# defaults (estimated 4.5 min idle) took 5 min 5 s of wall time on the
# 2-core machine at a load average of about 4.5.
CPU_DEFAULTS = {
    'alexnet': Settings(image_size=64, batch=4, iterations=30, warmup=3),
    'googlenet': Settings(image_size=64, batch=4, iterations=30, warmup=3),
    'vgg16': Settings(image_size=64, batch=4, iterations=16, warmup=3),
    'resnet152': Settings(image_size=64, batch=4, iterations=20, warmup=3),
}

# A module:callable network (models.custom): the GPU settings of the four;
# on CPU replicas ResNet-152's, whose time is not estimated for such a
# model (its cost is unknown before it runs).
ANY_NET_DEFAULTS = {'gpu': Settings(image_size=224, batch=32, iterations=50,
                                    warmup=10),
                    'cpu': CPU_DEFAULTS['resnet152']}
# Seconds per image that weigh a module:callable network's progress-bar
# steps (one network per run, so only the ratios between its steps count).
ANY_NET_SECONDS_PER_IMAGE_64PX = 0.1

NetPlan = collections.namedtuple('NetPlan', ('net', 'settings', 'reason'))
NetPlan.__doc__ = """One network's part of a run.

Attributes:
    net (str): The network.
    settings (Settings): Its image size, batch and iteration counts.
    reason (str): Why that image size (for the plan and env.json).
"""

Plan = collections.namedtuple(
    'Plan', ('nets', 'kind', 'counts', 'modes', 'notes', 'cpu_defaults'))
Plan.__doc__ = """A checked run (see :func:`make_plan`).

Attributes:
    nets (list of NetPlan): The networks, in order.
    kind (str): ``'gpu'`` or ``'cpu'`` replicas.
    counts (list of int): The device counts N, ascending.
    modes (list of str): The requested modes (some may be skipped at
        some N, see :func:`skipped_runs`).
    notes (list of str): Lines about the choice of devices.
    cpu_defaults (bool): Whether a CPU run takes some of the batch and
        iteration counts from :data:`CPU_DEFAULTS`.
"""


# ------------------------------------------------------ command-line types

def device_counts(text):
    """argparse type: device counts such as ``1,2,4``.

    Args:
        text (str): Comma-separated positive integers.

    Returns:
        list of int: Distinct counts, ascending.

    Raises:
        argparse.ArgumentTypeError: An item is not a positive integer.
    """
    counts = []
    for item in text.split(','):
        try:
            counts.append(cli.positive_int(item.strip()))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                'takes positive device counts such as 1,2,4, got {!r}'.format(
                    text))
    return sorted(set(counts))


def net_or_all(text):
    """argparse type: a network name, ``module:callable``, or ``all``.

    Args:
        text (str): The argument as typed.
    """
    if text == ALL:
        return text
    try:
        return cli.net_spec(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError('{} (or {})'.format(error, ALL))


# ------------------------------------------------------------- the devices

def device_specs_for(kind, count, world=None):
    """The device specifiers of ``count`` replicas of ``kind``.

    Args:
        kind (str): ``'gpu'`` (GPUs 0 to count - 1) or ``'cpu'``.
        count (int): Number of replicas.
        world (World or None): Under MPI, ranks that share a machine take
            distinct GPUs: local rank L takes ``L x count`` onwards.
    """
    if kind == 'gpu':
        first = 0 if world is None else world.local_rank * count
        return ['@cupy:{}'.format(first + i) for i in range(count)]
    return devices_module.numpy_devices(count)


def device_kind_name(kind):
    """``CPU replicas (@numpy)`` or the GPU's model, for figure titles.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
    """
    if kind == 'cpu':
        return 'CPU replicas (@numpy)'
    device = devices_module.parse_devices(['@cupy:0'])[0]
    return devices_module.describe(device).replace(' (@cupy:0)', '')


def cudnn_note(enabled):
    """The plan's line where Chainer runs on GPUs without cuDNN (None
    where cuDNN is on, or for no GPU run).

    Args:
        enabled (bool or None): As ``devices.cudnn_enabled`` returns it.
    """
    if enabled is not False:
        return None
    return ('note: cuDNN is off (CuPy 14 has none; or CHAINER_CUDNN=0): '
            'convolutions, pooling and BatchNorm run on Chainer\'s own '
            'kernels, so the times are not those of a cuDNN set-up')


def resolve_devices(args, world=None):
    """The replica kind and the device counts to run, checked.

    Under MPI the ranks on one machine share its GPUs: each takes its own
    N of them (see :func:`device_specs_for`).

    Args:
        args (argparse.Namespace): The parsed command line.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        tuple: ``(kind, counts, notes)``: ``'gpu'`` or ``'cpu'``, the
        ascending device counts, and lines to print about the choice.
    """
    n_gpus = devices_module.gpu_count()
    kind = args.device_kind
    if kind == 'auto':
        kind = 'gpu' if n_gpus > 0 else 'cpu'
    notes = []
    # Ranks on this machine share its GPUs.
    sharing = 1 if world is None else world.local_size
    if kind == 'gpu' and sharing > 1:
        notes.append('note: {} ranks share this machine\'s {} GPU(s): each '
                     'rank takes its own N'.format(sharing, n_gpus))
        n_gpus //= sharing
    counts = args.devices
    if kind == 'gpu':
        if counts is None:
            counts = [n for n in DEFAULT_DEVICE_COUNTS if n <= n_gpus]
            dropped = [n for n in DEFAULT_DEVICE_COUNTS if n > n_gpus]
            if dropped and counts:
                notes.append('note: N={} skipped: this machine has {} '
                             'GPU(s)'.format(
                                 ','.join(map(str, dropped)), n_gpus))
        if not counts or max(counts) > n_gpus:
            cli.fail('asked for {} GPU(s), but this machine has {} GPU(s) '
                     '(as CuPy sees them){}{}'.format(
                         max(counts or [1]), n_gpus * sharing,
                         '' if sharing == 1 else
                         ', {} for each of its {} ranks'.format(n_gpus,
                                                                sharing),
                         '' if n_gpus else "; use --device-kind cpu for "
                                           "'@numpy' replicas"))
        note = cudnn_note(devices_module.cudnn_enabled())
        if note:
            notes.append(note)
    else:
        if counts is None:
            counts = list(DEFAULT_DEVICE_COUNTS)
        if n_gpus > 0:
            notes.append('note: running CPU replicas although {} GPU(s) are '
                         'present (--device-kind cpu)'.format(n_gpus))
    return kind, counts, notes


def skipped_runs(kind, counts, modes, world=None):
    """The (mode, count) pairs that cannot run, grouped for one message.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
        counts (list of int): The device counts.
        modes (list of str): The requested modes.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        dict: ``(mode, reason) -> [counts]``, in mode order.
    """
    skipped = collections.OrderedDict()
    for mode in modes:
        for count in counts:
            reason = modes_module.MODES[mode].skip_reason(
                device_specs_for(kind, count), world)
            if reason:
                skipped.setdefault((mode, reason), []).append(count)
    return skipped


def runnable_modes(kind, counts, modes, world=None):
    """The modes of ``modes`` that run at one of ``counts`` at least.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
        counts (list of int): The device counts.
        modes (iterable of str): Mode names.
        world (World or None): The MPI ranks; None in a single process.
    """
    return [mode for mode in modes if any(
        not modes_module.MODES[mode].skip_reason(
            device_specs_for(kind, count), world) for count in counts)]


# ------------------------------------------------------------ the settings

def settings_for(net, kind, args):
    """The image size, batch and iteration counts of one network's run.

    Command-line values win over the defaults of :data:`GPU_DEFAULTS` and
    :data:`CPU_DEFAULTS`.

    Args:
        net (str): The network.
        kind (str): ``'gpu'`` or ``'cpu'``.
        args (argparse.Namespace): The parsed command line.

    Returns:
        tuple: ``(Settings, image_size_reason)``.
    """
    defaults = defaults_for(net, kind)
    settings = Settings(
        image_size=args.image_size or defaults.image_size,
        batch=args.batch or defaults.batch,
        iterations=args.iterations or defaults.iterations,
        warmup=defaults.warmup if args.warmup is None else args.warmup)
    if args.image_size is not None:
        reason = 'given with --image-size'
    elif kind == 'gpu':
        reason = ('default on GPUs: 224 px, the ImageNet size of the '
                  'paper\'s experiments')
    elif models.is_custom(net):
        reason = ('default on CPU replicas for a module:callable model: {} '
                  'px, as for the four networks'.format(defaults.image_size))
    else:
        reason = ('default on CPU replicas: {} px instead of the paper\'s '
                  '224 px (about {:.0f}x less work per image), so that the '
                  'default run fits {:.0f} minutes on a 2-core CPU; {} px is '
                  'the smallest size every network takes').format(
                      defaults.image_size, (224.0 / defaults.image_size) ** 2,
                      CPU_BUDGET_SECONDS / 60.0,
                      models.min_image_size(net))
    return settings, reason


def defaults_for(net, kind):
    """The default settings of a network's run.

    Args:
        net (str): A name in ``models.NETWORKS`` or ``module:callable``.
        kind (str): ``'gpu'`` or ``'cpu'``.

    Returns:
        Settings: From :data:`GPU_DEFAULTS` or :data:`CPU_DEFAULTS`, or
        :data:`ANY_NET_DEFAULTS` for a ``module:callable``.
    """
    if models.is_custom(net):
        return ANY_NET_DEFAULTS[kind]
    return (GPU_DEFAULTS if kind == 'gpu' else CPU_DEFAULTS)[net]


def estimate_seconds(net, settings, counts, modes, kind, world=None):
    """Rough run time of one network's experiment on CPU replicas.

    An iteration with N replicas costs about N x batch x seconds per image
    (typical runs the replicas one after the other; CGDP's threads share
    the same cores), times the network's overhead factor; each run adds
    the time to build the model and its replicas. Ranks on one machine
    share its cores, which multiplies the time by their number.

    Args:
        net (str): The network.
        settings (Settings): Image size, batch and iteration counts.
        counts (list of int): The device counts.
        modes (list of str): The requested modes (skipped ones cost nothing).
        kind (str): ``'gpu'`` or ``'cpu'``.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        float or None: Seconds, or None on GPUs and for a
        ``module:callable`` (not estimated).
    """
    if kind != 'cpu' or models.is_custom(net):
        return None
    per_image = (CPU_SECONDS_PER_IMAGE_64PX[net]
                 * (settings.image_size / 64.0) ** 2
                 * CPU_OVERHEAD_FACTOR[net])
    sharing = 1 if world is None else world.local_size
    total = 0.0
    for count in counts:
        for mode in modes:
            if modes_module.MODES[mode].skip_reason(
                    device_specs_for(kind, count), world):
                continue
            total += ((settings.warmup + settings.iterations)
                      * count * settings.batch * per_image * sharing)
            total += CPU_SETUP_SECONDS[net]
    return total


def iteration_cost(net, settings, count, kind):
    """Relative cost of one iteration, to weigh the progress bar's steps.

    Args:
        net (str): The network.
        settings (Settings): Its image size and batch.
        count (int): Replicas.
        kind (str): ``'gpu'`` or ``'cpu'``.
    """
    cost = (CPU_SECONDS_PER_IMAGE_64PX.get(
        net, ANY_NET_SECONDS_PER_IMAGE_64PX) * settings.batch
            * (settings.image_size / 64.0) ** 2)
    # On the CPU the replicas share the cores, so N replicas take N times
    # as long; GPUs run side by side.
    return cost * count if kind == 'cpu' else cost


def total_weight(plan, world=None):
    """Sum of the progress bar's steps over the whole plan.

    Args:
        plan (Plan): The run.
        world (World or None): The MPI ranks; None in a single process.
    """
    total = 0.0
    for net_plan in plan.nets:
        settings = net_plan.settings
        for count in plan.counts:
            runnable = runnable_modes(plan.kind, [count], plan.modes, world)
            total += (len(runnable) * (settings.warmup + settings.iterations)
                      * iteration_cost(net_plan.net, settings, count,
                                       plan.kind))
    return total


# ---------------------------------------------------------------- checking

def check_measurable(kind, counts, modes, world=None):
    """Fails (exit 2) when no requested mode runs at any device count.

    Args:
        kind (str): ``'gpu'`` or ``'cpu'``.
        counts (list of int): The device counts.
        modes (list of str): The requested modes.
        world (World or None): The MPI ranks; None in a single process.
    """
    if runnable_modes(kind, counts, modes, world):
        return
    why = '; '.join('{} at N={}: {}'.format(
        mode, ','.join(map(str, skipped)), reason)
        for (mode, reason), skipped in skipped_runs(
            kind, counts, modes, world).items())
    choices = runnable_modes(kind, counts, modes_module.MODES, world)
    cli.fail('nothing to measure: {}; with --devices {} here, --modes can '
             'be {}'.format(why, ','.join(map(str, counts)),
                            ', '.join(choices) or '(none)'))


def layer_count(net):
    """The layers of a network as CGDP's ``chunk_size`` counts them: the
    links that own parameters (:func:`cgdp_chainer.runtime.replica.readiness.
    owner_of`), so the largest chunk size it takes.

    Builds the network once, on the CPU with one class: up to a few
    seconds (VGG-16), so it is asked only for an integer chunk size.

    Args:
        net (str): The network.
    """
    from cgdp_chainer.runtime.replica import readiness
    return readiness.count_layers(train.build_model(net, n_classes=1))


def check_chunk_size(net, chunk_size):
    """Fails (exit 2) if an integer chunk size exceeds the net's layers.

    Args:
        net (str): The network.
        chunk_size (int, str or None): ``--chunk-size``.
    """
    if not isinstance(chunk_size, int):
        return
    cli.check_chunk_size(chunk_size, net, layer_count(net))


def check_out(out, nets):
    """Fails (exit 2) unless run folders can be written under ``out``.

    Creates ``out`` (the results root) if it is missing and writes a
    temporary file in it, so a path that is a file, lies under a file, or
    cannot be written is refused before anything runs.

    Args:
        out (str): ``--out``.
        nets (list of str): The networks, whose folders go under it.
    """
    if os.path.exists(out) and not os.path.isdir(out):
        cli.fail('--out {} is a file; give the folder that results go to '
                 '(default {})'.format(out, DEFAULT_OUT))
    for net in nets:
        path = os.path.join(out, net)
        if os.path.exists(path) and not os.path.isdir(path):
            cli.fail('--out {}: {} is a file, where the {} runs go; give '
                     'another folder'.format(out, path, net))
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        cli.fail('--out {}: cannot write there ({}); give a folder that '
                 'can be written'.format(out, error.strerror or error))


def make_plan(args, world=None, root=True):
    """The checked plan of a run; bad input ends it with status 2.

    Every check is made here, before any mode runs: the devices, each
    network's image size (a ``module:callable`` is built and probed, see
    :func:`experiments.cli.check_net`) and chunk size, that something can
    be measured, and (last, as it creates the results root) that ``--out``
    can be written.

    Args:
        args (argparse.Namespace): The parsed command line.
        world (World or None): The MPI ranks; None in a single process.
        root (bool): Whether this process writes the files (it probes
            ``--out``).

    Returns:
        Plan: The run.
    """
    modes = args.modes or modes_module.default_modes(world)
    names = list(models.NETWORKS) if args.net == ALL else [args.net]
    kind, counts, notes = resolve_devices(args, world)
    check_measurable(kind, counts, modes, world)
    nets = []
    for net in names:
        settings, reason = settings_for(net, kind, args)
        cli.check_net(net, args.classes, settings.image_size)
        if 'cgdp' in runnable_modes(kind, counts, modes, world):
            check_chunk_size(net, args.chunk_size)
        nets.append(NetPlan(net, settings, reason))
    if root:
        check_out(args.out, names + ([ALL] if len(names) > 1 else []))
    cpu_defaults = kind == 'cpu' and None in (args.batch, args.iterations,
                                              args.warmup)
    return Plan(nets, kind, counts, modes, notes, cpu_defaults)


def describe(plan, world=None):
    """The lines that announce a plan: skips, then each network's run.

    Args:
        plan (Plan): The run.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        list of str: The lines.
    """
    lines = list(plan.notes)
    if world is not None:
        hosts = sorted(set(world.hosts))
        lines.append(
            'MPI: {} ranks on {} machine(s) ({}); N devices per rank, so the '
            'global batch is R x N x batch; an iteration\'s time is the '
            'maximum over the ranks; rank 0 writes the files'.format(
                world.size, len(hosts), ', '.join(hosts)))
        lines.append('  single-process rows (typical, nccl) are not measured '
                     'under MPI: they come from a plain make experiment (no '
                     'RANKS)')
    for (mode, reason), skipped in skipped_runs(
            plan.kind, plan.counts, plan.modes, world).items():
        lines.append('skip: {} at N={}: {}'.format(
            mode, ','.join(map(str, skipped)), reason))
    runnable = runnable_modes(plan.kind, plan.counts, plan.modes, world)
    total = 0.0
    for net, settings, reason in plan.nets:
        estimate = estimate_seconds(net, settings, plan.counts, plan.modes,
                                    plan.kind, world)
        lines.append(
            'plan: {} on {}: {}N = {}; modes {}; {} px, batch {}/device, {} '
            'warm-up + {} measured iterations{}'.format(
                net, device_kind_name(plan.kind),
                '' if world is None else 'R = {} ranks, '.format(world.size),
                ','.join(map(str, plan.counts)), ', '.join(runnable),
                settings.image_size, settings.batch, settings.warmup,
                settings.iterations,
                '' if estimate is None else
                '; estimated {} (m:ss) on 2 idle cores'.format(
                    minutes(estimate))))
        lines.append('  image size: {}'.format(reason))
        if plan.cpu_defaults:
            lines.append(
                '  why these defaults: no GPU, so the replicas share {} CPU '
                'core(s); a small batch per replica and few iterations keep '
                'the run within about {:.0f} minutes on a 2-core '
                'machine'.format(os.cpu_count(), CPU_BUDGET_SECONDS / 60.0))
        total += estimate or 0.0
    if len(plan.nets) > 1 and total:
        lines.append('plan: all networks together estimated {} (m:ss)'.format(
            minutes(total)))
    return lines
