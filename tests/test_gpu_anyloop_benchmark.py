"""``python -m benchmarks.gpu_anyloop`` runs end to end on the CPU ('@numpy',
a tiny net, one iteration): one rank in a singleton MPI process, and two
ranks under the project's mpiexec. Every printed row carries the four times
and ratios that are the ratios of those times; bad options exit with
status 2 and one line. Timings themselves are not checked (a shared 2-core
machine says nothing about them)."""
import csv
import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu_anyloop
from cgdp_chainer import mpi as cgdp_mpi
from test_mpi import mpiexec  # NOQA: F401  (the fixture)
from cli_checks import BAD_SIZES_AND_ROUNDS, assert_usage_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = 'models.examples:tiny'
TINY = ('--device', '@numpy', '--nets', NET, '--image-size', '32',
        '--batches', '2', '--iterations', '1', '--warmup', '0', '--rounds',
        '1')


def _benchmark(*args, timeout=600):
    return subprocess.run(
        [sys.executable, '-m', 'benchmarks.gpu_anyloop'] + list(args),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=timeout)


def _tiny_run(out, *args):
    job = _benchmark(*(TINY + args + ('--out', out)))
    assert job.returncode == 0, job.stdout + job.stderr
    with open(os.path.join(out, gpu_anyloop.JSON_FILE)) as f:
        return job.stdout, json.load(f)


@pytest.fixture(scope='module')
def one_rank(tmp_path_factory):
    """One tiny run of the 1-rank part: its output, report and folder."""
    pytest.importorskip('mpi4py')
    out = str(tmp_path_factory.mktemp('gpu_anyloop'))
    return _tiny_run(out) + (out,)


def _read_csv(path):
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def _printed_rows(stdout, header):
    """The table rows under ``header``: the lines that start with the
    network's name, split into words."""
    lines = stdout.splitlines()
    start = lines.index(header) + 1
    return [line.replace('|', ' ').split() for line in lines[start:]
            if line.startswith(NET)]


def _assert_ratio_of_printed(ratio, numerator, denominator):
    """A printed ratio (3 decimals) against the ratio of two printed times
    (2 decimals): equal up to the rounding of each."""
    exact = numerator / denominator
    slack = exact * (0.005 / numerator + 0.005 / denominator) + 0.0005
    assert abs(ratio - exact) <= slack * 1.01, (ratio, numerator,
                                                denominator)


@pytest.mark.mpi
@pytest.mark.slow
def test_one_row_per_net_and_batch_with_the_four_times(one_rank):
    stdout, report, out = one_rank
    assert gpu_anyloop.TABLE_HEADER in stdout
    (row,) = report['rows']
    assert (row['net'], row['batch'], row['image_size']) == (NET, 2, 32)
    for run in gpu_anyloop.RUNS:
        assert row['{}_ms'.format(run)] > 0, run
    written = _read_csv(os.path.join(out, gpu_anyloop.CSV_FILE))
    assert list(written[0]) == gpu_anyloop.summary_columns()
    assert len(written) == 1 and written[0]['net'] == NET
    assert float(written[0]['cgdp_ms']) == pytest.approx(row['cgdp_ms'])
    assert report['rank_rows'] == []  # no --ranks 2 asked for


@pytest.mark.mpi
@pytest.mark.slow
def test_ratios_are_the_ratios_of_the_times(one_rank):
    _, report, _ = one_rank
    (row,) = report['rows']
    for ratio, (numerator, denominator) in gpu_anyloop.RATIOS.items():
        assert row[ratio] == pytest.approx(
            row['{}_ms'.format(numerator)] /
            row['{}_ms'.format(denominator)]), ratio


@pytest.mark.mpi
@pytest.mark.slow
def test_printed_row_holds_the_times_and_their_ratios(one_rank):
    stdout, report, _ = one_rank
    (row,) = report['rows']
    (printed,) = _printed_rows(stdout, gpu_anyloop.TABLE_HEADER)
    assert printed[:2] == [NET, '2']
    times = dict(zip(gpu_anyloop.RUNS, map(float, printed[2:6])))
    ratios = dict(zip(gpu_anyloop.RATIOS, map(float, printed[6:9])))
    for run, value in times.items():
        assert value == pytest.approx(row['{}_ms'.format(run)], abs=0.006)
    for ratio, (numerator, denominator) in gpu_anyloop.RATIOS.items():
        _assert_ratio_of_printed(ratios[ratio], times[numerator],
                                 times[denominator])


