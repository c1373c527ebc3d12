"""ChainerMN baseline: 2 ranks x 1 device == 1 process on the whole batch.

Run: mpiexec -n 2 python tests/mpi_scripts/chainermn_baseline.py
Each rank trains on its half of the global batch with the multi-node
optimizer (gradients averaged over ranks); every rank also trains a
single-process reference (StandardUpdater, whole batch, mean loss) and
compares the parameters after the same number of iterations.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

GLOBAL_BATCH = 8
N_FEATURES, N_HIDDEN, N_CLASSES = 6, 10, 3
ITERATIONS = 3


class MLP(chainer.Chain):

    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(N_FEATURES, N_HIDDEN)
            self.l2 = L.Linear(N_HIDDEN, N_CLASSES)

    def forward(self, x):
        return self.l2(chainer.functions.relu(self.l1(x)))


def build_model_and_optimizer():
    # The same seed on every rank and for the reference: the same start.
    numpy.random.seed(0)
    model = L.Classifier(MLP())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    return model, optimizer


def train_reference(dataset):
    model, optimizer = build_model_and_optimizer()
    iterator = chainer.iterators.SerialIterator(
        dataset, GLOBAL_BATCH, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(
        iterator, optimizer, device='@numpy')
    for _ in range(ITERATIONS):
        updater.update()
    return model


def main():
    comm = _common.start_mpi()
    size = comm.Get_size()
    with cgdp_mpi.abort_on_exception(comm):
        dataset = _common.numbered_dataset(GLOBAL_BATCH, N_FEATURES,
                                           N_CLASSES)
        shard = cgdp_mpi.shard_dataset(dataset, comm)
        assert len(shard) == GLOBAL_BATCH // size, len(shard)
        model, optimizer = build_model_and_optimizer()
        initial = {name: param.array.copy()
                   for name, param in model.namedparams()}
        cgdp_mpi.check_consistency(comm, model, optimizer)
        iterator = chainer.iterators.SerialIterator(
            shard, GLOBAL_BATCH // size, shuffle=False)
        updater = cgdp_mpi.make_chainermn_updater(
            iterator, optimizer, comm, '@numpy')
        for _ in range(ITERATIONS):
            updater.update()
        assert optimizer.t == ITERATIONS, optimizer.t
        assert _common.parameters_changed(model, initial)
        _common.assert_same_parameters(model, train_reference(dataset))
        _common.report_ok(comm, 'chainermn')


if __name__ == '__main__':
    main()
