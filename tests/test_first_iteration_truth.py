"""What the first iteration's extra work on the master must not change:
found with ChainerCV's SegNet example, switched.

- The master's forward that initializes lazy parameters leaves its
  BatchNormalization statistics as they were (a lazy layer before
  BatchNormalization, one replica and two; a lazy BatchNormalization).
- The first iteration reports the loss its update used (the replicas'), as
  every later one does, also with its graph kept for DumpGraph.
- A loss that is a mean over what it does not ignore (softmax cross
  entropy with ``ignore_label``) is refused before any work, whatever the
  first batch: never taken for a mean over the examples because the
  first batch's shares happen to agree.
"""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from equivalence import assert_same_params, train

WORKERS = ['thread', pytest.param('process', marks=pytest.mark.slow)]


class LazyConvBatchNorm(chainer.Chain):
    """A lazy convolution, BatchNormalization, a lazy linear classifier
    (SegNet's shape: lazy layers before BatchNormalization). Constant
    initializers, so that ParallelUpdater's copies, which initialize
    separately, start equal to the master too."""

    def __init__(self, lazy_statistics=False):
        super(LazyConvBatchNorm, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(
                None, 4, 3, pad=1, initialW=_fixed((4, 2, 3, 3), 0))
            self.bn = L.BatchNormalization(axis=(0, 2, 3)) \
                if lazy_statistics else L.BatchNormalization(4)
            self.out = L.Linear(None, 3, initialW=_fixed((3, 4 * 4 * 4), 1))

    def forward(self, x, t):
        h = F.relu(self.bn(self.conv(x)))
        loss = F.softmax_cross_entropy(self.out(h), t)
        chainer.report({'loss': loss}, self)
        return loss


def _fixed(shape, seed):
    return numpy.random.RandomState(seed).normal(
        0, 0.3, shape).astype(numpy.float32)


def _images(n=12, seed=3):
    rng = numpy.random.RandomState(seed)
    x = rng.normal(1.5, 2.0, (n, 2, 4, 4)).astype(numpy.float32)
    t = rng.randint(0, 3, n).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def _statistics(model):
    return {'avg_mean': model.bn.avg_mean.copy(),
            'avg_var': model.bn.avg_var.copy()}


def _momentum(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    return optimizer


def _train(model, make_updater, iterations=2):
    """The parameters and BatchNormalization statistics after training."""
    params = train(model, _momentum, make_updater, iterations=iterations,
                   batch=6, data=_images())
    return params, _statistics(model)


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('lazy_statistics', [False, True])
def test_one_replica_keeps_standard_updaters_statistics(workers,
                                                        lazy_statistics):
    model = LazyConvBatchNorm(lazy_statistics)
    expected = _train(copy.deepcopy(model), updaters.StandardUpdater, 1)
    actual = _train(model, lambda iterator, optimizer:
                    cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'],
                                             workers=workers), 1)
    assert_same_params(expected[1], actual[1])
    assert_same_params(expected[0], actual[0])


@pytest.mark.parametrize('lazy_statistics', [False, True])
def test_two_replicas_keep_parallel_updaters_per_share_statistics(
        lazy_statistics):
    # ParallelUpdater normalizes each device's share on its own and keeps
    # the main device's statistics: CGDP's promise for BatchNormalization.
    devices = {'main': '@numpy', 'second': '@numpy'}
    model = LazyConvBatchNorm(lazy_statistics)
    expected = _train(copy.deepcopy(model), lambda iterator, optimizer:
                      updaters.ParallelUpdater(iterator, optimizer,
                                               devices=devices))
    actual = _train(model, lambda iterator, optimizer:
                    cgdp_chainer.CGDPUpdater(iterator, optimizer, devices,
                                             workers='thread'))
    assert_same_params(expected[1], actual[1])
    assert_same_params(expected[0], actual[0])


def _share_losses(model, x, t, n):
    """Each of ``n`` shares' loss in training mode, as the replicas run it
    (BatchNormalization over each share's own examples)."""
    with chainer.using_config('train', True), chainer.no_backprop_mode():
        return [float(F.softmax_cross_entropy(
            model.out(F.relu(model.bn(model.conv(x[i::n])))), t[i::n]).array)
            for i in range(n)]


@pytest.mark.parametrize('keep_graph', [False, True])
def test_the_first_iteration_reports_the_loss_its_update_used(keep_graph):
    model = LazyConvBatchNorm()
    x, t = _images()._datasets
    x, t = x[:6], t[:6]
    # The lazy layers initialized as the master's forward does (constant
    # initializers), on a copy that is never trained.
    reference = copy.deepcopy(model)
    with chainer.using_config('train', False):
        reference(x, t)
    shares = _share_losses(copy.deepcopy(reference), x, t, 2)
    with chainer.using_config('train', True), chainer.no_backprop_mode():
        whole = float(copy.deepcopy(reference)(x, t).array)
    expected = sum(shares) / 2  # two shares of three examples
    assert abs(whole - expected) > 1e-4  # the two are told apart

    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(
        chainer.iterators.SerialIterator(_images(), 6, shuffle=False),
        optimizer, ['@numpy', '@numpy'], workers='thread')
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    reporter.add_observers('main', model.namedlinks(skipself=True))
    observation = {}
    try:
        with reporter.scope(observation), \
                chainer.using_config('keep_graph_on_report', keep_graph):
            updater.update()
    finally:
        updater.finalize()
    loss = observation['main/loss']
    numpy.testing.assert_allclose(float(chainer.as_array(loss)), expected,
                                  rtol=1e-5)
    if keep_graph:
        # DumpGraph('main/loss') still finds the graph.
        assert isinstance(loss, chainer.Variable)
        assert loss.creator is not None


class PixelClassifier(chainer.Chain):
    """Per-pixel logits and softmax cross entropy that ignores label -1,
    a mean over the pixels it does not ignore (CamVid's unlabelled
    pixels), as SegNet's loss."""

    def __init__(self, scale, zero_output=False):
        super(PixelClassifier, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(
                2, 3, 1, initialW=0 if zero_output else
                _fixed((3, 2, 1, 1), 2) * scale)

    def forward(self, x, t):
        loss = F.softmax_cross_entropy(self.conv(x), t, ignore_label=-1)
        chainer.report({'loss': loss}, self)
        return loss


def _masked_images(ignored, n=8, seed=4):
    """``ignored[i]`` pixels of image ``i`` (of 16) labelled -1."""
    rng = numpy.random.RandomState(seed)
    x = rng.normal(0, 1, (n, 2, 4, 4)).astype(numpy.float32)
    t = rng.randint(0, 3, (n, 4, 4)).astype(numpy.int32)
    for i in range(n):
        t[i].flat[:ignored[i % len(ignored)]] = -1
    return chainer.datasets.TupleDataset(x, t)


@pytest.mark.parametrize('scale,zero_output', [
    (1.0, False),    # shares' losses far apart: neither matches
    (1e-3, False),   # every pixel's loss about log(3): all but agree
    (1.0, True),     # every pixel's loss exactly log(3)
])
def test_a_masked_mean_is_refused_before_any_work(scale, zero_output):
    # Shares (batch[i::2]) hold 2 and 14 ignored pixels per image.
    model = PixelClassifier(scale, zero_output)
    before = {name: param.array.copy() for name, param in model.namedparams()}
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(
        chainer.iterators.SerialIterator(_masked_images([2, 14]), 8,
                                         shuffle=False),
        optimizer, ['@numpy', '@numpy'], workers='thread')
    try:
        with pytest.raises(ValueError, match='reduction') as error:
            updater.update()
    finally:
        updater.finalize()
    message = str(error.value)
    assert "reduction='mean'" in message
    assert 'ignore' in message
    for name, param in model.namedparams():
        numpy.testing.assert_array_equal(param.array, before[name])


def test_shares_that_agree_are_told_apart_on_finer_shares():
    # A mean over the examples whose two device shares hold the same
    # examples (so the same loss): the finer shares show its weights.
    x, t = _masked_images([0], n=4)._datasets
    order = [0, 0, 1, 1, 2, 2, 3, 3]
    data = chainer.datasets.TupleDataset(x[order], t[order])
    model = PixelClassifier(1.0)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    expected = copy.deepcopy(model)
    reference_optimizer = chainer.optimizers.SGD()
    reference_optimizer.setup(expected)

    def iterator():
        return chainer.iterators.SerialIterator(data, 8, shuffle=False)

    standard = updaters.StandardUpdater(iterator(), reference_optimizer)
    updater = cgdp_chainer.CGDPUpdater(iterator(), optimizer,
                                       ['@numpy', '@numpy'], workers='thread')
    try:
        for _ in range(2):
            standard.update()
            updater.update()
    finally:
        updater.finalize()
    assert updater.reduction == 'mean'
    assert_same_params(
        {name: p.array for name, p in expected.namedparams()},
        {name: p.array for name, p in model.namedparams()})


def test_a_lazy_layer_the_loss_never_calls_is_refused_by_name():
    model = LazyConvBatchNorm()
    with model.init_scope():
        model.unused = L.Linear(None, 2)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(
        chainer.iterators.SerialIterator(_images(), 6, shuffle=False),
        optimizer, ['@numpy'], workers='thread')
    try:
        with pytest.raises(ValueError, match='/unused/W'):
            updater.update()
    finally:
        updater.finalize()
