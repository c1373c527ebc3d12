"""A last batch with fewer examples than a rank's replicas, across ranks.

Run: mpiexec -n 2 python tests/mpi_scripts/short_batches.py
Each rank trains an epoch without repeat on its 33 examples at batch 16
(its third batch holds 1 example for its 2 replicas), with CGDPUpdater:

* given ChainerMN's multi-node optimizer, or CGDP's own (thread workers),
  against ChainerMN's own ``StandardUpdater`` with ChainerMN's (one device
  per rank; all spend their first update() on the broadcast);
* given ``mpi_comm=`` (process workers), against ChainerMN's baseline
  (``make_chainermn_updater``, which broadcasts before training).

Each rank checks its parameters and every iteration's reported values
against the reference's. Then ``cgdp_chainer.create_multi_node_optimizer``
against ChainerMN's where the ranks' last local batches differ (1 example
and 9): the mean over the ranks of each rank's mean, as ChainerMN's.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402

PER_RANK, BATCH, ITERATIONS = 33, 16, 3


def train(comm, make_updater):
    """The rank's epoch; its model and each iteration's reported values."""
    model = _common.staged_mlp(seed=comm.rank)  # the ranks start apart
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    data = _common.numbered_dataset(2 * PER_RANK, 6, 3, seed=5)
    shard = data[comm.rank * PER_RANK:(comm.rank + 1) * PER_RANK]
    iterator = chainer.iterators.SerialIterator(shard, BATCH, repeat=False,
                                                shuffle=False)
    updater = make_updater(iterator, optimizer)
    reports = []
    for _ in range(ITERATIONS):
        reporter = chainer.Reporter()
        reporter.add_observer('main', model)
        observation = {}
        with reporter.scope(observation):
            updater.update()
        reports.append({key: float(chainer.as_array(value))
                        for key, value in observation.items()})
    assert iterator.epoch == 1, iterator.epoch
    updater.finalize()
    return model, reports


def check_same(ours, theirs):
    _common.assert_same_parameters(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    for iteration, (got, want) in enumerate(zip(ours[1], theirs[1])):
        assert sorted(got) == sorted(want), (iteration, got, want)
        for key in want:
            numpy.testing.assert_allclose(
                got[key], want[key], rtol=1e-5, atol=1e-6,
                err_msg='{} at iteration {}'.format(key, iteration + 1))


def optimizer_form(comm, create_multi_node_optimizer):
    """The optimizer form over the ranks' batches of 16, 16 and then 1 on
    rank 0, 9 on rank 1: the model and its losses."""
    model = _common.staged_mlp(seed=comm.rank)
    optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1), comm)
    optimizer.setup(model)
    data = _common.numbered_dataset(2 * PER_RANK, 6, 3, seed=5)
    shard = data[comm.rank * PER_RANK:(comm.rank + 1) * PER_RANK]
    ends = [0, BATCH, 2 * BATCH, 2 * BATCH + (1 if comm.rank == 0 else 9)]
    losses = []
    for start, end in zip(ends, ends[1:]):
        optimizer.update(model, *chainer.dataset.concat_examples(
            shard[start:end]))
        losses.append(float(model.loss.array))
    if hasattr(optimizer, 'close'):
        optimizer.close()
    return model, losses


def main():
    world = _common.start_mpi()
    comm = chainermn.create_communicator('naive', mpi_comm=world)
    with cgdp_mpi.abort_on_exception(world):
        def multi_node(optimizer):
            return chainermn.create_multi_node_optimizer(optimizer, comm)

        chainermn_run = train(
            comm, lambda iterator, optimizer:
            chainer.training.updaters.StandardUpdater(
                iterator, multi_node(optimizer)))
        check_same(
            train(comm, lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
                iterator, multi_node(optimizer), ['@numpy'] * 2,
                workers='thread')), chainermn_run)
        # CGDP's own optimizer form given to the updater: the same.
        check_same(
            train(comm, lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
                iterator, cgdp_chainer.create_multi_node_optimizer(
                    optimizer, world), ['@numpy'] * 2, workers='thread')),
            chainermn_run)
        check_same(
            train(comm, lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
                iterator, optimizer, ['@numpy'] * 2, mpi_comm=world,
                workers='process')),
            train(comm, lambda iterator, optimizer:
                  cgdp_mpi.make_chainermn_updater(iterator, optimizer, comm,
                                                  '@numpy')))
        # Local batches of different sizes: the mean over the ranks of
        # each rank's mean, as ChainerMN's (ranks weigh alike).
        ours = optimizer_form(comm, cgdp_chainer.create_multi_node_optimizer)
        theirs = optimizer_form(comm, chainermn.create_multi_node_optimizer)
        _common.assert_same_parameters(ours[0], theirs[0], rtol=1e-5,
                                       atol=1e-6)
        numpy.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5)
        _common.report_ok(world, 'short-batches')


if __name__ == '__main__':
    main()
