"""ChainerMN scripts of any training loop, switched by one call (issue 27).

Each script under tests/mpi_scripts/anyloop_*.py is a Chainer 7.8.1 example
cut down to a tiny model, whose optimizers are wrapped by
``create_multi_node_optimizer`` of the module that ``--impl`` names
(``chainermn`` or ``cgdp``, i.e. ``cgdp_chainer``); nothing else differs.
Every script runs under ``mpiexec -n 2`` once per entry of :data:`IMPLS`,
each rank writing its models' arrays and reported values (see
tests/mpi_scripts/_anyloop.py), and the tests check:

* within each run, both ranks hold bit-identical parameters and grads
  (except what is per rank by design: BatchNormalization statistics, an
  LSTM's state, a grad that a later backward added to);
* the candidate run's arrays (parameters, ``grad/`` after the last update,
  per-rank statistics and state) equal the reference run's, rank by rank,
  within rtol 1e-5 and atol 1e-6, and so do the values it reported;
* a resumed Trainer run ends where the uninterrupted one does;
* a rank killed by SIGKILL ends the job, non-zero, leaving nothing in
  /dev/shm;
* all of it on GPUs too (``--device gpu``: ChainerMN's run through
  cgdp_chainer.mpi.host_staged's communicator, whose staging the CPU runs
  compare with ChainerMN's naive communicator);
* ``cgdp_chainer.create_multi_node_optimizer`` refuses what it cannot train.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy
import pytest

from test_mpi import JOB_TIMEOUT, REPO_ROOT, SCRIPTS, assert_ok
from test_mpi import mpi_environment, mpiexec_command, process_tree, run_job
# Fixtures: skip where MPI is not installed; remove what killed jobs left.
from test_mpi import mpiexec, remove_segments_of_killed_jobs  # NOQA: F401

# (reference, candidate): whose create_multi_node_optimizer each run calls.
IMPLS = ('chainermn', 'cgdp', 'cgdp-rank-hosts')
REFERENCE, CANDIDATE = IMPLS[:2]
RANK_HOSTS = 2  # the role of CGDP with node_host=False

RTOL, ATOL = 1e-5, 1e-6

# shape -> (script, the name of its OK lines)
SHAPES = {
    'dcgan': ('anyloop_dcgan.py', 'anyloop-dcgan'),
    'bptt': ('anyloop_bptt.py', 'anyloop-bptt'),
    'custom_loop': ('anyloop_custom_loop.py', 'anyloop-custom-loop'),
    'loss_scaling': ('anyloop_loss_scaling.py', 'anyloop-loss-scaling'),
    'spellings': ('anyloop_spellings.py', 'anyloop-spellings'),
}
RESUME = ('anyloop_trainer_resume.py', 'anyloop-trainer-resume')
SNAPSHOT_AT = 3

# A GPU job creates CUDA contexts, and its first run has CuPy compile its
# kernels (cached on disk for the next): it counts as hung later, and the
# scripts' hang watchdog (_common.WATCHDOG_SECONDS) waits that long too.
GPU_JOB_TIMEOUT = 240
GPU_WATCHDOG = {'CGDP_MPI_WATCHDOG': str(GPU_JOB_TIMEOUT - 15)}


def on_gpus(args):
    """Whether a script's arguments put it on GPUs (``--device gpu``)."""
    return any(args[index:index + 2] == ('--device', 'gpu')
               for index in range(len(args)))


# -- the runs and what they wrote ---------------------------------------------

class Run(object):
    """What one run's ranks wrote: ``arrays[r]`` (key -> array) and
    ``report[r]`` (the JSON: values, per_rank) for each rank r."""

    def __init__(self, impl, out):
        self.impl = impl
        self.out = out
        self.arrays, self.report = [], []
        rank = 0
        while os.path.exists(os.path.join(out, 'rank{}.json'.format(rank))):
            stem = os.path.join(out, 'rank{}'.format(rank))
            with numpy.load(stem + '.npz') as npz:
                self.arrays.append({key: npz[key] for key in npz.files})
            with open(stem + '.json') as stream:
                self.report.append(json.load(stream))
            rank += 1

    def values(self, rank):
        return self.report[rank]['values']

    def __repr__(self):
        return '{} run in {}'.format(self.impl, self.out)


