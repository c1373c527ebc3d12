"""Repeatable runs: the replicas' random streams (cgdp_chainer.randomness).

Under ``numpy.random.seed(s)`` Chainer's own random functions in the model
(F.dropout, F.gaussian, ...) draw per replica from streams derived from the
seed, the iteration and the replica, so that two seeded runs, and a run
resumed from a snapshot, are bit for bit the same; the caller's global
state is left as StandardUpdater leaves it.
"""
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer import randomness
from cgdp_chainer.runtime.workers import worker as worker_module

BATCH = 4
N_EXAMPLES = 12

# Worker processes take seconds to start on the CI machine.
PROCESS = pytest.param('process', marks=pytest.mark.slow)


def _dataset(n=N_EXAMPLES):
    rng = numpy.random.RandomState(11)
    return chainer.datasets.TupleDataset(
        rng.normal(size=(n, 5)).astype(numpy.float32),
        rng.randint(0, 3, n).astype(numpy.int32))


def _fingerprint(mask):
    """One number that tells masks apart: the weighted count of kept
    units."""
    kept = (chainer.backends.cuda.to_cpu(mask) != 0).ravel()
    weights = numpy.arange(1, kept.size + 1, dtype=numpy.float64) ** 1.5
    return float(numpy.dot(kept, weights))


class NoisyMLP(chainer.Chain):
    """Two layers with a random function between them, which reports a
    fingerprint of its draws per replica (``main/draws0``, ...).

    Args:
        noise (str): ``'dropout'`` (F.dropout), ``'gaussian'``
            (F.gaussian), ``'project_dropout'``
            (cgdp_chainer.randomness.dropout) or ``'none'``.
        lazy (bool): Whether the first layer is initialized lazily.
    """

    def __init__(self, noise='dropout', lazy=False):
        super(NoisyMLP, self).__init__()
        self.noise = noise
        with self.init_scope():
            self.l1 = L.Linear(None if lazy else 5, 16)
            self.l2 = L.Linear(16, 3)

    def forward(self, x, t):
        h = F.relu(self.l1(x))
        h = h * self._noise(self.xp.ones_like(h.array))
        loss = F.softmax_cross_entropy(self.l2(h), t)
        chainer.report({'loss': loss}, self)
        return loss

    def _noise(self, ones):
        if self.noise == 'none':
            return ones
        if self.noise == 'gaussian':
            noise = F.gaussian(ones, self.xp.full_like(ones, -2.0)).array
        elif self.noise == 'dropout':
            noise = F.dropout(ones, 0.5).array
        else:
            noise = randomness.dropout(ones, 0.5).array
        index = worker_module.replica_index()
        if index is not None:
            # A Gaussian's draws: its sign pattern.
            pattern = noise if self.noise != 'gaussian' else noise > 1.0
            chainer.report({'draws{}'.format(index): _fingerprint(pattern)},
                           self)
        return noise


def _setup(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    return optimizer


def _params(model):
    return {name: chainer.backends.cuda.to_cpu(p.array).copy()
            for name, p in model.namedparams()}


def _cgdp(workers, devices=('@numpy', '@numpy')):
    def make(iterator, optimizer):
        # NoisyMLP's loss is a mean. F.gaussian draws in test mode too, so
        # the first iteration's check could not tell (and would refuse):
        # the reduction is given, as USAGE says to.
        return cgdp_chainer.CGDPUpdater(iterator, optimizer, list(devices),
                                        chunk_size=1, workers=workers,
                                        reduction='mean')
    return make


def _run(make_updater, noise, seed=0, iterations=3, lazy=False,
         shuffle=False, dataset=None):
    """Seeds NumPy, builds and trains a model; returns its parameters, the
    reported draws per iteration and the caller's next three draws."""
    numpy.random.seed(seed)
    model = NoisyMLP(noise, lazy=lazy)
    iterator = chainer.iterators.SerialIterator(
        dataset if dataset is not None else _dataset(), BATCH,
        shuffle=shuffle)
    updater = make_updater(iterator, _setup(model))
    try:
        draws = _updates(updater, model, iterations)
    finally:
        updater.finalize()
    return _params(model), draws, numpy.random.rand(3)


def _updates(updater, model, iterations):
    """Runs ``iterations`` updates; returns the draws reported in each."""
    draws = []
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)  # for StandardUpdater's forward
    for _ in range(iterations):
        observation = {}
        with reporter.scope(observation):
            updater.update()
        draws.append({key: float(value) for key, value in
                      observation.items() if '/draws' in key})
    return draws


