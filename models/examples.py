"""Example models for ``--net module:callable`` (see :mod:`models.custom`).

Each function takes no arguments and returns a :class:`chainer.Link` that
maps an image batch ``(N, 3, S, S)`` to the scores of 1000 classes (the
commands' default ``--classes``; :func:`cifar_cnn` gives 10)::

    make experiment NET=models.examples:resnet50
    python -m experiments.train --net models.examples:tiny --image-size 32

- :func:`resnet50`: Chainer's own ``L.ResNet50Layers``, untrained (built
  without downloading weights), ending in its 1000-way ``fc6``.
- :func:`tiny`: two small convolutions, a batch normalization and a linear
  layer, for quick tests and trials (any image side from 8 pixels).
- :func:`cifar_cnn`: two convolutions and a linear layer giving 10 class
  scores for 32x32 images (``--input-shape 3,32,32``), a CIFAR-sized
  model for the cost model's ``--net``.
- :func:`many_arrays`: 150 residual blocks of a 32-wide linear layer and a
  batch normalization (about ResNet-152's count of parameter arrays, with
  little compute): the short-iteration regime of ``benchmarks/runtime.py``.
"""
import chainer
import chainer.functions as F
import chainer.links as L

CLASSES = 1000


class ResNet50Scores(chainer.Chain):
    """``L.ResNet50Layers(pretrained_model=None)``, returning the scores of
    its ``fc6`` layer (global average pooling makes it take any image side
    from 32 pixels)."""

    def __init__(self):
        super(ResNet50Scores, self).__init__()
        with self.init_scope():
            self.net = L.ResNet50Layers(pretrained_model=None)

    def forward(self, x):
        """Class scores of an image batch.

        Args:
            x (chainer.Variable or array): Shape (N, 3, S, S).

        Returns:
            chainer.Variable: Shape (N, 1000).
        """
        return self.net(x, layers=['fc6'])['fc6']


class Tiny(chainer.Chain):
    """Two strided convolutions (the first batch-normalized), global
    average pooling and a linear layer.

    Args:
        n_classes (int): Scores per image.
    """

    def __init__(self, n_classes=CLASSES):
        super(Tiny, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 8, 3, stride=2, pad=1)
            self.norm1 = L.BatchNormalization(8)
            self.conv2 = L.Convolution2D(8, 16, 3, stride=2, pad=1)
            self.fc = L.Linear(16, n_classes)

    def forward(self, x):
        """Class scores of an image batch.

        Args:
            x (chainer.Variable or array): Shape (N, 3, S, S).

        Returns:
            chainer.Variable: Shape (N, n_classes).
        """
        h = F.relu(self.norm1(self.conv1(x)))
        h = F.relu(self.conv2(h))
        return self.fc(F.mean(h, axis=(2, 3)))


def resnet50():
    """Chainer's ResNet-50, untrained, giving 1000 class scores."""
    return ResNet50Scores()


def tiny():
    """A tiny convolutional network giving 1000 class scores."""
    return Tiny()


class ManyArrays(chainer.Chain):
    """Global average pooling, then ``n_blocks`` residual blocks of a
    ``width``-wide linear layer and a batch normalization, then a linear
    layer: many small parameter arrays (four a block) and little compute,
    so that an iteration's per-array work shows.

    Args:
        n_blocks (int): Residual blocks.
        width (int): Features of every block.
        n_classes (int): Scores per image.
    """

    def __init__(self, n_blocks=150, width=32, n_classes=CLASSES):
        super(ManyArrays, self).__init__()
        with self.init_scope():
            self.stem = L.Linear(3, width)
            self.blocks = chainer.ChainList(*[
                chainer.Sequential(L.Linear(width, width),
                                   L.BatchNormalization(width))
                for _ in range(n_blocks)])
            self.fc = L.Linear(width, n_classes)

    def forward(self, x):
        """Class scores of an image batch.

        Args:
            x (chainer.Variable or array): Shape (N, 3, S, S).

        Returns:
            chainer.Variable: Shape (N, n_classes).
        """
        h = self.stem(F.mean(x, axis=(2, 3)))
        for block in self.blocks:
            h = F.relu(h + block(h))
        return self.fc(h)


def many_arrays():
    """150 residual linear + batch-normalization blocks (604 parameter
    arrays) giving 1000 class scores."""
    return ManyArrays()


class CifarCNN(chainer.Chain):
    """Two 3x3 convolutions (the first batch-normalized), each followed by
    2x2 max pooling, and a linear layer: a small CNN for 32-pixel RGB
    images in 10 classes, as CIFAR-10's.

    Args:
        n_classes (int): Scores per image.
    """

    def __init__(self, n_classes=10):
        super(CifarCNN, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 16, 3, pad=1)
            self.norm1 = L.BatchNormalization(16)
            self.conv2 = L.Convolution2D(16, 32, 3, pad=1)
            self.fc = L.Linear(None, n_classes)

    def forward(self, x):
        """Class scores of an image batch.

        Args:
            x (chainer.Variable or array): Shape (N, 3, 32, 32).

        Returns:
            chainer.Variable: Shape (N, n_classes).
        """
        h = F.max_pooling_2d(F.relu(self.norm1(self.conv1(x))), 2)
        h = F.max_pooling_2d(F.relu(self.conv2(h)), 2)
        return self.fc(h)


def cifar_cnn():
    """A small CNN giving 10 class scores for 32x32 RGB images
    (``--input-shape 3,32,32``)."""
    return CifarCNN()
