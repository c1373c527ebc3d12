"""The small models of the example-shaped scripts (picklable: CGDP's
worker processes import them)."""
import chainer
import chainer.functions as F
import chainer.links as L


class MLP(chainer.Chain):
    """train_mnist.MLP of Chainer's examples, with its input size given.

    The examples' ``L.Linear(None, n_units)`` is initialized lazily; under
    ParallelUpdater each replica then draws its own first weights for the
    first iteration, so the comparison with ParallelUpdater needs weights
    that exist before the updater copies the model.
    """

    def __init__(self, n_units, n_out, n_in=784):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


class LazyMLP(MLP):
    """train_mnist.MLP of Chainer's examples as it is: each layer infers
    its input size at its first forward (the example's single-device
    updater, StandardUpdater, initializes the one model it trains)."""

    def __init__(self, n_units, n_out):
        chainer.Chain.__init__(self)
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)


class TinyConvNet(chainer.Chain):
    """A convolution and a linear layer: the ImageNet example's shape of
    network (images in, classes out) at a size the CPU trains at once."""

    insize = 28

    def __init__(self, n_out=10):
        super(TinyConvNet, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(1, 4, 3, stride=2)
            self.fc = L.Linear(4 * 13 * 13, n_out)

    def forward(self, x, t):
        y = self.fc(F.relu(self.conv(x)))
        loss = F.softmax_cross_entropy(y, t)
        chainer.report({'loss': loss, 'accuracy': F.accuracy(y, t)}, self)
        return loss

