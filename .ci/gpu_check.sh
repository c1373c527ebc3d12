#!/usr/bin/env bash
# The device check for a session that is lent a GPU machine (Python 3.12,
# NumPy 2 and CuPy preinstalled there; maybe an mpi4py, but no mpiexec; no
# network). Carry Chainer's wheel, and MPICH's and mpi4py's (the pins of
# requirements.txt' venv) for the multi-rank parts. Here, first (.whl/ is
# git-ignored):
#   mkdir -p .whl
#   cp "$(find ~/.cache/pip/wheels -name 'chainer-7.8.1-*.whl' | head -n 1)" .whl/
#   python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
#     -d .whl mpich==5.0.2 mpi4py==4.1.2
# (mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl and
# mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.manylinux_2_5_x86_64.whl, 15 MB
# with Chainer's), then run `OUT=$OUT bash .ci/gpu_check.sh` on the device
# with `.whl` carried. Each wheel is installed only where .whl/ holds it,
# into a fresh $SITE (/tmp/gpu_check_site.*), first on PYTHONPATH (its
# mpi4py shadows the machine's); MPICH's libraries go to $SITE/lib
# (.ci/wheel_lib.py: pip --target drops them), and
# CGDP_MPIEXEC=$SITE/bin/mpiexec (the tests' and benchmarks' launcher:
# cgdp_chainer.mpi.find_mpiexec) and MPI4PY_LIBMPI=$SITE/lib/libmpi.so.12
# (the libmpi that mpi4py loads) are exported.
#
# Steps, under ten minutes on one GPU in all (each step's budget is its
# timeout; what a step printed before its timeout is kept). PART=all (the
# default) runs every step; a session that can afford two device calls runs
# PART=tests, then PART=bench, each step with more time (the budgets below
# are all / tests / bench, in seconds; 0: not run):
# 1. preflight (about 30 s, in every part): the stack (nvidia-smi's driver
#    and compute mode, /dev/shm, CuPy's and NCCL's versions, cuDNN on or
#    off), and MPI: a 2-rank hello job (mpiexec -launcher fork -n 2, 30 s at
#    most) says whether MPI is usable; where not, the multi-rank parts below
#    are skipped and named in the summary. Exits 1, naming what is missing,
#    unless Chainer sees CuPy and at least one GPU;
# 2. the tests marked gpu and not mpi (100 / 250 / 0), then those marked
#    mpi and gpu (75 / 300 / 0; 2 ranks sharing the one GPU), one line per
#    test in gpu_tests.txt and gpu_mpi_tests.txt and the summary;
# 3. the GPU benchmark with the cost model's check (190 / 0 / 300; python
#    -m benchmarks.gpu, defaults: the four networks at 224 px, batch 64 and
#    16, StandardUpdater, CGDP with processes and threads and the limit,
#    then the per-layer profile and the predictions), its output in
#    gpu_benchmark.txt and its CSV and JSON in gpu_benchmark/; then the
#    optimizer form's benchmark (90 / 0 / 120; python -m
#    benchmarks.gpu_anyloop at batch 64: the plain loop, ChainerMN's
#    optimizer, CGDP's and the limit), in gpu_anyloop.txt and gpu_anyloop/;
#    then its 2-rank part (50 / 0 / 80; --ranks 2 --nets alexnet --batches
#    64: 2 ranks on the one GPU, ChainerMN against CGDP), in
#    gpu_anyloop_ranks.txt and gpu_anyloop_ranks/;
# 4. a short weak-scaling run of AlexNet at 224 px on GPUs (30 / 0 / 40;
#    --device-kind gpu: no CPU fallback), with CGDP's timeline and trace:
#    the experiment's pipeline on a GPU (the benchmark has the figures).
# Budgets: 565 s (all), 580 s (tests), 570 s (bench) of the 600 s limit.
# Everything goes into ONE archive directly under $OUT, gpu_check.tar.gz,
# beside a short summary, gpu_check_summary.txt. The script's status is the
# worst of its steps' (an MPI that the carried wheels do not make usable
# counts as 1, the other steps still run).
set -uo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
# The parts and their budgets (seconds): PART=all (the default) runs both
# in one call; PART=tests or PART=bench runs one, with more time each, for
# a session that can afford two calls.
PART=${PART:-all}
case $PART in
    all)   budgets=(100 75 190 90 50 30) ;;
    tests) budgets=(250 300 0 0 0 0) ;;
    bench) budgets=(0 0 300 120 80 40) ;;
    *) echo "PART must be all, tests or bench, not $PART" >&2; exit 2 ;;
