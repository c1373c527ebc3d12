"""How CGDPUpdater takes the optimizer it is given, as far as MPI goes.

CGDP runs an optimizer's update rules and hooks itself, on the host, chunk
by chunk; it never calls the optimizer's ``update()``. So:

* a ChainerMN multi-node optimizer
  (``chainermn.create_multi_node_optimizer(optimizer, comm)``, or CGDP's
  own ``cgdp_chainer.create_multi_node_optimizer``), whose
  ``update()`` averages the gradients over the ranks before the wrapped
  optimizer's update, becomes what it means: CGDP over ``comm``'s MPI
  communicator (as with ``mpi_comm=``), running the wrapped optimizer on
  the host. With ``reduction='mean'`` the gradient is the mean over the
  global batch, which is what ChainerMN's average over ranks of per-rank
  means gives (equal per-rank batches). The updater's first ``update()``
  is the optimizer's first (:class:`BroadcastingFirstUpdate`): the loss
  and its backward on the rank's batch, rank 0's weights to every rank,
  and no step, as ChainerMN's;
* ChainerMN's double-buffering optimizer (``double_buffering=True``) is
  refused: it updates with the previous iteration's gradients, which CGDP
  does not reproduce, and the overlap it buys is what CGDP's per-chunk
  all-reduce already does;
* any other optimizer whose ``update()`` does more than Chainer's
  ``GradientMethod.update`` (another wrapper, a subclass overriding it) is
  refused, since CGDP would bypass that code silently;
* a process of a multi-rank MPI launch that gets neither ``mpi_comm`` nor a
  multi-node optimizer trains a model of its own on every rank: rank 0
  warns (:class:`SeparateModelsWarning`), once.

``chainermn`` is not imported here: a multi-node optimizer can exist only
where the user's script imported it.
"""
import sys
import warnings

from cgdp_chainer.mpi.launch import as_mpi_comm
from cgdp_chainer.mpi.launch import launch_rank_and_size


class SeparateModelsWarning(UserWarning):
    """Every rank of an MPI launch trains a model of its own."""


_warned_separate_models = False


def host_optimizer_and_comm(optimizer, mpi_comm):
    """The optimizer that CGDP runs on the host, and the MPI communicator.

    Args:
        optimizer: The optimizer given to ``CGDPUpdater``: a
            ``chainer.GradientMethod`` or a ChainerMN multi-node optimizer
            around one.
        mpi_comm: The ``mpi_comm`` given to ``CGDPUpdater`` (an mpi4py or a
            ChainerMN communicator), or ``None``.

    Returns:
        tuple: ``(optimizer, comm)``: the ``chainer.GradientMethod`` whose
        rules and hooks CGDP runs, and the ``mpi4py.MPI.Comm`` to sum
        chunks over (``None``: this process alone).

    Raises:
        ValueError: The optimizer's ``update()`` does more than CGDP runs
            (double buffering, another wrapper, an override), or
            ``mpi_comm`` is not the multi-node optimizer's communicator.
    """
    comm = None if mpi_comm is None else as_mpi_comm(mpi_comm)
    if _is_multi_node_optimizer(optimizer) or \
            _is_cgdp_multi_node_optimizer(optimizer):
        comm = _joined_comm(comm, as_mpi_comm(optimizer.communicator))
        optimizer = optimizer.actual_optimizer
    refuse_bypassed_update(optimizer, 'CGDPUpdater')
    if comm is None:
        _warn_if_ranks_train_apart()
    return optimizer, comm


class BroadcastingFirstUpdate(object):
    """The first ``update()`` of a multi-node optimizer, for
    ``CGDPUpdater`` given one.

    ChainerMN's ``_MultiNodeOptimizer.update`` computes the loss and its
    backward on the rank's batch, then, finding the model's parameters new
    to it (``is_changed``), broadcasts rank 0's weights instead of the
    update: ``optimizer.t`` stays 0, the iteration's reported loss is that
    of the rank's own weights. The updater's first ``update()`` does the
    same, so that a switched script's parameters, log and snapshots are
    ChainerMN's (CGDP's own optimizer form does it too).

    Args:
        optimizer: The multi-node optimizer given to the updater.
        comm: The ``mpi4py.MPI.Comm`` the updater trains over.
    """

    def __init__(self, optimizer, comm):
        self._optimizer = optimizer
        self._comm = comm

    def due(self):
        """Whether the optimizer's next ``update()`` would broadcast rather
        than update: ChainerMN's own test (which records the parameters, as
        its ``update()`` does), or, for CGDP's optimizer form, not started.
        Asked once, at the updater's first ``update()``."""
        if _is_multi_node_optimizer(self._optimizer):
            return self._optimizer.is_changed(self._optimizer.target)
        return self._optimizer.chunk_plan is None

    def run(self, model, loss, loss_scale):
        """The backward of ``loss`` (the model's forward on the rank's
        batch), then rank 0's weights to every rank, as ChainerMN's first
        ``update()``."""
        model.cleargrads()
        loss.backward(loss_scale=loss_scale)
        from cgdp_chainer.mpi.consistency import broadcast_parameters
        broadcast_parameters(self._comm, model)


