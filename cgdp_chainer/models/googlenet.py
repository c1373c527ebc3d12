"""GoogLeNet (Szegedy et al. 2015, Inception v1) as blocks.

The same layers as ``chainer.links.GoogLeNet``, auxiliary classifiers
included: 13,378,280 parameters for 1000 classes. Weights start from
LeCun-uniform, as BVLC's Caffe model and ``GoogLeNet`` without a pretrained
model do.

Blocks: the stem (three convolutions with their pooling and local response
normalization), the nine inception modules (``inception_3a`` ...
``inception_5b``, each with the max pooling that follows it) and the head
(global average pooling, dropout 0.4, classifier); eleven in all.

The two auxiliary classifiers branch off after inception 4a and 4d and are
part of those blocks. In training mode (``chainer.config.train``) the
4a block turns the carry into a tuple ``(h, aux1)``, the 4d block into
``(h, aux1, aux2)``, the blocks between pass the auxiliary logits through
untouched, and the head returns ``(main, aux1, aux2)``. In evaluation mode
the auxiliary classifiers are skipped and the carry and the output stay
single variables. ``cgdp_chainer.models.Classifier`` weighs the auxiliary losses.

Global average pooling before the classifier, and adaptive average pooling
to the 4x4 grid the auxiliary classifiers are built for (the original
5x5/3 pooling gives 4x4 at 224 px), let inputs from 64x64 up share the same
parameters.
"""
import chainer
import chainer.functions as F
import chainer.links as L

from cgdp_chainer import randomness
from cgdp_chainer.models import common

NAME = 'googlenet'

# (block name, in_channels, out1, proj3, out3, proj5, out5, proj_pool,
#  max pooling after the module, auxiliary classifier after the module)
_INCEPTIONS = (
    ('inception_3a', 192, 64, 96, 128, 16, 32, 32, False, False),
    ('inception_3b', 256, 128, 128, 192, 32, 96, 64, True, False),
    ('inception_4a', 480, 192, 96, 208, 16, 48, 64, False, True),
    ('inception_4b', 512, 160, 112, 224, 24, 64, 64, False, False),
    ('inception_4c', 512, 128, 128, 256, 24, 64, 64, False, False),
    ('inception_4d', 512, 112, 144, 288, 32, 64, 64, False, True),
    ('inception_4e', 528, 256, 160, 320, 32, 128, 128, True, False),
    ('inception_5a', 832, 256, 160, 320, 32, 128, 128, False, False),
    ('inception_5b', 832, 384, 192, 384, 48, 128, 128, False, False),
)
AUX_GRID = 4


def split_carry(carry):
    """Splits a carry into the main feature map and the auxiliary logits.

    Args:
        carry (chainer.Variable or tuple): What the previous block returned.

    Returns:
        tuple: ``(h, aux_outputs)`` with ``aux_outputs`` a (maybe empty)
        tuple.
    """
    if isinstance(carry, tuple):
        return carry[0], tuple(carry[1:])
    return carry, ()


def join_carry(h, aux_outputs):
    """Inverse of :func:`split_carry`: a tuple only if there are aux outputs.

    Args:
        h (chainer.Variable): Main feature map or logits.
        aux_outputs (tuple): Auxiliary logits so far.
    """
    if aux_outputs:
        return (h,) + tuple(aux_outputs)
    return h


def _local_response_normalization(x):
    # BVLC's constants: Caffe divides alpha by the window size, Chainer
    # does not, hence alpha / 5 (as in chainer.links.GoogLeNet).
    return F.local_response_normalization(x, n=5, k=1, alpha=1e-4 / 5)


