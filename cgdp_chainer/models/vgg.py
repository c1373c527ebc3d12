"""VGG-16 (Simonyan and Zisserman 2015, configuration D) as blocks.

The same layers as ``chainer.links.VGG16Layers``: thirteen 3x3
convolutions in five blocks, each block ending in 2x2 max pooling, then
fully connected layers of 4096, 4096 and ``n_classes`` units; 138,357,544
parameters for 1000 classes. Weights start from N(0, 0.01) and biases from
zero, as in ``VGG16Layers`` without a pretrained model.

Each block is one learned layer with its ReLU, the pooling that follows it
and dropout. Before fc6, adaptive average pooling brings the last feature
map to the 7x7 grid fc6 is built for (at 224x224 it is already 7x7), so
inputs from 64x64 up share the same parameters.
"""
import functools

import chainer.functions as F
import chainer.links as L

from cgdp_chainer.models import common

NAME = 'vgg16'

# Output channels of the convolutions, one tuple per pooling block.
_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512),
           (512, 512, 512))
FEATURE_GRID = 7


class VGG16(common.SequentialNetwork):
    """VGG-16; ``blocks`` lists its sixteen layers.

    Args:
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization.

    Calling the model returns the logits, shape (N, n_classes).
    """

    def __init__(self, n_classes=1000, seed=None):
        super(VGG16, self).__init__()
        initializers = common.SeededInitializers(seed)
        in_channels = 3
        for block_index, block in enumerate(_BLOCKS, start=1):
            for conv_index, out_channels in enumerate(block, start=1):
                before = []
                if block_index == 1 and conv_index == 1:
                    before.append(functools.partial(common.check_input, NAME))
                after = [F.relu]
                if conv_index == len(block):
                    after.append(common.max_pooling_2x2_stride2)
                conv = L.Convolution2D(
                    in_channels, out_channels, 3, stride=1, pad=1,
                    initialW=initializers.normal(0.01))
                self.add_block(
                    'conv{}_{}'.format(block_index, conv_index),
                    common.LayerBlock(conv, before, after))
                in_channels = out_channels

        fc_inputs = in_channels * FEATURE_GRID * FEATURE_GRID
        self.add_block('fc6', common.LayerBlock(
            L.Linear(fc_inputs, 4096, initialW=initializers.normal(0.01)),
            before=[functools.partial(common.adaptive_average_pooling_2d,
                                      output_size=FEATURE_GRID)],
            after=[F.relu, common.dropout(0.5)]))
        self.add_block('fc7', common.LayerBlock(
            L.Linear(4096, 4096, initialW=initializers.normal(0.01)),
            after=[F.relu, common.dropout(0.5)]))
        self.add_block('fc8', common.LayerBlock(
            L.Linear(4096, n_classes, initialW=initializers.normal(0.01))))
