"""Tests of cgdp_chainer.runtime.replica.readiness: gradients identical to
loss.backward(), each parameter reported right after its last consumer's
backward, chunk plans, the chunk-wait link hook, refusals and lazy init."""
import copy
import threading

import numpy
import pytest

import models  # NOQA: imports the compat module before Chainer
import chainer
import chainer.computational_graph
import chainer.functions as F
import chainer.links as L

from cgdp_chainer.runtime.replica import readiness


# ---------------------------------------------------------------- helpers

def _grads(model):
    return {name: None if p.grad is None else p.grad.copy()
            for name, p in model.namedparams()}


def _assert_same_grads(expected, actual):
    assert expected.keys() == actual.keys()
    for name in expected:
        if expected[name] is None:
            assert actual[name] is None, name
        else:
            assert actual[name] is not None, name
            # Bitwise: the same accumulation order gives the same bits.
            assert actual[name].dtype == expected[name].dtype, name
            assert numpy.array_equal(actual[name], expected[name]), name


class _Events(chainer.FunctionHook):
    """Records each function's backward and, through on_ready, each ready
    parameter, in the order they happen."""

    name = 'ReadinessEvents'

    def __init__(self):
        self.events = []

    def backward_preprocess(self, function, in_data, out_grad):
        self.events.append(('start', function))

    def backward_postprocess(self, function, in_data, out_grad):
        self.events.append(('done', function))


def _consumers(loss, model):
    """Parameter name -> function nodes taking it, from Chainer's own
    computational graph builder (independent of the traversal)."""
    graph = chainer.computational_graph.build_computational_graph([loss])
    names = {id(p.node): n for n, p in model.namedparams()}
    consumers = {}
    for tail, head in graph.edges:
        if isinstance(tail, chainer.variable.VariableNode) and \
                id(tail) in names:
            consumers.setdefault(names[id(tail)], set()).add(head)
    return consumers


def _check_readiness(model, make_loss, prior_grads=False, **backward_kw):
    """Runs loss.backward() and the readiness backward on the same forward
    and checks equality, the ready order and finality at the callback."""
    params = dict(model.namedparams())
    if not prior_grads:
        model.cleargrads()
    start = _grads(model)
    numpy.random.seed(0)  # the same dropout masks in both forwards
    loss = make_loss()
    loss.backward(**backward_kw)
    expected = _grads(model)

    for name, p in params.items():
        p.grad = None if start[name] is None else start[name].copy()
    numpy.random.seed(0)
    loss = make_loss()
    consumers = _consumers(loss, model)
    hook = _Events()
    at_callback = {}

    def on_ready(name, used):
        assert name not in at_callback, 'reported twice: ' + name
        grad_var = params[name].grad_var
        at_callback[name] = (used, grad_var, None if grad_var is None
                             else grad_var.array.copy())
        hook.events.append(('ready', name))

    engine = readiness.ReadinessBackward(model.namedparams())
    with hook:
        report = engine.backward(loss, on_ready, **backward_kw)
    actual = _grads(model)
    _assert_same_grads(expected, actual)

    assert sorted(report.order) == sorted(params)
    assert set(report.unused) == set(params) - set(consumers)
    assert report.order[:len(report.unused)] == report.unused
    for name, (used, grad_var, array) in at_callback.items():
        assert used == (name not in report.unused)
        # Final at the callback: the very object kept, with the same values.
        assert params[name].grad_var is grad_var, name
        if array is not None:
            assert numpy.array_equal(array, expected[name]), name

    # Reported right after the last consumer's backward: every consumer
    # done, and no other function's backward started in between. A
    # parameter whose consumers the backward never visits (no gradient
    # reached them) is reported after the whole backward.
    done = set()
    last_event = None
    last_done = max(i for i, (kind, _) in enumerate(hook.events)
                    if kind == 'done')
    for i, event in enumerate(hook.events):
        kind, what = event
        if kind == 'done':
            done.add(what)
        elif kind == 'ready' and what not in report.unused:
            assert consumers[what] <= done or i > last_done, what
            assert last_event[0] in ('done', 'ready'), what
        last_event = event
    return report, loss


