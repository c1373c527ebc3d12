"""ChainerMN's naive communicator, its GPU arrays staged through host memory.

Why it exists: the reference runs of the any-loop scripts
(tests/mpi_scripts/anyloop_*.py) train with ChainerMN on GPUs, and
ChainerMN 7.8.1's 'naive' and 'flat' communicators hand CuPy device
pointers straight to mpi4py, which only a CUDA-aware MPI reads; the
project's MPI (MPICH's pip wheel) is not one, and 'pure_nccl' refuses two
ranks on one GPU. :class:`HostStagedCommunicator` is the naive communicator
with the device arrays of its reductions and broadcasts copied to the host,
passed to the very MPI call the naive one makes, and copied back into the
original arrays: ChainerMN's naive result (same mean, same order of
summation: MPI's Allreduce of the host arrays).

CGDP itself never needs it: its GPU path reduces host arrays.

What it stages: ``multi_node_mean_grad`` (through ``_multi_node_mean``,
which ``chainermn.extensions.AllreducePersistent`` calls too),
``bcast_data`` and ``allreduce``. The ``*_obj`` methods pickle (CuPy
arrays travel as host bytes) and need nothing. The other array methods
(``send``, ``recv``'s sender, ``bcast``, ``gather``, ``allgather``,
``scatter``, ``alltoall``) refuse a device array with ``TypeError``: a
receiver could not tell that the array it gets belongs on a device.
"""
import chainer
from chainer.backends import cuda
from chainermn.communicators import naive_communicator
import numpy


def is_device_array(array):
    """Whether ``array`` is a CuPy array (one this communicator stages)."""
    return isinstance(array, cuda.ndarray)


def create_host_staged_communicator(mpi_comm=None, staged=None):
    """A :class:`HostStagedCommunicator` over ``mpi_comm`` (default:
    ``MPI.COMM_WORLD``), as ``chainermn.create_communicator('naive')``
    makes a naive one; ``staged`` as the class takes it."""
    if mpi_comm is None:
        import mpi4py.MPI
        mpi_comm = mpi4py.MPI.COMM_WORLD
    return HostStagedCommunicator(mpi_comm, staged=staged)


def _to_host(array):
    """A host copy of ``array`` that nothing else holds."""
    host = chainer.backend.CpuDevice().send(array)
    # A staged host array (see HostStagedCommunicator's ``staged``) is
    # copied too, so MPI works on a buffer of its own, as for a device one.
    return numpy.array(host, copy=True) if host is array else host


def _copy_back(host, array):
    """Writes ``host`` into ``array`` in place (on its device)."""
    with cuda.get_device_from_array(array):
        array[...] = chainer.backend.get_device_from_array(array).send(host)


class HostStagedCommunicator(naive_communicator.NaiveCommunicator):
    """The naive communicator, with device arrays staged through the host.

    Args:
        mpi_comm: The ``mpi4py`` communicator.
        staged (callable or None): ``staged(array)`` says whether an array
            goes through host copies; ``None``: CuPy arrays
            (:func:`is_device_array`). Where there is no GPU, the tests
            stage host arrays as well (``lambda array: True``), so that the
            staging itself is compared with the naive communicator.
    """

    def __init__(self, mpi_comm, staged=None):
        super(HostStagedCommunicator, self).__init__(mpi_comm)
        self._staged = is_device_array if staged is None else staged

    def split(self, color, key):
        return self.__class__(self.mpi_comm.Split(color, key),
                              staged=self._staged)

    # -- staged ---------------------------------------------------------

    def _multi_node_mean(self, sendbuf, recvbuf):
        if not self._staged(recvbuf):
            self._refuse('_multi_node_mean', sendbuf)
            return super(HostStagedCommunicator, self)._multi_node_mean(
                sendbuf, recvbuf)
        host_recv = _to_host(recvbuf)
        host_send = None if sendbuf is None else _to_host(sendbuf)
        super(HostStagedCommunicator, self)._multi_node_mean(
            host_send, host_recv)
        _copy_back(host_recv, recvbuf)

    def bcast_data(self, model):
        # The naive communicator's loop, with each staged parameter's
        # broadcast on a host copy of it.
        for _, param in sorted(model.namedparams()):
            array = param.array
            if array is None:
                continue
            if not self._staged(array):
                self._refuse('bcast_data', array)
                self._bcast_host_array(array)
                continue
            host = _to_host(array)
            self._bcast_host_array(host)
            _copy_back(host, array)

    def _bcast_host_array(self, array):
        """What the naive ``bcast_data`` does to one parameter's array:
        float16 travels as float32 (MPI has no half type)."""
        if array.dtype == numpy.float16:
            data = array.astype(numpy.float32)
            self.mpi_comm.Bcast(data)
            array[...] = data.astype(numpy.float16)
        else:
            self.mpi_comm.Bcast(numpy.ascontiguousarray(array))

    def allreduce(self, x):
        if not self._staged(x):
            self._refuse('allreduce', x)
            return super(HostStagedCommunicator, self).allreduce(x)
        total = super(HostStagedCommunicator, self).allreduce(_to_host(x))
        return chainer.backend.get_device_from_array(x).send(total)

    # -- refused --------------------------------------------------------

    def _refuse(self, method, *arrays):
        """Raises TypeError if any of ``arrays`` (or of the tuples and lists
        among them) is a device array that ``method`` would pass to MPI
        without staging it."""
        for array in arrays:
            if isinstance(array, (tuple, list)):
                self._refuse(method, *array)
            elif array is not None and is_device_array(array):
                raise TypeError(
                    'HostStagedCommunicator.{} does not stage device arrays '
                    'through host memory (the MPI here is not CUDA-aware); '
                    'only multi_node_mean_grad, bcast_data and allreduce '
                    'do. Pass host arrays (chainer.backend.CpuDevice().'
                    'send(array)), or use a CUDA-aware MPI with ChainerMN\'s '
                    'own communicators.'.format(method))

    def send(self, data, dest, tag):
        self._refuse('send', data)
        return super(HostStagedCommunicator, self).send(data, dest, tag)

    def bcast(self, x, root=0):
        self._refuse('bcast', x)
        return super(HostStagedCommunicator, self).bcast(x, root)

    def gather(self, x, root=0):
        self._refuse('gather', x)
        return super(HostStagedCommunicator, self).gather(x, root)

    def allgather(self, x):
        self._refuse('allgather', x)
        return super(HostStagedCommunicator, self).allgather(x)

    def scatter(self, xs, root=0):
        self._refuse('scatter', xs)
        return super(HostStagedCommunicator, self).scatter(xs, root)

    def alltoall(self, xs):
        self._refuse('alltoall', xs)
        return super(HostStagedCommunicator, self).alltoall(xs)
