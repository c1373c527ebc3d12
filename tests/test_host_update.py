"""Fused host update rules: the same numbers as Chainer's own update rules.

Every fused rule and option runs through the real HostAccumulator (replica
slots handed over by HostResidentTransfer, two chunks), and the parameters,
the optimizer state and ``t`` are compared after several iterations with a
second copy of the model updated the unfused way: the accumulator's block
reduction into ``param.grad``, the optimizer's hooks, Chainer's
``param.update()``.
"""
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.host import accumulator
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.host import host_update
from cgdp_chainer.runtime.transport import transfer
import chainer
from chainer import optimizer_hooks
from chainer import optimizers

import any_models

ITERATIONS = 4
RTOL = 1e-6
# One array above host_update.MIN_SPLIT, so chunks are split across threads.
SHAPES = {'w1': (300, 240), 'b1': (240,), 'w2': (17, 3, 3, 3), 'b2': (5,)}
CHUNKS = [['w1', 'b1'], ['w2', 'b2']]

BACKENDS = ['numpy'] + (['numba'] if host_update.numba_available() else [])

FUSED_OPTIMIZERS = {
    'sgd': lambda: optimizers.SGD(lr=0.1),
    'momentum_sgd': lambda: optimizers.MomentumSGD(lr=0.1, momentum=0.9),
    'nesterov_ag': lambda: optimizers.NesterovAG(lr=0.1, momentum=0.8),
    'adam': lambda: optimizers.Adam(alpha=0.01),
    'adam_decay': lambda: optimizers.Adam(alpha=0.01, weight_decay_rate=0.05,
                                          eta=0.5),
    'adamw': lambda: optimizers.AdamW(alpha=0.01, weight_decay_rate=0.1),
    'amsgrad': lambda: optimizers.AMSGrad(alpha=0.01, beta2=0.9),
    'adabound': lambda: optimizers.AdaBound(alpha=0.01, final_lr=0.05),
    'amsbound': lambda: optimizers.AMSBound(alpha=0.01, final_lr=0.05,
                                            gamma=0.1),
    'corrected_momentum_sgd': lambda: optimizers.CorrectedMomentumSGD(
        lr=0.1, momentum=0.9),
    'rmsprop': lambda: optimizers.RMSprop(lr=0.01, alpha=0.9),
    'rmsprop_eps_inside': lambda: optimizers.RMSprop(
        lr=0.01, alpha=0.95, eps=1e-4, eps_inside_sqrt=True),
    'adagrad': lambda: optimizers.AdaGrad(lr=0.05, eps=1e-6),
    'adadelta': lambda: optimizers.AdaDelta(rho=0.9, eps=1e-4),
    'rmsprop_graves': lambda: optimizers.RMSpropGraves(lr=0.01, alpha=0.9,
                                                       momentum=0.8),
}

