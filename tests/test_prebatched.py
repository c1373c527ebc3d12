"""Batches that are not lists of examples (the word2vec example's iterator
returns one tuple ``(center, contexts)``) train as with StandardUpdater:
converted whole, every array split along its first axis; an output that
cannot be split is refused before any work, saying why."""
import collections
import copy

import chainer
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.input import batches

import semantics_models
from equivalence import WORKERS, assert_same_params


def _train(model, make_updater, iterations=3, batch_size=7):
    optimizer = chainer.optimizers.Adam(alpha=0.01)
    optimizer.setup(model)
    updater = make_updater(semantics_models.WindowIterator(
        semantics_models.words(), batch_size=batch_size), optimizer)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    losses = []
    try:
        for _ in range(iterations):
            observation = {}
            with reporter.scope(observation):
                updater.update()
            losses.append(float(observation['main/loss'].array))
    finally:
        updater.finalize()
    return ({name: p.array.copy() for name, p in model.namedparams()},
            losses, updater)


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('hsm', [True, False])
def test_a_word2vec_shaped_iterator_trains_as_standard_updater(workers,
                                                               hsm):
    # The hierarchical softmax adds up over the examples; the softmax
    # cross entropy is a mean. Batches of 7 positions: shares of 4 and 3.
    model = semantics_models.SkipGram(hsm=hsm)
    expected, expected_losses, _ = _train(
        copy.deepcopy(model), lambda iterator, optimizer:
        updaters.StandardUpdater(
            iterator, optimizer, converter=semantics_models.convert_window,
            device='@numpy'))
    actual, losses, updater = _train(
        model, lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * 2,
            converter=semantics_models.convert_window, workers=workers))
    assert updater.reduction == ('sum' if hsm else 'mean')
    assert_same_params(expected, actual)
    numpy.testing.assert_allclose(losses, expected_losses, rtol=1e-5)


class _UnevenIterator(semantics_models.WindowIterator):
    """Gives one center fewer than contexts."""

    def __next__(self):
        center, contexts = super(_UnevenIterator, self).__next__()
        return center[:-1], contexts


def test_arrays_of_different_first_dimensions_are_refused_before_work():
    model = semantics_models.SkipGram()
    before = {name: p.array.copy() for name, p in model.namedparams()}
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    updater = cgdp_chainer.CGDPUpdater(
        _UnevenIterator(semantics_models.words()), optimizer,
        ['@numpy'] * 2, converter=semantics_models.convert_window,
        workers='thread')
    try:
        with pytest.raises(ValueError) as info:
            updater.update()
    finally:
        updater.finalize()
    message = str(info.value)
    assert 'pre-batched tuple' in message
    assert '5 at the output[0]' in message and '6 at the output[1]' in message
    assert 'list of examples' in message  # what to do
    assert updater.iteration == 0
    assert_same_params(before, {name: p.array for name, p in
                                model.namedparams()})


Pair = collections.namedtuple('Pair', ('x', 't'))


def test_split_converted_keeps_the_containers():
    x = numpy.arange(10).reshape(5, 2)
    t = numpy.arange(5)
    shares, counts = batches.split_converted(
        {'pair': Pair(x, t), 'scale': 0.5}, 2, 'a batch')
    assert counts == [3, 2]
    assert isinstance(shares[1]['pair'], Pair)
    numpy.testing.assert_array_equal(shares[1]['pair'].x, x[3:])
    numpy.testing.assert_array_equal(shares[0]['pair'].t, t[:3])
    assert shares[1]['scale'] == 0.5


@pytest.mark.parametrize('converted, words', [
    ({'xs': [numpy.zeros(3), numpy.zeros(2)]}, "the output['xs'] is a list"),
    ((numpy.zeros(4), numpy.zeros(())),
     'the output[1] is an array of no dimension'),
    (numpy.array([numpy.zeros(2), None], dtype=object),
     'the output is an array of objects'),
    ((1, 'a'), 'the output holds no array'),
    (numpy.zeros(0), 'holds no example'),
])
def test_unsplittable_outputs_are_refused_naming_the_part(converted, words):
    with pytest.raises(ValueError, match='cannot split|fewer than') as info:
        batches.split_converted(converted, 2, 'a pre-batched tuple')
    assert words in str(info.value)


def test_the_iterator_list_form_concatenates_pre_batched_batches():
    # One device on the concatenation of both iterators' batches.
    model = semantics_models.SkipGram(hsm=False)
    words = semantics_models.words()

    def iterators():
        return [semantics_models.WindowIterator(words, batch_size=4),
                semantics_models.WindowIterator(words[10:], batch_size=2)]

    class Joined(chainer.dataset.Iterator):
        def __init__(self, parts):
            self.parts = parts

        def __next__(self):
            batches_ = [part.next() for part in self.parts]
            return tuple(numpy.concatenate(arrays) for arrays in
                         zip(*batches_))

        is_new_epoch = False

    def run(model, make_updater):
        optimizer = chainer.optimizers.Adam(alpha=0.01)
        optimizer.setup(model)
        updater = make_updater(optimizer)
        try:
            for _ in range(3):
                updater.update()
        finally:
            updater.finalize()
        return {name: p.array.copy() for name, p in model.namedparams()}

    expected = run(copy.deepcopy(model), lambda optimizer:
                   updaters.StandardUpdater(
                       Joined(iterators()), optimizer,
                       converter=semantics_models.convert_window,
                       device='@numpy'))
    actual = run(model, lambda optimizer: cgdp_chainer.CGDPUpdater(
        iterators(), optimizer, ['@numpy'] * 2,
        converter=semantics_models.convert_window, workers='thread'))
    assert_same_params(expected, actual)
