"""Tests of cgdp_chainer.datasets: synthetic data, image lists, iterator."""
import os

import numpy
import pytest

from cgdp_chainer import datasets

import chainer


# --- SyntheticImageNet ------------------------------------------------------

def test_synthetic_shapes_dtypes_and_label_range():
    dataset = datasets.SyntheticImageNet(20, 16, n_classes=5, seed=3)
    assert len(dataset) == 20
    labels = set()
    for i in range(len(dataset)):
        image, label = dataset[i]
        assert image.shape == (3, 16, 16)
        assert image.dtype == numpy.float32
        assert label.dtype == numpy.int32
        assert 0 <= int(label) < 5
        labels.add(int(label))
    assert len(labels) > 1


def test_synthetic_is_deterministic_per_index_and_seed():
    first = datasets.SyntheticImageNet(10, 8, n_classes=7, seed=1)
    again = datasets.SyntheticImageNet(10, 8, n_classes=7, seed=1)
    other_seed = datasets.SyntheticImageNet(10, 8, n_classes=7, seed=2)
    # Access in a different order: each example depends only on its index.
    for i in reversed(range(10)):
        image, label = first[i]
        image_again, label_again = again[i]
        numpy.testing.assert_array_equal(image, image_again)
        assert label == label_again
    assert not numpy.array_equal(first[0][0], first[1][0])
    assert not numpy.array_equal(first[0][0], other_seed[0][0])


def test_synthetic_indexing_and_batching():
    dataset = datasets.SyntheticImageNet(4, 8, n_classes=3)
    numpy.testing.assert_array_equal(dataset[-1][0], dataset[3][0])
    with pytest.raises(IndexError):
        dataset[4]
    images, labels = chainer.dataset.concat_examples(dataset[0:3])
    assert images.shape == (3, 3, 8, 8)
    assert labels.shape == (3,)
    assert labels.dtype == numpy.int32


@pytest.mark.parametrize('kwargs', [
    dict(length=0, image_size=8), dict(length=4, image_size=0),
    dict(length=4, image_size=8, n_classes=0),
    dict(length=4, image_size=8, seed=-1),
])
def test_synthetic_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        datasets.SyntheticImageNet(**kwargs)


# --- SeededSerialIterator ---------------------------------------------------

def _indices(batches):
    return [[int(label) for _, label in batch] for batch in batches]


class _IndexDataset(chainer.dataset.DatasetMixin):
    """Example i is (i, i): the batches show the order directly."""

    def __init__(self, length):
        self.length = length
        self.epochs_seen = []

    def __len__(self):
        return self.length

    def set_epoch(self, epoch):
        self.epochs_seen.append(epoch)

    def get_example(self, i):
        return numpy.float32(i), numpy.int32(i)


def test_iterator_order_depends_only_on_seed_and_epoch():
    def run(seed):
        iterator = datasets.SeededSerialIterator(_IndexDataset(5), 2,
                                                 seed=seed)
        return _indices([iterator.next() for _ in range(10)])

    assert run(0) == run(0)
    assert run(0) != run(1)
    flat = sum(run(0), [])
    # Every epoch visits each example once; epochs are shuffled differently.
    epochs = [sorted(flat[k:k + 5]) for k in range(0, 20, 5)]
    assert all(epoch == list(range(5)) for epoch in epochs)
    assert len({tuple(flat[k:k + 5]) for k in range(0, 20, 5)}) > 1


def test_iterator_resumes_from_a_snapshot_exactly():
    uninterrupted = datasets.SeededSerialIterator(_IndexDataset(5), 3, seed=4)
    expected = _indices([uninterrupted.next() for _ in range(8)])

    first = datasets.SeededSerialIterator(_IndexDataset(5), 3, seed=4)
    head = _indices([first.next() for _ in range(3)])
    state = chainer.serializers.DictionarySerializer()
    first.serialize(state)

    resumed = datasets.SeededSerialIterator(_IndexDataset(5), 3, seed=4)
    resumed.serialize(chainer.serializers.NpzDeserializer(state.target))
    tail = _indices([resumed.next() for _ in range(5)])
    assert head + tail == expected


def test_iterator_without_shuffle_and_set_epoch_hook():
    dataset = _IndexDataset(3)
    iterator = datasets.SeededSerialIterator(dataset, 2, shuffle=False)
    batches = _indices([iterator.next() for _ in range(3)])
    assert batches == [[0, 1], [2, 0], [1, 2]]
    # The epoch at the start of each batch.
    assert dataset.epochs_seen == [0, 0, 1]


# --- Image lists: checks that need no image decoding ------------------------

