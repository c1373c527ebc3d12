"""Recording what every device and the host do during CGDP iterations."""
import collections
import json
import threading
import time

EVENT_KINDS = ('forward', 'backward', 'd2h', 'reduce', 'update', 'h2d',
               'wait', 'allreduce')

# Host events of these kinds are the MPI communication thread's work; the
# trace shows them on that thread's track rather than the host thread's.
COMMUNICATION_KINDS = ('allreduce',)

# Chrome trace ids: replicas keep their index; host and communication
# threads come after them, in this order, numbered as they first appear.
_HOST_TRACK_BASE = 1000
_COMMUNICATION_TRACK_BASE = 2000

Event = collections.namedtuple(
    'Event', ('iteration', 'device', 'kind', 'chunk', 'start', 'end',
              'thread'), defaults=(None,))
Event.__doc__ = """One recorded interval.

Attributes:
    iteration (int): Updater iteration (0-based) the event belongs to.
    device (int or str): Replica index, or ``'host'`` for the accumulator.
    kind (str): One of :data:`EVENT_KINDS`.
    chunk (int or None): Chunk index (0 holds the input-side stages).
    start (float): Seconds since :attr:`Timeline.origin`.
    end (float): Seconds since :attr:`Timeline.origin`.
    thread (str or None): For host events, the name of the thread that did
        the work (a host accumulator thread, or the MPI communication
        thread for ``'allreduce'``).
"""


def check_timeline(timeline):
    """Raises ValueError unless ``timeline`` is None or records events as a
    :class:`Timeline` does (the ``timeline=`` option of both front ends)."""
    if timeline is not None and not all(
            hasattr(timeline, name) for name in
            ('record', 'span', 'end_iteration', 'now')):
        raise ValueError(
            'timeline must be a cgdp_chainer.Timeline or None; got '
            '{!r}'.format(timeline))


