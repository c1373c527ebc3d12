"""A ChainerMN script switched to CGDP with one line.

Run: mpiexec -n 2 python tests/mpi_scripts/chainermn_switch.py OUT
In the shape of Chainer v7.8.1's examples/chainermn/mnist/train_mnist.py
(multi-node optimizer, scatter_dataset, a multi-node evaluator, a Trainer),
with a tiny MLP and random MNIST-shaped data made on rank 0. Every rank
trains twice on the same global batches: with the updater line switched to
``CGDPUpdater(train_iter, optimizer, devices=['@numpy', '@numpy'])``, and
with ChainerMN's own ``StandardUpdater``. Then:

* the CGDP run ends with identical parameters on both ranks (the multi-node
  optimizer made CGDP sum over the ranks), equal (rtol 1e-5) to the
  ChainerMN run's;
* both runs' multi-node evaluators report the same validation loss;
* the updater's optimizer is the wrapped one; its first update() is
  ChainerMN's (the loss on the rank's own weights, reported; rank 0's
  weights broadcast; no step), so ``optimizer.t`` and the first
  iteration's reported loss equal ChainerMN's run;
* ``mpi_comm=`` with the multi-node optimizer is accepted when it is the
  optimizer's communicator (or a duplicate), refused when it holds other
  ranks.

MomentumSGD instead of the example's Adam: Adam's step for a gradient
near zero is of the order of ``lr`` whatever the gradient's size, so the
summation order (two replicas, then two ranks, against one device per
rank) can move such an element by more than rtol 1e-5 allows.

The ranks build their models from different seeds: both runs start from
rank 0's weights only through the multi-node optimizer's first update(),
which broadcasts them instead of updating.
"""
import os
import sys

import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
from chainer import training  # NOQA: E402
from chainer.training import extensions  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402

N_IN, N_UNITS, N_OUT = 784, 16, 10
N_TRAIN, N_TEST = 64, 16
BATCH_PER_RANK = 8
ITERATIONS = 4
EVALUATE_EVERY = 2


class MLP(chainer.Chain):

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(N_IN, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def __call__(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def mnist_shaped(n_examples, seed):
    random = numpy.random.RandomState(seed)
    x = random.uniform(0, 1, (n_examples, N_IN)).astype(numpy.float32)
    t = random.randint(0, N_OUT, n_examples).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def scatter(comm):
    """The example's split: rank 0 makes the data, every rank gets a part."""
    if comm.rank == 0:
        train, test = mnist_shaped(N_TRAIN, 1), mnist_shaped(N_TEST, 2)
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=3)
    test = chainermn.scatter_dataset(test, comm, shuffle=True, seed=4)
    return train, test


def train(comm, shards, out, make_updater):
    """One run of the example's training; returns the model and updater."""
    numpy.random.seed(comm.rank)   # the ranks start apart
    model = L.Classifier(MLP(N_UNITS, N_OUT))
    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), comm)
    optimizer.setup(model)
    # A hook, added through the wrapper as scripts do: CGDP runs it on the
    # host with the wrapped optimizer's rules.
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(1e-3))
    train_shard, test_shard = shards
    train_iter = chainer.iterators.SerialIterator(
        train_shard, BATCH_PER_RANK, order_sampler=(
            chainer.iterators.ShuffleOrderSampler(
                numpy.random.RandomState(10 + comm.rank))))
    test_iter = chainer.iterators.SerialIterator(
        test_shard, BATCH_PER_RANK, repeat=False, shuffle=False)
    updater = make_updater(train_iter, optimizer, model)
    trainer = training.Trainer(updater, (ITERATIONS, 'iteration'), out=out)
    evaluator = extensions.Evaluator(test_iter, model, device=-1)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator, trigger=(EVALUATE_EVERY, 'iteration'))
    if comm.rank == 0:
        trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    trainer.run()
    return model, updater, trainer


def cgdp_updater(train_iter, optimizer, model):
    # The one line that changed.
    return CGDPUpdater(train_iter, optimizer, devices=['@numpy', '@numpy'])


def chainermn_updater(train_iter, optimizer, model):
    # The example's line.
    return training.StandardUpdater(train_iter, optimizer, device=-1)


def logged(trainer, key):
    log = trainer.get_extension('LogReport').log
    return [entry[key] for entry in log if key in entry]


def check_ranks_agree(comm, model):
    """Every rank's parameters are exactly rank 0's."""
    mine = {name: param.array for name, param in model.namedparams()}
    for rank, theirs in enumerate(comm.mpi_comm.allgather(mine)):
        for name in sorted(mine):
            numpy.testing.assert_array_equal(
                mine[name], theirs[name],
                err_msg='{} differs from rank {}'.format(name, rank))


def check_mpi_comm_must_match(comm, shards):
    """mpi_comm= beside the multi-node optimizer: the same ranks only."""
    def build(mpi_comm):
        model = L.Classifier(MLP(N_UNITS, N_OUT))
        optimizer = chainermn.create_multi_node_optimizer(
            chainer.optimizers.SGD(), comm)
        optimizer.setup(model)
        iterator = chainer.iterators.SerialIterator(shards[0],
                                                    BATCH_PER_RANK)
        return CGDPUpdater(iterator, optimizer, devices=['@numpy'],
                           mpi_comm=mpi_comm)
    build(comm.mpi_comm).finalize()
    duplicate = comm.mpi_comm.Dup()
    build(duplicate).finalize()
    duplicate.Free()
    alone = comm.mpi_comm.Split(color=comm.rank, key=0)
    try:
        build(alone)
    except ValueError as error:
        assert 'mpi_comm is not the communicator of the multi-node ' \
            'optimizer' in str(error), error
    else:
        raise AssertionError('mpi_comm of one rank was accepted')
    alone.Free()


def main():
    out = sys.argv[1]
    _common.start_mpi()
    comm = chainermn.create_communicator('naive')
    with cgdp_mpi.abort_on_exception(comm):
        shards = scatter(comm)
        cgdp_model, updater, cgdp_trainer = train(
            comm, shards, os.path.join(out, 'cgdp'), cgdp_updater)
        assert type(updater.get_optimizer('main')) is \
            chainer.optimizers.MomentumSGD, updater.get_optimizer('main')
        check_ranks_agree(comm, cgdp_model)
        reference, reference_updater, reference_trainer = train(
            comm, shards, os.path.join(out, 'chainermn'), chainermn_updater)
        # The first update() broadcast rank 0's weights instead of a step.
        assert updater.get_optimizer('main').t == ITERATIONS - 1 == \
            reference_updater.get_optimizer('main').t, (
                updater.get_optimizer('main').t,
                reference_updater.get_optimizer('main').t)
        _common.assert_same_parameters(cgdp_model, reference, rtol=1e-5)
        check_mpi_comm_must_match(comm, shards)
        lines = []
        if comm.rank == 0:
            for key, count in (('validation/main/loss',
                                ITERATIONS // EVALUATE_EVERY),
                               ('main/loss', ITERATIONS)):
                values = logged(cgdp_trainer, key)
                assert len(values) == count, (key, values)
                numpy.testing.assert_allclose(
                    values, logged(reference_trainer, key), rtol=1e-5,
                    err_msg=key)
                lines.append('{} {}'.format(key, values))
        _common.report_ok(comm.mpi_comm, 'chainermn-switch', lines)


if __name__ == '__main__':
    main()
