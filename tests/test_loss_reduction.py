"""The reduction found from the loss: with a list of devices (one iterator,
or one iterator per device), a loss that is a mean over the examples and one
that adds up over them both train as StandardUpdater trains on the whole
batch, and report its main/loss; what cannot be told is refused before any
update."""
import copy

import chainer
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime import observations

import semantics_models
import staged_models
from equivalence import Concatenated, WORKERS, assert_same_params


def _iterator(batch=6, offset=0):
    data = staged_models.dataset()
    return chainer.iterators.SerialIterator(
        data[offset:] + data[:offset], batch, shuffle=False)


def train(model, make_updater, iterations=3):
    """Parameters after ``iterations`` updates and what each reported."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    updater = make_updater(optimizer)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    for name, other in getattr(updater, '_models', {}).items():
        if other is not model:  # ParallelUpdater's, as a Trainer adds them
            reporter.add_observer(name, other)
    reported = []
    try:
        for _ in range(iterations):
            observation = {}
            with reporter.scope(observation):
                updater.update()
            reported.append(observation)
    finally:
        updater.finalize()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return params, reported, updater


def _value(value):
    if isinstance(value, chainer.Variable):
        value = value.array
    return numpy.asarray(value, dtype=numpy.float64)


def assert_same_reports(expected, actual, keys):
    for want, got in zip(expected, actual):
        for key in keys:
            numpy.testing.assert_allclose(_value(got[key]),
                                          _value(want[key]), rtol=1e-5,
                                          err_msg=key)
            assert type(got[key]) is type(want[key]), key


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('sum_loss', [True, False])
def test_default_reduction_trains_as_standard_updater(workers, sum_loss):
    model = semantics_models.CountingClassifier(sum_loss)
    expected, expected_reports, _ = train(
        copy.deepcopy(model),
        lambda optimizer: updaters.StandardUpdater(_iterator(), optimizer))
    actual, reports, updater = train(model, lambda optimizer:
                                     cgdp_chainer.CGDPUpdater(
                                         _iterator(), optimizer,
                                         ['@numpy'] * 2, workers=workers))
    assert updater.reduction == ('sum' if sum_loss else 'mean')
    assert_same_params(expected, actual)
    assert_same_reports(expected_reports, reports,
                        ['main/loss', 'main/correct', 'main/total'])


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('sum_loss', [True, False])
def test_iterator_list_trains_as_one_device_on_the_concatenated_batches(
        workers, sum_loss):
    # Batches of 4 and 2 examples: the shares weigh 2/3 and 1/3.
    model = semantics_models.CountingClassifier(sum_loss)
    expected, expected_reports, _ = train(
        copy.deepcopy(model), lambda optimizer: updaters.StandardUpdater(
            Concatenated([_iterator(4), _iterator(2, offset=12)]),
            optimizer))
    actual, reports, updater = train(model, lambda optimizer:
                                     cgdp_chainer.CGDPUpdater(
                                         [_iterator(4),
                                          _iterator(2, offset=12)],
                                         optimizer, ['@numpy'] * 2,
                                         workers=workers))
    assert updater.reduction == ('sum' if sum_loss else 'mean')
    assert_same_params(expected, actual)
    assert_same_reports(expected_reports, reports,
                        ['main/loss', 'main/correct', 'main/total'])


def test_what_was_found_is_said_once(capsys):
    train(semantics_models.CountingClassifier(sum_loss=True),
          lambda optimizer: cgdp_chainer.CGDPUpdater(
              _iterator(), optimizer, ['@numpy'] * 2, workers='thread'))
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith('CGDP reduction')]
    assert len(lines) == 1
    assert "'sum'" in lines[0] and 'their sum is' in lines[0]


def test_an_explicit_reduction_skips_the_check(capsys):
    model = semantics_models.ZeroLoss()
    before = {name: p.array.copy() for name, p in model.namedparams()}
    _, _, updater = train(model, lambda optimizer: cgdp_chainer.CGDPUpdater(
        _iterator(), optimizer, ['@numpy'] * 2, workers='thread',
        reduction='sum'))
    assert updater.reduction == 'sum'
    assert 'CGDP reduction' not in capsys.readouterr().out
    # Zero gradients: the parameters did not move.
    assert_same_params(before, {name: p.array for name, p in
                                model.namedparams()})


def _refused(model, match, workers='thread'):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    before = {name: p.array.copy() for name, p in model.namedparams()}
    state = numpy.random.get_state()[1].copy()
    updater = cgdp_chainer.CGDPUpdater(_iterator(), optimizer,
                                       ['@numpy'] * 2, workers=workers)
    try:
        with pytest.raises(ValueError, match=match) as info:
            updater.update()
    finally:
        updater.finalize()
    # Refused before any update, NumPy's global state as it was.
    assert updater.iteration == 0
    assert_same_params(before, {name: p.array for name, p in
                                model.namedparams()})
    numpy.testing.assert_array_equal(numpy.random.get_state()[1], state)
    message = str(info.value)
    assert "reduction='sum'" in message and "reduction='mean'" in message
    return message


@pytest.mark.parametrize('workers', WORKERS)
def test_a_loss_that_cannot_be_told_is_refused(workers):
    message = _refused(semantics_models.ZeroLoss(), 'both match', workers)
    assert 'gave the loss 0' in message


def test_a_loss_drawing_random_numbers_in_test_mode_is_refused():
    message = _refused(semantics_models.NoisyLoss(), 'neither matches')
    assert 'F.gaussian' in message and 'their sum is' in message


def test_the_dict_of_devices_keeps_parallel_updaters_sum():
    model = semantics_models.CountingClassifier(sum_loss=False)
    expected, _, _ = train(copy.deepcopy(model), lambda optimizer:
                           updaters.ParallelUpdater(
                               _iterator(), optimizer,
                               devices={'main': -1, 'second': -1}))
    actual, _, updater = train(model, lambda optimizer:
                               cgdp_chainer.CGDPUpdater(
                                   _iterator(), optimizer,
                                   {'main': -1, 'second': -1},
                                   workers='thread'))
    assert updater.reduction == 'sum'
    assert_same_params(expected, actual)


def test_probe_forwards_leave_the_model_and_random_states_as_they_were():
    model = chainer.Sequential(chainer.links.Linear(6, 4),
                               chainer.links.BatchNormalization(4),
                               lambda h: chainer.functions.dropout(h, 0.5),
                               chainer.links.Linear(4, 3))
    model.marker = 'before'
    x = numpy.random.RandomState(0).normal(size=(8, 6)).astype(numpy.float32)
    statistics = model[1].avg_mean.copy(), model[1].N
    state = numpy.random.get_state()[1].copy()

    def loss(x):
        model.marker = 'after'
        return chainer.functions.sum(model(x))

    first, second = observations.probe_forwards(model, loss, [x, x[:4]])
    assert model.marker == 'before'
    numpy.testing.assert_array_equal(model[1].avg_mean, statistics[0])
    assert model[1].N == statistics[1]
    numpy.testing.assert_array_equal(numpy.random.get_state()[1], state)
    # Deterministic (dropout off): the same forward again gives the same.
    again, = observations.probe_forwards(model, loss, [x])
    numpy.testing.assert_array_equal(first.loss.array, again.loss.array)


@pytest.mark.gpu
@pytest.mark.parametrize('workers', WORKERS)
def test_a_summed_loss_on_a_gpu_and_a_cpu_replica(workers):
    model = semantics_models.CountingClassifier(sum_loss=True)
    expected, expected_reports, _ = train(
        copy.deepcopy(model),
        lambda optimizer: updaters.StandardUpdater(_iterator(), optimizer))
    actual, reports, updater = train(model, lambda optimizer:
                                     cgdp_chainer.CGDPUpdater(
                                         _iterator(), optimizer,
                                         ['@cupy:0', '@numpy'],
                                         workers=workers))
    assert updater.reduction == 'sum'
    assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)
    for want, got in zip(expected_reports, reports):
        for key in ('main/loss', 'main/correct', 'main/total'):
            # Combined in host memory, whatever device reported them.
            assert not hasattr(got[key], 'device') or isinstance(
                got[key], chainer.Variable)
            numpy.testing.assert_allclose(_value(got[key]),
                                          _value(want[key]), rtol=1e-4)


def test_forwards_that_fail_in_test_mode_refuse_only_the_default(capsys):
    message = _refused(semantics_models.TrainOnly(), 'raised RuntimeError')
    assert 'this model trains only' in message
    # With the reduction given, the reported values go by type.
    model = semantics_models.TrainOnly()
    expected, expected_reports, _ = train(
        copy.deepcopy(model),
        lambda optimizer: updaters.StandardUpdater(_iterator(), optimizer))
    actual, reports, _ = train(model, lambda optimizer:
                               cgdp_chainer.CGDPUpdater(
                                   _iterator(), optimizer, ['@numpy'] * 2,
                                   workers='thread', reduction='mean'))
    assert_same_params(expected, actual)
    assert_same_reports(expected_reports, reports,
                        ['main/loss', 'main/correct', 'main/total'])
    assert 'by type' in capsys.readouterr().out
