"""The notice that each replica normalizes over its share of the batch:
once per updater with a BatchNormalization model and several replicas, not
with one replica, a model without such links, or outside training mode."""
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.replica import batch_statistics

import staged_models


class Normalized(chainer.Chain):
    """A Linear, then a normalization link of the given class."""

    def __init__(self, normalization):
        super(Normalized, self).__init__()
        with self.init_scope():
            self.fc = L.Linear(6, 5)
            self.norm = normalization

    def forward(self, x):
        return F.relu(self.norm(self.fc(x)))


def _notices(model, devices, iterations=3, train=True):
    """The BatchStatisticsWarning lines of ``iterations`` updates."""
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, devices,
                                           workers='thread')
        try:
            with chainer.using_config('train', train):
                for _ in range(iterations):
                    updater.update()
        finally:
            updater.finalize()
    return [str(w.message) for w in caught
            if issubclass(w.category, batch_statistics.BatchStatisticsWarning)]


def test_a_batch_normalization_model_on_several_replicas_hears_it_once():
    said = _notices(L.Classifier(Normalized(L.BatchNormalization(5))),
                    ['@numpy'] * 2)
    assert len(said) == 1, said
    assert 'each of the 2 replicas normalizes /predictor/norm over its ' \
        'own share of the batch' in said[0]
    assert 'MultiNodeBatchNormalization' in said[0]


@pytest.mark.parametrize('model, devices, train', [
    (lambda: Normalized(L.BatchNormalization(5)), ['@numpy'], True),
    (lambda: staged_models.StagedMLP(), ['@numpy'] * 2, True),
    (lambda: Normalized(L.GroupNormalization(1, 5)), ['@numpy'] * 2, True),
    (lambda: Normalized(L.BatchNormalization(5)), ['@numpy'] * 2, False),
])
def test_nothing_is_said_where_nothing_differs(model, devices, train):
    assert _notices(L.Classifier(model()), devices, iterations=2,
                    train=train) == []


def test_the_links_normalizing_over_the_batch_are_found():
    model = chainer.Sequential(
        L.BatchRenormalization(3), L.DecorrelatedBatchNormalization(4, 2),
        L.LayerNormalization(3), L.GroupNormalization(1, 3))
    # Over the batch: BatchRenormalization (a BatchNormalization) and
    # DecorrelatedBatchNormalization; per example: the other two.
    found = batch_statistics.batch_normalizing_links(model)
    assert sorted(found) == sorted(
        path for path, link in model.namedlinks() if isinstance(
            link, (L.BatchRenormalization, L.DecorrelatedBatchNormalization)))
    assert len(found) == 2
