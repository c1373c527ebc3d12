"""Multi-node pieces (cgdp_chainer.mpi), each run as a real 2-rank MPI job.

Every test launches ``mpiexec -n 2 python tests/mpi_scripts/X.py`` with the
mpiexec of the venv's ``mpich`` wheel (or ``$CGDP_MPIEXEC``'s: see
``cgdp_chainer.mpi.find_mpiexec``), under a timeout, and reads the
job's status and output. A script prints ``OK <name> rank <r>`` per rank
when all its checks pass; a failed check aborts the job with the rank's
traceback (cgdp_chainer.mpi.abort_on_exception). The experiment scripts
(``python -m experiments.train`` / ``experiments.weak_scaling``) run the
same way, as ``mpiexec -launcher fork -n 2 python -m MODULE ...``.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer.mpi import shm as cgdp_shm
from experiments import results

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'mpi_scripts')
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_RANKS = 2
JOB_TIMEOUT = 60  # seconds; each job takes a few


def mpiexec_path():
    """The mpiexec of the project's MPI jobs (``$CGDP_MPIEXEC``, else the
    mpich wheel's next to this Python), or None where there is none."""
    return cgdp_mpi.find_mpiexec()


def mpiexec_command(n_ranks, script, *args):
    """The command line that runs ``script`` on ``n_ranks`` local ranks.

    ``-launcher fork`` makes Hydra start the ranks as its own children
    instead of through ssh, which containers lack; nothing else is needed
    for MPICH's wheel on one machine.
    """
    return ([mpiexec_path(), '-launcher', 'fork', '-n', str(n_ranks),
             sys.executable, os.path.join(SCRIPTS, script)] + list(args))


def mpiexec_module_command(n_ranks, module, *args):
    """``mpiexec ... python -m module args`` on ``n_ranks`` local ranks."""
    return ([mpiexec_path(), '-launcher', 'fork', '-n', str(n_ranks),
             sys.executable, '-m', module] + list(args))


def mpi_environment():
    """The test's environment, with one BLAS/OpenMP thread per rank: the
    ranks share few cores, and oversubscribed BLAS only slows them down."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
               MKL_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    return env


def plain_environment():
    """The environment without any MPI launcher's variables."""
    return {key: value for key, value in mpi_environment().items()
            if key not in cgdp_mpi.LAUNCH_VARIABLES}


# -- MPICH's shared memory: what the jobs leave in /dev/shm ------------------