def _write(path, text):
    with open(str(path), 'w') as f:
        f.write(text)
    return str(path)


def _touch_images(root, names):
    for name in names:
        full = os.path.join(str(root), name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, 'wb').close()


def test_read_image_list_parses_pairs_and_skips_blank_lines(tmp_path):
    _touch_images(tmp_path, ['a.png', 'sub/b.png'])
    list_path = _write(tmp_path / 'train.txt', 'a.png 0\n\nsub/b.png  3\n')
    pairs = datasets.read_image_list(list_path, str(tmp_path), n_classes=4)
    assert pairs == [('a.png', 0), ('sub/b.png', 3)]


@pytest.mark.parametrize('content, line, words', [
    ('a.png 0\nb.png\n', 2, 'PATH LABEL'),
    ('a.png 0 extra\n', 1, 'PATH LABEL'),
    ('a.png 0\n\na.png x\n', 3, 'not an integer'),
    ('a.png -1\n', 1, 'non-negative'),
    ('a.png 0\na.png 4\n', 2, 'below 4'),
    ('a.png 0\nmissing.png 1\n', 2, 'missing.png'),
])
def test_read_image_list_errors_name_file_and_line(tmp_path, content, line,
                                                   words):
    _touch_images(tmp_path, ['a.png'])
    list_path = _write(tmp_path / 'list.txt', content)
    with pytest.raises(datasets.ImageListError) as info:
        datasets.read_image_list(list_path, str(tmp_path), n_classes=4)
    message = str(info.value)
    assert '{}:{}:'.format(list_path, line) in message
    assert words in message


def test_read_image_list_missing_or_empty_list(tmp_path):
    missing = str(tmp_path / 'nope.txt')
    with pytest.raises(datasets.ImageListError, match='nope.txt'):
        datasets.read_image_list(missing)
    empty = _write(tmp_path / 'empty.txt', '\n\n')
    with pytest.raises(datasets.ImageListError, match='no images'):
        datasets.read_image_list(empty)


# --- Image lists: the pipeline on real PNG files (needs Pillow) -------------

@pytest.fixture
def png_folder(tmp_path):
    """Writes PNGs of several sizes and modes, and their list file."""
    Image = pytest.importorskip('PIL.Image')
    rng = numpy.random.default_rng(0)
    specs = [('rgb.png', 'RGB', (20, 12), 0), ('gray.png', 'L', (12, 16), 1),
             ('rgba.png', 'RGBA', (12, 12), 2), ('pal.png', 'P', (30, 14), 1)]
    lines = []
    for name, mode, (width, height), label in specs:
        channels = {'RGB': 3, 'RGBA': 4}.get(mode)
        shape = (height, width) if channels is None else (
            height, width, channels)
        pixels = rng.integers(0, 256, size=shape, dtype=numpy.uint8)
        Image.fromarray(pixels, mode='L' if mode == 'P' else None).convert(
            mode).save(str(tmp_path / name))
        lines.append('{} {}'.format(name, label))
    list_path = _write(tmp_path / 'train.txt', '\n'.join(lines) + '\n')
    return list_path, str(tmp_path)


def test_pipeline_shapes_for_all_image_modes(png_folder):
    list_path, root = png_folder
    for train in (True, False):
        dataset = datasets.image_list_dataset(list_path, root, 8, train=train)
        assert len(dataset) == 4
        images, labels = chainer.dataset.concat_examples(
            [dataset[i] for i in range(len(dataset))])
        assert images.shape == (4, 3, 8, 8)
        assert images.dtype == numpy.float32
        numpy.testing.assert_array_equal(labels, [0, 1, 2, 1])
        # Mean-subtracted and scaled by 1/255: within [-0.5, 1].
        assert images.min() >= -0.5 and images.max() <= 1.0


def test_pipeline_mean_subtraction_and_center_crop():
    class Constant(chainer.dataset.DatasetMixin):
        def __len__(self):
            return 1

        def get_example(self, i):
            # Each row holds its own value: the centre crop is visible.
            rows = numpy.arange(10, dtype=numpy.float32)[None, :, None]
            return numpy.broadcast_to(rows * 10, (3, 10, 10)).copy(), \
                numpy.int32(0)

    mean = (1.0, 2.0, 3.0)
    dataset = datasets.PreprocessedImageDataset(
        Constant(), 4, train=False, mean=mean, resize_size=10)
    image, _ = dataset[0]
    rows = numpy.arange(3, 7, dtype=numpy.float32) * 10
    for channel in range(3):
        expected = numpy.broadcast_to(
            ((rows - mean[channel]) / 255)[:, None], (4, 4))
        numpy.testing.assert_allclose(image[channel], expected, rtol=1e-6)