_RUNS = {}


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """``trained(script, name, role, *args)``: the script's run with the
    impl of ``role`` (0 reference, 1 candidate); each run once per module."""
    def run(script, name, role, *args):
        key = (script, role) + args
        if key not in _RUNS:
            out = str(tmp_path_factory.mktemp('{}-{}-{}'.format(
                script[:-3], role, IMPLS[role])))
            command = mpiexec_command(2, script, '--impl', IMPLS[role],
                                      '--out', out, *args)
            if on_gpus(args):
                job = run_job(command, GPU_JOB_TIMEOUT, GPU_WATCHDOG)
            else:
                job = run_job(command, JOB_TIMEOUT)
            assert_ok(job, name)
            _RUNS[key] = Run(IMPLS[role], out)
            _RUNS[key].output = job.output
        return _RUNS[key]
    return run


# -- comparisons --------------------------------------------------------------

def per_rank(run, key):
    return key.startswith(tuple(run.report[0]['per_rank']))


def assert_ranks_agree(run):
    """Every rank's arrays are bit-identical to rank 0's, except the keys
    that the script declares per rank."""
    assert len(run.arrays) == 2, run
    shared = sorted(key for key in run.arrays[0] if not per_rank(run, key))
    assert [key for key in shared if '/' in key and not key.startswith(
        ('grad/', 'persistent/', 'state/'))], (run, 'no parameter saved')
    for rank in range(1, len(run.arrays)):
        assert shared == sorted(key for key in run.arrays[rank]
                                if not per_rank(run, key)), (run, rank)
        for key in shared:
            numpy.testing.assert_array_equal(
                run.arrays[rank][key], run.arrays[0][key],
                err_msg='{}: {} differs between rank 0 and rank {}'.format(
                    run, key, rank))


def assert_same_arrays(run, reference):
    """``run`` ends with ``reference``'s arrays, rank by rank."""
    assert len(run.arrays) == len(reference.arrays), (run, reference)
    for rank, (ours, theirs) in enumerate(zip(run.arrays,
                                              reference.arrays)):
        assert sorted(ours) == sorted(theirs), (rank, run, reference)
        for key in sorted(theirs):
            numpy.testing.assert_allclose(
                ours[key], theirs[key], rtol=RTOL, atol=ATOL,
                err_msg='rank {}: {} of the {} differs from the {}'.format(
                    rank, key, run, reference))