# ---------------------------------------------------------------- models

class Branchy(chainer.Chain):
    """A skip connection, a link called twice (tied weight), a Parameter
    registered on the Chain itself, an unused link and a branch that depends
    on a flag."""

    def __init__(self):
        super(Branchy, self).__init__()
        rng = numpy.random.RandomState(3)
        with self.init_scope():
            self.l1 = L.Linear(4, 5, initialW=rng.randn(5, 4) * 0.5)
            self.l2 = L.Linear(5, 5, initialW=rng.randn(5, 5) * 0.5)
            self.l3 = L.Linear(5, 3, initialW=rng.randn(3, 5) * 0.5)
            self.extra = L.Linear(5, 5, initialW=rng.randn(5, 5) * 0.5)
            self.unused = L.Linear(3, 3)
            self.scale = chainer.Parameter(
                numpy.linspace(0.5, 1.5, 5).astype(numpy.float32))
        self.use_extra = True

    def forward(self, x):
        h = F.relu(self.l1(x))
        skip = h
        h = self.l2(h) * F.broadcast_to(self.scale, h.shape)
        h = self.l2(F.tanh(h))
        if self.use_extra:
            h = h + self.extra(skip)
        h = h + skip
        return F.sum(self.l3(h) ** 2)


class Nested(chainer.Chain):
    """A Chain with a Parameter of its own and a child Chain."""

    def __init__(self):
        super(Nested, self).__init__()
        with self.init_scope():
            self.inner = Inner()
            self.out = L.Linear(3, 2)
            self.bias = chainer.Parameter(numpy.ones(3, numpy.float32))

    def forward(self, x):
        h = self.inner(x) + F.broadcast_to(self.bias, (x.shape[0], 3))
        return F.sum(self.out(h))


class Inner(chainer.Chain):

    def __init__(self):
        super(Inner, self).__init__()
        with self.init_scope():
            self.a = L.Linear(4, 3)
            self.gain = chainer.Parameter(numpy.full(3, 2, numpy.float32))

    def forward(self, x):
        return self.a(x) * F.broadcast_to(self.gain, (x.shape[0], 3))


def _x(shape, seed=0):
    return numpy.random.RandomState(seed).uniform(
        -1, 1, shape).astype(numpy.float32)


# ---------------------------------------------------------------- gradients

def test_branchy_model_gradients_order_and_unused():
    model = Branchy()
    x = _x((6, 4))
    report, _ = _check_readiness(model, lambda: model(x))
    assert set(report.unused) == {'/unused/W', '/unused/b'}
    # The output layer is ready first; the tied l2 only after its first
    # (forward-order) use's backward.
    used = report.order[len(report.unused):]
    assert used.index('/l3/W') < used.index('/l2/W') < used.index('/l1/W')


def test_branch_that_depends_on_a_flag():
    model = Branchy()
    x = _x((6, 4), seed=1)
    model.use_extra = False
    report, _ = _check_readiness(model, lambda: model(x))
    assert set(report.unused) == {'/unused/W', '/unused/b', '/extra/W',
                                  '/extra/b'}
    model.use_extra = True
    report, _ = _check_readiness(model, lambda: model(x))
    assert set(report.unused) == {'/unused/W', '/unused/b'}


class _CutGradient(chainer.FunctionNode):
    """Identity whose backward gives no gradient: what lies behind it is in
    the graph but never visited by the backward."""

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        return None,


