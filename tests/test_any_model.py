"""CGDPUpdater on models without stages: per-parameter readiness during one
ordinary backward, equivalence with StandardUpdater and ParallelUpdater,
Chainer's own vision models, overlap, lazy parameters, the MNIST example's
Trainer set, and what is refused."""
import copy
import os
import subprocess
import sys

import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import blas
import chainer
import chainer.links as L
from chainer import optimizer_hooks

import any_models
import equivalence
from equivalence import WORKERS, assert_same_params, cgdp, parallel, standard  # NOQA
import staged_models

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def setup_optimizer(kind, model):
    if kind == 'momentum':
        optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    elif kind == 'adam':
        optimizer = chainer.optimizers.Adam(alpha=0.01)
    else:
        raise ValueError(kind)
    optimizer.setup(model)
    # Weight decay moves even a parameter no replica used: Chainer's
    # optimizer.update() gives it a zero gradient, and so must CGDP.
    optimizer.add_hook(optimizer_hooks.WeightDecay(0.01))
    return optimizer


def train(model, optimizer_kind, make_updater, iterations=3, batch=6,
          data=None):
    return equivalence.train(
        model, lambda m: setup_optimizer(optimizer_kind, m), make_updater,
        iterations=iterations, batch=batch, data=data)


def assert_trained(initial, trained, names=None):
    """Guards against a vacuous comparison: every weight matrix (by default;
    a zero bias of an unused layer stays zero) has changed."""
    names = names or [n for n in initial if n.endswith('/W')]
    assert all(not numpy.array_equal(initial[n], trained[n]) for n in names)


def _initial(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('optimizer_kind', ['momentum', 'adam'])
@pytest.mark.parametrize('n_devices', [2, 3])
def test_branching_tied_unused_mean_equals_standard_updater(
        n_devices, optimizer_kind, workers):
    base = L.Classifier(any_models.Branching())
    expected = train(copy.deepcopy(base), optimizer_kind, standard)
    actual = train(copy.deepcopy(base), optimizer_kind,
                   cgdp(n_devices, chunk_size=1, workers=workers))
    assert_same_params(expected, actual)
    assert_trained(_initial(base), expected)


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('optimizer_kind, n_devices', [('momentum', 2),
                                                       ('adam', 3)])
def test_branching_tied_unused_sum_equals_parallel_updater(
        optimizer_kind, n_devices, workers):
    base = L.Classifier(any_models.Branching())
    expected = train(copy.deepcopy(base), optimizer_kind,
                     parallel(n_devices))
    actual = train(copy.deepcopy(base), optimizer_kind,
                   cgdp(n_devices, chunk_size=2, reduction='sum',
                        workers=workers))
    assert_same_params(expected, actual)


def test_chunks_follow_the_ready_order_with_the_unused_layer_last():
    model = L.Classifier(any_models.Branching())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1, workers='thread')
    assert updater.chunk_plan is None
    updater.update()
    updater.finalize()
    plan = updater.chunk_plan
    # Seven layers (six links and the Chain holding `scale`), one a chunk,
    # in backward order: the output layer first, the never-used one last.
    assert plan.n_chunks == updater.n_layers == 7
    layers = [chunk[0] for chunk in plan.layers]
    assert layers[0] == '/predictor/out'
    assert layers[-1] == '/predictor/unused'
    assert layers.index('/predictor/tied') < layers.index('/predictor/left')
    assert layers.index('/predictor/stem') == 5
    # The runtime's chunks count from the input side.
    assert updater.chunks[0] == ['/predictor/unused/W', '/predictor/unused/b']


@pytest.mark.parametrize('workers', WORKERS)
def test_a_graph_that_changes_with_the_iteration(workers):
    base = L.Classifier(any_models.IterationDependent())
    data = staged_models.dataset(n=30)
    expected = train(copy.deepcopy(base), 'adam', standard, iterations=5,
                     data=data)
    actual = train(copy.deepcopy(base), 'adam',
                   cgdp(2, chunk_size=1, workers=workers), iterations=5,
                   data=data)
    assert_same_params(expected, actual)
    sum_expected = train(copy.deepcopy(base), 'momentum', parallel(3),
                         iterations=4, data=data)
    sum_actual = train(copy.deepcopy(base), 'momentum',
                       cgdp(3, chunk_size=2, reduction='sum',
                            workers=workers), iterations=4, data=data)
    assert_same_params(sum_expected, sum_actual)
    assert_trained(_initial(base), expected,
                   ['/predictor/a/W', '/predictor/b/W'])


