"""Multi-node CGDP: every rank derives its replicas' random streams from
rank 0's seed, and the ranks' replicas draw different streams.

Run: mpiexec -n 2 python tests/mpi_scripts/random_streams.py
Each rank seeds NumPy with a seed of its own before it builds its updater
(one '@numpy' replica thread, F.dropout in the model) and trains twice; the
dropout masks (a fingerprint per iteration) must be the same in both runs,
differ between ranks, and the updaters' base seed must be rank 0's.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402

BATCH = 4
ITERATIONS = 3


class DropoutMLP(chainer.Chain):
    """Reports a fingerprint of its dropout mask (``main/mask``)."""

    def __init__(self):
        super(DropoutMLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(6, 16, initialW=chainer.initializers.One())
            self.l2 = L.Linear(16, 3, initialW=chainer.initializers.One())

    def forward(self, x, t):
        h = F.relu(self.l1(x))
        mask = F.dropout(self.xp.ones_like(h.array), 0.5).array
        kept = (mask != 0).ravel()
        weights = numpy.arange(1, kept.size + 1, dtype=numpy.float64) ** 1.5
        chainer.report({'mask': float(numpy.dot(kept, weights))}, self)
        loss = F.softmax_cross_entropy(self.l2(h * mask), t)
        chainer.report({'loss': loss}, self)
        return loss


def train(comm, dataset):
    """One seeded run; returns the masks' fingerprints and the base seed
    the updater was built with and the one it trained with."""
    numpy.random.seed(100 + comm.Get_rank())  # a different seed per rank
    model = DropoutMLP()
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(dataset, BATCH,
                                                shuffle=False)
    # Every example's loss is the same with these weights, so the first
    # iteration cannot find the reduction: it is given.
    updater = CGDPUpdater(iterator, optimizer, devices=['@numpy'],
                          workers='thread', mpi_comm=comm, reduction='mean')
    built_with = updater.random_base
    masks = []
    try:
        for _ in range(ITERATIONS):
            observation = {}
            with chainer.Reporter().scope(observation):
                updater.update()
            masks.append(float(observation['main/mask']))
    finally:
        updater.finalize()
    return masks, built_with, updater.random_base


def main():
    comm = _common.start_mpi()
    with cgdp_mpi.abort_on_exception(comm):
        dataset = cgdp_mpi.shard_dataset(
            _common.numbered_dataset(BATCH * comm.Get_size() * ITERATIONS,
                                     6, 3), comm)
        first, built_with, trained_with = train(comm, dataset)
        second, _, _ = train(comm, dataset)
        assert first == second, (first, second)
        ranks = comm.allgather((first, built_with, trained_with))
        rank0_base = ranks[0][1]
        assert all(base == rank0_base for _, _, base in ranks), ranks
        assert len({built for _, built, _ in ranks}) == len(ranks), ranks
        masks = [value for rank_masks, _, _ in ranks for value in rank_masks]
        assert len(set(masks)) == len(masks), masks
        _common.report_ok(comm, 'random')


if __name__ == '__main__':
    main()
