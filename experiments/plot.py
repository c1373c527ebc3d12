"""Figures of a weak-scaling run, drawn from its saved CSV files.

``python -m experiments.plot RUN_DIR`` (``make plot RUN=RUN_DIR``) redraws
every figure of a run folder without training:

- ``efficiency.png``: weak-scaling efficiency against device count, a line
  per mode.
- ``throughput.png``: images per second against device count.
- ``speedup.png``: CGDP's speedup over the typical data parallel updater.
- ``timeline.png``: a Gantt chart of one measured CGDP iteration.

For a folder of a ``--net all`` run (``<root>/all/<run-id>``) it redraws
``efficiency_all.png``, the four networks side by side, and the figures
of each network's own folder.

:mod:`experiments.weak_scaling` draws its figures with the same functions
from the CSVs it has just written, so a redraw gives the same pictures.

As the recovery tool it draws from whatever a run left: a ``runs.csv``
whose last row was cut short (its complete rows are used), no or a damaged
``summary.csv`` (derived again from ``runs.csv``), an empty or cut
``env.json`` (titles without the run's settings). Each such repair is
printed as a ``note:`` line naming the file; only when nothing at all can
be drawn does it end with one ``error:`` line (exit 2). Figures are written
atomically, so an interrupted redraw leaves the previous figure.
"""
import os
import sys

import matplotlib
matplotlib.use('Agg')  # files only; no display is needed (or present)
import matplotlib.pyplot as plt  # NOQA: E402 (after the backend choice)
from matplotlib.patches import Patch  # NOQA: E402

from cgdp_chainer import devices  # NOQA: E402
from cgdp_chainer import files  # NOQA: E402
from experiments import cli  # NOQA: E402 (one-line errors, exit 2)
from experiments import results  # NOQA: E402

EFFICIENCY_PNG = 'efficiency.png'
THROUGHPUT_PNG = 'throughput.png'
SPEEDUP_PNG = 'speedup.png'
TIMELINE_PNG = 'timeline.png'
EFFICIENCY_ALL_PNG = 'efficiency_all.png'

# Fixed styles, so a mode or an event kind looks the same in every figure.
MODE_STYLES = {
    'typical': {'color': 'tab:blue', 'marker': 'o',
                'label': 'typical (ParallelUpdater)'},
    'nccl': {'color': 'tab:green', 'marker': 's',
             'label': 'nccl (MultiprocessParallelUpdater)'},
    'cgdp': {'color': 'tab:red', 'marker': '^', 'label': 'CGDP'},
    'chainermn': {'color': 'tab:gray', 'marker': 'v',
                  'label': 'ChainerMN (1 device per rank)'},
}
_SPARE_COLORS = ('tab:purple', 'tab:brown', 'tab:olive', 'tab:cyan')

KIND_COLORS = {
    'forward': 'tab:blue',
    'backward': 'tab:orange',
    'd2h': 'tab:purple',
    'reduce': 'tab:red',
    'update': 'tab:green',
    'h2d': 'tab:brown',
    'wait': 'lightgray',
}

DPI = 100


def _save(fig, path):
    """Writes ``fig`` to ``path`` atomically and closes it."""
    try:
        with files.atomic_path(path) as temporary:
            # The format from the target's name: the temporary one keeps
            # the extension, but saying so leaves no doubt.
            fig.savefig(temporary, dpi=DPI,
                        format=os.path.splitext(path)[1][1:] or None)
    finally:
        plt.close(fig)


def _mode_style(mode, index):
    style = MODE_STYLES.get(mode)
    if style is None:
        style = {'color': _SPARE_COLORS[index % len(_SPARE_COLORS)],
                 'marker': 'D', 'label': mode}
    return style


def _by_mode(summary):
    """Summary rows grouped by mode (order kept), sorted by replicas."""
    modes = {}
    for row in summary:
        modes.setdefault(row['mode'], []).append(row)
    for rows in modes.values():
        rows.sort(key=results.workers)
    return modes


def _setting_line(env):
    """``resnet152, 64 px, batch 4/device, CPU replicas (@numpy)``, with
    ``, cuDNN on`` or ``, cuDNN off`` for a GPU run."""
    return '{}, {} px, batch {}/device, {}'.format(
        env.get('net', '?'), env.get('image_size', '?'),
        env.get('batch_per_device', '?'), _device_words(env))


