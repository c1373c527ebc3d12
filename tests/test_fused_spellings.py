"""Optimizers and hooks as real scripts spell them take the fused host
update (issue 40): Chainer's deprecated hook aliases, subclasses that change
nothing of the update, CorrectedMomentumSGD, RMSprop and AdaGrad, and models
with frozen parameters.

Through ``CGDPUpdater`` (both worker kinds) against ``StandardUpdater``,
and what the optimizer form's node-shared host says where it still cannot
take an optimizer. The fused rules' arithmetic is checked against Chainer's
rule by rule in tests/test_host_update.py; under 2 MPI ranks in
tests/test_any_loop.py (the spellings script).
"""
import copy

import chainer
import chainer.links as L
from chainer import optimizer_hooks
from chainer import optimizers
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.host import fused_classes
from cgdp_chainer.runtime.host import host_update
from cgdp_chainer.runtime.host import node_host

from equivalence import WORKERS
import staged_models

ITERATIONS = 3
BATCH = 6

# name -> (optimizer, hooks): as Chainer's and ChainerCV's examples spell
# them (imagenet: CorrectedMomentumSGD; dcgan, pix2pix, pos, pspnet:
# chainer.optimizer.WeightDecay).
SPELLINGS = {
    'adam_alias_decay': (lambda: optimizers.Adam(alpha=0.01),
                         lambda: [chainer.optimizer.WeightDecay(1e-3)]),
    'corrected_momentum_alias_decay': (
        lambda: optimizers.CorrectedMomentumSGD(lr=0.05, momentum=0.9),
        lambda: [chainer.optimizer.WeightDecay(1e-3)]),
    'rmsprop_alias_lasso': (
        lambda: optimizers.RMSprop(lr=0.01, alpha=0.9),
        lambda: [chainer.optimizer.Lasso(1e-3)]),
    'adagrad_alias_clipping': (
        lambda: optimizers.AdaGrad(lr=0.05),
        lambda: [chainer.optimizer.GradientHardClipping(-0.5, 0.5)]),
}


def setup(model, spelling, freeze):
    make_optimizer, make_hooks = SPELLINGS[spelling]
    optimizer = make_optimizer()
    optimizer.setup(model)
    for hook in make_hooks():
        optimizer.add_hook(hook)
    if freeze:
        # As ChainerCV's FPN freezes its first convolution and BN.
        model.predictor.layers[0].disable_update()
    return optimizer


def train(model, spelling, freeze, make_updater):
    """Parameters and grads after training, and the updater's fused
    parameters (None for Chainer's updater)."""
    optimizer = setup(model, spelling, freeze)
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(),
                                                BATCH, shuffle=False)
    updater = make_updater(iterator, optimizer)
    fused = None
    try:
        for _ in range(ITERATIONS):
            updater.update()
        accumulator = getattr(updater, '_accumulator', None)
        if accumulator is not None:
            fused = sorted(accumulator.fused_parameters())
    finally:
        updater.finalize()
    arrays = {}
    for name, param in model.namedparams():
        arrays[name] = param.array.copy()
        arrays['grad' + name] = param.grad.copy()
    return arrays, fused


@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('freeze', [False, True], ids=['all', 'frozen'])
@pytest.mark.parametrize('spelling', sorted(SPELLINGS))
def test_spellings_train_fused_what_standard_updater_trains(
        spelling, freeze, workers):
    base = L.Classifier(staged_models.StagedMLP())
    expected, _ = train(copy.deepcopy(base), spelling, freeze,
                        updaters.StandardUpdater)
    actual, fused = train(
        copy.deepcopy(base), spelling, freeze,
        lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * 2, chunk_size=2,
            workers=workers))
    assert sorted(actual) == sorted(expected)
    for key in sorted(expected):
        numpy.testing.assert_allclose(actual[key], expected[key], rtol=1e-5,
                                      atol=1e-6, err_msg=key)
    names = sorted(n for n, _ in base.namedparams())
    frozen = ['/predictor/layers/0/W', '/predictor/layers/0/b']
    assert fused == [n for n in names if not (freeze and n in frozen)]
    if freeze:
        initial = dict(base.namedparams())
        for name in frozen:
            numpy.testing.assert_array_equal(actual[name],
                                             initial[name].array)


# -- what the node-shared host says -------------------------------------------

