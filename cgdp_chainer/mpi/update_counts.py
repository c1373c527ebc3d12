"""UpdateCountWatch: each rank's number of ``update()`` calls, told to its
peers, so that a rank waiting for them in ``update()`` learns why.

Every ``update()`` of the multi-node forms sums the gradients over all
ranks, so every rank must call it as often as the others: a rank that stops
early (its episodes ended sooner, its shard ran out) leaves its peers
waiting in their next ``update()`` for gradients that never come, and
ChainerMN waits forever, silently. The watch tells the waiting ranks, over
a communicator of its own, on a thread of its own (so that its messages
flow wherever the main thread is, in a collective of the script's too):

* a rank that stops training (its script ends, or it closes the optimizer
  or the updater) tells every peer how many times it called ``update()``;
  a peer that waits in a later ``update()`` fails at once with
  :class:`UnevenUpdatesError`, which names both counts and the fix, and so
  does a peer that calls ``update()`` again afterwards. That peer's count
  comes back, and the rank that stopped ends the job with the same words
  at the end of its script, so that every rank says it.
* a rank that waits in one ``update()`` longer than the patience
  (``CGDP_UPDATE_PATIENCE`` seconds, default 60) asks its peers their
  counts and prints, once per ``update()``, which ranks are behind and
  both counts. It goes on waiting: a rank blocked elsewhere (in a barrier
  of its own) cannot be told from a slow one (a long evaluation) but by
  time.
* a rank whose ``update()`` raised stops training too: a peer waiting in
  that call fails at once (``RuntimeError``), where it would wait forever
  without abort hooks (``CGDPUpdater``'s script may have none).

At the end of its script a rank waits for every peer to stop training too
(as ``MPI_Finalize`` would), saying so after the patience, so that no
message of the watch is left unread when its communicator goes.

The watch needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); with less, it
says once that uneven counts go unnoticed, and does nothing.
"""
import atexit
import math
import os
import sys
import threading
import time

from cgdp_chainer import log
from cgdp_chainer.mpi import faults
from cgdp_chainer.mpi.launch import as_mpi_comm

PATIENCE_VARIABLE = 'CGDP_UPDATE_PATIENCE'
DEFAULT_PATIENCE_SECONDS = 60.0

# Seconds between two looks for the peers' messages: a rank that stopped
# is heard within a fraction of a second; an idle watch barely wakes.
POLL_SECONDS = 0.05

# Seconds that a rank whose script ended gives a peer that failed on the
# uneven counts to print its own error, before it aborts the job itself.
EXIT_GRACE_SECONDS = 2.0

# Message tags on the watch's own communicator.
_STOPPED, _QUERY, _COUNT = 1, 2, 3

# How a rank's count ended, in the error's words.
STOPPED, WAITING, FAILED = 'stopped', 'waiting', 'failed'


class UnevenUpdatesError(RuntimeError):
    """Ranks called ``update()`` different numbers of times."""


