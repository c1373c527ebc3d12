"""The results schema of the weak-scaling experiment: the one place for it.

Every script that writes or reads experiment results imports this module:
the column lists, the CSV writers and readers, the naming of run folders,
the summary statistics and the collection of ``env.json`` live here, so a
column is added or renamed in exactly one place.

A run folder ``<root>/<net>/<run-id>/`` holds:

- ``runs.csv``: one row per measured iteration (:data:`RUNS_COLUMNS`).
- ``summary.csv``: one row per mode and device count
  (:data:`SUMMARY_COLUMNS`), derived from ``runs.csv`` by :func:`summarize`.
- ``timeline.csv``: the events of one measured CGDP iteration
  (:data:`TIMELINE_COLUMNS`), times relative to that iteration's start.
- ``env.json``: versions, devices, CPU, git commit, command line and the
  settings of the run (:func:`collect_env`).
- the figures drawn by :mod:`experiments.plot`.

Whole files are written atomically (:mod:`cgdp_chainer.files`): a crash
leaves the previous file or the complete new one. ``runs.csv`` is the
exception, appended row by row (:class:`CsvAppender`) so that an
interrupted run keeps every finished iteration; a crash may cut its last
row short, and :func:`read_csv` drops such a row. A file damaged in any
other way raises :class:`DamagedFileError`, naming the file and line.

``<root>/all/<run-id>/index.json`` (:data:`INDEX_FILE`) ties together the
per-network folders of one ``--net all`` run.
"""
import csv
import datetime
import io
import json
import os
import platform
import shlex
import subprocess

import numpy

from cgdp_chainer import devices
from cgdp_chainer import files

RUNS_FILE = 'runs.csv'
SUMMARY_FILE = 'summary.csv'
TIMELINE_FILE = 'timeline.csv'
ENV_FILE = 'env.json'
INDEX_FILE = 'index.json'
TRACE_FILE = 'timeline_trace.json'
# The cost model's prediction of the measured points (experiments.prediction),
# with SUMMARY_COLUMNS.
MODEL_FILE = 'model.csv'

# The folder name under the results root for a run of all networks.
ALL_NETS = 'all'

RUNS_COLUMNS = ('mode', 'n_devices', 'n_ranks', 'batch_per_device',
                'image_size', 'iteration', 'seconds')
SUMMARY_COLUMNS = ('mode', 'n_devices', 'n_ranks', 'batch_per_device',
                   'image_size', 'median_s', 'iqr_s', 'throughput',
                   'efficiency', 'speedup_vs_typical')
TIMELINE_COLUMNS = ('device', 'kind', 'chunk', 'start', 'end')

# How each column is read back; columns not named here stay strings.
# ``None`` in a float or int column is written as an empty cell.
_INT_COLUMNS = frozenset(('n_devices', 'n_ranks', 'batch_per_device',
                          'image_size', 'iteration', 'chunk'))
_FLOAT_COLUMNS = frozenset(('seconds', 'median_s', 'iqr_s', 'throughput',
                            'efficiency', 'speedup_vs_typical', 'start',
                            'end'))

# The single-process baseline mode; speedups are measured against it.
TYPICAL = 'typical'
CGDP = 'cgdp'
# The multi-rank baseline (ChainerMN, one device per rank): multi-rank CGDP
# rows are compared with it.
CHAINERMN = 'chainermn'


# ---------------------------------------------------------------- run folders

def new_run_id(now=None):
    """A run id: the local time as ``YYYYmmdd-HHMMSS``.

    Args:
        now (datetime.datetime or None): The time to use (default: now).
    """
    now = now or datetime.datetime.now()
    return now.strftime('%Y%m%d-%H%M%S')


def net_folder(net):
    """The folder name of a ``--net`` value: ``module:callable`` with a
    dash for the colon (``models.examples-tiny``), which Windows forbids
    and shells and ``scp`` read as a host or drive."""
    return net.replace(':', '-')


def run_dir(root, net, run_id):
    """The folder of one network's run: ``<root>/<net folder>/<run_id>``.

    Args:
        root (str): The results root.
        net (str): The network (or :data:`ALL_NETS`); see
            :func:`net_folder`.
        run_id (str): The run id.
    """
    return os.path.join(root, net_folder(net), run_id)


def free_run_id(root, nets, now=None):
    """A run id whose folders do not exist yet for any of ``nets``.

    Two runs started within the same second would share a timestamp, so a
    suffix ``-2``, ``-3``, ... is added until every folder is free.

    Args:
        root (str): The results root.
        nets (sequence of str): Folder names that will use the id (the
            networks, plus :data:`ALL_NETS` for a run of all networks).
        now (datetime.datetime or None): The time to use (default: now).
    """
    base = new_run_id(now)
    candidate, n = base, 1
    while any(os.path.exists(run_dir(root, net, candidate)) for net in nets):
        n += 1
        candidate = '{}-{}'.format(base, n)
    return candidate


