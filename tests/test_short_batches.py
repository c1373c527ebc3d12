"""A batch with fewer examples than replicas (the last of an epoch without
repeat) trains as StandardUpdater trains it: parameters and reported values
equal, the replica without examples adding nothing."""
import chainer
import chainer.links as L
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.input import batches

import cuda_standin
import equivalence
import staged_models


def _epoch(make_updater, n_examples, batch_size, devices_form=None):
    """One epoch without repeat; the parameters after it and each
    iteration's reported values."""
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(n=n_examples), batch_size, repeat=False,
        shuffle=False)
    updater = make_updater(iterator, optimizer)
    reports = []
    try:
        while True:
            reporter = chainer.Reporter()
            reporter.add_observer('main', model)
            observation = {}
            with reporter.scope(observation):
                try:
                    updater.update()
                except StopIteration:
                    break
            reports.append({key: chainer.as_array(value).item()
                            for key, value in observation.items()})
    finally:
        updater.finalize()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return params, reports


def _assert_same_epoch(expected, actual):
    equivalence.assert_same_params(expected[0], actual[0])
    assert len(actual[1]) == len(expected[1])
    for want, got in zip(expected[1], actual[1]):
        assert sorted(got) == sorted(want)
        for key in want:
            numpy.testing.assert_allclose(got[key], want[key], rtol=1e-5,
                                          atol=1e-6, err_msg=key)


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('n, n_examples, batch_size', [
    (2, 65, 32),  # the third batch holds 1 example
    (3, 7, 3),    # the third batch holds 1 example for 3 replicas
])
def test_a_short_last_batch_trains_as_standard_updater(
        workers, n, n_examples, batch_size):
    expected = _epoch(updaters.StandardUpdater, n_examples, batch_size)
    actual = _epoch(equivalence.cgdp(n, workers=workers), n_examples,
                    batch_size)
    _assert_same_epoch(expected, actual)


def test_a_short_last_batch_trains_through_the_gpu_path():
    # The stand-in of CuPy's copies: shares staged for the device (a share
    # without examples stages nothing), gradients copied per chunk.
    expected = _epoch(updaters.StandardUpdater, 65, 32)
    actual = _epoch(equivalence.cgdp(
        2, workers='thread', chunk_size=1,
        device_copies=cuda_standin.HostDeviceCopies), 65, 32)
    _assert_same_epoch(expected, actual)


def test_the_dict_of_devices_form_sums_a_short_batch_as_one_replica():
    # ParallelUpdater's sum over the replicas (it cannot convert an empty
    # share): on the last batch, the one replica's gradient, which is
    # StandardUpdater's.
    def reference():
        model = L.Classifier(staged_models.StagedMLP())
        optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
        optimizer.setup(model)
        data = staged_models.dataset(n=5)

        def run(updater, iterations):
            for _ in range(iterations):
                updater.update()
        run(equivalence.parallel(2)(chainer.iterators.SerialIterator(
            data[:4], 2, shuffle=False), optimizer), 2)
        run(updaters.StandardUpdater(chainer.iterators.SerialIterator(
            data[4:], 1, shuffle=False), optimizer), 1)
        return {name: p.array.copy() for name, p in model.namedparams()}

    actual = _epoch(lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
        iterator, optimizer, {'main': '@numpy', 'second': '@numpy'},
        workers='thread'), 5, 2)
    equivalence.assert_same_params(reference(), actual[0])
    assert len(actual[1]) == 3 and numpy.isfinite(actual[1][2]['main/loss'])


def test_a_share_without_examples_is_none_and_not_converted():
    converted = []

    def convert(examples):
        converted.append(len(examples))
        return chainer.dataset.concat_examples(examples)

    dataset = staged_models.dataset(n=2)
    batch = batches.from_iterator_batch([dataset[0]], 3, convert)
    assert batch.counts == [1, 0, 0]
    assert batch.shares == [1.0, 0.0, 0.0]
    assert batch.inputs[1] is None and batch.inputs[2] is None
    assert converted == [1]
    shares, counts = batches.split_converted(
        (numpy.zeros((1, 4)), numpy.zeros(1)), 2, 'a pre-batched tuple')
    assert counts == [1, 0] and shares[1] is None


def test_a_first_batch_shorter_than_the_devices_is_refused():
    # The first iteration learns the graph on every replica.
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(n=1), 2, repeat=False, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       workers='thread')
    try:
        with pytest.raises(ValueError, match='the first batch has 1 '
                           'examples, fewer than the 2 devices'):
            updater.update()
    finally:
        updater.finalize()