def assert_same_values(ours, theirs, where):
    """Reported values: numbers within RTOL/ATOL, the rest equal."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and sorted(ours) == sorted(theirs), \
            (where, ours, theirs)
        for key in sorted(theirs):
            assert_same_values(ours[key], theirs[key],
                               '{}[{!r}]'.format(where, key))
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), \
            (where, ours, theirs)
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            assert_same_values(mine, other, '{}[{}]'.format(where, index))
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=RTOL, abs=ATOL), \
            (where, ours, theirs)
    else:
        assert ours == theirs, (where, ours, theirs)


def assert_same_reports(run, reference):
    for rank in range(len(reference.report)):
        assert_same_values(run.values(rank), reference.values(rank),
                           'rank {} values of the {}'.format(rank, run))


# -- the three loops ----------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize('role', [0, 1], ids=['reference', 'candidate'])
@pytest.mark.parametrize('shape', sorted(SHAPES))
def test_both_ranks_end_with_one_model(mpiexec, trained, shape, role):
    assert_ranks_agree(trained(*SHAPES[shape], role))


@pytest.mark.mpi
@pytest.mark.parametrize('shape', sorted(SHAPES))
def test_the_switched_call_trains_what_chainermn_trains(mpiexec, trained,
                                                        shape):
    reference = trained(*SHAPES[shape], 0)
    candidate = trained(*SHAPES[shape], 1)
    assert_same_arrays(candidate, reference)
    assert_same_reports(candidate, reference)


@pytest.mark.mpi
@pytest.mark.parametrize('shape', sorted(SHAPES))
def test_a_host_per_rank_trains_what_a_shared_node_host_does(
        mpiexec, trained, shape):
    # node_host=False: every rank reduces and updates whole chunks after
    # their all-reduce, instead of its part of the machine's shared host.
    reference = trained(*SHAPES[shape], 0)
    rank_hosts = trained(*SHAPES[shape], RANK_HOSTS)
    assert_ranks_agree(rank_hosts)
    assert_same_arrays(rank_hosts, reference)
    assert_same_reports(rank_hosts, reference)


# -- the GPU path, on the CPU stand-in of CuPy's copies -----------------------

# CGDP's runs train each model through the optimizer form's GPU path (host
# shadow, ChunkedCudaTransfer, copy streams that hold their copies back
# until an event orders them), with the NumPy stand-in of tests/
# cuda_standin.py; ChainerMN's '@numpy' run is the reference.
STANDIN = ('--device', 'standin')


@pytest.mark.mpi
@pytest.mark.parametrize('args', [(), STANDIN], ids=['numpy', 'standin'])
def test_the_spellings_of_real_scripts_share_one_node_host(mpiexec, trained,
                                                           args):
    # Deprecated hook aliases, CorrectedMomentumSGD, RMSprop, AdaGrad,
    # AdaDelta, RMSpropGraves and a frozen layer (issue 40; the script
    # checks that the frozen layers never change): the ranks of the machine
    # share one host.
    run = trained(*SHAPES['spellings'], 1, *args)
    assert 'host of its own' not in run.output, run.output


@pytest.mark.mpi
@pytest.mark.parametrize('role', [1, RANK_HOSTS],
                         ids=['node-host', 'rank-hosts'])
@pytest.mark.parametrize('shape', sorted(SHAPES))
def test_the_gpu_path_trains_what_chainermn_trains(mpiexec, trained, shape,
                                                   role):
    reference = trained(*SHAPES[shape], 0)
    device_run = trained(*SHAPES[shape], role, *STANDIN)
    assert_ranks_agree(device_run)
    assert_same_arrays(device_run, reference)
    assert_same_reports(device_run, reference)


@pytest.mark.mpi
@pytest.mark.slow
def test_the_gpu_path_snapshots_and_resumes_as_chainermn_does(
        mpiexec, trained):
    for reference, candidate in zip(
            resumed_pair(trained, 0),
            resumed_pair(trained, 1, *STANDIN)):
        assert_same_arrays(candidate, reference)
        assert_same_reports(candidate, reference)


# On GPUs: ChainerMN's run and CGDP's of the same script on the same GPUs
# (two ranks on the one GPU of a machine that has one); ChainerMN's reduces
# through the host-staged communicator (the MPI here is not CUDA-aware).
GPU = ('--device', 'gpu')
GPU_SHAPES = tuple(sorted(SHAPES))  # every script takes --device gpu


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize('shape', GPU_SHAPES)
def test_on_gpus_the_switched_call_trains_what_chainermn_trains(
        mpiexec, trained, shape):
    reference = trained(*SHAPES[shape], 0, *GPU)
    candidate = trained(*SHAPES[shape], 1, *GPU)
    for run in (reference, candidate):
        assert_ranks_agree(run)
    assert_same_arrays(candidate, reference)
    assert_same_reports(candidate, reference)


# -- ChainerMN's host-staged communicator ------------------------------------

# On the CPU, '--comm staged' stages every host array as the GPU runs stage
# device arrays: copied out, reduced or broadcast by the naive
# communicator's MPI call, copied back. ChainerMN's run must not change.
STAGED = ('--comm', 'staged')


@pytest.mark.mpi
@pytest.mark.parametrize('shape', ['custom_loop', 'loss_scaling'])
def test_the_host_staged_communicator_trains_what_the_naive_one_does(
        mpiexec, trained, shape):
    naive = trained(*SHAPES[shape], 0)
    staged = trained(*SHAPES[shape], 0, *STAGED)
    assert_ranks_agree(staged)
    assert len(staged.arrays) == len(naive.arrays)
    for rank, (ours, theirs) in enumerate(zip(staged.arrays, naive.arrays)):
        assert sorted(ours) == sorted(theirs), rank
        for key in sorted(theirs):
            numpy.testing.assert_array_equal(
                ours[key], theirs[key], err_msg='rank {}: {}'.format(
                    rank, key))
        assert staged.values(rank) == naive.values(rank), rank


# -- a Trainer, a snapshot, a resumed run -------------------------------------

def resumed_pair(trained, role, *args):
    """The uninterrupted run, and the run resumed from its snapshot."""
    whole = trained(*RESUME, role, '--snapshot-at', str(SNAPSHOT_AT), *args)
    snapshot = os.path.join(whole.out, 'trainer',
                            'snapshot_rank0_iter_{}'.format(SNAPSHOT_AT))
    assert os.path.isfile(snapshot), os.listdir(os.path.dirname(snapshot))
    resumed = trained(*RESUME, role, '--snapshot-at', str(SNAPSHOT_AT),
                      '--resume', snapshot, *args)
    return whole, resumed


def checkpointed_pair(trained, role, *args):
    """The uninterrupted run with ChainerMN's multi-node checkpointer, and
    the run resumed from the checkpoints it kept."""
    saver = ('--snapshot-at', str(SNAPSHOT_AT), '--saver', 'checkpointer')
    whole = trained(*RESUME, role, *(saver + args))
    kept = os.path.join(whole.out, 'kept')
    assert len(os.listdir(kept)) == 2, os.listdir(kept)  # one per rank
    resumed = trained(*RESUME, role, *(saver + ('--resume', kept) + args))
    return whole, resumed


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('role', [0, 1], ids=['reference', 'candidate'])
def test_a_resumed_trainer_ends_where_the_uninterrupted_one_does(
        mpiexec, trained, role):
    assert_resumed_run_ends_where_whole_one_does(
        *resumed_pair(trained, role))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize('role', [0, 1], ids=['reference', 'candidate'])
def test_on_gpus_a_resumed_trainer_ends_where_the_uninterrupted_one_does(
        mpiexec, trained, role):
    assert_resumed_run_ends_where_whole_one_does(
        *resumed_pair(trained, role, *GPU))


def assert_resumed_run_ends_where_whole_one_does(whole, resumed):
    assert_training_goes_on_from_the_saved_state(whole, resumed)
    for rank in range(2):
        # The snapshot holds rank 0's LogReport: its log goes on.
        assert_same_values(resumed.values(rank)['log'],
                           whole.values(rank)['log'],
                           'rank {} log of the {}'.format(rank, resumed))
    assert whole.values(0)['log'] and whole.values(1)['log'] is None
    assert any('validation/main/loss' in entry
               for entry in whole.values(0)['log'])


def assert_training_goes_on_from_the_saved_state(whole, resumed):
    """Both runs agree across their ranks; the resumed run ends with the
    whole run's arrays, steps and observations."""
    for run in (whole, resumed):
        assert_ranks_agree(run)
    assert_same_arrays(resumed, whole)
    for rank in range(2):
        ours, theirs = resumed.values(rank), whole.values(rank)
        assert ours['iteration'] == theirs['iteration'] == 6
        # Every iteration is a step (the script spent ChainerMN's
        # broadcast before the trainer ran).
        assert ours['t'] == theirs['t'] == 6
        assert_same_values(ours['observed'],
                           theirs['observed'][SNAPSHOT_AT:],
                           'rank {} observations of the {}'.format(
                               rank, resumed))


