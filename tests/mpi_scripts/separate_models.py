"""Ranks that build CGDPUpdaters without joining them: rank 0 warns, once.

Run: mpiexec -n 2 python tests/mpi_scripts/separate_models.py
Every rank builds two CGDPUpdaters with neither ``mpi_comm`` nor a
multi-node optimizer (construction only: nothing trains), then prints
``built rank <r>``. The test reads the warnings that Python prints to
stderr (the job runs with ``PYTHONWARNINGS=default``).
"""
import os

import _common  # first: it imports cgdp_chainer, whose compat module
# must run before Chainer is imported

import chainer  # NOQA: E402

from cgdp_chainer import CGDPUpdater  # NOQA: E402


def build_updater():
    model = _common.staged_mlp(seed=0)
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    dataset = _common.numbered_dataset(8, 6, 3)
    iterator = chainer.iterators.SerialIterator(dataset, 4)
    return CGDPUpdater(iterator, optimizer, devices=['@numpy', '@numpy'])


def main():
    for _ in range(2):
        build_updater().finalize()
    # Hydra's variable: the test runs the venv's MPICH mpiexec.
    print('built rank {}'.format(os.environ['PMI_RANK']), flush=True)


if __name__ == '__main__':
    main()