def process_tree(root_pid):
    """``root_pid`` and its live descendants. Hydra starts its proxy and the
    ranks in sessions of their own, so only parenthood links them to the
    mpiexec that the test started."""
    children = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/{}/stat'.format(entry)) as stat_file:
                stat = stat_file.read()
        except OSError:  # ended meanwhile
            continue
        # The command name may hold spaces: the fields follow its ')'.
        parent = int(stat[stat.rindex(')') + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def segment_mappers(name):
    """Pids of the live processes that map /dev/shm/``name``."""
    return [int(entry) for entry in os.listdir('/proc') if entry.isdigit()
            and name in cgdp_shm.mapped_mpich_segments(entry)]


def segment_exists(name):
    return os.path.exists(os.path.join(cgdp_shm.SHM_FOLDER, name))


class SegmentWatch(object):
    """Notes the MPICH segments that a job's processes map while it runs.

    Other jobs on the machine (other users' tests) create segments too:
    only the ones that this job's own processes mapped are its own.

    Args:
        root_pid (int): The job's mpiexec.
    """

    POLL_SECONDS = 0.1

    def __init__(self, root_pid):
        self.root_pid = root_pid
        self.segments = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name='segment watch')
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            for pid in process_tree(self.root_pid):
                self.segments |= cgdp_shm.mapped_mpich_segments(pid)
            self._stop.wait(self.POLL_SECONDS)

    def stop(self):
        """Stops watching (once the job has ended).

        Returns:
            list of str: The job's segments still in /dev/shm.
        """
        self._stop.set()
        self._thread.join()
        return sorted(name for name in self.segments if segment_exists(name))


# Every segment that a job of this module mapped, and those that the
# harness had to remove because the job's ranks were killed (a hung job).
SEGMENTS_SEEN = set()
SEGMENTS_REMOVED = set()
_WATCHES = []


@pytest.fixture(autouse=True)
def remove_segments_of_killed_jobs():
    """After each test: removes what its jobs left in /dev/shm.

    MPICH unlinks its segment in MPI_Finalize, and the project's abort path
    unlinks it before MPI_Abort; only ranks killed outright (a job killed
    as hung) leave one, and nobody else will remove it.
    """
    yield
    while _WATCHES:
        watch = _WATCHES.pop()
        for name in watch.stop():
            # A rank that is still ending keeps its mapping briefly.
            deadline = time.monotonic() + 5
            while segment_mappers(name) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not segment_mappers(name):
                os.unlink(os.path.join(cgdp_shm.SHM_FOLDER, name))
                SEGMENTS_REMOVED.add(name)
        SEGMENTS_SEEN.update(watch.segments)


class Job(object):
    """What a finished MPI job left: status, output, time taken, and the
    names of its shared-memory segments still in /dev/shm when it ended."""

    def __init__(self, returncode, output, seconds, segments_left=()):
        self.returncode = returncode
        self.output = output
        self.seconds = seconds
        self.segments_left = list(segments_left)

    def ok_ranks(self, name):
        return sorted(int(rank) for rank in re.findall(
            r'^OK {} rank (\d+)$'.format(re.escape(name)), self.output,
            re.MULTILINE))


def run_mpi(script, *args, n_ranks=N_RANKS, timeout=JOB_TIMEOUT):
    """Runs an MPI job; kills its whole process group if it overruns.

    Returns:
        Job: The finished job.
    """
    return run_job(mpiexec_command(n_ranks, script, *args), timeout)


def run_mpi_module(module, *args, n_ranks=N_RANKS, timeout=JOB_TIMEOUT):
    """Runs ``python -m module args`` as an MPI job (see :func:`run_job`).

    Returns:
        Job: The finished job.
    """
    return run_job(mpiexec_module_command(n_ranks, module, *args), timeout)


def start_job(command, env=None):
    """Starts a job in its own process group, output merged, from the
    repository root; ``env`` overrides variables of the environment."""
    environment = mpi_environment()
    environment.update(env or {})
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # Its own process group: on a timeout the ranks die with mpiexec.
        start_new_session=True)
    process.segment_watch = SegmentWatch(process.pid)
    _WATCHES.append(process.segment_watch)
    return process


def run_job(command, timeout=JOB_TIMEOUT, env=None):
    """Runs ``command``; kills its whole process group if it overruns.

    Args:
        command (list of str): The job's command line.
        timeout (float): Seconds before it counts as hung.
        env (dict or None): Variables to set in the job's environment.

    Returns:
        Job: The finished job.
    """
    started = time.monotonic()
    process = start_job(command, env)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail('MPI job {} hung for {} s; output:\n{}'.format(
            ' '.join(command), timeout, output))
    return Job(process.returncode, output, time.monotonic() - started,
               process.segment_watch.stop())


def assert_ok(job, name, n_ranks=N_RANKS):
    assert job.returncode == 0, job.output
    assert job.ok_ranks(name) == list(range(n_ranks)), job.output


@pytest.fixture
def mpiexec():
    """Skips where the MPI stack is not installed."""
    path = mpiexec_path()
    if path is None:
        pytest.skip('{} (install the mpi extra: pip install -e .[mpi])'
                    .format(cgdp_mpi.no_mpiexec_words()))
    pytest.importorskip('mpi4py')
    return path


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
    # Without the abort the other rank waits forever, and run_job fails the
    # test as hung after 60 s (a liveness bound, not a speed check); with it
    # the job ends within seconds (the stall mode waits 1 s for its stall
    # timeout).
    job = run_mpi('fault.py', mode, timeout=60)
    assert job.returncode != 0, job.output
    prefix = '[rank {}] '.format(failing_rank)
    assert prefix + 'Uncaught exception on rank {}'.format(
        failing_rank) in job.output, job.output
    assert prefix + 'Traceback (most recent call last):' in job.output
    assert prefix + message in job.output, job.output
    # No rank finalizes after MPI_Abort: the aborting rank unlinked MPICH's
    # shared memory itself.
    assert job.segments_left == []