@pytest.mark.parametrize('workers', WORKERS)
def test_a_cut_graph_trains_as_with_standard_updater(workers):
    # stem and side never get a gradient, a only in odd iterations: all
    # count as zeros (weight decay and momentum still move them), as
    # Chainer's optimizer.update() fills a missing gradient with zeros.
    base = L.Classifier(any_models.Unchained())
    data = staged_models.dataset(n=30)
    expected = train(copy.deepcopy(base), 'momentum', standard,
                     iterations=4, data=data)
    actual = train(copy.deepcopy(base), 'momentum',
                   cgdp(2, chunk_size=1, workers=workers), iterations=4,
                   data=data)
    assert_same_params(expected, actual)
    assert_trained(_initial(base), expected,
                   ['/predictor/stem/W', '/predictor/side/W',
                    '/predictor/a/W'])


@pytest.mark.parametrize('workers', WORKERS)
def test_rule_hooks_without_a_fused_form_train_as_with_standard_updater(
        workers):
    # ChainerCV's GradientScaling on the biases and on one weight, with
    # MomentumSGD (Adam would hide a scaling), the optimizer's WeightDecay
    # and a static loss scale: the hooks run
    # on the host between the gradient and the fused update, in Chainer's
    # order (optimizer hooks, the scale's division, the rule's hooks).
    def hooked(model):
        for name, param in model.namedparams():
            if name.endswith('/b') or name == '/predictor/out/W':
                param.update_rule.add_hook(any_models.GradientScaling(3.0))
        return model

    base = L.Classifier(any_models.Unchained())
    data = staged_models.dataset(n=30)

    def make(kind):
        def make_updater(iterator, optimizer):
            hooked(optimizer.target)
            if kind == 'standard':
                return chainer.training.updaters.StandardUpdater(
                    iterator, optimizer, loss_scale=64.0)
            return cgdp_chainer.CGDPUpdater(
                iterator, optimizer, ['@numpy'] * 2, chunk_size=1,
                workers=workers, loss_scale=64.0)
        return make_updater

    expected = train(copy.deepcopy(base), 'momentum', make('standard'),
                     iterations=4, data=data)
    actual = train(copy.deepcopy(base), 'momentum', make('cgdp'),
                   iterations=4, data=data)
    assert_same_params(expected, actual)
    without = train(copy.deepcopy(base), 'momentum', standard, iterations=4,
                    data=data)
    assert not numpy.allclose(without['/predictor/out/W'],
                              expected['/predictor/out/W'])


def _images(n, size, n_classes, seed=0):
    rng = numpy.random.RandomState(seed)
    return chainer.datasets.TupleDataset(
        rng.normal(size=(n, 3, size, size)).astype(numpy.float32),
        rng.randint(0, n_classes, n).astype(numpy.int32))


def _one_step(base, data, batch, workers, rtol=1e-5, atol=1e-5):
    """One step from the same model, dropout off: process workers against
    StandardUpdater (mean), thread workers against ParallelUpdater (sum);
    the reference with one BLAS thread. The absolute tolerance covers
    weights near zero whose gradient sums per-example terms that cancel
    (a batched convolution sums them in another order)."""
    reference, reduction = ((standard, 'mean') if workers == 'process' else
                            (parallel(2), 'sum'))
    with chainer.using_config('train', False):
        with blas.BlasLimit(1):
            expected = train(copy.deepcopy(base), 'momentum', reference,
                             iterations=1, batch=batch, data=data)
        actual = train(copy.deepcopy(base), 'momentum',
                       cgdp(2, workers=workers, reduction=reduction),
                       iterations=1, batch=batch, data=data)
    assert_same_params(expected, actual, rtol=rtol, atol=atol)
    assert_trained(_initial(base), expected)


@pytest.fixture(scope='module')
def vgg16():
    # Building Chainer's VGG16Layers draws 138 million weights: once. Its
    # initializers draw from NumPy's global random state: seeded, so that
    # every run compares the same weights.
    numpy.random.seed(0)
    return L.Classifier(any_models.VGG16At64(n_classes=10))


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_chainer_vgg16_layers_at_64_pixels(vgg16, workers):
    _one_step(vgg16, _images(4, 64, 10), 4, workers)


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_chainer_googlenet_with_its_auxiliary_heads(workers):
    models = pytest.importorskip('models')
    numpy.random.seed(0)  # GoogLeNet's initializers use the global state
    base = models.Classifier(any_models.GoogLeNetWithAux())
    _one_step(base, _images(2, any_models.GOOGLENET_PIXELS, 1000), 2,
              workers)


