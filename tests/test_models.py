"""Tests of the four networks and their block sequences (models/).

Each big network is built once per module (the ``network`` fixture) at
1000 classes, since the parameter counts are tested at that size. Forward
and backward passes use 64x64 inputs and batches of 2 to stay quick on a
busy two-core machine; the canonical 224x224 is run once per network in
evaluation mode without backpropagation.
"""
import models  # NOQA: first, so cgdp_chainer._compat runs before Chainer

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

from models import common


EXPECTED_PARAMETER_COUNTS = {
    'alexnet': 62378344,
    'googlenet': 13378280,
    'vgg16': 138357544,
    'resnet152': 60192872,
}

# Chainer's own definitions of three of the networks. AlexNet has none in
# chainer.links; its shapes are written out in test_alexnet_layer_shapes.
CHAINER_REFERENCES = {
    'googlenet': lambda: L.GoogLeNet(pretrained_model=None),
    'vgg16': lambda: L.VGG16Layers(pretrained_model=None),
    'resnet152': lambda: L.ResNet152Layers(pretrained_model=None),
}

N_CLASSES = 1000
SMALL = 64
BATCH = 2


@pytest.fixture(scope='module', params=models.NETWORKS)
def network(request):
    """(name, model): each network built once, seed 0, 1000 classes."""
    return request.param, models.get_model(request.param, N_CLASSES, seed=0)


def images(size, batch=BATCH, seed=0):
    return numpy.random.RandomState(seed).standard_normal(
        (batch, 3, size, size)).astype(numpy.float32)


def labels(batch=BATCH, seed=0):
    return numpy.random.RandomState(seed).randint(
        0, N_CLASSES, size=batch).astype(numpy.int32)


def run_blocks(model, x):
    """Applies the blocks one by one; returns the output and every carry."""
    carries = []
    h = x
    for block in model.blocks:
        h = block(h)
        carries.append(h)
    return h, carries


def as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


def gradients(model):
    return {path: param.grad.copy() for path, param in model.namedparams()
            if param.grad is not None}


def parameter_count(link):
    return sum(param.size for param in link.params())


# --- names, sizes ----------------------------------------------------------

def test_network_names():
    assert models.NETWORKS == ('alexnet', 'googlenet', 'vgg16', 'resnet152')


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError) as error:
        models.get_model('resnet50')
    for name in models.NETWORKS:
        assert name in str(error.value)
    with pytest.raises(ValueError):
        models.min_image_size('resnet50')


@pytest.mark.parametrize('name', models.NETWORKS)
def test_image_size_limit(name):
    minimum = models.min_image_size(name)
    assert minimum == 64
    assert models.check_image_size(name, minimum) == (minimum, minimum)
    assert models.check_image_size(name, (224, 300)) == (224, 300)
    for too_small in (minimum - 1, (minimum, minimum - 1)):
        with pytest.raises(ValueError, match='at least {0}x{0}'.format(
                minimum)):
            models.check_image_size(name, too_small)


def test_too_small_input_is_refused_by_model_and_first_block(network):
    name, model = network
    x = images(SMALL - 1, batch=1)
    with pytest.raises(ValueError, match='{}.*at least 64x64.*63x63'.format(
            name)):
        model(x)
    with pytest.raises(ValueError, match='at least 64x64'):
        model.blocks[0](x)
    with pytest.raises(ValueError, match=r'\(N, 3, H, W\)'):
        model(images(SMALL, batch=1)[:, :2])


# --- parameters --------------------------------------------------------------

def test_parameter_count(network):
    name, model = network
    assert parameter_count(model) == EXPECTED_PARAMETER_COUNTS[name]


def test_parameter_shapes_match_reference(network):
    name, model = network
    own_shapes = sorted(param.shape for param in model.params())
    if name in CHAINER_REFERENCES:
        reference = CHAINER_REFERENCES[name]()
        assert parameter_count(model) == parameter_count(reference)
        expected = sorted(param.shape for param in reference.params())
    else:
        # Single-tower AlexNet: five convolutions, three fc layers.
        weights = [(96, 3, 11, 11), (256, 96, 5, 5), (384, 256, 3, 3),
                   (384, 384, 3, 3), (256, 384, 3, 3), (4096, 9216),
                   (4096, 4096), (1000, 4096)]
        expected = sorted(weights + [(shape[0],) for shape in weights])
    assert own_shapes == expected


def test_every_parameter_belongs_to_exactly_one_block(network):
    _, model = network
    owners = {}
    for block in model.blocks:
        if isinstance(block, chainer.Link):
            for param in block.params():
                assert id(param) not in owners, 'parameter in two blocks'
                owners[id(param)] = block
        else:
            assert callable(block)
            assert not isinstance(getattr(block, '__self__', None),
                                  chainer.Link)
    assert set(owners) == {id(param) for param in model.params()}
    assert len(model.block_names) == len(model.blocks)