class Timeline(object):
    """Thread-safe recorder of CGDP events and per-iteration summaries.

    Pass an instance as ``timeline=`` to :class:`~cgdp_chainer.CGDPUpdater`.
    Times come from :func:`time.perf_counter`; on GPUs the updater converts
    CUDA event timings onto the same clock before recording them.

    Args:
        max_iterations (int or None): Keep events of at most this many most
            recent iterations (summaries are always kept). ``None`` keeps all.
    """

    def __init__(self, max_iterations=None):
        self.origin = time.perf_counter()
        self.max_iterations = max_iterations
        self._events = []
        self._summaries = []
        self._notes = []
        self._copies = []  # (iteration, device, counts, time)
        self._lock = threading.Lock()
        self._replica_labels = {}
        self._rank = None

    def name_tracks(self, replica_labels, rank=None):
        """Names the trace's tracks (the updater calls it when it starts).

        Args:
            replica_labels (list of str): One label per replica index,
                e.g. ``'replica 0 @numpy'``.
            rank (int or None): This process's MPI rank, if any.
        """
        self._replica_labels = dict(enumerate(replica_labels))
        self._rank = rank

    def now(self):
        """Seconds since :attr:`origin`."""
        return time.perf_counter() - self.origin

    def record(self, iteration, device, kind, chunk, start, end,
               thread=None):
        """Adds one event (times in seconds since :attr:`origin`; see
        :class:`Event` for the fields)."""
        if kind not in EVENT_KINDS:
            raise ValueError('unknown event kind {!r}; valid kinds: {}'.format(
                kind, ', '.join(EVENT_KINDS)))
        with self._lock:
            self._events.append(
                Event(iteration, device, kind, chunk, start, end, thread))

    def note(self, text):
        """Marks something that changes how the events read (a worker
        whose copies are staged, for instance), at the current time."""
        with self._lock:
            self._notes.append((self.now(), text))

    @property
    def notes(self):
        """``(time, text)`` of every :meth:`note`, in order."""
        with self._lock:
            return list(self._notes)

    def span(self, iteration, device, kind, chunk=None, thread=None):
        """Context manager that records the time spent inside it; a host
        event is put on the calling thread's track unless ``thread`` names
        another."""
        if device == 'host' and thread is None:
            thread = threading.current_thread().name
        return _Span(self, iteration, device, kind, chunk, thread)

    def count_copies(self, iteration, device, counts):
        """Records the copies a GPU replica's transfer issued for an
        iteration (its gradients' copies out and, since its previous
        count, its parameters' copies in), for the iteration's summary and
        the trace.

        Args:
            iteration (int): The iteration.
            device (int): The replica's index.
            counts (dict): ``'d2h'``, ``'h2d'`` and ``'event'`` counts.
        """
        with self._lock:
            self._copies.append((iteration, device, dict(counts),
                                 self.now()))

    def record_replicas(self, iteration, results, start, sync_end):
        """Puts the replicas' events of an iteration on the timeline and
        closes the iteration there.

        Args:
            iteration (int): The iteration.
            results (list): Each replica's ``IterationResult``: its
                ``events`` (``(kind, chunk, start, end)`` in
                ``time.perf_counter`` seconds) and ``copies`` (or None).
            start (float): When the iteration began (:meth:`now`).
            sync_end (float): When the last chunk was published.
        """
        for index, result in enumerate(results):
            for kind, chunk, begin, end in result.events:
                self.record(iteration, index, kind, chunk,
                            begin - self.origin, end - self.origin)
            if result.copies is not None:
                self.count_copies(iteration, index, result.copies)
        self.end_iteration(iteration, start, self.now(), sync_end)

    def end_iteration(self, iteration, start, end, sync_end=None):
        """Closes an iteration and derives its summary from its events.

        Args:
            iteration (int): The iteration that ended.
            start (float): When ``update()`` began (seconds since origin).
            end (float): When ``update()`` returned (seconds since origin).
            sync_end (float): When the last chunk's new weights were
                published (defaults to ``end``); the exposed sync is the
                time from the last backward to this point.
        """
        if sync_end is None:
            sync_end = end
        with self._lock:
            events = [e for e in self._events if e.iteration == iteration]
            devices = sorted({e.device for e in events if e.device != 'host'})
            compute = {d: 0.0 for d in devices}
            wait = {d: 0.0 for d in devices}
            last_backward_end = start
            for e in events:
                if e.device == 'host':
                    continue
                if e.kind in ('forward', 'backward'):
                    compute[e.device] += e.end - e.start
                elif e.kind == 'wait':
                    wait[e.device] += e.end - e.start
                if e.kind == 'backward':
                    last_backward_end = max(last_backward_end, e.end)
            n = max(1, len(devices))
            copies = collections.Counter()
            for copy_iteration, _, counts, _ in self._copies:
                if copy_iteration == iteration:
                    copies.update(counts)
            self._summaries.append({
                'copies': dict(copies),
                'iteration': iteration,
                'start': start,
                'end': end,
                'duration': end - start,
                'compute': sum(compute.values()) / n,
                'wait': sum(wait.values()) / n,
                'exposed_sync': max(0.0, sync_end - last_backward_end),
            })
            if self.max_iterations is not None:
                keep = {s['iteration'] for s in
                        self._summaries[-self.max_iterations:]}
                self._events = [e for e in self._events
                                if e.iteration in keep]
                self._copies = [c for c in self._copies if c[0] in keep]

    @property
    def events(self):
        """All recorded events (a copy), in recording order."""
        with self._lock:
            return list(self._events)

    @property
    def iteration_summaries(self):
        """Per-iteration dicts: iteration, start, end, duration, compute
        (mean per device), wait (mean per device), exposed_sync (from the
        last backward's end on any device until the last chunk's weights
        are published), copies (what GPU replicas' transfers issued, summed
        over them: ``'d2h'``, ``'h2d'``, ``'event'``; empty on the CPU)."""
        with self._lock:
            return [dict(s) for s in self._summaries]

    def events_of(self, iteration):
        """Events of one iteration."""
        return [e for e in self.events if e.iteration == iteration]

    def to_chrome_trace(self):
        """The events in Chrome's trace event format (Perfetto opens it):
        one process (named by its MPI rank, if any), one named track per
        replica, then one per host thread and per communication thread."""
        tracks = _TrackNames(self._replica_labels)
        trace = []
        pid = self._rank or 0
        for e in self.events:
            name = e.kind if e.chunk is None else '{} c{}'.format(
                e.kind, e.chunk)
            trace.append({
                'name': name, 'cat': e.kind, 'ph': 'X', 'pid': pid,
                'tid': tracks.tid(e), 'ts': e.start * 1e6,
                'dur': max(0.0, e.end - e.start) * 1e6,
                'args': {'iteration': e.iteration, 'chunk': e.chunk},
            })
        process = 'cgdp' if self._rank is None else 'cgdp rank {}'.format(
            self._rank)
        metadata = [{'name': 'process_name', 'ph': 'M', 'pid': pid,
                     'tid': 0, 'args': {'name': process}}]
        for tid, label in tracks.named():
            metadata.append({'name': 'thread_name', 'ph': 'M', 'pid': pid,
                             'tid': tid, 'args': {'name': label}})
            metadata.append({'name': 'thread_sort_index', 'ph': 'M',
                             'pid': pid, 'tid': tid,
                             'args': {'sort_index': tid}})
        with self._lock:
            copies = list(self._copies)
        for iteration, device, counts, time_ in copies:
            trace.append({'name': 'copies', 'ph': 'C', 'pid': pid,
                          'tid': device, 'ts': time_ * 1e6,
                          'args': dict(counts, iteration=iteration)})
        for time_, text in self.notes:
            trace.append({'name': text, 'cat': 'note', 'ph': 'i', 's': 'g',
                          'pid': pid, 'tid': 0, 'ts': time_ * 1e6})
        return {'traceEvents': metadata + trace, 'displayTimeUnit': 'ms'}

    def export_chrome_trace(self, path):
        """Writes :meth:`to_chrome_trace` as JSON to ``path``, atomically.

        Args:
            path (str): The trace file; replaced only once the new trace is
                complete (:func:`cgdp_chainer.files.atomic_write`). Its
                folder must exist.
        """
        from cgdp_chainer import files
        text = json.dumps(self.to_chrome_trace())
        with files.atomic_write(path, 'w') as f:
            f.write(text)