@pytest.mark.parametrize('workers', WORKERS)
def test_host_updates_chunks_while_the_replicas_are_still_in_backward(
        workers):
    timeline = cgdp_chainer.Timeline()
    model = L.Classifier(any_models.SlowInputSide(seconds=0.3))
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1, timeline=timeline,
                                       workers=workers)
    for _ in range(2):
        updater.update()
    updater.finalize()
    assert len(updater.chunks) == 6
    events = timeline.events_of(1)
    backward_end = min(
        max(e.end for e in events if e.device == device and
            e.kind == 'backward') for device in (0, 1))
    updates = [e for e in events if e.device == 'host' and
               e.kind == 'update']
    assert {e.chunk for e in updates} == set(range(6))
    early = {e.chunk for e in updates if e.end < backward_end}
    # The output-side layers are updated during the slow backward of the
    # first layers (chunk 0, the input side, comes last).
    assert len(early) >= 2
    assert 0 not in early


@pytest.mark.parametrize('workers', WORKERS)
def test_lazy_parameters_get_standard_updaters_values(workers):
    data = _mnist_like(36)

    def run(make_updater, optimizer_kind):
        numpy.random.seed(7)
        model = L.Classifier(any_models.MLP())
        assert model.predictor.l1.W.array is None
        if optimizer_kind == 'frozen':
            # lr=0: the parameters stay at their initial values.
            def setup(m):
                optimizer = chainer.optimizers.SGD(lr=0.0)
                optimizer.setup(m)
                return optimizer
            return equivalence.train(model, setup, make_updater,
                                     iterations=1, batch=12, data=data)
        return train(model, optimizer_kind, make_updater, iterations=2,
                     batch=12, data=data)

    # The initial values themselves: exactly StandardUpdater's.
    expected = run(standard, 'frozen')
    actual = run(cgdp(2, workers=workers), 'frozen')
    assert expected.keys() == actual.keys()
    for name in expected:
        numpy.testing.assert_array_equal(actual[name], expected[name],
                                         err_msg=name)
    # And training from them. (Adam would amplify the rounding of
    # near-zero gradient elements summed in another order.)
    assert_same_params(run(standard, 'momentum'),
                       run(cgdp(2, workers=workers), 'momentum'))


def _mnist_like(n, seed=0):
    rng = numpy.random.RandomState(seed)
    return chainer.datasets.TupleDataset(
        rng.uniform(0, 1, (n, 784)).astype(numpy.float32),
        rng.randint(0, 10, n).astype(numpy.int32))


def test_main_loss_is_a_variable_with_its_graph_when_the_graph_is_kept():
    model = L.Classifier(any_models.Branching())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       workers='thread')
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    observations = []
    try:
        for keep_graph in (True, False):
            observation = {}
            with chainer.using_config('keep_graph_on_report', keep_graph), \
                    reporter.scope(observation):
                updater.update()
            observations.append(observation)
    finally:
        updater.finalize()
    first, second = observations
    assert isinstance(first['main/loss'], chainer.Variable)
    assert first['main/loss'].creator is not None
    assert isinstance(second['main/loss'], chainer.Variable)
    assert second['main/loss'].creator is None
    assert second['main/loss'].dtype == numpy.float32
    assert isinstance(second['main/accuracy'], chainer.Variable)


MNIST_SCRIPT = '''
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import cgdp_chainer
import chainer
import chainer.links as L
from chainer import training
from chainer.training import extensions
import numpy
import any_models


def main():
    mode, out, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    numpy.random.seed(0)
    rng = numpy.random.RandomState(0)
    data = chainer.datasets.TupleDataset(
        rng.uniform(0, 1, (48, 784)).astype(numpy.float32),
        rng.randint(0, 10, 48).astype(numpy.int32))
    train, test = data[:36], data[36:]
    model = L.Classifier(any_models.MLP())
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    # In order: a shuffling sampler's random state is not in Chainer's
    # snapshots, so only a fixed order resumes exactly (with any updater).
    train_iter = chainer.iterators.SerialIterator(train, 12, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, 12, repeat=False,
                                                 shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(train_iter, optimizer,
                                       devices=['@numpy', '@numpy'])
    trainer = training.Trainer(updater, (epochs, 'epoch'), out=out)
    trainer.extend(extensions.Evaluator(test_iter, model))
    trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PlotReport(
        ['main/loss', 'validation/main/loss'], 'epoch',
        filename='loss.png'))
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss', 'main/accuracy',
         'validation/main/accuracy', 'elapsed_time']))
    trainer.extend(extensions.ProgressBar())
    if mode == 'resume':
        chainer.serializers.load_npz(sys.argv[4], trainer)
    trainer.run()
    numpy.savez(out + '/params.npz',
                **{{n: p.array for n, p in model.namedparams()}})


if __name__ == '__main__':
    main()
'''


