"""The replicas' random streams: seeded, repeatable and resumable.

Each replica draws (``F.dropout``, ``F.gaussian``, ...) from streams derived
from a base seed, the MPI rank, the iteration and the replica (see
:mod:`cgdp_chainer.randomness`). The base is taken from NumPy's global state
without drawing, the same on every rank (rank 0's), and snapshots keep it,
so seeded runs repeat and resumed runs continue exactly.
"""
import contextlib
import warnings

import chainer

from cgdp_chainer import devices as devices_module
from cgdp_chainer import randomness


class ReplicaStreams(object):
    """The streams of one process's replicas.

    Args:
        devices (list): The replicas' devices.
        workers (str): ``'process'`` or ``'thread'``: replica threads share
            the process's global NumPy state, worker processes have their
            own.
    """

    def __init__(self, devices, workers):
        self.base = randomness.base_seed()  # draws nothing
        self._devices = devices
        self._workers = workers
        self._rank = 0
        self._warned = False

    def agree(self, allreducer):
        """Takes rank 0's base, so that every rank derives its replicas'
        streams from one seed (the rank keeps them apart).

        Args:
            allreducer: The ranks' :class:`~cgdp_chainer.mpi.ChunkAllreducer`.
        """
        self._rank = allreducer.rank
        self.base = allreducer.allreduce_int(
            self.base if allreducer.rank == 0 else 0, op='max')

    def seed(self, index, iteration, global_numpy=None):
        """The :class:`~cgdp_chainer.randomness.ReplicaSeed` of replica
        ``index`` in ``iteration`` (``global_numpy``: by default, whether
        the replica runs in a worker process of its own)."""
        if global_numpy is None:
            global_numpy = self._workers == 'process'
        return randomness.ReplicaSeed(
            base=self.base, rank=self._rank, iteration=iteration,
            replica=index, global_numpy=global_numpy)

    def scope(self, iteration):
        """For replica threads, which share the process's global NumPy
        state: a stream of this iteration's as that state while they run
        (the first ``'@numpy'`` replica's: with one, its own, as in a
        worker process), and the caller's put back after."""
        if self._workers == 'process':
            return contextlib.nullcontext()
        cpu = [i for i, device in enumerate(self._devices)
               if not devices_module.is_gpu(device)]
        seed = self.seed(cpu[0] if cpu else 0, iteration, global_numpy=True)
        return randomness.SharedGlobalState(
            seed.words(randomness.NUMPY_STREAM))

    def check_shared_draws(self, shared_random):
        """Warns, once, that several ``'@numpy'`` replica threads drew from
        the global NumPy state they share (their draws interleave in
        whatever order the threads run)."""
        n_cpu = devices_module.cpu_replica_count(self._devices)
        if self._warned or n_cpu < 2 or \
                not getattr(shared_random, 'drawn', False):
            return
        self._warned = True
        warnings.warn(
            'CGDP: the model draws from NumPy\'s global random state (as '
            'F.dropout, F.gaussian and L.NegativeSampling do on the CPU) in '
            '{} \'@numpy\' replica threads, which share that one state: '
            'their draws interleave in whatever order the threads run, so '
            'two seeded runs, or a run and its resume from a snapshot, '
            'differ. For repeatable runs use workers=\'process\' (each '
            'replica process draws from its own seeded state), or '
            'cgdp_chainer.randomness.dropout in place of F.dropout (it '
            'draws from each replica thread\'s own state)'.format(n_cpu),
            UserWarning, stacklevel=5)

    def serialize(self, serializer):
        """Saves or restores the base seed (with the iteration, all that
        the streams need to continue exactly)."""
        if not isinstance(serializer, chainer.serializer.Deserializer):
            serializer('cgdp_random_base', self.base)
            return
        try:
            value = serializer('cgdp_random_base', self.base)
        except KeyError:
            # A snapshot from before the key: its streams cannot be
            # restored; the resumed run keeps the ones of this updater.
            return
        self.base = int(value)
