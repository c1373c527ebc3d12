#!/usr/bin/env bash
# The device check for a session that is lent a GPU machine (Python 3.12,
# NumPy 2 and CuPy preinstalled there; no network). Here, first:
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   cp "$(find ~/.cache/pip/wheels -name 'chainer-7.8.1-*.whl' | head -n 1)" .whl/
# then run this script on the device with `.whl` carried. It prints the
# stack, runs the tests marked gpu (process and thread workers: CuPy in the
# worker processes, registered shared buffers, streams and events) and a
# short weak-scaling run (typical and cgdp, ResNet-152, 224 px) over 1 GPU,
# or 1, 2 and 4 where the machine has them, keeping its files in $OUT.
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
python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -n 30
gpus=$(python3 -c "import cgdp_chainer; from cgdp_chainer import devices; print(devices.gpu_count())")
counts=1
[ "$gpus" -ge 2 ] && counts=1,2
[ "$gpus" -ge 4 ] && counts=1,2,4
timeout 300 python3 -m experiments.weak_scaling --net resnet152 --devices $counts \
    --batch 32 --image-size 224 --iterations 10 --warmup 3 --out "${OUT:-/tmp}/results" 2>&1 | grep -v '^\[' | tail -n 20