@pytest.mark.mpi
def test_chainermn_baseline_equals_one_process_on_the_whole_batch(mpiexec):
    assert_ok(run_mpi('chainermn_baseline.py'), 'chainermn')


@pytest.mark.mpi
def test_multi_node_cgdp_equals_one_process_with_as_many_devices(mpiexec):
    assert_ok(run_mpi('cgdp_equivalence.py'), 'cgdp')


@pytest.mark.mpi
def test_multi_node_grads_and_dynamic_loss_scaling_equal_one_process(
        mpiexec):
    assert_ok(run_mpi('grads_and_loss_scaling.py'), 'grads')


@pytest.mark.mpi
def test_a_last_batch_shorter_than_the_replicas_trains_as_chainermn(mpiexec):
    # Each rank's third batch holds 1 example for its 2 replicas; the
    # updater given a multi-node optimizer (ChainerMN's or CGDP's) and
    # given mpi_comm= equal ChainerMN's run; the optimizer form with last
    # local batches of 1 and 9 examples equals ChainerMN's optimizer.
    assert_ok(run_mpi('short_batches.py', timeout=120), 'short-batches')


@pytest.mark.mpi
def test_multi_node_batch_normalization_trains_under_the_optimizer_form(
        mpiexec):
    # The whole batch's statistics that BatchStatisticsWarning points to.
    assert_ok(run_mpi('multi_node_batch_normalization.py'), 'multi-node-bn')


@pytest.mark.mpi
def test_a_chainermn_script_switched_to_cgdp_trains_one_model(mpiexec,
                                                              tmp_path):
    # The script checks that both ranks end with identical parameters,
    # equal to ChainerMN's StandardUpdater on the same global batches, with
    # the multi-node evaluator and scatter_dataset around it.
    job = run_mpi('chainermn_switch.py', str(tmp_path), timeout=120)
    assert_ok(job, 'chainermn-switch')
    assert os.path.isfile(str(tmp_path / 'cgdp' / 'log'))


@pytest.mark.mpi
def test_ranks_that_train_apart_hear_it_from_rank_0_once(mpiexec, tmp_path):
    # Hydra writes each rank's stderr to a file of its own (%r: the rank).
    command = mpiexec_command(N_RANKS, 'separate_models.py')
    command[1:1] = ['-errfile-pattern', str(tmp_path / 'stderr.%r')]
    job = run_job(command, env={'PYTHONWARNINGS': 'default'})
    assert job.returncode == 0, job.output
    assert sorted(re.findall(r'built rank (\d)', job.output)) == ['0', '1']
    warnings = {}
    for rank in range(N_RANKS):
        path = tmp_path / 'stderr.{}'.format(rank)
        text = path.read_text() if path.exists() else ''
        warnings[rank] = re.findall(r'SeparateModelsWarning: (.*)$', text,
                                    re.MULTILINE)
    assert len(warnings[0]) == 1 and warnings[1] == [], warnings
    assert 'every rank will train a model of its own' in warnings[0][0]
    assert 'mpi_comm=MPI.COMM_WORLD' in warnings[0][0]
    assert 'create_multi_node_optimizer' in warnings[0][0]


# -- the optimizer CGDP runs (no MPI started) ---------------------------------

def small_model_and_iterator():
    import chainer
    import chainer.links as L
    import numpy
    model = L.Classifier(L.Linear(3, 2))
    x = numpy.zeros((4, 3), numpy.float32)
    t = numpy.zeros(4, numpy.int32)
    iterator = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 2)
    return model, iterator


