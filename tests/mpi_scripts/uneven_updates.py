"""Ranks that call update() different numbers of times, or late.

Run: mpiexec -n 2 python tests/mpi_scripts/uneven_updates.py
--form optimizer|rank-hosts|updater|updater-chainermn
--case ended|raises|blocked|slow|ends-first|raises-first|all-end-first|
raises-first-elsewhere

Two ranks train a small classifier through one multi-node form:
'optimizer' (``cgdp_chainer.create_multi_node_optimizer`` in a custom
loop; the two ranks share the machine's host), 'rank-hosts' (the same with
``node_host=False``: each rank sums through MPI) or 'updater'
(``CGDPUpdater`` over the ranks' communicator) or 'updater-chainermn'
(``CGDPUpdater`` with a ChainerMN multi-node optimizer). No abort hooks of
the script's own. The case:

* ended: rank 1 calls update() ``UPDATES - 1`` times and its script ends,
  while rank 0 calls it ``UPDATES`` times. Never prints an OK line.
* raises ('updater' only): rank 1's batch of call ``LATE_CALL`` raises
  (inside update(), before its gradients leave), while rank 0 waits in
  that call. Never prints an OK line.
* ends-first, raises-first: rank 1 builds its optimizer or updater, then
  its script ends (returns; raises ``ValueError``) before its first
  update(), while rank 0 calls update(). Never prints an OK line.
* raises-first-elsewhere ('optimizer' only): rank 1 raises before its
  first update(), while rank 0 waits in a barrier of the script's, not in
  update(): the abort hooks still end the job. Never prints an OK line.
* all-end-first: every rank builds its optimizer or updater and its
  script ends before any update(): nobody waits, the job ends cleanly.
* blocked: before its update() call ``LATE_CALL``, rank 1 waits in a
  barrier of its own for ``3 x $CGDP_UPDATE_PATIENCE`` seconds (a thread
  of rank 0 joins it then), while rank 0 waits in that update(). Both end
  with ``UPDATES`` calls and the same weights.
* slow: before its call ``LATE_CALL``, rank 0 sleeps ``2 x
  $CGDP_UPDATE_PATIENCE`` seconds. Both end with ``UPDATES`` calls and the
  same weights.
"""
import argparse
import threading
import time

import _common  # NOQA: first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402
from cgdp_chainer.mpi import update_counts  # NOQA: E402

UPDATES = 5
LATE_CALL = 4
N_EXAMPLES, N_FEATURES, N_CLASSES, BATCH = 32, 6, 3, 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--form', choices=(
        'optimizer', 'rank-hosts', 'updater', 'updater-chainermn'),
        required=True)
    parser.add_argument('--case', choices=(
        'ended', 'raises', 'blocked', 'slow', 'ends-first', 'raises-first',
        'all-end-first', 'raises-first-elsewhere'),
        required=True)
    return parser.parse_args()


class OptimizerTraining(object):
    """A custom loop's update() through the optimizer form."""

    def __init__(self, comm, node_host):
        self.model = L.Classifier(_common.StagedMLP((6, 8, 3), seed=0))
        self.optimizer = cgdp_chainer.create_multi_node_optimizer(
            chainer.optimizers.SGD(lr=0.1), comm,
            node_host=node_host).setup(self.model)
        self.batches = _batches(comm)

    def update(self):
        x, t = next(self.batches)
        self.optimizer.update(self.model, x, t)

    def close(self):
        pass