def test_parameter_behind_a_cut_gradient_is_still_reported():
    model = Branchy()
    x = _x((3, 4))

    def make_loss():
        cut, = _CutGradient().apply((model.extra(model.l1(x)),))
        return F.sum(model.l3(model.l2(model.l1(x)))) + F.sum(cut)

    report, _ = _check_readiness(model, make_loss)
    # In the graph, so not unused; never given a gradient, as in Chainer.
    assert '/extra/W' not in report.unused
    assert model.extra.W.grad is None
    # Reported after the whole backward, with l1, whose second use is
    # behind the cut too: conservative, and correct.
    assert set(report.order[-4:]) == {'/extra/W', '/extra/b', '/l1/W',
                                      '/l1/b'}
    assert model.l1.W.grad is not None


def test_parameters_registered_on_chains():
    model = Nested()
    x = _x((5, 4))
    report, _ = _check_readiness(model, lambda: model(x))
    assert report.unused == ()
    assert {'/bias', '/inner/gain'} <= set(report.order)


def test_accumulates_into_existing_gradients():
    model = Branchy()
    x = _x((6, 4), seed=2)
    model.cleargrads()
    model(x).backward()  # gradients the next backward accumulates into
    model.unused.W.grad = numpy.ones_like(model.unused.W.array)
    _check_readiness(model, lambda: model(x), prior_grads=True)
    assert numpy.array_equal(model.unused.W.grad,
                             numpy.ones_like(model.unused.W.array))


def test_retain_grad_semantics_and_input_gradients():
    model = Branchy()
    x = chainer.Variable(_x((3, 4), seed=4))
    engine = readiness.ReadinessBackward(model.namedparams())
    for retain in (False, True):
        results = []
        for run in ('chainer', 'readiness'):
            model.cleargrads()
            x.grad = None
            h = model.l1(x)
            loss = F.sum(model.l3(F.tanh(model.l2(h))))
            if run == 'chainer':
                loss.backward(retain_grad=retain)
            else:
                engine.backward(loss, lambda name, used: None,
                                retain_grad=retain)
            results.append((x.grad.copy(),
                            None if h.grad is None else h.grad.copy()))
        (x_a, h_a), (x_b, h_b) = results
        assert numpy.array_equal(x_a, x_b)
        if retain:
            assert numpy.array_equal(h_a, h_b)
        else:
            assert h_a is None and h_b is None


def test_function_hooks_run_as_in_backward():
    model = Branchy()
    x = _x((2, 4))
    counts = []
    for run in ('chainer', 'readiness'):
        hook = chainer.function_hooks.TimerHook()
        model.cleargrads()
        loss = model(x)
        with hook:
            if run == 'chainer':
                loss.backward()
            else:
                readiness.ReadinessBackward(model.namedparams()).backward(
                    loss, lambda name, used: None)
        counts.append(sorted(label for label, _ in hook.call_history))
    assert counts[0] == counts[1] and counts[0]


def test_double_backprop_graph_is_supported():
    # A gradient penalty: the loss holds the graph of a first backward.
    model = Branchy()
    x0 = _x((4, 4), seed=5)

    def make_loss():
        x = chainer.Variable(x0)
        y = model(x)
        gx, = chainer.grad([y], [x], enable_double_backprop=True)
        return y + F.sum(gx * gx)

    report, _ = _check_readiness(model, make_loss)
    assert set(report.unused) == {'/unused/W', '/unused/b'}


def test_parameter_shared_by_two_links_reported_under_both_names():
    model = Branchy()
    model.unused.W = None
    del model.unused.W
    with model.unused.init_scope():
        model.unused.W = model.l3.W  # the same Parameter, two names
    x = _x((2, 4))
    got = []
    loss = model(x)
    readiness.ReadinessBackward(model.namedparams()).backward(
        loss, lambda name, used: got.append((name, used)))
    assert ('/l3/W', True) in got and ('/unused/W', True) in got
    assert len(got) == len(list(model.namedparams()))


def test_googlenet_with_auxiliary_heads():
    model = models.Classifier(models.get_model('googlenet', n_classes=5,
                                               seed=0))
    x = _x((2, 3, 64, 64))
    t = numpy.array([1, 3], numpy.int32)
    with chainer.using_config('train', True):
        report, _ = _check_readiness(model, lambda: model(x, t))
        with readiness.ParameterUses(model) as uses:
            model(x, t)
    aux = [n for n in report.order if 'aux' in n]
    assert aux and not set(aux) & set(report.unused)
    assert uses.outside == {}