# reduction, shares of the batch per slot count
REDUCTIONS = [
    ('mean', lambda n: [1.0 / n] * n),
    ('mean', lambda n: [i + 1.0 for i in range(n)]),  # unequal (normalized)
    ('sum', lambda n: [1.0 / n] * n),
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(host_update.BACKEND_VARIABLE, request.param)
    return request.param


def make_link(seed):
    rng = numpy.random.RandomState(seed)
    link = chainer.Link()
    with link.init_scope():
        for name, shape in SHAPES.items():
            setattr(link, name, chainer.Parameter(
                rng.uniform(-1, 1, shape).astype(numpy.float32)))
    return link


def make_gradients(rng, n_slots):
    return [{'/' + name: rng.uniform(-1, 1, shape).astype(numpy.float32)
             for name, shape in SHAPES.items()} for _ in range(n_slots)]


class FusedRig(object):
    """A master model updated by a HostAccumulator from replica slots."""

    def __init__(self, make_optimizer, hooks, n_slots, reduction, seed=0):
        self.model = make_link(seed)
        self.optimizer = make_optimizer()
        self.optimizer.setup(self.model)
        for hook in hooks:
            self.optimizer.add_hook(hook)
        self.chunk_names = [['/' + n for n in names] for names in CHUNKS]
        # Each chunk one slice of the flat buffers, as the runtime lays
        # them out.
        named = dict(self.model.namedparams())
        params = {name: named[name] for names in self.chunk_names
                  for name in names}
        layout = buffers.FlatLayout.of_arrays(
            {name: p.array for name, p in params.items()})
        master = buffers.FlatMaster(params, layout,
                                    buffers.host_buffer(layout.capacity))
        self.replicas = [{name: chainer.Parameter(p.array)
                          for name, p in params.items()}
                         for _ in range(n_slots)]
        self.transfers = [transfer.HostResidentTransfer(master, replica)
                          for replica in self.replicas]
        self.failures = accumulator.FailureBox()
        self.acc = accumulator.HostAccumulator(
            self.optimizer, self.transfers, self.chunk_names, reduction,
            self.failures, master, n_threads=2)
        self.iteration = 0

    def step(self, gradients, shares):
        for replica, grads in zip(self.replicas, gradients):
            for name, grad in grads.items():
                replica[name].grad = grad.copy()
        self.acc.start_iteration(self.iteration, shares)
        for chunk in reversed(range(len(self.chunk_names))):
            for device, t in enumerate(self.transfers):
                t.send_grads(self.chunk_names[chunk])
                self.acc.deliver(device, chunk, None)
        self.acc.wait()
        if self.failures.failed:
            raise self.failures.surfaced()
        self.iteration += 1

    def close(self):
        self.acc.close()


class ChainerRig(object):
    """The same model updated the unfused way, by Chainer's rules."""

    def __init__(self, make_optimizer, hooks, reduction, seed=0):
        self.model = make_link(seed)
        self.optimizer = make_optimizer()
        self.optimizer.setup(self.model)
        for hook in hooks:
            self.optimizer.add_hook(hook)
        self.reduction = reduction
        for p in self.model.params():
            p.grad = numpy.zeros_like(p.array)

    def step(self, gradients, shares):
        weights = [1.0] * len(shares) if self.reduction == 'sum' else shares
        equal = all(w == weights[0] for w in weights)
        pre, post = accumulator.optimizer_hooks(self.optimizer)
        self.optimizer.t += 1
        for name, param in self.model.namedparams():
            slots = [g[name] for g in gradients]
            if equal:
                accumulator.reduce_sum(param.grad, slots, weights[0])
            else:
                accumulator.reduce_weighted(param.grad, slots, weights)
            for hook in pre:
                hook(param.update_rule, param)
            param.update()
            for hook in post:
                hook(param.update_rule, param)


def assert_same(expected_model, actual_model):
    expected = dict(expected_model.namedparams())
    for name, param in actual_model.namedparams():
        ref = expected[name]
        numpy.testing.assert_allclose(param.array, ref.array, rtol=RTOL,
                                      atol=0, err_msg=name)
        assert param.update_rule.t == ref.update_rule.t, name
        state, ref_state = param.update_rule.state, ref.update_rule.state
        assert (state is None) == (ref_state is None), name
        if state is not None:
            assert sorted(state) == sorted(ref_state), name
            for key in state:
                numpy.testing.assert_allclose(
                    state[key], ref_state[key], rtol=RTOL, atol=0,
                    err_msg='{} {}'.format(name, key))


def normalized(shares):
    total = sum(shares)
    return [s / total for s in shares]


def run_both(make_optimizer, hooks, n_slots, reduction, shares,
             iterations=ITERATIONS, seed=1):
    rng = numpy.random.RandomState(seed)
    fused = FusedRig(make_optimizer, hooks, n_slots, reduction)
    reference = ChainerRig(make_optimizer, hooks, reduction)
    try:
        for _ in range(iterations):
            gradients = make_gradients(rng, n_slots)
            fused.step(gradients, shares)
            reference.step(gradients, shares)
        assert_same(reference.model, fused.model)
        return fused
    finally:
        fused.close()


def fused_names(rig):
    """The parameters the rig's accumulator fuses in its next update."""
    return sorted(rig.acc.fused_parameters())


@pytest.mark.parametrize('name', sorted(FUSED_OPTIMIZERS))
def test_fused_rule_equals_chainer(name, backend):
    make_optimizer = FUSED_OPTIMIZERS[name]
    for n_slots in (1, 2, 4):
        for reduction, make_shares in REDUCTIONS:
            rig = run_both(make_optimizer, [], n_slots, reduction,
                           normalized(make_shares(n_slots)))
            # After the first update (which creates the state) every
            # parameter takes the fused path.
            assert fused_names(rig) == sorted(dict(rig.model.namedparams()))


class DefaultDecay(optimizer_hooks.WeightDecay):
    """A user's spelling: WeightDecay with its rate set in ``__init__``."""

    def __init__(self):
        super(DefaultDecay, self).__init__(0.015)


HOOKS = {
    # Chainer's deprecated aliases (subclasses that warn in __init__), as
    # its dcgan, pix2pix and pos examples spell them.
    'aliases': lambda: [
        chainer.optimizer.GradientHardClipping(-0.4, 0.3),
        chainer.optimizer.WeightDecay(0.02),
        chainer.optimizer.Lasso(0.001)],
    'user_subclass': lambda: [DefaultDecay()],
    'weight_decay': lambda: [optimizer_hooks.WeightDecay(0.01)],
    'lasso': lambda: [optimizer_hooks.Lasso(0.003)],
    'hard_clipping': lambda: [
        optimizer_hooks.GradientHardClipping(-0.4, 0.3)],
    'all_in_order': lambda: [
        optimizer_hooks.GradientHardClipping(-0.4, 0.3),
        optimizer_hooks.WeightDecay(0.02),
        optimizer_hooks.Lasso(0.001)],
}


@pytest.mark.parametrize('hooks', sorted(HOOKS))
@pytest.mark.parametrize('name', ['momentum_sgd', 'adam', 'nesterov_ag',
                                  'corrected_momentum_sgd', 'rmsprop',
                                  'adagrad'])
def test_fused_hooks_equal_chainer(name, hooks, backend):
    rig = run_both(FUSED_OPTIMIZERS[name], HOOKS[hooks](), 2, 'mean',
                   [0.25, 0.75])
    assert fused_names(rig) == sorted(dict(rig.model.namedparams()))


def test_clipping_hook_changes_the_result(backend):
    # The hooks are really applied inside the fused pass: without them the
    # parameters differ.
    clip = run_both(FUSED_OPTIMIZERS['momentum_sgd'],
                    HOOKS['hard_clipping'](), 2, 'mean', [0.5, 0.5])
    plain = run_both(FUSED_OPTIMIZERS['momentum_sgd'], [], 2, 'mean',
                     [0.5, 0.5])
    assert not numpy.allclose(clip.model.w1.array, plain.model.w1.array)


class SlowAdamRule(optimizers.adam.AdamRule):
    """Adam's rule with its own NumPy update: it keeps Chainer's path."""

    def update_core_cpu(self, param):
        param.grad *= 0.5
        super(SlowAdamRule, self).update_core_cpu(param)


class SlowAdam(optimizers.Adam):
    """An Adam whose rules change the update."""

    def create_update_rule(self):
        return SlowAdamRule(self.hyperparam)


class QuietAdamRule(optimizers.adam.AdamRule):
    """Adam's rule that only sets its options in ``__init__``."""

    def __init__(self, parent_hyperparam):
        super(QuietAdamRule, self).__init__(parent_hyperparam, beta2=0.99)


class QuietAdam(optimizers.Adam):
    """An Adam subclass that sets defaults: fused as Adam."""

    def __init__(self):
        super(QuietAdam, self).__init__(alpha=0.02, beta1=0.8)


class SquaredSGDRule(optimizers.sgd.SGDRule):
    """An SGD rule whose own attribute changes the update."""

    def update_core_cpu(self, param):
        param.array -= self.hyperparam.lr * param.grad * param.grad


class SquaredSGD(optimizers.SGD):

    def create_update_rule(self):
        return SquaredSGDRule(self.hyperparam)


@pytest.mark.parametrize('make_optimizer', [
    lambda: optimizers.SMORMS3(lr=0.01),
    lambda: optimizers.MSVAG(lr=0.01),
    SlowAdam,
    SquaredSGD,
], ids=['smorms3', 'msvag', 'rule_subclass', 'changed_rule'])
def test_unfused_optimizers_equal_chainer(make_optimizer, backend):
    rig = run_both(make_optimizer, [], 2, 'mean', [0.3, 0.7])
    assert fused_names(rig) == []


def test_a_subclass_that_changes_nothing_of_the_update_is_fused(backend):
    # QuietAdam overrides only __init__ and makes its rules as Adam does;
    # a rule class that overrides only __init__ is fused as Adam's too.
    def quiet_rules():
        optimizer = QuietAdam()
        optimizer.create_update_rule = \
            lambda: QuietAdamRule(optimizer.hyperparam)
        return optimizer

    for make in (QuietAdam, quiet_rules):
        rig = run_both(make, HOOKS['user_subclass'](), 2, 'mean',
                       [0.5, 0.5])
        assert fused_names(rig) == sorted(dict(rig.model.namedparams()))
    assert type(rig.model.w1.update_rule) is QuietAdamRule


class HalvedDecay(optimizer_hooks.WeightDecay):
    """A WeightDecay subclass that changes what it computes."""

    name = 'HalvedDecay'

    def __call__(self, rule, param):
        super(HalvedDecay, self).__call__(rule, param)
        param.grad *= 0.5


class HalveGradient(object):
    """A user's own per-parameter hook: the fused pass cannot know it."""

    name = 'HalveGradient'
    call_for_each_param = True
    timing = 'pre'

    def __call__(self, rule, param):
        param.grad *= 0.5


def clipping_after_the_update():
    # A hook after the update changes only the gradient Chainer leaves
    # behind, which the fused pass does not write: such hooks are not fused.
    clipping = optimizer_hooks.GradientHardClipping(-0.5, 0.5)
    clipping.timing = 'post'
    return [optimizer_hooks.WeightDecay(0.01), clipping]


@pytest.mark.parametrize('make_hooks', [
    lambda: [optimizer_hooks.GradientLARS(threshold=1e-3,
                                          weight_decay=0.01)],
    clipping_after_the_update,
    lambda: [HalveGradient()],
    lambda: [chainer.optimizer.WeightDecay(0.01), HalvedDecay(0.01)],
], ids=['lars', 'post_timing', 'user_hook', 'changed_subclass'])
def test_unfused_hooks_equal_chainer(make_hooks, backend):
    hooks = make_hooks()
    rig = run_both(FUSED_OPTIMIZERS['adam'], hooks, 2, 'mean', [0.5, 0.5])
    assert fused_names(rig) == []


def test_whole_gradient_hook_keeps_the_deferred_update(backend):
    # Same numbers as optimizer.update() over the reduced gradients.
    reference = ChainerRig(FUSED_OPTIMIZERS['momentum_sgd'],
                           [optimizer_hooks.GradientClipping(1.0)], 'mean')
    with pytest.warns(UserWarning, match='whole gradient'):
        fused = FusedRig(FUSED_OPTIMIZERS['momentum_sgd'],
                         [optimizer_hooks.GradientClipping(1.0)], 2, 'mean')
    rng = numpy.random.RandomState(3)
    try:
        for _ in range(3):
            gradients = make_gradients(rng, 2)
            fused.step(gradients, [0.5, 0.5])
            for name, param in reference.model.namedparams():
                accumulator.reduce_sum(param.grad,
                                       [g[name] for g in gradients], 0.5)
            reference.optimizer.update()
    finally:
        fused.close()
    assert_same(reference.model, fused.model)


def test_per_parameter_exceptions_take_chainers_path(backend):
    # A replaced rule runs through Chainer, a disabled one not at all; a
    # rule with its own hook stays fused (the hook runs in between), as do
    # the other parameters.
    def customize(rig):
        rig.model.w2.update_rule.add_hook(optimizer_hooks.WeightDecay(0.1))
        rig.model.b1.update_rule = optimizers.SGD(lr=0.2).create_update_rule()
        rig.model.b2.update_rule.enabled = False

    rng = numpy.random.RandomState(4)
    make = FUSED_OPTIMIZERS['adam']
    fused = FusedRig(make, [], 2, 'mean')
    reference = ChainerRig(make, [], 'mean')
    customize(fused)
    customize(reference)
    before = fused.model.b2.array.copy()
    try:
        for _ in range(ITERATIONS):
            gradients = make_gradients(rng, 2)
            fused.step(gradients, [0.5, 0.5])
            reference.step(gradients, [0.5, 0.5])
        assert fused_names(fused) == ['/w1', '/w2']
    finally:
        fused.close()
    assert_same(reference.model, fused.model)
    numpy.testing.assert_array_equal(fused.model.b2.array, before)


class Halving(object):
    """A user's hook that gives param.grad a new array."""

    name = 'Halving'

    def __call__(self, rule, param):
        param.grad = param.grad * numpy.float32(0.5) + rule.t


class ClipAfter(object):
    """A user's post-update hook on the new values."""

    name = 'ClipAfter'

    def __call__(self, rule, param):
        numpy.clip(param.array, -0.9, 0.9, out=param.array)


@pytest.mark.parametrize('kind, shares', [('adam', [0.5, 0.5]),
                                          ('momentum_sgd', [0.25, 0.75])])
def test_rule_hooks_without_a_fused_form_keep_the_update_fused(backend,
                                                               kind, shares):
    def customize(rig):
        rig.model.w1.update_rule.add_hook(any_models.GradientScaling(3.0))
        rig.model.b2.update_rule.add_hook(any_models.GradientScaling(0.5))
        rig.model.b1.update_rule.add_hook(Halving())
        rig.model.w2.update_rule.add_hook(ClipAfter(), timing='post')

    rng = numpy.random.RandomState(5)
    make = FUSED_OPTIMIZERS[kind]
    hooks = [optimizer_hooks.WeightDecay(0.01)]
    fused = FusedRig(make, hooks, 2, 'mean')
    reference = ChainerRig(make, hooks, 'mean')
    customize(fused)
    customize(reference)
    try:
        for _ in range(ITERATIONS):
            gradients = make_gradients(rng, 2)
            fused.step(gradients, shares)
            reference.step(gradients, shares)
        # After Chainer's first update created the state, all four.
        assert fused_names(fused) == ['/b1', '/b2', '/w1', '/w2']
    finally:
        fused.close()
    assert_same(reference.model, fused.model)
    for name, param in reference.model.namedparams():
        numpy.testing.assert_allclose(
            dict(fused.model.namedparams())[name].grad, param.grad,
            rtol=RTOL, err_msg=name)


def test_snapshot_and_resume_equal_chainer(tmp_path, backend):
    make = FUSED_OPTIMIZERS['amsbound']
    rng = numpy.random.RandomState(5)
    gradients = [make_gradients(rng, 2) for _ in range(2 * ITERATIONS)]
    shares = [0.4, 0.6]
    reference = ChainerRig(make, [optimizer_hooks.WeightDecay(0.01)], 'mean')
    for g in gradients:
        reference.step(g, shares)

    first = FusedRig(make, [optimizer_hooks.WeightDecay(0.01)], 2, 'mean')
    try:
        for g in gradients[:ITERATIONS]:
            first.step(g, shares)
    finally:
        first.close()
    path = str(tmp_path / 'optimizer.npz')
    chainer.serializers.save_npz(path, first.optimizer)
    model_path = str(tmp_path / 'model.npz')
    chainer.serializers.save_npz(model_path, first.model)

    # The snapshot is Chainer's: a plain Chainer optimizer resumes from it.
    resumed = FusedRig(make, [optimizer_hooks.WeightDecay(0.01)], 2, 'mean',
                       seed=99)
    try:
        chainer.serializers.load_npz(model_path, resumed.model)
        chainer.serializers.load_npz(path, resumed.optimizer)
        assert resumed.optimizer.t == ITERATIONS
        assert sorted(resumed.model.w1.update_rule.state) == [
            'm', 'v', 'vhat']
        for g in gradients[ITERATIONS:]:
            resumed.step(g, shares)
        assert fused_names(resumed) == sorted(
            dict(resumed.model.namedparams()))
    finally:
        resumed.close()
    assert_same(reference.model, resumed.model)

    plain = ChainerRig(make, [optimizer_hooks.WeightDecay(0.01)], 'mean',
                       seed=98)
    chainer.serializers.load_npz(model_path, plain.model)
    chainer.serializers.load_npz(path, plain.optimizer)
    for g in gradients[ITERATIONS:]:
        plain.step(g, shares)
    assert_same(reference.model, plain.model)


def test_backends_agree_exactly_and_threads_do_not_matter():
    results = []
    for backend in BACKENDS:
        for threads in (1, 3):
            bench = host_update.FusedBench('adam', 3, [(200, 700), (9,)],
                                           n_threads=threads,
                                           backend=backend)
            try:
                for _ in range(3):
                    bench.fused_step()
            finally:
                bench.close()
            results.append([p.array.copy() for p in bench.params])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            numpy.testing.assert_array_equal(a, b)


def test_block_pool_splits_and_raises_errors_in_the_caller():
    pool = host_update.BlockPool(3)
    seen = []

    def record(begin, end):
        seen.append((begin, end))

    def broken(begin, end):
        if begin > 0:
            raise RuntimeError('piece failed')

    try:
        pool.run([(record, 5 * host_update.MIN_SPLIT)], 1024)
        covered = sorted(seen)
        assert len(covered) == 3
        assert covered[0][0] == 0
        assert covered[-1][1] == 5 * host_update.MIN_SPLIT
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
        with pytest.raises(RuntimeError, match='piece failed'):
            pool.run([(broken, 5 * host_update.MIN_SPLIT)], 1024)
    finally:
        pool.close()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match='auto, numba, numpy'):
        host_update.resolve_backend('fortran')
    with pytest.raises(ValueError, match='n_threads'):
        host_update.BlockPool(0)
    with pytest.raises(ValueError, match='adam'):
        host_update.make_optimizer('lamb')
    with pytest.raises(ValueError, match='n_slots'):
        host_update.FusedBench('adam', 0, [(4,)])


def test_bad_backend_variable_is_named(monkeypatch):
    monkeypatch.setenv(host_update.BACKEND_VARIABLE, 'gpu')
    optimizer = optimizers.Adam()
    optimizer.setup(make_link(0))
    with pytest.raises(ValueError, match='CGDP_HOST_UPDATE.*off'):
        host_update.make_host_update(optimizer)


def test_switched_off_runs_chainer(monkeypatch):
    monkeypatch.setenv(host_update.BACKEND_VARIABLE, 'off')
    optimizer = optimizers.Adam()
    optimizer.setup(make_link(0))
    assert host_update.make_host_update(optimizer) is None
    run_both(FUSED_OPTIMIZERS['adam'], [], 2, 'mean', [0.5, 0.5])


def test_measure_seconds_per_element():
    for name in sorted(host_update.OPTIMIZERS):
        per_element = host_update.measure_seconds_per_element(
            name, 2, n_elements=1 << 14, repeats=1)
        assert numpy.isfinite(per_element) and per_element > 0
    assert host_update.necessary_bytes('adam', 10, 4) == 4 * 10 * (4 + 6)
