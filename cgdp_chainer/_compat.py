"""Lets Chainer 7.8.1 import on current Python, NumPy and setuptools.

Chainer 7.8.1 (2020) and ChainerCV 0.13.1 predate four removals. Each
patch below fills one gap and only when the gap exists, so on the pinned
stack (Python 3.11, NumPy 1.26, setuptools<81) it changes nothing that
works but the removed aliases of item 4, which NumPy 1.24 already dropped. Import this
module before the first ``import chainer``: ``cgdp_chainer`` does so at the
top, and where the package is installed its import hook
(:mod:`cgdp_chainer._import_hook`) runs it before Chainer's first import,
in any order of imports.

1. ``pkg_resources`` is gone from setuptools 81 on. Chainer's
   ``_environment_check`` imports it to look up optional dependencies'
   versions. A small stand-in built on ``importlib.metadata`` answers the
   calls Chainer makes (``require``, ``get_distribution`` and the two
   exceptions it catches).
2. ``numpy.distutils`` is gone on Python 3.12 and NumPy 2, and on Python
   3.11 it fails to import beside setuptools>=74 (its
   ``distutils.msvccompiler`` was dropped). Chainer imports
   ``numpy.distutils.system_info`` only to ask macOS for its BLAS; the
   stand-in answers "no information", which skips that macOS-only warning.
3. ``numpy.sctypes`` is gone in NumPy 2. Chainer's ``as_strided`` reads
   it at import time; the dictionary is rebuilt with NumPy 1's contents.
4. NumPy 1.24 removed the aliases of Python's types that NumPy 1.20
   deprecated (``numpy.float``, ``numpy.int``, ``numpy.bool``, ...): on
   NumPy 1.26 and 2 reading one raises AttributeError. Chainer's
   ``F.resize_images`` reads ``numpy.float``; ChainerCV reads
   ``numpy.bool``. Each missing alias is set to the builtin type it was
   (:data:`REMOVED_ALIASES`); one NumPy defines again is left as it is
   (NumPy 2's ``numpy.bool`` is ``numpy.bool_``, its ``numpy.long`` the C
   ``long``), and so are arrays: ``dtype=bool`` gives the same dtype as
   ``dtype=numpy.bool_``.
"""
import importlib.metadata
import re
import sys
import types
import warnings

import numpy


def _install_pkg_resources_stand_in():
    try:
        with warnings.catch_warnings():
            # setuptools 67-80 warn on import that the API is deprecated.
            warnings.simplefilter('ignore')
            import pkg_resources  # NOQA
        return
    except ImportError:
        pass

    module = types.ModuleType('pkg_resources')

    class ResolutionError(Exception):
        pass

    class DistributionNotFound(ResolutionError):
        pass

    class VersionConflict(ResolutionError):
        pass

    class _Distribution(object):
        def __init__(self, name):
            try:
                self.version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                raise DistributionNotFound(name)
            self.project_name = name

    def get_distribution(requirement):
        name = re.split(r'[<>=!~;\[ ]', requirement, maxsplit=1)[0]
        return _Distribution(name)

    def require(requirement):
        # Presence only: version specifiers are not checked, so a mismatch
        # is never reported as a conflict (Chainer only warns on those).
        return [get_distribution(requirement)]

    module.ResolutionError = ResolutionError
    module.DistributionNotFound = DistributionNotFound
    module.VersionConflict = VersionConflict
    module.get_distribution = get_distribution
    def fixup_namespace_packages(path_item, parent=None):
        # Asked by whoever finds pkg_resources loaded and adds to sys.path
        # (pytest's monkeypatch.syspath_prepend): this stand-in declares
        # no namespace packages, so there is nothing to fix up.
        pass

    module.require = require
    module.fixup_namespace_packages = fixup_namespace_packages
    sys.modules['pkg_resources'] = module


def _install_numpy_distutils_stand_in():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # its own deprecation notice
            import numpy.distutils.system_info  # NOQA
        return
    except Exception:
        # ImportError where it is gone; ModuleNotFoundError or AttributeError
        # where setuptools' distutils lacks what it needs.
        for name in list(sys.modules):
            if name.startswith('numpy.distutils'):
                del sys.modules[name]

    package = types.ModuleType('numpy.distutils')
    package.__path__ = []
    system_info = types.ModuleType('numpy.distutils.system_info')
    system_info.get_info = lambda name, notfound_action=0: {}
    package.system_info = system_info
    sys.modules['numpy.distutils'] = package
    sys.modules['numpy.distutils.system_info'] = system_info


def _install_numpy_sctypes():
    if 'sctypes' in numpy.__dict__:
        return
    numpy.sctypes = {
        'int': [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        'uint': [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        'float': [numpy.float16, numpy.float32, numpy.float64,
                  numpy.longdouble],
        'complex': [numpy.complex64, numpy.complex128, numpy.clongdouble],
        'others': [bool, object, bytes, str, numpy.void],
    }


# NumPy 1.20's deprecated aliases, as the builtin types they were.
REMOVED_ALIASES = {'bool': bool, 'int': int, 'float': float,
                   'complex': complex, 'object': object, 'str': str,
                   'long': int, 'unicode': str}


def _install_removed_aliases():
    for name, builtin in REMOVED_ALIASES.items():
        with warnings.catch_warnings():
            # NumPy 1.26 warns on reading a removed alias before raising.
            warnings.simplefilter('ignore')
            try:
                getattr(numpy, name)
                continue
            except AttributeError:
                pass
        setattr(numpy, name, builtin)


_install_pkg_resources_stand_in()
_install_numpy_distutils_stand_in()
_install_numpy_sctypes()
_install_removed_aliases()
