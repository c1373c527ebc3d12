"""Models for the tests of what the updater does with the loss, the reported
values and the batch (picklable: CGDP's worker processes import them)."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import staged_models


class CountingClassifier(chainer.Chain):
    """StagedMLP with a loss that is a mean over the examples or their sum
    (``sum_loss``), reporting the loss, the correct predictions (a NumPy
    integer, as ``xp.sum`` gives) and the examples (a Python int), as the
    pos and sentiment examples report them."""

    def __init__(self, sum_loss, seed=0):
        super(CountingClassifier, self).__init__()
        self.sum_loss = sum_loss
        with self.init_scope():
            self.predictor = staged_models.StagedMLP(seed=seed)

    def forward(self, x, t):
        y = self.predictor(x)
        if self.sum_loss:
            loss = F.sum(F.softmax_cross_entropy(y, t, reduce='no'))
        else:
            loss = F.softmax_cross_entropy(y, t)
        correct = numpy.sum(y.array.argmax(axis=1) == t)
        chainer.report({'loss': loss, 'correct': correct, 'total': len(t)},
                       self)
        return loss


class ZeroLoss(CountingClassifier):
    """A loss that is zero on any batch: a sum and a mean alike."""

    def __init__(self):
        super(ZeroLoss, self).__init__(sum_loss=False)

    def forward(self, x, t):
        return 0 * super(ZeroLoss, self).forward(x, t)


class NoisyLoss(CountingClassifier):
    """Draws random numbers in any mode (``F.gaussian``), so that no two
    forwards in test mode give the same loss: noise added to the logits
    and to the loss (a noise that may drown the difference between a sum
    and a mean).

    Args:
        sum_loss (bool): The loss adds up over the examples (else a mean).
        logit_noise (float): Standard deviation of the logits' noise.
        loss_noise (float): Standard deviation of the loss's own noise.
    """

    def __init__(self, sum_loss=False, logit_noise=0.2, loss_noise=0.0):
        super(NoisyLoss, self).__init__(sum_loss=sum_loss)
        self.logit_noise = logit_noise
        self.loss_noise = loss_noise

    def forward(self, x, t):
        h = self.predictor(x)
        h = h + self.logit_noise * F.gaussian(h, self.xp.zeros_like(h.array))
        loss = F.softmax_cross_entropy(h, t, reduce='no')
        loss = F.sum(loss) if self.sum_loss else F.mean(loss)
        if self.loss_noise:
            zero = self.xp.zeros((), h.dtype)
            loss = loss + self.loss_noise * F.gaussian(zero, zero)
        return loss


class SquaredMeanLoss(CountingClassifier):
    """A deterministic loss that is neither a sum nor a mean over the
    examples: the square of their mean."""

    def __init__(self):
        super(SquaredMeanLoss, self).__init__(sum_loss=False)

    def forward(self, x, t):
        loss = super(SquaredMeanLoss, self).forward(x, t)
        return loss * loss


class TypedReports(chainer.Chain):
    """Reports one value of each type a model may report, both sums and
    means."""

    def __init__(self):
        super(TypedReports, self).__init__()
        with self.init_scope():
            self.predictor = staged_models.StagedMLP()

    def forward(self, x, t):
        y = self.predictor(x)
        loss = F.softmax_cross_entropy(y, t)
        n = len(t)
        chainer.report({
            'loss': loss,                                   # Variable, mean
            'examples': n,                                  # int, sum
            'float_sum': float(n) * 0.5,                    # float, sum
            'float_mean': float(loss.array),                # float, mean
            'classes': numpy.int32(y.shape[1]),             # numpy int, mean
            'labels': numpy.sum(t, dtype=numpy.int64),      # numpy int, sum
            'mean32': numpy.float32(loss.array),            # numpy float
            'per_class': numpy.bincount(t, minlength=y.shape[1]),  # array
            'total_variable': F.sum(y),                     # Variable, sum
        }, self)
        return loss


class PerExampleReport(CountingClassifier):
    """Reports an array with one value per example."""

    def __init__(self):
        super(PerExampleReport, self).__init__(sum_loss=False)

    def forward(self, x, t):
        loss = super(PerExampleReport, self).forward(x, t)
        chainer.report({'labels': t.copy()}, self)
        return loss


class SkipGram(chainer.Chain):
    """Chainer's word2vec example's SkipGram with its hierarchical softmax
    (``BinaryHierarchicalSoftmax``, a loss summed over the examples), or,
    with ``hsm=False``, a softmax cross entropy (a mean)."""

    def __init__(self, n_vocab=12, n_units=4, hsm=True, seed=0):
        super(SkipGram, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units, initialW=rng.uniform(
                -0.5, 0.5, (n_vocab, n_units)).astype(numpy.float32))
            if hsm:
                tree = L.BinaryHierarchicalSoftmax.create_huffman_tree(
                    {word: word + 1 for word in range(n_vocab)})
                self.loss_func = L.BinaryHierarchicalSoftmax(n_units, tree)
                self.loss_func.W.array[...] = rng.normal(
                    0, 0.3, self.loss_func.W.shape)
            else:
                self.loss_func = _SoftmaxLoss(n_units, n_vocab, rng)

    def forward(self, x, contexts):
        e = self.embed(contexts)
        batch_size, n_context, n_units = e.shape
        x = F.broadcast_to(x[:, None], (batch_size, n_context))
        e = F.reshape(e, (batch_size * n_context, n_units))
        x = F.reshape(x, (batch_size * n_context,))
        loss = self.loss_func(e, x)
        chainer.report({'loss': loss}, self)
        return loss


class _SoftmaxLoss(chainer.Chain):

    def __init__(self, n_in, n_out, rng):
        super(_SoftmaxLoss, self).__init__()
        with self.init_scope():
            self.out = L.Linear(n_in, n_out, initialW=rng.normal(
                0, 0.3, (n_out, n_in)).astype(numpy.float32))

    def forward(self, x, t):
        return F.softmax_cross_entropy(self.out(x), t)


class WindowIterator(chainer.dataset.Iterator):
    """The word2vec example's iterator: each batch is one tuple
    ``(center, contexts)`` of arrays already batched, positions in a fixed
    order (the example shuffles them with NumPy's global state)."""

    def __init__(self, words, window=2, batch_size=6):
        self.words = numpy.asarray(words, numpy.int32)
        self.window = window
        self.batch_size = batch_size
        self.order = numpy.arange(window, len(words) - window,
                                  dtype=numpy.int32)
        self.position = 0
        self.epoch = 0
        self.is_new_epoch = False

    def __next__(self):
        position = self.order[self.position:self.position + self.batch_size]
        offset = numpy.concatenate([numpy.arange(-self.window, 0),
                                    numpy.arange(1, self.window + 1)])
        contexts = self.words.take(position[:, None] + offset[None, :])
        center = self.words.take(position)
        self.position += self.batch_size
        self.is_new_epoch = self.position >= len(self.order)
        if self.is_new_epoch:
            self.epoch += 1
            self.position = 0
        return center, contexts

    @property
    def epoch_detail(self):
        return self.epoch + self.position / len(self.order)

    def serialize(self, serializer):
        self.position = serializer('position', self.position)
        self.epoch = serializer('epoch', self.epoch)


@chainer.dataset.converter()
def convert_window(batch, device):
    """The word2vec example's converter: the tuple unpacked and sent."""
    center, contexts = batch
    return device.send(center), device.send(contexts)


def words(n=40, n_vocab=12, seed=3):
    return numpy.random.RandomState(seed).randint(0, n_vocab, n)


class TrainOnly(CountingClassifier):
    """Raises outside train mode (as a forward that needs its graph, e.g.
    for ``chainer.grad``, may fail without backprop)."""

    def __init__(self):
        super(TrainOnly, self).__init__(sum_loss=False)

    def forward(self, x, t):
        if not chainer.config.train or not chainer.config.enable_backprop:
            raise RuntimeError('this model trains only')
        return super(TrainOnly, self).forward(x, t)


class PositivesLoss(chainer.Chain):
    """A regression on each example's positive entries (``mask`` 1), as
    ChainerCV's SSD multibox loss is on its positive boxes: a sum over
    them (``form='sum'``), that sum over the examples (``'mean'``, a mean
    over the examples), or over the positives (``'count'``, SSD's
    normalization). A batch without a positive gives a constant zero
    without a graph, as ``multibox_loss`` does.

    Args:
        form (str): ``'sum'``, ``'mean'`` or ``'count'``.
    """

    def __init__(self, form, n_in=4, seed=0):
        super(PositivesLoss, self).__init__()
        self.form = form
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.hidden = L.Linear(n_in, 5, initialW=rng.normal(
                0, 0.5, (5, n_in)).astype(numpy.float32))
            self.out = L.Linear(5, n_in, initialW=rng.normal(
                0, 0.5, (n_in, 5)).astype(numpy.float32))

    def forward(self, x, target, mask):
        xp = self.xp
        positives = int(mask.sum())
        if positives == 0:
            loss = chainer.Variable(xp.zeros((), numpy.float32))
        else:
            error = F.sum((self.out(F.tanh(self.hidden(x))) - target) ** 2
                          * mask)
            normalizer = {'sum': 1, 'mean': len(x),
                          'count': positives}[self.form]
            loss = error / normalizer
        chainer.report({'loss': loss}, self)
        return loss


def positives_dataset(positives, n_in=4, seed=5):
    """Examples with ``positives[i]`` positive entries (of ``n_in``)."""
    rng = numpy.random.RandomState(seed)
    n = len(positives)
    x = rng.normal(size=(n, n_in)).astype(numpy.float32)
    target = rng.normal(size=(n, n_in)).astype(numpy.float32)
    mask = numpy.zeros((n, n_in), numpy.float32)
    for i, count in enumerate(positives):
        mask[i, :count] = 1
    return chainer.datasets.TupleDataset(x, target, mask)


class WeightedPixels(chainer.Chain):
    """Per-pixel logits and softmax cross entropy with class weights that
    ignores label -1: a mean over the pixels it does not ignore, as
    ChainerCV's SegNet loss on CamVid."""

    def __init__(self, n_classes=3, seed=2):
        super(WeightedPixels, self).__init__()
        rng = numpy.random.RandomState(seed)
        self.class_weight = rng.uniform(0.5, 2.0, n_classes).astype(
            numpy.float32)
        with self.init_scope():
            self.conv = L.Convolution2D(2, n_classes, 1, initialW=rng.normal(
                0, 1, (n_classes, 2, 1, 1)).astype(numpy.float32))

    def forward(self, x, t):
        loss = F.softmax_cross_entropy(self.conv(x), t, ignore_label=-1,
                                       class_weight=self.class_weight)
        chainer.report({'loss': loss}, self)
        return loss


def pixels_dataset(ignored, n=4, size=32, seed=4):
    """Images of ``size`` x ``size`` pixels, ``ignored[i]`` of image ``i``
    (cycling) labelled -1."""
    rng = numpy.random.RandomState(seed)
    x = rng.normal(0, 1, (n, 2, size, size)).astype(numpy.float32)
    t = rng.randint(0, 3, (n, size, size)).astype(numpy.int32)
    for i in range(n):
        t[i].flat[:ignored[i % len(ignored)]] = -1
    return chainer.datasets.TupleDataset(x, t)
