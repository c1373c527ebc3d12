"""Tests of experiments.train: command-line errors, a run, resume, trace.

The networks are the real ones at their smallest settings (GoogLeNet at
64 px, few classes, batch 2): GoogLeNet is the quickest of the four on the
CPU and its snapshots are the smallest, and it has dropout, which a resumed
run must reproduce.
"""
import json
import os
import subprocess
import sys

import numpy
import pytest

from cgdp_chainer import devices
from experiments import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--net', 'googlenet', '--image-size', '64', '--classes', '4',
        '--batchsize', '2']


def _run_cli(args, cwd=REPO):
    return subprocess.run(
        [sys.executable, '-m', 'experiments.train'] + list(args), cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=300)


def _assert_one_line_error(result, fragment):
    assert result.returncode == 2, result.stderr
    assert 'Traceback' not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('error: ')
    assert fragment in lines[0]


@pytest.fixture
def bad_list(tmp_path):
    open(str(tmp_path / 'a.png'), 'wb').close()
    path = tmp_path / 'bad.txt'
    path.write_text('a.png 0\na.png zero\n')
    return str(path)


CLI_ERRORS = [
    (['--net', 'lenet'], 'unknown network'),
    (['--net', 'alexnet', '--image-size', '32'], 'at least 64'),
    (['--net', 'alexnet', '--batchsize', '0'], 'positive integer'),
    (['--net', 'alexnet', '--iterations', '-3'], 'positive integer'),
    (['--net', 'alexnet', '--devices', '@tpu'], 'unknown device'),
    (['--net', 'alexnet', '--updater', 'parallel', '--devices',
      '@numpy,@numpy,@numpy', '--batchsize', '2'],
     'smaller than the number of devices'),
    (['--net', 'alexnet', '--devices', '@numpy,@numpy'],
     'standard runs on one device'),
    (['--net', 'alexnet', '--device', '@numpy,@numpy'], 'takes one device'),
    (['--net', 'alexnet', '--device', '@numpy', '--devices', '@numpy'],
     'not allowed with'),
    (['--net', 'alexnet', '--trace', 'trace.json'],
     '--trace applies only to --updater cgdp'),
    (['--net', 'alexnet', '--updater', 'cgdp', '--chunk-size', '0'],
     "'auto' or 'model'"),
    (['--net', 'alexnet', '--resume', 'no_such_snapshot'],
     'no_such_snapshot'),
]


@pytest.mark.parametrize('args, fragment', CLI_ERRORS)
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    _assert_one_line_error(_run_cli(args), fragment)


@pytest.mark.skipif(devices.gpu_count() > 0,
                    reason='CuPy and a GPU are present here')
def test_cupy_device_without_cupy_or_gpu_is_an_error():
    _assert_one_line_error(
        _run_cli(['--net', 'alexnet', '--devices', '@cupy:0']), 'CuPy')


def test_malformed_image_list_names_file_and_line(bad_list, tmp_path):
    result = _run_cli(TINY + ['--train-list', bad_list, '--root',
                              str(tmp_path), '--out', str(tmp_path / 'o')])
    _assert_one_line_error(result, '{}:2:'.format(bad_list))


def test_short_run_writes_log_snapshot_and_progress(tmp_path):
    out = str(tmp_path / 'run')
    result = _run_cli(TINY + ['--device', '@numpy', '--iterations', '2',
                              '--out', out])
    assert result.returncode == 0, result.stderr
    assert 'total [' in result.stdout  # the progress bar
    assert 'main/loss' in result.stdout  # the printed report's header
    with open(os.path.join(out, 'log')) as log_file:
        log = json.load(log_file)
    assert [entry['iteration'] for entry in log] == [1, 2]
    assert all(numpy.isfinite(entry['main/loss']) for entry in log)
    assert os.path.isfile(os.path.join(out, 'snapshot_iter_2'))


def _updater_state(snapshot):
    """Model parameters, optimizer state and iterator state of a snapshot."""
    with numpy.load(snapshot) as arrays:
        return {key: arrays[key] for key in arrays.files
                if key.startswith('updater/')}


def _assert_same_state(expected_path, actual_path):
    expected = _updater_state(expected_path)
    actual = _updater_state(actual_path)
    assert sorted(expected) == sorted(actual)
    assert any(key.startswith('updater/model:main/') for key in expected)
    for key in expected:
        numpy.testing.assert_array_equal(actual[key], expected[key],
                                         err_msg=key)


@pytest.mark.parametrize('updater_args', [
    ['--updater', 'standard'],
    ['--updater', 'parallel', '--devices', '@numpy,@numpy'],
    # Two replica threads: each draws its dropout masks from its own
    # random state (cgdp_chainer.randomness), so the resume is exact.
    ['--updater', 'cgdp', '--devices', '@numpy,@numpy'],
], ids=['standard', 'parallel', 'cgdp'])
def test_resume_gives_the_parameters_of_an_uninterrupted_run(
        tmp_path, capsys, updater_args):
    # Three examples and batch 2: the run crosses epochs (reshuffling),
    # and GoogLeNet's dropout draws fresh masks every iteration.
    common = TINY + updater_args + ['--train-length', '3',
                                    '--iterations', '4']
    whole = str(tmp_path / 'whole')
    resumed = str(tmp_path / 'resumed')
    assert train.main(common + ['--snapshot-every', '2',
                                '--out', whole]) == 0
    assert train.main(common + [
        '--resume', os.path.join(whole, 'snapshot_iter_2'),
        '--out', resumed]) == 0
    _assert_same_state(os.path.join(whole, 'snapshot_iter_4'),
                       os.path.join(resumed, 'snapshot_iter_4'))
    with open(os.path.join(resumed, 'log')) as log_file:
        assert [entry['iteration'] for entry in json.load(log_file)] == [
            1, 2, 3, 4]


def test_cgdp_run_writes_the_chrome_trace(tmp_path, capsys):
    out = str(tmp_path / 'cgdp')
    trace = os.path.join(out, 'trace.json')
    train.main(TINY + ['--updater', 'cgdp', '--devices', '@numpy,@numpy',
                       '--iterations', '2', '--chunk-size', '2',
                       '--reduction', 'sum', '--trace', trace,
                       '--out', out])
    with open(trace) as trace_file:
        events = json.load(trace_file)['traceEvents']
    assert {'forward', 'backward', 'update'} <= {
        event.get('cat') for event in events}
    assert os.path.isfile(os.path.join(out, 'snapshot_iter_2'))
    assert 'wrote the Chrome trace' in capsys.readouterr().out


def test_training_on_an_image_list(tmp_path, capsys):
    Image = pytest.importorskip('PIL.Image')
    rng = numpy.random.default_rng(0)
    lines = []
    for index in range(4):
        name = 'img{}.png'.format(index)
        pixels = rng.integers(0, 256, size=(80, 72, 3), dtype=numpy.uint8)
        Image.fromarray(pixels).save(str(tmp_path / name))
        lines.append('{} {}'.format(name, index % 4))
    list_path = tmp_path / 'train.txt'
    list_path.write_text('\n'.join(lines) + '\n')
    out = str(tmp_path / 'out')
    assert train.main(TINY + ['--iterations', '1', '--train-list',
                              str(list_path), '--root', str(tmp_path),
                              '--out', out]) == 0
    assert os.path.isfile(os.path.join(out, 'snapshot_iter_1'))