esac
read -r single_budget ranks_budget benchmark_budget anyloop_budget \
    anyloop_ranks_budget scaling_budget <<< "${budgets[*]}"

mkdir -p "$OUT"
WORK=$(mktemp -d)
# The carried wheels' target: fresh each run, so that nothing stale of an
# earlier run shadows what this one carries.
SITE=$(mktemp -d /tmp/gpu_check_site.XXXXXX)
trap 'rm -rf "$WORK" "$SITE"' EXIT
SUMMARY="$OUT/gpu_check_summary.txt"
status=0
worst() { [ "$1" -gt "$status" ] && status=$1; return 0; }
pack() {
    tar -czf "$OUT/gpu_check.tar.gz" -C "$WORK" . 2>/dev/null
    { echo "status: $status"; cat "$WORK/summary.txt" 2>/dev/null; } > "$SUMMARY"
}

site_path=
# install_wheels WHEEL...: pip-installs the carried wheels into $SITE.
install_wheels() {
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade \
        --target "$SITE" "$@" && site_path=$SITE:
}
if [ -d .whl ] && ls .whl/chainer-7.8.1-*.whl >/dev/null 2>&1; then
    if ! install_wheels .whl/chainer-7.8.1-*.whl; then
        echo 'preflight failed: the carried Chainer wheel did not install' |
            tee "$WORK/summary.txt"
        status=1
        pack
        exit 1
    fi
fi
# MPICH's and mpi4py's wheels: mpi_wheels is none, installed or failed.
mpi_wheels=none
if ls .whl/mpich-*.whl >/dev/null 2>&1 && ls .whl/mpi4py-*.whl >/dev/null 2>&1
then
    mpi_wheels=failed
    if install_wheels .whl/mpich-*.whl .whl/mpi4py-*.whl \
            > "$WORK/mpi_wheels.txt" 2>&1 &&
            "$PYTHON" .ci/wheel_lib.py .whl/mpich-*.whl "$SITE/lib" \
            >> "$WORK/mpi_wheels.txt" 2>&1; then
        mpi_wheels=installed
        export CGDP_MPIEXEC=$SITE/bin/mpiexec
        export MPI4PY_LIBMPI=$SITE/lib/libmpi.so.12
    fi
fi
if [ -n "$site_path" ]; then
    export PYTHONPATH=$site_path$PWD
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

# MPI: the launcher that the tests and benchmarks take, on a 2-rank job.
MPI_SKIPS='the tests marked mpi and gpu, the 2-rank optimizer-form benchmark'
MPI_HELLO='from mpi4py import MPI
import mpi4py
world = MPI.COMM_WORLD
line = " ".join(map(str, [
    "hello from rank", world.Get_rank(), "of", world.Get_size(), "sum",
    world.allreduce(world.Get_rank() + 1), "mpi4py", mpi4py.__version__,
    "from", mpi4py.__file__, MPI.Get_library_version().splitlines()[0]]))
lines = world.gather(line)  # rank 0 prints them, one after the other
if lines:
    print("\n".join(lines))'
