"""Links that normalize over the batch, said once where the replicas split
it.

In training mode ``L.BatchNormalization`` (and ``L.BatchRenormalization``,
a subclass) and ``L.DecorrelatedBatchNormalization`` normalize with the
mean and variance over the batch axis. Each replica computes them over its
own share, as ``ParallelUpdater``, ``MultiprocessParallelUpdater`` and
ChainerMN (per rank) do; ``StandardUpdater`` computes them over the whole
batch, so the result then differs from the updater a script replaced.
``L.GroupNormalization`` and ``L.LayerNormalization`` normalize each example
on its own (nothing differs); ChainerMN's ``MultiNodeBatchNormalization``
computes them over every rank's batch.
"""
import warnings

import chainer
import chainer.links as L


class BatchStatisticsWarning(UserWarning):
    """Each replica normalizes over its share of the batch."""


# Links whose training-mode forward normalizes over the batch axis.
BATCH_NORMALIZING_LINKS = (L.BatchNormalization,
                           L.DecorrelatedBatchNormalization)


def batch_normalizing_links(model):
    """The paths of ``model``'s links that normalize over the batch in
    training mode (see the module's docstring), as ``namedlinks()`` lists
    them."""
    return [path or '/' for path, link in model.namedlinks()
            if isinstance(link, BATCH_NORMALIZING_LINKS)]


class BatchStatisticsNotice(object):
    """Says once, at the first update in training mode, that each replica
    normalizes over its share, where the model has such links and more
    than one replica (with one, nothing differs).

    Args:
        model (chainer.Link): The master model.
        n_replicas (int): The replicas that split each batch.
        who (str): The updater's name in the line (``'CGDPUpdater'``).
    """

    def __init__(self, model, n_replicas, who):
        self._links = batch_normalizing_links(model) if n_replicas > 1 \
            else []
        self._n_replicas = n_replicas
        self._who = who

    def check(self, here=True):
        """Warns (:class:`BatchStatisticsWarning`) if pending and
        ``chainer.config.train``; then never again.

        Args:
            here (bool): Whether this process says it (rank 0 under MPI;
                the others only stop waiting to).
        """
        if not self._links or not chainer.config.train:
            return
        if not here:
            self._links = []
            return
        links, self._links = self._links, []
        warnings.warn(
            '{}: each of the {} replicas normalizes {} over its own share '
            'of the batch, as ParallelUpdater and ChainerMN do (not over '
            'the whole batch, as StandardUpdater); whole-batch statistics: '
            'chainermn.links.MultiNodeBatchNormalization under '
            'cgdp_chainer.create_multi_node_optimizer'.format(
                self._who, self._n_replicas, ', '.join(links[:3]) + (
                    ' and {} more'.format(len(links) - 3)
                    if len(links) > 3 else '')),
            BatchStatisticsWarning, stacklevel=2)
