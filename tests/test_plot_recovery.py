"""Results files written atomically, read back after a crash, redrawn.

``experiments.plot`` is the recovery tool: it must redraw from whatever
complete rows a run left and name a damaged file instead of a traceback.
The run folders here are written with the results schema's own writers
and then damaged the way a crash or a full disk would.
"""
import json
import os
import subprocess
import sys

import pytest

from experiments import plot
from experiments import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runs():
    rows = []
    for mode, seconds in (('typical', 0.2), ('cgdp', 0.15)):
        for n_devices in (1, 2):
            for iteration in range(3):
                rows.append(results.run_row(
                    mode, n_devices, 4, 64, iteration,
                    seconds * n_devices + 0.01 * iteration))
    return rows


def _make_run(folder, summary=True, env=True):
    os.makedirs(folder, exist_ok=True)
    runs = _runs()
    with results.CsvAppender(os.path.join(folder, results.RUNS_FILE),
                             results.RUNS_COLUMNS) as appender:
        for row in runs:
            appender.append(row)
    if summary:
        results.write_csv(os.path.join(folder, results.SUMMARY_FILE),
                          results.SUMMARY_COLUMNS, results.summarize(runs))
    if env:
        results.write_json(os.path.join(folder, results.ENV_FILE),
                           {'net': 'alexnet', 'image_size': 64,
                            'batch_per_device': 4,
                            'device_kind': 'CPU replicas (@numpy)'})
    return runs


def _cut_last_row(path, keep_chars=7):
    """Cuts the file in the middle of its last row, as a crash would."""
    with open(path, newline='') as f:
        text = f.read()
    last_start = text.rstrip('\r\n').rfind('\n') + 1
    with open(path, 'w', newline='') as f:
        f.write(text[:last_start + keep_chars])


def _run_plot(folder):
    return subprocess.run(
        [sys.executable, '-m', 'experiments.plot', str(folder)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=300)


def _figures(folder):
    return sorted(name for name in os.listdir(str(folder))
                  if name.endswith('.png'))


# ------------------------------------------------------- results files

def test_write_csv_that_fails_midway_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / results.SUMMARY_FILE)
    summary = results.summarize(_runs())
    results.write_csv(path, results.SUMMARY_COLUMNS, summary)
    with open(path) as f:
        before = f.read()
    broken = [dict(summary[0]), {'mode': 'cgdp'}]  # second row lacks cells
    with pytest.raises(KeyError):
        results.write_csv(path, results.SUMMARY_COLUMNS, broken)
    with open(path) as f:
        assert f.read() == before
    assert os.listdir(str(tmp_path)) == [results.SUMMARY_FILE]


def test_write_json_that_fails_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / results.ENV_FILE)
    results.write_json(path, {'net': 'alexnet'})
    with pytest.raises(TypeError):
        results.write_json(path, {'net': object()})
    assert results.read_json(path) == {'net': 'alexnet'}
    assert os.listdir(str(tmp_path)) == [results.ENV_FILE]


def test_read_csv_drops_a_last_row_cut_short(tmp_path):
    _make_run(str(tmp_path), summary=False, env=False)
    path = str(tmp_path / results.RUNS_FILE)
    _cut_last_row(path)
    rows = results.read_csv(path)
    assert rows == _runs()[:-1]
    assert results.incomplete_last_line(path) == len(_runs()) + 1


def test_read_csv_of_a_file_cut_inside_its_header_is_empty(tmp_path):
    path = str(tmp_path / results.RUNS_FILE)
    with open(path, 'w') as f:
        f.write('mode,n_dev')
    assert results.read_csv(path) == []


@pytest.mark.parametrize('bad_row, words', [
    ('cgdp,2,1,4,64\r\n', 'line 3 has 5 cells'),
    ('cgdp,two,1,4,64,0,0.5\r\n', "line 3: n_devices 'two' is not a number"),
])
def test_read_csv_names_the_line_of_a_damaged_row(tmp_path, bad_row, words):
    path = str(tmp_path / results.RUNS_FILE)
    results.write_csv(path, results.RUNS_COLUMNS, _runs()[:1])
    with open(path, 'a', newline='') as f:
        f.write(bad_row)
        f.write('cgdp,2,1,4,64,1,0.5\r\n')
    with pytest.raises(results.DamagedFileError) as info:
        results.read_csv(path)
    assert path in str(info.value) and words in str(info.value)


@pytest.mark.parametrize('content', ['', '{"net": "alex'])
def test_read_json_names_an_empty_or_cut_file(tmp_path, content):
    path = str(tmp_path / results.ENV_FILE)
    with open(path, 'w') as f:
        f.write(content)
    with pytest.raises(results.DamagedFileError, match='env.json is damaged'):
        results.read_json(path)


