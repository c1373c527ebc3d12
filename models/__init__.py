"""The four reference networks of the CGDP paper, as block sequences."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported

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
           'VGG16', 'check_image_size', 'get_model', 'min_image_size']


def get_model(name, n_classes=1000, seed=None):
    """Builds one of the networks, on the CPU.

    Args:
        name (str): One of :data:`NETWORKS`.
        n_classes (int): Number of output classes.
        seed (int or None): Seed of the weight initialization; the same
            seed gives the same parameters. ``None`` draws fresh entropy.

    Returns:
        models.common.SequentialNetwork: The network; its ``blocks`` follow
        ``docs/INTERFACES.md``.

    Raises:
        ValueError: ``name`` is not one of :data:`NETWORKS`.
    """
    if name not in _CLASSES:
        raise ValueError('unknown network {!r}; valid names are {}'.format(
            name, ', '.join(NETWORKS)))
    return _CLASSES[name](n_classes=n_classes, seed=seed)
