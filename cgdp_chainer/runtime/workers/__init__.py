"""Where replicas run: starting, feeding, watching and stopping the worker
of each replica, a thread of the user's process or a worker process.

- :mod:`.channels`: the replicas' workers as threads or processes behind one
  interface (jobs in, results and chunk announcements out, failures
  raised in the caller);
- :mod:`.worker_launch`: launching worker processes early and safely (the
  user's ``__main__`` guarded or not, spawn or forkserver);
- :mod:`.worker`: the loop a worker runs, one iteration per job;
- :mod:`.replica_copy`: the model's copy on its way to a worker;
- :mod:`.replica_persistents`: the first replica's persistent values
  against the master's (which side is newer, and the copies).

Imports :mod:`..replica` (what a replica is and does), :mod:`..host` (the
accumulator a thread replica hands chunks to) and :mod:`..transport`; is
imported by the front doors and :mod:`..chunks`.
"""