def _assert_equal_params(expected, actual):
    assert sorted(expected) == sorted(actual)
    for name in expected:
        numpy.testing.assert_array_equal(actual[name], expected[name],
                                         err_msg=name)


def _differ(a, b):
    return any(not numpy.array_equal(a[name], b[name]) for name in a)


# -- two seeded runs --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('noise', ['dropout', 'gaussian'])
def test_two_seeded_runs_are_the_same_with_process_workers(noise):
    first = _run(_cgdp('process'), noise)
    second = _run(_cgdp('process'), noise)
    _assert_equal_params(first[0], second[0])
    assert first[1] == second[1]
    assert len(first[1][0]) == 2  # both replicas drew
    # The seed matters: another one draws other noise.
    other = _run(_cgdp('process'), noise, seed=1)
    assert other[1] != first[1]


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_project_dropout_runs_are_the_same_with_either_worker_kind(workers):
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # its own states: nothing to warn
        first = _run(_cgdp(workers), 'project_dropout')
        second = _run(_cgdp(workers), 'project_dropout')
    _assert_equal_params(first[0], second[0])
    assert first[1] == second[1]


def test_one_numpy_replica_thread_draws_its_own_stream_as_a_process():
    # With one '@numpy' replica thread the updater lends it NumPy's global
    # state for the iteration, seeded from the replica's own stream, which
    # is the stream a worker process seeds.
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        first = _run(_cgdp('thread', ['@numpy']), 'dropout')
        second = _run(_cgdp('thread', ['@numpy']), 'dropout')
    _assert_equal_params(first[0], second[0])
    assert first[1] == second[1] and first[1][0]


@pytest.mark.slow
def test_one_replica_thread_and_one_replica_process_draw_the_same():
    thread = _run(_cgdp('thread', ['@numpy']), 'dropout')
    process = _run(_cgdp('process', ['@numpy']), 'dropout')
    assert thread[1] == process[1]
    for name in thread[0]:
        numpy.testing.assert_allclose(process[0][name], thread[0][name],
                                      rtol=1e-6, atol=1e-7, err_msg=name)


def test_numpy_replica_threads_drawing_from_the_global_state_warn_once():
    with pytest.warns(UserWarning) as caught:
        _run(_cgdp('thread'), 'dropout')
    messages = [str(w.message) for w in caught
                if 'global random state' in str(w.message)]
    assert len(messages) == 1
    assert "workers='process'" in messages[0]
    assert 'cgdp_chainer.randomness.dropout' in messages[0]


def test_numpy_replica_threads_without_global_draws_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        _run(_cgdp('thread'), 'none')


# -- different streams -------------------------------------------------------

@pytest.mark.parametrize('workers, noise', [
    ('thread', 'project_dropout'), pytest.param(
        'process', 'dropout', marks=pytest.mark.slow)])
def test_replicas_and_iterations_draw_different_masks(workers, noise):
    # Every example is the same: only the streams could tell them apart.
    dataset = chainer.datasets.TupleDataset(
        numpy.ones((N_EXAMPLES, 5), numpy.float32),
        numpy.zeros(N_EXAMPLES, numpy.int32))
    _, draws, _ = _run(_cgdp(workers), noise, dataset=dataset,
                       iterations=3)
    values = [value for iteration in draws for value in iteration.values()]
    assert len(values) == 6
    assert len(set(values)) == 6


def test_replica_streams_depend_on_every_part_of_the_seed():
    seed = randomness.ReplicaSeed(base=5, rank=0, iteration=3, replica=1,
                                  global_numpy=True)
    states = [numpy.random.RandomState(
        s.words(randomness.NUMPY_STREAM)).randint(2 ** 31)
        for s in (seed, seed._replace(base=6), seed._replace(rank=1),
                  seed._replace(iteration=4), seed._replace(replica=0))]
    assert len(set(states)) == len(states)
    streams = {randomness.NUMPY_STREAM, randomness.DROPOUT_STREAM,
               randomness.CUPY_STREAM}
    draws = {int(seed.sequence(s).generate_state(1)[0]) for s in streams}
    assert len(draws) == 3


