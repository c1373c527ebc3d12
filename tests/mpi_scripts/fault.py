"""A fault on one rank must end the whole job, in bounded time.

Run: mpiexec -n 2 python tests/mpi_scripts/fault.py MODE
MODE:
  main    rank 1 raises in its main thread (abort_on_exception), while
          rank 0 waits on an all-reduce that rank 1 never joins;
  thread  rank 1 raises in another thread (install_abort_hooks), while its
          main thread and rank 0 wait;
  stall   rank 1 hangs without an exception; rank 0's allreducer gives up
          after its stall timeout and aborts the job.
Without the abort every mode would hang forever; the test bounds its time.
"""
import sys
import threading
import time

import numpy

import _common
from _common import cgdp_mpi

FOREVER = 600   # far beyond the test's timeout


def wait_for_peer(allreducer):
    """An all-reduce that the peer never joins: blocks until aborted."""
    allreducer.start([numpy.ones(4, numpy.float32)]).wait()


def fault_in_main_thread(comm, allreducer):
    if comm.Get_rank() == 1:
        time.sleep(0.2)
        raise RuntimeError('injected fault on rank 1')
    wait_for_peer(allreducer)


def fault_in_other_thread(comm, allreducer):
    cgdp_mpi.install_abort_hooks(comm)
    if comm.Get_rank() == 1:
        def accumulate():
            time.sleep(0.2)
            raise RuntimeError('injected fault on rank 1 in a thread')
        threading.Thread(target=accumulate, name='accumulator').start()
        time.sleep(FOREVER)
    wait_for_peer(allreducer)


def stalled_peer(comm, allreducer):
    if comm.Get_rank() == 1:
        time.sleep(FOREVER)
    wait_for_peer(allreducer)


MODES = {'main': fault_in_main_thread, 'thread': fault_in_other_thread,
         'stall': stalled_peer}


def main():
    mode = MODES[sys.argv[1]]
    comm = _common.start_mpi()
    with cgdp_mpi.abort_on_exception(comm):
        allreducer = cgdp_mpi.ChunkAllreducer(comm, stall_timeout=1.0)
        mode(comm, allreducer)


if __name__ == '__main__':
    main()
