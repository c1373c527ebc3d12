"""Reported values as StandardUpdater reports them on the whole batch: sums
summed over the replicas, means weighted by their shares, integers exact,
each value in the type the model reported; MicroAverage over reported
counts gives StandardUpdater's figure."""
import copy

import chainer
from chainer import training
from chainer.training import extensions
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.replica import observations

import semantics_models
import staged_models
from equivalence import WORKERS, assert_same_params
from test_loss_reduction import _iterator, train


def test_integers_stay_exact_and_keep_their_type():
    combine = observations.combine
    assert combine('k', [2, 1], [3, 3], 'sum') == 3
    assert type(combine('k', [2, 1], [3, 3], 'sum')) is int
    # A mean of integers is one where it is whole, else a float.
    assert type(combine('k', [4, 4], [3, 3], 'mean')) is int
    assert combine('k', [2, 1], [3, 3], 'mean') == 1.5
    total = combine('k', [numpy.int64(9), numpy.int64(9)], [2, 2], 'sum')
    assert type(total) is numpy.int64 and total == 18
    big = 2 ** 40 + 1
    assert combine('k', [big, big], [1, 1], 'sum') == 2 * big


def test_floats_arrays_and_variables_keep_their_type():
    combine = observations.combine
    value = combine('k', [1.0, 4.0], [1, 3], 'mean')
    assert type(value) is float and value == pytest.approx(3.25)
    value = combine('k', [numpy.float32(1), numpy.float32(4)], [1, 3],
                    'mean')
    assert type(value) is numpy.float32 and value == pytest.approx(3.25)
    value = combine('k', [numpy.array([1, 2]), numpy.array([3, 4])], [1, 1],
                    'sum')
    assert isinstance(value, numpy.ndarray) and value.dtype == numpy.int64
    numpy.testing.assert_array_equal(value, [4, 6])
    variables = [observations.portable(chainer.Variable(
        numpy.asarray(v, numpy.float32))) for v in (1, 4)]
    value = combine('k', variables, [1, 3], 'sum')
    assert isinstance(value, chainer.Variable)
    assert value.dtype == numpy.float32 and float(value.array) == 5
    # DictSummary's (value, weight) pairs: weighted by their weights.
    value, weight = combine('k', [(1.0, 1), (4.0, 3)], [2, 2], 'mean')
    assert value == pytest.approx(3.25) and weight == 4


def test_values_that_cannot_be_combined_are_refused_by_name():
    with pytest.raises(ValueError, match='main/x .*shapes'):
        observations.combine('main/x', [numpy.zeros(3), numpy.zeros(2)],
                             [3, 2], 'mean')
    with pytest.raises(ValueError, match='main/name .*not numbers'):
        observations.combine('main/name', ['a', 'b'], [1, 1], 'mean')
    assert observations.combine('main/name', ['a', 'a'], [1, 1], 'mean') == \
        'a'


def test_compare_tells_sums_from_means():
    assert observations.compare(6.0, [2.0, 4.0], [3, 3]).kind == 'sum'
    assert observations.compare(3.0, [2.0, 4.0], [3, 3]).kind == 'mean'
    assert observations.compare(3.5, [2.0, 4.0], [1, 3]).kind == 'mean'
    assert observations.compare(0.0, [0.0, 0.0], [3, 3]).kind == 'both'
    assert observations.compare(5.0, [2.0, 4.0], [3, 3]).kind == 'neither'
    assert observations.compare(numpy.zeros(6), [numpy.zeros(3)] * 2,
                                [3, 3]).kind == 'shapes'
    # Integers exactly: 7 is not the mean of 6 and 9 over 1 and 2 examples.
    assert observations.compare(8, [6, 9], [1, 2]).kind == 'mean'
    assert observations.compare(7, [6, 9], [1, 2]).kind == 'neither'


KEYS = ['main/' + key for key in (
    'loss', 'examples', 'float_sum', 'float_mean', 'classes', 'labels',
    'mean32', 'per_class', 'total_variable')]


