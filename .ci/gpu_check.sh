#!/usr/bin/env bash
# The device check for a session that is lent a GPU machine (Python 3.12,
# NumPy 2 and CuPy preinstalled there; no network). Chainer is not
# installed there: carry its wheel. Here, first:
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   cp "$(find ~/.cache/pip/wheels -name 'chainer-7.8.1-*.whl' | head -n 1)" .whl/
# then run `OUT=$OUT bash .ci/gpu_check.sh` on the device with `.whl` carried
# (the wheel is installed only where .whl/ holds one).
#
# Steps, under ten minutes on one GPU in all (each step's budget is its
# timeout; what a step printed before its timeout is kept):
# 1. preflight (about 30 s): the stack (nvidia-smi's driver and compute
#    mode, /dev/shm, CuPy's and NCCL's versions, cuDNN on or off); exits 1,
#    naming what is missing, unless Chainer sees CuPy and at least one GPU;
# 2. the tests marked gpu (170 s), their output kept in gpu_tests.txt;
# 3. the GPU benchmark with the cost model's check (220 s; python -m
#    benchmarks.gpu, defaults: the four networks at 224 px, batch 64 and
#    16, StandardUpdater, CGDP with processes and threads and the limit,
#    then the per-layer profile and the predictions), its output in
#    gpu_benchmark.txt and its CSV and JSON in gpu_benchmark/; then the
#    optimizer form's benchmark (110 s; python -m benchmarks.gpu_anyloop
#    at batch 64: the plain loop, ChainerMN's optimizer, CGDP's and the
#    limit), in gpu_anyloop.txt and gpu_anyloop/;
# 4. a short weak-scaling run of AlexNet at 224 px on GPUs (40 s;
#    --device-kind gpu: no CPU fallback), with CGDP's timeline and trace:
#    the experiment's pipeline on a GPU (the benchmark has the figures).
# Everything goes into ONE archive directly under $OUT, gpu_check.tar.gz,
# beside a short summary, gpu_check_summary.txt. The script's status is the
# worst of its steps'.
set -uo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SUMMARY="$OUT/gpu_check_summary.txt"
status=0
worst() { [ "$1" -gt "$status" ] && status=$1; return 0; }
pack() {
    tar -czf "$OUT/gpu_check.tar.gz" -C "$WORK" . 2>/dev/null
    { echo "status: $status"; cat "$WORK/summary.txt" 2>/dev/null; } > "$SUMMARY"
}

if [ -d .whl ] && ls .whl/chainer-7.8.1-*.whl >/dev/null 2>&1; then
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
            --target /tmp/site .whl/chainer-7.8.1-*.whl; then
        echo 'preflight failed: the carried Chainer wheel did not install' |
            tee "$WORK/summary.txt"
        status=1
        pack
        exit 1
    fi
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

# 1. preflight --------------------------------------------------------------
{
    echo '== nvidia-smi'
    nvidia-smi --query-gpu=index,name,driver_version,compute_mode,memory.total \
        --format=csv 2>&1 || echo 'nvidia-smi: not available'
    echo '== df -h /dev/shm'
    df -h /dev/shm 2>&1
    echo '== python stack'
} > "$WORK/preflight.txt"
"$PYTHON" - >> "$WORK/preflight.txt" 2>&1 <<'PY'
import sys
try:
    import cgdp_chainer  # NOQA: first, its compat module runs before Chainer
    import chainer
    from chainer.backends import cuda
    import numpy
    from cgdp_chainer import devices
except Exception as error:
    print('preflight failed: missing Chainer or cgdp_chainer ({}: {})'.format(
        type(error).__name__, error))
    sys.exit(1)
print('python', sys.version.split()[0], 'chainer', chainer.__version__,
      'numpy', numpy.__version__)
missing = []
if not cuda.available:
    missing.append('CuPy under Chainer (chainer.backends.cuda.available is '
                   'False: {})'.format(getattr(cuda, '_resolution_error', '')))