def _device_words(env):
    """The run's device kind, with whether cuDNN was on where it ran on
    GPUs (env.json before it recorded that: the kind alone)."""
    words = devices.cudnn_words(env.get('cudnn'))
    kind = env.get('device_kind', '?')
    return '{}, {}'.format(kind, words) if words else kind


def _device_ticks(ax, summary):
    counts = sorted({results.workers(r) for r in summary})
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts])


def _multi_rank(summary):
    return any(r.get('n_ranks', 1) > 1 for r in summary)


def _replicas_label(summary):
    """The x axis: devices N, or ranks x devices with MPI rows."""
    if _multi_rank(summary):
        return 'replicas = ranks R x devices per rank N'
    return 'devices N'


# ------------------------------------------------------------ single figures

def plot_efficiency_lines(ax, summary, model=None):
    """Draws efficiency against replicas on ``ax``, a line per mode.

    Args:
        ax (matplotlib.axes.Axes): Where to draw.
        summary (list of dict): ``summary.csv`` rows.
        model (list of dict or None): ``model.csv`` rows, drawn dashed in
            each mode's colour.
    """
    modes = list(_by_mode(summary))
    for index, (mode, rows) in enumerate(_by_mode(summary).items()):
        rows = [r for r in rows if r['efficiency'] is not None]
        if not rows:
            continue
        style = _mode_style(mode, index)
        ax.plot([results.workers(r) for r in rows],
                [r['efficiency'] for r in rows],
                marker=style['marker'], color=style['color'],
                label=style['label'])
    for mode, rows in _by_mode(model or []).items():
        rows = [r for r in rows if r['efficiency'] is not None]
        if not rows or mode not in modes:
            continue
        style = _mode_style(mode, modes.index(mode))
        ax.plot([results.workers(r) for r in rows],
                [r['efficiency'] for r in rows], linestyle='--',
                color=style['color'], alpha=0.8,
                label='{} (cost model)'.format(mode))
    ax.axhline(1.0, color='black', linestyle=':', linewidth=1,
               label='ideal')
    if summary and all(r['efficiency'] is None for r in summary):
        # An MPI run has no 1-rank x 1-device row to compare with.
        ax.text(0.5, 0.5, 'no efficiency: this run has no 1-device (1-rank) '
                'row of these modes', transform=ax.transAxes, ha='center',
                va='center', fontsize='small', color='gray')
    top = max([1.0] + [r['efficiency'] for r in summary + (model or [])
                       if r['efficiency'] is not None])
    ax.set_ylim(0, top * 1.1)
    _device_ticks(ax, summary)
    ax.set_xlabel(_replicas_label(summary))
    ax.set_ylabel('efficiency = throughput(N) / (N x throughput(1))')
    ax.grid(True, alpha=0.3)


def draw_efficiency(summary, env, path, model=None):
    """Writes ``efficiency.png``: weak-scaling efficiency per mode.

    Args:
        summary (list of dict): ``summary.csv`` rows.
        env (dict): The run's ``env.json`` (for the title).
        path (str): The PNG file.
        model (list of dict or None): ``model.csv`` rows (dashed).
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_efficiency_lines(ax, summary, model)
    ax.set_title('Weak-scaling efficiency\n' + _setting_line(env))
    ax.legend(loc='lower left', fontsize='small')
    fig.tight_layout()
    _save(fig, path)


def draw_throughput(summary, env, path):
    """Writes ``throughput.png``: images per second against devices.

    The dotted line is perfect scaling of the one-device typical run.

    Args:
        summary (list of dict): ``summary.csv`` rows.
        env (dict): The run's ``env.json`` (for the title).
        path (str): The PNG file.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (mode, rows) in enumerate(_by_mode(summary).items()):
        style = _mode_style(mode, index)
        ax.plot([results.workers(r) for r in rows],
                [r['throughput'] for r in rows],
                marker=style['marker'], color=style['color'],
                label=style['label'])
    single = [r for r in summary
              if r['mode'] == results.TYPICAL and results.workers(r) == 1]
    if single:
        counts = sorted({results.workers(r) for r in summary})
        ax.plot(counts, [single[0]['throughput'] * n for n in counts],
                color='black', linestyle=':', linewidth=1,
                label='ideal (N x typical on 1 device)')
    ax.set_ylim(bottom=0)
    _device_ticks(ax, summary)
    ax.set_xlabel(_replicas_label(summary))
    ax.set_ylabel('throughput (images / s)')
    ax.set_title('Training throughput\n' + _setting_line(env))
    ax.grid(True, alpha=0.3)
    ax.legend(loc='upper left', fontsize='small')
    fig.tight_layout()
    _save(fig, path)