def build_updater(optimizer, iterator, **kwargs):
    from cgdp_chainer import CGDPUpdater
    return CGDPUpdater(iterator, optimizer, devices=['@numpy', '@numpy'],
                       workers='thread', **kwargs)


def test_an_optimizer_that_overrides_update_is_refused():
    import chainer

    class ClippedSGD(chainer.optimizers.SGD):
        def update(self, lossfun=None, *args, **kwds):
            super(ClippedSGD, self).update(lossfun, *args, **kwds)
            for param in self.target.params():
                param.array[...] = param.array.clip(-1, 1)

    model, iterator = small_model_and_iterator()
    optimizer = ClippedSGD()
    optimizer.setup(model)
    with pytest.raises(ValueError) as error:
        build_updater(optimizer, iterator)
    message = str(error.value)
    assert 'ClippedSGD overrides update() (in ClippedSGD)' in message
    assert 'bypass' in message and 'optimizer.add_hook' in message


def test_a_wrapper_that_is_not_a_gradient_method_is_refused():
    import chainer

    class Wrapper(object):
        """Delegates everything, as ChainerMN's wrappers do."""

        def __init__(self, actual):
            self.__dict__['actual'] = actual

        def update(self, *args, **kwds):
            self.actual.update(*args, **kwds)

        def __getattr__(self, name):
            return getattr(self.actual, name)

    model, iterator = small_model_and_iterator()
    actual = chainer.optimizers.SGD()
    actual.setup(model)
    with pytest.raises(ValueError, match='optimizer: Wrapper is not a '
                       'chainer.GradientMethod'):
        build_updater(Wrapper(actual), iterator)


def test_a_plain_optimizer_or_subclass_without_update_is_taken():
    import chainer

    class NamedSGD(chainer.optimizers.SGD):
        pass

    for optimizer in (chainer.optimizers.MomentumSGD(), NamedSGD()):
        model, iterator = small_model_and_iterator()
        optimizer.setup(model)
        updater = build_updater(optimizer, iterator)
        assert updater.get_optimizer('main') is optimizer
        updater.finalize()


def test_chainermn_double_buffering_is_refused():
    import chainer
    chainermn_optimizers = pytest.importorskip('chainermn.optimizers')
    model, iterator = small_model_and_iterator()
    actual = chainer.optimizers.SGD()
    actual.setup(model)
    # Its constructor needs CUDA (a stream) and a PureNcclCommunicator;
    # the refusal looks at the class alone.
    cls = chainermn_optimizers._DoubleBufferingOptimizer
    optimizer = cls.__new__(cls)
    object.__setattr__(optimizer, 'actual_optimizer', actual)
    with pytest.raises(ValueError, match='double_buffering'):
        build_updater(optimizer, iterator)


# -- launch detection (no MPI started) ----------------------------------------

def test_launch_rank_and_size_from_the_launchers_variables():
    assert cgdp_mpi.launch_rank_and_size({}) is None
    assert cgdp_mpi.launch_rank_and_size(
        {'PMI_RANK': '1', 'PMI_SIZE': '2'}) == (1, 2)
    assert cgdp_mpi.launch_rank_and_size(
        {'OMPI_COMM_WORLD_RANK': '3', 'OMPI_COMM_WORLD_SIZE': '4'}) == (3, 4)


def test_launch_is_detected_from_any_launchers_variable():
    assert not cgdp_mpi.launched_with_mpi({})
    assert not cgdp_mpi.launched_with_mpi({'PMI_SIZE': ''})
    for name, value in [('PMI_SIZE', '2'), ('OMPI_COMM_WORLD_SIZE', '4'),
                        ('MPI_LOCALNRANKS', '1'), ('PMIX_RANK', '0')]:
        assert cgdp_mpi.launched_with_mpi({name: value}), name
    # Without a launch, world() does not start MPI.
    assert cgdp_mpi.world({}) is None


