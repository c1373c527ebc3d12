"""Multi-node pieces (cgdp_chainer.mpi), each run as a real 2-rank MPI job.

Every test launches ``mpiexec -n 2 python tests/mpi_scripts/X.py`` with the
mpiexec of the venv's ``mpich`` wheel, under a timeout, and reads the
job's status and output. A script prints ``OK <name> rank <r>`` per rank
when all its checks pass; a failed check aborts the job with the rank's
traceback (cgdp_chainer.mpi.abort_on_exception).
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from cgdp_chainer import mpi as cgdp_mpi

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'mpi_scripts')
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_RANKS = 2
JOB_TIMEOUT = 60  # seconds; each job takes a few


def mpiexec_path():
    """The mpiexec installed next to this Python (the mpich wheel's)."""
    return os.path.join(os.path.dirname(sys.executable), 'mpiexec')


def mpiexec_command(n_ranks, script, *args):
    """The command line that runs ``script`` on ``n_ranks`` local ranks.

    ``-launcher fork`` makes Hydra start the ranks as its own children
    instead of through ssh, which containers lack; nothing else is needed
    for MPICH's wheel on one machine.
    """
    return ([mpiexec_path(), '-launcher', 'fork', '-n', str(n_ranks),
             sys.executable, os.path.join(SCRIPTS, script)] + list(args))


def mpi_environment():
    """The test's environment, with one BLAS/OpenMP thread per rank: the
    ranks share few cores, and oversubscribed BLAS only slows them down."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
               MKL_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    return env


class Job(object):
    """What a finished MPI job left: status, output and time taken."""

    def __init__(self, returncode, output, seconds):
        self.returncode = returncode
        self.output = output
        self.seconds = seconds

    def ok_ranks(self, name):
        return sorted(int(rank) for rank in re.findall(
            r'^OK {} rank (\d+)$'.format(re.escape(name)), self.output,
            re.MULTILINE))


def run_mpi(script, *args, n_ranks=N_RANKS, timeout=JOB_TIMEOUT):
    """Runs an MPI job; kills its whole process group if it overruns.

    Returns:
        Job: The finished job.
    """
    started = time.monotonic()
    process = subprocess.Popen(
        mpiexec_command(n_ranks, script, *args), cwd=REPO_ROOT,
        env=mpi_environment(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        # Its own process group: on a timeout the ranks die with mpiexec.
        start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail('MPI job {} {} hung for {} s; output:\n{}'.format(
            script, ' '.join(args), timeout, output))
    return Job(process.returncode, output, time.monotonic() - started)


def assert_ok(job, name, n_ranks=N_RANKS):
    assert job.returncode == 0, job.output
    assert job.ok_ranks(name) == list(range(n_ranks)), job.output


@pytest.fixture
def mpiexec():
    """Skips where the MPI stack is not installed."""
    if not os.path.exists(mpiexec_path()):
        pytest.skip('no mpiexec next to {} (install the mpi extra: '
                    'pip install -e .[mpi])'.format(sys.executable))
    pytest.importorskip('mpi4py')
    return mpiexec_path()


# -- without MPI: the pure parts ---------------------------------------------

def test_shards_cover_the_dataset_with_equal_lengths():
    for n_examples, size in [(8, 2), (9, 2), (10, 3), (3, 4)]:
        ranges = [cgdp_mpi.shard_range(n_examples, rank, size)
                  for rank in range(size)]
        lengths = {end - begin for begin, end in ranges}
        assert len(lengths) == 1, ranges
        covered = set()
        for begin, end in ranges:
            assert 0 <= begin <= end <= n_examples, ranges
            covered.update(range(begin, end))
        assert covered == set(range(n_examples)), ranges
    assert [cgdp_mpi.shard_range(8, rank, 2) for rank in range(2)] == [
        (0, 4), (4, 8)]


def test_first_difference_names_missing_and_extra_parameters():
    def setup(*parameters, **hyperparameters):
        return {'parameters': list(parameters), 'optimizer': 'MomentumSGD',
                'hyperparameters': {key: repr(value) for key, value in
                                    hyperparameters.items()},
                'hooks': []}
    w = ('/fc/W', (3, 2), 'float32')
    b = ('/fc/b', (3,), 'float32')
    assert cgdp_mpi.first_difference(setup(w, b), setup(w, b), 0, 1) is None
    assert cgdp_mpi.first_difference(setup(w, b), setup(w), 0, 1) == (
        'rank 1 has no parameter /fc/b, rank 0 has it (shape (3,))')
    assert cgdp_mpi.first_difference(setup(w), setup(w, b), 0, 1) == (
        'rank 1 has parameter /fc/b (shape (3,)), rank 0 does not')
    assert cgdp_mpi.first_difference(
        setup(w), setup(('/fc/W', (3, 2), 'float64')), 0, 1) == (
        'rank 1 has parameter /fc/W of dtype float64, rank 0 has float32')
    assert cgdp_mpi.first_difference(
        setup(w), setup(('/fc/W', None, None)), 0, 1) == (
        'rank 1 has parameter /fc/W of shape uninitialized, rank 0 has '
        '(3, 2)')
    assert cgdp_mpi.first_difference(
        setup(w, momentum=0.9), setup(w), 0, 1) == (
        'rank 1 has no optimizer hyperparameter momentum, rank 0 has '
        'momentum=0.9')


# -- MPI jobs ----------------------------------------------------------------

@pytest.mark.mpi
def test_allreducer_sums_chunks_started_from_two_threads(mpiexec):
    assert_ok(run_mpi('allreduce_sum.py'), 'allreduce')


@pytest.mark.mpi
def test_allreducer_on_a_single_rank(mpiexec):
    assert_ok(run_mpi('allreduce_sum.py', n_ranks=1), 'allreduce', n_ranks=1)


@pytest.mark.mpi
def test_consistency_check_names_the_first_difference_on_every_rank(mpiexec):
    job = run_mpi('consistency.py')
    assert_ok(job, 'consistency')
    expected = {
        'shape': 'rank 1 has parameter /predictor/fc8/W of shape (10, 16), '
                 'rank 0 has (100, 16)',
        'lr': 'rank 1 has optimizer hyperparameter lr=0.02, rank 0 has '
              'lr=0.01',
        'class': 'rank 1 uses optimizer Adam, rank 0 uses MomentumSGD',
    }
    for case, difference in expected.items():
        for rank in range(N_RANKS):
            line = re.search(r'^CASE {} rank {}: (.*)$'.format(case, rank),
                             job.output, re.MULTILINE)
            assert line is not None, (case, rank, job.output)
            assert difference in line.group(1), (case, rank, job.output)


@pytest.mark.mpi
@pytest.mark.parametrize('mode, failing_rank, message', [
    ('main', 1, 'RuntimeError: injected fault on rank 1'),
    ('thread', 1, 'RuntimeError: injected fault on rank 1 in a thread'),
    ('stall', 0, 'TimeoutError: all-reduce request #0 on rank 0'),
])
def test_a_fault_on_one_rank_ends_the_whole_job(mpiexec, mode, failing_rank,
                                                message):
    job = run_mpi('fault.py', mode, timeout=30)
    assert job.returncode != 0, job.output
    # Without the abort the other rank waits forever; with it the job ends
    # within seconds (the stall mode waits 1 s for its stall timeout).
    assert job.seconds < 20, job.output
    prefix = '[rank {}] '.format(failing_rank)
    assert prefix + 'Uncaught exception on rank {}'.format(
        failing_rank) in job.output, job.output
    assert prefix + 'Traceback (most recent call last):' in job.output
    assert prefix + message in job.output, job.output


@pytest.mark.mpi
def test_chainermn_baseline_equals_one_process_on_the_whole_batch(mpiexec):
    assert_ok(run_mpi('chainermn_baseline.py'), 'chainermn')


@pytest.mark.mpi
def test_multi_node_cgdp_equals_one_process_with_as_many_devices(mpiexec):
    assert_ok(run_mpi('cgdp_equivalence.py'), 'cgdp')
