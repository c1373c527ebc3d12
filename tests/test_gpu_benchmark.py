"""``python -m benchmarks.gpu`` runs end to end on the CPU stand-in
('@numpy', a tiny net, one iteration) and writes every row, ratio and
prediction, each consistent with the times it comes from; bad options exit
with status 2 and one line. Timings themselves are not checked (a shared
2-core machine says nothing about them)."""
import csv
import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu
from benchmarks import gpu_model
from cli_checks import BAD_SIZES_AND_ROUNDS, assert_usage_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = 'models.examples:tiny'
RUNS = ('standard', 'cgdp_process', 'cgdp_thread', 'limit')


def _benchmark(*args, timeout=600):
    return subprocess.run(
        [sys.executable, '-m', 'benchmarks.gpu'] + list(args), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=timeout)


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    """One tiny run on '@numpy': its output and what it wrote."""
    out = str(tmp_path_factory.mktemp('gpu_benchmark'))
    job = _benchmark('--device', '@numpy', '--nets', NET, '--image-size',
                     '32', '--batches', '2', '--iterations', '1',
                     '--warmup', '0', '--rounds', '1', '--profile-reps',
                     '1', '--out', out)
    assert job.returncode == 0, job.stdout + job.stderr
    with open(os.path.join(out, gpu.JSON_FILE)) as f:
        report = json.load(f)
    return job.stdout, report, out


def _read_csv(path):
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_one_row_per_net_and_batch_with_every_time(tiny_run):
    stdout, report, out = tiny_run
    assert gpu.TABLE_HEADER in stdout
    (row,) = report['rows']
    assert (row['net'], row['batch'], row['image_size']) == (NET, 2, 32)
    for run in RUNS:
        assert row['{}_ms'.format(run)] > 0
    written = _read_csv(os.path.join(out, gpu.CSV_FILE))
    assert list(written[0]) == gpu.summary_columns()
    assert len(written) == 1 and written[0]['net'] == NET
    assert float(written[0]['limit_ms']) == pytest.approx(row['limit_ms'])


@pytest.mark.slow
def test_ratios_are_the_times_ratios(tiny_run):
    _, report, _ = tiny_run
    (row,) = report['rows']
    for workers in ('process', 'thread'):
        cgdp = row['cgdp_{}_ms'.format(workers)]
        assert row['speedup_{}'.format(workers)] == pytest.approx(
            row['standard_ms'] / cgdp)
        assert row['vs_limit_{}'.format(workers)] == pytest.approx(
            row['limit_ms'] / cgdp)


@pytest.mark.slow
def test_breakdown_parts_fit_inside_the_measured_iteration(tiny_run):
    # One measured iteration: the parts are that iteration's, they add up
    # to update() as the timeline saw it, which the measured time (update()
    # and the synchronize) encloses.
    _, report, _ = tiny_run
    (row,) = report['rows']
    for workers in ('process', 'thread'):
        parts = [row['{}_{}_ms'.format(workers, part)]
                 for part in gpu.BREAKDOWN]
        assert all(part >= 0 for part in parts), parts
        assert parts[1] > 0 and parts[2] > 0  # a forward and a backward
        assert sum(parts) <= row['cgdp_{}_ms'.format(workers)] + 1e-3


@pytest.mark.slow
def test_goal_misses_follow_the_ratios(tiny_run):
    _, report, _ = tiny_run
    (row,) = report['rows']
    misses = report['misses'].get('{} batch 2'.format(NET), [])
    for workers in ('process', 'thread'):
        below = row['speedup_{}'.format(workers)] < gpu.SPEEDUP_GOAL
        assert below == any('({}) speedup'.format(workers) in miss
                            for miss in misses)
    # No CGDP / limit goal at batch 2.
    assert not any('/ limit' in miss for miss in misses)


@pytest.mark.slow
def test_model_predicts_each_run_against_its_measured_time(tiny_run):
    stdout, report, out = tiny_run
    (row,) = report['rows']
    model = report['model']
    assert [r['run'] for r in model['rows']] == [
        run for run, _, _ in gpu_model.PREDICTED_RUNS]
    for predicted in model['rows']:
        measured = row['{}_ms'.format(predicted['run'].replace('-', '_'))]
        assert predicted['measured_ms'] == pytest.approx(measured)
        assert predicted['predicted_ms'] > 0
        assert predicted['error'] == pytest.approx(
            predicted['predicted_ms'] / measured - 1.0)
    assert 'median absolute error' in stdout
    written = _read_csv(os.path.join(out, gpu_model.MODEL_FILE))
    assert [r['run'] for r in written] == [r['run'] for r in model['rows']]


@pytest.mark.slow
def test_model_predicts_scaling_from_the_measured_link(tiny_run):
    _, report, out = tiny_run
    model = report['model']
    assert [r['n_devices'] for r in model['scaling']] == \
        list(gpu_model.SCALING_DEVICES)
    for point in model['scaling']:
        assert 0 < point['eff_cgdp'] and 0 < point['eff_typical']
        assert point['eff_nccl'] is None  # no NCCL on the CPU
    (link,) = model['links']
    for key in gpu_model.LINK_COLUMNS:
        assert link[key] > 0, key
    written = _read_csv(os.path.join(out, gpu_model.SCALING_FILE))
    assert [int(r['n_devices']) for r in written] == \
        list(gpu_model.SCALING_DEVICES)


@pytest.mark.parametrize('args, words', BAD_SIZES_AND_ROUNDS + [
    (['--out', '/proc/benchmarks_gpu'], '--out'),
])
def test_bad_options_exit_2_with_one_line(args, words):
    job = _benchmark('--device', '@numpy', *args, timeout=120)
    assert_usage_error(job, words)
    assert job.stdout == ''
