"""The ranks' set-up: consistency check, weight broadcast, data shards.

Run: mpiexec -n 2 python tests/mpi_scripts/consistency.py
check_consistency passes on equal set-ups; for each mismatch case every
rank reports ``CASE <case> rank <r>: <message>`` (the ValueError's
message), which the test compares across ranks. broadcast_parameters and
shard_dataset are checked here too (one job is cheaper than three).
"""
import _common  # first: it imports cgdp_chainer, whose compat module
from _common import cgdp_mpi  # must run before Chainer is imported

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402


class TwoLayerNet(chainer.Chain):
    """fc7 -> fc8, named like the end of AlexNet/VGG."""

    def __init__(self, n_out):
        super(TwoLayerNet, self).__init__()
        with self.init_scope():
            self.fc7 = L.Linear(8, 16)
            self.fc8 = L.Linear(16, n_out)

    def forward(self, x):
        return self.fc8(self.fc7(x))


def build(n_out=100, optimizer_class=chainer.optimizers.MomentumSGD,
          **hyperparameters):
    model = L.Classifier(TwoLayerNet(n_out))
    optimizer = optimizer_class(**hyperparameters)
    optimizer.setup(model)
    return model, optimizer


def run_case(comm, case, model, optimizer):
    """The line to report: this rank's ValueError message."""
    try:
        cgdp_mpi.check_consistency(comm, model, optimizer)
    except ValueError as error:
        return 'CASE {} rank {}: {}'.format(case, comm.Get_rank(), error)
    raise AssertionError('case {}: no ValueError'.format(case))


def check_broadcast(comm):
    """Ranks start from different weights, then all hold rank 0's."""
    numpy.random.seed(comm.Get_rank())
    model, _ = build()
    cgdp_mpi.broadcast_parameters(comm, model, root=0)
    everyone = comm.allgather({name: param.array
                               for name, param in model.namedparams()})
    for name, array in everyone[0].items():
        for rank_arrays in everyone[1:]:
            assert numpy.array_equal(rank_arrays[name], array), name


def check_shards(comm):
    """The shards together hold every example (shuffled the same way on
    every rank, with a given seed or one that rank 0 draws)."""
    dataset = numpy.arange(10) * 10
    for seed in (3, None):
        for shuffle in (False, True):
            shard = cgdp_mpi.shard_dataset(dataset, comm, shuffle=shuffle,
                                           seed=seed)
            everyone = comm.allgather([int(example) for example in shard])
            assert len({len(part) for part in everyone}) == 1, everyone
            assert set().union(*everyone) == set(dataset.tolist()), everyone
            if not shuffle:
                assert everyone[0] == [0, 10, 20, 30, 40][:len(shard)]


def main():
    comm = _common.start_mpi()
    rank = comm.Get_rank()
    with cgdp_mpi.abort_on_exception(comm):
        # Equal set-ups pass (ranks initialize weights differently: values
        # are not part of the check).
        cgdp_mpi.check_consistency(comm, *build(lr=0.01))
        lines = [
            run_case(comm, 'shape', *build(n_out=10 if rank == 1 else 100)),
            run_case(comm, 'lr', *build(lr=0.02 if rank == 1 else 0.01)),
            run_case(comm, 'class', *build(
                optimizer_class=(chainer.optimizers.Adam if rank == 1
                                 else chainer.optimizers.MomentumSGD))),
        ]
        check_broadcast(comm)
        check_shards(comm)
        _common.report_ok(comm, 'consistency', lines)


if __name__ == '__main__':
    main()
