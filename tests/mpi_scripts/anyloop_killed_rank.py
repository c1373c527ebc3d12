"""A rank killed outright in the middle of training.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_killed_rank.py --impl
chainermn|cgdp [--device numpy|standin|gpu]

Two ranks train a small classifier through ``create_multi_node_optimizer``
in a custom loop (``optimizer.update(model, x, t)``); at iteration
``KILL_AT`` rank 1 sends itself SIGKILL: no exception, no handler, no
``MPI_Abort``. Rank 0 goes on into the next update and waits for a peer
that is gone. The test expects the job to end, non-zero, by itself (the
process manager or the implementation notices the dead rank), and nothing
new left in /dev/shm. Never prints an OK line. On '--device gpu' the model and
the batches are on the rank's GPU.

The hang watchdog (_common.WATCHDOG_SECONDS) would end a hung rank 0 too;
the test sets it far beyond its own time bound, so that it does not.
"""
import os
import signal

import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
from chainer.dataset import convert  # NOQA: E402
import chainer.links as L  # NOQA: E402
import chainermn  # NOQA: E402

import _common  # NOQA: E402

KILL_AT = 3
ITERATIONS = 100000  # far more than rank 0 gets to


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0], out=False)
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        device = _anyloop.device_of(args, comm)
        model = L.Classifier(_common.StagedMLP((6, 16, 16, 3), seed=0))
        model.to_device(device)
        optimizer = _anyloop.multi_node_optimizer_factory(
            args.impl, args.device)(
                chainer.optimizers.MomentumSGD(lr=0.01), comm)
        optimizer.setup(model)
        train = chainermn.scatter_dataset(
            _common.numbered_dataset(64, 6, 3) if comm.rank == 0 else None,
            comm)
        train_iter = chainer.iterators.SerialIterator(train, 8)
        for iteration in range(ITERATIONS):
            if comm.rank == 1 and iteration == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            x, t = convert.concat_examples(train_iter.next(), device)
            optimizer.update(model, x, t)
        raise AssertionError('rank {} trained {} iterations without its '
                             'peer'.format(comm.rank, ITERATIONS))


if __name__ == '__main__':
    main()