# ------------------------------------------------------------------ CSV files

def _format_cell(value):
    if value is None:
        return ''
    if isinstance(value, float):
        # repr keeps every digit, so a figure drawn from the CSV is the one
        # drawn from the values in memory.
        return repr(value)
    return value


def _parse_cell(column, text):
    if column in _INT_COLUMNS or column in _FLOAT_COLUMNS:
        if text == '':
            return None
        return int(text) if column in _INT_COLUMNS else float(text)
    return text


class DamagedFileError(ValueError):
    """A results file that cannot be read back as written.

    Args:
        path (str): The file.
        problem (str): What is wrong, with the line where it applies.
    """

    def __init__(self, path, problem):
        super(DamagedFileError, self).__init__(
            '{} is damaged: {}'.format(path, problem))
        self.path = path
        self.problem = problem


class CsvAppender(object):
    """Writes a CSV file row by row, flushing each row to disk.

    An interrupted experiment keeps every row written before the
    interruption; a crash in the middle of a row leaves that row cut
    short, without its line end, and :func:`read_csv` drops it. Use as a
    context manager or call :meth:`close`.

    Args:
        path (str): The file; it is created (or emptied) with a header.
        columns (sequence of str): The column names, in order.
    """

    def __init__(self, path, columns):
        self.path = path
        self.columns = tuple(columns)
        self._file = open(path, 'w', newline='')
        self._writer = csv.writer(self._file)
        self._writer.writerow(self.columns)
        self._file.flush()

    def append(self, row):
        """Writes one row.

        Args:
            row (dict): A value for every column (``None`` for empty).

        Raises:
            KeyError: A column is missing from ``row``.
        """
        self._writer.writerow([_format_cell(row[c]) for c in self.columns])
        self._file.flush()

    def close(self):
        """Closes the file."""
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def write_csv(path, columns, rows):
    """Writes all ``rows`` to ``path`` with a header, atomically.

    Args:
        path (str): The file; replaced only once the new one is complete.
        columns (sequence of str): The column names, in order.
        rows (iterable of dict): A value for every column.

    Raises:
        KeyError: A column is missing from a row (``path`` is unchanged).
    """
    columns = tuple(columns)
    with files.atomic_write(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_format_cell(row[c]) for c in columns])


def _complete_text(path):
    """The file's text without a last line cut short, and that line's
    number (``None`` when every line is complete)."""
    with open(path, newline='') as f:
        text = f.read()
    if text == '' or text.endswith('\n'):
        return text, None
    # Every row written by this module ends with a line end, so a last
    # line without one is a row whose writing was interrupted.
    kept, _, _ = text.rpartition('\n')
    kept = kept + '\n' if kept else ''
    return kept, text.count('\n') + 1


def incomplete_last_line(path):
    """The line number of ``path``'s last line if it was cut short.

    Args:
        path (str): A CSV file.

    Returns:
        int or None: The number (1-based) of a last line without a line
        end, which :func:`read_csv` drops; ``None`` if there is none.
    """
    return _complete_text(path)[1]


def read_csv(path):
    """Reads a CSV written by this module back into typed dicts.

    A last row cut short (an interrupted :class:`CsvAppender`) is dropped;
    :func:`incomplete_last_line` tells whether there was one.

    Args:
        path (str): The file.

    Returns:
        list of dict: One dict per complete row; numeric columns are ints
        or floats (``None`` where empty), the others strings. Empty if the
        file is empty or its header was cut short.

    Raises:
        DamagedFileError: A complete row has too few or too many cells, or
            a numeric cell is not a number; the message names the line.
    """
    text, _ = _complete_text(path)
    reader = csv.reader(io.StringIO(text, newline=''))
    header = next(reader, None)
    if header is None:
        return []
    rows = []
    for row in reader:
        if len(row) != len(header):
            raise DamagedFileError(path, 'line {} has {} cells, the header '
                                         '{}'.format(reader.line_num,
                                                     len(row), len(header)))
        parsed = {}
        for column, cell in zip(header, row):
            try:
                parsed[column] = _parse_cell(column, cell)
            except ValueError:
                raise DamagedFileError(path, 'line {}: {} {!r} is not a '
                                             'number'.format(reader.line_num,
                                                             column, cell))
        rows.append(parsed)
    return rows


