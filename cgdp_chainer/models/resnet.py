"""ResNet-152 (He et al. 2016) as blocks: one bottleneck block per block.

The same layers as ``chainer.links.ResNet152Layers``: a 7x7 stem
convolution with batch normalization and 3x3 max pooling, then 3, 8, 36 and
3 bottleneck blocks (256, 512, 1024 and 2048 output channels), global
average pooling and a fully connected classifier; 60,192,872 parameters for
1000 classes. As in the original MSRA model (and Chainer's default), a
block that halves the resolution does so in its first 1x1 convolution.

Blocks: the stem, the 50 blocks (``res2_1`` ... ``res5_3``) and the head
(global average pooling and the classifier), 52 in all. Global average
pooling makes the head independent of the input size.
"""

import chainer
import chainer.functions as F
import chainer.links as L

from cgdp_chainer.models import common

NAME = 'resnet152'

# (block prefix, number of blocks, bottleneck width, output channels,
#  stride of the first block)
_GROUPS = (
    ('res2', 3, 64, 256, 1),
    ('res3', 8, 128, 512, 2),
    ('res4', 36, 256, 1024, 2),
    ('res5', 3, 512, 2048, 2),
)


class Bottleneck(chainer.Chain):
    """A bottleneck residual block: 1x1, 3x3, 1x1 convolutions plus shortcut.

    The shortcut is the identity when the block keeps channels and
    resolution, and a strided 1x1 convolution with batch normalization (a
    projection) when it changes either.

    Args:
        in_channels (int): Channels of the input.
        mid_channels (int): Channels inside the bottleneck.
        out_channels (int): Channels of the output.
        stride (int): Stride of the first 1x1 convolution and of the
            projection; 2 halves the resolution.
        initializers (models.common.SeededInitializers): Source of the
            convolution weights.
    """

    def __init__(self, in_channels, mid_channels, out_channels, stride,
                 initializers):
        super(Bottleneck, self).__init__()
        with self.init_scope():
            # No biases: each convolution is followed by batch normalization,
            # whose beta makes a bias redundant.
            self.conv1 = L.Convolution2D(
                in_channels, mid_channels, 1, stride, 0, nobias=True,
                initialW=initializers.he_normal())
            self.bn1 = L.BatchNormalization(mid_channels)
            self.conv2 = L.Convolution2D(
                mid_channels, mid_channels, 3, 1, 1, nobias=True,
                initialW=initializers.he_normal())
            self.bn2 = L.BatchNormalization(mid_channels)
            self.conv3 = L.Convolution2D(
                mid_channels, out_channels, 1, 1, 0, nobias=True,
                initialW=initializers.he_normal())
            self.bn3 = L.BatchNormalization(out_channels)
            if stride != 1 or in_channels != out_channels:
                self.projection = L.Convolution2D(
                    in_channels, out_channels, 1, stride, 0, nobias=True,
                    initialW=initializers.he_normal())
                self.projection_bn = L.BatchNormalization(out_channels)
            else:
                self.projection = None

    def forward(self, x):
        """Computes the block's output.

        Args:
            x (chainer.Variable): Input of shape (N, in_channels, H, W).

        Returns:
            chainer.Variable: Output of shape (N, out_channels, H', W').
        """
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        if self.projection is None:
            shortcut = x
        else:
            shortcut = self.projection_bn(self.projection(x))
        return F.relu(h + shortcut)


class Stem(chainer.Chain):
    """The 7x7 stride-2 convolution, batch normalization, ReLU, max pooling.

    Args:
        initializers (models.common.SeededInitializers): Source of the
            convolution weights.
    """

    def __init__(self, initializers):
        super(Stem, self).__init__()
        with self.init_scope():
            # With a bias, as in ResNet152Layers (the count includes it).
            self.conv = L.Convolution2D(3, 64, 7, 2, 3,
                                        initialW=initializers.he_normal())
            self.bn = L.BatchNormalization(64)

    def forward(self, x):
        """Computes the stem's output.

        Args:
            x (chainer.Variable): Images of shape (N, 3, H, W).

        Returns:
            chainer.Variable: Shape (N, 64, H/4, W/4) (rounded up).
        """
        common.check_input(NAME, x)
        h = F.relu(self.bn(self.conv(x)))
        return common.max_pooling_3x3_stride2(h)


class ResNet152(common.SequentialNetwork):
    """ResNet-152; ``blocks`` lists the stem, 50 blocks and the head.

    Args:
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization.

    Calling the model returns the logits, shape (N, n_classes).
    """

    def __init__(self, n_classes=1000, seed=None):
        super(ResNet152, self).__init__()
        initializers = common.SeededInitializers(seed)
        self.add_block('stem', Stem(initializers))
        in_channels = 64
        for prefix, n_blocks, mid_channels, out_channels, stride in _GROUPS:
            for index in range(n_blocks):
                block = Bottleneck(in_channels, mid_channels, out_channels,
                                   stride if index == 0 else 1, initializers)
                self.add_block('{}_{}'.format(prefix, index + 1), block)
                in_channels = out_channels
        self.add_block('head', common.LayerBlock(
            L.Linear(in_channels, n_classes,
                     initialW=initializers.lecun_normal()),
            before=[common.global_average_pooling_2d]))
