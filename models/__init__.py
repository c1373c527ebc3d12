"""The checkout's ``models`` package: the four networks of the paper, from
:mod:`cgdp_chainer.models`, and :mod:`models.examples`.

The networks are part of the installed library (the cost model builds
them); this package is not installed. It keeps the repository's commands
and documents working as they are written: ``import models``,
``from models import common`` and ``--net models.examples:tiny`` from the
repository root.
"""
from cgdp_chainer.models import *  # NOQA: the networks and their helpers
from cgdp_chainer.models import __all__ as _networks_all
from cgdp_chainer.models import alexnet  # NOQA
from cgdp_chainer.models import classifier  # NOQA
from cgdp_chainer.models import common  # NOQA
from cgdp_chainer.models import custom  # NOQA
from cgdp_chainer.models import googlenet  # NOQA
from cgdp_chainer.models import resnet  # NOQA
from cgdp_chainer.models import vgg  # NOQA

__all__ = list(_networks_all) + ['custom', 'common']