def test_base_seed_does_not_advance_the_global_state():
    numpy.random.seed(4)
    before = numpy.random.get_state()
    first = randomness.base_seed()
    assert randomness.base_seed() == first
    after = numpy.random.get_state()
    numpy.testing.assert_array_equal(after[1], before[1])
    assert after[2:] == before[2:]
    numpy.random.rand()
    assert randomness.base_seed() != first


# -- the caller's random state -------------------------------------------

def _recorded_dataset(record):
    """A dataset that appends each index it reads to the file ``record``
    (from whichever process reads it)."""
    class Recording(chainer.dataset.DatasetMixin):
        def __init__(self):
            self.base = _dataset()

        def __len__(self):
            return len(self.base)

        def get_example(self, i):
            with open(record, 'a') as f:
                f.write('{}\n'.format(int(i)))
            return self.base[i]
    return Recording()


def _standard(iterator, optimizer):
    return updaters.StandardUpdater(iterator, optimizer)


@pytest.mark.parametrize('workers', ['thread', PROCESS])
def test_caller_draws_and_shuffles_are_standard_updaters(workers, tmp_path):
    # Seven iterations of three per epoch: shuffles of three epochs, and a
    # lazily initialized layer whose initial weights come from the global
    # state at the first forward.
    runs = []
    # The reads are recorded in a file: where the input path reads ahead in
    # a reader process (NumPy 2, see USAGE), they happen there.
    for number, make in enumerate((_standard, _cgdp(workers))):
        record = str(tmp_path / 'reads{}'.format(number))
        params, _, next_draws = _run(
            make, 'none', seed=2, iterations=7, lazy=True, shuffle=True,
            dataset=_recorded_dataset(record))
        with open(record) as f:
            runs.append((params, [int(i) for i in f.read().split()],
                         next_draws))
    (expected, expected_order, expected_draws), \
        (actual, actual_order, actual_draws) = runs
    # The same reads in the same order; CGDP read the next batch ahead
    # (cgdp_chainer.runtime.input.input_path) for an iteration that did not run.
    assert actual_order[:len(expected_order)] == expected_order
    assert len(actual_order) - len(expected_order) in (0, BATCH)
    assert sorted(actual_order[:N_EXAMPLES]) == list(range(N_EXAMPLES))
    assert actual_order[:N_EXAMPLES] != actual_order[N_EXAMPLES:][:N_EXAMPLES]
    numpy.testing.assert_array_equal(actual_draws, expected_draws)
    for name in expected:
        numpy.testing.assert_allclose(actual[name], expected[name],
                                      rtol=1e-5, atol=1e-6, err_msg=name)


# -- snapshots ----------------------------------------------------------------

def _resumed(make_updater, noise, tmp_path, before, after):
    """Trains ``before`` iterations, snapshots, then trains ``after`` more
    in a fresh updater (from a fresh model) that loads the snapshot under
    another global seed; returns the parameters and the draws."""
    path = str(tmp_path / 'snapshot.npz')
    numpy.random.seed(0)
    model = NoisyMLP(noise)
    initial = model.copy(mode='copy')
    iterator = chainer.iterators.SerialIterator(_dataset(), BATCH,
                                                shuffle=False)
    updater = make_updater(iterator, _setup(model))
    try:
        for _ in range(before):
            updater.update()
        chainer.serializers.save_npz(path, updater)
    finally:
        updater.finalize()
    numpy.random.seed(99)  # the streams must come from the snapshot
    model = initial
    iterator = chainer.iterators.SerialIterator(_dataset(), BATCH,
                                                shuffle=False)
    updater = make_updater(iterator, _setup(model))
    chainer.serializers.load_npz(path, updater)
    try:
        draws = _updates(updater, model, after)
    finally:
        updater.finalize()
    return _params(model), draws


@pytest.mark.parametrize('workers, noise', [
    ('thread', 'project_dropout'), pytest.param(
        'process', 'dropout', marks=pytest.mark.slow)])
