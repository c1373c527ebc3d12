#!/usr/bin/env bash
# Python 3.12 + NumPy 2 + setuptools>=81 (no pkg_resources): the stack of
# current GPU machines; runs every test not marked slow, mpi or gpu. Chainer's wheel is built with setuptools<81 (its
# setup.py needs pkg_resources), then setuptools is upgraded past 81 so that
# the run itself has no pkg_resources, as on those machines.
set -euo pipefail
cd "$(dirname "$0")/.."
py312=""
if command -v pyenv >/dev/null 2>&1; then
  v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | tail -n 1 || true)
  [ -n "$v" ] && py312="$(pyenv root)/versions/$v/bin/python3.12"
fi
[ -z "$py312" ] && command -v python3.12 >/dev/null 2>&1 && py312=$(command -v python3.12)
if [ -z "$py312" ] || [ ! -x "$py312" ]; then
  echo "NOTICE: no Python 3.12 found (pyenv or PATH): skipping the Python 3.12 + NumPy 2 leg"
  exit 0
fi
venv=.venv312
if [ ! -f $venv/.installed ]; then
  rm -rf $venv
  "$py312" -m venv $venv
  $venv/bin/python -m pip install --quiet --upgrade pip
  $venv/bin/python -m pip install --quiet 'setuptools<81' wheel
  $venv/bin/python -m pip wheel --quiet --no-build-isolation --no-deps -w $venv/wheels chainer==7.8.1
  $venv/bin/python -m pip install --quiet --upgrade 'setuptools>=81' 'numpy>=2' pytest threadpoolctl cloudpickle matplotlib Pillow
  # numba for the fused host update rules, where a release supports this
  # NumPy; pinning NumPy keeps pip from downgrading it for numba.
  numpy_now=$($venv/bin/python -c 'import numpy; print(numpy.__version__)')
  $venv/bin/python -m pip install --quiet numba "numpy==$numpy_now" || echo "NOTICE: no numba release supports numpy $numpy_now: the host update runs as blocked NumPy"
  $venv/bin/python -m pip install --quiet --no-deps $venv/wheels/chainer-7.8.1-*.whl
  $venv/bin/python -m pip install --quiet filelock protobuf six typing_extensions
  touch $venv/.installed
fi
$venv/bin/python -c "import sys, numpy, setuptools; print('py312 leg:', sys.version.split()[0], 'numpy', numpy.__version__, 'setuptools', setuptools.__version__)"
# Every test that needs neither MPI nor a GPU nor minutes: the runtime, the
# chunk search, the cost model, the datasets and the tools run on this stack
# too, as they will on a GPU machine.
PYTHONPATH=. $venv/bin/python -m pytest -q -m "not slow and not mpi and not gpu" tests