def check_columns(path, columns):
    """Raises ``ValueError`` unless ``path``'s header is exactly ``columns``.

    Args:
        path (str): A CSV file.
        columns (sequence of str): The expected header.
    """
    with open(path, newline='') as f:
        header = next(csv.reader(f), [])
    if tuple(header) != tuple(columns):
        raise ValueError('{} has columns {}, expected {}'.format(
            path, ', '.join(header), ', '.join(columns)))


# -------------------------------------------------------------------- rows

def run_row(mode, n_devices, batch_per_device, image_size, iteration,
            seconds, n_ranks=1):
    """One row of ``runs.csv``.

    Args:
        mode (str): ``typical``, ``nccl``, ``cgdp``, ``chainermn`` (or a
            mode added later).
        n_devices (int): Devices per rank.
        batch_per_device (int): Examples per device and iteration.
        image_size (int): Height and width of the input images.
        iteration (int): Index of the measured iteration (0-based, after the
            warm-up).
        seconds (float): Wall time of that ``update()`` call.
        n_ranks (int): MPI ranks (1 without MPI).
    """
    return {'mode': mode, 'n_devices': n_devices, 'n_ranks': n_ranks,
            'batch_per_device': batch_per_device, 'image_size': image_size,
            'iteration': iteration, 'seconds': seconds}


def workers(row):
    """Data parallel replicas of a row: devices per rank times ranks.

    Args:
        row (dict): A ``runs.csv`` or ``summary.csv`` row.
    """
    return row['n_devices'] * row['n_ranks']


def summarize(runs):
    """Derives ``summary.csv`` rows from ``runs.csv`` rows.

    Per (mode, n_devices, n_ranks, batch_per_device, image_size):

    - ``median_s`` and ``iqr_s``: median and interquartile range of the
      iteration times.
    - ``throughput``: images per second, ``batch_per_device x replicas /
      median_s``.
    - ``efficiency``: weak-scaling efficiency ``throughput(N) / (N x
      throughput(1))`` within the mode. A mode never run on one replica
      (``nccl`` needs two GPUs) is compared with the ``typical`` one-device
      run, which is the same single-device training. A multi-rank row
      (``n_ranks`` R > 1, N devices per rank) is ``throughput / (R x N x
      throughput of the same mode at 1 rank x 1 device)``, only where such
      a row is in ``runs``; otherwise empty (an MPI run has R fixed; see
      :func:`summary_notes`).
    - ``speedup_vs_typical``: for ``cgdp`` rows, the ``typical`` median over
      the ``cgdp`` median at the same replica count; for multi-rank ``cgdp``
      rows the multi-rank typical data parallel baseline, ``chainermn``, at
      the same ranks and replica count; empty otherwise.

    Args:
        runs (list of dict): Rows as written by :func:`run_row`.

    Returns:
        list of dict: Rows with :data:`SUMMARY_COLUMNS`, ordered by mode (in
        order of first appearance) and replica count.
    """
    groups = {}
    for row in runs:
        key = (row['mode'], row['n_devices'], row['n_ranks'],
               row['batch_per_device'], row['image_size'])
        groups.setdefault(key, []).append(row['seconds'])

    summary = []
    for (mode, n_devices, n_ranks, batch, size), seconds in groups.items():
        q25, median, q75 = numpy.percentile(seconds, [25, 50, 75])
        replicas = n_devices * n_ranks
        summary.append({
            'mode': mode, 'n_devices': n_devices, 'n_ranks': n_ranks,
            'batch_per_device': batch, 'image_size': size,
            'median_s': float(median), 'iqr_s': float(q75 - q25),
            'throughput': float(batch * replicas / median),
            'efficiency': None, 'speedup_vs_typical': None})

    def find(mode, replicas, batch, size, n_ranks=None):
        for row in summary:
            if (row['mode'] == mode and workers(row) == replicas
                    and row['batch_per_device'] == batch
                    and row['image_size'] == size
                    and n_ranks in (None, row['n_ranks'])):
                return row
        return None

    for row in summary:
        batch, size = row['batch_per_device'], row['image_size']
        multi_rank = row['n_ranks'] > 1
        single = find(row['mode'], 1, batch, size)
        if single is None and not multi_rank:
            single = find(TYPICAL, 1, batch, size)
        if single is not None:
            row['efficiency'] = row['throughput'] / (
                workers(row) * single['throughput'])
        if row['mode'] == CGDP:
            if multi_rank:
                baseline = find(CHAINERMN, workers(row), batch, size,
                                row['n_ranks'])
            else:
                baseline = find(TYPICAL, workers(row), batch, size, 1)
            if baseline is not None:
                row['speedup_vs_typical'] = (
                    baseline['median_s'] / row['median_s'])

    mode_order = []
    for row in summary:
        if row['mode'] not in mode_order:
            mode_order.append(row['mode'])
    summary.sort(key=lambda r: (mode_order.index(r['mode']), workers(r)))
    return summary