@pytest.mark.parametrize('workers', WORKERS)
def test_reported_values_are_the_whole_batchs_in_their_types(workers):
    model = semantics_models.TypedReports()
    # Batches of 7: shares of 4 and 3 examples.
    expected, expected_reports, _ = train(
        copy.deepcopy(model), lambda optimizer: updaters.StandardUpdater(
            _iterator(7), optimizer))
    actual, reports, _ = train(model, lambda optimizer:
                               cgdp_chainer.CGDPUpdater(
                                   _iterator(7), optimizer, ['@numpy'] * 2,
                                   workers=workers))
    assert_same_params(expected, actual)
    for want, got in zip(expected_reports, reports):
        assert sorted(got) == sorted(KEYS)
        for key in KEYS:
            assert type(got[key]) is type(want[key]), key
            if isinstance(want[key], chainer.Variable):
                assert got[key].dtype == want[key].dtype
                want_value, got_value = want[key].array, got[key].array
            else:
                want_value, got_value = want[key], got[key]
            if numpy.asarray(want_value).dtype.kind in 'iu':
                numpy.testing.assert_array_equal(got_value, want_value,
                                                 err_msg=key)
            else:
                numpy.testing.assert_allclose(got_value, want_value,
                                              rtol=1e-5, err_msg=key)


def test_report_kinds_override_what_was_found():
    _, reports, _ = train(semantics_models.TypedReports(),
                          lambda optimizer: cgdp_chainer.CGDPUpdater(
                              _iterator(6), optimizer, ['@numpy'] * 2,
                              workers='thread',
                              report_kinds={'main/classes': 'sum'}),
                          iterations=1)
    classes = reports[0]['main/classes']
    assert classes == 10 and type(classes) is numpy.int32
    with pytest.raises(ValueError, match='report_kinds'):
        cgdp_chainer.CGDPUpdater(_iterator(), chainer.optimizers.SGD(),
                                 ['@numpy'] * 2,
                                 report_kinds={'main/x': 'max'})


def test_a_value_per_example_is_refused_before_any_update():
    model = semantics_models.PerExampleReport()
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(_iterator(), optimizer,
                                       ['@numpy'] * 2, workers='thread')
    try:
        with pytest.raises(ValueError, match='main/labels .*per example'):
            updater.update()
    finally:
        updater.finalize()
    assert updater.iteration == 0


def _train_with_micro_average(model, make_updater, out):
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    # 24 examples, batches of 5: the last batch of each epoch wraps around.
    updater = make_updater(chainer.iterators.SerialIterator(
        staged_models.dataset(), 5, shuffle=False), optimizer)
    trainer = training.Trainer(updater, (2, 'epoch'), out=str(out))
    trainer.extend(extensions.LogReport(trigger=(1, 'epoch')))
    trainer.extend(extensions.MicroAverage('main/correct', 'main/total',
                                           'main/accuracy'))
    trainer.run()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return params, trainer.get_extension('LogReport').log


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('sum_loss', [True, False])
def test_micro_average_over_reported_counts_is_standard_updaters(
        tmp_path, workers, sum_loss):
    model = semantics_models.CountingClassifier(sum_loss)
    expected, expected_log = _train_with_micro_average(
        copy.deepcopy(model), updaters.StandardUpdater, tmp_path / 'std')
    actual, log = _train_with_micro_average(
        model, lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * 2, workers=workers),
        tmp_path / 'cgdp')
    assert_same_params(expected, actual)
    assert len(log) == len(expected_log) == 2
    for want, got in zip(expected_log, log):
        assert got['main/accuracy'] == want['main/accuracy']
        assert got['main/total'] == want['main/total']
        assert got['main/correct'] == want['main/correct']
        assert got['main/loss'] == pytest.approx(want['main/loss'],
                                                 rel=1e-5)


@pytest.mark.gpu
def test_device_values_leave_the_replica_in_host_memory():
    import cupy
    value = observations.portable(chainer.Variable(
        cupy.arange(3, dtype=cupy.float32)))
    assert isinstance(value.array, numpy.ndarray)
    assert isinstance(observations.portable(cupy.ones(())), numpy.ndarray)
    combined = observations.combine(
        'k', [value, observations.portable(chainer.Variable(
            numpy.arange(3, dtype=numpy.float32)))], [1, 1], 'sum')
    numpy.testing.assert_array_equal(combined.array, [0, 2, 4])