def draw_speedup(summary, env, path, model=None):
    """Writes ``speedup.png``: typical median over CGDP median, per N.

    Args:
        summary (list of dict): ``summary.csv`` rows.
        env (dict): The run's ``env.json`` (for the title).
        path (str): The PNG file.
        model (list of dict or None): ``model.csv`` rows: the predicted
            speedup is drawn dashed over the bars.

    Returns:
        bool: False (and no file) where no CGDP row has a typical partner.
    """
    rows = sorted([r for r in summary if r['mode'] == results.CGDP
                   and r['speedup_vs_typical'] is not None],
                  key=results.workers)
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [str(results.workers(r)) for r in rows]
    values = [r['speedup_vs_typical'] for r in rows]
    bars = ax.bar(labels, values, color=MODE_STYLES['cgdp']['color'],
                  width=0.5)
    for bar, value in zip(bars, values):
        ax.annotate('{:.2f}x'.format(value),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha='center', va='bottom', fontsize='small')
    ax.axhline(1.0, color='black', linestyle=':', linewidth=1,
               label='no speedup')
    predicted = {results.workers(r): r['speedup_vs_typical']
                 for r in model or [] if r['mode'] == results.CGDP
                 and r['speedup_vs_typical'] is not None}
    marks = [(label, predicted[results.workers(r)])
             for label, r in zip(labels, rows)
             if results.workers(r) in predicted]
    if marks:
        ax.plot([label for label, _ in marks], [v for _, v in marks],
                linestyle='--', marker='D', color='black',
                label='cost model')
        values = values + [v for _, v in marks]
    ax.set_xlabel(_replicas_label(rows))
    if _multi_rank(rows):
        # Multi-rank rows are compared with ChainerMN (results.summarize).
        ax.set_ylabel('speedup = ChainerMN time / CGDP time per iteration')
        ax.set_title('CGDP speedup over ChainerMN\n' + _setting_line(env))
    else:
        ax.set_ylabel('speedup = typical time / CGDP time per iteration')
        ax.set_title('CGDP speedup over typical data parallel\n'
                     + _setting_line(env))
    ax.grid(True, axis='y', alpha=0.3)
    ax.legend(loc='upper left', fontsize='small')
    fig.tight_layout()
    _save(fig, path)
    return True


def _row_order(device):
    """Replica rows first (by index), then the host."""
    return (1, 0, device) if not device.isdigit() else (0, int(device), '')


def _assign_lanes(rows):
    """Splits each device's events into lanes whose bars do not overlap.

    A device may run two things at once (a copy on its own stream while the
    next chunk's backward runs; two host threads reducing different
    chunks), so each device gets as many lanes as it needs.

    Args:
        rows (list of dict): ``timeline.csv`` rows.

    Returns:
        list of (str, list of dict): Lane label and its events, top first.
    """
    lanes = []
    for device in sorted({r['device'] for r in rows}, key=_row_order):
        name = 'host' if device == 'host' else 'device {}'.format(device)
        device_lanes = []  # each: [end of last bar, events]
        for row in sorted((r for r in rows if r['device'] == device),
                          key=lambda r: (r['start'], r['end'])):
            for lane in device_lanes:
                if lane[0] <= row['start'] + 1e-9:
                    lane[0] = row['end']
                    lane[1].append(row)
                    break
            else:
                device_lanes.append([row['end'], [row]])
        for index, (_, events) in enumerate(device_lanes):
            label = name if index == 0 else '{} ({})'.format(name, index + 1)
            lanes.append((label, events))
    return lanes


