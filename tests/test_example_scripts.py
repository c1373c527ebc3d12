"""Scripts in the shape of Chainer 7.8.1's multi-device examples, switched
to CGDP with one line: each trains through a Trainer with its extensions,
on CPU devices given as -1, and ends with the parameters of the updater it
replaced (ParallelUpdater itself; for MultiprocessParallelUpdater, which
needs GPUs, its arithmetic: StandardUpdater on the concatenated batches)."""
import json
import os
import subprocess
import sys

import numpy
import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(TESTS, 'example_scripts')
ROOT = os.path.dirname(TESTS)
N_TRAIN = 48
N_TEST = 16


@pytest.fixture(scope='module')
def dataset_root(tmp_path_factory):
    """MNIST-shaped random arrays where chainer.datasets.get_mnist caches
    its download."""
    root = tmp_path_factory.mktemp('datasets')
    folder = root / 'pfnet' / 'chainer' / 'mnist'
    folder.mkdir(parents=True)
    rng = numpy.random.RandomState(0)
    for name, n in (('train.npz', N_TRAIN), ('test.npz', N_TEST)):
        numpy.savez_compressed(
            str(folder / name),
            x=rng.randint(0, 256, size=(n, 784)).astype(numpy.uint8),
            y=rng.randint(0, 10, size=n).astype(numpy.uint8))
    return str(root)


def _run(script, out, dataset_root, *args):
    # CGDP's INFO lines (what it found) on stderr: cgdp_chainer.log.
    env = dict(os.environ, CHAINER_DATASET_ROOT=dataset_root,
               PYTHONPATH=os.pathsep.join([ROOT, TESTS]),
               CGDP_CHAINER_LOG='INFO')
    completed = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, script), '--out', str(out)]
        + list(args), env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


def _log(out):
    with open(os.path.join(str(out), 'log')) as f:
        return json.load(f)


def _assert_same_npz(expected_path, actual_path, rtol=1e-5, atol=1e-6):
    with numpy.load(expected_path) as expected, \
            numpy.load(actual_path) as actual:
        assert sorted(expected.files) == sorted(actual.files)
        assert expected.files
        for name in expected.files:
            numpy.testing.assert_allclose(actual[name], expected[name],
                                          rtol=rtol, atol=atol,
                                          err_msg=name)


@pytest.mark.slow
def test_parallel_updater_example_switched(tmp_path, dataset_root):
    script = 'train_mnist_data_parallel.py'
    devices = ['--device0', '-1', '--device1', '-1']
    _run(script, tmp_path / 'parallel', dataset_root, '--updater',
         'parallel', *devices)
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp',
         *devices)
    # 48 examples, 12 a batch, 2 epochs.
    _assert_trained_alike(tmp_path, 'parallel')


@pytest.mark.slow
def test_multiprocess_parallel_updater_mnist_example_switched(
        tmp_path, dataset_root):
    script = 'train_mnist_data_parallel_updater.py'
    args = ['--devices', '-1', '-1', '--ljob', '2']
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard', *args)
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp', *args)
    # Two iterators of 24 examples, 6 a batch, 2 epochs of the first.
    _assert_trained_alike(tmp_path, 'standard')


