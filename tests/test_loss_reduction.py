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
from cgdp_chainer.runtime.replica import loss_reduction
from cgdp_chainer.runtime.replica import observations
from cgdp_chainer.runtime.replica import reduction_evidence

import semantics_models
import staged_models
from equivalence import Concatenated, WORKERS, assert_same_params
from log_capture import said  # NOQA: the fixture


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


def test_what_was_found_is_said_once(said):
    train(semantics_models.CountingClassifier(sum_loss=True),
          lambda optimizer: cgdp_chainer.CGDPUpdater(
              _iterator(), optimizer, ['@numpy'] * 2, workers='thread'))
    lines = [line for line in said().splitlines()
             if line.startswith('CGDP reduction')]
    assert len(lines) == 1
    assert "'sum'" in lines[0] and 'their sum is' in lines[0]


def test_an_explicit_reduction_skips_the_check(said):
    model = semantics_models.ZeroLoss()
    before = {name: p.array.copy() for name, p in model.namedparams()}
    _, _, updater = train(model, lambda optimizer: cgdp_chainer.CGDPUpdater(
        _iterator(), optimizer, ['@numpy'] * 2, workers='thread',
        reduction='sum'))
    assert updater.reduction == 'sum'
    assert 'CGDP reduction' not in said()
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


@pytest.mark.parametrize('sum_loss', [False, True])
def test_a_loss_drawing_random_numbers_is_found_within_noise(said,
                                                             sum_loss):
    # F.gaussian draws in any mode: no two forwards agree exactly, but the
    # whole batch's loss is far nearer the shares' mean (or sum) than the
    # other. Process workers: each replica draws from its own seeded
    # stream, so the run can be repeated exactly.
    def run(reduction):
        numpy.random.seed(1)
        state = numpy.random.get_state()[1].copy()
        params, _, updater = train(
            semantics_models.NoisyLoss(sum_loss), lambda optimizer:
            cgdp_chainer.CGDPUpdater(_iterator(), optimizer, ['@numpy'] * 2,
                                     reduction=reduction))
        # The probes' draws left the caller's state as it was.
        numpy.testing.assert_array_equal(numpy.random.get_state()[1], state)
        return params, updater

    found, updater = run(None)
    expected = 'sum' if sum_loss else 'mean'
    assert updater.reduction == expected
    lines = [line for line in said().splitlines()
             if line.startswith('CGDP reduction')]
    line = lines[0]
    # A mean is compared again on the two next batches (within their
    # noise too), and said once confirmed.
    assert lines[1:] == [] if sum_loss else \
        lines[1].startswith("CGDP reduction: 'mean' confirmed at iteration 3")
    assert line.startswith("CGDP reduction: {!r}, found within sampling "
                           'noise'.format(expected))
    assert 'a second forward on the whole batch' in line
    # The probes' draws did not change the replicas' streams either: the
    # same training as with the reduction given (which skips them).
    given, _ = run(expected)
    assert found.keys() == given.keys()
    for name in found:
        numpy.testing.assert_array_equal(found[name], given[name], name)


def test_a_loss_whose_noise_drowns_sum_and_mean_is_refused():
    # The loss's own noise (standard deviation 1000) is far larger than the
    # loss: neither its distance to the shares' mean nor to their sum says
    # anything.
    numpy.random.seed(2)
    message = _refused(semantics_models.NoisyLoss(loss_noise=1000.0),
                       'within the sampling noise')
    assert 'gave the loss' in message and 'their sum is' in message
    assert 'a second forward on the whole batch' in message


def test_a_deterministic_loss_that_is_neither_is_refused():
    # Neither a sum nor a mean, and the same on a second draw: no noise to
    # decide within.
    message = _refused(semantics_models.SquaredMeanLoss(),
                       'neither matches, and a second forward')
    assert 'their sum is' in message


def _noisy_comparison(whole, parts, counts):
    comparison = observations.compare(whole, parts, counts)
    assert comparison.kind == 'neither'
    return comparison


