"""The four reference networks of the CGDP paper, as stage sequences."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported

import functools

from models.alexnet import AlexNet
from models.classifier import Classifier
from models.common import check_image_size
from models.common import min_image_size
from models.googlenet import GoogLeNet
from models.resnet import ResNet152
from models.vgg import VGG16

# The networks of the paper's experiments, in its order.
NETWORKS = ('alexnet', 'googlenet', 'vgg16', 'resnet152')

_CLASSES = {
    'alexnet': AlexNet,
    'googlenet': GoogLeNet,
    'vgg16': VGG16,
    'resnet152': ResNet152,
}

__all__ = ['NETWORKS', 'AlexNet', 'Classifier', 'GoogLeNet', 'ResNet152',
           'VGG16', 'check_image_size', 'get_model', 'min_image_size',
           'n_stages']


def get_model(name, n_classes=1000, seed=None):
    """Builds one of the networks, on the CPU.

    Args:
        name (str): One of :data:`NETWORKS`.
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization; the same
            seed gives the same parameters. ``None`` draws fresh entropy.

    Returns:
        models.common.StagedNetwork: The network; its ``stages`` follow
        ``docs/INTERFACES.md``.

    Raises:
        ValueError: ``name`` is not one of :data:`NETWORKS`.
    """
    if name not in _CLASSES:
        raise ValueError('unknown network {!r}; valid names are {}'.format(
            name, ', '.join(NETWORKS)))
    return _CLASSES[name](n_classes=n_classes, seed=seed)


@functools.lru_cache(maxsize=None)
def n_stages(name):
    """The number of stages of a network: the largest CGDP chunk size.

    Builds the network once per process, on the CPU and with one class,
    and counts its stages (the networks add them as they are built, so
    the count is only known from a built one). That takes up to a few
    seconds (VGG-16's 134M parameters), so callers ask only when a number
    of stages is needed.

    Args:
        name (str): One of :data:`NETWORKS`.

    Returns:
        int: ``len(get_model(name).stages)``.

    Raises:
        ValueError: ``name`` is not one of :data:`NETWORKS`.
    """
    return len(get_model(name, n_classes=1, seed=0).stages)