@pytest.mark.mpi
@pytest.mark.slow
def test_goal_misses_follow_the_ratios(one_rank):
    stdout, report, _ = one_rank
    (row,) = report['rows']
    misses = report['misses'].get('{} batch 2'.format(NET), [])
    below = row['plain_vs_cgdp'] < gpu_anyloop.PLAIN_GOAL
    assert below == any('plain/cgdp' in miss for miss in misses)
    # No limit/cgdp goal at batch 2.
    assert not any('limit/cgdp' in miss for miss in misses)
    assert ('goal missed' in stdout) == bool(misses)


@pytest.mark.mpi
@pytest.mark.slow
def test_two_ranks_compare_chainermn_with_cgdp(mpiexec, tmp_path):  # NOQA
    stdout, report = _tiny_run(str(tmp_path), '--ranks', '2')
    assert report['rows'] == []  # only the 2-rank part was asked for
    (row,) = report['rank_rows']
    assert (row['net'], row['batch'], row['ranks']) == (NET, 2, 2)
    assert row['chainermn_vs_cgdp'] == pytest.approx(
        row['chainermn_ms'] / row['cgdp_ms'])
    (printed,) = _printed_rows(stdout, gpu_anyloop.RANKS_HEADER)
    assert printed[:3] == [NET, '2', '2']
    chainermn_ms, cgdp_ms, ratio = map(float, printed[3:6])
    assert chainermn_ms == pytest.approx(row['chainermn_ms'], abs=0.006)
    assert cgdp_ms == pytest.approx(row['cgdp_ms'], abs=0.006)
    _assert_ratio_of_printed(ratio, chainermn_ms, cgdp_ms)
    written = _read_csv(os.path.join(str(tmp_path),
                                     gpu_anyloop.RANKS_CSV_FILE))
    assert list(written[0]) == gpu_anyloop.ranks_columns()
    assert [int(r['ranks']) for r in written] == [2]


def test_without_mpiexec_the_ranks_part_says_so_and_is_skipped(
        tmp_path, monkeypatch, capsys):
    # A Python with no mpiexec beside it and no CGDP_MPIEXEC: nothing is
    # launched, the run ends normally and says what it left out.
    monkeypatch.setattr(sys, 'executable', str(tmp_path / 'python'))
    monkeypatch.delenv(cgdp_mpi.MPIEXEC_VARIABLE, raising=False)
    report = gpu_anyloop.main(list(TINY) + ['--ranks', '2'])
    assert report['rank_rows'] == [] and report['rows'] == []
    assert report['skipped'] == ['2 ranks: no mpiexec']
    assert 'no mpiexec next to {}'.format(tmp_path / 'python') in \
        capsys.readouterr().out


def test_a_named_mpiexec_that_is_missing_ends_the_ranks_part(
        tmp_path, monkeypatch):
    # Named, but not there: refused, never replaced by another mpiexec.
    missing = str(tmp_path / 'bin' / 'mpiexec')
    monkeypatch.setenv(cgdp_mpi.MPIEXEC_VARIABLE, missing)
    with pytest.raises(gpu_anyloop.BenchmarkFailed) as error:
        gpu_anyloop.main(list(TINY) + ['--ranks', '2'])
    assert '{}={}'.format(cgdp_mpi.MPIEXEC_VARIABLE, missing) in \
        str(error.value)


@pytest.mark.parametrize('args, words', BAD_SIZES_AND_ROUNDS + [
    (['--ranks', '0'], 'positive'),
    (['--ranks', ','], 'no rank count'),
    (['--out', '/proc/benchmarks_gpu_anyloop'], '--out'),
])
def test_bad_options_exit_2_with_one_line(args, words):
    job = _benchmark('--device', '@numpy', *args, timeout=120)
    assert_usage_error(job, words)
    assert job.stdout == ''
