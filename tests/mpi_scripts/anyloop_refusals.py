"""What ``cgdp_chainer.create_multi_node_optimizer`` refuses, in one process.

Run: python tests/mpi_scripts/anyloop_refusals.py (no mpiexec: MPI starts
as a singleton, COMM_WORLD of size 1)

Calls ``cgdp_chainer.create_multi_node_optimizer`` as a ChainerMN script
would, with ChainerMN's naive communicator, in each case that it must
refuse before any work, and prints one JSON line per case:
``{"case": ..., "raised": <exception class name or null>, "message": ...}``.
The cases:

* ``double_buffering``: ``double_buffering=True`` (ChainerMN's option
  trains on the previous iteration's gradients);
* ``not_a_gradient_method``: an actual optimizer that is a
  ``chainer.Optimizer`` but not a ``chainer.GradientMethod``;
* ``wrapped_twice``: ChainerMN's multi-node optimizer given as the actual
  optimizer (a wrapper, not a ``chainer.GradientMethod``).

Runs in a process of its own so that the test process never starts MPI.
"""
import json

import _common  # first: it imports cgdp_chainer before Chainer
from _common import cgdp_mpi

import chainer  # NOQA: E402
import chainermn  # NOQA: E402

import cgdp_chainer  # NOQA: E402


class PlainOptimizer(chainer.Optimizer):
    """An optimizer with its own update(), outside GradientMethod."""

    def update(self, lossfun=None, *args, **kwds):
        self.t += 1


def double_buffering(comm):
    return cgdp_chainer.create_multi_node_optimizer(
        chainer.optimizers.SGD(), comm, double_buffering=True)


def not_a_gradient_method(comm):
    return cgdp_chainer.create_multi_node_optimizer(PlainOptimizer(), comm)


def wrapped_twice(comm):
    return cgdp_chainer.create_multi_node_optimizer(
        chainermn.create_multi_node_optimizer(
            chainer.optimizers.SGD(), comm), comm)


CASES = (double_buffering, not_a_gradient_method, wrapped_twice)


def outcome(case, comm):
    try:
        case(comm)
    except Exception as error:
        return {'case': case.__name__, 'raised': type(error).__name__,
                'message': str(error)}
    return {'case': case.__name__, 'raised': None, 'message': None}


def main():
    cgdp_mpi.init_mpi()
    comm = chainermn.create_communicator('naive')
    for case in CASES:
        print(json.dumps(outcome(case, comm), sort_keys=True), flush=True)


if __name__ == '__main__':
    main()
