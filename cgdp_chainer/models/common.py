"""Pieces shared by the four networks.

* The image-size limit: :data:`MIN_IMAGE_SIZE`, :func:`min_image_size` and
  :func:`check_image_size` are the one place that knows how small an input
  each network accepts.
* Pooling that makes the classifiers independent of the input size:
  :func:`adaptive_average_pooling_2d` and :func:`global_average_pooling_2d`.
* :class:`SeededInitializers`, which draws every weight from one seeded
  generator, so a seed (and nothing global) decides a model's parameters.
* :class:`LayerBlock` and :class:`SequentialNetwork`: each network is a
  sequence of blocks (a learned layer with what follows it), how it is
  written, not an interface: the runtime and the cost model work on any
  ``chainer.Link``, per layer.
"""
import functools
import math

import chainer
from chainer import backend
import chainer.functions as F
import numpy

from cgdp_chainer import randomness


# Every network accepts the canonical 224x224 and anything down to 64x64
# with the same parameters; the tests cover 64 and 224. At 64 px VGG-16,
# ResNet-152 and GoogLeNet end on a 2x2 feature map (1/32 of the input),
# GoogLeNet's auxiliary classifiers see their full 4x4 grid (1/16) and
# AlexNet, whose unpadded layers shrink fastest, ends on 1x1, which its
# adaptive pooling spreads over the 6x6 grid. Smaller inputs would leave
# the deep layers nothing but single pixels, so they are refused rather
# than silently trained on. One limit per network, kept here only.
MIN_IMAGE_SIZE = {
    'alexnet': 64,
    'googlenet': 64,
    'vgg16': 64,
    'resnet152': 64,
}


def min_image_size(name):
    """The smallest image side, in pixels, that a network accepts.

    Args:
        name (str): One of ``cgdp_chainer.models.NETWORKS``.

    Returns:
        int: The minimum height and width.

    Raises:
        ValueError: ``name`` is not a known network.
    """
    try:
        return MIN_IMAGE_SIZE[name]
    except KeyError:
        raise ValueError('unknown network {!r}; valid names are {}'.format(
            name, ', '.join(MIN_IMAGE_SIZE)))


def check_image_size(name, size):
    """Raises ``ValueError`` if a network cannot take images of ``size``.

    Args:
        name (str): One of ``cgdp_chainer.models.NETWORKS``.
        size (int or pair of ints): Image side, or ``(height, width)``.

    Returns:
        tuple of int: ``(height, width)``, for callers that want it.

    Raises:
        ValueError: The image is smaller than the network's minimum (the
            message names the minimum), or ``size`` is not a positive size.
    """
    minimum = min_image_size(name)
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(
                'image size must be an int or (height, width), got {!r}'
                .format(size))
        height, width = (int(side) for side in size)
    else:
        height = width = int(size)
    if height < minimum or width < minimum:
        raise ValueError(
            '{} needs images of at least {}x{} pixels, got {}x{}'.format(
                name, minimum, minimum, height, width))
    return height, width


def check_input(name, x):
    """Validates a network's input batch before the first layer sees it.

    Used as the first operation of each network's first block, so the error
    comes with the same message whether the caller runs ``model(x)`` or the
    blocks one by one.

    Args:
        name (str): The network's name in ``cgdp_chainer.models.NETWORKS``.
        x (chainer.Variable or array): Batch of shape (N, 3, H, W).

    Returns:
        The input, unchanged.

    Raises:
        ValueError: The batch is not 4-D with 3 channels, or its images are
            too small for the network.
    """
    if len(x.shape) != 4 or x.shape[1] != 3:
        raise ValueError(
            '{} expects a batch of RGB images shaped (N, 3, H, W), got shape '
            '{}'.format(name, tuple(x.shape)))
    check_image_size(name, x.shape[2:])
    return x