def patience_seconds(environ=None):
    """Seconds a rank waits in one ``update()`` before it names the ranks
    behind: ``$CGDP_UPDATE_PATIENCE``, default 60.

    Args:
        environ (dict or None): The environment; ``os.environ`` if None.

    Returns:
        float: The patience.

    Raises:
        ValueError: The variable is not a positive number of seconds.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(PATIENCE_VARIABLE, '').strip()
    if not text:
        return DEFAULT_PATIENCE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise ValueError(
            '{}={!r}: give the seconds that a rank waits in update() '
            'before it names the ranks behind, a positive number (default '
            '{:g})'.format(PATIENCE_VARIABLE, text, DEFAULT_PATIENCE_SECONDS))
    return value


def uneven_message(counts):
    """The words of :class:`UnevenUpdatesError`: each rank's count, and
    the fix.

    Args:
        counts (dict): Rank -> ``(calls, how)``: the ``update()`` calls the
            rank made, and :data:`STOPPED` (it stopped training),
            :data:`WAITING` (its last call waits for the others) or
            :data:`FAILED` (its last call raised).

    Returns:
        str: The message.
    """
    words = {
        STOPPED: 'then it stopped (its script ended, or it closed its '
                 'optimizer or updater)',
        WAITING: 'the last one waiting for the other ranks',
        FAILED: 'the last one raised (its error is on its output)'}
    ranks = '; '.join(
        'rank {}: {} update() call{}, {}'.format(
            rank, calls, '' if calls == 1 else 's', words[how])
        for rank, (calls, how) in sorted(counts.items()))
    return (
        'the ranks called update() different numbers of times ({}). Each '
        'update() sums the gradients of every rank, so a rank that stops '
        'early leaves the others waiting for it forever: make every rank '
        'call update() the same number of times, for example by stopping '
        'every rank\'s loop on a count that all ranks share (a fixed '
        'number of updates, or one agreed with comm.allreduce(n, '
        'op=MPI.MIN))'.format(ranks))


class UpdateCountWatch(object):
    """Counts this rank's ``update()`` calls and hears its peers' (see the
    module).

    Constructing one is collective (it duplicates ``comm``): every rank
    builds its watch at the same point of the program.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        on_peer_stop (callable): ``on_peer_stop(error)``, called on the
            watch's thread when a peer stopped while this rank waits in an
            ``update()`` call that the peer never finishes (it made fewer
            calls: :class:`UnevenUpdatesError`; its own call raised:
            ``RuntimeError``): it makes the wait end and raise ``error``
            (:meth:`FailureBox.fail
            <cgdp_chainer.runtime.host.accumulator.FailureBox.fail>`).
        patience (float or None): Seconds in one ``update()`` before the
            ranks behind are named; default :func:`patience_seconds`.
        poll_seconds (float): Seconds between two looks for messages.

    Attributes:
        rank (int): This rank.
        size (int): Number of ranks.
        calls (int): This rank's ``update()`` calls so far.
        completed (int): Those of them that returned.
        patience (float): As given.
        active (bool): Whether peers are watched (several ranks and
            ``MPI_THREAD_MULTIPLE``).
    """

    def __init__(self, comm, on_peer_stop, patience=None,
                 poll_seconds=POLL_SECONDS):
        from mpi4py import MPI
        comm = as_mpi_comm(comm)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.patience = patience_seconds() if patience is None else patience
        self.calls = 0
        self.completed = 0      # calls that returned
        self._on_peer_stop = on_peer_stop
        self._poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._in_update = False
        self._update_began = None
        self._stopped = {}      # peer -> (its calls, completed) at its stop
        self._peer_errors = {}  # peer -> its error, in words, if it failed
        self._error_words = None  # this rank's, told with its stop
        self._closed = False    # this rank calls update() no more
        self._failed = False    # a peer's stop failed this rank's call
        self._asked = None      # the call for which the peers were asked
        self._noticed = set()   # (call, peer) already printed
        self._sends = []
        self._job = comm        # what an abort at the end of the script ends
        self._thread = None
        self._comm = None
        threads_ok = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self.active = self.size > 1 and threads_ok
        if self.size > 1 and not threads_ok and self.rank == 0:
            log.notice('CGDP: MPI without MPI_THREAD_MULTIPLE (mpi4py\'s '
                       'default): ranks with uneven update() calls hang',
                       'ranks that call update() different numbers of times '
                       'are not named (they wait for each other forever); '
                       'start MPI with MPI_THREAD_MULTIPLE to have them named')
        if not self.active:
            return
        self._comm = comm.Dup()
        self._thread = threading.Thread(target=self._run,
                                        name='cgdp-update-counts',
                                        daemon=True)
        self._thread.start()
        # Before mpi4py finalizes MPI: atexit runs the last registered
        # first, and mpi4py registered its own when it was imported.
        atexit.register(self._at_exit)

    # -- the training's side ----------------------------------------------

    def begin_update(self):
        """Counts an ``update()`` call.

        Raises:
            UnevenUpdatesError: A peer stopped with fewer calls: this one
                would wait for it forever.
        """
        with self._lock:
            self.calls += 1
            self._in_update = True
            self._update_began = time.monotonic()
            error = self._uneven_error()
            self._failed = self._failed or error is not None
        if error is not None:
            raise error

    def end_update(self):
        """The ``update()`` call returned. (One that raised is not ended:
        the training closes.)"""
        with self._lock:
            self._in_update = False
            self.completed = self.calls

    def close(self, error_words=None):
        """This rank calls ``update()`` no more: its counts (calls, and
        calls that returned) go to every peer. Does not wait for them; the
        watch's thread ends once every peer has stopped too. Safe to call
        more than once.

        Args:
            error_words (str or None): The error that stopped this rank
                (type and message, in words), which a peer waiting for it
                names in its own error.
        """
        with self._lock:
            if not self._closed:
                self._error_words = error_words
            self._closed = True
            self._in_update = False

    # -- the watch's thread -----------------------------------------------

    def _run(self):
        from mpi4py import MPI
        status = MPI.Status()
        peers = [rank for rank in range(self.size) if rank != self.rank]
        told = False
        while True:
            while self._comm.iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG,
                                    status=status):
                source, tag = status.Get_source(), status.Get_tag()
                self._take(self._comm.recv(source=source, tag=tag), source,
                           tag)
            with self._lock:
                closed, counts = self._closed, (self.calls, self.completed,
                                                self._error_words)
            if closed and not told:
                for peer in peers:
                    self._send(counts, peer, _STOPPED)
                told = True
            self._ask_when_due(peers)
            self._sends = [request for request in self._sends
                           if not request.Test()]
            # Messages between two ranks arrive in the order they were
            # sent: once every peer's last one is here, none is left.
            if told and len(self._stopped) == len(peers):
                break
            time.sleep(self._poll_seconds)
        MPI.Request.Waitall(self._sends)
        self._comm.Free()

    def _send(self, message, peer, tag):
        self._sends.append(self._comm.isend(message, dest=peer, tag=tag))

    def _take(self, message, source, tag):
        if tag == _STOPPED:
            with self._lock:
                self._stopped[source] = tuple(message[:2])
                self._peer_errors[source] = message[2]
                error = None if self._failed else self._uneven_error()
                self._failed = self._failed or error is not None
            if error is not None:
                self._on_peer_stop(error)
        elif tag == _QUERY:
            with self._lock:
                reply = (self.calls, self._in_update)
            self._send(reply, source, _COUNT)
        elif tag == _COUNT:
            self._say_behind(source, *message)

    def _uneven_error(self):
        """The error where this rank waits in a call that a stopped peer
        never finishes (``self._lock`` held), else None: uneven counts, or
        a peer whose own call raised."""
        if not self._in_update:
            return None
        behind = {peer: (calls, completed)
                  for peer, (calls, completed) in self._stopped.items()
                  if completed < self.calls}
        failed = sorted(peer for peer, (calls, completed) in behind.items()
                        if completed < calls)
        if failed:
            words = self._peer_errors.get(failed[0])
            return RuntimeError(
                'rank {} stopped on an error in its update() call {} ({}), '
                'so update() call {} of this rank would wait for it '
                'forever'.format(
                    failed[0], behind[failed[0]][0],
                    words or 'its own error is on its output', self.calls))
        if not behind:
            return None
        counts = {peer: (calls, STOPPED)
                  for peer, (calls, _) in behind.items()}
        counts[self.rank] = (self.calls, WAITING)
        return UnevenUpdatesError(uneven_message(counts))

    def _ask_when_due(self, peers):
        """After the patience in one call, asks the peers that have not
        stopped for their counts (once per call)."""
        with self._lock:
            due = (self._in_update and not self._closed and
                   self._asked != self.calls and
                   time.monotonic() - self._update_began >= self.patience)
            if due:
                self._asked = self.calls
            asked = [peer for peer in peers if peer not in self._stopped]
        if due:
            for peer in asked:
                self._send(None, peer, _QUERY)

    def _say_behind(self, peer, calls, in_update):
        """Prints that ``peer`` is behind, where it still is."""
        with self._lock:
            call = self.calls
            if not self._in_update or self._asked != call or \
                    calls >= call or (call, peer) in self._noticed:
                return
            self._noticed.add((call, peer))
            waited = time.monotonic() - self._update_began
        where = 'is in its update() call {}'.format(calls) if in_update \
            else 'is not in update() now'
        say(self.rank, (
            'CGDP: update() call {call} of this rank has waited {waited:.0f} '
            's for rank {peer}, which has called update() {calls} time{s} '
            'and {where}. A slow rank (a long evaluation, say) catches up; '
            'a rank blocked elsewhere (in a barrier or collective that this '
            'rank does not join) never will: every rank must call update() '
            'the same number of times. This rank goes on waiting ({var}={'
            'patience:g} s).'.format(
                call=call, waited=waited, peer=peer, calls=calls,
                s='' if calls == 1 else 's', where=where,
                var=PATIENCE_VARIABLE, patience=self.patience)))

    # -- the end of the script --------------------------------------------

    def _at_exit(self):
        """Tells the peers this rank's count, waits until every peer has
        stopped too, and ends the job where their counts differ."""
        self.close()
        self._thread.join(self.patience)
        if self._thread.is_alive():
            with self._lock:
                waiting = sorted(set(range(self.size)) - set(self._stopped) -
                                 {self.rank})
            say(self.rank, (
                'CGDP: the script of this rank ended after {} update() '
                'calls; waiting for rank{} {} to stop training too'.format(
                    self.calls, '' if len(waiting) == 1 else 's',
                    ', '.join(map(str, waiting)))))
            self._thread.join()
        if self.completed < self.calls:
            return  # this rank's last call raised: its error is out
        counts = {peer: (calls, STOPPED if completed == calls else FAILED)
                  for peer, (calls, completed) in self._stopped.items()
                  if calls != self.calls}
        if not counts:
            return
        counts[self.rank] = (self.calls, STOPPED)
        error = UnevenUpdatesError(uneven_message(counts))
        # The peer that failed on it prints its own error first.
        time.sleep(EXIT_GRACE_SECONDS)
        faults.abort_job(self._job, UnevenUpdatesError, error, None,
                         where=' at the end of its script')


def say(rank, line):
    """One line on stderr, with the rank's prefix (ranks share it)."""
    sys.stderr.write('[rank {}] {}\n'.format(rank, line))
    sys.stderr.flush()
