"""A rank that fails in the script's own loop ends the whole job.

Run: mpiexec -n 2 python tests/mpi_scripts/optimizer_rank_fails.py

Two ranks train through ``cgdp_chainer.create_multi_node_optimizer`` in a
custom loop; at iteration ``FAIL_AT`` rank 1 raises in its own code (no
``abort_on_exception`` around it), while rank 0 goes on into the next
``update()``, where it would wait for rank 1's chunks. The optimizer's
abort hooks end the job with rank 1's traceback. Never prints an OK line.
"""
import _common  # NOQA: first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402

FAIL_AT = 3


def main():
    comm = _common.start_mpi()
    model = L.Classifier(L.Linear(6, 3))
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.SGD(), comm).setup(model)
    x = numpy.ones((4, 6), numpy.float32)
    t = numpy.zeros(4, numpy.int32)
    for iteration in range(100000):
        if comm.rank == 1 and iteration == FAIL_AT:
            raise ValueError('rank 1 fails in its own loop')
        optimizer.update(model, x, t)


if __name__ == '__main__':
    main()