@pytest.mark.slow
def test_resnet152_gradients_identical():
    model = models.Classifier(models.get_model('resnet152', n_classes=10,
                                               seed=0))
    x = _x((2, 3, 64, 64))
    t = numpy.array([1, 2], numpy.int32)
    report, _ = _check_readiness(model, lambda: model(x, t))
    assert len(report.order) == 468 and report.unused == ()
    with readiness.ParameterUses(model) as uses:
        model(x, t)
    assert uses.outside == {}


@pytest.mark.slow
def test_chainer_vgg16_layers_with_unused_fully_connected_layers():
    numpy.random.seed(0)
    model = L.VGG16Layers(pretrained_model=None)
    x = _x((1, 3, 64, 64))
    report, _ = _check_readiness(
        model, lambda: F.sum(model(x, layers=['pool5'])['pool5']))
    assert set(report.unused) == {
        '/fc6/W', '/fc6/b', '/fc7/W', '/fc7/b', '/fc8/W', '/fc8/b'}


# ---------------------------------------------------------------- refusals

def test_forget_is_refused_by_name():
    model = Branchy()
    x = _x((2, 4))
    h = F.forget(lambda v: F.relu(model.l1(v)), chainer.Variable(x))
    loss = F.sum(model.l3(model.l2(h)))
    model.cleargrads()
    engine = readiness.ReadinessBackward(model.namedparams())
    got = []
    with pytest.raises(readiness.UnsupportedGraphError, match='F.forget'):
        engine.backward(loss, lambda name, used: got.append(name))
    assert got == []  # refused before any parameter was handed over


class _InnerBackward(chainer.FunctionNode):
    """A function whose backward runs a backward of its own on a parameter
    the outer graph does not show (as F.forget does)."""

    def __init__(self, link):
        self.link = link

    def forward(self, inputs):
        return numpy.asarray(inputs[0] * 2, inputs[0].dtype),

    def backward(self, indexes, grad_outputs):
        with chainer.force_backprop_mode():
            F.sum(self.link(numpy.ones((1, 3), numpy.float32))).backward()
        return grad_outputs[0] * 2,


def test_gradient_set_behind_the_traversal_is_refused():
    model = Branchy()
    x = _x((2, 4))
    h = model.l1(x)
    y, = _InnerBackward(model.unused).apply((F.sum(h),))
    model.cleargrads()
    with pytest.raises(readiness.UnsupportedGraphError, match='/unused/'):
        readiness.ReadinessBackward(model.namedparams()).backward(
            y, lambda name, used: None)


def test_a_cut_off_parameter_given_its_gradient_while_the_backward_runs():
    # As the multi-node optimizer's host does: an unused parameter's chunk
    # leaves at once, and its param.grad becomes the host's array while
    # the traversal still runs (FCIS's unchain_backward() after res2).
    model = Branchy()
    x = _x((2, 4))
    h = F.relu(model.l1(x))
    h.unchain_backward()
    loss = F.sum(model.l3(model.l2(h)) ** 2)
    model.cleargrads()
    given = {}

    def on_ready(name, used):
        if not used:
            param = dict(model.namedparams())[name]
            param.grad = given[name] = numpy.zeros_like(param.array)

    report = readiness.ReadinessBackward(model.namedparams()).backward(
        loss, on_ready)
    assert {'/l1/W', '/l1/b'} <= set(report.unused)
    for name, param in model.namedparams():
        if name in given:
            assert param.grad is given[name], name
        else:
            assert param.grad is not None, name


