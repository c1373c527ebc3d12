"""Multi-node CGDP's param.grad and dynamic loss scaling against
StandardUpdater on the whole batch.

Run: mpiexec -n 2 python tests/mpi_scripts/grads_and_loss_scaling.py
Each rank trains CGDPUpdater(devices=['@numpy'], mpi_comm=COMM_WORLD) on its
shard, MomentumSGD with WeightDecay and GradientHardClipping and
``optimizer.loss_scaling()``; the second batch holds an example, on the last
rank's shard only, that makes that rank's gradients non-finite. After every
update the parameters, ``param.grad`` and the loss scale equal
StandardUpdater's on the whole batch (rtol 1e-5), and the poisoned iteration
is skipped on every rank.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import warnings  # NOQA: E402

import chainer  # NOQA: E402
from chainer import optimizer_hooks  # NOQA: E402
import numpy  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402
from cgdp_chainer.mpi.data import shard_range  # NOQA: E402

GLOBAL_BATCH = 8
N_FEATURES, N_CLASSES = 6, 3
ITERATIONS = 3


def make_optimizer(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    optimizer.add_hook(optimizer_hooks.WeightDecay(1e-2))
    optimizer.add_hook(optimizer_hooks.GradientHardClipping(-2, 2))
    optimizer.loss_scaling(interval=2)
    return optimizer


def train(dataset, batch_size, make_updater):
    """Per update: parameters, gradients and the loss scale."""
    def step(model, optimizer):
        return ({n: p.array.copy() for n, p in model.namedparams()},
                {n: p.grad.copy() for n, p in model.namedparams()},
                optimizer._loss_scale)

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the non-finite gradient
        _, steps = _common.staged_updates(dataset, batch_size, make_optimizer,
                                          make_updater, ITERATIONS, step)
    return steps


def datasets(size):
    """The dataset the ranks shard, and StandardUpdater's: its batches are
    the union of the ranks' batches of the same iteration."""
    n = GLOBAL_BATCH * ITERATIONS
    dataset = _common.numbered_dataset(n, N_FEATURES, N_CLASSES)
    x, t = dataset._datasets
    per_rank = GLOBAL_BATCH // size
    begins = [shard_range(n, rank, size)[0] for rank in range(size)]
    # The last example of the last rank's second batch overflows.
    x[begins[-1] + 2 * per_rank - 1] = numpy.finfo(numpy.float32).max
    order = [begin + i * per_rank + j for i in range(ITERATIONS)
             for begin in begins for j in range(per_rank)]
    return dataset, chainer.datasets.TupleDataset(x[order], t[order])


def main():
    comm = _common.start_mpi()
    size = comm.Get_size()
    with cgdp_mpi.abort_on_exception(comm):
        dataset, whole = datasets(size)
        shard = cgdp_mpi.shard_dataset(dataset, comm)
        multi_node = train(
            shard, GLOBAL_BATCH // size,
            lambda iterator, optimizer: CGDPUpdater(
                iterator, optimizer, devices=['@numpy'], chunk_size=1,
                mpi_comm=comm))
        standard = train(
            whole, GLOBAL_BATCH,
            lambda iterator, optimizer: chainer.training.updaters
            .StandardUpdater(iterator, optimizer))
        assert [s[2] for s in standard] == [2.0, 1.0, 2.0 ** 0.5]
        for step, (ours, theirs) in enumerate(zip(multi_node, standard)):
            assert ours[2] == theirs[2], (step, ours[2], theirs[2])
            for kind in (0, 1):
                for name in theirs[kind]:
                    numpy.testing.assert_allclose(
                        ours[kind][name], theirs[kind][name], rtol=1e-5,
                        atol=1e-7, err_msg='{} {} after update {}'.format(
                            ('parameter', 'grad')[kind], name, step + 1))
        for name in standard[0][0]:  # the second update was skipped
            numpy.testing.assert_array_equal(multi_node[1][0][name],
                                             multi_node[0][0][name])
        _common.report_ok(comm, 'grads')


if __name__ == '__main__':
    main()