def test_resume_from_a_snapshot_continues_exactly(workers, noise, tmp_path):
    whole, whole_draws, _ = _run(_cgdp(workers), noise, iterations=4)
    resumed, resumed_draws = _resumed(_cgdp(workers), noise, tmp_path,
                                      before=2, after=2)
    assert resumed_draws == whole_draws[2:]
    _assert_equal_params(whole, resumed)


def test_a_snapshot_without_the_seed_still_loads(tmp_path):
    numpy.random.seed(0)
    model = NoisyMLP('project_dropout')
    iterator = chainer.iterators.SerialIterator(_dataset(), BATCH)
    updater = _cgdp('thread')(iterator, _setup(model))
    path = str(tmp_path / 'full.npz')
    try:
        updater.update()
        chainer.serializers.save_npz(path, updater)
    finally:
        updater.finalize()
    with numpy.load(path) as saved:
        assert 'cgdp_random_base' in saved.files
        old = {key: saved[key] for key in saved.files
               if key != 'cgdp_random_base'}
    old_path = str(tmp_path / 'old.npz')
    numpy.savez(old_path, **old)
    fresh = _cgdp('thread')(
        chainer.iterators.SerialIterator(_dataset(), BATCH),
        _setup(NoisyMLP('project_dropout')))
    try:
        constructed = fresh.random_base
        chainer.serializers.load_npz(old_path, fresh)  # strict
        assert fresh.iteration == 1
        assert fresh.random_base == constructed
        fresh.update()
    finally:
        fresh.finalize()


# -- GPUs -------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize('workers', ['thread', 'process'])
@pytest.mark.parametrize('noise', ['dropout', 'gaussian'])
def test_two_seeded_runs_are_the_same_with_a_gpu_replica(workers, noise):
    import cupy

    def run():
        cupy.random.seed(0)
        # Chainer's cuDNN dropout draws from cuDNN's own states, which
        # no updater seeds; without cuDNN it draws from cupy.random.
        with chainer.using_config('use_cudnn', 'never'):
            result = _run(_cgdp(workers, ['@cupy:0', '@numpy']), noise)
        return result, cupy.random.rand(3).get()

    (first, first_cupy), (second, second_cupy) = run(), run()
    _assert_equal_params(first[0], second[0])
    assert first[1] == second[1] and len(first[1][0]) == 2
    numpy.testing.assert_array_equal(first_cupy, second_cupy)
    cupy.random.seed(0)
    untouched = cupy.random.rand(3).get()
    # The replicas drew from states of their own: the caller's CuPy
    # stream is where cupy.random.seed(0) left it.
    numpy.testing.assert_array_equal(first_cupy, untouched)


# -- MPI --------------------------------------------------------------------

@pytest.mark.mpi
def test_ranks_draw_different_streams_from_rank_0s_seed():
    test_mpi = pytest.importorskip('test_mpi')
    if test_mpi.mpiexec_path() is None:
        pytest.skip(cgdp_mpi.no_mpiexec_words())
    pytest.importorskip('mpi4py')
    test_mpi.assert_ok(test_mpi.run_mpi('random_streams.py'), 'random')


# -- the command line -------------------------------------------------------

@pytest.mark.slow
def test_two_runs_of_the_training_script_with_one_seed_are_the_same(tmp_path):
    # GoogLeNet's dropout draws from the replicas' streams, whose base seed
    # comes from the global state as the updater is built: the script
    # seeds it from --seed.
    train_script = pytest.importorskip('experiments.train')
    snapshots = []
    for name in ('first', 'second'):
        out = str(tmp_path / name)
        assert train_script.main([
            '--net', 'googlenet', '--image-size', '64', '--classes', '4',
            '--batchsize', '2', '--train-length', '4', '--iterations', '2',
            '--updater', 'cgdp', '--devices', '@numpy,@numpy',
            '--out', out]) == 0
        with numpy.load(str(tmp_path / name / 'snapshot_iter_2')) as saved:
            snapshots.append({key: saved[key] for key in saved.files
                              if key.startswith('updater/')})
    first, second = snapshots
    assert sorted(first) == sorted(second)
    assert 'updater/cgdp_random_base' in first
    for key in first:
        numpy.testing.assert_array_equal(second[key], first[key],
                                         err_msg=key)