@pytest.mark.mpi
@pytest.mark.slow
def test_the_switched_call_snapshots_and_resumes_as_chainermn_does(
        mpiexec, trained):
    for reference, candidate in zip(resumed_pair(trained, 0),
                                    resumed_pair(trained, 1)):
        assert_same_arrays(candidate, reference)
        assert_same_reports(candidate, reference)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('device', [(), STANDIN], ids=['numpy', 'standin'])
def test_the_multi_node_checkpointer_resumes_as_chainermn_does(
        mpiexec, trained, device):
    # chainermn.create_multi_node_checkpointer saves and loads the trainer,
    # the optimizer's state within; CGDP's runs go on from it as
    # ChainerMN's do, through the GPU path's host shadow too.
    assert_checkpointed_pairs_agree(checkpointed_pair(trained, 1, *device),
                                    checkpointed_pair(trained, 0))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.gpu
def test_on_gpus_the_multi_node_checkpointer_resumes_as_chainermn_does(
        mpiexec, trained):
    assert_checkpointed_pairs_agree(checkpointed_pair(trained, 1, *GPU),
                                    checkpointed_pair(trained, 0, *GPU))


def assert_checkpointed_pairs_agree(candidate, reference):
    """The candidate's resumed run trains on from the checkpoint as its
    whole run did, and both equal the reference's. (Not its log: ChainerMN's
    checkpointer, at its default priority, saves LogReport before LogReport
    took the iteration in, so that entry is missing from either resumed
    run's log.)"""
    assert_training_goes_on_from_the_saved_state(*candidate)
    for ours, theirs in zip(candidate, reference):
        assert_same_arrays(ours, theirs)
        assert_same_reports(ours, theirs)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.gpu