check_mpi() {
    echo "mpi wheels carried: $mpi_wheels"
    cat "$WORK/mpi_wheels.txt" 2>/dev/null
    local mpiexec job
    mpiexec=$("$PYTHON" -c 'from cgdp_chainer import mpi
print(mpi.find_mpiexec() or "")') || mpiexec=
    if [ -z "$mpiexec" ]; then
        echo "mpi: not usable: no mpiexec (carry MPICH's and mpi4py's" \
            "wheels; see above); skipped: $MPI_SKIPS"
        return 1
    fi
    echo "mpiexec: $mpiexec"
    timeout 30 "$mpiexec" -launcher fork -n 2 "$PYTHON" -c "$MPI_HELLO" \
        > "$WORK/mpi_hello.txt" 2>&1
    job=$?
    cat "$WORK/mpi_hello.txt"
    if [ $job -eq 0 ] && [ "$(grep -c '^hello from rank [01] of 2 sum 3 ' \
            "$WORK/mpi_hello.txt")" = 2 ]; then
        echo "mpi: usable (a 2-rank job under $mpiexec)"
        return 0
    fi
    echo "mpi: not usable: the 2-rank job exited $job (see above);" \
        "skipped: $MPI_SKIPS"
    return 1
}
check_mpi >> "$WORK/preflight.txt" 2>&1
if [ $? -ne 0 ]; then
    # The multi-rank parts then say they are skipped, rather than each
    # failing on its own; MPI wheels carried but unusable fail the check.
    unset CGDP_MPIEXEC
    [ "$mpi_wheels" != none ] && worst 1
fi
cat "$WORK/preflight.txt"
grep -E '^(python|cupy|nccl|cudnn|matplotlib|gpus|mpi|preflight)' \
    "$WORK/preflight.txt" > "$WORK/summary.txt"
if [ $preflight -ne 0 ]; then
    status=1
    pack
    exit 1
fi

# run_tests NAME BUDGET MARKS: pytest of the tests marked MARKS, one line
# per test as it ends (kept should the budget cut the run short).
run_tests() {
    local name=$1 budget=$2 marks=$3 code
    timeout "$budget" "$PYTHON" -m pytest -v -m "$marks" \
        -p no:cacheprovider tests > "$WORK/$name.txt" 2>&1
    code=$?
    worst $code
    tail -n 25 "$WORK/$name.txt"
    {
        echo "$name ($marks, ${budget} s): exit $code"
        grep -E ' (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)' "$WORK/$name.txt"
    } >> "$WORK/summary.txt"
}

# 2. the gpu tests ------------------------------------------------------------
if [ "$single_budget" -gt 0 ]; then
    run_tests gpu_tests "$single_budget" 'gpu and not mpi'
    run_tests gpu_mpi_tests "$ranks_budget" 'gpu and mpi'
fi

# 3. the GPU benchmark and the cost model's check -------------------------------
# run_benchmark NAME BUDGET TITLE MODULE [ARG...]: python -m MODULE ARG...
# --out $WORK/NAME, its output in NAME.txt and, under TITLE, the summary.
run_benchmark() {
    local name=$1 budget=$2 title=$3 module=$4 code
    shift 4
    timeout "$budget" "$PYTHON" -m "$module" "$@" --out "$WORK/$name" \
        > "$WORK/$name.txt" 2>&1
    code=$?
    worst $code
    cat "$WORK/$name.txt"
    {
        echo "$title: exit $code"
        grep -v '^  (' "$WORK/$name.txt"
    } >> "$WORK/summary.txt"
}
if [ "$benchmark_budget" -gt 0 ]; then
    run_benchmark gpu_benchmark "$benchmark_budget" 'gpu benchmark' \
        benchmarks.gpu
    run_benchmark gpu_anyloop "$anyloop_budget" 'gpu anyloop benchmark' \
        benchmarks.gpu_anyloop --batches 64
    run_benchmark gpu_anyloop_ranks "$anyloop_ranks_budget" \
        'gpu anyloop benchmark, 2 ranks on one GPU' \
        benchmarks.gpu_anyloop --ranks 2 --nets alexnet --batches 64
fi

# 4. weak scaling on GPUs -----------------------------------------------------
if [ "$scaling_budget" -gt 0 ]; then
gpus=$("$PYTHON" -c 'from cgdp_chainer import devices; print(devices.gpu_count())')
counts=1
[ "$gpus" -ge 2 ] && counts=1,2
timeout "$scaling_budget" "$PYTHON" -m experiments.weak_scaling --net alexnet --device-kind gpu \
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
fi
pack
cat "$SUMMARY"
exit $status