def test_a_nested_backward_names_the_function_and_the_parameter():
    model = Branchy()
    h = model.l1(_x((2, 4)))
    y, = _InnerBackward(model.unused).apply((F.sum(h),))
    model.cleargrads()
    with pytest.raises(readiness.UnsupportedGraphError) as error:
        readiness.ReadinessBackward(model.namedparams()).backward(
            y, lambda name, used: None)
    message = str(error.value)
    assert '_InnerBackward' in message and 'LinearFunction' in message
    assert '/unused/' in message and model.unused.W.grad is None
    # The watch is gone with the traversal.
    assert 'CGDPNestedBackwardWatch' not in chainer.get_function_hooks()


@pytest.mark.parametrize('loss_scale', [None, 128.0, 3.0])
def test_loss_scale_scales_as_backward_does(loss_scale):
    reference, model = Branchy(), Branchy()
    model.copyparams(reference)
    x = _x((2, 4))
    reference.cleargrads()
    F.sum(reference.l1(x) * 3).backward(loss_scale=loss_scale)
    model.cleargrads()
    readiness.ReadinessBackward(model.namedparams()).backward(
        F.sum(model.l1(x) * 3), lambda name, used: None,
        loss_scale=loss_scale)
    expected = dict(reference.namedparams())
    for name, param in model.namedparams():
        if expected[name].grad is None:
            assert param.grad is None
            continue
        numpy.testing.assert_array_equal(param.grad, expected[name].grad)
        assert param._loss_scale == expected[name]._loss_scale == loss_scale


def test_an_error_in_on_ready_propagates():
    model = Branchy()

    def on_ready(name, used):
        if name == '/l2/W':
            raise KeyError('host refused ' + name)

    with pytest.raises(KeyError, match='host refused /l2/W'):
        readiness.ReadinessBackward(model.namedparams()).backward(
            model(_x((2, 4))), on_ready)


def test_bad_arguments():
    model = Branchy()
    with pytest.raises(ValueError, match='named_params'):
        readiness.ReadinessBackward([('/a', 1)])
    with pytest.raises(ValueError, match='repeats'):
        p = chainer.Parameter(numpy.zeros(1, numpy.float32))
        readiness.ReadinessBackward([('/a', p), ('/a', p)])
    engine = readiness.ReadinessBackward(model.namedparams())
    with pytest.raises(ValueError, match='loss must be'):
        engine.backward(numpy.zeros(()), lambda n, u: None)
    with pytest.raises(ValueError, match='on_ready'):
        engine.backward(model(_x((1, 4))), None)


# ---------------------------------------------------------------- chunk plans

def _branchy_report():
    model = Branchy()
    model.cleargrads()
    loss = model(_x((2, 4)))
    return model, readiness.ReadinessBackward(model.namedparams()).backward(
        loss, lambda name, used: None)


def test_chunk_plan_by_layer_count():
    model, report = _branchy_report()
    plan = readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, chunk_size=2)
    # Layers: l3, '/' (scale), l2, extra, l1 in backward order, then the
    # unused link last.
    assert plan.layers[0][0] == '/l3'
    assert plan.layers[-1][-1] == '/unused'
    assert [len(c) for c in plan.layers] == [2, 2, 2]
    assert plan.n_chunks == 3
    assert plan.fingerprint.startswith('3 chunks of 2x3 layers, sha256 ')
    assert sorted(plan.chunk_of) == sorted(n for n, _ in model.namedparams())
    for i, chunk in enumerate(plan.chunks):
        for name in chunk:
            assert plan.chunk_of[name] == i
            assert plan.chunk_of_layer[readiness.owner_of(name)] == i
    assert plan.chunk_of['/scale'] == plan.chunk_of_layer['/']
    one = readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, chunk_size=100)
    assert one.n_chunks == 1


