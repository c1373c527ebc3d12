"""Training data: synthetic ImageNet-like batches and real image lists.

Two sources feed the training scripts:

* :class:`SyntheticImageNet` makes each example from its index on access,
  so a dataset of any length costs no memory and every run (and every
  resumed run) sees the same data.
* :func:`image_list_dataset` reads real images in the convention of
  Chainer's ImageNet example: a list file of ``PATH LABEL`` lines, paths
  relative to a root folder, read by
  :class:`chainer.datasets.LabeledImageDataset` and preprocessed by
  :class:`PreprocessedImageDataset` (resize, crop, flip, mean subtraction).

:class:`SeededSerialIterator` shuffles with a generator keyed on the seed and
the epoch, both of which a snapshot restores, so that resuming from a
snapshot visits the examples in the same order as an uninterrupted run.
"""
import os

from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported

import chainer
from chainer.iterators import order_samplers
import numpy


# Per-channel mean of the ImageNet training images, RGB order, 0-255 scale.
IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)

# Chainer's ImageNet example crops 224 px from images resized to 256 px.
RESIZE_RATIO = 256.0 / 224.0


# Each use of randomness gets its own stream tag, so that, e.g., example 3
# of the synthetic data and the order of epoch 3 never share a generator.
_STREAM_SYNTHETIC = 1
_STREAM_ORDER = 2
_STREAM_AUGMENT = 3


def _rng(*key):
    """A generator that depends only on ``key`` (non-negative ints)."""
    return numpy.random.default_rng([int(k) for k in key])


class SyntheticImageNet(chainer.dataset.DatasetMixin):
    """ImageNet-shaped examples generated from their index on access.

    Example ``i`` is a float32 ``(3, image_size, image_size)`` image and an
    int32 label in ``[0, n_classes)``, both drawn from a generator seeded by
    ``(seed, i)``: the same index always gives the same example, in any
    process and in any order of access, and nothing is stored. Each image is
    standard normal noise plus a per-channel offset that depends on the label,
    so a network can learn something and the loss falls.

    Args:
        length (int): Number of examples (positive).
        image_size (int): Height and width of the images (positive).
        n_classes (int): Number of classes (positive).
        seed (int): Non-negative seed; different seeds give different data.
    """

    def __init__(self, length, image_size, n_classes=1000, seed=0):
        for name, value in (('length', length), ('image_size', image_size),
                            ('n_classes', n_classes)):
            if int(value) != value or value <= 0:
                raise ValueError(
                    '{} must be a positive integer, got {!r}'.format(
                        name, value))
        if int(seed) != seed or seed < 0:
            raise ValueError(
                'seed must be a non-negative integer, got {!r}'.format(seed))
        self.length = int(length)
        self.image_size = int(image_size)
        self.n_classes = int(n_classes)
        self.seed = int(seed)

    def __len__(self):
        return self.length

    def get_example(self, i):
        """Returns example ``i`` as ``(image, label)``.

        Args:
            i (int): Index in ``[-len(self), len(self))``.

        Returns:
            tuple: float32 CHW image and int32 scalar label.

        Raises:
            IndexError: ``i`` is out of range.
        """
        if not -self.length <= i < self.length:
            raise IndexError('index {} out of range for a dataset of {} '
                             'examples'.format(i, self.length))
        i = int(i) % self.length
        rng = _rng(_STREAM_SYNTHETIC, self.seed, i)
        label = int(rng.integers(self.n_classes))
        size = self.image_size
        image = rng.standard_normal((3, size, size), dtype=numpy.float32)
        # A label-dependent colour cast in [-0.5, 0.5) per channel: the
        # signal that makes the synthetic task learnable.
        golden_steps = numpy.array([0.618034, 0.414214, 0.732051])
        cast = ((label + 1) * golden_steps) % 1.0 - 0.5
        image += cast.astype(numpy.float32)[:, None, None]
        return image, numpy.int32(label)


class ImageListError(ValueError):
    """An image list file is missing or malformed, or names an image that is
    missing or cannot be read."""


