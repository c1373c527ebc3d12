"""One MPI job of ``benchmarks.runtime``'s ``ranks`` and ``shortranks``
parts: each rank trains one '@numpy' replica with a multi-node optimizer.

    mpiexec -launcher fork -n 2 python -m benchmarks.mpi_ranks
        --optimizer cgdp|chainermn [--net resnet152] [--image-size 64]
        [--batch 4] [--iterations 5] [--warmup 2]

The same training script for both optimizers, as a ChainerMN user writes
it: a naive ChainerMN communicator, MomentumSGD wrapped by
``cgdp_chainer.create_multi_node_optimizer`` or by
``chainermn.create_multi_node_optimizer`` (the one line that differs), a
StandardUpdater on this rank's batch of ``--batch`` examples, one BLAS
thread per rank (:class:`cgdp_chainer.blas.BlasLimit`). Each rank times its
``update()`` calls after the warm-up; an iteration of the job takes the
longest rank's time. Rank 0 prints one JSON line::

    {"optimizer": "cgdp", "ranks": 2, "seconds": [...]}

The first ``update()`` of either optimizer only broadcasts rank 0's weights
(ChainerMN's behaviour), so it always counts as warm-up.
"""
import json

from experiments import cli  # NOQA: first, it silences import-time warnings

from benchmarks import runtime as runtime_benchmark

import chainer
import models
import numpy

import cgdp_chainer
from cgdp_chainer import blas
from cgdp_chainer import mpi as cgdp_mpi

OPTIMIZERS = ('cgdp', 'cgdp-rank-hosts', 'chainermn')


def multi_node_optimizer(kind, communicator):
    """MomentumSGD, as in the other parts, wrapped for the ranks.

    Args:
        kind (str): ``'cgdp'``, ``'cgdp-rank-hosts'`` (``node_host=False``)
            or ``'chainermn'``: whose ``create_multi_node_optimizer`` wraps
            it.
        communicator: The ChainerMN communicator.

    Returns:
        The multi-node optimizer (not set up yet).
    """
    import chainermn
    actual = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    if kind in ('cgdp', 'cgdp-rank-hosts'):
        # cgdp-rank-hosts: every rank keeps a host of its own, where the
        # ranks of this machine would share one.
        return cgdp_chainer.create_multi_node_optimizer(
            actual, communicator, node_host=kind == 'cgdp')
    return chainermn.create_multi_node_optimizer(actual, communicator)


def rank_seconds(args, communicator):
    """This rank's training: seconds of each measured update.

    Args:
        args (argparse.Namespace): The parsed command line.
        communicator: The ChainerMN communicator.

    Returns:
        list of float: Seconds per measured update on this rank.
    """
    with blas.BlasLimit(1):
        model = models.Classifier(models.get_model(args.net, seed=0))
        optimizer = multi_node_optimizer(args.optimizer, communicator)
        optimizer.setup(model)
        iterator = runtime_benchmark._iterator(1, args.batch,
                                               args.image_size)
        updater = chainer.training.updaters.StandardUpdater(iterator,
                                                            optimizer)
        try:
            # The same loop as the other parts' (it finalizes the updater).
            return runtime_benchmark._iteration_times(
                updater, args.iterations, max(1, args.warmup))
        finally:
            if args.optimizer != 'chainermn':
                optimizer.close()


def job_seconds(times, mpi_comm):
    """Per iteration, the longest rank's seconds (collective).

    Args:
        times (list of float): This rank's seconds per measured update.
        mpi_comm (mpi4py.MPI.Comm): The ranks.
    """
    from mpi4py import MPI
    mine = numpy.asarray(times, dtype=numpy.float64)
    longest = numpy.empty_like(mine)
    mpi_comm.Allreduce(mine, longest, op=MPI.MAX)
    return longest.tolist()


def build_parser():
    parser = cli.ArgumentParser(prog='python -m benchmarks.mpi_ranks',
                                description=__doc__.splitlines()[0])
    parser.add_argument('--optimizer', required=True, choices=OPTIMIZERS)
    parser.add_argument('--net', default='resnet152', type=cli.net_spec)
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--batch', type=cli.positive_int, default=4)
    parser.add_argument('--iterations', type=cli.positive_int, default=5)
    parser.add_argument('--warmup', type=cli.non_negative_int, default=2)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    cgdp_mpi.init_mpi()
    import chainermn
    communicator = chainermn.create_communicator('naive')
    with cgdp_mpi.abort_on_exception(communicator):
        times = job_seconds(rank_seconds(args, communicator),
                            communicator.mpi_comm)
        if communicator.rank == 0:
            print(json.dumps({'optimizer': args.optimizer,
                              'ranks': communicator.size,
                              'seconds': times}), flush=True)


if __name__ == '__main__':
    main()