class Stem(chainer.Chain):
    """conv1 7x7/2, pool, LRN, conv2 1x1 and 3x3, LRN, pool.

    Args:
        initializers (models.common.SeededInitializers): Weight source.
    """

    def __init__(self, initializers):
        super(Stem, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(
                3, 64, 7, stride=2, pad=3,
                initialW=initializers.lecun_uniform())
            self.conv2_reduce = L.Convolution2D(
                64, 64, 1, initialW=initializers.lecun_uniform())
            self.conv2 = L.Convolution2D(
                64, 192, 3, stride=1, pad=1,
                initialW=initializers.lecun_uniform())

    def forward(self, x):
        """Computes the stem's output.

        Args:
            x (chainer.Variable): Images of shape (N, 3, H, W).

        Returns:
            chainer.Variable: Shape (N, 192, H/8, W/8) (rounded up).
        """
        common.check_input(NAME, x)
        h = F.relu(self.conv1(x))
        h = _local_response_normalization(common.max_pooling_3x3_stride2(h))
        h = F.relu(self.conv2_reduce(h))
        h = _local_response_normalization(F.relu(self.conv2(h)))
        return common.max_pooling_3x3_stride2(h)


class AuxiliaryClassifier(chainer.Chain):
    """An auxiliary classifier: pool to 4x4, 1x1 conv, two fc layers.

    Args:
        in_channels (int): Channels of the inception output it reads.
        n_classes (int): Number of output classes.
        initializers (models.common.SeededInitializers): Weight source.
    """

    def __init__(self, in_channels, n_classes, initializers):
        super(AuxiliaryClassifier, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(
                in_channels, 128, 1, initialW=initializers.lecun_uniform())
            self.fc1 = L.Linear(128 * AUX_GRID * AUX_GRID, 1024,
                                initialW=initializers.lecun_uniform())
            self.fc2 = L.Linear(1024, n_classes,
                                initialW=initializers.lecun_uniform())

    def forward(self, x):
        """Computes the auxiliary logits.

        Args:
            x (chainer.Variable): Inception output, shape (N, C, H, W).

        Returns:
            chainer.Variable: Logits, shape (N, n_classes).
        """
        h = common.adaptive_average_pooling_2d(x, AUX_GRID)
        h = F.relu(self.conv(h))
        h = F.relu(self.fc1(h))
        # The paper's 70% dropout on the auxiliary classifiers.
        h = randomness.dropout(h, ratio=0.7)
        return self.fc2(h)


class InceptionBlock(chainer.Chain):
    """One inception module, maybe followed by pooling and an aux classifier.

    Args:
        inception (chainer.links.Inception): The module.
        pool_after (bool): Apply 3x3/2 max pooling to the module's output.
        auxiliary (AuxiliaryClassifier or None): Classifier that branches
            off the module's output in training mode.
    """

    def __init__(self, inception, pool_after=False, auxiliary=None):
        super(InceptionBlock, self).__init__()
        with self.init_scope():
            self.inception = inception
            self.auxiliary = auxiliary
        self.pool_after = pool_after

    def forward(self, carry):
        """Runs the module on the main map; passes auxiliary logits through.

        Args:
            carry (chainer.Variable or tuple): ``h`` or ``(h, aux...)``.

        Returns:
            ``h'`` or ``(h', aux..., new_aux)``; a new auxiliary output is
            added only in training mode.
        """
        h, aux_outputs = split_carry(carry)
        h = self.inception(h)
        if self.auxiliary is not None and chainer.config.train:
            aux_outputs = aux_outputs + (self.auxiliary(h),)
        if self.pool_after:
            h = common.max_pooling_3x3_stride2(h)
        return join_carry(h, aux_outputs)


class Head(chainer.Chain):
    """Global average pooling, dropout 0.4 and the classifier.

    Args:
        in_channels (int): Channels of the last inception output.
        n_classes (int): Number of output classes.
        initializers (models.common.SeededInitializers): Weight source.
    """

    def __init__(self, in_channels, n_classes, initializers):
        super(Head, self).__init__()
        with self.init_scope():
            self.fc = L.Linear(in_channels, n_classes,
                               initialW=initializers.lecun_uniform())

    def forward(self, carry):
        """Computes the main logits.

        Args:
            carry (chainer.Variable or tuple): ``h`` or ``(h, aux1, aux2)``.

        Returns:
            ``main`` in evaluation mode, ``(main, aux1, aux2)`` in training
            mode.
        """
        h, aux_outputs = split_carry(carry)
        h = randomness.dropout(common.global_average_pooling_2d(h), ratio=0.4)
        return join_carry(self.fc(h), aux_outputs)


class GoogLeNet(common.SequentialNetwork):
    """GoogLeNet with auxiliary classifiers; ``blocks`` lists 11 blocks.

    Args:
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization.

    Calling the model returns ``(main, aux1, aux2)`` logits in training
    mode and ``main`` alone in evaluation mode, each (N, n_classes).
    """

    def __init__(self, n_classes=1000, seed=None):
        super(GoogLeNet, self).__init__()
        initializers = common.SeededInitializers(seed)
        self.add_block('stem', Stem(initializers))
        out_channels = 192
        for (name, in_channels, out1, proj3, out3, proj5, out5, proj_pool,
             pool_after, has_auxiliary) in _INCEPTIONS:
            inception = L.Inception(
                in_channels, out1, proj3, out3, proj5, out5, proj_pool,
                conv_init=initializers.lecun_uniform())
            out_channels = out1 + out3 + out5 + proj_pool
            auxiliary = None
            if has_auxiliary:
                auxiliary = AuxiliaryClassifier(out_channels, n_classes,
                                                initializers)
            self.add_block(name, InceptionBlock(inception, pool_after,
                                                auxiliary))
        self.add_block('head', Head(out_channels, n_classes, initializers))