def test_on_gpus_the_switched_call_snapshots_and_resumes_as_chainermn_does(
        mpiexec, trained):
    for reference, candidate in zip(resumed_pair(trained, 0, *GPU),
                                    resumed_pair(trained, 1, *GPU)):
        assert_same_arrays(candidate, reference)
        assert_same_reports(candidate, reference)


# -- a rank killed outright ---------------------------------------------------

SHM_FOLDER = '/dev/shm'
# The job must end by itself within this many seconds; if it has not, the
# test kills it and fails (a liveness bound, not a speed check).
KILLED_JOB_BOUND = 30
# On GPUs the bound adds the time to start CUDA and compile CuPy's kernels.
KILLED_JOB_BOUND_ON_GPUS = 150
# Other users' jobs create and remove files in /dev/shm meanwhile: a new
# file counts as left behind if no live process uses it and it is still
# there this long after the job ended.
SHM_SETTLE_SECONDS = 5


def shm_names_used_by(pid):
    """Names in /dev/shm that process ``pid`` maps or holds open."""
    prefix = SHM_FOLDER + '/'
    names = set()
    try:
        with open('/proc/{}/maps'.format(pid)) as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    names.add(fields[5].strip()[len(prefix):])
        for fd in os.listdir('/proc/{}/fd'.format(pid)):
            target = os.readlink('/proc/{}/fd/{}'.format(pid, fd))
            if target.startswith(prefix):
                names.add(target[len(prefix):])
    except OSError:  # ended meanwhile, or not ours to read
        pass
    return {name for name in names if not name.endswith(' (deleted)')}


def shm_names_in_use():
    return set().union(*[shm_names_used_by(entry)
                         for entry in os.listdir('/proc') if entry.isdigit()])


class ShmWatch(object):
    """Every /dev/shm name that a job's processes use while it runs."""

    def __init__(self, root_pid):
        self.root_pid = root_pid
        self.names = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            for pid in process_tree(self.root_pid):
                self.names |= shm_names_used_by(pid)
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.names


