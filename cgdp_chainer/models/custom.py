"""Networks named ``module:callable``: any Chainer model on the commands.

Besides the four networks of :data:`cgdp_chainer.models.NETWORKS`, the experiment
commands take ``--net module:callable``: ``module`` is imported, the
callable found in it (a dotted path, e.g. ``pkg.mod:Factory.build``) is
called with no arguments, and it must return a :class:`chainer.Link` that
maps an image batch ``(N, 3, S, S)`` to class scores ``(N, classes)``
(or a tuple of such outputs, main output first, as GoogLeNet's auxiliary
heads give in training mode). The commands wrap it in
:class:`cgdp_chainer.models.Classifier`, as they do the four.

:func:`build` makes the model; :func:`probe` checks it once, before any
work, with a forward of one image on the CPU. Both raise ``ValueError``
with a message that names ``--net`` and what is wrong.
"""
import importlib
import re
import warnings

import chainer
import numpy

# What separates the module from the callable.
SEPARATOR = ':'
_DOTTED_NAME = re.compile(r'^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$')


def is_spec(net):
    """Whether ``net`` names a network as ``module:callable``.

    Args:
        net (str): A ``--net`` value.
    """
    return SEPARATOR in net


def split_spec(net):
    """The module and the callable's path of ``module:callable``.

    Args:
        net (str): The ``--net`` value.

    Returns:
        tuple of str: ``(module, callable)``.

    Raises:
        ValueError: Not two dotted Python names around one ``:``.
    """
    parts = net.split(SEPARATOR)
    if len(parts) != 2 or not all(_DOTTED_NAME.match(p) for p in parts):
        raise ValueError(
            '{!r} is not of the form module:callable (e.g. '
            'models.examples:resnet50): a dotted module name, one colon, '
            'and the name of a callable in that module'.format(net))
    return parts[0], parts[1]


def load_callable(net):
    """Imports the module of ``net`` and returns its callable.

    Args:
        net (str): ``module:callable``.

    Returns:
        callable: The function or class that builds the model.

    Raises:
        ValueError: Malformed, the module does not import, it has no such
            attribute, or the attribute is not callable.
    """
    module_name, path = split_spec(net)
    try:
        target = importlib.import_module(module_name)
    except Exception as error:  # any failure of the user's module
        raise ValueError('--net {}: cannot import module {}: {}: {}'.format(
            net, module_name, type(error).__name__, error))
    for name in path.split('.'):
        if not hasattr(target, name):
            raise ValueError('--net {}: {} has no attribute {!r}'.format(
                net, getattr(target, '__name__', module_name), name))
        target = getattr(target, name)
    if not callable(target):
        raise ValueError('--net {}: {} is not callable (its type is {}); '
                         'name a function or class that builds the '
                         'model'.format(net, path, type(target).__name__))
    return target


def build(net, seed=None):
    """Calls the callable of ``net`` and checks that it gave a Link.

    The call runs with NumPy's global random state seeded by ``seed`` (and
    restored afterwards), so weights drawn by Chainer's default
    initializers are the same for the same seed; a model that seeds its
    own initializers is not affected.

    Args:
        net (str): ``module:callable``.
        seed (int or None): Seed of NumPy's global random state during the
            call; ``None`` leaves the state alone.

    Returns:
        chainer.Link: The model (the predictor, without a loss).

    Raises:
        ValueError: The callable cannot be loaded, raises, or returns
            something that is not a ``chainer.Link``.
    """
    function = load_callable(net)
    saved = numpy.random.get_state()
    if seed is not None:
        numpy.random.seed(seed)
    try:
        link = function()
    except Exception as error:  # any failure of the user's code
        raise ValueError('--net {}: calling it raised {}: {}'.format(
            net, type(error).__name__, error))
    finally:
        numpy.random.set_state(saved)
    if not isinstance(link, chainer.Link):
        raise ValueError('--net {}: it returned a {}, not a chainer.Link that '
                         'maps images to class scores'.format(
                             net, type(link).__name__))
    return link


def probe(net, link, n_classes, image_size):
    """Checks that ``link`` maps one image to ``n_classes`` scores.

    One forward, in training mode (the mode the commands train in) without
    a graph, of a batch of one image of ``image_size`` pixels on the CPU.
    NumPy's global random state (dropout) is restored afterwards.

    Args:
        net (str): The ``--net`` value, for the messages.
        link (chainer.Link): The model from :func:`build`; it is moved to
            the CPU.
        n_classes (int): The scores expected per image (``--classes``).
        image_size (int): Side of the images (``--image-size``).

    Raises:
        ValueError: The forward raises, or an output is not ``(1,
            n_classes)``.
    """
    link.to_device('@numpy')
    x = numpy.random.RandomState(0).uniform(
        -1, 1, (1, 3, image_size, image_size)).astype(numpy.float32)
    y = quiet_forward(lambda: link(x), '--net {}: its forward on one {}x{} '
                      'image failed'.format(net, image_size, image_size))
    outputs = y if isinstance(y, tuple) else (y,)
    for output in outputs:
        shape = getattr(output, 'shape', None)
        if shape is None or tuple(shape) != (1, n_classes):
            got = 'a {}'.format(type(output).__name__) if shape is None \
                else 'shape {}'.format(tuple(shape))
            hint = (' (give --classes {})'.format(shape[1])
                    if shape is not None and len(shape) == 2 and
                    shape[0] == 1 else '')
            raise ValueError(
                '--net {}: one {}x{} image gave {}, not the scores of '
                '{} classes, shape (1, {}){}'.format(
                    net, image_size, image_size, got, n_classes, n_classes,
                    hint))


def quiet_forward(call, failure):
    """``call()`` in training mode without a graph, for a check of shapes.

    Warnings are silenced (a batch of one makes batch normalization warn
    that its output is zero: true, and harmless here) and NumPy's global
    random state (dropout) is restored afterwards.

    Args:
        call (callable): The forward, without arguments.
        failure (str): What failed, for the message (``--net X: its forward
            on ... failed``).

    Returns:
        What ``call()`` returned.

    Raises:
        ValueError: ``call()`` raised; the message is ``failure``, then the
            error's type and words.
    """
    saved = numpy.random.get_state()
    try:
        with warnings.catch_warnings(), \
                chainer.using_config('train', True), \
                chainer.using_config('enable_backprop', False):
            warnings.simplefilter('ignore')
            return call()
    except Exception as error:  # any failure of the user's model
        raise ValueError('{}: {}: {}'.format(failure, type(error).__name__,
                                             error))
    finally:
        numpy.random.set_state(saved)
