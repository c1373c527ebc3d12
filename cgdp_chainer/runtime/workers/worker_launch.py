"""How a replica's worker process starts without running the user's script.

``multiprocessing``'s ``spawn`` and ``forkserver`` start a child by
running the parent's ``__main__`` again (as ``__mp_main__``), so that the
child can find the functions and classes that the process object names. A
worker needs none of that: its entry point is
:func:`~cgdp_chainer.runtime.workers.channels.process_main`, and the
replica's classes and functions of ``__main__`` travel by value
(:mod:`~cgdp_chainer.runtime.workers.replica_copy`). Running the script
again would run an unguarded script's training code in every worker (which
then dies while it starts) and import the script's modules (seconds with
SciPy or librosa) for nothing.

Workers start ahead of their replicas (:class:`LaunchedWorkers`): each
boots (an interpreter, Chainer) while the user's process runs the master's
first forwards, then waits on its pipe for what it serves.

The parent's preparation data says which main module the child runs;
:func:`start_worker` names its process so that :func:`_preparation_data`,
which stands for ``multiprocessing.spawn.get_preparation_data`` (once
:func:`start_worker` has run), leaves the main module out for worker
processes only: every other process, the user's own included, starts as
before. The child still gets the parent's ``sys.path`` and working
directory, so that what the replica names by module imports as in the
parent.
"""
import functools
import multiprocessing
import multiprocessing.spawn
import threading

# A worker that is handed no replica (the first iteration failed before)
# gets EOF on its pipe and leaves; after this it is killed.
_LEAVE_SECONDS = 1.0

# A replica's worker process (or thread) name; for a process, also what
# picks it out in its preparation data.
WORKER_NAME = 'cgdp-replica-{}'
_WORKER_PREFIX = WORKER_NAME.format('')

# The preparation data's entries that make the child run a main module.
_MAIN_MODULE_ENTRIES = ('init_main_from_name', 'init_main_from_path')

_install_lock = threading.Lock()


def is_worker_name(name):
    """Whether ``name`` is a replica worker process's name."""
    return isinstance(name, str) and name.startswith(_WORKER_PREFIX)


def _preparation_data(original, name):
    """``multiprocessing.spawn.get_preparation_data`` without the main
    module for a worker process (by its name)."""
    data = original(name)
    if is_worker_name(name):
        for entry in _MAIN_MODULE_ENTRIES:
            data.pop(entry, None)
    return data


def _install():
    """Puts :func:`_preparation_data` in place once per process."""
    with _install_lock:
        current = multiprocessing.spawn.get_preparation_data
        if getattr(current, 'cgdp_leaves_out_main', False):
            return
        wrapper = functools.wraps(current)(
            functools.partial(_preparation_data, current))
        wrapper.cgdp_leaves_out_main = True
        multiprocessing.spawn.get_preparation_data = wrapper


def start_worker(start_method, index, target, args):
    """Starts worker process ``index``, which does not run ``__main__``.

    Args:
        start_method (str): ``'spawn'`` or ``'forkserver'``.
        index (int): The replica's index (in the process's name).
        target (callable): The entry point, a module-level function of an
            importable module.
        args (tuple): Its arguments; keep them small (a pipe end, shared
            memory layouts): they are written into the child's start-up
            pipe before the child reads it.

    Returns:
        multiprocessing.Process: The started process (a daemon).
    """
    _install()
    context = multiprocessing.get_context(start_method)
    process = context.Process(target=target, args=args,
                              name=WORKER_NAME.format(index), daemon=True)
    process.start()
    return process


class LaunchedWorkers(object):
    """Worker processes started before the replicas they will serve exist.

    Each runs ``target(conn)``: it waits on its pipe for what it serves,
    and leaves when the pipe closes. :meth:`hand_over` gives the processes
    and the parent's pipe ends to their owner; :meth:`close` ends those not
    handed over.

    Args:
        start_method (str): ``'spawn'`` or ``'forkserver'``.
        count (int): How many workers.
        target (callable): Their entry point (see :func:`start_worker`).

    Raises:
        RuntimeError: multiprocessing refused to start a process; the
            message says why and what to do.
    """

    def __init__(self, start_method, count, target):
        self.processes = []
        self.conns = []
        try:
            for index in range(count):
                parent_end, child_end = multiprocessing.Pipe(duplex=True)
                self.conns.append(parent_end)
                self.processes.append(self._start(
                    start_method, index, target, child_end))
                child_end.close()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _start(start_method, index, target, child_end):
        try:
            return start_worker(start_method, index, target, (child_end,))
        except RuntimeError as error:
            # multiprocessing refuses to start a process from a process
            # that is itself starting (importing its main module).
            raise RuntimeError(
                'could not start the CGDP worker processes: {}. The updater '
                'was built while this process was being started by '
                'multiprocessing, which runs its script again: guard that '
                "script's training code with if __name__ == '__main__':"
                .format(error)) from error

    def hand_over(self):
        """The processes and the parent's pipe ends, for their owner (who
        then stops them); :meth:`close` no longer touches them.

        Returns:
            tuple: ``(processes, conns)``, lists in the workers' order.
        """
        handed = self.processes, self.conns
        self.processes, self.conns = [], []
        return handed

    def close(self):
        """Ends the workers not handed over (closing their pipes, then
        killing any that does not leave)."""
        for conn in self.conns:
            conn.close()
        for process in self.processes:
            process.join(timeout=_LEAVE_SECONDS)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        self.processes, self.conns = [], []