def _chunking_words(timeline_info):
    """The chunking that ran, as the updater described it (older runs
    recorded only a chunk size, None for the default chunks)."""
    if timeline_info.get('chunking'):
        return timeline_info['chunking']
    size = timeline_info.get('chunk_size')
    return 'default chunks' if size is None else 'chunk size {}'.format(size)


def draw_timeline(rows, env, path):
    """Writes ``timeline.png``: a Gantt chart of one CGDP iteration.

    One row (or more, where events overlap) per replica and for the host;
    bars are coloured by kind and labelled with their chunk.

    Args:
        rows (list of dict): ``timeline.csv`` rows.
        env (dict): The run's ``env.json`` (title; the iteration shown).
        path (str): The PNG file.

    Returns:
        bool: False (and no file) where there are no events.
    """
    if not rows:
        return False
    lanes = _assign_lanes(rows)
    span = max(r['end'] for r in rows) - min(r['start'] for r in rows)
    scale, unit = (1e3, 'ms') if span < 10 else (1.0, 's')
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.45 * len(lanes)))
    for y, (_, events) in enumerate(lanes):
        for row in events:
            width = (row['end'] - row['start']) * scale
            ax.barh(y, width, left=row['start'] * scale, height=0.7,
                    color=KIND_COLORS.get(row['kind'], 'black'),
                    edgecolor='black', linewidth=0.3)
            # Chunk labels only where they fit inside the bar.
            if row['chunk'] is not None and width > span * scale * 0.025:
                ax.text(row['start'] * scale + width / 2, y,
                        str(row['chunk']), ha='center', va='center',
                        fontsize=7)
    ax.set_xlim(left=0)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for label, _ in lanes])
    ax.invert_yaxis()  # device 0 on top, the host at the bottom
    ax.set_xlabel('time since the iteration began ({}); bar labels: chunk '
                  'index'.format(unit))
    ax.set_ylabel('replica / host')
    timeline_info = env.get('timeline') or {}
    n_ranks = timeline_info.get('n_ranks', 1)
    ax.set_title('One measured CGDP iteration ({}N={}, iteration {}, {})'
                 '\n{}'.format(
                     'rank 0 of R={}, '.format(n_ranks) if n_ranks > 1
                     else '',
                     timeline_info.get('n_devices', '?'),
                     timeline_info.get('iteration', '?'),
                     _chunking_words(timeline_info),
                     _setting_line(env)))
    kinds = [k for k in KIND_COLORS if any(r['kind'] == k for r in rows)]
    kinds += sorted({r['kind'] for r in rows} - set(KIND_COLORS))
    ax.legend(handles=[Patch(facecolor=KIND_COLORS.get(k, 'black'),
                             edgecolor='black', label=k) for k in kinds],
              loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize='small',
              title='kind')
    ax.grid(True, axis='x', alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return True


# ---------------------------------------------------------------- run folders

def _note(notes, message):
    if notes is not None:
        notes.append(message)


def _read_rows(path, columns, notes, appended=False):
    """The complete rows of a results CSV, or ``None`` where it is damaged.

    Args:
        path (str): The CSV file.
        columns (sequence of str): Its expected header.
        notes (list or None): Gets a sentence on any damage.
        appended (bool): The file is written row by row (``runs.csv``),
            so a last row cut short is an interrupted run: its complete
            rows are used. A file written whole cannot be cut short by an
            interruption, so there a cut row is damage.

    Returns:
        list of dict or None: The rows; ``None`` for a damaged file.
    """
    try:
        results.check_columns(path, columns)
        rows = results.read_csv(path)
    except ValueError as error:
        _note(notes, str(error))
        return None
    cut = results.incomplete_last_line(path)
    if cut is not None and not appended:
        _note(notes, '{} is damaged: line {} is cut short'.format(path, cut))
        return None
    if cut is not None:
        _note(notes, '{}: line {} was cut short (an interrupted run); '
                     'drawn from the {} complete rows'.format(
                         path, cut, len(rows)))
    return rows


def load_model(run_dir, notes=None):
    """The cost model's rows of a run (``model.csv``), or None where the
    run has none or the file is damaged (then with a note)."""
    path = os.path.join(run_dir, results.MODEL_FILE)
    if not os.path.exists(path):
        return None
    return _read_rows(path, results.SUMMARY_COLUMNS, notes)


def load_summary(run_dir, notes=None):
    """The run's summary rows: ``summary.csv``, else derived from runs.csv.

    ``summary.csv`` is derived from ``runs.csv``, so where it is missing
    or damaged the rows are derived again from the complete rows of
    ``runs.csv``.

    Args:
        run_dir (str): The run folder.
        notes (list or None): Gets a sentence for each file that was
            damaged, cut short or replaced by another.

    Returns:
        list of dict: Possibly empty (a run interrupted before any row,
        or no readable file).
    """
    summary_path = os.path.join(run_dir, results.SUMMARY_FILE)
    runs_path = os.path.join(run_dir, results.RUNS_FILE)
    if os.path.exists(summary_path):
        rows = _read_rows(summary_path, results.SUMMARY_COLUMNS, notes)
        if rows is not None:
            return rows
        if os.path.exists(runs_path):
            _note(notes, 'derived the summary again from {}'.format(
                runs_path))
    if os.path.exists(runs_path):
        runs = _read_rows(runs_path, results.RUNS_COLUMNS, notes,
                          appended=True)
        if runs:
            return results.summarize(runs)
    return []


def _load_env(run_dir, notes=None):
    path = os.path.join(run_dir, results.ENV_FILE)
    if not os.path.exists(path):
        return {}
    try:
        env = results.read_json(path)
    except ValueError as error:
        _note(notes, '{}; the titles lack the run\'s settings'.format(
            error))
        return {}
    if not isinstance(env, dict):
        _note(notes, '{} holds no settings object; the titles lack the '
                     'run\'s settings'.format(path))
        return {}
    return env


def _load_timeline(run_dir, notes=None):
    path = os.path.join(run_dir, results.TIMELINE_FILE)
    if not os.path.exists(path):
        return []
    rows = _read_rows(path, results.TIMELINE_COLUMNS, notes)
    if rows is None:
        _note(notes, 'no {}: {} is damaged'.format(TIMELINE_PNG, path))
        return []
    return rows


def draw_run(run_dir, notes=None):
    """Draws every figure of one network's run folder from its files.

    Damaged files are skipped or replaced (see the module's docstring),
    each with a sentence in ``notes``.

    Args:
        run_dir (str): ``<root>/<net>/<run-id>``.
        notes (list or None): Gets a sentence for each damaged file and
            how it was dealt with.

    Returns:
        list of str: The PNG files written (figures without data are
        skipped).
    """
    env = _load_env(run_dir, notes)
    summary = load_summary(run_dir, notes)
    model = load_model(run_dir, notes)
    written = []
    if summary:
        path = os.path.join(run_dir, EFFICIENCY_PNG)
        draw_efficiency(summary, env, path, model)
        written.append(path)
        path = os.path.join(run_dir, THROUGHPUT_PNG)
        draw_throughput(summary, env, path)
        written.append(path)
        path = os.path.join(run_dir, SPEEDUP_PNG)
        if draw_speedup(summary, env, path, model):
            written.append(path)
    timeline = _load_timeline(run_dir, notes)
    if timeline:
        path = os.path.join(run_dir, TIMELINE_PNG)
        if draw_timeline(timeline, env, path):
            written.append(path)
    return written


def _load_index(all_dir, notes=None):
    """The ``nets`` of a ``--net all`` folder's index, or ``None``."""
    path = os.path.join(all_dir, results.INDEX_FILE)
    try:
        index = results.read_json(path)
    except ValueError as error:
        _note(notes, '{}; the networks\' folders are unknown'.format(error))
        return None
    nets = index.get('nets') if isinstance(index, dict) else None
    if not isinstance(nets, dict):
        _note(notes, '{} is damaged: it has no "nets" object; the networks\' '
                     'folders are unknown'.format(path))
        return None
    return nets


def draw_all(all_dir, notes=None):
    """Draws ``efficiency_all.png`` of a ``--net all`` run, side by side.

    Args:
        all_dir (str): ``<root>/all/<run-id>``, holding ``index.json``
            whose ``nets`` maps each network to its run folder (relative to
            ``all_dir``).
        notes (list or None): Gets a sentence if ``index.json`` is damaged
            (the networks' own files are reported by :func:`draw_run`).

    Returns:
        str or None: The PNG file, or None where no network has data.
    """
    nets = _load_index(all_dir, notes)
    if nets is None:
        return None
    panels = []
    for net, relative in nets.items():
        net_dir = os.path.normpath(os.path.join(all_dir, relative))
        summary = load_summary(net_dir)
        if summary:
            panels.append((net, _load_env(net_dir), summary))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6),
                             sharey=True, squeeze=False)
    for ax, (net, env, summary) in zip(axes[0], panels):
        plot_efficiency_lines(ax, summary)
        ax.set_title('{}\n{} px, batch {}/device'.format(
            net, env.get('image_size', '?'), env.get('batch_per_device', '?')))
        if ax is not axes[0][0]:
            ax.set_ylabel('')
    # The panels share the y axis: fit the largest efficiency of any.
    top = max([1.0] + [r['efficiency'] for _, _, summary in panels
                       for r in summary if r['efficiency'] is not None])
    axes[0][0].set_ylim(0, top * 1.1)
    axes[0][-1].legend(loc='lower left', fontsize='small')
    fig.suptitle('Weak-scaling efficiency of the four networks ({})'.format(
        _device_words(panels[0][1])))
    fig.tight_layout()
    path = os.path.join(all_dir, EFFICIENCY_ALL_PNG)
    _save(fig, path)
    return path