def summary_notes(summary):
    """Sentences that explain empty or special cells of multi-rank rows.

    Args:
        summary (list of dict): ``summary.csv`` rows.

    Returns:
        list of str: Notes to print under the table (empty without
        multi-rank rows).
    """
    notes = []
    multi = [row for row in summary if row['n_ranks'] > 1]
    if not multi:
        return notes
    missing = sorted({row['mode'] for row in multi
                      if row['efficiency'] is None})
    if missing:
        notes.append(
            'efficiency of multi-rank rows = throughput / (R x N x '
            'throughput of the same mode at 1 rank x 1 device); empty for '
            '{}: this run has no 1-rank x 1-device row of that mode (an MPI '
            'run has R fixed: compare with RANKS=1, or with a plain make '
            'experiment)'.format(', '.join(missing)))
    if any(row['mode'] == CGDP for row in multi):
        notes.append('speedup of multi-rank cgdp rows: chainermn time / cgdp '
                      'time at the same ranks and replicas (ChainerMN is the '
                      'multi-rank typical data parallel)')
    return notes


def timeline_rows(events, iteration, start):
    """``timeline.csv`` rows for one iteration's events.

    Args:
        events (iterable of cgdp_chainer.timeline.Event): Recorded events.
        iteration (int): The iteration to keep.
        start (float): The iteration's start on the timeline's clock; the
            rows' times are relative to it.

    Returns:
        list of dict: Rows with :data:`TIMELINE_COLUMNS`, ordered by start.
    """
    rows = [{'device': str(e.device), 'kind': e.kind, 'chunk': e.chunk,
             'start': e.start - start, 'end': e.end - start}
            for e in events if e.iteration == iteration]
    rows.sort(key=lambda r: (r['start'], r['end']))
    return rows


# ------------------------------------------------------------------ env.json

def _git_commit():
    """The commit of the working tree (``+dirty`` if it has changes)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ['git', 'rev-parse', 'HEAD'], cwd=here, capture_output=True,
            text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(
            ['git', 'status', '--porcelain', '--untracked-files=no'],
            cwd=here, capture_output=True, text=True, timeout=10,
            check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ('+dirty' if dirty else '')


def _cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module_name):
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, '__version__', None)


def load_average():
    """The 1, 5 and 15 minute load averages, or ``None`` where unknown."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def collect_env(command, **settings):
    """The facts a reader needs to interpret (or repeat) a run.

    Args:
        command (list of str): The command line that started the run.
        **settings: The run's own settings (network, image size and the
            reason for it, batch, device names, ...); they are stored as
            given, and must be JSON-serializable.

    Returns:
        dict: Versions of Python, Chainer, NumPy and CuPy, whether cuDNN
        is on (None without CuPy), the CPU model and
        core count, the load average, the git commit, the command line and
        ``settings``.
    """
    import chainer

    env = {
        'python': platform.python_version(),
        'chainer': chainer.__version__,
        'numpy': numpy.__version__,
        'cupy': _version('cupy'),
        # Chainer's own kernels where not: the timings are not a cuDNN
        # set-up's (None: no CuPy).
        'cudnn': devices.cudnn_enabled(),
        'platform': platform.platform(),
        'cpu_model': _cpu_model(),
        'cpu_count': os.cpu_count(),
        'load_average_at_start': load_average(),
        'git_commit': _git_commit(),
        'command': ' '.join(shlex.quote(a) for a in command),
    }
    env.update(settings)
    return env


def write_json(path, data):
    """Writes ``data`` as indented JSON, atomically.

    Args:
        path (str): The file; replaced only once the new one is complete.
        data: JSON-serializable data.

    Raises:
        TypeError: ``data`` is not JSON-serializable (``path`` is
            unchanged).
    """
    # Serialized first: a value that cannot be written fails before any
    # file is touched.
    text = json.dumps(data, indent=2, sort_keys=False) + '\n'
    with files.atomic_write(path, 'w') as f:
        f.write(text)


def read_json(path):
    """Reads a JSON file.

    Args:
        path (str): The file.

    Raises:
        DamagedFileError: The file is empty or not valid JSON (cut short,
            for instance); the message names the line.
    """
    with open(path) as f:
        text = f.read()
    if not text.strip():
        raise DamagedFileError(path, 'the file is empty')
    try:
        return json.loads(text)
    except ValueError as error:
        raise DamagedFileError(path, 'not valid JSON ({})'.format(error))
