""".ci/wheel_lib.py copies a wheel's ``lib/`` data files (MPICH's libmpi
and what it loads), which ``pip install --target`` drops, and nothing
else; a wheel without them is an error, not an empty success."""
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, '.ci', 'wheel_lib.py')


def _wheel(path, members):
    with zipfile.ZipFile(path, 'w') as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return str(path)


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=60)


def test_the_lib_data_files_and_only_they_are_copied(tmp_path):
    wheel = _wheel(tmp_path / 'mpich-5.0.2-py3-none-any.whl', {
        'mpich-5.0.2.data/data/lib/libmpi.so.12': b'one',
        'mpich-5.0.2.data/data/lib/mpich/ucx/libuct.so.0': b'two',
        'mpich-5.0.2.data/data/bin/mpiexec': b'launcher',
        'mpich-5.0.2.data/data/include/mpi.h': b'header',
        'mpich-5.0.2.dist-info/RECORD': b'',
        'pkg/lib/not_data.so': b'package file'})
    dest = tmp_path / 'site' / 'lib'
    done = _run(wheel, dest)
    assert done.returncode == 0, done.stderr
    copied = sorted(os.path.relpath(os.path.join(folder, name), str(dest))
                    for folder, _, names in os.walk(str(dest))
                    for name in names)
    assert copied == ['libmpi.so.12', os.path.join('mpich', 'ucx',
                                                   'libuct.so.0')]
    assert (dest / 'libmpi.so.12').read_bytes() == b'one'
    assert (dest / 'mpich' / 'ucx' / 'libuct.so.0').read_bytes() == b'two'
    assert '2 files of lib/' in done.stdout


def test_a_wheel_without_lib_data_files_is_an_error(tmp_path):
    wheel = _wheel(tmp_path / 'mpi4py-4.1.2-py3-none-any.whl', {
        'mpi4py/__init__.py': b'', 'mpi4py-4.1.2.dist-info/RECORD': b''})
    done = _run(wheel, tmp_path / 'lib')
    assert done.returncode != 0
    assert 'holds no lib/ data files' in done.stderr
    assert not (tmp_path / 'lib').exists()
