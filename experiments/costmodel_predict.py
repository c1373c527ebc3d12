"""Predicted iteration times of both baselines and CGDP, in bulk.

``make model`` (``python -m experiments.costmodel_predict``; ``make model
NET=... INPUT_SHAPE=...``: one network, ``--net``, a name or
``module:callable``, and ``--input-shape``, one example's input) writes
``results/costmodel/predictions.csv`` with the columns of
:data:`COLUMNS`, one row per network, hardware preset, CGDP worker kind
(``process``, ``thread``), optimizer (``momentum_sgd``, ``adam``), device
count and batch per device: ``t_typical`` (Chainer's ``ParallelUpdater``),
``t_nccl`` (``MultiprocessParallelUpdater``; empty on ``this-cpu``),
``t_cgdp``, ``speedup`` (over typical), ``speedup_vs_nccl`` and each
scheme's weak-scaling efficiency. It draws (process workers, MomentumSGD)

- ``efficiency.png``: predicted weak-scaling efficiency of the three
  schemes against the device count, a panel per network and preset
  (batch 32);
- ``speedup.png``: CGDP's predicted speedup over typical (top) and over
  NCCL (bottom) against the device count, a panel per network, a line per
  preset and batch;
- ``NOTES.txt``: how the numbers were made (docs/COSTMODEL.md says what
  the model leaves out).

It also writes ``results/costmodel/predictions_multinode.csv``
(:data:`MULTINODE_COLUMNS`): the ChainerMN baseline against multi-node
CGDP on 1, 2, 4 and 8 nodes of 4 devices each, batch 32 per device, for
every network, GPU preset and interconnect (``ib-edr``, ``ib-hdr``); and
``multinode_efficiency.png``: their weak-scaling efficiency (against one
device on one node) against the total device count, a panel per network
and preset, a line per method and interconnect.

A ``module:callable`` model is any Chainer model: a predictor (its number
of outputs is read from it) or a chain that computes its own loss from
``(x, t)`` (see :mod:`cgdp_chainer.costmodel.samples`); it is built and
probed before any work, and its layers' FLOPs and bytes counted on one
example of ``--input-shape``. The four networks are counted once at their
image size (``--input-shape 3,S,S``, default 224 px) and cached
(``results/costmodel/flops_cache.json``). Each stage prints a line on
stderr. It prints the pay-off table (:func:`payoff_table`). The
``this-cpu`` preset is included for each network that has a CPU profile
under ``results/profiles/`` (``python -m experiments.profile --net NET``);
its times are scaled linearly from the profile's batch and image size is
that of the profile.
"""
import glob
import os
import sys
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

from cgdp_chainer import costmodel  # NOQA: E402
from cgdp_chainer import files  # NOQA: E402
from cgdp_chainer.costmodel import hardware  # NOQA: E402
from cgdp_chainer.costmodel import samples  # NOQA: E402
from experiments import progress  # NOQA: E402
from experiments import results  # NOQA: E402

COLUMNS = ('net', 'preset', 'workers', 'optimizer', 'n_devices',
           'batch_per_device', 't_typical', 't_nccl', 't_cgdp', 'speedup',
           'speedup_vs_nccl', 'eff_typical', 'eff_nccl', 'eff_cgdp',
           'best_chunk_size')
MULTINODE_COLUMNS = ('net', 'preset', 'network', 'n_nodes', 'devices_per_node',
                     'batch_per_device', 't_chainermn', 't_cgdp', 'speedup',
                     'eff_chainermn', 'eff_cgdp', 'best_chunk_size')
DEVICE_COUNTS = (1, 2, 4, 8)
NODE_COUNTS = (1, 2, 4, 8)
DEVICES_PER_NODE = 4
MULTINODE_BATCH = 32
BATCHES = (16, 32, 64)
WORKERS = costmodel.WORKERS
OPTIMIZERS = costmodel.OPTIMIZERS
# The figures' configuration: the runtime's default worker kind.
FIGURE_WORKERS = 'process'
FIGURE_OPTIMIZER = 'momentum_sgd'
# One example's input where --input-shape is not given: ImageNet's.
DEFAULT_INPUT_SHAPE = (3, 224, 224)
FIGURE_BATCH = 32
OUT_DIR = os.path.join('results', 'costmodel')
PROFILE_DIR = os.path.join('results', 'profiles')


