"""Every rank finds the same reduction from the loss, or every rank refuses.

Run: mpiexec -n 2 python tests/mpi_scripts/reduction_agreement.py
Each rank trains with ``CGDPUpdater(devices=['@numpy'], mpi_comm=...)`` and
the default reduction, which each finds from its own batch (on one device,
on two halves of it). With the same summed loss on every rank, all find
``'sum'``; with a summed loss on rank 0 and a mean on the others, every
rank's first ``update()`` raises a ValueError (none waits for the others).
The same with losses that draw random numbers in every mode, which each
rank decides within its sampling noise. A mean found is compared again on
the next batches on every rank: where one rank's batch does not show it
(a loss normalized by its positives, SSD's, whose counts differ), every
rank refuses that iteration before its update; where all show it, all
train on. A rank whose loss has no graph at the first iteration (no
positive entry in its batch) takes the chunks from a rank whose loss has
one, and trains with zero gradients: as StandardUpdater on the ranks'
batches together, with the reduction found or given.
"""
import copy
import os
import sys

import _common  # first: it imports cgdp_chainer, whose compat module
# must run before Chainer is imported

import chainer  # NOQA: E402
import numpy  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import semantics_models  # NOQA: E402


def first_update(comm, sum_loss, noisy=False):
    if noisy:
        # F.gaussian draws from NumPy's global state: seeded, the noise
        # the reduction finder sees is the same in every run (unseeded, a
        # rare draw left a rank undecided and the job failed).
        numpy.random.seed(100 + comm.Get_rank())
    model = semantics_models.NoisyLoss(sum_loss) if noisy else \
        semantics_models.CountingClassifier(sum_loss)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        _common.numbered_dataset(8, 6, 5, seed=comm.Get_rank()), 4,
        shuffle=False)
    updater = CGDPUpdater(iterator, optimizer, devices=['@numpy'],
                          mpi_comm=comm, workers='thread')
    try:
        updater.update()
        return updater.reduction
    except ValueError as error:
        return str(error)
    finally:
        updater.finalize()


def later_batches(comm, form, positives):
    """Three updates of a loss on the positive entries of batches of two
    examples (see semantics_models.PositivesLoss): the iterations done and
    the error that stopped them, if any."""
    model = semantics_models.PositivesLoss(form)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        semantics_models.positives_dataset(positives), 2, shuffle=False)
    updater = CGDPUpdater(iterator, optimizer, devices=['@numpy'],
                          mpi_comm=comm, workers='thread')
    try:
        for _ in range(3):
            updater.update()
        return updater.iteration, updater.reduction
    except ValueError as error:
        return updater.iteration, str(error)
    finally:
        updater.finalize()


def graphless_rank(comm, reduction):
    """Three updates where rank 1's first batch has no positive entry
    (its loss a constant zero without a graph); checked against
    StandardUpdater on every rank's batch together."""
    rank, size = comm.Get_rank(), comm.Get_size()
    positives = [[3, 1, 2, 2, 1, 4], [0, 0, 1, 2, 0, 3]]
    positives += [[2, 1, 1, 1, 3, 3]] * (size - 2)
    model = semantics_models.PositivesLoss('sum')
    reference = copy.deepcopy(model)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    updater = CGDPUpdater(
        chainer.iterators.SerialIterator(semantics_models.positives_dataset(
            positives[rank], seed=rank), 2, shuffle=False),
        optimizer, devices=['@numpy'], mpi_comm=comm, workers='thread',
        reduction=reduction)
    try:
        for _ in range(3):
            updater.update()
    finally:
        updater.finalize()
    datasets = [semantics_models.positives_dataset(p, seed=r)
                for r, p in enumerate(positives)]
    together = [example for i in range(0, 6, 2) for d in datasets
                for example in d[i:i + 2]]
    expected = chainer.optimizers.SGD()
    expected.setup(reference)
    standard = chainer.training.updaters.StandardUpdater(
        chainer.iterators.SerialIterator(together, 2 * size, shuffle=False),
        expected)
    for _ in range(3):
        standard.update()
    _common.assert_same_parameters(model, reference)
    return updater.reduction


def main():
    comm = _common.start_mpi()
    rank = comm.Get_rank()
    agreed = first_update(comm, sum_loss=True)
    assert agreed == 'sum', agreed
    refused = first_update(comm, sum_loss=rank == 0)
    assert 'cannot tell' in refused, refused
    if rank == 0:
        assert "this MPI rank found 'sum'" in refused, refused
    agreed = first_update(comm, sum_loss=False, noisy=True)
    assert agreed == 'mean', agreed
    refused = first_update(comm, sum_loss=rank == 0, noisy=True)
    assert 'cannot tell' in refused, refused
    if rank == 0:
        assert "this MPI rank found 'sum'" in refused, refused
        assert 'a second forward on the whole batch' in refused, refused
    # Equal counts of positives in each first batch; rank 1's second
    # batch holds 1 and 4.
    done, refused = later_batches(
        comm, 'count', [3, 3, 2, 2, 1, 1] if rank == 0 else
        [3, 3, 1, 4, 2, 2])
    assert done == 1, (done, refused)
    assert 'the batch of iteration 2 does not confirm it' in refused, refused
    if rank == 0:
        assert "another MPI rank's batch does not show it" in refused, \
            refused
    done, found = later_batches(comm, 'mean', [3, 3, 1, 4, 2, 2])
    assert (done, found) == (3, 'mean'), (done, found)
    assert graphless_rank(comm, 'sum') == 'sum'
    _common.report_ok(comm, 'reduction')


if __name__ == '__main__':
    main()