# ---------------------------------------------------------------- redraw

def test_redraw_uses_the_complete_rows_of_a_cut_runs_csv(tmp_path, capsys):
    folder = str(tmp_path / 'run')
    runs = _make_run(folder, summary=False)
    _cut_last_row(os.path.join(folder, results.RUNS_FILE))
    notes = []
    summary = plot.load_summary(folder, notes)
    assert summary == results.summarize(runs[:-1])
    assert len(notes) == 1
    assert 'runs.csv: line {} was cut short'.format(len(runs) + 1) \
        in notes[0]
    plot.main([folder])
    captured = capsys.readouterr()
    assert 'note: ' in captured.err and 'cut short' in captured.err
    assert _figures(folder) == sorted([plot.EFFICIENCY_PNG,
                                       plot.SPEEDUP_PNG, plot.THROUGHPUT_PNG])


def test_a_missing_summary_is_derived_from_runs_csv(tmp_path):
    folder = str(tmp_path / 'run')
    runs = _make_run(folder, summary=False)
    notes = []
    assert plot.load_summary(folder, notes) == results.summarize(runs)
    assert notes == []


def test_a_damaged_summary_is_derived_again_from_runs_csv(tmp_path):
    folder = str(tmp_path / 'run')
    runs = _make_run(folder)
    summary_path = os.path.join(folder, results.SUMMARY_FILE)
    # A summary written in place by an older version, cut by a crash.
    _cut_last_row(summary_path, keep_chars=3)
    notes = []
    assert plot.load_summary(folder, notes) == results.summarize(runs)
    assert any('summary.csv is damaged' in note for note in notes)
    assert any('derived the summary again' in note for note in notes)


@pytest.mark.parametrize('content', ['', '{"net": "alexnet", "ima'],
                         ids=['empty', 'truncated'])
def test_redraw_names_a_damaged_env_json_and_draws_anyway(tmp_path,
                                                          content):
    folder = str(tmp_path / 'run')
    _make_run(folder)
    with open(os.path.join(folder, results.ENV_FILE), 'w') as f:
        f.write(content)
    completed = _run_plot(folder)
    assert completed.returncode == 0, completed.stderr
    assert 'Traceback' not in completed.stderr
    assert 'env.json is damaged' in completed.stderr
    assert os.path.join(folder, plot.EFFICIENCY_PNG) in completed.stdout
    assert plot.EFFICIENCY_PNG in _figures(folder)


def test_nothing_drawable_is_one_error_line_naming_the_damage(tmp_path):
    folder = str(tmp_path / 'run')
    _make_run(folder, summary=False, env=False)
    with open(os.path.join(folder, results.RUNS_FILE), 'a',
              newline='') as f:
        f.write('cgdp,2,1\r\ncgdp,2,1,4,64,9,0.5\r\n')
    completed = _run_plot(folder)
    assert completed.returncode == 2, completed.stderr
    assert 'Traceback' not in completed.stderr
    errors = [line for line in completed.stderr.splitlines()
              if line.startswith('error: ')]
    assert len(errors) == 1
    assert 'runs.csv is damaged: line {} has 3 cells'.format(
        len(_runs()) + 2) in errors[0]
    assert _figures(folder) == []


def test_a_damaged_index_is_named(tmp_path):
    all_dir = tmp_path / 'all' / 'run'
    all_dir.mkdir(parents=True)
    (all_dir / results.INDEX_FILE).write_text('{"run_id": "run", "ne')
    completed = _run_plot(all_dir)
    assert completed.returncode == 2
    assert 'Traceback' not in completed.stderr
    assert 'index.json is damaged' in completed.stderr


def test_a_failed_redraw_keeps_the_previous_figure(tmp_path):
    folder = str(tmp_path / 'run')
    _make_run(folder)
    plot.draw_run(folder)
    path = os.path.join(folder, plot.EFFICIENCY_PNG)
    with open(path, 'rb') as f:
        before = f.read()
    figure = plot.plt.figure()
    # Invalid mathtext: the error comes while the file is being rendered.
    figure.text(0.5, 0.5, r'$\frac{$')
    with pytest.raises(ValueError):
        plot._save(figure, path)
    with open(path, 'rb') as f:
        assert f.read() == before
    assert not [name for name in os.listdir(folder) if name.startswith('.')]


def test_env_json_written_by_the_schema_round_trips(tmp_path):
    path = str(tmp_path / results.ENV_FILE)
    data = {'net': 'vgg16', 'devices': ['@numpy'] * 2, 'image_size': 64}
    results.write_json(path, data)
    with open(path) as f:
        assert json.load(f) == data
