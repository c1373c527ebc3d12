"""ChunkAllreducer sums chunks across ranks, started from two threads.

Run: mpiexec -n N python tests/mpi_scripts/allreduce_sum.py
Every rank knows what every other rank contributes (seeded by rank and
chunk), so each checks its result against numpy's sum of all of them.
"""
import threading
import time

import numpy

import _common
from _common import cgdp_mpi

N_CHUNKS = 12
N_THREADS = 2


def chunk_arrays(rank, chunk):
    """What ``rank`` contributes for ``chunk``: mixed dtypes and layouts."""
    random = numpy.random.RandomState(1000 * rank + chunk)
    if chunk == 3:
        # A lone contiguous array is reduced in place, without packing.
        return [random.standard_normal((7, 5)).astype(numpy.float32)]
    arrays = [
        random.standard_normal((chunk + 1, 3)).astype(numpy.float32),
        random.standard_normal(5),                     # float64
        # A transposed view: not contiguous, so it is packed and unpacked.
        random.standard_normal((4, 6)).astype(numpy.float32).T,
        random.randint(-50, 50, (2, 2)).astype(numpy.int64),
    ]
    if chunk == 5:
        # Big enough that MPI needs many progress calls.
        arrays.append(random.standard_normal(1 << 20).astype(numpy.float32))
    if chunk == 7:
        arrays.append(numpy.zeros((0, 3), numpy.float32))
    return arrays


def expected_sums(size, chunk):
    contributions = [chunk_arrays(rank, chunk) for rank in range(size)]
    return [sum(parts) for parts in zip(*contributions)]


class InOrderStarter(object):
    """Lets threads start chunks concurrently but in chunk order.

    That is the caller's side of the allreducer's contract: the start order
    is the same on every rank (here 0, 1, 2, ...), whichever thread starts.
    """

    def __init__(self, allreducer):
        self.allreducer = allreducer
        self.next_chunk = 0
        self.turn = threading.Condition()

    def start(self, chunk, arrays):
        with self.turn:
            if not self.turn.wait_for(lambda: self.next_chunk == chunk,
                                      timeout=30):
                raise TimeoutError('chunk {} never got its turn'.format(chunk))
            handle = self.allreducer.start(arrays)
            self.next_chunk += 1
            self.turn.notify_all()
        return handle


def run_threads(worker, arguments, errors):
    """Runs ``worker(*args)`` in a thread for each of ``arguments`` and
    waits for them all; raises the first error they handed over in
    ``errors`` (a thread that hangs fails the check)."""
    threads = [threading.Thread(target=worker, args=args)
               for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), 'a worker thread hangs'
    if errors:
        raise errors[0]


def check_chunks_from_two_threads(comm, allreducer):
    rank, size = comm.Get_rank(), comm.Get_size()
    starter = InOrderStarter(allreducer)
    errors = []

    def worker(thread_index):
        try:
            random = numpy.random.RandomState(rank * 10 + thread_index)
            mine = range(thread_index, N_CHUNKS, N_THREADS)
            started = []
            for chunk in mine:
                # Different delays on each rank: the threads interleave
                # differently, the start order stays the same.
                time.sleep(random.uniform(0, 0.01))
                arrays = chunk_arrays(rank, chunk)
                started.append((chunk, arrays, starter.start(chunk, arrays)))
            for chunk, arrays, handle in reversed(started):
                result = handle.wait(timeout=30)
                assert all(got is mine for got, mine in zip(result, arrays))
                for got, want in zip(arrays, expected_sums(size, chunk)):
                    numpy.testing.assert_allclose(
                        got, want, rtol=1e-6,
                        err_msg='chunk {} on rank {}'.format(chunk, rank))
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    run_threads(worker, [(index,) for index in range(N_THREADS)], errors)


def check_sequence_numbers(comm, allreducer):
    """Two threads start numbered chunks in an order that differs between
    ranks; the allreducer sends them in number order."""
    rank, size = comm.Get_rank(), comm.Get_size()
    call_order = numpy.random.RandomState(rank).permutation(N_CHUNKS)
    results = {}
    errors = []

    def worker(chunks):
        try:
            started = []
            for chunk in chunks:
                arrays = chunk_arrays(rank, chunk)
                started.append((chunk, arrays,
                                allreducer.start(arrays, sequence=chunk)))
            for chunk, arrays, handle in started:
                handle.wait(timeout=30)
                results[chunk] = arrays
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    run_threads(worker, [(call_order[i::2],) for i in range(2)], errors)
    for chunk in range(N_CHUNKS):
        for got, want in zip(results[chunk], expected_sums(size, chunk)):
            numpy.testing.assert_allclose(got, want, rtol=1e-6)
    try:
        allreducer.start([numpy.zeros(1)], sequence=0)
    except ValueError:
        pass
    else:
        raise AssertionError('a sequence number used twice: ValueError')


