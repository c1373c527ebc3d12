"""The four reference networks of the CGDP paper, as block sequences, and
any other model named ``module:callable``
(see :mod:`cgdp_chainer.models.custom`)."""
from cgdp_chainer.models.alexnet import AlexNet
from cgdp_chainer.models.classifier import Classifier
from cgdp_chainer.models.common import check_image_size
from cgdp_chainer.models.common import min_image_size
from cgdp_chainer.models import custom
from cgdp_chainer.models.googlenet import GoogLeNet
from cgdp_chainer.models.resnet import ResNet152
from cgdp_chainer.models.vgg import VGG16

# The networks of the paper's experiments, in its order.
NETWORKS = ('alexnet', 'googlenet', 'vgg16', 'resnet152')

_CLASSES = {
    'alexnet': AlexNet,
    'googlenet': GoogLeNet,
    'vgg16': VGG16,
    'resnet152': ResNet152,
}

__all__ = ['NETWORKS', 'AlexNet', 'Classifier', 'GoogLeNet', 'ResNet152',
           'VGG16', 'check_image_size', 'check_net_name',
           'check_network', 'get_model', 'is_custom', 'min_image_size']


def get_model(name, n_classes=1000, seed=None):
    """Builds the network a ``--net`` value names, on the CPU, without a loss.

    Args:
        name (str): One of :data:`NETWORKS`, or ``module:callable`` (see
            :mod:`cgdp_chainer.models.custom`).
        n_classes (int): Number of output classes of the four networks; a
            callable decides its own (:func:`check_network` checks that
            they agree).
        seed (int or None): Seed of the weight initialization; the same
            seed gives the same parameters. ``None`` draws fresh entropy.
            For a callable: NumPy's global random state while it runs
            (:func:`cgdp_chainer.models.custom.build`).

    Returns:
        chainer.Link: The network; the four are
        :class:`cgdp_chainer.models.common.SequentialNetwork`, whose ``blocks`` follow
        ``docs/INTERFACES.md``.

    Raises:
        ValueError: ``name`` is not one of :data:`NETWORKS`, or a callable
            that cannot be loaded, raises or returns no Link.
    """
    if is_custom(name):
        return custom.build(name, seed=seed)
    if name not in _CLASSES:
        raise ValueError('unknown network {!r}; valid names are {}'.format(
            name, ', '.join(NETWORKS)))
    return _CLASSES[name](n_classes=n_classes, seed=seed)


def is_custom(net):
    """Whether ``net`` is a ``module:callable`` rather than a name.

    Args:
        net (str): A ``--net`` value.
    """
    return custom.is_spec(net)


def check_net_name(net):
    """Checks the form of a ``--net`` value, without importing anything.

    Args:
        net (str): One of :data:`NETWORKS`, or ``module:callable``.

    Returns:
        str: ``net``.

    Raises:
        ValueError: Neither a known name nor of the form
            ``module:callable``.
    """
    if is_custom(net):
        custom.split_spec(net)
    elif net not in _CLASSES:
        raise ValueError(
            'unknown network {!r}; choose from {}, or give module:callable, '
            'a function that returns a chainer.Link (e.g. '
            'models.examples:resnet50)'.format(net, ', '.join(NETWORKS)))
    return net


def check_network(net, n_classes, image_size):
    """Checks, before any work, that ``net`` can train on such images.

    The four networks: the image size against their minimum. A callable:
    it is built and probed once with one image on the CPU
    (:func:`cgdp_chainer.models.custom.probe`).

    Args:
        net (str): A ``--net`` value.
        n_classes (int): Classes the scores must have.
        image_size (int): Side of the images.

    Returns:
        chainer.Link or None: The probed model of a callable (the caller
        may look at it, e.g. for ``stages``), ``None`` for the four.

    Raises:
        ValueError: What is wrong, naming ``net``.
    """
    check_net_name(net)
    if not is_custom(net):
        check_image_size(net, image_size)
        return None
    link = custom.build(net, seed=0)
    custom.probe(net, link, n_classes, image_size)
    return link