def read_image_list(list_path, root='.', n_classes=None):
    """Reads and checks a list file of ``PATH LABEL`` lines.

    Every line is checked up front, so that a bad line stops the run before
    training starts rather than hours into it. Blank lines are skipped.

    Args:
        list_path (str): The list file. Each non-blank line holds an image
            path relative to ``root`` and an integer label, separated by
            white space (the format of Chainer's ImageNet example and Caffe).
        root (str): Folder the image paths are relative to.
        n_classes (int or None): If given, labels must be below it.

    Returns:
        list of tuple: ``(path, label)`` pairs, paths as written in the file.

    Raises:
        ImageListError: The list file is missing or empty, a line is
            malformed, a label is out of range or an image file is missing;
            the message names the list file and the line number.
    """
    pairs, _ = _read_list(list_path, root, n_classes)
    return pairs


def _read_list(list_path, root, n_classes):
    """:func:`read_image_list`'s pairs and, for each, ``'LIST:LINE'``."""
    if not os.path.isfile(list_path):
        raise ImageListError(
            '{}: image list file does not exist'.format(list_path))
    pairs = []
    sources = []
    with open(list_path) as list_file:
        for line_number, line in enumerate(list_file, start=1):
            fields = line.split()
            if not fields:
                continue
            where = '{}:{}'.format(list_path, line_number)
            if len(fields) != 2:
                raise ImageListError(
                    '{}: expected "PATH LABEL", got {!r}'.format(
                        where, line.strip()))
            path, label_text = fields
            try:
                label = int(label_text)
            except ValueError:
                raise ImageListError('{}: label {!r} is not an integer'.format(
                    where, label_text))
            if label < 0 or (n_classes is not None and label >= n_classes):
                limit = ('' if n_classes is None
                         else ' and below {}'.format(n_classes))
                raise ImageListError(
                    '{}: label {} must be non-negative{}'.format(
                        where, label, limit))
            full_path = os.path.join(root, path)
            if not os.path.isfile(full_path):
                raise ImageListError(
                    '{}: image file {!r} does not exist'.format(
                        where, full_path))
            pairs.append((path, label))
            sources.append(where)
    if not pairs:
        raise ImageListError('{}: the list names no images'.format(list_path))
    return pairs, sources


def check_image_headers(pairs, root='.', sources=None):
    """Checks that every image file is an image Pillow can open.

    Reads only each file's header (format, size and mode), not its pixels,
    so a file that is no image at all (empty, text, an unknown format)
    stops the run before training, at a small cost per image. Pixels that
    are damaged further in surface when the image is decoded, as an
    :class:`ImageListError` that names the file (see
    :class:`RGBLabeledImageDataset`).

    Args:
        pairs (list of tuple): ``(path, label)`` pairs.
        root (str): Folder the paths are relative to.
        sources (list of str or None): Where each pair came from
            (``'LIST:LINE'``), for the messages.

    Raises:
        ImageListError: A file cannot be opened as an image; the message
            names it (and its list line).
    """
    from PIL import Image
    for index, (path, _) in enumerate(pairs):
        full_path = os.path.join(root, path)
        try:
            with Image.open(full_path):
                pass  # open() identifies the format and parses the header
        except (OSError, ValueError) as error:
            raise ImageListError('{}cannot read image {!r}: {}'.format(
                _where(sources, index), full_path, error))


def _where(sources, index):
    return '' if sources is None else '{}: '.format(sources[index])


class RGBLabeledImageDataset(chainer.datasets.LabeledImageDataset):
    """:class:`~chainer.datasets.LabeledImageDataset` that always gives RGB.

    Chainer's class returns the pixels as stored, so a grayscale, paletted
    or RGBA file yields 1, 4 or index channels and breaks batching; this one
    converts every image to three RGB channels. A file that cannot be
    decoded raises :class:`ImageListError` naming it and, where known, the
    list line it came from.

    Args:
        pairs (list of tuple): ``(path, label)`` pairs, e.g. from
            :func:`read_image_list`.
        root (str): Folder the paths are relative to.
        sources (list of str or None): Where each pair came from, one per
            pair (``'LIST:LINE'``), named in decoding errors.
    """

    def __init__(self, pairs, root='.', sources=None):
        if sources is not None and len(sources) != len(pairs):
            raise ValueError('sources must name one line per pair: got {} '
                             'for {} pairs'.format(len(sources), len(pairs)))
        super(RGBLabeledImageDataset, self).__init__(
            pairs, root, dtype=numpy.float32, label_dtype=numpy.int32)
        self._sources = None if sources is None else list(sources)

    def get_example(self, i):
        """Returns ``(image, label)``: float32 RGB CHW (0-255), int32."""
        from PIL import Image
        path, label = self._pairs[i]
        full_path = os.path.join(self._root, path)
        try:
            with Image.open(full_path) as image_file:
                pixels = numpy.asarray(image_file.convert('RGB'),
                                       dtype=numpy.float32)
        except (OSError, ValueError) as error:
            raise ImageListError('{}cannot decode image {!r}: {}'.format(
                _where(self._sources, int(i) % len(self)), full_path,
                error))
        return pixels.transpose(2, 0, 1), numpy.int32(label)


