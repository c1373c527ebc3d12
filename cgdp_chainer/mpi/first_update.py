"""FirstUpdateGate: a rank that ends before its first ``update()`` is
named to its peers, who would otherwise wait for it forever in the first
collective of theirs.

:class:`~cgdp_chainer.mpi.update_counts.UpdateCountWatch` names uneven
counts once every rank has called ``update()``; it is built in the first
call, after that call's collectives. A rank whose script ends, or raises,
after it built its multi-node optimizer or ``CGDPUpdater`` and before its
first ``update()`` (most likely: it failed loading its data) leaves its
peers in the first collective of their first ``update()``. The gate closes
that hole without any collective of its own at build time:

* building a multi-node optimizer or a ``CGDPUpdater`` over ranks arms the
  gate (:func:`arm`): at the end of its script, a rank that never passed a
  gate tells every peer, with a message on the ranks' communicator under a
  tag of the gate's, that it ended, and how (its script returned, or its
  uncaught error: the gate chains ``sys.excepthook``, and where another
  hook replaced it, Python's ``sys.last_value`` tells);
* each first ``update()`` passes the gate (:meth:`FirstUpdateGate.wait`)
  before its first collective: a non-blocking barrier that the rank tests
  while it looks for such a message. Every rank there: the barrier
  completes and the first ``update()`` goes on. A peer's message: the call
  raises :class:`PeerEndedError`, naming the rank and what it did, and
  answers it, so that the ended rank stops waiting for it.

At the end of its script, a rank whose first ``update()`` failed so ends
the job (``MPI_Abort`` through :func:`~cgdp_chainer.mpi.faults.abort_job`,
which also clears MPICH's memory in ``/dev/shm``): its barrier can never
complete, and ``MPI_Finalize`` would wait on it. The rank that ended waits
for each peer's answer, or the peer's own message (every rank ended before
training: nothing waits, and it finalizes), saying after
``$CGDP_UPDATE_PATIENCE`` seconds which peers it waits for (one still
loading its data, say); then it waits for the job's end, which those peers
bring: a rank that finalizes while a peer it exchanged messages with goes
on has MPICH's launcher kill that peer, unheard. Where the hook the gate
chained is another than Python's (the abort hooks of
:func:`~cgdp_chainer.mpi.install_abort_hooks`), a rank's uncaught error
waits for the answers at most the patience, then a grace for the peers to
print theirs, and the hook ends the job: a peer blocked in a collective of
the script's never answers, and the job must end all the same.

A rank killed outright (``SIGKILL``, the out-of-memory killer) runs no
code at its end: its peers learn of it only from the launcher (mpiexec
ends the job when a rank dies).
"""
import atexit
import sys
import time

from cgdp_chainer.mpi import faults
from cgdp_chainer.mpi import shm
from cgdp_chainer.mpi.launch import as_mpi_comm
from cgdp_chainer.mpi import update_counts

# Tags of the gate's messages on the ranks' communicator: far from the
# small tags that scripts and ChainerMN use.
ENDED_TAG, ANSWER_TAG = 30931, 30932

# Seconds between two looks for a peer's message while waiting.
POLL_SECONDS = 0.01


class PeerEndedError(RuntimeError):
    """A peer rank ended before its first ``update()``."""


def ended_message(peer, how, rank):
    """The words of :class:`PeerEndedError`.

    Args:
        peer (int): The rank that ended.
        how (str or None): Its uncaught error, as ``Type: message``; None
            where its script ended without one.
        rank (int): The rank that waits.

    Returns:
        str: The message.
    """
    did = 'its script ended' if how is None else \
        'its script raised {}'.format(how)
    return (
        'rank {peer} ended before its first update() ({did}), so the first '
        'update() of rank {rank} would wait for it forever: every rank must '
        'reach its first update() (a rank that fails, loading its data say, '
        'fails the job)'.format(peer=peer, did=did, rank=rank))