class UpdaterTraining(object):
    """update() through CGDPUpdater over the ranks; ``failing_batch``:
    the iterator raises at that batch (counted from 1)."""

    def __init__(self, comm, failing_batch=None, chainermn_optimizer=False):
        self.model = L.Classifier(_common.StagedMLP((6, 8, 3), seed=0))
        optimizer = chainer.optimizers.SGD(lr=0.1)
        mpi_comm = comm
        if chainermn_optimizer:
            # CGDPUpdater trains across the ChainerMN optimizer's ranks.
            import chainermn
            optimizer = chainermn.create_multi_node_optimizer(
                optimizer, chainermn.create_communicator(
                    'naive', mpi_comm=comm))
            mpi_comm = None
        optimizer.setup(self.model)
        shard = _common.cgdp_mpi.shard_dataset(
            _common.numbered_dataset(N_EXAMPLES, N_FEATURES, N_CLASSES),
            comm)
        iterator = FailingIterator(shard, BATCH, shuffle=False)
        iterator.failing_batch = failing_batch
        self.updater = cgdp_chainer.CGDPUpdater(
            iterator, optimizer, devices=['@numpy'], mpi_comm=mpi_comm)

    def update(self):
        self.updater.update()

    def close(self):
        self.updater.finalize()


class FailingIterator(chainer.iterators.SerialIterator):
    """A SerialIterator whose batch ``failing_batch`` raises."""

    failing_batch = None
    batches = 0

    def __next__(self):
        self.batches += 1
        if self.batches == self.failing_batch:
            raise ValueError('batch {} fails on purpose'.format(self.batches))
        return super(FailingIterator, self).__next__()

    next = __next__


def _batches(comm):
    dataset = _common.numbered_dataset(N_EXAMPLES, N_FEATURES, N_CLASSES)
    x, t = chainer.dataset.concat_examples(dataset)
    x, t = x[comm.rank::comm.size], t[comm.rank::comm.size]
    while True:
        for start in range(0, len(x), BATCH):
            yield x[start:start + BATCH], t[start:start + BATCH]


def main():
    args = parse_args()
    comm = _common.start_mpi()
    patience = update_counts.patience_seconds()
    side = comm.Dup()  # the barrier of rank 1's own (case 'blocked')
    if args.form.startswith('updater'):
        failing = args.case == 'raises' and comm.rank == 1
        training = UpdaterTraining(comm, LATE_CALL if failing else None,
                                   args.form == 'updater-chainermn')
    else:
        training = OptimizerTraining(comm, args.form == 'optimizer')
    if args.case == 'all-end-first':
        _common.report_ok(comm, 'uneven-{}-{}'.format(args.form, args.case))
        return
    if args.case == 'raises-first-elsewhere' and comm.rank == 0:
        side.Barrier()  # rank 1 never joins it
    if '-first' in args.case and comm.rank == 1:
        if args.case.startswith('raises-first'):
            raise ValueError('rank 1 fails loading its data on purpose')
        return
    calls = UPDATES - 1 if args.case == 'ended' and comm.rank == 1 \
        else UPDATES
    for call in range(1, calls + 1):
        if call == LATE_CALL:
            late(args.case, comm.rank, side, patience)
        training.update()
    training.close()
    if args.case in ('ended', 'raises'):
        if comm.rank == 1:
            return  # the script of rank 1 ends here
        raise AssertionError('rank 0 made {} update() calls while rank 1 '
                             'made {}'.format(UPDATES, UPDATES - 1))
    weights = numpy.concatenate([param.array.ravel() for _, param in sorted(
        training.model.namedparams())])
    every = comm.allgather(weights)
    assert all(numpy.array_equal(every[0], other) for other in every), \
        'the ranks ended with different weights'
    _common.report_ok(comm, 'uneven-{}-{}'.format(args.form, args.case))
    side.Free()


def late(case, rank, side, patience):
    """What happens before the late update() call on each rank."""
    if case == 'slow' and rank == 0:
        time.sleep(2 * patience)
    if case == 'blocked':
        if rank == 1:
            side.Barrier()
        else:
            # Rank 0 joins the barrier only after 3 x patience, from a
            # thread: its main thread waits in update() for rank 1.
            joiner = threading.Timer(3 * patience, side.Barrier)
            joiner.daemon = True
            joiner.start()


if __name__ == '__main__':
    main()