def test_block_granularity(network):
    name, model = network
    expected = {
        'alexnet': 8,    # five convolutions, three fully connected layers
        'googlenet': 11,  # stem, nine inception modules, head
        'vgg16': 16,     # thirteen convolutions, three fully connected
        'resnet152': 52,  # stem, 3 + 8 + 36 + 3 bottleneck blocks, head
    }
    assert len(model.blocks) == expected[name]


def test_copied_model_uses_its_own_blocks(network):
    # ParallelUpdater copies the model per device: the copy's blocks must
    # be the copy's links, not the original's.
    _, model = network
    copied = model.copy()
    for original, copy in zip(model.blocks, copied.blocks):
        if isinstance(original, chainer.Link):
            assert copy is not original
            assert any(copy is child for child in copied.children())


@pytest.mark.parametrize('seed', [0, 1])
def test_seed_decides_the_parameters(network, seed):
    name, model = network  # built with seed 0
    # Disturb the global generator: a layer drawing from it would differ.
    numpy.random.seed(1234 + seed)
    rebuilt = dict(models.get_model(name, N_CLASSES, seed=seed).namedparams())
    original = dict(model.namedparams())
    assert set(rebuilt) == set(original)
    if seed == 0:
        for path, param in original.items():
            assert numpy.array_equal(param.array, rebuilt[path].array), path
    else:
        # Biases and batch normalization start from constants; every
        # randomly initialized weight must differ.
        weights = [path for path in original if path.endswith('/W')]
        assert weights
        for path in weights:
            assert not numpy.array_equal(original[path].array,
                                         rebuilt[path].array), path


# --- forward and backward ----------------------------------------------------

def test_blocks_equal_model_forward_and_backward(network):
    _, model = network
    classifier = models.Classifier(model)
    x, t = images(SMALL), labels()

    with chainer.using_config('train', True):
        numpy.random.seed(7)  # Chainer's dropout draws from numpy.random
        model.cleargrads()
        loss_model = classifier(x, t)
        y_model = as_tuple(classifier.y)
        loss_model.backward()
        grads_model = gradients(model)

        numpy.random.seed(7)
        model.cleargrads()
        y_blocks, _ = run_blocks(model, x)
        loss_blocks = classifier.head(y_blocks, t)
        loss_blocks.backward()
        grads_blocks = gradients(model)
        model.cleargrads()

    assert len(as_tuple(y_blocks)) == len(y_model)
    for a, b in zip(as_tuple(y_blocks), y_model):
        numpy.testing.assert_allclose(a.array, b.array, rtol=1e-6, atol=1e-6)
    numpy.testing.assert_allclose(loss_blocks.array, loss_model.array,
                                  rtol=1e-6)
    assert set(grads_blocks) == set(grads_model)
    assert len(grads_model) == len(list(model.params()))
    for path, grad in grads_model.items():
        numpy.testing.assert_allclose(grads_blocks[path], grad, rtol=1e-5,
                                      atol=1e-7, err_msg=path)


def test_googlenet_auxiliary_outputs_and_losses(network):
    name, model = network
    if name != 'googlenet':
        pytest.skip('GoogLeNet only')
    classifier = models.Classifier(model, aux_loss_weight=0.3)
    x, t = images(SMALL), labels()

    with chainer.using_config('train', True):
        numpy.random.seed(3)
        y, carries = run_blocks(model, x)
        block_names = model.block_names
        # The carry becomes a tuple at each branch point and stays one.
        lengths = [len(as_tuple(carry)) for carry in carries]
        first_aux = block_names.index('inception_4a')
        second_aux = block_names.index('inception_4d')
        assert lengths[:first_aux] == [1] * first_aux
        assert lengths[first_aux:second_aux] == [2] * (second_aux - first_aux)
        assert lengths[second_aux:] == [3] * (len(lengths) - second_aux)
        assert isinstance(y, tuple) and len(y) == 3
        for output in y:
            assert output.shape == (BATCH, N_CLASSES)

        observer = chainer.Reporter()
        observer.add_observer('main', classifier)
        observation = {}
        with observer.scope(observation):
            loss = classifier.head(y, t)
    main, aux1, aux2 = (F.softmax_cross_entropy(output, t).array
                        for output in y)
    numpy.testing.assert_allclose(loss.array, main + 0.3 * (aux1 + aux2),
                                  rtol=1e-6)
    assert not numpy.allclose(loss.array, main)
    assert set(observation) == {'main/loss', 'main/accuracy'}
    numpy.testing.assert_allclose(
        observation['main/accuracy'].array,
        F.accuracy(y[0], t).array)


