"""Tests of the weak-scaling experiment, its results schema and its figures.

One small end-to-end run (AlexNet, 64 px, 1 and 2 CPU replicas, one
warm-up and two measured iterations) is shared by the tests that inspect
its files; the command-line errors run the real scripts in subprocesses.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy
import pytest
from PIL import Image

from cgdp_chainer import devices
from cgdp_chainer.timeline import EVENT_KINDS
from cgdp_chainer.timeline import Event
from experiments import plot
from experiments import results
from cli_checks import assert_usage_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = (plot.EFFICIENCY_PNG, plot.THROUGHPUT_PNG, plot.SPEEDUP_PNG,
           plot.TIMELINE_PNG)
# The end-to-end run that the output checks read: a tiny network, as the
# pipeline does not depend on it (the four networks' own runs are the
# README's block and the make-experiment tests below; AlexNet's 60 million
# parameters, pickled to the worker processes, made this one take 30 s).
SMALL_NET = 'models.examples:tiny'
SMALL_RUN = ['--net', SMALL_NET, '--devices', '1,2', '--iterations', '2',
             '--warmup', '1', '--image-size', '64', '--batch', '2',
             '--classes', '1000']


# make, taking the venv as it is: a test never sets it up again (-o: the
# stamp of its installation counts as up to date).
MAKE = ['make', '--no-print-directory', '-o', '.venv/.installed']


def run_module(module, *args, timeout=300):
    """Runs ``python -m module args`` from the repository root."""
    return subprocess.run([sys.executable, '-m', module] + list(args),
                          cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def only_folder(path):
    """The single folder inside ``path``."""
    entries = os.listdir(path)
    assert len(entries) == 1, entries
    return os.path.join(path, entries[0])


def pixels(path):
    with Image.open(path) as image:
        return image.size, image.mode, image.tobytes()


def assert_valid_png(path):
    with Image.open(path) as image:
        assert image.format == 'PNG'
        width, height = image.size
        assert width > 0 and height > 0


@pytest.fixture(scope='module')
def small_run(tmp_path_factory):
    """The folder of one small end-to-end run."""
    out = str(tmp_path_factory.mktemp('results'))
    completed = run_module('experiments.weak_scaling', *SMALL_RUN,
                           '--out', out)
    assert completed.returncode == 0, completed.stderr
    # The folder of a module:callable net: a dash for the colon.
    return only_folder(os.path.join(out, 'models.examples-tiny')), completed


# ------------------------------------------------------------- end to end

@pytest.mark.slow
def test_small_run_writes_runs_and_summary(small_run):
    folder, _ = small_run
    results.check_columns(os.path.join(folder, results.RUNS_FILE),
                          results.RUNS_COLUMNS)
    results.check_columns(os.path.join(folder, results.SUMMARY_FILE),
                          results.SUMMARY_COLUMNS)
    runs = results.read_csv(os.path.join(folder, results.RUNS_FILE))
    # nccl needs GPUs, so on CPU replicas: 2 modes x 2 counts x 2 iterations.
    assert sorted({(r['mode'], r['n_devices']) for r in runs}) == [
        ('cgdp', 1), ('cgdp', 2), ('typical', 1), ('typical', 2)]
    assert len(runs) == 8
    assert {r['iteration'] for r in runs} == {0, 1}
    assert all(r['n_ranks'] == 1 and r['batch_per_device'] == 2
               and r['image_size'] == 64 and r['seconds'] > 0 for r in runs)

    summary = {(r['mode'], r['n_devices']): r for r in results.read_csv(
        os.path.join(folder, results.SUMMARY_FILE))}
    assert set(summary) == {(r['mode'], r['n_devices']) for r in runs}
    for (mode, n), row in summary.items():
        assert row['throughput'] == pytest.approx(2 * n / row['median_s'])
        if n == 1:
            assert row['efficiency'] == pytest.approx(1.0)
        if mode == 'cgdp':
            assert row['speedup_vs_typical'] == pytest.approx(
                summary['typical', n]['median_s'] / row['median_s'])
        else:
            assert row['speedup_vs_typical'] is None


@pytest.mark.slow
def test_small_run_writes_timeline_env_and_figures(small_run):
    folder, completed = small_run
    results.check_columns(os.path.join(folder, results.TIMELINE_FILE),
                          results.TIMELINE_COLUMNS)
    events = results.read_csv(os.path.join(folder, results.TIMELINE_FILE))
    assert events
    # One iteration at the largest N: both replicas and the host appear.
    assert {'0', '1', 'host'} <= {e['device'] for e in events}
    assert {e['kind'] for e in events} <= set(EVENT_KINDS)
    assert {'forward', 'backward', 'update'} <= {e['kind'] for e in events}
    assert all(e['end'] >= e['start'] >= -1e-3 for e in events)

    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    for key in ('python', 'chainer', 'numpy', 'cupy', 'device_names',
                'cpu_model', 'cpu_count', 'git_commit', 'command',
                'image_size', 'image_size_reason', 'load_average_at_start'):
        assert key in env, key
    assert env['chainer'] == '7.8.1'
    assert env['image_size'] == 64
    assert env['image_size_reason'] == 'given with --image-size'
    assert '--net {}'.format(SMALL_NET) in env['command']
    assert env['finished'] is True
    assert env['timeline']['n_devices'] == 2
    assert env['timeline']['iteration'] >= 1  # a measured one, not warm-up
    assert re.match(r'^\d+ chunks? of ', env['timeline']['chunking'])
    assert [s['mode'] for s in env['skipped']] == ['nccl', 'nccl']
    assert 'nccl' in completed.stdout  # the skip was announced

    for name in FIGURES:
        assert_valid_png(os.path.join(folder, name))


@pytest.mark.slow
def test_small_run_predicts_its_points_and_draws_them_dashed(small_run):
    folder, _ = small_run
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['model']['file'] == results.MODEL_FILE
    model = plot.load_model(folder)
    summary = plot.load_summary(folder)
    # One prediction for each measured point, from a profile of this run.
    assert sorted((r['mode'], r['n_devices']) for r in model) == sorted(
        (r['mode'], r['n_devices']) for r in summary)
    for row in model:
        assert row['median_s'] > 0
        if row['n_devices'] == 1:
            assert row['efficiency'] == pytest.approx(1.0)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    try:
        plot.plot_efficiency_lines(ax, summary, model)
        dashed = {line.get_label(): list(line.get_ydata())
                  for line in ax.lines if line.get_linestyle() == '--'}
    finally:
        plt.close(fig)
    for mode in ('typical', 'cgdp'):
        expected = [r['efficiency'] for r in sorted(
            (r for r in model if r['mode'] == mode),
            key=lambda r: r['n_devices'])]
        assert dashed['{} (cost model)'.format(mode)] == pytest.approx(
            expected)


@pytest.mark.slow
def test_redraw_from_csv_reproduces_the_figures(small_run, tmp_path):
    folder, _ = small_run
    copy = str(tmp_path / 'run')
    shutil.copytree(folder, copy)
    for name in FIGURES:
        os.remove(os.path.join(copy, name))
    completed = run_module('experiments.plot', copy)
    assert completed.returncode == 0, completed.stderr
    for name in FIGURES:
        assert pixels(os.path.join(copy, name)) == pixels(
            os.path.join(folder, name)), name


@pytest.mark.slow
def test_all_networks_figure_from_an_index(small_run, tmp_path):
    folder, _ = small_run
    all_dir = tmp_path / 'all' / 'run'
    all_dir.mkdir(parents=True)
    results.write_json(str(all_dir / results.INDEX_FILE), {
        'run_id': 'run',
        'nets': {'alexnet': os.path.relpath(folder, str(all_dir)),
                 'alexnet again': os.path.relpath(folder, str(all_dir))}})
    path = plot.draw_all(str(all_dir))
    assert path == str(all_dir / plot.EFFICIENCY_ALL_PNG)
    assert_valid_png(path)


@pytest.mark.slow
def test_ctrl_c_keeps_what_finished(tmp_path):
    out = str(tmp_path)
    process = subprocess.Popen(
        [sys.executable, '-m', 'experiments.weak_scaling', '--net',
         'alexnet', '--devices', '2', '--modes', 'cgdp', '--iterations',
         '200', '--warmup', '1', '--image-size', '64', '--batch', '1',
         '--classes', '10', '--out', out],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runs_path = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if runs_path is None and os.path.isdir(
                    os.path.join(out, 'alexnet')):
                runs_path = os.path.join(only_folder(
                    os.path.join(out, 'alexnet')), results.RUNS_FILE)
            if runs_path and os.path.exists(runs_path):
                with open(runs_path) as f:
                    if len(f.readlines()) >= 3:  # header + 2 rows
                        break
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert 'interrupted' in stdout
    assert 'Traceback' not in stderr
    folder = os.path.dirname(runs_path)
    runs = results.read_csv(runs_path)
    assert 2 <= len(runs) < 200
    summary = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    assert [(r['mode'], r['n_devices']) for r in summary] == [('cgdp', 2)]
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['interrupted'] is True and env['finished'] is False
    assert_valid_png(os.path.join(folder, plot.EFFICIENCY_PNG))


@pytest.mark.slow
def test_sigterm_to_make_experiment_keeps_what_finished(tmp_path):
    # make passes its SIGTERM on to the experiment, which keeps what
    # finished as after Ctrl-C and exits with 143 (128 + SIGTERM).
    out = str(tmp_path / 'results')
    process = subprocess.Popen(
        MAKE + ['experiment', 'NET=alexnet', 'DEVICES=1', 'MODES=cgdp',
                'ITERATIONS=200', 'WARMUP=1', 'BATCH=1', 'IMAGE_SIZE=64',
                'OUT=' + out],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        runs_path = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            if runs_path is None and os.path.isdir(
                    os.path.join(out, 'alexnet')):
                runs_path = os.path.join(only_folder(
                    os.path.join(out, 'alexnet')), results.RUNS_FILE)
            if runs_path and os.path.exists(runs_path):
                with open(runs_path) as f:
                    if len(f.readlines()) >= 3:  # header + 2 rows
                        break
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)  # to make alone
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # make reports the experiment's status, then ends by its own SIGTERM.
    assert 'Error 143' in stderr, stderr
    assert process.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)
    assert 'Traceback' not in stderr
    assert stdout.rstrip().splitlines()[-1].startswith(
        'interrupted: kept the iterations that finished (stopped by '
        'SIGTERM)'), stdout
    folder = os.path.dirname(runs_path)
    runs = results.read_csv(runs_path)
    assert 2 <= len(runs) < 200
    summary = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    assert [(r['mode'], r['n_devices']) for r in summary] == [('cgdp', 1)]
    assert '\n{}\nmode '.format(folder) in stdout, stdout
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['interrupted'] is True and env['finished'] is False


# ------------------------------------------------------------- bad input

def test_unknown_network_lists_the_names():
    completed = run_module('experiments.weak_scaling', '--net', 'lenet')
    assert_usage_error(completed, 'lenet', 'alexnet', 'googlenet', 'vgg16',
                       'resnet152')


@pytest.mark.parametrize('counts', ['0', '1,two', '-1', '1.5'])
def test_device_counts_must_be_positive_integers(counts):
    completed = run_module('experiments.weak_scaling', '--net', 'alexnet',
                           '--devices', counts)
    assert_usage_error(completed, '--devices')


def test_more_gpus_than_present_says_how_many():
    present = devices.gpu_count()
    completed = run_module('experiments.weak_scaling', '--net', 'alexnet',
                           '--device-kind', 'gpu', '--devices',
                           str(present + 1))
    assert_usage_error(completed, 'has {} GPU'.format(present))


def test_image_too_small_for_the_network():
    completed = run_module('experiments.weak_scaling', '--net', 'resnet152',
                           '--image-size', '32')
    assert_usage_error(completed, 'resnet152', '64')


TINY = ['--net', 'alexnet', '--devices', '1', '--iterations', '1',
        '--warmup', '0', '--image-size', '64', '--batch', '1',
        '--classes', '4']


def assert_refused_before_any_run(completed, out, *fragments):
    """A usage error (see assert_usage_error) and no trace of a run: no
    plan printed, no results root created."""
    assert_usage_error(completed, *fragments)
    assert completed.stdout == '', completed.stdout
    assert not os.path.exists(out), os.listdir(out)


def test_chunk_size_beyond_the_layers_is_refused_before_any_mode(tmp_path):
    out = str(tmp_path / 'results')
    completed = run_module('experiments.weak_scaling', *TINY,
                           '--chunk-size', '999', '--out', out)
    assert_refused_before_any_run(
        completed, out, '--chunk-size 999', 'the 8 layers of alexnet',
        "1 to 8, 'auto' or 'model'")


def test_chunk_size_limit_is_the_one_cgdp_applies():
    import chainer
    from experiments import run_plan
    from experiments import train
    # AlexNet: five convolutions and three fully connected layers.
    limit = run_plan.layer_count('alexnet')
    assert limit == 8
    model = train.build_model('alexnet', n_classes=2)
    optimizer = train.build_optimizer(model)
    iterator = chainer.iterators.SerialIterator([], 1)
    updater = train.build_updater('cgdp', iterator, optimizer, ['@numpy'],
                                  chunk_size=limit)
    updater.finalize()
    with pytest.raises(ValueError, match='out of range'):
        train.build_updater('cgdp', iterator, optimizer, ['@numpy'],
                            chunk_size=limit + 1)


@pytest.mark.parametrize('where', ['file', 'under a file'])
def test_out_that_cannot_hold_results_is_refused_before_any_mode(tmp_path,
                                                                 where):
    blocker = tmp_path / 'a-file'
    blocker.write_text('not a folder')
    out = str(blocker if where == 'file' else blocker / 'results')
    completed = run_module('experiments.weak_scaling', *TINY, '--out', out)
    assert_usage_error(completed, '--out {}'.format(out))
    assert completed.stdout == '', completed.stdout
    assert blocker.read_text() == 'not a folder'
    assert os.listdir(str(tmp_path)) == ['a-file']


def test_a_run_with_nothing_to_measure_is_an_error(tmp_path):
    out = str(tmp_path / 'results')
    completed = run_module('experiments.weak_scaling', *TINY,
                           '--device-kind', 'cpu', '--modes', 'nccl',
                           '--out', out)
    assert_refused_before_any_run(
        completed, out, 'nothing to measure', 'nccl at N=1: needs GPUs',
        '--modes can be typical, cgdp')


@pytest.mark.parametrize('ranks', ['0', 'x', '-1', '2x'])
def test_makefile_refuses_a_rank_count_that_is_not_positive(tmp_path,
                                                            ranks):
    out = str(tmp_path / 'results')
    completed = subprocess.run(
        MAKE + ['experiment', 'NET=alexnet', 'RANKS=' + ranks, 'DEVICES=1',
                'ITERATIONS=1', 'WARMUP=0', 'BATCH=1', 'IMAGE_SIZE=64',
                'OUT=' + out],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2, (completed.stdout, completed.stderr)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert 'RANKS={} is not a number of MPI ranks'.format(ranks) in lines[0]
    assert 'positive integer' in lines[0]
    assert completed.stdout == ''
    assert not os.path.exists(out)


def test_plot_of_a_missing_folder(tmp_path):
    completed = run_module('experiments.plot', str(tmp_path / 'nowhere'))
    assert_usage_error(completed, 'nowhere')


# ------------------------------------------------------ the results schema

def test_summary_efficiency_and_speedup():
    rows = []
    medians = {('typical', 1): 1.0, ('typical', 2): 2.5, ('typical', 4): 5.0,
               ('cgdp', 1): 1.0, ('cgdp', 2): 1.25, ('cgdp', 4): 2.0,
               ('nccl', 2): 1.1}
    for (mode, n), median in medians.items():
        for iteration, seconds in enumerate((median * 0.9, median,
                                             median * 1.2)):
            rows.append(results.run_row(mode, n, 4, 64, iteration, seconds))
    summary = {(r['mode'], r['n_devices']): r
               for r in results.summarize(rows)}
    assert summary['typical', 2]['median_s'] == pytest.approx(2.5)
    assert summary['typical', 2]['iqr_s'] == pytest.approx(
        numpy.percentile([2.25, 2.5, 3.0], 75)
        - numpy.percentile([2.25, 2.5, 3.0], 25))
    assert summary['cgdp', 4]['throughput'] == pytest.approx(16 / 2.0)
    # throughput(N) / (N x throughput(1)) = time(1) / time(N) here.
    assert summary['typical', 4]['efficiency'] == pytest.approx(0.2)
    assert summary['cgdp', 2]['efficiency'] == pytest.approx(0.8)
    # nccl has no one-device run: it is compared with typical's.
    assert summary['nccl', 2]['efficiency'] == pytest.approx(1 / 1.1)
    assert summary['cgdp', 4]['speedup_vs_typical'] == pytest.approx(2.5)
    assert summary['nccl', 2]['speedup_vs_typical'] is None
    assert summary['typical', 1]['speedup_vs_typical'] is None
    assert [r['mode'] for r in results.summarize(rows)] == [
        'typical'] * 3 + ['cgdp'] * 3 + ['nccl']


def test_summary_of_multi_rank_rows():
    def rows(mode, n_devices, n_ranks, median):
        return [results.run_row(mode, n_devices, 4, 64, i, median * f,
                                n_ranks=n_ranks)
                for i, f in enumerate((0.9, 1.0, 1.2))]
    # What an MPI run of 2 ranks measures: no 1-rank x 1-device row.
    runs = (rows('cgdp', 1, 2, 1.0) + rows('cgdp', 2, 2, 1.6)
            + rows('chainermn', 1, 2, 1.5))
    summary = {(r['mode'], r['n_devices']): r
               for r in results.summarize(runs)}
    assert summary['cgdp', 2]['throughput'] == pytest.approx(4 * 4 / 1.6)
    assert all(r['efficiency'] is None for r in summary.values())
    # Multi-rank CGDP is compared with ChainerMN at the same R and replicas.
    assert summary['cgdp', 1]['speedup_vs_typical'] == pytest.approx(1.5)
    assert summary['cgdp', 2]['speedup_vs_typical'] is None
    notes = results.summary_notes(list(summary.values()))
    assert any('empty for cgdp, chainermn' in note for note in notes)
    # With the same mode at 1 rank x 1 device (RANKS=1, or runs merged):
    # throughput / (R x N x that throughput); typical is not used for them.
    runs += rows('cgdp', 1, 1, 0.5) + rows('typical', 1, 1, 0.25)
    summary = {(r['mode'], r['n_devices'], r['n_ranks']): r
               for r in results.summarize(runs)}
    assert summary['cgdp', 2, 2]['efficiency'] == pytest.approx(
        (16 / 1.6) / (4 * 4 / 0.5))
    assert summary['chainermn', 1, 2]['efficiency'] is None
    assert summary['cgdp', 1, 1]['efficiency'] == pytest.approx(1.0)
    assert results.summary_notes([summary['cgdp', 1, 1]]) == []


def test_csv_round_trip_keeps_values(tmp_path):
    path = str(tmp_path / 'summary.csv')
    row = {'mode': 'cgdp', 'n_devices': 2, 'n_ranks': 1,
           'batch_per_device': 4, 'image_size': 64, 'median_s': 0.1 + 0.2,
           'iqr_s': 1e-17, 'throughput': 1 / 3.0, 'efficiency': None,
           'speedup_vs_typical': 2.5}
    results.write_csv(path, results.SUMMARY_COLUMNS, [row])
    assert results.read_csv(path) == [row]
    with pytest.raises(ValueError):
        results.check_columns(path, results.RUNS_COLUMNS)


def test_timeline_rows_are_relative_to_the_iteration():
    events = [Event(3, 0, 'forward', 0, 10.5, 10.75),
              Event(3, 'host', 'update', 0, 11.0, 11.25),
              Event(4, 0, 'forward', 0, 12.0, 12.5)]
    assert results.timeline_rows(events, 3, 10.0) == [
        {'device': '0', 'kind': 'forward', 'chunk': 0, 'start': 0.5,
         'end': 0.75},
        {'device': 'host', 'kind': 'update', 'chunk': 0, 'start': 1.0,
         'end': 1.25}]


def test_free_run_id_avoids_existing_folders(tmp_path):
    import datetime
    now = datetime.datetime(2024, 5, 6, 7, 8, 9)
    root = str(tmp_path)
    assert results.free_run_id(root, ['alexnet'], now) == '20240506-070809'
    os.makedirs(results.run_dir(root, 'all', '20240506-070809'))
    assert results.free_run_id(root, ['alexnet', 'all'], now) == \
        '20240506-070809-2'


def test_env_records_versions_and_settings():
    env = results.collect_env(['python', '-m', 'x', '--net', 'a b'],
                              image_size=64, image_size_reason='test')
    assert env['command'] == "python -m x --net 'a b'"
    assert env['image_size'] == 64 and env['image_size_reason'] == 'test'
    assert env['cpu_count'] == os.cpu_count()
    json.dumps(env)  # serializable as it is