def check_scalars(comm, allreducer):
    rank, size = comm.Get_rank(), comm.Get_size()
    assert allreducer.allreduce_scalar(rank + 0.5) == sum(
        r + 0.5 for r in range(size))
    assert allreducer.allreduce_int(rank + 1, op='max') == size
    assert allreducer.allreduce_scalar(rank - 2.0, op='min') == -2.0


def check_timeout_then_result(comm, allreducer):
    """A wait that times out leaves the request running; a later wait
    gets the result."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size > 1 and rank == 1:
        time.sleep(0.5)
    handle = allreducer.start([numpy.full(3, rank, numpy.float32)])
    if size > 1 and rank == 0:
        try:
            handle.wait(timeout=0.05)
        except TimeoutError:
            pass
        else:
            raise AssertionError('rank 1 is late: the wait must time out')
    result, = handle.wait(timeout=30)
    assert (result == sum(range(size))).all(), result


def check_bad_input(allreducer):
    try:
        allreducer.start([[1.0, 2.0]])
    except TypeError:
        pass
    else:
        raise AssertionError('a list is not a numpy array: TypeError')
    read_only = numpy.zeros(3, numpy.float32)
    read_only.flags.writeable = False
    try:
        allreducer.start([read_only])
    except ValueError:
        pass
    else:
        raise AssertionError('read-only arrays: ValueError')
    try:
        allreducer.start([numpy.zeros(3, numpy.complex64)])
    except TypeError:
        pass
    else:
        raise AssertionError('complex64 is not supported: TypeError')


def check_float16(comm, allreducer):
    """float16 arrays are summed as float32 and rounded back once, as
    ChainerMN's communicators sum them: alone, packed with others of their
    dtype, beside float32 arrays, and strided."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def contribution(r):
        random = numpy.random.RandomState(50 + r)
        # Values of very different magnitudes: a sum in float16 steps
        # would round differently from the float32 sum.
        return [(random.randn(7) * 10.0 ** random.randint(-3, 4, 7)
                 ).astype(numpy.float16),
                random.randn(3, 4).astype(numpy.float16),
                random.randn(5).astype(numpy.float32),
                random.randn(4, 6).astype(numpy.float16)[:, ::2]]

    def expected():
        totals = [sum(contribution(r)[i].astype(numpy.float32)
                      for r in range(size)) for i in range(4)]
        return [total.astype(array.dtype)
                for total, array in zip(totals, contribution(0))]

    alone = contribution(rank)[:1]
    allreducer.start(alone).wait(timeout=30)
    numpy.testing.assert_array_equal(alone[0], expected()[0])
    arrays = contribution(rank)
    allreducer.start(arrays).wait(timeout=30)
    for got, want in zip(arrays, expected()):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        numpy.testing.assert_array_equal(got, want)


def check_blocking_mode(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    with cgdp_mpi.ChunkAllreducer(comm, nonblocking=False) as allreducer:
        arrays = chunk_arrays(rank, 5)
        allreducer.start(arrays).wait(timeout=30)
        for got, want in zip(arrays, expected_sums(size, 5)):
            numpy.testing.assert_allclose(got, want, rtol=1e-6)
    try:
        allreducer.start([numpy.zeros(1)])
    except RuntimeError:
        pass
    else:
        raise AssertionError('start() after close() must raise')


def main():
    comm = _common.start_mpi()
    with cgdp_mpi.abort_on_exception(comm):
        allreducer = cgdp_mpi.ChunkAllreducer(comm, stall_timeout=30)
        check_chunks_from_two_threads(comm, allreducer)
        check_sequence_numbers(comm, allreducer)
        check_scalars(comm, allreducer)
        check_timeout_then_result(comm, allreducer)
        check_bad_input(allreducer)
        check_float16(comm, allreducer)
        allreducer.close()
        allreducer.close()      # a second close does nothing
        check_blocking_mode(comm)
        _common.report_ok(comm, 'allreduce')


if __name__ == '__main__':
    main()
