#!/usr/bin/env bash
# The device check for a session that is lent a GPU machine (Python 3.12,
# NumPy 2 and CuPy preinstalled there; no network). Here, first:
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   cp "$(find ~/.cache/pip/wheels -name 'chainer-7.8.1-*.whl' | head -n 1)" .whl/
# then run this script on the device with `.whl` carried. It prints the
# stack, runs the tests marked gpu and a short single-GPU weak-scaling run
# (typical and cgdp at N=1, ResNet-152, 224 px), keeping its files in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/chainer-7.8.1-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 - <<'PY'
import cgdp_chainer, chainer, numpy, cupy
from chainer.backends import cuda
from cgdp_chainer import devices
print('chainer', chainer.__version__, 'numpy', numpy.__version__, 'cupy', cupy.__version__,
      'cuda available', cuda.available, 'gpus', devices.gpu_count())
PY
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_updater.py tests/test_models.py 2>&1 | tail -n 30
timeout 300 python3 -m experiments.weak_scaling --net resnet152 --devices 1 \
    --batch 32 --image-size 224 --iterations 10 --warmup 3 --out "${OUT:-/tmp}/results" 2>&1 | grep -v '^\[' | tail -n 20
