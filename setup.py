"""The library's install: the ``cgdp_chainer`` package (the paper's four
networks inside it, as ``cgdp_chainer.models``) and one ``.pth`` file.

Nothing else lands at the top level of site-packages: the checkout's
``models/``, ``experiments/`` and ``benchmarks/`` are the repository's own
commands and stay out of the install. The ``.pth`` file arms the import
hook of ``cgdp_chainer/_import_hook.py``, so that a program that imports
``chainer`` before ``cgdp_chainer`` also gets the compat patches (without
them Chainer 7.8.1 fails to import on NumPy 2).
"""
import os

from setuptools import find_packages
from setuptools import setup
from setuptools.command.build_py import build_py

# One line that Python's site module runs at start-up: it finds the package
# without importing it (its __init__ imports Chainer) and runs the hook
# file, which puts its finder on sys.meta_path.
IMPORT_HOOK_PTH = 'cgdp_chainer_import_hook.pth'
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithImportHook(build_py):
    """``build_py`` that also writes :data:`IMPORT_HOOK_PTH` at the top of
    what is installed."""

    def run(self):
        super().run()
        target = self.build_lib
        if getattr(self, 'editable_mode', False):
            # An editable wheel takes only a finder for the packages from
            # build_lib; files for the top of site-packages go where its
            # install command puts them (the unpacked wheel).
            target = self.get_finalized_command('install').install_lib
        os.makedirs(target, exist_ok=True)
        self.copy_file(os.path.join(HERE, IMPORT_HOOK_PTH),
                       os.path.join(target, IMPORT_HOOK_PTH))


setup(
    name='cgdp-chainer',
    version='0.1.0',
    description='CPU-GPU data parallel (CGDP) training for Chainer',
    # With the subpackages (.runtime, .costmodel, .mpi, .models).
    packages=find_packages(include=['cgdp_chainer', 'cgdp_chainer.*']),
    cmdclass={'build_py': BuildPyWithImportHook},
    python_requires='>=3.11',
    # What the package imports. Chainer 7.8.1's sdist needs setuptools<81 to
    # build (see the Makefile and docs/DEVELOPING.md).
    install_requires=[
        'chainer==7.8.1',
        'numpy',
        'threadpoolctl',
        'cloudpickle',
        'Pillow',
    ],
    extras_require={
        # The host's fused update rules; without numba they run as blocked
        # NumPy with the same numbers, slower. An extra, not a dependency:
        # a new NumPy can come out before a numba release that supports it.
        'numba': ['numba'],
        'mpi': ['mpi4py', 'mpich'],
        # CUDA 12's CuPy; `make gpu` picks the driver's (gpu-cuda13).
        'gpu': ['cupy-cuda12x'],
        'gpu-cuda13': ['cupy-cuda13x'],
        # The repository's experiment commands (figures) and tests.
        'experiments': ['matplotlib'],
        'test': ['pytest', 'matplotlib'],
    },
)