def _single_device_mnist_switched(tmp_path, dataset_root, device, workers,
                                  rtol=1e-5, atol=1e-6):
    """train_mnist.py's shape: a lazy model first called by the Evaluator
    before training (on ``device``, through CGDP's view of the master on a
    GPU); the switched run stops after its first epoch and resumes from its
    snapshot (--autoload), and ends with StandardUpdater's model (within
    ``rtol`` and ``atol``: on a GPU, StandardUpdater's update runs there,
    CGDP's on the host)."""
    script = 'train_mnist_switched.py'
    args = ['--device', device, '--workers', workers]
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard', *args)
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp',
         '--epoch', '1', *args)
    assert (tmp_path / 'cgdp' / 'snapshot_iter_4').exists()
    completed = _run(script, tmp_path / 'cgdp', dataset_root, '--updater',
                     'cgdp', '--epoch', '2', '--autoload', *args)
    # 48 examples, 12 a batch, 2 epochs; snapshots keep the latest only.
    assert sorted(path.name for path in (tmp_path / 'cgdp').iterdir()
                  if path.name.startswith('snapshot')) == ['snapshot_iter_8']
    for name in ('cg.dot', 'loss.png', 'accuracy.png'):
        assert (tmp_path / 'cgdp' / name).exists(), name
    assert 'validation/main/loss' in completed.stdout  # PrintReport
    expected, log = _log(tmp_path / 'standard'), _log(tmp_path / 'cgdp')
    # Before training, then after each epoch: the resumed run's log
    # continues the first run's.
    assert [entry['epoch'] for entry in log] == [0, 1, 2]
    for key in ('validation/main/loss', 'validation/main/accuracy',
                'main/loss'):
        numpy.testing.assert_allclose(
            [entry.get(key, 0.0) for entry in log],
            [entry.get(key, 0.0) for entry in expected], rtol=rtol,
            atol=atol, err_msg=key)
    _assert_same_npz(str(tmp_path / 'standard' / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'), rtol, atol)


@pytest.mark.slow
@pytest.mark.parametrize('workers', ['thread', 'process'])
def test_single_device_mnist_example_switched(tmp_path, dataset_root,
                                              workers):
    _single_device_mnist_switched(tmp_path, dataset_root, '-1', workers)


@pytest.mark.gpu
@pytest.mark.parametrize('workers', ['thread', 'process'])
def test_single_device_mnist_example_switched_on_a_gpu(tmp_path,
                                                       dataset_root, workers):
    _single_device_mnist_switched(tmp_path, dataset_root, '0', workers,
                                  rtol=1e-4, atol=1e-5)


def _assert_trained_alike(tmp_path, reference):
    """The switched MNIST run logged and evaluated at iterations 4 and 8,
    took its last snapshot, and ended with the reference run's model."""
    log = _log(tmp_path / 'cgdp')
    assert [entry['iteration'] for entry in log] == [4, 8]
    assert all('validation/main/loss' in entry for entry in log)
    assert (tmp_path / 'cgdp' / 'snapshot_iter_8').exists()
    _assert_same_npz(str(tmp_path / reference / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'))


@pytest.mark.slow
def test_multiprocess_parallel_updater_imagenet_example_switched(
        tmp_path, dataset_root):
    script = 'train_imagenet_data_parallel.py'
    args = ['--devices', '-1', '-1', '--test']
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard', *args)
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp', *args)
    # Two iterators of 24 examples, 4 a batch, 1 epoch.
    log = _log(tmp_path / 'cgdp')
    assert [entry['iteration'] for entry in log] == [6]
    assert log[0]['lr'] == pytest.approx(0.01)  # the user's, unchanged
    assert 'validation/main/loss' in log[0]
    _assert_same_npz(str(tmp_path / 'standard' / 'model_iter_6'),
                     str(tmp_path / 'cgdp' / 'model_iter_6'))


@pytest.mark.slow
def test_memnn_example_switched(tmp_path, dataset_root):
    # The model holds a lambda over itself and plain objects holding its
    # links: each worker process's replica must use its own.
    script = 'train_memnn_switched.py'
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard')
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp')
    # 48 stories, 12 a batch, 2 epochs.
    log = _log(tmp_path / 'cgdp')
    assert [entry['epoch'] for entry in log] == [1, 2]
    assert all('validation/main/loss' in entry for entry in log)
    _assert_same_npz(str(tmp_path / 'standard' / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'))


def _assert_same_logs(tmp_path, keys, reference=None):
    """The switched run logged the reference run's values (the reference
    run's output is ``tmp_path / 'standard'`` unless given)."""
    expected = _log(reference or tmp_path / 'standard')
    actual = _log(tmp_path / 'cgdp')
    assert [e['iteration'] for e in actual] == \
        [e['iteration'] for e in expected]
    for want, got in zip(expected, actual):
        for key in keys:
            assert got[key] == pytest.approx(want[key], rel=1e-5), key


@pytest.mark.slow
def test_sentiment_example_with_a_summed_loss_switched(tmp_path,
                                                       dataset_root):
    # A loss that adds up over the trees: found as 'sum', logged as the
    # whole batch's; MicroAverage over the node counts.
    script = 'train_sentiment.py'
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard')
    completed = _run(script, tmp_path / 'cgdp', dataset_root, '--updater',
                     'cgdp', '--devices', '-1', '-1')
    assert "CGDP reduction: 'sum'" in completed.stderr
    _assert_same_logs(tmp_path, ['main/loss', 'main/accuracy',
                                 'main/total', 'main/correct'])
    _assert_same_npz(str(tmp_path / 'standard' / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'))


@pytest.mark.slow
def test_pos_tagging_example_with_integer_counts_switched(tmp_path,
                                                          dataset_root):
    # Integer counts through MicroAverage, for training and evaluation; the
    # tagger's forward, defined in the script, loops over six.moves.zip
    # (a lazily loaded module object), which the worker processes (the
    # default workers) import by name.
    script = 'postagging.py'
    _run(script, tmp_path / 'standard', dataset_root, '--updater',
         'standard')
    _run(script, tmp_path / 'cgdp', dataset_root, '--updater', 'cgdp',
         '--devices', '-1', '-1')
    _assert_same_logs(tmp_path, [
        'main/loss', 'main/accuracy', 'main/total', 'main/correct',
        'validation/main/loss', 'validation/main/accuracy'])
    _assert_same_npz(str(tmp_path / 'standard' / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'))


@pytest.fixture(scope='module')
def static_graph_standard_run(tmp_path_factory, dataset_root):
    """The static_graph example with StandardUpdater (which replays the
    static schedule from the second iteration on), once for both worker
    kinds' comparisons."""
    out = tmp_path_factory.mktemp('static_graph') / 'standard'
    _run('train_mnist_static_graph.py', out, dataset_root, '--updater',
         'standard')
    return out


@pytest.mark.slow
@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_static_graph_example_switched(tmp_path, dataset_root, workers,
                                       static_graph_standard_run):
    # An MLP whose __call__ is @static_graph, 48 examples, 12 a batch
    # (shuffled), 2 epochs: 8 iterations, an Evaluator of the model (its
    # own static schedule) after the 4th and the 8th.
    completed = _run('train_mnist_static_graph.py', tmp_path / 'cgdp',
                     dataset_root, '--updater', 'cgdp', '--workers', workers)
    said = [line for line in completed.stderr.splitlines()
            if line.startswith('CGDP @static_graph')]
    assert len(said) == 1 and 'MLP.__call__' in said[0]
    # The master's Evaluator schedule let go of the shared memory.
    assert 'BufferError' not in completed.stderr
    assert [entry['iteration'] for entry in _log(tmp_path / 'cgdp')] == \
        [4, 8]
    _assert_same_logs(tmp_path, ['main/loss', 'main/accuracy',
                                 'validation/main/loss',
                                 'validation/main/accuracy'],
                      reference=static_graph_standard_run)
    _assert_same_npz(str(static_graph_standard_run / 'model.npz'),
                     str(tmp_path / 'cgdp' / 'model.npz'))


VAE_KEYS = ('main/loss', 'validation/main/loss')


@pytest.mark.slow
def test_vae_example_whose_loss_samples_in_every_mode_switched(
        tmp_path, dataset_root):
    # The loss samples z in every mode: the reduction is found within the
    # sampling noise ('mean'), with both worker kinds.
    script = 'train_vae.py'
    for seed in (1, 2, 3, 4):
        _run(script, tmp_path / 'standard{}'.format(seed), dataset_root,
             '--updater', 'standard', '--seed', str(seed))
    runs = {}
    for name, workers in (('process', 'process'), ('again', 'process'),
                          ('thread', 'thread')):
        completed = _run(script, tmp_path / name, dataset_root, '--updater',
                         'cgdp', '--workers', workers, '--seed', '1')
        assert "CGDP reduction: 'mean', found within sampling noise" in \
            completed.stderr
        runs[name] = _log(tmp_path / name)
    # Repeatable under a seed: each worker process draws from its own
    # seeded stream. (Thread workers share NumPy's global state and warn
    # that they are not.)
    with numpy.load(str(tmp_path / 'process' / 'model.npz')) as first, \
            numpy.load(str(tmp_path / 'again' / 'model.npz')) as again:
        assert first.files
        for name in first.files:
            numpy.testing.assert_array_equal(first[name], again[name], name)
    # Within the noise of StandardUpdater's losses on the same batches.
    # CGDP's replicas draw other random numbers than StandardUpdater does,
    # as StandardUpdater does under another seed: the runs with seeds 1 to
    # 4 measure how far the logged losses move with the draws alone
    # (a standard deviation per value, pooled over the values: 12 degrees
    # of freedom), and a CGDP run is within 5 of them of their mean (a
    # chance of about 3e-4 per value to fall outside by noise alone; the
    # training loss falls by some 30, about 20 of them, in the two epochs).
    references = [_log(tmp_path / 'standard{}'.format(seed))
                  for seed in (1, 2, 3, 4)]
    values = numpy.array([[entry[key] for entry in log for key in VAE_KEYS]
                          for log in references])
    spread = numpy.sqrt(numpy.mean(numpy.var(values, axis=0, ddof=1)))
    tolerance = 5 * spread * numpy.sqrt(1 + 1 / len(references))
    for name, log in runs.items():
        got = numpy.array([entry[key] for entry in log for key in VAE_KEYS])
        assert got.shape == values[0].shape, name
        numpy.testing.assert_allclose(got, values.mean(axis=0), rtol=0,
                                      atol=tolerance, err_msg=name)
