"""cgdp_chainer.mpi.find_mpiexec: the one place that says which mpiexec
launches the project's MPI jobs. ``$CGDP_MPIEXEC`` where set (what
.ci/gpu_check.sh sets on a machine without one), else the mpiexec next to
the interpreter, else none; a named path that is no executable file is
refused, never passed over for another mpiexec."""
import os
import stat

import pytest

from cgdp_chainer import mpi as cgdp_mpi

VARIABLE = cgdp_mpi.MPIEXEC_VARIABLE


def _executable(path):
    """An empty file at ``path`` that its owner may run."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w'):
        pass
    os.chmod(path, stat.S_IRWXU)
    return path


def test_the_variable_is_named_cgdp_mpiexec():
    # .ci/gpu_check.sh exports it by this name.
    assert VARIABLE == 'CGDP_MPIEXEC'


def test_without_the_variable_the_mpiexec_next_to_the_interpreter(tmp_path):
    python = str(tmp_path / 'venv' / 'bin' / 'python')
    beside = _executable(str(tmp_path / 'venv' / 'bin' / 'mpiexec'))
    assert cgdp_mpi.find_mpiexec({}, python) == beside
    # An empty value counts as unset.
    assert cgdp_mpi.find_mpiexec({VARIABLE: ''}, python) == beside


def test_without_the_variable_or_one_beside_there_is_none(tmp_path):
    python = str(tmp_path / 'bin' / 'python')
    assert cgdp_mpi.find_mpiexec({}, python) is None
    # An mpiexec on PATH is not taken.
    on_path = _executable(str(tmp_path / 'elsewhere' / 'mpiexec'))
    assert cgdp_mpi.find_mpiexec(
        {'PATH': os.path.dirname(on_path)}, python) is None
    words = cgdp_mpi.no_mpiexec_words(python)
    assert python in words and VARIABLE in words


def test_the_variable_wins_over_the_mpiexec_next_to_the_interpreter(
        tmp_path):
    python = str(tmp_path / 'venv' / 'bin' / 'python')
    _executable(str(tmp_path / 'venv' / 'bin' / 'mpiexec'))
    named = _executable(str(tmp_path / 'site' / 'bin' / 'mpiexec'))
    assert cgdp_mpi.find_mpiexec({VARIABLE: named}, python) == named


@pytest.mark.parametrize('kind', ['missing', 'not executable', 'directory'])
def test_a_named_path_that_cannot_run_is_refused(tmp_path, kind):
    python = str(tmp_path / 'venv' / 'bin' / 'python')
    _executable(str(tmp_path / 'venv' / 'bin' / 'mpiexec'))
    named = str(tmp_path / 'site' / 'bin' / 'mpiexec')
    if kind == 'not executable':
        _executable(named)
        os.chmod(named, stat.S_IRUSR | stat.S_IWUSR)
    elif kind == 'directory':
        os.makedirs(named)
    with pytest.raises(FileNotFoundError) as error:
        cgdp_mpi.find_mpiexec({VARIABLE: named}, python)
    assert '{}={} is not an executable file'.format(VARIABLE, named) in \
        str(error.value)
    assert 'unset it' in str(error.value)


def test_the_process_environment_and_interpreter_by_default(
        tmp_path, monkeypatch):
    named = _executable(str(tmp_path / 'bin' / 'mpiexec'))
    monkeypatch.setenv(VARIABLE, named)
    assert cgdp_mpi.find_mpiexec() == named
    monkeypatch.setenv(VARIABLE, named + '.missing')
    with pytest.raises(FileNotFoundError):
        cgdp_mpi.find_mpiexec()
