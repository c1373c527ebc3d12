"""Bad input to experiments.profile and benchmarks.baseline: exit 2, one
``error:`` line, no traceback, nothing measured and nothing written.

Most cases call the tools' ``main`` in this process (an exception other
than the exit would fail the test just as a traceback would); one case per
tool runs it as a user does, in a subprocess.
"""
import os
import subprocess
import sys

import pytest

from benchmarks import baseline
from experiments import profile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module, args):
    return subprocess.run(
        [sys.executable, '-m', module] + list(args), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=300)


def _assert_one_line_error(returncode, stdout, stderr, *fragments):
    assert returncode == 2, stderr
    assert 'Traceback' not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith('error: ')
    for fragment in fragments:
        assert fragment in lines[0]
    assert stdout == ''  # nothing measured, nothing reported


def _assert_main_fails(main, args, capsys, *fragments):
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    _assert_one_line_error(info.value.code, captured.out, captured.err,
                           *fragments)


def _assert_cli_fails(module, args, *fragments):
    result = _run(module, args)
    _assert_one_line_error(result.returncode, result.stdout, result.stderr,
                           *fragments)


def _blocker(tmp_path):
    path = tmp_path / 'a_file'
    path.write_text('in the way')
    return str(path)


@pytest.mark.parametrize('make_args, fragments', [
    (lambda tmp: ['--out', _blocker(tmp)],
     ['--out ', 'already holds a profile', '--force']),
    (lambda tmp: ['--out', os.path.join(_blocker(tmp), 'p.json')],
     ['--out:', 'is a file, not a folder']),
    (lambda tmp: ['--out', str(tmp)], ['--out:', 'is a folder, not a file']),
    (lambda tmp: ['--image-size', '32', '--out', str(tmp / 'p.json')],
     ['at least 64x64']),
    (lambda tmp: ['--batch', '0'], ['--batch', 'positive integer']),
    (lambda tmp: ['--reps', '0'], ['--reps', 'positive integer']),
    (lambda tmp: ['--statistic', 'mean'], ['median', 'min']),
    (lambda tmp: ['--device', '@tpu'], ['unknown device']),
], ids=['out-exists', 'out-under-a-file', 'out-is-a-folder',
        'image-too-small', 'batch-0', 'reps-0', 'statistic', 'device'])
def test_profile_refuses_bad_input_before_measuring(tmp_path, capsys,
                                                    make_args, fragments):
    args = make_args(tmp_path)
    before = {name: os.path.getmtime(str(tmp_path / name))
              for name in os.listdir(str(tmp_path))}
    _assert_main_fails(profile.main, ['--net', 'alexnet'] + args, capsys,
                       *fragments)
    after = {name: os.path.getmtime(str(tmp_path / name))
             for name in os.listdir(str(tmp_path))}
    assert after == before


@pytest.mark.parametrize('args, fragments', [
    (['--repeats', '0'], ['--repeats', 'positive integer']),
    (['--repeats', 'x'], ['--repeats', 'not an integer']),
    (['--nets', 'lenet'], ['unknown network', 'alexnet, googlenet']),
    (['--nets'], ['--nets', 'at least one']),
    (['--device', '@tpu'], ['unknown device']),
    (['--device', '@numpy,@numpy'], ['takes one device, got 2']),
])
def test_baseline_refuses_bad_input_before_timing(capsys, args, fragments):
    _assert_main_fails(baseline.main, args, capsys, *fragments)


def test_profile_command_line_existing_out(tmp_path):
    _assert_cli_fails('experiments.profile',
                      ['--net', 'alexnet', '--out', _blocker(tmp_path)],
                      'already holds a profile', '--force')
    assert (tmp_path / 'a_file').read_text() == 'in the way'


def test_baseline_command_line_zero_repeats():
    _assert_cli_fails('benchmarks.baseline', ['--repeats', '0'],
                      '--repeats', 'positive integer')
