"""The compat module lets Chainer import where its old dependencies are gone."""
import subprocess
import sys
import textwrap

import numpy

import cgdp_chainer  # NOQA
import chainer


def _run(code):
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_chainer_trains_a_layer_after_compat():
    layer = chainer.links.Linear(3, 2)
    layer.cleargrads()
    loss = chainer.functions.sum(layer(numpy.ones((4, 3), numpy.float32)))
    loss.backward()
    numpy.testing.assert_allclose(layer.W.grad, numpy.full((2, 3), 4.0))


def test_sctypes_present_for_chainer():
    assert numpy.float32 in numpy.sctypes['float']
    assert numpy.int64 in numpy.sctypes['int']


def test_chainer_imports_without_pkg_resources_and_numpy_distutils():
    # Hides both modules, as on Python 3.12 with setuptools>=81 and NumPy 2.
    result = _run('''
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == 'pkg_resources' or name.startswith('numpy.distutils'):
                    raise ImportError('hidden: ' + name)
        sys.meta_path.insert(0, Hide())
        import cgdp_chainer
        import chainer, chainer.functions as F
        import numpy
        import pkg_resources
        dist = pkg_resources.get_distribution('numpy>=1')
        assert dist.version == numpy.__version__, dist.version
        try:
            pkg_resources.require('no-such-package-xyz')
        except pkg_resources.DistributionNotFound:
            pass
        else:
            raise AssertionError('missing package not reported')
        # What pytest's monkeypatch.syspath_prepend calls where it finds
        # pkg_resources loaded.
        from pkg_resources import fixup_namespace_packages
        fixup_namespace_packages('.')
        y = F.as_strided(numpy.arange(6, dtype='f'), (2, 2), (1, 1))
        print(y.shape)
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '(2, 2)'


def test_chainer_and_chainercv_read_numpys_removed_aliases():
    # A fresh process that imports cgdp_chainer first, as a script does:
    # F.resize_images reads numpy.float, ChainerCV numpy.bool (both
    # removed in NumPy 1.24; NumPy 2 has numpy.bool again, as bool_).
    result = _run('''
        import cgdp_chainer
        import chainer.functions as F
        import numpy
        x = numpy.arange(2 * 3 * 4 * 5, dtype=numpy.float32).reshape(
            2, 3, 4, 5)
        y = F.resize_images(x, (8, 10))
        mask = numpy.zeros(3, dtype=numpy.bool)
        mask[1] = True
        assert mask.dtype == numpy.bool_, mask.dtype
        assert numpy.float is float and numpy.int is int
        assert numpy.object is object and numpy.complex is complex
        print(y.shape, int(mask.sum()))
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '(2, 3, 8, 10) 1'


def test_aliases_numpy_defines_are_left_as_they_are():
    from cgdp_chainer import _compat
    for name, builtin in _compat.REMOVED_ALIASES.items():
        value = getattr(numpy, name)
        # Restored as the builtin, or NumPy's own scalar type where it
        # defines the name again (NumPy 2's bool and long).
        assert value is builtin or issubclass(value, numpy.generic), name