def test_chunk_plan_by_bytes_and_boundaries():
    model, report = _branchy_report()
    nbytes = readiness.parameter_nbytes(model.namedparams())
    plan = readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, chunk_bytes=100, nbytes=nbytes)
    for chunk in plan.chunks[:-1]:
        total = sum(nbytes[n] for n in chunk)
        assert total >= 100
        # Without its last layer the chunk would be under the threshold.
        layer = readiness.owner_of(chunk[-1])
        assert total - sum(nbytes[n] for n in chunk
                           if readiness.owner_of(n) == layer) < 100
    plan = readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, boundaries=[1, 4])
    assert [len(c) for c in plan.layers] == [1, 3, 2]
    with pytest.raises(ValueError, match='boundaries'):
        readiness.ChunkPlan.from_ready_order(report.order,
                                             boundaries=[4, 1])
    with pytest.raises(ValueError, match='boundaries'):
        readiness.ChunkPlan.from_ready_order(report.order, boundaries=[6])


def test_chunk_plan_bad_options():
    _, report = _branchy_report()
    with pytest.raises(ValueError, match='exactly one'):
        readiness.ChunkPlan.from_ready_order(report.order)
    with pytest.raises(ValueError, match='exactly one'):
        readiness.ChunkPlan.from_ready_order(report.order, chunk_size=1,
                                             chunk_bytes=10)
    with pytest.raises(ValueError, match='chunk_size'):
        readiness.ChunkPlan.from_ready_order(report.order, chunk_size=0)
    with pytest.raises(ValueError, match='nbytes'):
        readiness.ChunkPlan.from_ready_order(report.order, chunk_bytes=10)
    with pytest.raises(ValueError, match='once'):
        readiness.ChunkPlan.from_ready_order(report.order * 2, chunk_size=1)
    with pytest.raises(ValueError, match='not initialized'):
        readiness.parameter_nbytes(L.Linear(None, 3).namedparams())


def test_chunk_readiness_reports_each_chunk_after_its_last_parameter():
    model = Branchy()
    x = _x((2, 4), seed=3)
    model.cleargrads()
    first = readiness.ReadinessBackward(model.namedparams()).backward(
        model(x), lambda name, used: None)
    plan = readiness.ChunkPlan.from_ready_order(first.order, first.unused,
                                                chunk_size=2)
    events = []
    tracker = readiness.ChunkReadiness(
        plan, lambda chunk: events.append(('chunk', chunk)))

    def on_ready(name, used):
        events.append(('param', name))
        tracker(name, used)

    for _ in range(2):  # reusable across iterations
        del events[:]
        tracker.start()
        model.cleargrads()
        readiness.ReadinessBackward(model.namedparams()).backward(
            model(x), on_ready)
        assert tracker.complete
        chunks = [c for kind, c in events if kind == 'chunk']
        assert sorted(chunks) == list(range(plan.n_chunks))
        for i, (kind, what) in enumerate(events):
            if kind == 'chunk':
                before = {n for k, n in events[:i] if k == 'param'}
                assert set(plan.chunks[what]) <= before
                # Reported at once: its last parameter came just before.
                assert events[i - 1][1] in plan.chunks[what]
    with pytest.raises(ValueError, match='not in the chunk plan'):
        tracker('/nothing/W', True)


def test_chunk_plans_compare_between_replicas():
    model, report = _branchy_report()
    replica = copy.deepcopy(model)
    replica.cleargrads()
    other = readiness.ReadinessBackward(replica.namedparams()).backward(
        replica(_x((2, 4), seed=9)), lambda name, used: None)
    a = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                             chunk_size=2)
    b = readiness.ChunkPlan.from_ready_order(other.order, other.unused,
                                             chunk_size=2)
    assert a == b and a.fingerprint == b.fingerprint
    a.check_same([a.fingerprint, b.fingerprint])
    c = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                             chunk_size=3)
    assert c != a and c.fingerprint != a.fingerprint
    with pytest.raises(RuntimeError, match='rank 1'):
        a.check_same([a.fingerprint, c.fingerprint], what='rank')


# ---------------------------------------------------------------- link hook

