"""AlexNet, single tower (Krizhevsky 2014, "One weird trick"), as blocks.

The one-GPU form of AlexNet that Chainer's ImageNet example trains: five
convolutions with 96, 256, 384, 384 and 256 filters, local response
normalization after the first two, and three fully connected layers with
4096, 4096 and ``n_classes`` units; 62,378,344 parameters for 1000 classes.

Each block is one learned layer with its activation, normalization, pooling
and dropout. Before fc6, adaptive average pooling brings the last feature
map to the 6x6 grid fc6 is built for, so any input from 64x64 up works with
the same parameters (at 224x224 the map is already 6x6 and the pooling does
nothing).
"""
import functools

import chainer.functions as F
import chainer.links as L

from cgdp_chainer.models import common

NAME = 'alexnet'

# (name, out_channels, ksize, stride, pad, apply LRN, apply max pooling)
_CONVOLUTIONS = (
    ('conv1', 96, 11, 4, 0, True, True),
    ('conv2', 256, 5, 1, 2, True, True),
    ('conv3', 384, 3, 1, 1, False, False),
    ('conv4', 384, 3, 1, 1, False, False),
    ('conv5', 256, 3, 1, 1, False, True),
)
FEATURE_GRID = 6


class AlexNet(common.SequentialNetwork):
    """Single-tower AlexNet; ``blocks`` lists its eight layers.

    Args:
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization.

    Calling the model returns the logits, shape (N, n_classes).
    """

    def __init__(self, n_classes=1000, seed=None):
        super(AlexNet, self).__init__()
        initializers = common.SeededInitializers(seed)
        in_channels = 3
        for index, (name, out_channels, ksize, stride, pad, lrn,
                    pool) in enumerate(_CONVOLUTIONS):
            before = []
            if index == 0:
                before.append(functools.partial(common.check_input, NAME))
            after = [F.relu]
            if lrn:
                # The paper's constants, which are also Chainer's defaults.
                after.append(F.local_response_normalization)
            if pool:
                after.append(common.max_pooling_3x3_stride2)
            conv = L.Convolution2D(
                in_channels, out_channels, ksize, stride=stride, pad=pad,
                initialW=initializers.lecun_normal())
            self.add_block(name, common.LayerBlock(conv, before, after))
            in_channels = out_channels

        fc_inputs = in_channels * FEATURE_GRID * FEATURE_GRID
        self.add_block('fc6', common.LayerBlock(
            L.Linear(fc_inputs, 4096, initialW=initializers.lecun_normal()),
            before=[functools.partial(common.adaptive_average_pooling_2d,
                                      output_size=FEATURE_GRID)],
            after=[F.relu, common.dropout(0.5)]))
        self.add_block('fc7', common.LayerBlock(
            L.Linear(4096, 4096, initialW=initializers.lecun_normal()),
            after=[F.relu, common.dropout(0.5)]))
        self.add_block('fc8', common.LayerBlock(
            L.Linear(4096, n_classes, initialW=initializers.lecun_normal())))