else:
    import cupy
    print('cupy', cupy.__version__, 'cuda runtime',
          cupy.cuda.runtime.runtimeGetVersion())
    try:
        from cupy.cuda import nccl
        print('nccl', nccl.get_version() if getattr(nccl, 'available', True)
              else 'not available (library missing)')
    except Exception as error:
        print('nccl not available ({})'.format(error))
    print('cudnn', devices.cudnn_words(devices.cudnn_enabled()))
try:
    import matplotlib
    print('matplotlib', matplotlib.__version__)
except ImportError:
    print('matplotlib missing: the weak-scaling step will fail')
gpus = devices.gpu_count()
print('gpus seen by CuPy', gpus)
if gpus < 1:
    missing.append('a CUDA GPU that CuPy sees')
if missing:
    print('preflight failed: missing ' + '; '.join(missing))
    sys.exit(1)
PY
preflight=$?
cat "$WORK/preflight.txt"
grep -E '^(python|cupy|nccl|cudnn|matplotlib|gpus|preflight)' "$WORK/preflight.txt" \
    > "$WORK/summary.txt"
if [ $preflight -ne 0 ]; then
    status=1
    pack
    exit 1
fi

# 2. the gpu tests ------------------------------------------------------------
timeout 170 "$PYTHON" -m pytest -q -rA -m gpu -p no:cacheprovider tests \
    > "$WORK/gpu_tests.txt" 2>&1
tests=$?
worst $tests
tail -n 25 "$WORK/gpu_tests.txt"
{
    echo "gpu tests: exit $tests"
    grep -E '^(PASSED|FAILED|ERROR|SKIPPED)' "$WORK/gpu_tests.txt"
} >> "$WORK/summary.txt"

# 3. the GPU benchmark and the cost model's check -------------------------------
timeout 220 "$PYTHON" -m benchmarks.gpu --out "$WORK/gpu_benchmark" \
    > "$WORK/gpu_benchmark.txt" 2>&1
benchmark=$?
worst $benchmark
cat "$WORK/gpu_benchmark.txt"
{
    echo "gpu benchmark: exit $benchmark"
    grep -v '^  (' "$WORK/gpu_benchmark.txt"
} >> "$WORK/summary.txt"

timeout 110 "$PYTHON" -m benchmarks.gpu_anyloop --batches 64 \
    --out "$WORK/gpu_anyloop" > "$WORK/gpu_anyloop.txt" 2>&1
anyloop=$?
worst $anyloop
cat "$WORK/gpu_anyloop.txt"
{
    echo "gpu anyloop benchmark: exit $anyloop"
    grep -v '^  (' "$WORK/gpu_anyloop.txt"
} >> "$WORK/summary.txt"

# 4. weak scaling on GPUs -----------------------------------------------------
gpus=$("$PYTHON" -c 'from cgdp_chainer import devices; print(devices.gpu_count())')
counts=1
[ "$gpus" -ge 2 ] && counts=1,2
timeout 40 "$PYTHON" -m experiments.weak_scaling --net alexnet --device-kind gpu \
    --devices $counts --image-size 224 --batch 16 --iterations 2 --warmup 1 \
    --no-model --out "$WORK/results" > "$WORK/weak_scaling.txt" 2>&1
scaling=$?
worst $scaling
grep -v '^\[' "$WORK/weak_scaling.txt" | tail -n 40
echo "weak scaling: exit $scaling" >> "$WORK/summary.txt"
"$PYTHON" - "$WORK/results" >> "$WORK/summary.txt" 2>&1 <<'PY'
import glob
import os
import sys
from experiments import results
for path in sorted(glob.glob(os.path.join(sys.argv[1], '*', '*',
                                          results.SUMMARY_FILE))):
    net = path.split(os.sep)[-3]
    for row in results.read_csv(path):
        print('{} {} N={}: median {} s/iteration'.format(
            net, row['mode'], results.workers(row), row['median_s']))
PY
pack
cat "$SUMMARY"
exit $status
