"""What ``CGDPUpdater`` does across MPI ranks, from its construction to
its end.

The updater is given a communicator (``mpi_comm=``) or a ChainerMN
multi-node optimizer; either way the ranks are armed at construction (a
rank that ends before its first ``update()`` is named to its peers), check
at the first update that they train the same, start from rank 0's weights
and sum every chunk with a :class:`~cgdp_chainer.mpi.ChunkAllreducer`,
and count their ``update()`` calls so that uneven ones fail rather than
hang. With neither, there is one process and each step does nothing.
"""
from cgdp_chainer.mpi import chainermn_optimizer
from cgdp_chainer.mpi import consistency
from cgdp_chainer.mpi import first_update
from cgdp_chainer.mpi import update_counts
from cgdp_chainer.mpi.allreduce import ChunkAllreducer


class UpdaterRanks(object):
    """The ranks an updater trains across (none without MPI).

    Args:
        given: The optimizer given to the updater: a multi-node optimizer
            trains across its communicator, and CGDP runs the optimizer
            it wraps.
        mpi_comm: The updater's ``mpi_comm`` argument, or None.
        on_watch_failure (callable): ``on_watch_failure(error)``: the
            update-count watch found the ranks' counts apart.

    Attributes:
        optimizer: The optimizer CGDP runs on the host.
        comm: The ``mpi4py`` communicator, or None (one process).
        allreducer (ChunkAllreducer or None): The chunks' sum across the
            ranks, once :meth:`join` ran.
    """

    def __init__(self, given, mpi_comm, on_watch_failure):
        self.optimizer, self.comm = \
            chainermn_optimizer.host_optimizer_and_comm(given, mpi_comm)
        # A multi-node optimizer's first update() broadcasts instead.
        self._broadcast_first = chainermn_optimizer.broadcasting_first_update(
            given, self.comm)
        self.allreducer = None
        self._update_counts = None
        self._on_watch_failure = on_watch_failure
        # Read now: a bad $CGDP_UPDATE_PATIENCE is refused before any work.
        self._patience = None if self.comm is None else \
            update_counts.patience_seconds()
        if self.comm is not None:
            # A rank that ends before its first update() is named to its
            # peers.
            first_update.arm(self.comm)

    @property
    def rank(self):
        """This rank once joined, else None."""
        return getattr(self.allreducer, 'rank', None)

    @property
    def speaks(self):
        """Whether this process says what all say (rank 0, or the one
        process)."""
        return self.allreducer is None or self.allreducer.rank == 0

    def first_broadcast(self):
        """The :class:`~cgdp_chainer.mpi.chainermn_optimizer.
        BroadcastingFirstUpdate` where the first ``update()`` broadcasts
        instead, else None; asked once, at the first ``update()``."""
        broadcast, self._broadcast_first = self._broadcast_first, None
        if broadcast is not None and broadcast.due():
            return broadcast
        return None

    def join(self, master, optimizer):
        """Checks that the ranks train the same, starts every rank from
        rank 0's weights and sets up the all-reduce and the watch over
        the ranks' ``update()`` counts (nothing without MPI)."""
        if self.comm is None:
            return
        # A peer that ended before its first update() is named here.
        first_update.FirstUpdateGate(self.comm).wait()
        consistency.check_consistency(self.comm, master, optimizer)
        # Every rank starts from rank 0's weights, before replicas are
        # copied from the master.
        consistency.broadcast_parameters(self.comm, master)
        self.allreducer = ChunkAllreducer(self.comm)
        # A rank that stops calling update() before its peers fails
        # their waiting update() with the counts; this call counts.
        self._update_counts = update_counts.UpdateCountWatch(
            self.comm, self._on_watch_failure, patience=self._patience)
        self._update_counts.begin_update()

    def begin_update(self):
        """Counts an ``update()`` call, once joined."""
        if self._update_counts is not None:
            self._update_counts.begin_update()

    def end_update(self):
        """The ``update()`` call returned."""
        if self._update_counts is not None:
            self._update_counts.end_update()

    def stop_counting(self, error_words):
        """This rank calls ``update()`` no more; a peer waiting in a later
        one hears it at once, with ``error_words`` (why, or None)."""
        if self._update_counts is not None:
            self._update_counts.close(error_words)

    def close(self, abandon):
        """Stops the all-reduce (``abandon``: after a failure)."""
        if self.allreducer is not None:
            self.allreducer.close(abandon=abandon)