# -- the experiment scripts under mpiexec -------------------------------------

TINY_MODEL = ['--net', 'alexnet', '--image-size', '64', '--classes', '4',
              '--batchsize', '2']
TINY_TRAIN = TINY_MODEL + ['--iterations', '2']


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('updater', ['cgdp', 'chainermn'])
def test_train_under_two_ranks_rank_0_writes_log_and_snapshot(
        mpiexec, tmp_path, updater):
    out = str(tmp_path / updater)
    trace = str(tmp_path / 'trace.json')
    job = run_mpi_module('experiments.train', *TINY_TRAIN,
                         '--updater', updater, '--out', out,
                         *(['--trace', trace] if updater == 'cgdp' else []))
    assert job.returncode == 0, job.output
    if updater == 'cgdp':
        assert_rank_0_trace_has_a_communication_track(trace)
    assert 'MPI: 2 ranks x 1 device(s); batch 2 per rank, 4 in all' in \
        job.output
    # Only rank 0 prints the report and its last line.
    assert job.output.count('trained alexnet to iteration 2') == 1, \
        job.output
    with open(os.path.join(out, 'log')) as log_file:
        log = json.load(log_file)
    assert [entry['iteration'] for entry in log] == [1, 2]
    assert os.path.isfile(os.path.join(out, 'snapshot_iter_2'))


def assert_rank_0_trace_has_a_communication_track(path):
    with open(path) as trace_file:
        events = json.load(trace_file)['traceEvents']
    assert [e['args']['name'] for e in events
            if e['name'] == 'process_name'] == ['cgdp rank 0']
    names = {e['tid']: e['args']['name'] for e in events
             if e['name'] == 'thread_name'}
    allreduce = [e for e in events if e.get('cat') == 'allreduce']
    assert allreduce
    assert {names[e['tid']] for e in allreduce} == {
        'communication thread cgdp-allreduce'}


@pytest.mark.mpi
@pytest.mark.slow
def test_train_under_two_ranks_resumes_exactly(mpiexec, tmp_path):
    # Rank 0's snapshot holds the state of every rank: the same weights and
    # optimizer state, and iterators over equal shards in the same order.
    import numpy
    common = TINY_MODEL + ['--iterations', '4', '--train-length', '6',
                           '--updater', 'cgdp']
    whole, resumed = str(tmp_path / 'whole'), str(tmp_path / 'resumed')
    job = run_mpi_module('experiments.train', *common,
                         '--snapshot-every', '2', '--out', whole)
    assert job.returncode == 0, job.output
    job = run_mpi_module('experiments.train', *common, '--resume',
                         os.path.join(whole, 'snapshot_iter_2'),
                         '--out', resumed)
    assert job.returncode == 0, job.output
    with numpy.load(os.path.join(whole, 'snapshot_iter_4')) as expected, \
            numpy.load(os.path.join(resumed, 'snapshot_iter_4')) as actual:
        keys = [key for key in expected.files if key.startswith('updater/')]
        assert keys and sorted(keys) == sorted(
            key for key in actual.files if key.startswith('updater/'))
        for key in keys:
            numpy.testing.assert_array_equal(actual[key], expected[key],
                                             err_msg=key)


@pytest.mark.mpi
def test_train_under_two_ranks_refuses_an_updater_without_mpi(mpiexec,
                                                             tmp_path):
    job = run_mpi_module('experiments.train', *TINY_TRAIN,
                         '--updater', 'standard', '--out', str(tmp_path))
    assert job.returncode == 2, job.output
    assert 'error: --updater standard does not communicate across MPI ' \
        'ranks' in job.output
    assert 'Traceback' not in job.output


def test_chainermn_without_mpiexec_is_exit_2(tmp_path):
    completed = subprocess.run(
        [sys.executable, '-m', 'experiments.train', *TINY_TRAIN,
         '--updater', 'chainermn', '--out', str(tmp_path)],
        cwd=REPO_ROOT, env=plain_environment(), capture_output=True,
        text=True, timeout=120)
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.strip().splitlines() == [
        'error: --updater chainermn runs one process per device and needs '
        'an MPI launch: mpiexec -n R python -m experiments.train --updater '
        'chainermn ...'], completed.stderr