class _Gates(object):
    """This process's side of the gate: the communicators its multi-node
    optimizers and updaters train over, whether a first ``update()``
    passed or failed, and whether the peers were told that it ended."""

    def __init__(self):
        self.comms = []
        self.passed = False
        self.failure = None     # (comm, PeerEndedError) of a failed gate
        self._told = False
        self._previous_hook = None

    def arm(self, comm):
        if not self.comms:
            # Before mpi4py finalizes MPI: atexit runs the last registered
            # first, and mpi4py registered its own when it was imported.
            atexit.register(self._at_exit)
        if sys.excepthook != self._excepthook:
            # Chained anew where a hook came since (install_abort_hooks).
            self._previous_hook = sys.excepthook
            sys.excepthook = self._excepthook
        if all(known is not comm for known in self.comms):
            self.comms.append(comm)

    def _excepthook(self, exc_type, exc_value, exc_traceback):
        """Tells the peers this rank's error: after Python's hook, which
        prints it (then waits for the job's end, as at exit); before
        another, an abort hook that ends the job, for at most the patience
        (a peer in a collective of the script's never answers), with a
        grace for the peers that answered to print their own error."""
        previous = self._previous_hook
        how = _described(exc_value)
        if previous is sys.__excepthook__:
            previous(exc_type, exc_value, exc_traceback)
            self._tell_and_await_end(how)
            return
        if self._tell(how, limit=update_counts.patience_seconds()):
            time.sleep(update_counts.EXIT_GRACE_SECONDS)
        previous(exc_type, exc_value, exc_traceback)

    def _at_exit(self):
        if self.failure is not None:
            comm, error = self.failure
            # Its barrier never completes: MPI_Finalize would wait on it.
            faults.abort_job(comm, PeerEndedError, error, None,
                             where=' at the end of its script')
        self._tell_and_await_end(
            _described(getattr(sys, 'last_value', None)))

    def _tell_and_await_end(self, how):
        """Tells the peers (see :meth:`_tell`). A peer that waited in its
        first ``update()`` fails and ends the job at its own end; this rank
        waits for that (finalizing under it would have MPICH kill the peer
        unheard)."""
        if not self._tell(how):
            return
        update_counts.say(self.comms[0].Get_rank(), (
            'CGDP: this rank ended before its first update(); its peers\' '
            'first update() failed on it, and they end the job'))
        while True:
            time.sleep(1.0)

    def _tell(self, how, limit=None):
        """Where no first ``update()`` of this rank ever passed or failed,
        tells every peer once that it ended (``how``) and waits until each
        answered or ended too (at most ``limit`` seconds, if given).

        Returns:
            bool: Whether a peer answered (it waited in its first
            ``update()``).
        """
        if self._told or self.passed or self.failure is not None:
            return False
        self._told = True
        answered = False
        for comm in self.comms:
            answered = _tell_and_hear(comm, how, limit) or answered
        if not answered and limit is None:
            # Every rank ended; each has mapped MPICH's segment, whose name
            # MPI_Finalize leaves in /dev/shm once ranks exchanged messages.
            shm.unlink_mapped_segments()
        return answered


_GATES = _Gates()


def arm(comm):
    """Arms the gate for a multi-node optimizer or ``CGDPUpdater`` built
    over ``comm`` (see the module). No communication.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator; one of a
            single rank arms nothing.
    """
    comm = as_mpi_comm(comm)
    if comm.Get_size() > 1:
        _GATES.arm(comm)


class FirstUpdateGate(object):
    """The wait of a first ``update()`` for every rank to reach its own.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator: the one the
            gate was armed with.
        poll_seconds (float): Seconds between two looks.
    """

    def __init__(self, comm, poll_seconds=POLL_SECONDS):
        self.comm = as_mpi_comm(comm)
        self.poll_seconds = poll_seconds

    def wait(self):
        """Returns once every rank is in its first ``update()``.

        Collective (non-blocking, then the ranks' first collective).

        Raises:
            PeerEndedError: A peer ended before its first ``update()``.
        """
        from mpi4py import MPI
        comm = self.comm
        if comm.Get_size() == 1:
            _GATES.passed = True
            return
        barrier = comm.Ibarrier()
        status = MPI.Status()
        while not barrier.Test():
            if comm.iprobe(source=MPI.ANY_SOURCE, tag=ENDED_TAG,
                           status=status):
                raise self._peer_ended(status.Get_source())
            time.sleep(self.poll_seconds)
        _GATES.passed = True

    def _peer_ended(self, peer):
        how = self.comm.recv(source=peer, tag=ENDED_TAG)
        self.comm.send(None, dest=peer, tag=ANSWER_TAG)
        error = PeerEndedError(ended_message(peer, how,
                                             self.comm.Get_rank()))
        _GATES.failure = (self.comm, error)
        return error


def _described(error):
    """An uncaught error as ``Type: message``; None for None."""
    if error is None:
        return None
    words = str(error)
    return type(error).__name__ + (': ' + words if words else '')


def _tell_and_hear(comm, how, limit=None):
    """Tells every peer that this rank ended (``how``), then waits until
    each answered (it waited in its first ``update()``) or ended too, at
    most ``limit`` seconds if given, saying after the patience which peers
    it waits for; returns whether a peer answered."""
    from mpi4py import MPI
    rank = comm.Get_rank()
    peers = [peer for peer in range(comm.Get_size()) if peer != rank]
    sends = [comm.isend(how, dest=peer, tag=ENDED_TAG) for peer in peers]
    heard, answered = set(), False
    patience = update_counts.patience_seconds()
    began = time.monotonic()
    said = False
    while len(heard) < len(peers):
        for peer in sorted(set(peers) - heard):
            if comm.iprobe(source=peer, tag=ANSWER_TAG):
                heard.add(peer)
                answered = True
            elif comm.iprobe(source=peer, tag=ENDED_TAG):
                heard.add(peer)
        waited = time.monotonic() - began
        if limit is not None and waited >= limit:
            return answered
        if not said and waited >= patience:
            said = True
            update_counts.say(rank, (
                'CGDP: this rank ended before its first update(); waiting '
                'for rank{} {} to reach a first update() and fail there '
                '({}={:g} s)'.format(
                    '' if len(peers) - len(heard) == 1 else 's',
                    ', '.join(map(str, sorted(set(peers) - heard))),
                    update_counts.PATIENCE_VARIABLE, patience)))
        time.sleep(POLL_SECONDS)
    MPI.Request.Waitall(sends)
    return answered
