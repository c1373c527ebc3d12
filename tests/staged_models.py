"""Small staged networks for the runtime's tests (fast on the CPU)."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy


class StagedMLP(chainer.Chain):
    """Linear layers and ReLUs, one stage each (functions are stages too)."""

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
    def stages(self):
        stages = []
        for i, layer in enumerate(self.layers):
            stages.append(layer)
            if i < len(self.layers) - 1:
                stages.append(F.relu)
        return stages

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
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
    def stages(self):
        return [self.s0, self.s1, self.s2, self.s3]

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
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