class HalvedDecay(optimizer_hooks.WeightDecay):
    """Changes what WeightDecay computes."""

    name = 'HalvedDecay'

    def __call__(self, rule, param):
        super(HalvedDecay, self).__call__(rule, param)
        param.grad *= 0.5


class ClippedAdam(optimizers.Adam):
    """Changes how Adam makes its rules."""

    def create_update_rule(self):
        rule = super(ClippedAdam, self).create_update_rule()
        rule.add_hook(optimizer_hooks.GradientHardClipping(-1, 1))
        return rule


def refusal(optimizer, hooks=(), customize=None):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer.setup(model)
    for hook in hooks:
        optimizer.add_hook(hook)
    if customize is not None:
        customize(model)
    node_host.prepare_rule_states(optimizer)
    return node_host.node_host_refusal(optimizer)


@pytest.mark.parametrize('make_optimizer, hooks', [
    (lambda: optimizers.Adam(), [chainer.optimizer.WeightDecay(1e-4)]),
    (lambda: optimizers.CorrectedMomentumSGD(), [chainer.optimizer.Lasso(1)]),
    (lambda: optimizers.RMSprop(), []),
    (lambda: optimizers.AdaGrad(),
     [chainer.optimizer.GradientHardClipping(-1, 1)]),
    (lambda: optimizers.AdamW(), []),
], ids=['adam', 'corrected_momentum_sgd', 'rmsprop', 'adagrad', 'adamw'])
def test_the_node_host_takes_the_spellings(make_optimizer, hooks):
    assert refusal(make_optimizer(), hooks) is None


def test_a_frozen_parameter_does_not_keep_the_node_host_off():
    def freeze(model):
        model.predictor.layers[0].disable_update()

    assert refusal(optimizers.MomentumSGD(), customize=freeze) is None


def replace_rule(model):
    model.predictor.layers[1].b.update_rule = \
        optimizers.AdaGrad().create_update_rule()


def test_a_rule_hook_without_a_fused_form_keeps_the_node_host():
    # ChainerCV's GradientScaling, say: it runs between the gradient and
    # the fused update (tests/test_host_update.py).
    def scale(model):
        model.predictor.layers[1].b.update_rule.add_hook(
            lambda rule, param: None, name='GradientScaling')

    assert refusal(optimizers.SGD(), customize=scale) is None


@pytest.mark.parametrize('make_optimizer, hooks, customize, words', [
    (lambda: optimizers.Adam(), [HalvedDecay(1e-4)], None,
     'hook HalvedDecay (a subclass of WeightDecay that overrides __call__) '
     'has no fused form'),
    (ClippedAdam, [], None,
     'ClippedAdam (a subclass of Adam that overrides create_update_rule) '
     'has no fused host rule'),
    (lambda: optimizers.SMORMS3(), [], None,
     'SMORMS3 has no fused host rule'),
    (lambda: optimizers.SGD(), [], replace_rule,
     'parameter /predictor/layers/1/b is not updated by a fused rule (its '
     'rule is AdaGradRule)'),
], ids=['changed_hook', 'changed_optimizer', 'other_optimizer',
        'replaced_rule'])
def test_where_the_node_host_cannot_it_names_the_class(
        make_optimizer, hooks, customize, words):
    assert refusal(make_optimizer(), hooks, customize) == words


def test_the_fused_form_is_decided_from_the_class_methods():
    class OwnName(optimizer_hooks.Lasso):
        name = 'OwnName'  # data, not a method: fused

        def describe(self):  # a method Lasso does not have: fused
            return 'lasso'

    class OwnAccess(optimizer_hooks.Lasso):
        @property
        def __getattribute__(self):
            return object.__getattribute__

    hooks = (optimizer_hooks.Lasso,)
    assert fused_classes.fused_as(chainer.optimizer.Lasso, hooks) is \
        optimizer_hooks.Lasso
    assert fused_classes.fused_as(OwnName, hooks) is optimizer_hooks.Lasso
    assert fused_classes.why_not(OwnAccess, hooks) == (
        'OwnAccess (a subclass of Lasso that overrides __getattribute__)')
    assert host_update.fused_rule_for(optimizers.AMSBound()).rule_type is \
        optimizers.adam.AdamRule
    assert host_update.fused_rule_for(optimizers.MSVAG()) is None
