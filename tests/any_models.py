"""Models without stages for the any-model tests, at module level so that
worker processes can import them."""
import numpy

import chainer
import chainer.functions as F
import chainer.links as L


def _linear(rng, n_in, n_out):
    return L.Linear(n_in, n_out, initialW=rng.normal(
        0, 0.5, (n_out, n_in)).astype(numpy.float32))


class Branching(chainer.Chain):
    """Two branches joined by a skip connection; ``tied`` is applied twice
    (a tied weight, ready after its last use); ``unused`` never runs; a
    Parameter ``scale`` is registered on the Chain itself."""

    def __init__(self, seed=0, n_in=6, n_hidden=8, n_out=5):
        super(Branching, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.stem = _linear(rng, n_in, n_hidden)
            self.left = _linear(rng, n_hidden, n_hidden)
            self.right = _linear(rng, n_hidden, n_hidden)
            self.tied = _linear(rng, n_hidden, n_hidden)
            self.unused = _linear(rng, n_hidden, n_hidden)
            self.out = _linear(rng, n_hidden, n_out)
            self.scale = chainer.Parameter(
                rng.normal(1, 0.1, (n_hidden,)).astype(numpy.float32))

    def forward(self, x):
        h = F.relu(self.stem(x))
        left = F.tanh(self.left(h))
        right = F.relu(self.right(h))
        h = self.tied(F.tanh(self.tied(left + right))) + h
        h = h * F.broadcast_to(self.scale, h.shape)
        return self.out(h)


class IterationDependent(chainer.Chain):
    """Takes branch ``a`` on even calls and branch ``b`` on odd ones (each
    replica calls it once per iteration, so the branch follows the
    iteration): the graph changes from one iteration to the next."""

    def __init__(self, seed=0, n_in=6, n_hidden=8, n_out=5):
        super(IterationDependent, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.stem = _linear(rng, n_in, n_hidden)
            self.a = _linear(rng, n_hidden, n_hidden)
            self.b = _linear(rng, n_hidden, n_hidden)
            self.out = _linear(rng, n_hidden, n_out)
        self.calls = 0

    def forward(self, x):
        branch = self.a if self.calls % 2 == 0 else self.b
        self.calls += 1
        h = F.relu(self.stem(x))
        return self.out(F.relu(branch(h)))


class Unchained(chainer.Chain):
    """Cuts its graph after ``stem`` (``unchain_backward()``, as FCIS's
    extractor does after res2), so ``stem`` never gets a gradient; ``side``
    runs only without backprop, and ``a`` only on odd calls."""

    def __init__(self, seed=0, n_in=6, n_hidden=8, n_out=5):
        super(Unchained, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.stem = _linear(rng, n_in, n_hidden)
            self.side = _linear(rng, n_hidden, n_hidden)
            self.a = _linear(rng, n_hidden, n_hidden)
            self.out = _linear(rng, n_hidden, n_out)
        self.calls = 0

    def forward(self, x):
        h = F.relu(self.stem(x))
        h.unchain_backward()
        with chainer.no_backprop_mode():
            h = h + 0.1 * self.side(h).array
        if self.calls % 2 == 1:
            h = F.tanh(self.a(h))
        self.calls += 1
        return self.out(h)


class GradientScaling(object):
    """ChainerCV 0.13's update-rule hook (written here: ChainerCV is not a
    dependency): scales the gradient in place before the update."""

    name = 'GradientScaling'
    call_for_each_param = True

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, rule, param):
        g = param.grad
        with chainer.using_device(param.device):
            g *= self.rate


class MLP(chainer.Chain):
    """Chainer's MNIST example network: lazily initialized layers."""

    def __init__(self, n_units=20, n_out=10):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


class _SlowBackward(chainer.FunctionNode):
    """Identity whose backward sleeps, to make a layer's backward long."""

    def __init__(self, seconds):
        self.seconds = seconds

    def forward(self, inputs):
        return inputs

    def backward(self, indexes, grad_outputs):
        import time
        time.sleep(self.seconds)
        return grad_outputs


class SlowInputSide(chainer.Chain):
    """A plain Chain of six Linear layers whose backward through the first
    layers takes ``seconds``: the host can update the output-side chunks
    meanwhile."""

    def __init__(self, seconds=0.3, seed=0, n_in=6, n_hidden=8, n_out=5):
        super(SlowInputSide, self).__init__()
        rng = numpy.random.RandomState(seed)
        self.seconds = seconds
        with self.init_scope():
            self.l0 = _linear(rng, n_in, n_hidden)
            self.l1 = _linear(rng, n_hidden, n_hidden)
            self.l2 = _linear(rng, n_hidden, n_hidden)
            self.l3 = _linear(rng, n_hidden, n_hidden)
            self.l4 = _linear(rng, n_hidden, n_hidden)
            self.l5 = _linear(rng, n_hidden, n_out)

    def forward(self, x):
        h = F.relu(self.l0(x))
        h, = _SlowBackward(self.seconds).apply((h,))
        for link in (self.l1, self.l2, self.l3, self.l4):
            h = F.relu(link(h))
        return self.l5(h)


class Forgetting(chainer.Chain):
    """Uses F.forget, which the readiness backward refuses."""

    def __init__(self, seed=0):
        super(Forgetting, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.l1 = _linear(rng, 6, 8)
            self.l2 = _linear(rng, 8, 5)

    def forward(self, x):
        h = F.forget(lambda v: F.relu(self.l1(v)), x)
        return self.l2(h)


class VGG16At64(chainer.Chain):
    """Chainer's ``L.VGG16Layers(pretrained_model=None)`` for 64-pixel
    images: its fully connected layers take 7 x 7 maps (224 pixels), so
    they are replaced by ones sized for 2 x 2 maps and ``n_classes``."""

    def __init__(self, n_classes=10, n_hidden=64, seed=0):
        super(VGG16At64, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.net = L.VGG16Layers(pretrained_model=None)
        net = self.net
        for name in ('fc6', 'fc7', 'fc8'):
            delattr(net, name)
        with net.init_scope():
            net.fc6 = _linear(rng, 512 * 2 * 2, n_hidden)
            net.fc7 = _linear(rng, n_hidden, n_hidden)
            net.fc8 = _linear(rng, n_hidden, n_classes)

    def forward(self, x):
        return self.net(x, layers=['fc8'])['fc8']


# GoogLeNet's own pooling and fully connected layers fix its input size.
GOOGLENET_PIXELS = 224


class GoogLeNetWithAux(chainer.Chain):
    """Chainer's ``L.GoogLeNet(pretrained_model=None)`` with its two
    auxiliary heads: returns ``(main, aux1, aux2)``, as
    ``models.Classifier`` takes them."""

    def __init__(self):
        super(GoogLeNetWithAux, self).__init__()
        with self.init_scope():
            self.net = L.GoogLeNet(pretrained_model=None)

    def forward(self, x):
        out = self.net(x, layers=['loss3_fc', 'loss1_fc2', 'loss2_fc2'])
        return out['loss3_fc'], out['loss1_fc2'], out['loss2_fc2']


class ReplicaDependent(chainer.Chain):
    """Replica 1 skips ``extra`` in its first iteration: the replicas see
    different first-iteration graphs, so they would form different chunks."""

    def __init__(self, seed=0):
        super(ReplicaDependent, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.l1 = _linear(rng, 6, 8)
            self.extra = _linear(rng, 8, 8)
            self.l2 = _linear(rng, 8, 5)

    def forward(self, x):
        from cgdp_chainer.runtime.workers import worker
        h = F.relu(self.l1(x))
        if worker.replica_index() != 1:
            h = F.relu(self.extra(h))
        return self.l2(h)