class _Gates(object):
    """wait(chunk) blocks on that chunk's event; records the calls."""

    def __init__(self, n):
        self.events = [threading.Event() for _ in range(n)]
        self.calls = []
        self.lock = threading.Lock()
        self.called = threading.Condition(self.lock)

    def wait(self, chunk):
        with self.called:
            self.calls.append(chunk)
            self.called.notify_all()
        assert self.events[chunk].wait(timeout=30), 'gate never opened'

    def wait_for_calls(self, n):
        with self.called:
            assert self.called.wait_for(lambda: len(self.calls) >= n,
                                        timeout=30)
            return list(self.calls)


def _forward_in_thread(target):
    errors = []
    result = []

    def run():
        try:
            result.append(target())
        except BaseException as e:  # surfaced in the test's thread
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors, result


@pytest.mark.parametrize('registration', ['install', 'with'])
def test_link_hook_waits_only_for_each_layers_chunk(registration):
    model = Nested()
    model.cleargrads()
    report = readiness.ReadinessBackward(model.namedparams()).backward(
        model(_x((2, 4))), lambda name, used: None)
    plan = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                                chunk_size=1)
    # Layers: '/out', '/', '/inner', '/inner/a' (four chunks).
    assert plan.n_chunks == 4
    gates = _Gates(plan.n_chunks)
    hook = readiness.ChunkWaitHook(model, plan, gates.wait)
    assert hook.chunks_of(model.out) == (plan.chunk_of_layer['/out'],)
    assert hook.chunks_of(model.inner) == (plan.chunk_of_layer['/inner'],)
    x = _x((2, 4))

    def forward():
        if registration == 'with':
            with hook:
                return model(x)
        return model(x)

    if registration == 'install':
        hook.install()
    try:
        thread, errors, result = _forward_in_thread(forward)
        # Forward order of the calls: model ('/'), inner, inner/a, out.
        expected = [plan.chunk_of_layer[p]
                    for p in ('/', '/inner', '/inner/a', '/out')]
        for i, chunk in enumerate(expected):
            calls = gates.wait_for_calls(i + 1)
            assert calls == expected[:i + 1]
            # Blocked on this chunk alone: no further layer has started.
            assert not result
            gates.events[chunk].set()
        thread.join(timeout=30)
        assert not thread.is_alive() and not errors
        assert gates.calls == expected
        assert result and result[0].array == model(x).array
    finally:
        for event in gates.events:
            event.set()
        if registration == 'install':
            hook.uninstall()
    assert not model.out.local_link_hooks


class UsesOutside(chainer.Chain):
    """A parent using a child's weight without calling the child."""

    def __init__(self):
        super(UsesOutside, self).__init__()
        with self.init_scope():
            self.first = L.Linear(4, 3)
            self.proj = L.Linear(3, 3)
            self.last = L.Linear(3, 2)

    def forward(self, x):
        h = self.first(x)
        h = F.linear(h, self.proj.W)  # self.proj is never called
        return F.sum(self.last(h))


def test_parameter_uses_outside_their_link_are_waited_for():
    model = UsesOutside()
    x = _x((2, 4))
    with readiness.ParameterUses(model) as uses:
        loss = model(x)
    assert uses.outside == {'/proj/W': '/'}
    model.cleargrads()
    report = readiness.ReadinessBackward(model.namedparams()).backward(
        loss, lambda name, used: None)
    assert report.unused == ('/proj/b',)
    plan = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                                chunk_size=1)
    without = readiness.ChunkWaitHook(model, plan, lambda chunk: None)
    assert without.chunks_of(model) == ()
    gates = _Gates(plan.n_chunks)
    hook = readiness.ChunkWaitHook(model, plan, gates.wait, uses=uses)
    assert hook.chunks_of(model) == (plan.chunk_of['/proj/W'],)
    hook.install()
    try:
        thread, errors, result = _forward_in_thread(lambda: model(x))
        # The root's call waits for proj's chunk before anything runs.
        assert gates.wait_for_calls(1) == [plan.chunk_of['/proj/W']]
        assert not result
        for event in gates.events:
            event.set()
        thread.join(timeout=30)
        assert not thread.is_alive() and not errors and result
    finally:
        for event in gates.events:
            event.set()
        hook.uninstall()


