"""Applies :mod:`cgdp_chainer._compat` before Chainer's first import, in a
program that imports ``chainer`` before (or without) ``cgdp_chainer``.

On NumPy 2, ``import chainer`` fails inside Chainer (``np.sctypes`` was
removed) before any of this package's code could run. So the install
puts ``cgdp_chainer_import_hook.pth`` beside the package in
site-packages; Python reads it at start-up and runs its one line, which
executes this file (found with ``importlib.util.find_spec``, which does
not import the package: its ``__init__`` imports Chainer and the whole
runtime) and calls :func:`arm`.

:func:`arm` puts a :class:`ChainerCompatFinder` first on
``sys.meta_path``. Asked for ``chainer``, the finder takes itself off,
runs ``_compat.py`` (its patches each apply only where the gap exists, so
running it again when ``cgdp_chainer`` imports it changes nothing) and
lets the ordinary finders find Chainer. Until then it costs one string
comparison per import. It never raises: a failing patch leaves the
import as it would have been without the hook.

``CGDP_CHAINER_NO_IMPORT_HOOK=1`` in the environment leaves it unarmed.
"""
import os
import sys

# The environment variable that keeps the hook off.
DISABLE_VARIABLE = 'CGDP_CHAINER_NO_IMPORT_HOOK'
# The module whose first import triggers the patches.
TRIGGER = 'chainer'
_COMPAT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            '_compat.py')


def apply_compat():
    """Runs ``_compat.py`` as a module of its own, outside the package (so
    that the package's ``__init__``, which imports Chainer, does not run).

    Returns:
        bool: Whether it ran without an error.
    """
    namespace = {'__name__': 'cgdp_chainer_compat_early',
                 '__file__': _COMPAT_FILE}
    try:
        with open(_COMPAT_FILE) as source:
            exec(compile(source.read(), _COMPAT_FILE, 'exec'), namespace)
    except Exception:  # the import goes on as without the hook
        return False
    return True


class ChainerCompatFinder(object):
    """A ``sys.meta_path`` finder that finds nothing: on the first lookup of
    ``chainer`` it removes itself and applies the compat patches."""

    def find_spec(self, fullname, path=None, target=None):
        """Import-system hook; always returns ``None`` (not found here)."""
        if fullname == TRIGGER:
            disarm()
            apply_compat()
        return None


def is_armed():
    """Whether a :class:`ChainerCompatFinder` is on ``sys.meta_path``."""
    return any(type(finder).__name__ == ChainerCompatFinder.__name__
               for finder in sys.meta_path)


def arm():
    """Puts the finder first on ``sys.meta_path``, unless Chainer is
    already imported, the hook is already armed or the environment says
    :data:`DISABLE_VARIABLE`."""
    if TRIGGER in sys.modules or is_armed() or \
            os.environ.get(DISABLE_VARIABLE, '') not in ('', '0'):
        return
    sys.meta_path.insert(0, ChainerCompatFinder())


def disarm():
    """Takes every :class:`ChainerCompatFinder` off ``sys.meta_path``."""
    sys.meta_path[:] = [
        finder for finder in sys.meta_path
        if type(finder).__name__ != ChainerCompatFinder.__name__]


if __name__ == 'cgdp_chainer_import_hook':
    # Run by the .pth line at start-up (see the module docstring).
    arm()
