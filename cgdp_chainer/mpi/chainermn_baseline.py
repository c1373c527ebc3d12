"""The ChainerMN baseline: a StandardUpdater with ChainerMN's multi-node
optimizer, one device per rank."""
import numpy


def make_chainermn_updater(iterator, optimizer, comm, device,
                           converter=None, loss_func=None):
    """A ChainerMN data parallel updater: the multi-node baseline.

    One device per rank. Gradients are averaged over the ranks (ChainerMN's
    ``multi_node_mean_grad``), so with each rank's loss a mean over its
    batch, the update equals one process's update with the mean loss over
    the global batch. Uses ChainerMN's ``'naive'`` communicator (MPI on
    host arrays) for ``'@numpy'`` and ``'pure_nccl'`` for ``'@cupy:N'``.

    ChainerMN's multi-node optimizer spends its first ``update`` on
    broadcasting rank 0's weights instead of updating. This function does
    that broadcast now, so every iteration updates, as in single-process
    training and CGDP (parameters that are still uninitialized get their
    broadcast at the first update, ChainerMN's way).

    Args:
        iterator: This rank's iterator (see :func:`shard_dataset`).
        optimizer (chainer.Optimizer): Set up with the model.
        comm: ``mpi4py.MPI.Comm``, or a ChainerMN communicator to use as
            it is.
        device: Device specifier or ``chainer.backend.Device``.
        converter: Batch converter; ``None``: ``concat_examples``.
        loss_func: Loss function; ``None``: the model.

    Returns:
        chainer.training.updaters.StandardUpdater: The updater; its
        optimizer is the multi-node optimizer, whose ``communicator`` is
        the ChainerMN communicator.

    Raises:
        ValueError: The optimizer has not been set up with a model.
    """
    import chainer
    import chainermn
    if optimizer.target is None:
        raise ValueError('set the optimizer up with the model first '
                         '(optimizer.setup(model))')
    device = chainer.get_device(device)
    if isinstance(comm, chainermn.CommunicatorBase):
        communicator = comm
    else:
        name = 'naive' if device.xp is numpy else 'pure_nccl'
        if device.xp is not numpy:
            device.use()
        communicator = chainermn.create_communicator(name, mpi_comm=comm)
    multi_node_optimizer = chainermn.create_multi_node_optimizer(
        optimizer, communicator)
    if converter is None:
        converter = chainer.dataset.concat_examples
    # The updater moves the model to ``device``; broadcast afterwards.
    updater = chainer.training.updaters.StandardUpdater(
        iterator, multi_node_optimizer, converter=converter, device=device,
        loss_func=loss_func)
    model = optimizer.target
    communicator.bcast_data(model)
    # Records the parameter set, so the first update is not taken for a
    # change of the model (which would broadcast instead of update).
    multi_node_optimizer.is_changed(model)
    return updater