def _bin_bounds(in_size, out_size):
    """Start and end of each adaptive pooling bin along one axis.

    Bin ``i`` covers ``[floor(i * in / out), ceil((i + 1) * in / out))``,
    the rule torchvision's ``adaptive_avg_pool2d`` uses: bins may overlap
    by one pixel and, when ``in < out``, repeat pixels.
    """
    return [((i * in_size) // out_size, -(-((i + 1) * in_size) // out_size))
            for i in range(out_size)]


def _adaptive_mean_along(x, axis, out_size):
    in_size = x.shape[axis]
    if in_size == out_size:
        return x
    if in_size % out_size == 0:
        # Equal, disjoint bins: one reshape and one mean instead of slices.
        shape = (x.shape[:axis] + (out_size, in_size // out_size)
                 + x.shape[axis + 1:])
        return F.mean(F.reshape(x, shape), axis=axis + 1)
    pieces = []
    for start, end in _bin_bounds(in_size, out_size):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, end)
        pieces.append(F.mean(x[tuple(index)], axis=axis, keepdims=True))
    return F.concat(pieces, axis=axis)


def adaptive_average_pooling_2d(x, output_size):
    """Average pooling to a fixed output grid, whatever the input size.

    Follows torchvision's ``adaptive_avg_pool2d``: output cell ``(i, j)``
    is the mean of rows ``[floor(i*H/h), ceil((i+1)*H/h))`` and columns
    ``[floor(j*W/w), ceil((j+1)*W/w))``. The mean over such a rectangle is
    the mean over its rows of the means over its columns, so the pooling is
    done one axis at a time (``h + w`` slices rather than ``h * w``).

    Args:
        x (chainer.Variable or array): Feature map of shape (N, C, H, W).
        output_size (int or pair of ints): ``h`` and ``w`` of the result.

    Returns:
        chainer.Variable: Shape (N, C, h, w).
    """
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    out_h, out_w = output_size
    h = _adaptive_mean_along(x, 2, out_h)
    h = _adaptive_mean_along(h, 3, out_w)
    if not isinstance(h, chainer.Variable):
        h = chainer.Variable(h, requires_grad=False)
    return h


def global_average_pooling_2d(x):
    """Mean over the spatial axes: (N, C, H, W) -> (N, C).

    Args:
        x (chainer.Variable or array): Feature map.

    Returns:
        chainer.Variable: Shape (N, C).
    """
    return F.mean(x, axis=(2, 3))


class _SeededInitializer(chainer.initializer.Initializer):
    """Draws from a shared ``numpy.random.Generator``; see SeededInitializers.

    Args:
        rng (numpy.random.Generator): Source of the random numbers.
        distribution (str): ``'normal'`` or ``'uniform'``.
        rule (str): How the spread follows the fan-in: ``'he'`` (std
            sqrt(2 / fan_in)), ``'lecun'`` (std sqrt(1 / fan_in); for the
            uniform distribution the bound sqrt(3 / fan_in), as in Caffe's
            "xavier") or ``'fixed'`` (the given ``scale``).
        scale (float): Standard deviation for ``rule='fixed'``.
    """

    def __init__(self, rng, distribution, rule, scale=1.0):
        super(_SeededInitializer, self).__init__()
        self.rng = rng
        self.distribution = distribution
        self.rule = rule
        self.scale = scale

    def _spread(self, shape):
        if self.rule == 'fixed':
            return self.scale
        fan_in, _ = chainer.initializer.get_fans(shape)
        gain = 2.0 if self.rule == 'he' else 1.0
        std = math.sqrt(gain / fan_in)
        if self.distribution == 'uniform':
            return std * math.sqrt(3.0)  # the bound with this std
        return std

    def __call__(self, array):
        spread = self._spread(array.shape)
        # float32 draws: half the memory and time of RandomState's float64,
        # which matters for VGG-16's 100-million-weight fc6.
        if self.distribution == 'normal':
            values = self.rng.standard_normal(array.shape,
                                              dtype=numpy.float32)
            values *= spread
        else:
            values = self.rng.random(array.shape, dtype=numpy.float32)
            values *= 2 * spread
            values -= spread
        backend.copyto(array, values.astype(array.dtype, copy=False))


class SeededInitializers(object):
    """Makes weight initializers that all draw from one seeded generator.

    Links are built in a fixed order and each initializer draws as its
    layer is built, so the seed alone decides every parameter: the global
    ``numpy.random`` state is never touched.

    Args:
        seed (int or None): Seed of the generator; ``None`` takes fresh
            entropy from the operating system.
    """

    def __init__(self, seed):
        self.rng = numpy.random.default_rng(seed)

    def he_normal(self):
        """Normal with std sqrt(2 / fan_in) (He et al. 2015)."""
        return _SeededInitializer(self.rng, 'normal', 'he')

    def lecun_normal(self):
        """Normal with std sqrt(1 / fan_in) (Chainer's default)."""
        return _SeededInitializer(self.rng, 'normal', 'lecun')

    def lecun_uniform(self):
        """Uniform on [-sqrt(3 / fan_in), sqrt(3 / fan_in)] (BVLC)."""
        return _SeededInitializer(self.rng, 'uniform', 'lecun')

    def normal(self, std):
        """Normal with a fixed standard deviation.

        Args:
            std (float): The standard deviation.
        """
        return _SeededInitializer(self.rng, 'normal', 'fixed', scale=std)


def max_pooling_3x3_stride2(x):
    """3x3 max pooling, stride 2, rounding up (as Caffe; Chainer's default).

    Args:
        x (chainer.Variable): Feature map.
    """
    return F.max_pooling_2d(x, ksize=3, stride=2)


def max_pooling_2x2_stride2(x):
    """2x2 max pooling with stride 2 (VGG).

    Args:
        x (chainer.Variable): Feature map.
    """
    return F.max_pooling_2d(x, ksize=2, stride=2)


def dropout(ratio):
    """A picklable dropout function with a fixed ratio.

    Args:
        ratio (float): Probability of dropping a unit (in training mode).
    """
    return functools.partial(randomness.dropout, ratio=ratio)


class LayerBlock(chainer.Chain):
    """One learned layer with the parameter-free operations around it.

    Args:
        layer (chainer.Link): The layer; its parameters are the block's.
        before (sequence of callables): Applied to the input first (input
            checks, pooling that adapts the input to the layer).
        after (sequence of callables): Applied to the layer's output
            (activation, normalization, pooling, dropout), in order.
    """

    def __init__(self, layer, before=(), after=()):
        super(LayerBlock, self).__init__()
        with self.init_scope():
            self.layer = layer
        self.before = tuple(before)
        self.after = tuple(after)

    def forward(self, x):
        """Applies ``before``, the layer, then ``after``.

        Args:
            x (chainer.Variable): The block's input.

        Returns:
            chainer.Variable: The block's output.
        """
        for function in self.before:
            x = function(x)
        x = self.layer(x)
        for function in self.after:
            x = function(x)
        return x


class SequentialNetwork(chainer.Chain):
    """A network made of blocks that are applied one after the other.

    Subclasses call :meth:`add_block` in order while building. ``forward``
    applies :attr:`blocks` in order, so the block list and the model cannot
    disagree.

    Blocks that are links are registered as children under their block
    name and looked up by name whenever :attr:`blocks` is read. That keeps
    the list right for copies made by ``Link.copy`` (Chainer's
    ``ParallelUpdater`` copies the model per device) and ``copy.deepcopy``,
    whose children are new objects.
    """

    def __init__(self):
        super(SequentialNetwork, self).__init__()
        # (name, function) pairs; function is None for a child link.
        self._block_entries = ()

    def add_block(self, name, block):
        """Appends a block.

        Args:
            name (str): Name of the block (the child name for links).
            block (chainer.Link or callable): The block; a callable that is
                not a link must have no parameters.
        """
        if isinstance(block, chainer.Link):
            with self.init_scope():
                setattr(self, name, block)
            entry = (name, None)
        else:
            entry = (name, block)
        self._block_entries = self._block_entries + (entry,)

    @property
    def blocks(self):
        """list: The blocks in order; applying them in turn is ``forward``."""
        return [getattr(self, name) if function is None else function
                for name, function in self._block_entries]

    @property
    def block_names(self):
        """list of str: A name for each block, in the order of ``blocks``."""
        return [name for name, _ in self._block_entries]

    def forward(self, x):
        """Applies the blocks in order.

        Args:
            x (chainer.Variable or array): Batch of shape (N, 3, H, W).

        Returns:
            The last block's output (see the network's class for its form).
        """
        h = x
        for block in self.blocks:
            h = block(h)
        return h