def test_evaluation_mode_returns_main_output_only(network):
    name, model = network
    classifier = models.Classifier(model)
    x, t = images(SMALL), labels()
    with chainer.using_config('train', False), \
            chainer.using_config('enable_backprop', False):
        y, carries = run_blocks(model, x)
        loss = classifier(x, t)
    assert all(isinstance(carry, chainer.Variable) for carry in carries)
    assert isinstance(y, chainer.Variable)
    assert y.shape == (BATCH, N_CLASSES)
    # Evaluation is deterministic: dropout off, batch statistics not used.
    numpy.testing.assert_allclose(classifier.y.array, y.array, rtol=1e-6,
                                  atol=1e-6)
    numpy.testing.assert_allclose(
        loss.array, F.softmax_cross_entropy(y, t).array, rtol=1e-6)


def test_canonical_size_reaches_the_classifier_grid(network):
    # At 224x224 the adaptive pooling must have nothing to do: the last
    # feature map already has the grid the classifier was built for.
    name, model = network
    grid_before = {'alexnet': ('fc6', (256, 6, 6)),
                   'vgg16': ('fc6', (512, 7, 7)),
                   'googlenet': ('head', (1024, 7, 7)),
                   'resnet152': ('head', (2048, 7, 7))}
    block_name, feature_shape = grid_before[name]
    stop = model.block_names.index(block_name)
    x = images(224, batch=1)
    with chainer.using_config('train', False), \
            chainer.using_config('enable_backprop', False):
        h = x
        for block in model.blocks[:stop]:
            h = block(h)
        assert h.shape == (1,) + feature_shape
        for block in model.blocks[stop:]:
            h = block(h)
    assert h.shape == (1, N_CLASSES)


# --- pooling and the classifier ------------------------------------------

def reference_adaptive_average(x, out_h, out_w):
    """torchvision's adaptive_avg_pool2d, written as plain loops."""
    n, c, in_h, in_w = x.shape
    y = numpy.empty((n, c, out_h, out_w), dtype=numpy.float64)
    for i in range(out_h):
        top = (i * in_h) // out_h
        bottom = -(-((i + 1) * in_h) // out_h)
        for j in range(out_w):
            left = (j * in_w) // out_w
            right = -(-((j + 1) * in_w) // out_w)
            y[:, :, i, j] = x[:, :, top:bottom, left:right].mean(axis=(2, 3))
    return y


@pytest.mark.parametrize('in_size,out_size', [
    ((14, 14), (4, 4)), ((7, 7), (7, 7)), ((12, 8), (6, 4)),
    ((5, 9), (3, 7)), ((1, 2), (6, 6)), ((2, 3), (7, 7))])
def test_adaptive_average_pooling_matches_torchvision_rule(in_size, out_size):
    x = numpy.random.RandomState(0).standard_normal(
        (2, 3) + in_size).astype(numpy.float32)
    variable = chainer.Variable(x)
    y = common.adaptive_average_pooling_2d(variable, out_size)
    numpy.testing.assert_allclose(
        y.array, reference_adaptive_average(x, *out_size), rtol=1e-5,
        atol=1e-6)
    # Each input pixel's gradient is the sum of 1/|bin| over its bins.
    F.sum(y).backward()
    expected = numpy.zeros(in_size)
    out_h, out_w = out_size
    for i in range(out_h):
        for j in range(out_w):
            mask = numpy.zeros(in_size)
            top = (i * in_size[0]) // out_h
            bottom = -(-((i + 1) * in_size[0]) // out_h)
            left = (j * in_size[1]) // out_w
            right = -(-((j + 1) * in_size[1]) // out_w)
            mask[top:bottom, left:right] = 1.0 / mask[
                top:bottom, left:right].size
            expected += mask
    numpy.testing.assert_allclose(
        variable.grad, numpy.broadcast_to(expected, x.shape), rtol=1e-5)


def test_classifier_forward_is_head_of_predictor():
    predictor = L.Linear(5, 3, initialW=chainer.initializers.Normal(
        1.0, rng=numpy.random.RandomState(0)))
    classifier = models.Classifier(predictor)
    assert isinstance(classifier, L.Classifier)
    x = numpy.random.RandomState(1).standard_normal((4, 5)).astype(
        numpy.float32)
    t = numpy.array([0, 1, 2, 1], dtype=numpy.int32)
    observer = chainer.Reporter()
    observer.add_observer('main', classifier)
    observation = {}
    with observer.scope(observation):
        loss = classifier(x, t)
    assert set(observation) == {'main/loss', 'main/accuracy'}
    head_loss = classifier.head(predictor(x), t)
    numpy.testing.assert_allclose(loss.array, head_loss.array, rtol=1e-6)
    numpy.testing.assert_allclose(
        loss.array, F.softmax_cross_entropy(predictor(x), t).array,
        rtol=1e-6)
    # Labels by keyword, as chainer.links.Classifier allows.
    by_key = models.Classifier(predictor, label_key='t')
    numpy.testing.assert_allclose(by_key(x, t=t).array, loss.array,
                                  rtol=1e-6)