def test_pipeline_random_crop_and_flip_are_seeded(png_folder):
    list_path, root = png_folder
    dataset = datasets.image_list_dataset(list_path, root, 8, train=True,
                                          seed=5)
    again = datasets.image_list_dataset(list_path, root, 8, train=True,
                                        seed=5)
    numpy.testing.assert_array_equal(dataset[3][0], again[3][0])
    per_epoch = []
    for epoch in range(8):
        dataset.set_epoch(epoch)
        per_epoch.append(dataset[3][0])
    # Different epochs crop or flip differently.
    assert len({image.tobytes() for image in per_epoch}) > 1
    evaluation = datasets.image_list_dataset(list_path, root, 8, train=False)
    evaluation.set_epoch(3)
    numpy.testing.assert_array_equal(evaluation[3][0],
                                     evaluation.get_example(3)[0])


def test_pipeline_flip_mirrors_the_crop():
    class Gradient(chainer.dataset.DatasetMixin):
        def __len__(self):
            return 1

        def get_example(self, i):
            columns = numpy.arange(6, dtype=numpy.float32)[None, None, :]
            return numpy.broadcast_to(columns, (3, 6, 6)).copy(), \
                numpy.int32(0)

    dataset = datasets.PreprocessedImageDataset(
        Gradient(), 6, train=True, mean=(0, 0, 0), resize_size=6)
    seen = set()
    for epoch in range(16):
        dataset.set_epoch(epoch)
        row = tuple(numpy.round(dataset[0][0][0, 0] * 255).astype(int))
        seen.add(row)
    assert seen == {(0, 1, 2, 3, 4, 5), (5, 4, 3, 2, 1, 0)}


def test_pipeline_resizes_the_shorter_side(png_folder):
    list_path, root = png_folder
    dataset = datasets.image_list_dataset(list_path, root, 8, resize_size=10)
    base_image, _ = dataset.base[3]  # 30 x 14 (width x height)
    assert base_image.shape == (3, 14, 30)
    resized = dataset._resize(base_image)
    assert resized.shape == (3, 10, 21)


def test_a_file_that_is_no_image_is_refused_up_front(tmp_path):
    Image = pytest.importorskip('PIL.Image')
    Image.new('RGB', (8, 8)).save(str(tmp_path / 'good.png'))
    _write(tmp_path / 'broken.png', 'not a png')
    open(str(tmp_path / 'empty.png'), 'wb').close()
    for name in ('broken.png', 'empty.png'):
        list_path = _write(tmp_path / 'list.txt',
                           'good.png 0\n\n{} 1\n'.format(name))
        # When the dataset is built, before any example is drawn.
        with pytest.raises(datasets.ImageListError) as info:
            datasets.image_list_dataset(list_path, str(tmp_path), 8)
        message = str(info.value)
        assert message.startswith('{}:3: '.format(list_path))
        assert 'cannot read image' in message and name in message


def _truncated_png(path):
    Image = pytest.importorskip('PIL.Image')
    rng = numpy.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(40, 40, 3), dtype=numpy.uint8)
    Image.fromarray(pixels).save(path)
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])


def test_an_image_damaged_inside_names_the_list_line_when_decoded(tmp_path):
    Image = pytest.importorskip('PIL.Image')
    Image.new('RGB', (8, 8)).save(str(tmp_path / 'good.png'))
    _truncated_png(str(tmp_path / 'cut.png'))
    list_path = _write(tmp_path / 'list.txt', 'good.png 0\ncut.png 1\n')
    # Its header is intact: the dataset builds, the good image reads.
    dataset = datasets.image_list_dataset(list_path, str(tmp_path), 8)
    assert dataset[0][0].shape == (3, 8, 8)
    for index in (1, -1):
        with pytest.raises(datasets.ImageListError) as info:
            dataset[index]
        message = str(info.value)
        assert message.startswith('{}:2: cannot decode image'.format(
            list_path))
        assert 'cut.png' in message


def test_image_dataset_without_sources_still_names_the_file(tmp_path):
    _truncated_png(str(tmp_path / 'cut.png'))
    dataset = datasets.RGBLabeledImageDataset([('cut.png', 0)],
                                              str(tmp_path))
    with pytest.raises(datasets.ImageListError,
                       match="^cannot decode image .*cut.png"):
        dataset[0]
    with pytest.raises(ValueError, match='one line per pair'):
        datasets.RGBLabeledImageDataset([('cut.png', 0)], str(tmp_path),
                                        sources=[])
