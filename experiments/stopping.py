"""Ctrl-C and SIGTERM: stop the experiment, keeping what finished.

A run that gets SIGINT (Ctrl-C) or SIGTERM (``kill``, a batch system,
``make`` passing on its own SIGTERM) stops measuring, writes the files of
what finished, prints them and exits with ``128 + signal``: 130 after
SIGINT, 143 after SIGTERM, the statuses a shell reports for a process
ended by those signals.

Where it stops depends on the launch (see :class:`StopSignals`): a single
process stops at once, wherever its runs are; under MPI the ranks only
record the request and agree on it at their next check point
(:class:`experiments.mpi_world.StopPoints`), so that every rank leaves
its collectives at the same place and the job ends normally.
"""
import contextlib
import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum):
    """The exit status of a run stopped by signal ``signum``: 128 + it.

    Args:
        signum (int): ``signal.SIGINT`` or ``signal.SIGTERM``.
    """
    return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """Raised where the run stops after SIGINT or SIGTERM.

    A :class:`KeyboardInterrupt`, so that the code that cleans up after
    Ctrl-C (the updaters' ``finalize``, ``finally`` blocks) does the same
    after SIGTERM.

    Args:
        signum (int): The signal.
    """

    def __init__(self, signum):
        super(Interrupted, self).__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self):
        """int: 130 after SIGINT, 143 after SIGTERM."""
        return exit_status(self.signum)


class StopSignals(object):
    """Turns SIGINT and SIGTERM into a request to stop.

    Once installed (:meth:`install`, or ``with``) a signal is recorded
    (:attr:`signum`) and the run stops at its next check point
    (:meth:`check`, or :class:`experiments.mpi_world.StopPoints` under
    MPI, where the ranks agree on it). Inside :meth:`interrupting`, which
    a single process wraps around its runs, the signal also raises
    :class:`Interrupted` at once, wherever the main thread is, except
    inside :meth:`hold` (writing the files that keep what finished,
    cleaning up). The first signal is the request; later ones change
    nothing, so that a second Ctrl-C cannot cut the files that keep the
    first part.
    """

    def __init__(self):
        self.signum = None
        self._interrupting = 0
        self._held = 0
        self._previous = {}

    def install(self):
        """Handles SIGINT and SIGTERM from now on (main thread only).

        Returns:
            StopSignals: This handler.
        """
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame):
        if self.signum is not None:
            return
        self.signum = signum
        if self._interrupting and not self._held:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def interrupting(self):
        """Inside this block the first signal raises :class:`Interrupted`
        at once (outside :meth:`hold`). A signal that came before raises
        on entry."""
        self._interrupting += 1
        try:
            self.check()
            yield self
        finally:
            self._interrupting -= 1

    @contextlib.contextmanager
    def hold(self):
        """Inside this block a signal is recorded, never raised: around
        the work that keeps what finished (writing files, cleaning up)."""
        self._held += 1
        try:
            yield self
        finally:
            self._held -= 1

    def check(self):
        """Raises :class:`Interrupted` if a signal was recorded.

        Raises:
            Interrupted: A stop was requested.
        """
        if self.signum is not None:
            raise Interrupted(self.signum)