def broadcasting_first_update(optimizer, comm):
    """A :class:`BroadcastingFirstUpdate` where ``optimizer`` (as given to
    ``CGDPUpdater``) is a multi-node optimizer, else None."""
    if _is_multi_node_optimizer(optimizer) or \
            _is_cgdp_multi_node_optimizer(optimizer):
        return BroadcastingFirstUpdate(optimizer, comm)
    return None


def _chainermn_optimizer_classes():
    module = sys.modules.get('chainermn.optimizers')
    if module is None:
        return None, None
    return module._MultiNodeOptimizer, module._DoubleBufferingOptimizer


def _is_multi_node_optimizer(optimizer):
    multi_node, double_buffering = _chainermn_optimizer_classes()
    if multi_node is None:
        return False
    if isinstance(optimizer, double_buffering):
        raise ValueError(
            'optimizer is ChainerMN\'s double-buffering multi-node optimizer '
            '(create_multi_node_optimizer(..., double_buffering=True)), '
            'which updates with the previous iteration\'s gradients; CGDP '
            'cannot reproduce that, and already overlaps the all-reduce '
            'with the backward chunk by chunk. Use '
            'create_multi_node_optimizer(optimizer, comm) without '
            'double_buffering')
    return isinstance(optimizer, multi_node)


def _is_cgdp_multi_node_optimizer(optimizer):
    """CGDP's own optimizer form, given to the updater: the updater runs
    its actual optimizer over its communicator, as for ChainerMN's."""
    module = sys.modules.get('cgdp_chainer.runtime.multi_node_optimizer')
    return module is not None and isinstance(optimizer,
                                             module.MultiNodeOptimizer)


def _joined_comm(given, wrapped):
    """``wrapped`` (the multi-node optimizer's), unless ``mpi_comm=`` named
    another group of ranks."""
    if given is None:
        return wrapped
    from mpi4py import MPI
    if MPI.Comm.Compare(given, wrapped) not in (MPI.IDENT, MPI.CONGRUENT):
        raise ValueError(
            'mpi_comm is not the communicator of the multi-node optimizer '
            '(they hold other ranks or order them differently): give '
            'mpi_comm=None to train over the optimizer\'s communicator, or '
            'the same communicator to both')
    return given


def refuse_bypassed_update(optimizer, taker):
    """Raises unless ``optimizer`` is a ``chainer.GradientMethod`` whose
    ``update()`` is Chainer's own: CGDP runs its update rules and hooks
    itself, chunk by chunk on the host, and never calls its ``update()``.

    Args:
        optimizer: The optimizer given to CGDP.
        taker (str): What it was given to (``'CGDPUpdater'``,
            ``'create_multi_node_optimizer'``), for the message.

    Raises:
        ValueError: Naming what would be bypassed, with the fix.
    """
    import chainer
    update = getattr(type(optimizer), 'update', None)
    if update is chainer.GradientMethod.update:
        return
    name = type(optimizer).__name__
    if not isinstance(optimizer, chainer.GradientMethod):
        why = '{} is not a chainer.GradientMethod'.format(name)
    else:
        owner = next(cls for cls in type(optimizer).__mro__
                     if 'update' in vars(cls))
        why = '{} overrides update() (in {})'.format(name, owner.__name__)
    raise ValueError(
        'optimizer: {}; {} runs the update rules and hooks of a '
        'chainer.GradientMethod itself, chunk by chunk on the host, and '
        'never calls its update(), so it would bypass what {}.update() '
        'does. Give a plain chainer.GradientMethod (extra work per update '
        'goes into an optimizer hook, optimizer.add_hook){}'.format(
            why, taker, name, ' or a ChainerMN multi-node optimizer around '
            'one, or train with StandardUpdater' if taker == 'CGDPUpdater'
            else ', or use chainermn.create_multi_node_optimizer'))


def _warn_if_ranks_train_apart():
    global _warned_separate_models
    launch = launch_rank_and_size()
    if launch is None or launch[1] < 2 or _warned_separate_models:
        return
    _warned_separate_models = True
    if launch[0] != 0:
        return
    warnings.warn(
        'this process is rank 0 of {} started by an MPI launcher, and '
        'CGDPUpdater got neither mpi_comm nor a ChainerMN multi-node '
        'optimizer: every rank will train a model of its own. To train one '
        'model over the ranks, give mpi_comm=MPI.COMM_WORLD (or a ChainerMN '
        'communicator), or the optimizer '
        'chainermn.create_multi_node_optimizer(optimizer, comm)'.format(
            launch[1]), SeparateModelsWarning, stacklevel=4)
