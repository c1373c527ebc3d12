"""ChainerMN's MultiNodeBatchNormalization under CGDP's optimizer form.

Run: mpiexec -n 2 python tests/mpi_scripts/multi_node_batch_normalization.py
The link normalizes over every rank's batch (its forward and backward
all-reduce the statistics on the main thread, while CGDP's communication
thread sums the chunks). Four update() calls of a model with one, through
``cgdp_chainer.create_multi_node_optimizer`` and through ChainerMN's: equal
parameters, losses and running statistics on every rank. This is the
whole batch's normalization that BatchStatisticsWarning points to.
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402


class Net(chainer.Chain):

    def __init__(self, comm):
        super(Net, self).__init__()
        random = numpy.random.RandomState(0)
        with self.init_scope():
            self.l1 = L.Linear(6, 5, initialW=random.normal(
                size=(5, 6)).astype(numpy.float32))
            self.bn = chainermn.links.MultiNodeBatchNormalization(5, comm)
            self.l2 = L.Linear(5, 3, initialW=random.normal(
                size=(3, 5)).astype(numpy.float32))

    def forward(self, x):
        return self.l2(F.relu(self.bn(self.l1(x))))


def run(comm, create_multi_node_optimizer):
    """Four updates on the rank's batches; the model and its losses."""
    model = L.Classifier(Net(comm))
    optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1), comm)
    optimizer.setup(model)
    data = _common.numbered_dataset(48, 6, 3, seed=2)
    losses = []
    for step in range(4):
        start = comm.rank * 24 + step * 6
        x, t = chainer.dataset.concat_examples(data[start:start + 6])
        optimizer.update(model, x, t)
        losses.append(float(model.loss.array))
    if hasattr(optimizer, 'close'):
        optimizer.close()
    return model, losses


def main():
    world = _common.start_mpi()
    comm = chainermn.create_communicator('naive', mpi_comm=world)
    with cgdp_mpi.abort_on_exception(world):
        ours = run(comm, cgdp_chainer.create_multi_node_optimizer)
        theirs = run(comm, chainermn.create_multi_node_optimizer)
        _common.assert_same_parameters(ours[0], theirs[0], rtol=1e-5,
                                       atol=1e-6)
        numpy.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5)
        for name in ('avg_mean', 'avg_var'):
            numpy.testing.assert_allclose(
                getattr(ours[0].predictor.bn, name),
                getattr(theirs[0].predictor.bn, name), rtol=1e-5,
                err_msg=name)
        _common.report_ok(world, 'multi-node-bn',
                          ['losses {}'.format(ours[1])])


if __name__ == '__main__':
    main()
