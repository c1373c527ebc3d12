"""The first replica's persistent values (BatchNormalization statistics)
against the master's.

The replicas update their own statistics; the master's are copied from
replica 0 only when something may read them (see
``CGDPUpdater.sync_persistents``), and the master's go to the replicas
again only when user code changed them, or a snapshot was restored.
"""
import chainer

from cgdp_chainer.runtime.host import master as master_module
from cgdp_chainer.runtime.workers import worker as worker_module


class ReplicaPersistents(object):
    """Which side holds the newer persistent values, and the copies.

    Args:
        master (chainer.Link): The master model.
    """

    def __init__(self, master):
        self._master = master
        self.present = any(link._persistent for _, link in master.namedlinks())
        self._record = None      # PersistentsRecord, once replicas exist
        self._refresh = False    # the replicas must take the master's
        self.stale = False       # replica 0 has newer ones
        self.fetches = 0

    def start(self):
        """Remembers the master's values as the replicas' (they are copied
        from it)."""
        self._record = master_module.PersistentsRecord(self._master)

    def keep(self, first):
        """Takes the first replica's values where its result holds them;
        else notes that the master's are behind."""
        if first.persistents is not None:
            self.load(first.persistents)
        else:
            self.stale = self.present

    def load(self, values):
        """Copies replica 0's ``values`` into the master."""
        worker_module.load_persistents(self._master, values,
                                       chainer.get_device('@numpy'))
        self._record.remember(values)
        self.stale = False
        self.fetches += 1

    def for_job(self):
        """The master's values for the next jobs, where the replicas must
        take them (else None), each time once."""
        refresh = (worker_module.save_persistents(self._master)
                   if self._refresh else None)
        self._refresh = False
        if refresh is not None:
            self._record.remember(refresh)
        return refresh

    def after_edit(self):
        """Where user code changed the master's values, the replicas take
        them with their next job."""
        if self.present and self._record.changed():
            self.master_wins()

    def master_wins(self):
        """The master's values (restored, or set by user code) go to the
        replicas with their next job."""
        self._refresh = True
        self.stale = False