def test_within_noise_decides_by_the_nearer_kind_with_a_margin():
    # Two shares of 50 examples of a mean loss (the VAE example's first
    # batch): off the exact mean by noise, half the sum.
    parts, counts = [583.84, 585.20], [50, 50]
    mean = (parts[0] + parts[1]) / 2
    noisy_mean = _noisy_comparison(mean + 0.6, parts, counts)
    found = reduction_evidence.within_noise(noisy_mean, mean - 0.5)
    assert (found.kind, found.again) == ('mean', mean - 0.5)
    noisy_sum = _noisy_comparison(2 * mean - 0.6, parts, counts)
    assert reduction_evidence.within_noise(
        noisy_sum, 2 * mean + 1).kind == 'sum'
    # The same value again: deterministic, neither stays neither.
    same = reduction_evidence.within_noise(noisy_mean, noisy_mean.whole)
    assert same.kind == 'neither' and same.again is None
    # Two draws further apart than a quarter of the sum-mean distance: the
    # nearness tells nothing.
    margin = reduction_evidence.NOISE_MARGIN * mean
    wide = reduction_evidence.within_noise(
        noisy_mean, noisy_mean.whole + 1.1 * margin)
    assert wide.kind == 'neither' and wide.again is not None
    # Nearer the mean, but not within the margin of it.
    between = _noisy_comparison(mean + 1.1 * margin, parts, counts)
    assert reduction_evidence.within_noise(
        between, mean + 1.2 * margin).kind == 'neither'
    message = reduction_evidence.reduction_refusal(wide)
    assert 'within the sampling noise' in message
    for value in (noisy_mean.whole, wide.again, mean):
        assert '{:.7g}'.format(value) in message


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

    first, second = loss_reduction.probe_forwards(model, loss, [x, x[:4]])
    assert model.marker == 'before'
    numpy.testing.assert_array_equal(model[1].avg_mean, statistics[0])
    assert model[1].N == statistics[1]
    numpy.testing.assert_array_equal(numpy.random.get_state()[1], state)
    # Deterministic (dropout off): the same forward again gives the same.
    again, = loss_reduction.probe_forwards(model, loss, [x])
    numpy.testing.assert_array_equal(first.loss.array, again.loss.array)


def test_probe_forwards_with_a_seed_draw_others_and_put_every_state_back():
    model = chainer.links.Linear(6, 3)
    model.generator = numpy.random.RandomState(5)
    x = numpy.random.RandomState(0).normal(size=(4, 6)).astype(numpy.float32)
    generator_state = model.generator.get_state()[1].copy()
    global_state = numpy.random.get_state()[1].copy()

    def loss(x):
        # Draws from the global state and from a generator of the model's.
        y = chainer.functions.gaussian(model(x), numpy.zeros(
            (4, 3), numpy.float32))
        return chainer.functions.sum(y) + model.generator.normal()

    first, = loss_reduction.probe_forwards(model, loss, [x])
    again, = loss_reduction.probe_forwards(model, loss, [x])
    seeded, = loss_reduction.probe_forwards(model, loss, [x],
                                          seed=numpy.arange(4))
    numpy.testing.assert_array_equal(numpy.random.get_state()[1],
                                     global_state)
    numpy.testing.assert_array_equal(model.generator.get_state()[1],
                                     generator_state)
    # Each forward drew from the states as they were: the same draws; the
    # seeded one drew others.
    assert float(first.loss.array) == float(again.loss.array)
    assert float(seeded.loss.array) != float(first.loss.array)


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
            # Combined in host memory, whatever device reported them
            # (NumPy 2 arrays have a ``device`` too: ask Chainer).
            assert chainer.backend.get_array_module(got[key]) is numpy, key
            numpy.testing.assert_allclose(_value(got[key]),
                                          _value(want[key]), rtol=1e-4)


def test_forwards_that_fail_in_test_mode_refuse_only_the_default(said):
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
    assert 'by type' in said()