def newest_cpu_profile(net, profile_dir=PROFILE_DIR):
    """The newest ``'@numpy'`` profile of ``net``, or ``None``."""
    paths = glob.glob(os.path.join(profile_dir, '{}_numpy_*.json'.format(
        net)))
    if not paths:
        return None
    return costmodel.load_profile(max(paths, key=os.path.getmtime))


def measured_optimizers(profile):
    """The optimizers whose host update a measured profile has (older
    profiles measured MomentumSGD only)."""
    rules = (profile.get('host') or {}).get('update_rules') or {}
    return tuple(o for o in OPTIMIZERS
                 if o in rules or o == 'momentum_sgd')


def predict_rows(net, profile, preset, counts=DEVICE_COUNTS,
                 batches=BATCHES, workers=WORKERS, optimizers=OPTIMIZERS):
    """Prediction rows for one network on one preset.

    Args:
        net (str): Network name.
        profile (dict): Its profile (FLOPs, or measured for ``this-cpu``).
        preset (str): Hardware preset name.
        counts (tuple of int): Device counts.
        batches (tuple of int): Batches per device.
        workers (tuple of str): CGDP worker kinds.
        optimizers (tuple of str): Optimizers.

    Returns:
        list of dict: Rows with :data:`COLUMNS`.
    """
    hw = hardware.get_hardware(preset, profile)
    rows = []
    for optimizer in optimizers:
        for kind in workers:
            for batch in batches:
                single = None
                for n in counts:
                    result = costmodel.predict(
                        profile, hw, n, batch, single=single, workers=kind,
                        optimizer=optimizer)
                    if n == 1:
                        single = result
                    row = {'net': net, 'preset': preset, 'workers': kind,
                           'optimizer': optimizer, 'n_devices': n,
                           'batch_per_device': batch,
                           'best_chunk_size': result['best_chunk_size']}
                    for key in COLUMNS:
                        if key not in row:
                            row[key] = _round(result[key])
                    rows.append(row)
    return rows


def predict_multinode_rows(net, profile, preset, network,
                           node_counts=NODE_COUNTS,
                           devices_per_node=DEVICES_PER_NODE,
                           batch=MULTINODE_BATCH):
    """Multi-node prediction rows for one network on one preset and
    interconnect.

    Args:
        net (str): Network name.
        profile (dict): Its profile.
        preset (str): Hardware preset name (one node).
        network (str): Interconnect preset name (``'ib-edr'``, ...).
        node_counts (tuple of int): Node counts.
        devices_per_node (int): Devices per node.
        batch (int): Batch per device.

    Returns:
        list of dict: Rows with :data:`MULTINODE_COLUMNS`.
    """
    hw = hardware.get_hardware(preset, profile)
    interconnect = hardware.get_network(network)
    single = costmodel.predict_multinode(profile, hw, interconnect, 1, 1,
                                         batch)
    rows = []
    for n_nodes in node_counts:
        result = costmodel.predict_multinode(
            profile, hw, interconnect, n_nodes, devices_per_node, batch,
            single=single)
        rows.append({
            'net': net, 'preset': preset, 'network': interconnect.name,
            'n_nodes': n_nodes, 'devices_per_node': devices_per_node,
            'batch_per_device': batch,
            't_chainermn': _round(result['t_chainermn']),
            't_cgdp': _round(result['t_cgdp']),
            'speedup': _round(result['speedup']),
            'eff_chainermn': _round(result['eff_chainermn']),
            'eff_cgdp': _round(result['eff_cgdp']),
            'best_chunk_size': result['best_chunk_size']})
    return rows