class PreprocessedImageDataset(chainer.dataset.DatasetMixin):
    """Resizes, crops, flips and normalizes the images of a base dataset.

    Follows Chainer's ImageNet example: the shorter side is resized to
    ``resize_size``, a ``crop_size`` square is cut (at random with a random
    horizontal flip for training, from the centre without flip for
    evaluation), the mean is subtracted and the result scaled by 1/255.

    The random choices come from a generator keyed on ``(seed, epoch,
    index)``, not from a global state: an example looks the same every time
    it is drawn in the same epoch, which keeps a resumed run identical to an
    uninterrupted one. :class:`SeededSerialIterator` sets the epoch through
    :meth:`set_epoch`.

    Args:
        base: Dataset of ``(image, label)`` with float32 CHW RGB images on a
            0-255 scale.
        crop_size (int): Side of the square output images.
        train (bool): Random crop and flip if ``True``, centre crop if not.
        mean (sequence or numpy.ndarray): Per-channel mean (3 values) or an
            array broadcastable to ``(3, crop_size, crop_size)``; 0-255 scale.
        resize_size (int or None): Length of the shorter side after resizing;
            ``round(crop_size * 256 / 224)`` if ``None``. Must be at least
            ``crop_size``.
        seed (int): Non-negative seed of the random crops and flips.
    """

    def __init__(self, base, crop_size, train=True, mean=IMAGENET_MEAN_RGB,
                 resize_size=None, seed=0):
        if resize_size is None:
            resize_size = int(round(crop_size * RESIZE_RATIO))
        if crop_size <= 0 or resize_size < crop_size:
            raise ValueError(
                'need 0 < crop_size <= resize_size, got crop_size={} and '
                'resize_size={}'.format(crop_size, resize_size))
        self.base = base
        self.crop_size = int(crop_size)
        self.resize_size = int(resize_size)
        self.train = bool(train)
        mean = numpy.asarray(mean, dtype=numpy.float32)
        if mean.ndim == 1:
            mean = mean[:, None, None]
        self.mean = mean
        self.seed = int(seed)
        self.epoch = 0

    def __len__(self):
        return len(self.base)

    def set_epoch(self, epoch):
        """Sets the epoch that keys the random crops and flips.

        Args:
            epoch (int): Non-negative epoch number.
        """
        self.epoch = int(epoch)

    def _resize(self, image):
        _, height, width = image.shape
        shorter = min(height, width)
        if shorter == self.resize_size:
            return image
        from PIL import Image
        scale = self.resize_size / float(shorter)
        # Rounding up keeps the shorter side at resize_size exactly and the
        # longer one never below it.
        new_width = max(self.resize_size, int(round(width * scale)))
        new_height = max(self.resize_size, int(round(height * scale)))
        pixels = numpy.clip(image, 0, 255).astype(numpy.uint8)
        resized = Image.fromarray(pixels.transpose(1, 2, 0)).resize(
            (new_width, new_height), Image.BILINEAR)
        return numpy.asarray(resized, dtype=numpy.float32).transpose(2, 0, 1)

    def get_example(self, i):
        """Returns the preprocessed example ``i``: float32 CHW, int32 label.

        Args:
            i (int): Index of the example.
        """
        image, label = self.base[i]
        image = self._resize(numpy.asarray(image, dtype=numpy.float32))
        _, height, width = image.shape
        crop = self.crop_size
        if self.train:
            rng = _rng(_STREAM_AUGMENT, self.seed, self.epoch,
                       int(i) % len(self))
            top = int(rng.integers(height - crop + 1))
            left = int(rng.integers(width - crop + 1))
            flip = bool(rng.integers(2))
        else:
            top = (height - crop) // 2
            left = (width - crop) // 2
            flip = False
        image = image[:, top:top + crop, left:left + crop]
        if flip:
            image = image[:, :, ::-1]
        image = (image - self.mean) * numpy.float32(1.0 / 255.0)
        return numpy.ascontiguousarray(image, dtype=numpy.float32), label