class _TrackNames(object):
    """Integer track ids and their names, for the Chrome trace."""

    def __init__(self, replica_labels):
        self._replica_labels = replica_labels
        self._tids = {('replica', index): (index, label)
                      for index, label in replica_labels.items()}

    def tid(self, event):
        if event.device != 'host':
            key = ('replica', event.device)
            label = self._replica_labels.get(
                event.device, 'replica {}'.format(event.device))
            number = event.device
        elif event.kind in COMMUNICATION_KINDS:
            key = ('communication', event.thread)
            label = 'communication thread {}'.format(event.thread or '')
            number = _COMMUNICATION_TRACK_BASE + self._count(key[0])
        else:
            key = ('host', event.thread)
            label = 'host thread {}'.format(event.thread or '')
            number = _HOST_TRACK_BASE + self._count(key[0])
        if key not in self._tids:
            self._tids[key] = (number, label.strip())
        return self._tids[key][0]

    def _count(self, kind):
        return sum(1 for key in self._tids if key[0] == kind)

    def named(self):
        """``(tid, name)`` of every track used, in id order."""
        return sorted(self._tids.values())


class _Span(object):

    def __init__(self, timeline, iteration, device, kind, chunk, thread):
        self._timeline = timeline
        self._args = (iteration, device, kind, chunk)
        self._thread = thread

    def __enter__(self):
        self._start = self._timeline.now()
        return self

    def __exit__(self, *exc):
        self._timeline.record(*self._args, start=self._start,
                              end=self._timeline.now(), thread=self._thread)
        return False