def draw_any(folder, notes=None):
    """Draws every figure of a run folder or of a ``--net all`` folder.

    Args:
        folder (str): ``<root>/<net>/<run-id>`` or ``<root>/all/<run-id>``.
        notes (list or None): Gets a sentence for each damaged file.

    Returns:
        list of str: The PNG files written.
    """
    if os.path.exists(os.path.join(folder, results.INDEX_FILE)):
        nets = _load_index(folder, notes)
        if nets is None:
            return []
        written = []
        for relative in nets.values():
            net_dir = os.path.normpath(os.path.join(folder, relative))
            if os.path.isdir(net_dir):
                written += draw_run(net_dir, notes)
            else:
                _note(notes, '{} names {}, which is not a folder'.format(
                    os.path.join(folder, results.INDEX_FILE), net_dir))
        combined = draw_all(folder)
        return written + ([combined] if combined else [])
    return draw_run(folder, notes)


def main(argv=None):
    """Redraws the figures of the run folder given on the command line.

    Prints each figure written, and a ``note:`` line on stderr for each
    damaged file it worked around; exits with 2 and one ``error:`` line
    when no figure can be drawn.

    Args:
        argv (list of str or None): Arguments (default: ``sys.argv[1:]``).
    """
    parser = cli.ArgumentParser(
        prog='python -m experiments.plot',
        description='Redraw the figures of a weak-scaling run from its CSV '
                    'files, without training.')
    parser.add_argument('run_dir', metavar='RUN_DIR',
                        help='results/<net>/<run-id> or results/all/<run-id>')
    args = parser.parse_args(argv)
    folder = args.run_dir
    if not os.path.isdir(folder):
        cli.fail('{} is not a folder; pass a run folder such as '
                 'results/resnet152/<run-id>'.format(folder))
    has_data = any(os.path.exists(os.path.join(folder, name)) for name in
                   (results.RUNS_FILE, results.SUMMARY_FILE,
                    results.TIMELINE_FILE, results.INDEX_FILE))
    if not has_data:
        cli.fail('{} holds none of {}, {}, {} or {}; is it a run '
                 'folder?'.format(folder, results.RUNS_FILE,
                                  results.SUMMARY_FILE, results.TIMELINE_FILE,
                                  results.INDEX_FILE))
    # The figures go next to the data: a read-only copy fails here, not
    # after the first figure is drawn.
    cli.check_output_folder('RUN_DIR', folder)
    notes = []
    written = draw_any(folder, notes)
    for note in notes:
        sys.stderr.write('note: {}\n'.format(note))
    for path in written:
        print(path)
    if not written:
        if notes:
            cli.fail('no figure drawn: {}'.format(notes[0]))
        cli.fail('no figure drawn: {} has no complete measured row '
                 'yet'.format(folder))


if __name__ == '__main__':
    main()