def image_list_dataset(list_path, root, crop_size, train=True,
                       mean=IMAGENET_MEAN_RGB, resize_size=None, seed=0,
                       n_classes=None):
    """Builds the preprocessed dataset of a ``PATH LABEL`` list file.

    The list is checked completely before the dataset is returned (see
    :func:`read_image_list`), and so is every image's header (see
    :func:`check_image_headers`); an image that fails to decode later
    raises :class:`ImageListError` naming the list file and line.

    Args:
        list_path (str): The list file.
        root (str): Folder the image paths are relative to.
        crop_size (int): Side of the square images given to the network.
        train (bool): Random crop and flip (training) or centre crop.
        mean: Per-channel mean or mean image, 0-255 scale.
        resize_size (int or None): Shorter side after resizing.
        seed (int): Seed of the random crops and flips.
        n_classes (int or None): If given, labels must be below it.

    Returns:
        PreprocessedImageDataset: The dataset.

    Raises:
        ImageListError: See :func:`read_image_list` and
            :func:`check_image_headers`.
    """
    pairs, sources = _read_list(list_path, root, n_classes)
    check_image_headers(pairs, root, sources)
    base = RGBLabeledImageDataset(pairs, root, sources)
    return PreprocessedImageDataset(
        base, crop_size, train=train, mean=mean, resize_size=resize_size,
        seed=seed)


class EpochSeededOrderSampler(order_samplers.OrderSampler):
    """Shuffles with a generator keyed on ``(seed, epoch)``.

    Chainer's :class:`~chainer.iterators.ShuffleOrderSampler` draws from a
    random state that snapshots do not save, so a resumed run would shuffle
    its later epochs differently. Here the order of epoch ``e`` depends only
    on ``seed`` and ``e``; :class:`SeededSerialIterator` tells the sampler
    which epoch it is about to start.

    Args:
        seed (int): Non-negative seed.
    """

    def __init__(self, seed):
        self.seed = int(seed)
        self.next_epoch = 0

    def __call__(self, current_order, current_position):
        rng = _rng(_STREAM_ORDER, self.seed, self.next_epoch)
        self.next_epoch += 1
        return rng.permutation(len(current_order))


class SeededSerialIterator(chainer.iterators.SerialIterator):
    """A :class:`~chainer.iterators.SerialIterator` that resumes exactly.

    The order of every epoch depends only on ``seed`` and the epoch number
    (restored from snapshots with the rest of the iterator's state), and a
    dataset with a ``set_epoch`` method (like
    :class:`PreprocessedImageDataset`) is told the epoch before each batch,
    so a run resumed from a snapshot draws the same batches as one that was
    never interrupted.

    Args:
        dataset: Dataset to iterate.
        batch_size (int): Examples per batch.
        seed (int): Non-negative seed of the shuffling.
        repeat (bool): Loop over the dataset forever.
        shuffle (bool): Shuffle each epoch; if ``False`` the order is the
            index order.
    """

    def __init__(self, dataset, batch_size, seed=0, repeat=True,
                 shuffle=True):
        self._seeded_sampler = EpochSeededOrderSampler(seed) if shuffle \
            else None
        super(SeededSerialIterator, self).__init__(
            dataset, batch_size, repeat=repeat,
            shuffle=None if shuffle else False,
            order_sampler=self._seeded_sampler)

    def reset(self):
        if self._seeded_sampler is not None:
            self._seeded_sampler.next_epoch = 0
        super(SeededSerialIterator, self).reset()

    def __next__(self):
        # The state machine calls the sampler once per epoch it finishes in
        # this batch; the first of those starts epoch self.epoch + 1.
        if self._seeded_sampler is not None:
            self._seeded_sampler.next_epoch = self.epoch + 1
        set_epoch = getattr(self.dataset, 'set_epoch', None)
        if set_epoch is not None:
            set_epoch(self.epoch)
        return super(SeededSerialIterator, self).__next__()

    next = __next__