def payoff_table(rows, batch=FIGURE_BATCH):
    """"Will CGDP pay off for my model?": per network, preset and device
    count, the predicted seconds per iteration of each scheme, CGDP's
    speedup over ``ParallelUpdater`` and ``MultiprocessParallelUpdater``,
    and the chunking CGDP would use (the runtime's default worker kind and
    optimizer, ``batch`` images per device).

    Returns:
        str: A plain-text table.
    """
    # As wide as the longest name (module:callable names are long).
    width = max([10] + [len(row['net']) for row in rows])
    line = '{:' + str(width) + '} {:9} {:>2} {:>10} {:>10} {:>10} {:>8} ' \
        '{:>8}  {}'
    lines = [line.format('net', 'preset', 'N', 'typical_s', 'nccl_s',
                         'cgdp_s', 'x_typ', 'x_nccl', 'CGDPUpdater chunking')]
    for row in rows:
        if row['workers'] != FIGURE_WORKERS or row['optimizer'] != \
                FIGURE_OPTIMIZER or row['batch_per_device'] != batch or \
                row['n_devices'] == 1:
            continue
        lines.append(line.format(
            row['net'], row['preset'], row['n_devices'],
            _number(row['t_typical'], 4), _number(row['t_nccl'], 4),
            _number(row['t_cgdp'], 4), _number(row['speedup'], 2),
            _number(row['speedup_vs_nccl'], 2),
            costmodel.describe_chunking(row['best_chunk_size'])))
    return '\n'.join(lines)


def _number(value, digits):
    """``value`` with ``digits`` decimals, or ``-`` where the scheme does
    not exist (NCCL on CPU replicas)."""
    return '-' if value is None else '{:.{}f}'.format(value, digits)