def test_parameter_used_outside_every_link_call_is_refused():
    model = UsesOutside()
    x = _x((2, 4))
    with readiness.ParameterUses(model) as uses:
        loss = F.sum(F.linear(model.first(x), model.proj.W))
    assert uses.outside == {'/proj/W': None}
    report = readiness.ReadinessBackward(model.namedparams()).backward(
        loss, lambda name, used: None)
    plan = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                                chunk_size=1)
    with pytest.raises(ValueError, match='/proj/W'):
        readiness.ChunkWaitHook(model, plan, lambda chunk: None, uses=uses)


def test_parameter_uses_of_ordinary_models_are_empty():
    for model in (Branchy(), Nested()):
        with readiness.ParameterUses(model) as uses:
            model(_x((2, 4)))
        assert uses.outside == {}


def test_link_hook_refuses_a_plan_of_another_model():
    model, report = _branchy_report()
    plan = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                                chunk_size=1)
    with pytest.raises(ValueError, match='not in the chunk plan'):
        readiness.ChunkWaitHook(Nested(), plan, lambda chunk: None)


# ---------------------------------------------------------------- lazy init

class LazyMLP(chainer.Chain):
    """Chainer's MNIST example's MLP, with dropout drawing between the lazy
    initializations."""

    def __init__(self):
        super(LazyMLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 6)
            self.l2 = L.Linear(None, 5)
            self.l3 = L.Linear(None, 3)

    def forward(self, x):
        h = F.dropout(F.relu(self.l1(x)), 0.5)
        h = F.dropout(F.relu(self.l2(h)), 0.5)
        return self.l3(h)


def _lazy_data():
    rng = numpy.random.RandomState(7)
    return [(rng.rand(8).astype(numpy.float32), numpy.int32(i % 3))
            for i in range(8)]


def test_lazy_init_equals_standard_updater():
    data = _lazy_data()
    numpy.random.seed(11)
    reference = L.Classifier(LazyMLP())
    optimizer = chainer.optimizers.SGD(lr=0)  # keeps the initial values
    optimizer.setup(reference)
    iterator = chainer.iterators.SerialIterator(data, 8, shuffle=False)
    chainer.training.updaters.StandardUpdater(iterator, optimizer).update()
    reference_state = numpy.random.get_state()[1].copy()

    numpy.random.seed(11)
    master = L.Classifier(LazyMLP())
    assert readiness.has_uninitialized_params(master)
    in_arrays = chainer.dataset.concat_examples(data)
    loss = readiness.initialize_from_first_batch(master, in_arrays)
    assert not readiness.has_uninitialized_params(master)
    for (name, p), (_, q) in zip(master.namedparams(),
                                 reference.namedparams()):
        assert numpy.array_equal(p.array, q.array), name
    assert numpy.array_equal(numpy.random.get_state()[1], reference_state)
    assert isinstance(loss, chainer.Variable) and loss.creator is not None
    graph = chainer.computational_graph.build_computational_graph([loss])
    assert graph.nodes

    # Half the batch draws smaller dropout masks between the
    # initializations: other values, which is why the whole batch is used.
    numpy.random.seed(11)
    half = L.Classifier(LazyMLP())
    readiness.initialize_from_first_batch(
        half, chainer.dataset.concat_examples(data[:4]))
    assert numpy.array_equal(half.predictor.l1.W.array,
                             master.predictor.l1.W.array)
    assert not numpy.array_equal(half.predictor.l2.W.array,
                                 master.predictor.l2.W.array)


def test_lazy_init_refuses_a_non_variable_loss():
    with pytest.raises(ValueError, match='chainer.Variable'):
        readiness.initialize_from_first_batch(lambda x: 1.0,
                                              numpy.zeros(2))