def run_killed_job(*args):
    """Runs anyloop_killed_rank.py (with ``args``); returns (status,
    output, shm names that the job used)."""
    command = mpiexec_command(2, 'anyloop_killed_rank.py', '--impl',
                              CANDIDATE, *args)
    bound = KILLED_JOB_BOUND_ON_GPUS if on_gpus(args) else KILLED_JOB_BOUND
    environment = mpi_environment()
    environment['CGDP_MPI_WATCHDOG'] = str(10 * bound)
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    watch = ShmWatch(process.pid)
    try:
        output, _ = process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        watch.stop()
        pytest.fail('the job went on for {} s after rank 1 was killed; '
                    'output:\n{}'.format(bound, output))
    return process.returncode, output, watch.stop()


def new_files_left(before):
    """New names in /dev/shm that no live process uses, once those that
    other jobs remove by themselves are gone (see SHM_SETTLE_SECONDS)."""
    deadline = time.monotonic() + SHM_SETTLE_SECONDS
    while True:
        new = set(os.listdir(SHM_FOLDER)) - before
        left = sorted(new - shm_names_in_use())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def remove_files(names):
    for name in names:
        try:
            os.unlink(os.path.join(SHM_FOLDER, name))
        except OSError:
            pass


@pytest.mark.mpi
@pytest.mark.slow
def test_a_killed_rank_ends_the_job_leaving_nothing_in_dev_shm(mpiexec):
    assert_killed_job_ends_leaving_nothing()


@pytest.mark.mpi
@pytest.mark.slow
def test_on_the_gpu_path_a_killed_rank_ends_the_job_leaving_nothing(
        mpiexec):
    assert_killed_job_ends_leaving_nothing(*STANDIN)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.gpu
def test_on_gpus_a_killed_rank_ends_the_job_leaving_nothing_in_dev_shm(
        mpiexec):
    assert_killed_job_ends_leaving_nothing(*GPU)


def assert_killed_job_ends_leaving_nothing(*args):
    before = set(os.listdir(SHM_FOLDER))
    status, output, used = run_killed_job(*args)
    assert status != 0, output
    assert 'OK ' not in output, output
    # The job's own files (it used them) and new files nobody uses.
    deadline = time.monotonic() + SHM_SETTLE_SECONDS
    while used & shm_names_in_use() and time.monotonic() < deadline:
        time.sleep(0.1)  # a rank that is ending still maps its files
    own = sorted(name for name in used
                 if os.path.exists(os.path.join(SHM_FOLDER, name)))
    left = sorted(set(own) | set(new_files_left(before)))
    remove_files(own)  # nobody else will
    if CANDIDATE == 'chainermn' and left and all(
            name.startswith('mpich_') for name in left):
        pytest.xfail("ChainerMN leaves MPICH's segment when a rank is "
                     "killed outright: {}".format(left))
    assert left == [], (left, output)


# -- refusals -----------------------------------------------------------------

_REFUSALS = {}


def refusals():
    """case -> outcome of anyloop_refusals.py (one plain process, no
    mpiexec: MPI starts as a singleton there, never in the test process)."""
    if not _REFUSALS:
        completed = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, 'anyloop_refusals.py')],
            cwd=REPO_ROOT, env=mpi_environment(), capture_output=True,
            text=True, timeout=JOB_TIMEOUT)
        assert completed.returncode == 0, completed.stderr
        for line in completed.stdout.splitlines():
            outcome = json.loads(line)
            _REFUSALS[outcome['case']] = outcome
    return _REFUSALS


@pytest.mark.mpi
def test_double_buffering_is_refused(mpiexec):
    outcome = refusals()['double_buffering']
    assert outcome['raised'] == 'ValueError', outcome
    assert 'double_buffering' in outcome['message'], outcome


@pytest.mark.mpi
@pytest.mark.parametrize('case', ['not_a_gradient_method', 'wrapped_twice'])
def test_an_actual_optimizer_that_is_not_a_gradient_method_is_refused(
        mpiexec, case):
    outcome = refusals()[case]
    assert outcome['raised'] == 'ValueError', outcome
    assert 'GradientMethod' in outcome['message'], outcome