def pyplot():
    """matplotlib's pyplot on the file-only backend, imported when the
    figures are drawn: its import takes seconds, which would delay the
    checks of the command line and the first line of progress."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot
    return matplotlib.pyplot


def save_figure(fig, path):
    """Writes ``fig`` to ``path`` atomically (a crash leaves the previous
    figure) and closes it."""
    try:
        with files.atomic_path(path) as temporary:
            fig.savefig(temporary, dpi=110, format='png')
    finally:
        pyplot().close(fig)


def _round(value):
    """Six significant digits: the model is not more precise than that
    (``None``, a scheme the preset cannot run, stays ``None``)."""
    if value is None:
        return None
    return float('{:.6g}'.format(value))


def _select(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def _figure_rows(rows):
    return _select(rows, workers=FIGURE_WORKERS, optimizer=FIGURE_OPTIMIZER)


def plot_efficiency(rows, nets, presets, path, batch=FIGURE_BATCH):
    """Efficiency of the three schemes against N, a panel per network and
    preset."""
    plt = pyplot()
    rows = _figure_rows(rows)
    fig, axes = plt.subplots(len(nets), len(presets), squeeze=False,
                             figsize=(3.0 * len(presets), 2.4 * len(nets)),
                             sharex=True, sharey=True)
    for i, net in enumerate(nets):
        for j, preset in enumerate(presets):
            ax = axes[i][j]
            chosen = sorted(_select(rows, net=net, preset=preset,
                                    batch_per_device=batch),
                            key=lambda r: r['n_devices'])
            if not chosen:
                ax.set_visible(False)
                continue
            counts = [r['n_devices'] for r in chosen]
            ax.plot(counts, [r['eff_typical'] for r in chosen], 'o-',
                    color='tab:blue', label='typical')
            if all(r['eff_nccl'] is not None for r in chosen):
                ax.plot(counts, [r['eff_nccl'] for r in chosen], '^-',
                        color='tab:green', label='NCCL')
            ax.plot(counts, [r['eff_cgdp'] for r in chosen], 's-',
                    color='tab:red', label='CGDP')
            ax.set_xscale('log', base=2)
            ax.set_xticks(counts)
            ax.set_xticklabels([str(c) for c in counts])
            ax.set_ylim(0, 1.1)
            ax.grid(alpha=0.3)
            if i == 0 or not axes[i - 1][j].get_visible():
                # The topmost drawn panel of a column names its preset
                # (this-cpu has rows only for profiled networks).
                ax.set_title(preset, fontsize=9)
            if j == 0:
                ax.set_ylabel('{}\nefficiency'.format(net), fontsize=8)
            if i == len(nets) - 1:
                ax.set_xlabel('devices', fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle('Predicted weak-scaling efficiency, batch {} per device '
                 '({} workers)'.format(batch, FIGURE_WORKERS), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_speedup(rows, nets, presets, path):
    """CGDP's speedup over typical (top row) and over NCCL (bottom row)
    against N, a panel per network."""
    plt = pyplot()
    rows = _figure_rows(rows)
    fig, axes = plt.subplots(2, len(nets), squeeze=False,
                             figsize=(3.4 * len(nets), 6.0), sharey='row')
    colors = dict(zip(presets, plt.rcParams['axes.prop_cycle']
                      .by_key()['color']))
    styles = {16: ':', 32: '-', 64: '--'}
    baselines = (('speedup', 'typical'), ('speedup_vs_nccl', 'NCCL'))
    for i, (key, label) in enumerate(baselines):
        for j, net in enumerate(nets):
            ax = axes[i][j]
            for preset in presets:
                for batch in BATCHES:
                    chosen = sorted(_select(rows, net=net, preset=preset,
                                            batch_per_device=batch),
                                    key=lambda r: r['n_devices'])
                    if not chosen or any(r[key] is None for r in chosen):
                        continue
                    ax.plot([r['n_devices'] for r in chosen],
                            [r[key] for r in chosen],
                            linestyle=styles.get(batch, '-'), marker='.',
                            color=colors[preset],
                            label='{} b{}'.format(preset, batch))
            ax.axhline(1.0, color='grey', linewidth=0.8)
            ax.set_xscale('log', base=2)
            ax.set_xticks(DEVICE_COUNTS)
            ax.set_xticklabels([str(c) for c in DEVICE_COUNTS])
            if i == 0:
                ax.set_title(net, fontsize=9)
            ax.set_xlabel('devices', fontsize=8)
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel('speedup of CGDP over {}'.format(label))
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.suptitle('Predicted speedup of CGDP ({} workers)'.format(
        FIGURE_WORKERS), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_multinode_efficiency(rows, nets, presets, networks, path):
    """Efficiency of ChainerMN and multi-node CGDP against the total device
    count, a panel per network (column) and preset (row), a line per method
    (colour) and interconnect (line style)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(presets), len(nets), squeeze=False,
                             figsize=(3.0 * len(nets), 2.4 * len(presets)),
                             sharex=True, sharey=True)
    colors = {'chainermn': 'tab:blue', 'cgdp': 'tab:red'}
    labels = {'chainermn': 'ChainerMN', 'cgdp': 'CGDP'}
    styles = dict(zip(networks, ('-', '--', ':', '-.')))
    ticks = []
    for i, preset in enumerate(presets):
        for j, net in enumerate(nets):
            ax = axes[i][j]
            for network in networks:
                chosen = sorted(_select(rows, net=net, preset=preset,
                                        network=network),
                                key=lambda r: r['n_nodes'])
                if not chosen:
                    continue
                total = [r['n_nodes'] * r['devices_per_node']
                         for r in chosen]
                ticks = sorted(set(ticks) | set(total))
                for method in ('chainermn', 'cgdp'):
                    ax.plot(total, [r['eff_' + method] for r in chosen],
                            marker='o' if method == 'chainermn' else 's',
                            markersize=3, linestyle=styles[network],
                            color=colors[method],
                            label='{} {}'.format(labels[method], network))
            ax.set_xscale('log', base=2)
            if ticks:
                ax.set_xticks(ticks)
                ax.set_xticklabels([str(t) for t in ticks])
            ax.set_ylim(0, 1.1)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(net, fontsize=9)
            if j == 0:
                ax.set_ylabel('{}\nefficiency'.format(preset), fontsize=8)
            if i == len(presets) - 1:
                ax.set_xlabel('devices (nodes x {})'.format(
                    DEVICES_PER_NODE), fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle('Predicted multi-node weak-scaling efficiency (vs 1 device), '
                 'batch {} per device'.format(MULTINODE_BATCH), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def write_notes(path, presets, cpu_nets, input_shape=DEFAULT_INPUT_SHAPE):
    lines = [
        'Predictions of cgdp_chainer.costmodel (discrete-event simulation; '
        'CGDP at the best chunk size among powers of two and one chunk).',
        'Schemes: typical = Chainer\'s ParallelUpdater (one thread drives '
        'every GPU); nccl = MultiprocessParallelUpdater (a process per GPU, '
        'NCCL reduce onto GPU 0, update there, NCCL broadcast); cgdp with '
        'workers process or thread; optimizers momentum_sgd and adam.',
        'Compute on GPU presets: per Chainer function on inputs of {} '
        '(one example), the longest '
        'of its FLOPs at the preset\'s efficiency, its bytes at the device\'s '
        'memory bandwidth and a kernel launch; per layer at least its '
        'host-side launch time (function calls x per-call cost); see '
        'cgdp_chainer/costmodel/hardware.py for every constant and its '
        'source.'.format(samples.describe_shape(input_shape)),
        'Efficiency: t(1) / t(N) within each scheme, as in '
        'experiments.results; speedup: t_typical / t_cgdp; '
        'speedup_vs_nccl: t_nccl / t_cgdp. Figures: {} workers, {}.'.format(
            FIGURE_WORKERS, FIGURE_OPTIMIZER),
        'Presets: {}. Device counts above a preset\'s physical devices '
        '(4) are extrapolated with more sockets of the same shape.'.format(
            ', '.join(presets)),
        'this-cpu rows (from measured CPU profiles): {}.'.format(
            ', '.join(cpu_nets) if cpu_nets else 'none (no profile under '
            'results/profiles/)'),
        '',
        'predictions_multinode.csv: {} nodes of {} devices, batch {} per '
        'device, interconnects {} (cgdp_chainer/costmodel/hardware.py). ChainerMN: '
        'the typical local sum on device 0, a ring all-reduce of all '
        'gradients across the nodes, update and spread; CGDP: each chunk '
        'all-reduced across the nodes between its local reduce and its '
        'update, one all-reduce at a time, in chunk order. A ring '
        'all-reduce of n bytes over R nodes: 2 (R - 1) / R x n / bandwidth '
        '+ 2 (R - 1) x latency. Efficiency: t(1 node x 1 device) / '
        't(R x N) within each method; speedup: t_chainermn / t_cgdp. One '
        'node equals the single-node rows (typical = ChainerMN).'.format(
            ', '.join(str(n) for n in NODE_COUNTS), DEVICES_PER_NODE,
            MULTINODE_BATCH, ', '.join(hardware.NETWORK_PRESETS)),
        'What the model leaves out: docs/COSTMODEL.md.',
    ]
    with files.atomic_write(path) as f:
        f.write('\n'.join(lines) + '\n')


def net_list(text):
    """argparse type: comma-separated network names, each known, none
    twice."""
    import argparse
    names = [n.strip() for n in text.split(',')]
    if not all(names):
        raise argparse.ArgumentTypeError(
            'an empty name in {!r}; give comma-separated networks'.format(
                text))
    for name in names:
        cli.net_name(name)
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            'a network is named twice in {!r}'.format(text))
    return names


def parse_args(argv=None):
    """Parses and checks the command line before any work; exits with 2 on
    bad input.

    Args:
        argv (list of str or None): Arguments; ``sys.argv[1:]`` if ``None``.

    Returns:
        argparse.Namespace: The arguments, with ``models``: per network, the
        :class:`cgdp_chainer.costmodel.samples.ProbedModel` of a
        ``module:callable`` (built and probed here) or the name of one of
        the four; and ``input_shape`` (default 3,224,224).
    """
    parser = cli.ArgumentParser(description='Predict typical and CGDP '
                                'iteration times for every preset.')
    parser.add_argument('--out', default=OUT_DIR,
                        help='output folder (default {})'.format(OUT_DIR))
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument('--net', default=None, type=cli.net_spec,
                        help='one network: a name or module:callable, a '
                             'function that returns a chainer.Link: a '
                             'predictor giving (N, K) class scores (K read '
                             'from it) or a chain whose forward(x, t) '
                             'returns the loss (e.g. '
                             'models.examples:cifar_cnn)')
    chosen.add_argument('--nets', default=None, type=net_list,
                        help='comma-separated networks (default: all four)')
    parser.add_argument('--input-shape', type=cli.input_shape,
                        default=DEFAULT_INPUT_SHAPE, metavar='SHAPE',
                        help='one example\'s input, without the batch: '
                             'C,H,W for images or F for a flat width '
                             '(default {})'.format(','.join(
                                 str(s) for s in DEFAULT_INPUT_SHAPE)))
    args = parser.parse_args(argv)
    import models
    nets = [args.net] if args.net else args.nets or list(models.NETWORKS)
    args.models = []
    for net in nets:
        if models.is_custom(net):
            args.models.append(cli.probe_model(net, args.input_shape))
        else:
            cli.check_image_input(net, args.input_shape)
            args.models.append(net)
    cli.check_output_folder('--out', args.out)
    return args


def net_profile(model, input_shape, cache, log):
    """The FLOPs profile of one network, announcing itself on ``log``.

    Args:
        model (str or ProbedModel): One of the four networks by name (its
            layers cached in ``cache``) or a probed model.
        input_shape (tuple of int): The four's images, ``(3, S, S)``.
        cache (str): The four's cache file.
        log (callable): ``log(text)``, one line per stage.

    Returns:
        dict: The profile (see :func:`cgdp_chainer.costmodel.flops_profile`).
    """
    if isinstance(model, str):
        log('{}: counting FLOPs and bytes per layer at {}'.format(
            model, samples.describe_shape(input_shape)))
        return costmodel.flops_profile(model, input_shape[-1],
                                       cache_path=cache)
    return costmodel.flops_profile(
        model, progress=lambda text: log('{}: {}'.format(model.name, text)))


def describe_profile(profile):
    """One line: the network, its input, outputs and loss, and layers."""
    outputs = profile.get('n_outputs', 1000) or 'unknown'
    shape = profile.get('input_shape') or [3, profile['image_size'],
                                           profile['image_size']]
    return '{}: input {}, {} outputs, {}, {} layers'.format(
        profile['net'], samples.describe_shape(shape), outputs,
        'its own loss' if profile.get('user_loss') else
        'softmax cross entropy', len(profile['layers']))


def predict_network(net, profile, presets, networks, log):
    """Every prediction row of one network: single-node on each preset,
    multi-node on each preset and interconnect, and ``this-cpu`` where a
    measured profile exists.

    Returns:
        tuple: ``(rows, multinode_rows, has_cpu)``.
    """
    rows, multinode_rows = [], []
    for index, preset in enumerate(presets):
        log('{}: predicting on {} {}/{}'.format(net, preset, index + 1,
                                                len(presets)))
        rows.extend(predict_rows(net, profile, preset))
        for network in networks:
            multinode_rows.extend(predict_multinode_rows(
                net, profile, preset, network))
    cpu_profile = newest_cpu_profile(net)
    if cpu_profile is None:
        return rows, multinode_rows, False
    log('{}: predicting on {} from its measured profile'.format(
        net, hardware.CPU_PRESET))
    try:
        rows.extend(predict_rows(
            net, cpu_profile, hardware.CPU_PRESET,
            optimizers=measured_optimizers(cpu_profile)))
    except ValueError as error:
        print('{}: this-cpu skipped: {}'.format(net, error))
        return rows, multinode_rows, False
    return rows, multinode_rows, True


def main(argv=None):
    args = parse_args(argv)
    log = progress.StageLog()
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    cache = os.path.join(args.out, 'flops_cache.json')
    presets = list(hardware.GPU_PRESETS)
    networks = list(hardware.NETWORK_PRESETS)
    rows, multinode_rows, cpu_nets, nets = [], [], [], []
    for model in args.models:
        profile = net_profile(model, args.input_shape, cache, log)
        net = profile['net']
        nets.append(net)
        print(describe_profile(profile), flush=True)
        single, multinode, has_cpu = predict_network(net, profile, presets,
                                                     networks, log)
        rows.extend(single)
        multinode_rows.extend(multinode)
        if has_cpu:
            cpu_nets.append(net)
        print('{}: done ({:.1f} s)'.format(net, time.perf_counter() - start),
              flush=True)
    print(payoff_table(rows), flush=True)
    log('writing the predictions and figures to {}'.format(args.out))
    csv_path = os.path.join(args.out, 'predictions.csv')
    results.write_csv(csv_path, COLUMNS, rows)
    all_presets = presets + ([hardware.CPU_PRESET] if cpu_nets else [])
    plot_efficiency(rows, nets, all_presets,
                    os.path.join(args.out, 'efficiency.png'))
    plot_speedup(rows, nets, all_presets,
                 os.path.join(args.out, 'speedup.png'))
    multinode_path = os.path.join(args.out, 'predictions_multinode.csv')
    results.write_csv(multinode_path, MULTINODE_COLUMNS, multinode_rows)
    plot_multinode_efficiency(multinode_rows, nets, presets, networks,
                              os.path.join(args.out,
                                           'multinode_efficiency.png'))
    write_notes(os.path.join(args.out, 'NOTES.txt'), all_presets, cpu_nets,
                args.input_shape)
    print('wrote {} rows to {}, {} to {} and figures in {} ({:.1f} s)'
          .format(len(rows), csv_path, len(multinode_rows), multinode_path,
                  args.out, time.perf_counter() - start))
    return 0


if __name__ == '__main__':
    sys.exit(main())
