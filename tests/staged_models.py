"""Small sequential networks for the runtime's tests (fast on the CPU)."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy


class StagedMLP(chainer.Chain):
    """Linear layers and ReLUs, one step each (functions are steps too)."""

    def __init__(self, sizes=(6, 10, 9, 8, 5), seed=0):
        super(StagedMLP, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.layers = chainer.ChainList(*[
                L.Linear(a, b, initialW=rng.normal(0, 0.5, (b, a)).astype(
                    numpy.float32), initial_bias=rng.normal(
                        0, 0.1, b).astype(numpy.float32))
                for a, b in zip(sizes, sizes[1:])])

    @property
    def steps(self):
        steps = []
        for i, layer in enumerate(self.layers):
            steps.append(layer)
            if i < len(self.layers) - 1:
                steps.append(F.relu)
        return steps

    def forward(self, x):
        for step in self.steps:
            x = step(x)
        return x


class _Branch(chainer.Chain):
    """Turns the carry into ``(h, aux)`` (training) like GoogLeNet's heads."""

    def __init__(self, n_in, n_out, rng):
        super(_Branch, self).__init__()
        with self.init_scope():
            self.fc = L.Linear(n_in, n_out, initialW=rng.normal(
                0, 0.5, (n_out, n_in)).astype(numpy.float32))

    def forward(self, h):
        return h, self.fc(h)


class _OnMain(chainer.Chain):
    """Applies a layer to the main element, passing the rest through."""

    def __init__(self, layer):
        super(_OnMain, self).__init__()
        with self.init_scope():
            self.layer = layer

    def forward(self, carry):
        if isinstance(carry, tuple):
            return (self.layer(carry[0]),) + carry[1:]
        return self.layer(carry)


class StagedAux(chainer.Chain):
    """A network with an auxiliary output branching off mid-way."""

    def __init__(self, seed=0):
        super(StagedAux, self).__init__()
        rng = numpy.random.RandomState(seed)

        def linear(a, b):
            return L.Linear(a, b, initialW=rng.normal(0, 0.5, (b, a)).astype(
                numpy.float32))
        with self.init_scope():
            self.s0 = _OnMain(linear(6, 8))
            self.s1 = _Branch(8, 5, rng)
            self.s2 = _OnMain(linear(8, 8))
            self.s3 = _OnMain(linear(8, 5))

    @property
    def steps(self):
        return [self.s0, self.s1, self.s2, self.s3]

    def forward(self, x):
        for step in self.steps:
            x = step(x)
        return x


def aux_loss(y, t):
    """Main loss plus 0.3 x the auxiliary loss."""
    main, aux = y
    return F.softmax_cross_entropy(main, t) + 0.3 * F.softmax_cross_entropy(
        aux, t)


def dataset(n=24, n_in=6, n_classes=5, seed=1):
    rng = numpy.random.RandomState(seed)
    x = rng.normal(size=(n, n_in)).astype(numpy.float32)
    t = rng.randint(0, n_classes, size=n).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


class Plain(chainer.Chain):
    """StagedMLP's layers behind an ordinary forward, with no steps."""

    def __init__(self):
        super(Plain, self).__init__()
        with self.init_scope():
            self.mlp = StagedMLP()

    def forward(self, x):
        return self.mlp(x)


class RaiseAt(chainer.Link):
    """A step that raises at its ``at_call``-th call on one replica."""

    def __init__(self, at_call=-1, replica=None):
        super(RaiseAt, self).__init__()
        self.at_call = at_call
        self.replica = replica
        self.calls = 0

    def forward(self, x):
        from cgdp_chainer.runtime.workers import worker
        if worker.replica_index() != self.replica:
            return x
        self.calls += 1
        if self.calls == self.at_call:
            raise RuntimeError('injected step failure')
        return x


class FaultyMLP(StagedMLP):
    """StagedMLP with a :class:`RaiseAt` step in its middle."""

    def __init__(self, at_call=-1, replica=None):
        super(FaultyMLP, self).__init__()
        with self.init_scope():
            self.fault = RaiseAt(at_call, replica)

    @property
    def steps(self):
        steps = super(FaultyMLP, self).steps
        return steps[:3] + [self.fault] + steps[3:]


class _SlowBackward(chainer.FunctionNode):
    """Identity whose backward takes ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        import time
        time.sleep(self.seconds)
        return grad_outputs[0],


class SlowBackwardStage(chainer.Link):
    """A step whose backward sleeps (to make a chunk's backward long)."""

    def __init__(self, seconds):
        super(SlowBackwardStage, self).__init__()
        self.seconds = seconds

    def forward(self, x):
        return _SlowBackward(self.seconds).apply((x,))[0]


class SlowInputSideMLP(StagedMLP):
    """StagedMLP whose second step (in chunk 0 for chunk sizes of 2 or
    more) has a slow backward."""

    def __init__(self, seconds=0.3):
        super(SlowInputSideMLP, self).__init__()
        with self.init_scope():
            self.slow = SlowBackwardStage(seconds)

    @property
    def steps(self):
        steps = super(SlowInputSideMLP, self).steps
        return steps[:1] + [self.slow] + steps[1:]


class SlowLaterStage(chainer.Link):
    """A step whose forward sleeps from its second call on."""

    def __init__(self, seconds):
        super(SlowLaterStage, self).__init__()
        self.seconds = seconds
        self.calls = 0

    def forward(self, x):
        import time
        self.calls += 1
        if self.calls > 1:
            time.sleep(self.seconds)
        return x


class SlowLaterMLP(StagedMLP):
    """StagedMLP whose iterations after the first last ``seconds`` more."""

    def __init__(self, seconds):
        super(SlowLaterMLP, self).__init__()
        with self.init_scope():
            self.slow = SlowLaterStage(seconds)

    @property
    def steps(self):
        steps = super(SlowLaterMLP, self).steps
        return steps[:1] + [self.slow] + steps[1:]


class BlasProbe(chainer.Link):
    """Reports the BLAS threads of the replica that runs it."""

    def forward(self, x):
        import threadpoolctl
        threads = [info['num_threads'] for info in
                   threadpoolctl.threadpool_info()
                   if info.get('user_api') == 'blas']
        chainer.report({'blas_threads': float(max(threads))}, self)
        return x


class ProbedMLP(StagedMLP):
    """StagedMLP with a :class:`BlasProbe` step first."""

    def __init__(self):
        super(ProbedMLP, self).__init__()
        with self.init_scope():
            self.probe = BlasProbe()

    @property
    def steps(self):
        return [self.probe] + super(ProbedMLP, self).steps


class ModelAuxLoss(object):
    """``loss_func(x, t)`` as StandardUpdater takes it, holding the model:
    :func:`aux_loss` of its output."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x, t):
        return aux_loss(self.model(x), t)
