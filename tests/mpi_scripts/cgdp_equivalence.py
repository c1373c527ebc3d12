"""Multi-node CGDP: N ranks x 1 device == 1 process x N devices.

Run: mpiexec -n 2 python tests/mpi_scripts/cgdp_equivalence.py
Each rank trains with CGDPUpdater(devices=['@numpy'], mpi_comm=COMM_WORLD)
on its shard of the global batch; every rank also trains the
single-process reference, CGDPUpdater(devices=['@numpy'] * N) on the whole
batch, and compares the parameters after the same iterations (rtol 1e-5).
StandardUpdater on the whole batch with the mean loss is checked too.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402

GLOBAL_BATCH = 8
N_FEATURES, N_CLASSES = 6, 3
ITERATIONS = 3


def make_optimizer(model):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return optimizer


def train(dataset, batch_size, make_updater):
    model, _ = _common.staged_updates(dataset, batch_size, make_optimizer,
                                      make_updater, ITERATIONS)
    return model


def main():
    comm = _common.start_mpi()
    size = comm.Get_size()
    with cgdp_mpi.abort_on_exception(comm):
        dataset = _common.numbered_dataset(GLOBAL_BATCH, N_FEATURES,
                                           N_CLASSES)
        shard = cgdp_mpi.shard_dataset(dataset, comm)
        multi_node = train(
            shard, GLOBAL_BATCH // size,
            lambda iterator, optimizer: CGDPUpdater(
                iterator, optimizer, devices=['@numpy'], chunk_size=1,
                mpi_comm=comm))
        initial = {name: param.array
                   for name, param in _common.staged_mlp(seed=0).namedparams()}
        assert _common.parameters_changed(multi_node, initial)
        one_process = train(
            dataset, GLOBAL_BATCH,
            lambda iterator, optimizer: CGDPUpdater(
                iterator, optimizer, devices=['@numpy'] * size,
                chunk_size=1))
        _common.assert_same_parameters(multi_node, one_process, rtol=1e-5)
        standard = train(
            dataset, GLOBAL_BATCH,
            lambda iterator, optimizer: chainer.training.updaters
            .StandardUpdater(iterator, optimizer))
        _common.assert_same_parameters(multi_node, standard, rtol=1e-5)
        _common.report_ok(comm, 'cgdp')


if __name__ == '__main__':
    main()