SMALL_MPI_EXPERIMENT = ['--net', 'alexnet', '--devices', '1', '--warmup', '1',
                        '--image-size', '64', '--batch', '2', '--classes', '4']


def only_run_folder(out):
    entries = os.listdir(os.path.join(out, 'alexnet'))
    assert len(entries) == 1, entries
    return os.path.join(out, 'alexnet', entries[0])


@pytest.mark.mpi
@pytest.mark.slow
def test_weak_scaling_under_two_ranks_writes_multi_rank_rows(mpiexec,
                                                            tmp_path):
    out = str(tmp_path)
    job = run_mpi_module('experiments.weak_scaling', *SMALL_MPI_EXPERIMENT,
                         '--iterations', '2', '--out', out)
    assert job.returncode == 0, job.output
    assert 'single-process rows (typical, nccl) are not measured under ' \
        'MPI' in job.output
    folder = only_run_folder(out)
    runs = results.read_csv(os.path.join(folder, results.RUNS_FILE))
    assert sorted((r['mode'], r['n_devices'], r['n_ranks'], r['iteration'])
                  for r in runs) == [
        ('cgdp', 1, 2, 0), ('cgdp', 1, 2, 1),
        ('chainermn', 1, 2, 0), ('chainermn', 1, 2, 1)]
    summary = {r['mode']: r for r in results.read_csv(
        os.path.join(folder, results.SUMMARY_FILE))}
    assert sorted(summary) == ['cgdp', 'chainermn']
    for row in summary.values():
        assert row['n_ranks'] == 2 and row['n_devices'] == 1
        # 2 ranks x 1 device x batch 2 per iteration.
        assert row['throughput'] == pytest.approx(4 / row['median_s'])
        # No 1-rank x 1-device row in an MPI run of 2 ranks.
        assert row['efficiency'] is None
    assert summary['cgdp']['speedup_vs_typical'] == pytest.approx(
        summary['chainermn']['median_s'] / summary['cgdp']['median_s'])
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['n_ranks'] == 2 and env['mpi']['ranks'] == 2
    assert env['modes'] == ['cgdp', 'chainermn'] and env['finished']
    # Rank 0 alone prints the table.
    assert job.output.count('\nmode ') == 1, job.output


