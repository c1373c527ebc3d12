"""Another rank's failure is never lost, in every run of a loop, one job.

Run: mpiexec -n 2 python tests/mpi_scripts/optimizer_failures.py

Each run builds a model and ``cgdp_chainer.create_multi_node_optimizer``
on both ranks, then rank 1 fails in its second ``update()``: in a host
thread (a rule hook, as ChainerCV's ``GradientScaling``, that raises) or
in its loss function (the caller). Both ranks catch what ``update()``
raises, as a script that goes on would: rank 1 its own error (type,
message, where, the raising frame), rank 0 a ``RuntimeError`` that names
rank 1 and its error; never a bare ``Aborted``. The runs alternate the
node's shared host and a host per rank.
"""
import traceback

import _common  # first: it imports cgdp_chainer before Chainer
from _common import cgdp_mpi

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402

RUNS = 20
MESSAGE = 'injected failure on rank 1'


class FailsOnRankOne(object):
    """A rule hook that raises in its rule's second update on rank 1."""

    name = 'FailsOnRankOne'

    def __init__(self, rank):
        self.rank = rank

    def __call__(self, rule, param):
        if self.rank == 1 and rule.t == 2:
            raise ValueError(MESSAGE + ' (host thread)')


class Model(chainer.Chain):

    def __init__(self, rank, fail_in_loss):
        super(Model, self).__init__()
        random = numpy.random.RandomState(0)
        with self.init_scope():
            self.l1 = L.Linear(4, 6, initialW=random.normal(0, 0.4, (6, 4)))
            self.l2 = L.Linear(6, 3, initialW=random.normal(0, 0.4, (3, 6)))
        self.rank = rank
        self.fail_in_loss = fail_in_loss
        self.calls = 0

    def forward(self, x, t):
        self.calls += 1
        if self.fail_in_loss and self.rank == 1 and self.calls == 3:
            raise ValueError(MESSAGE + ' (loss function)')
        return F.softmax_cross_entropy(self.l2(F.relu(self.l1(x))), t)


def one_run(comm, run):
    rank = comm.Get_rank()
    fail_in_loss = run % 4 >= 2
    model = Model(rank, fail_in_loss)
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1), comm,
        node_host=run % 2 == 0)
    optimizer.setup(model)
    if not fail_in_loss:
        for param in model.params():
            param.update_rule.add_hook(FailsOnRankOne(rank))
    random = numpy.random.RandomState(rank)
    x = random.uniform(-1, 1, (5, 4)).astype(numpy.float32)
    t = random.randint(0, 3, 5).astype(numpy.int32)
    error = None
    try:
        for _ in range(4):
            optimizer.update(model, x, t)
    except Exception as caught:
        error = caught
    optimizer.close()
    where = 'loss function' if fail_in_loss else 'host thread'
    context = 'run {} ({}, node host {}): {!r}'.format(
        run, where, run % 2 == 0, error)
    if rank == 1:
        assert isinstance(error, ValueError), context
        assert MESSAGE in str(error), context
        frames = [f.name for f in traceback.extract_tb(error.__traceback__)]
        assert ('forward' if fail_in_loss else '__call__') in frames, context
    else:
        assert type(error) is RuntimeError, context
        assert 'rank 1 stopped on an error' in str(error), context
        assert 'ValueError: ' + MESSAGE in str(error), context


def main():
    comm = _common.start_mpi()
    with cgdp_mpi.abort_on_exception(comm):
        for run in range(RUNS):
            one_run(comm, run)
            comm.Barrier()
        _common.report_ok(comm, 'optimizer-failures',
                          ['{} runs, every error named'.format(RUNS)])


if __name__ == '__main__':
    main()