@pytest.mark.slow
def test_chainer_mnist_example_trainer_set_and_resume(tmp_path):
    script = tmp_path / 'train_mnist.py'
    script.write_text(MNIST_SCRIPT.format(root=ROOT, tests=TESTS))

    def run(*args):
        result = subprocess.run([sys.executable, str(script)] + list(args),
                                capture_output=True, text=True, timeout=600,
                                cwd=str(tmp_path))
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    straight = tmp_path / 'straight'
    first = tmp_path / 'first'
    result = run('train', str(straight), '3')
    assert 'validation/main/loss' in result.stdout
    assert (straight / 'cg.dot').read_text().startswith('digraph')
    assert (straight / 'loss.png').stat().st_size > 0
    import json
    log = json.loads((straight / 'log').read_text())
    assert [entry['epoch'] for entry in log] == [1, 2, 3]
    assert all(numpy.isfinite(entry['main/loss']) for entry in log)
    run('train', str(first), '1')
    resumed = tmp_path / 'resumed'
    run('resume', str(resumed), '3',
        str(first / 'snapshot_iter_3'))
    straight_params = numpy.load(str(straight / 'params.npz'))
    resumed_params = numpy.load(str(resumed / 'params.npz'))
    for name in straight_params.files:
        numpy.testing.assert_array_equal(resumed_params[name],
                                         straight_params[name])


@pytest.mark.parametrize('workers', WORKERS)
def test_f_forget_is_refused_at_the_first_iteration(workers):
    model = L.Classifier(any_models.Forgetting())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       workers=workers)
    try:
        with pytest.raises(Exception, match='F.forget') as info:
            updater.update()
    finally:
        updater.finalize()
    assert 'call the function without F.forget' in str(info.value)
    assert updater.iteration == 0


@pytest.mark.parametrize('workers', WORKERS)
def test_replicas_forming_different_chunks_is_an_error_not_a_hang(workers):
    model = L.Classifier(any_models.ReplicaDependent())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1, workers=workers)
    try:
        with pytest.raises(RuntimeError, match='the chunk plans differ: '
                                               'replica 1 formed'):
            updater.update()
        with pytest.raises(RuntimeError, match='finalized or stopped'):
            updater.update()
    finally:
        updater.finalize()


@pytest.mark.parametrize('kwargs, message', [
    (dict(chunk_size=8), 'out of range: the model has 7 layers'),
    (dict(chunk_size=[0, 7]), 'from 0 .the output-side layer. to 6'),
    (dict(chunk_bytes=-5), 'chunk_bytes must be a positive integer'),
    (dict(chunk_size=1.5), 'chunk_size must be an int from 1 to 7'),
])
def test_bad_chunking_is_refused_naming_the_layers(kwargs, message):
    model = L.Classifier(any_models.Branching())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    with pytest.raises(ValueError, match=message):
        cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                 **kwargs)


@pytest.mark.parametrize('workers', WORKERS)
def test_chunk_bytes_and_boundaries_give_the_same_training(workers):
    base = L.Classifier(any_models.Branching())
    expected = train(copy.deepcopy(base), 'adam', standard)
    for kwargs in (dict(chunk_bytes=300), dict(chunk_size=[0, 2, 5])):
        actual = train(copy.deepcopy(base), 'adam',
                       cgdp(2, workers=workers, **kwargs))
        assert_same_params(expected, actual)


@pytest.mark.gpu
@pytest.mark.parametrize('workers', WORKERS)
def test_gpu_replicas_on_a_model_without_stages(workers):
    gpus = equivalence.two_gpu_replicas()
    base = L.Classifier(any_models.Branching())
    expected = train(copy.deepcopy(base), 'adam', standard)
    timeline = cgdp_chainer.Timeline()

    def make(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(iterator, optimizer, gpus,
                                        chunk_size=1, workers=workers,
                                        timeline=timeline)
    # The master stays in host memory.
    actual = train(copy.deepcopy(base), 'adam', make)
    assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)
    assert {e.chunk for e in timeline.events_of(2)
            if e.kind == 'backward'} == set(range(7))
