"""What ``pip install .`` puts in site-packages, and a program that imports
``chainer`` before ``cgdp_chainer`` (the import hook of the .pth file)."""
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = 'cgdp_chainer_import_hook.pth'

# Imports chainer first, as a script written before CGDP does, then the
# library. On NumPy 2 ``import chainer`` fails without the compat patches;
# on NumPy 1.26 the removed ``numpy.float``, set by them, shows they ran.
CHAINER_FIRST = '''
    import site, sys
    site.addsitedir(sys.argv[1])  # reads the .pth files there, as at start-up
    import chainer
    import chainer.functions as F
    import numpy
    y = F.as_strided(numpy.arange(6, dtype='f'), (2, 2), (1, 1))
    patched = numpy.__dict__.get('float') is float
    import cgdp_chainer
    print(y.shape, patched)
'''


def _run(code, *args, env=None, cwd=None, flags=()):
    return subprocess.run(
        [sys.executable] + list(flags) + ['-c', textwrap.dedent(code)] +
        list(args),
        capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def _environment(**changes):
    env = dict(os.environ)
    env.update(changes)
    return env


@pytest.fixture
def site_with_hook(tmp_path):
    """A site directory holding the checkout's .pth file only (the package
    itself is found on PYTHONPATH, the checkout)."""
    with open(os.path.join(ROOT, PTH)) as f:
        (tmp_path / PTH).write_text(f.read())
    return str(tmp_path)


def test_chainer_imported_before_cgdp_chainer_works(site_with_hook):
    result = _run(CHAINER_FIRST, site_with_hook,
                  env=_environment(PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['(2,', '2)', 'True']


def test_the_hook_stays_off_until_chainer_and_leaves_after(site_with_hook):
    result = _run('''
        import site, sys
        site.addsitedir(sys.argv[1])
        names = lambda: [type(f).__name__ for f in sys.meta_path]
        armed = 'ChainerCompatFinder' in names()
        imported_early = 'cgdp_chainer' in sys.modules or 'numpy' in sys.modules
        import chainer
        print(armed, imported_early, 'ChainerCompatFinder' in names())
    ''', site_with_hook, env=_environment(PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['True', 'False', 'False']


def test_the_hook_can_be_turned_off(site_with_hook):
    result = _run('''
        import site, sys
        site.addsitedir(sys.argv[1])
        print(any(type(f).__name__ == 'ChainerCompatFinder'
                  for f in sys.meta_path))
    ''', site_with_hook, env=_environment(
        PYTHONPATH=ROOT, CGDP_CHAINER_NO_IMPORT_HOOK='1'))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'False'


@pytest.mark.slow
def test_pip_install_puts_only_the_library_at_the_top(tmp_path):
    source, target = tmp_path / 'source', tmp_path / 'site'
    subprocess.run(['git', 'clone', '--quiet', ROOT, str(source)],
                   check=True, timeout=120)
    subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--quiet', '--no-deps',
         '--no-build-isolation', '--target', str(target), str(source)],
        check=True, timeout=300, cwd=str(tmp_path))
    top = sorted(os.listdir(target))
    assert [name for name in top if not name.endswith('.dist-info')] == [
        'cgdp_chainer', PTH]
    assert [name for name in top if name.endswith('.dist-info')] == [
        'cgdp_chainer-0.1.0.dist-info']
    assert os.path.isfile(target / 'cgdp_chainer' / 'models' / 'resnet.py')
    # The installed copy, from outside the checkout, without the venv's own
    # .pth files (-S: no site-packages until added): the target's .pth arms
    # the hook, and the networks are the library's.
    result = _run('''
        import site, sys, sysconfig
        site.addsitedir(sys.argv[1])
        hooks = [type(f).__module__ for f in sys.meta_path
                 if type(f).__name__ == 'ChainerCompatFinder']
        site.addsitedir(sys.argv[2])  # Chainer and NumPy
        import chainer
        import numpy
        patched = numpy.__dict__.get('float') is float
        import cgdp_chainer
        from cgdp_chainer import models
        print(hooks, patched, cgdp_chainer.__file__.startswith(sys.argv[1]),
              type(models.get_model('alexnet')).__module__)
    ''', str(target), sysconfig.get_paths()['purelib'], flags=['-S'],
        env=_environment(PYTHONPATH=''), cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "['cgdp_chainer_import_hook']", 'True', 'True',
        'cgdp_chainer.models.alexnet']
