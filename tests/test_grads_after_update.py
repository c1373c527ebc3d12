"""The master's ``param.grad`` after ``update()``: the gradient the update
used, as StandardUpdater (ParallelUpdater for the dict form) leaves it,
whenever anything may read it; not written where nothing may."""
import models  # NOQA: imports the compat module before Chainer
import chainer
from chainer import optimizer_hooks
from chainer import training
from chainer.training import extensions
import chainer.links as L
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.host import host_update

import equivalence
import staged_models

OPTIMIZERS = {
    'momentum': lambda: chainer.optimizers.MomentumSGD(lr=0.1),  # fused
    'adam': lambda: chainer.optimizers.Adam(alpha=0.01),          # fused
    'adagrad': lambda: chainer.optimizers.AdaGrad(lr=0.1),        # fused
    'smorms3': lambda: chainer.optimizers.SMORMS3(lr=0.01),       # Chainer's
}
# Bounds that clip some of these gradients (the test checks that they do).
CLIP = 0.05


def per_parameter_hooks():
    return [optimizer_hooks.WeightDecay(1e-2),
            optimizer_hooks.GradientHardClipping(-CLIP, CLIP)]


def setup(name, hooks):
    def make(model):
        optimizer = OPTIMIZERS[name]()
        optimizer.setup(model)
        for hook in hooks():
            optimizer.add_hook(hook)
        return optimizer
    return make


def grads_per_update(make_updater, setup_optimizer, iterations=3, batch=6):
    """Trains a fresh StagedMLP; returns its gradients after each update
    and its final parameters."""
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup_optimizer(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), batch, shuffle=False)
    updater = make_updater(iterator, optimizer)
    grads = []
    try:
        for _ in range(iterations):
            updater.update()
            grads.append({name: numpy.array(p.grad)
                          for name, p in model.namedparams()})
    finally:
        updater.finalize()
    return grads, {name: p.array.copy() for name, p in model.namedparams()}


def assert_same_grads(expected, actual):
    for step, (want, got) in enumerate(zip(expected, actual)):
        assert want.keys() == got.keys()
        for name in want:
            numpy.testing.assert_allclose(
                got[name], want[name], rtol=1e-5, atol=1e-7,
                err_msg='{} after update {}'.format(name, step + 1))


def check_against(reference, cgdp, setup_optimizer):
    want_grads, want_params = grads_per_update(reference, setup_optimizer)
    got_grads, got_params = grads_per_update(cgdp, setup_optimizer)
    assert_same_grads(want_grads, got_grads)
    equivalence.assert_same_params(want_params, got_params)
    return want_grads


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('n', [1, 2])
@pytest.mark.parametrize('optimizer', sorted(OPTIMIZERS))
def test_grads_equal_standard_updaters(workers, n, optimizer):
    setup_optimizer = setup(optimizer, per_parameter_hooks)
    grads = check_against(
        equivalence.standard,
        equivalence.cgdp(n, chunk_size=1, workers=workers), setup_optimizer)
    clipped = [numpy.abs(g).max() for step in grads for g in step.values()]
    assert max(clipped) == pytest.approx(CLIP)  # the clip did clip


