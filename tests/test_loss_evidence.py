"""'mean' or 'sum' only where the batches show it (issue #38): the loss is
compared with its shares' within float rounding, a share whose loss is
zero (or has no graph) tells nothing, and a mean found at the first
iteration is compared again on later batches before their updates. Found
with ChainerCV's SegNet (a masked mean) and SSD (a loss normalized by the
batch's positive boxes, a constant zero without a graph on a share
without one)."""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.replica import loss_reduction
from cgdp_chainer.runtime.replica import reduction_evidence

import semantics_models
from equivalence import assert_same_params
from log_capture import said  # NOQA: the fixture


def _sgd(model):
    optimizer = chainer.optimizers.SGD(lr=0.1)
    optimizer.setup(model)
    return optimizer


def _params(model):
    return {name: p.array.copy() for name, p in model.namedparams()}


def _iterator(data, batch):
    return chainer.iterators.SerialIterator(data, batch, shuffle=False)


def _standard(model, data, batch, iterations):
    """StandardUpdater's parameters after each of ``iterations``."""
    model = copy.deepcopy(model)
    updater = updaters.StandardUpdater(_iterator(data, batch), _sgd(model))
    after = [_params(model)]
    for _ in range(iterations):
        updater.update()
        after.append(_params(model))
    return after


def _cgdp(model, data, batch, iterations, workers='thread', reduction=None):
    """CGDP's updater after ``iterations`` (or the error that stopped it)
    and the parameters then."""
    updater = cgdp_chainer.CGDPUpdater(
        _iterator(data, batch), _sgd(model), ['@numpy'] * 2,
        workers=workers, reduction=reduction)
    error = None
    try:
        for _ in range(iterations):
            updater.update()
    except ValueError as raised:
        error = raised
    finally:
        updater.finalize()
    return updater, error, _params(model)


def test_a_masked_mean_whose_counts_differ_under_a_percent_is_refused():
    # SegNet's case: each share ignores a few of its 1024 pixels (8 and 0,
    # under 1%), so the whole batch's loss lies within 1% of the shares'
    # spread from their mean, but far beyond float rounding.
    model = semantics_models.WeightedPixels()
    data = semantics_models.pixels_dataset([8, 0])
    before = _params(model)
    updater, error, after = _cgdp(model, data, 4, 1)
    assert error is not None and updater.iteration == 0
    assert_same_params(before, after)
    message = str(error)
    assert 'neither matches' in message and 'ignore' in message
    assert "reduction='mean') to train as ChainerMN does" in message
    assert "StandardUpdater's exact result" in message
    # Within the 1% of the spread that a match once needed.
    forwards = _probe(model, data, 4)
    comparison = reduction_evidence.compare_loss(
        forwards[0], forwards[1:], [2, 2])
    spread = abs(forwards[1] - forwards[2])
    off = abs(forwards[0] - float(comparison.mean))
    assert off < 0.01 * spread and comparison.kind == 'neither'


def _probe(model, data, batch):
    """The test-mode losses of the whole first batch and of its two
    devices' shares (examples i::2)."""
    x, t = chainer.dataset.concat_examples(data[:batch])
    losses = loss_reduction.probe_forwards(
        model, None, [(x, t), (x[0::2], t[0::2]), (x[1::2], t[1::2])])
    return [float(f.loss.array) for f in losses]


class ConvMean(chainer.Chain):
    """A small conv net with softmax cross entropy, a mean over the
    examples, in the configured dtype."""

    def __init__(self):
        super(ConvMean, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 8, 3, pad=1)
            self.conv2 = L.Convolution2D(8, 8, 3, pad=1)
            self.out = L.Linear(None, 5)

    def forward(self, x, t):
        h = F.relu(self.conv2(F.relu(self.conv1(x))))
        return F.softmax_cross_entropy(self.out(h), t)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_real_means_are_found_within_rounding(dtype):
    # Batches of 7 split 4/3 and 2 split 1/1, twenty draws each: every
    # whole batch's loss is within the rounding tolerance of the shares'
    # mean, and the shares show it.
    for seed in range(20):
        rng = numpy.random.RandomState(seed)
        with chainer.using_config('dtype', dtype):
            model = ConvMean()
            for counts in ([4, 3], [1, 1]):
                n = sum(counts)
                x = rng.normal(0, 3, (n, 3, 8, 8)).astype(dtype)
                t = rng.randint(0, 5, n).astype(numpy.int32)
                whole, first, second = loss_reduction.probe_forwards(
                    model, None, [(x, t), (x[:counts[0]], t[:counts[0]]),
                                  (x[counts[0]:], t[counts[0]:])])
                comparison = reduction_evidence.compare_loss(
                    whole.loss, [first.loss, second.loss], counts)
                assert comparison.kind == 'mean', (seed, counts)
                assert reduction_evidence.shows_form(comparison), \
                    (seed, counts)
                # Far tighter than the old 1e-4 relative.
                assert float(comparison.tolerance['mean']) < \
                    1e-5 * abs(float(whole.loss.array))