def processes_mentioning(text):
    """Pids of the live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join('/proc', entry, 'cmdline'), 'rb') as f:
                command = f.read().decode(errors='replace')
        except OSError:  # ended meanwhile
            continue
        if text in command:
            found.append(int(entry))
    return found


def wait_for_rows(process, out, rows):
    """Waits until the run's runs.csv holds ``rows`` rows (0: until the
    run folder exists, during the first mode's set-up and warm-up).

    Returns:
        str: The run folder.
    """
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        if os.path.isdir(os.path.join(out, 'alexnet')):
            folder = only_run_folder(out)
            runs_path = os.path.join(folder, results.RUNS_FILE)
            if rows == 0:
                return folder
            if os.path.exists(runs_path):
                with open(runs_path) as f:
                    if len(f.readlines()) >= 1 + rows:
                        return folder
        time.sleep(0.1)
    pytest.fail('no {} rows within {} s'.format(rows, JOB_TIMEOUT))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('delivery', ['mpiexec', 'process group'])
@pytest.mark.parametrize('rows_before', [0, 2])
def test_weak_scaling_under_two_ranks_ends_on_ctrl_c(mpiexec, tmp_path,
                                                     delivery, rows_before):
    # 'mpiexec': kill -INT to mpiexec alone, which passes it on to the
    # ranks; 'process group': a terminal's Ctrl-C, which every process of
    # the job gets at once. Either way rank 0's files and closing lines
    # must all be there, and the job must end by itself with status 130.
    out = str(tmp_path)
    process = start_job(mpiexec_module_command(
        N_RANKS, 'experiments.weak_scaling', *SMALL_MPI_EXPERIMENT,
        '--modes', 'cgdp,chainermn', '--iterations', '500', '--out', out))
    try:
        folder = wait_for_rows(process, out, rows_before)
        if delivery == 'mpiexec':
            process.send_signal(signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=JOB_TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output
    # Rank 0's last lines: the table of what finished, then the verdict.
    assert '\n{}\n'.format(folder) in output, output
    runs = results.read_csv(os.path.join(folder, results.RUNS_FILE))
    assert len(runs) >= rows_before and len(runs) < 500
    if runs:
        assert re.search(r'^mode +R +N +median_s', output,
                         re.MULTILINE), output
    else:
        assert '\nno measured iteration finished\n' in output, output
    assert output.rstrip().splitlines()[-1].startswith(
        'interrupted: kept the iterations that finished (stopped by '
        'SIGINT)'), output
    assert 'MPI_Abort' not in output and 'BAD TERMINATION' not in output, \
        output
    assert processes_mentioning(out) == []
    assert process.segment_watch.stop() == []
    summary = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    assert [(r['mode'], r['n_ranks']) for r in summary] == sorted(
        {(r['mode'], r['n_ranks']) for r in runs},
        key=lambda key: ['cgdp', 'chainermn'].index(key[0]))
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['interrupted'] is True and env['finished'] is False


@pytest.mark.mpi
@pytest.mark.parametrize('problem', ['chunk size', 'out is a file'])
def test_weak_scaling_under_two_ranks_refuses_bad_input_on_every_rank(
        mpiexec, tmp_path, problem):
    # The chunk size is wrong on every rank; --out only on rank 0, which
    # alone writes: either way both ranks end, normally, with status 2,
    # and the job prints one error line.
    out = tmp_path / 'results'
    if problem == 'chunk size':
        option = ['--chunk-size', '999']
        message = ("error: --chunk-size 999 is more than the 8 layers of "
                   "alexnet (links with parameters, what a chunk counts); "
                   "give 1 to 8, 'auto' or 'model'")
    else:
        out.write_text('a file')
        option = []
        message = ('error: --out {} is a file; give the folder that results '
                   'go to (default results)'.format(out))
    job = run_mpi_module('experiments.weak_scaling', *SMALL_MPI_EXPERIMENT,
                         '--iterations', '1', *option, '--out', str(out))
    assert job.returncode == 2, job.output
    assert job.output.strip().splitlines() == [message], job.output
    assert os.listdir(str(tmp_path)) == ([] if problem == 'chunk size'
                                         else ['results'])


# -- last: what the module's jobs left in /dev/shm ----------------------------

@pytest.mark.mpi
def test_mpi_jobs_leave_no_shared_memory_segment(mpiexec):
    # A job that ends normally (MPI_Finalize unlinks MPICH's segment) and
    # one that aborts (abort_job unlinks it before MPI_Abort; the stall
    # mode's ranks live a second, many times the watch's polling interval)
    # leave nothing by themselves.
    for script, args in [('allreduce_sum.py', ()),
                         ('fault.py', ('stall',))]:
        process = start_job(mpiexec_command(N_RANKS, script, *args))
        output, _ = process.communicate(timeout=JOB_TIMEOUT)
        assert process.segment_watch.stop() == [], output
        assert process.segment_watch.segments, (
            'no MPICH segment seen for {}: the watch is blind'.format(script))
    # Nor is any left of the jobs of the tests before this one (run in file
    # order), after the harness removed those of killed jobs.
    left = sorted(name for name in SEGMENTS_SEEN if segment_exists(name))
    assert left == [], left


@pytest.mark.mpi
def test_every_rank_finds_the_same_reduction_or_every_rank_refuses(
        mpiexec):
    assert_ok(run_mpi('reduction_agreement.py'), 'reduction')