@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_grads_with_a_whole_gradient_hook(workers):
    def hooks():
        return [optimizer_hooks.WeightDecay(1e-2),
                optimizer_hooks.GradientClipping(0.05)]
    with pytest.warns(UserWarning, match='need the whole gradient'):
        check_against(
            equivalence.standard,
            equivalence.cgdp(2, chunk_size=1, workers=workers),
            setup('momentum', hooks))


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('n', [1, 2])
def test_summed_grads_equal_parallel_updaters(workers, n):
    devices = {'main': '@numpy', 'second': '@numpy'} if n == 2 else \
        {'main': '@numpy'}

    def cgdp(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(iterator, optimizer, devices,
                                        chunk_size=1, workers=workers)
    check_against(equivalence.parallel(n), cgdp,
                  setup('momentum', per_parameter_hooks))


@pytest.mark.parametrize('backend', ['numpy', 'off'])
def test_grads_with_the_numpy_backend_and_chainers_rules(monkeypatch,
                                                         backend):
    monkeypatch.setenv(host_update.BACKEND_VARIABLE, backend)
    check_against(equivalence.standard,
                  equivalence.cgdp(2, chunk_size=1, workers='thread'),
                  setup('adam', per_parameter_hooks))


def parameter_statistics_log(make_updater, out, iterations=3):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup('momentum', per_parameter_hooks)(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = make_updater(iterator, optimizer)
    trainer = training.Trainer(updater, (iterations, 'iteration'), out=out)
    trainer.extend(extensions.ParameterStatistics(
        model, trigger=(1, 'iteration')))
    log = extensions.LogReport(trigger=(1, 'iteration'))
    trainer.extend(log)
    trainer.run()
    return log.log


@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_parameter_statistics_report_standard_updaters_gradients(workers,
                                                                 tmp_path):
    want = parameter_statistics_log(equivalence.standard,
                                    str(tmp_path / 'standard'))
    got = parameter_statistics_log(
        equivalence.cgdp(2, chunk_size=1, workers=workers),
        str(tmp_path / 'cgdp'))
    assert len(want) == len(got) == 3
    keys = [key for key in want[0] if '/grad/' in key]
    assert len(keys) > 20
    for want_entry, got_entry in zip(want, got):
        for key in keys:
            assert got_entry[key] == pytest.approx(
                want_entry[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize('workers', equivalence.WORKERS)
def test_unattended_updates_leave_param_grad_unwritten(workers):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup('momentum', per_parameter_hooks)(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1, workers=workers)
    try:
        updater.update()
        updater.update()
        assert updater.grads_written == 2
        # Two replicas: the fused update of the second stored the sum.
        stored = updater._accumulator.fused_grad_writes
        assert stored > 0
        with updater.unattended():
            updater.update()
            updater.update()
        assert updater.grads_written == 2
        # The fused update stored no gradient (param.grad, the first
        # replica's slot, holds that replica's own gradient meanwhile).
        assert updater._accumulator.fused_grad_writes == stored
        updater.update()
        assert updater.grads_written == 3
        assert updater._accumulator.fused_grad_writes > stored
    finally:
        updater.finalize()


def only_log_report(make_updater, out, stop):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup('momentum', per_parameter_hooks)(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = make_updater(iterator, optimizer)
    trainer = training.Trainer(updater, stop, out=out)
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    trainer.extend(extensions.observe_lr())
    trainer.run()
    return updater, {name: p.grad.copy() for name, p in model.namedparams()}


# 24 examples in batches of 6: one epoch is 4 iterations.
@pytest.mark.parametrize('stop', [(4, 'iteration'), (1, 'epoch')])
def test_a_trainer_of_gradient_blind_extensions_writes_only_the_first_and_last(
        tmp_path, stop):
    _, want = only_log_report(equivalence.standard, str(tmp_path / 's'),
                              stop)
    updater, got = only_log_report(
        equivalence.cgdp(2, chunk_size=1, workers='thread'),
        str(tmp_path / 'c'), stop)
    assert updater.iteration == 4
    # The first update cannot know it runs in a loop; the last one ends it,
    # after which code may read the gradients: both wrote them.
    assert updater.grads_written == 2
    assert_same_grads([want], [got])


def test_an_unknown_extension_makes_every_update_write(tmp_path):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup('momentum', per_parameter_hooks)(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1, workers='thread')
    trainer = training.Trainer(updater, (4, 'iteration'), out=str(tmp_path))
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    norms = []
    trainer.extend(lambda t: norms.append(
        float(numpy.sum(model.predictor.layers[0].W.grad ** 2))),
        trigger=(1, 'iteration'))
    trainer.run()
    assert updater.grads_written == 4
    assert len(set(norms)) == 4


def test_gradient_classification_by_exact_type():
    from cgdp_chainer.runtime.host import master
    blind = [extensions.LogReport(), extensions.PrintReport(['epoch']),
             extensions.ProgressBar(), extensions.snapshot(),
             extensions.snapshot_object(chainer.Link(), 'x'),
             extensions.FailOnNonNumber(), extensions.observe_lr(),
             extensions.ExponentialShift('lr', 0.5),
             extensions.LinearShift('lr', (1, 0), (0, 1)),
             extensions.MicroAverage('a', 'b', 'c')]
    for extension in blind:
        assert not master.reads_gradients(extension), extension

    class MyLog(extensions.LogReport):
        pass
    readers = [extensions.ParameterStatistics(chainer.Link()), MyLog(),
               extensions.observe_value('x', lambda t: 0), lambda t: None]
    for extension in readers:
        assert master.reads_gradients(extension), extension


def first_slots(updater):
    """The first replica's flat gradient slots (no reference kept: the
    shared memory is freed only once nothing maps it)."""
    return updater._accumulator.transfers[0].slot_buffer


HOOKS = {'none': list,
         'weight_decay': lambda: [optimizer_hooks.WeightDecay(1e-2)]}


@pytest.mark.parametrize('workers', equivalence.WORKERS)
@pytest.mark.parametrize('n', [1, 2])
@pytest.mark.parametrize('optimizer,hooks', [
    ('momentum', 'none'), ('momentum', 'weight_decay'),
    ('adagrad', 'weight_decay'), ('smorms3', 'weight_decay')])
def test_param_grad_is_a_view_of_the_first_slot(workers, n, optimizer,
                                                 hooks):
    """The reduced gradient lies in the first replica's slot, which
    param.grad views: equal to StandardUpdater's after every update, and
    stored by the fused update only where the slot was not already it (one
    replica without a hook copies nothing); after finalize() it stays."""
    setup_optimizer = setup(optimizer, HOOKS[hooks])
    want, _ = grads_per_update(equivalence.standard, setup_optimizer)
    model = L.Classifier(staged_models.StagedMLP())
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    updater = equivalence.cgdp(n, chunk_size=1, workers=workers)(
        iterator, setup_optimizer(model))
    got = []
    try:
        for _ in range(len(want)):
            updater.update()
            got.append({name: numpy.array(p.grad)
                        for name, p in model.namedparams()})
            for name, p in model.namedparams():
                assert numpy.shares_memory(p.grad, first_slots(updater)), \
                    name
        stored = updater._accumulator.fused_grad_writes
    finally:
        updater.finalize()
    assert_same_grads(want, got)
    fused = optimizer != 'smorms3'
    assert (stored > 0) == (fused and (n > 1 or hooks != 'none'))
    # Taken out of the replicas' (shared) memory as it was freed.
    for name, p in model.namedparams():
        numpy.testing.assert_array_equal(p.grad, got[-1][name], name)
