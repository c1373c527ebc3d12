"""Tests of experiments.train: command-line errors, a run, resume, trace.

The networks are the real ones at their smallest settings (GoogLeNet at
64 px, few classes, batch 2): GoogLeNet is the quickest of the four on the
CPU and its snapshots are the smallest, and it has dropout, which a resumed
run must reproduce. Bad input that must be refused before any work uses
AlexNet (8 stages), which never gets to train there.
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


def _assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert 'Traceback' not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('error: ')
    for fragment in fragments:
        assert fragment in lines[0]


def _assert_main_fails(args, capsys, *fragments):
    """``train.main(args)`` in this process: the same checks as a
    subprocess, without its start-up time (any other exception than the
    exit fails the test, as a traceback would)."""
    with pytest.raises(SystemExit) as info:
        train.main(args)
    captured = capsys.readouterr()
    result = subprocess.CompletedProcess(args, info.value.code, captured.out,
                                         captured.err)
    _assert_one_line_error(result, *fragments)
    return result


def _assert_nothing_ran(result):
    # No progress bar, no report header: no iteration started.
    assert 'main/loss' not in result.stdout
    assert 'total [' not in result.stdout


def _tree(folder):
    """Every path under ``folder`` with its size and modification time."""
    found = {}
    for parent, _, names in os.walk(str(folder)):
        for name in names:
            path = os.path.join(parent, name)
            status = os.stat(path)
            found[path] = (status.st_size, status.st_mtime_ns)
    return found


ALEXNET_CGDP = ['--net', 'alexnet', '--updater', 'cgdp', '--devices',
                '@numpy,@numpy', '--image-size', '64', '--batchsize', '2',
                '--classes', '4']


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
    (['--net', 'alexnet', '--updater', 'standard', '--devices',
      '@numpy,@numpy'], 'standard runs on one device'),
    (['--net', 'alexnet', '--device', '@numpy,@numpy'], 'takes one device'),
    (['--net', 'alexnet', '--device', '@numpy', '--devices', '@numpy'],
     'not allowed with'),
    (['--net', 'alexnet', '--updater', 'parallel', '--trace', 'trace.json'],
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
    # A folder that does not exist yet: created before training starts.
    trace = str(tmp_path / 'traces' / 'new' / 'trace.json')
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
    assert os.listdir(os.path.dirname(trace)) == ['trace.json']
    assert_named_tracks(events, n_replicas=2)


def assert_named_tracks(events, n_replicas):
    """One named process; a named track per replica, sorted first, then
    one per host thread that did work; every event on a named track."""
    metadata = [e for e in events if e['ph'] == 'M']
    assert [e['args']['name'] for e in metadata
            if e['name'] == 'process_name'] == ['cgdp']
    names = {e['tid']: e['args']['name'] for e in metadata
             if e['name'] == 'thread_name'}
    order = {e['tid']: e['args']['sort_index'] for e in metadata
             if e['name'] == 'thread_sort_index'}
    assert all(isinstance(tid, int) for tid in names)
    replicas = ['replica {} @numpy'.format(k) for k in range(n_replicas)]
    assert [names[tid] for tid in sorted(names, key=order.get)][
        :n_replicas] == replicas
    host_tracks = {names[e['tid']] for e in events
                   if e['ph'] == 'X' and e['cat'] == 'update'}
    assert host_tracks and all(name.startswith('host thread cgdp-host')
                               for name in host_tracks)
    assert {e['tid'] for e in events if e['ph'] == 'X'} <= set(names)


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


# ----------------------------------------------- checked before any work

def test_chunk_size_above_the_layer_count_is_refused_before_work(tmp_path):
    out = tmp_path / 'out'
    result = _run_cli(ALEXNET_CGDP + ['--chunk-size', '9', '--out',
                                      str(out)])
    _assert_one_line_error(result, '--chunk-size 9', 'the 8 layers of alexnet',
                           "1 to 8, 'auto' or 'model'")
    _assert_nothing_ran(result)
    assert not out.exists()


def _file_in_the_way(tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a folder')
    return str(blocker)


@pytest.mark.parametrize('make_args, fragments', [
    (lambda tmp: ['--out', _file_in_the_way(tmp)],
     ['--out:', 'is a file, not a folder']),
    (lambda tmp: ['--out', os.path.join(_file_in_the_way(tmp), 'sub')],
     ['--out:', 'cannot create folder']),
    (lambda tmp: ['--out', str(tmp / 'out'), '--trace',
                  os.path.join(_file_in_the_way(tmp), 'trace.json')],
     ['--trace:', 'is a file, not a folder']),
    (lambda tmp: ['--out', str(tmp / 'out'), '--trace', str(tmp)],
     ['--trace:', 'is a folder, not a file']),
], ids=['out-is-a-file', 'out-under-a-file', 'trace-under-a-file',
        'trace-is-a-folder'])
def test_unusable_output_paths_are_refused_before_work(tmp_path, capsys,
                                                       make_args, fragments):
    args = make_args(tmp_path)
    before = sorted(os.listdir(str(tmp_path)))
    result = _assert_main_fails(ALEXNET_CGDP + args, capsys, *fragments)
    _assert_nothing_ran(result)
    assert sorted(os.listdir(str(tmp_path))) == before


def test_an_earlier_run_in_out_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'log').write_text('[]')
    (out / 'snapshot_iter_8').write_bytes(b'an earlier snapshot')
    before = _tree(out)
    result = _run_cli(ALEXNET_CGDP + ['--out', str(out)])
    _assert_one_line_error(result, 'already holds', 'snapshot_iter_8',
                           '--force', '--resume {}'.format(
                               out / 'snapshot_iter_8'))
    _assert_nothing_ran(result)
    assert _tree(out) == before


def test_an_existing_trace_is_refused_without_force(tmp_path):
    trace = tmp_path / 'trace.json'
    trace.write_text('{"traceEvents": []}')
    result = _run_cli(ALEXNET_CGDP + ['--out', str(tmp_path / 'out'),
                                      '--trace', str(trace)])
    _assert_one_line_error(result, 'trace.json already exists', '--force')
    assert trace.read_text() == '{"traceEvents": []}'
    assert not (tmp_path / 'out').exists()


@pytest.mark.slow
def test_force_replaces_the_earlier_run_without_mixing_snapshots(
        tmp_path, capsys):
    out = str(tmp_path / 'out')
    assert train.main(TINY + ['--iterations', '2', '--snapshot-every', '1',
                              '--out', out]) == 0
    notes = os.path.join(out, 'notes.txt')
    with open(notes, 'w') as f:
        f.write('the user\'s own file')
    capsys.readouterr()
    assert train.main(TINY + ['--iterations', '1', '--out', out,
                              '--force']) == 0
    assert 'removed log, snapshot_iter_1, snapshot_iter_2' in \
        capsys.readouterr().out
    assert sorted(os.listdir(out)) == ['log', 'notes.txt', 'snapshot_iter_1']
    with open(os.path.join(out, 'log')) as log_file:
        assert [entry['iteration'] for entry in json.load(log_file)] == [1]


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
    """A finished 2-iteration run with snapshots at iterations 1 and 2."""
    out = str(tmp_path_factory.mktemp('finished') / 'run')
    assert train.main(TINY + ['--iterations', '2', '--snapshot-every', '1',
                              '--out', out]) == 0
    return out


@pytest.mark.slow
def test_resume_at_iterations_says_the_run_is_complete(finished_run,
                                                       tmp_path):
    out = tmp_path / 'out'
    result = _run_cli(TINY + ['--iterations', '2', '--resume', os.path.join(
        finished_run, 'snapshot_iter_2'), '--out', str(out)])
    assert result.returncode == 0, result.stderr
    assert 'is at iteration 2, which is --iterations' in result.stdout
    assert 'complete, nothing to train' in result.stdout
    _assert_nothing_ran(result)
    assert not out.exists()


@pytest.mark.slow
def test_resume_past_iterations_is_refused_naming_both(finished_run,
                                                       tmp_path):
    out = tmp_path / 'out'
    result = _run_cli(TINY + ['--iterations', '1', '--resume', os.path.join(
        finished_run, 'snapshot_iter_2'), '--out', str(out)])
    _assert_one_line_error(result, 'at iteration 2, past --iterations 1',
                           '--iterations 3 or more')
    assert not out.exists()


@pytest.mark.slow
def test_resume_into_a_folder_with_later_snapshots_is_refused(finished_run):
    before = _tree(finished_run)
    result = _run_cli(TINY + ['--iterations', '2', '--resume', os.path.join(
        finished_run, 'snapshot_iter_1'), '--out', finished_run])
    _assert_one_line_error(result, 'after iteration 1', 'snapshot_iter_2',
                           'mix two runs', '--force')
    _assert_nothing_ran(result)
    assert _tree(finished_run) == before


@pytest.mark.parametrize('content, fragment', [
    (b'not a snapshot', 'cannot read snapshot'),
    (None, 'is not a snapshot of experiments.train'),
], ids=['not-npz', 'npz-without-iteration'])
def test_resume_from_a_file_that_is_no_snapshot(tmp_path, capsys, content,
                                                fragment):
    path = str(tmp_path / 'snapshot')
    if content is None:
        with open(path, 'wb') as f:
            numpy.savez(f, weights=numpy.zeros(3))
    else:
        with open(path, 'wb') as f:
            f.write(content)
    _assert_main_fails(ALEXNET_CGDP + ['--resume', path, '--out',
                                       str(tmp_path / 'out')], capsys,
                       fragment, path)
    assert not (tmp_path / 'out').exists()


def _write_images(folder, names, cut=()):
    Image = pytest.importorskip('PIL.Image')
    rng = numpy.random.default_rng(0)
    for name in names:
        path = str(folder / name)
        pixels = rng.integers(0, 256, size=(80, 72, 3), dtype=numpy.uint8)
        Image.fromarray(pixels).save(path)
        if name in cut:
            with open(path, 'rb') as f:
                data = f.read()
            with open(path, 'wb') as f:
                f.write(data[:len(data) // 2])


def test_a_file_in_the_list_that_is_no_image_is_refused_up_front(tmp_path):
    _write_images(tmp_path, ['good.png'])
    (tmp_path / 'text.png').write_text('not an image')
    list_path = tmp_path / 'train.txt'
    list_path.write_text('good.png 0\ntext.png 1\n')
    out = tmp_path / 'out'
    result = _run_cli(TINY + ['--train-list', str(list_path), '--root',
                              str(tmp_path), '--out', str(out)])
    _assert_one_line_error(result, '{}:2: cannot read image'.format(
        list_path), 'text.png')
    _assert_nothing_ran(result)
    assert not out.exists()


@pytest.mark.slow
def test_an_image_that_fails_to_decode_mid_run_is_one_error_line(tmp_path):
    # Its header is intact, so it passes the check up front; its pixels are
    # cut short, which shows only when the batch that holds it is read.
    _write_images(tmp_path, ['good.png', 'cut.png'], cut=('cut.png',))
    list_path = tmp_path / 'train.txt'
    list_path.write_text('good.png 0\ncut.png 1\n')
    # StandardUpdater, as when this was written: CGDP's notices on stderr
    # (the input path's) are tested where they are made.
    result = _run_cli(TINY + ['--updater', 'standard', '--iterations', '2',
                              '--train-list', str(list_path), '--root',
                              str(tmp_path), '--out', str(tmp_path / 'out')])
    _assert_one_line_error(
        result, '{}:2: cannot decode image'.format(list_path), 'cut.png',
        'training stopped after iteration 0', 'no snapshot was taken')