@pytest.mark.parametrize('positives,refused_at', [
    ([3, 3, 1, 4, 2, 2], 2),   # SSD's 26/26, then 12/20
    ([3, 3, 0, 4, 2, 2], 2),   # SSD's 26/26, then 0/35: half the loss
    ([3, 3, 2, 2, 1, 4], 3),   # equal twice, then not
])
def test_a_count_normalized_loss_is_refused_before_a_wrong_update(
        positives, refused_at):
    # Batch 2 on two devices: the first batch's shares hold equal counts
    # of positives, so its loss is their mean and 'mean' is found; the
    # batch that shows otherwise is refused before its update, and every
    # update before it was StandardUpdater's.
    model = semantics_models.PositivesLoss('count')
    data = semantics_models.positives_dataset(positives)
    expected = _standard(model, data, 2, 3)
    updater, error, after = _cgdp(model, data, 2, 3)
    assert updater.reduction == 'mean'
    assert error is not None, 'trained on without a check'
    message = str(error)
    assert 'the batch of iteration {} does not confirm it'.format(
        refused_at) in message
    assert "reduction='mean') to train as ChainerMN does" in message
    assert updater.iteration == refused_at - 1
    assert_same_params(expected[refused_at - 1], after)


def test_a_mean_over_the_examples_is_confirmed_and_trains_as_standard(
        said):
    # The same data as a mean over the examples: the checks at
    # iterations 2 and 3 show the mean, and no later one runs.
    model = semantics_models.PositivesLoss('mean')
    data = semantics_models.positives_dataset([3, 3, 1, 4, 2, 2, 4, 1])
    expected = _standard(model, data, 2, 4)
    updater, error, after = _cgdp(model, data, 2, 4)
    assert error is None and updater.reduction == 'mean'
    assert_same_params(expected[-1], after)
    lines = [line for line in said().splitlines()
             if line.startswith('CGDP reduction')]
    assert len(lines) == 2, lines
    assert "compared again before the update" in lines[0]
    assert lines[1].startswith("CGDP reduction: 'mean' confirmed at "
                               'iteration 3')


def test_a_zero_share_tells_nothing():
    # SSD's first batch with no positive box in one example: the whole
    # batch's loss is the other share's, a sum of it and zero, and a
    # normalized loss alike. Refused, not taken for 'sum'.
    model = semantics_models.PositivesLoss('count')
    data = semantics_models.positives_dataset([3, 0, 1, 4])
    before = _params(model)
    updater, error, after = _cgdp(model, data, 2, 1)
    assert error is not None and updater.iteration == 0
    assert_same_params(before, after)
    assert 'fewer than two shares have a loss that is not zero' in \
        str(error)


@pytest.mark.parametrize('workers', [
    'thread', pytest.param('process', marks=pytest.mark.slow)])
@pytest.mark.parametrize('form,reduction', [
    ('sum', None), ('sum', 'sum'), ('mean', 'mean'), ('mean', None)])
def test_a_replica_whose_loss_has_no_graph_trains(workers, form, reduction):
    # Examples 1 and 3 have no positive: replica 1's loss is a constant
    # zero without a graph at the first iteration (and at the third).
    # Its share's gradients are zeros; found on the finer shares where
    # not given.
    positives = [3, 0, 2, 0, 1, 2, 3, 4, 2, 0, 1, 0]
    model = semantics_models.PositivesLoss(form)
    data = semantics_models.positives_dataset(positives)
    expected = _standard(model, data, 4, 3)
    updater, error, after = _cgdp(model, data, 4, 3, workers=workers,
                                  reduction=reduction)
    assert error is None, error
    assert updater.reduction == form
    assert_same_params(expected[-1], after)


def test_an_overflow_at_a_later_check_tells_nothing():
    # A batch whose loss is not finite (an overflow, which dynamic loss
    # scaling skips) is neither a mean nor evidence against it.
    nan = float('nan')
    for whole, parts in ((nan, [1.2, nan]), (float('inf'), [1.0, 2.0])):
        comparison = reduction_evidence.compare_loss(whole, parts, [1, 1])
        assert not reduction_evidence.all_finite(comparison)
    comparison = reduction_evidence.compare_loss(1.5, [1.0, 2.0], [1, 1])
    assert reduction_evidence.all_finite(comparison)


def test_a_sum_is_shown_only_beyond_the_shares_range():
    # Losses of both signs: the sum 1.0 of 3.0 and -2.0 lies between them,
    # where a mean weighted 3:2 lies too.
    between = reduction_evidence.compare_loss(1.0, [3.0, -2.0], [1, 1])
    assert between.kind == 'sum'
    assert not reduction_evidence.shows_form(between)
    beyond = reduction_evidence.compare_loss(5.0, [3.0, 2.0], [1, 1])
    assert beyond.kind == 'sum' and reduction_evidence.shows_form(beyond)
    # A share whose loss is zero shows nothing.
    zero = reduction_evidence.compare_loss(3.0, [3.0, 0.0], [1, 1])
    assert zero.kind == 'sum' and not reduction_evidence.shows_form(zero)


def test_integers_are_compared_exactly_and_shown_alike():
    mean = reduction_evidence.compare_loss(8, [6, 9], [1, 2])
    assert mean.kind == 'mean' and reduction_evidence.shows_form(mean)
    assert reduction_evidence.compare_loss(
        7, [6, 9], [1, 2]).kind == 'neither'
