"""The runtime chunk-size search of the CGDP paper, as pure logic.

The updater (``chunk_size='auto'``) drives it: it trains with
:attr:`ChunkSizeSearch.current_size`, reports each iteration's seconds to
:meth:`ChunkSizeSearch.record`, and switches to the new
:attr:`~ChunkSizeSearch.current_size` after every call, until
:attr:`~ChunkSizeSearch.done`; then it keeps :attr:`~ChunkSizeSearch.best`.

Sizes (layers per chunk; see ``CGDPUpdater``'s ``chunk_size``) are tried
from ``start`` up, doubling, the last one capped at the number of layers.
Larger chunks mean fewer, larger copies and host jobs (less per-call
overhead) but a larger exposed last chunk; iteration time as a
function of the size typically falls and then rises, so the search stops at
the first size slower than the one before it. Each size runs ``skip_first``
iterations that are not timed (the first iteration after a change pays for
re-planning and cold caches), then ``trial_iterations`` timed ones; their
median is the size's time. The trial budget is bounded: at most
``(skip_first + trial_iterations) x (ceil(log2(n_stages / start)) + 1)``
iterations; the updater starts at the size that gives at most 64 chunks, so
that ResNet-152's 300-odd layers take at most 8 sizes.

No wall clock is read here: the numbers come from the caller, so the search
is deterministic given them.
"""
import math


class ChunkSizeSearch(object):
    """Tries growing chunk sizes and keeps the fastest.

    Args:
        n_stages (int): The largest chunk size: the network's layers (the
            name is the search's original, from stage lists).
        trial_iterations (int): Timed iterations per size.
        skip_first (int): Untimed iterations at the start of each size.
        start (int): The first size to try.

    Attributes:
        history (list of (int, float)): ``(size, median seconds)`` of every
            size tried, in order.

    Raises:
        ValueError: An argument is out of range.
    """

    def __init__(self, n_stages, trial_iterations=2, skip_first=1, start=1):
        if isinstance(n_stages, bool) or not isinstance(n_stages, int) or \
                n_stages < 1:
            raise ValueError('n_stages must be an integer >= 1, got '
                             '{!r}'.format(n_stages))
        if not isinstance(trial_iterations, int) or trial_iterations < 1:
            raise ValueError('trial_iterations must be an integer >= 1, got '
                             '{!r}'.format(trial_iterations))
        if not isinstance(skip_first, int) or skip_first < 0:
            raise ValueError('skip_first must be an integer >= 0, got '
                             '{!r}'.format(skip_first))
        if not isinstance(start, int) or not 1 <= start <= n_stages:
            raise ValueError('start must be an integer from 1 to {}, got '
                             '{!r}'.format(n_stages, start))
        self.n_stages = n_stages
        self.trial_iterations = trial_iterations
        self.skip_first = skip_first
        self.history = []
        self._size = start
        self._start = start
        self._samples = []
        self._seen = 0
        self._done = False
        self._best = None
        self.iterations_used = 0

    @property
    def max_trial_iterations(self):
        """The most iterations the search can take."""
        sizes = int(math.ceil(math.log2(self.n_stages / self._start))) + 1
        return sizes * (self.skip_first + self.trial_iterations)

    @property
    def current_size(self):
        """The chunk size to run the next iteration with (the best once
        done)."""
        return self._best if self._done else self._size

    @property
    def done(self):
        """True once the search has settled."""
        return self._done

    @property
    def best(self):
        """The fastest size so far (``None`` before one is timed)."""
        if self._done:
            return self._best
        if not self.history:
            return None
        return min(self.history, key=lambda entry: (entry[1], entry[0]))[0]

    def record(self, iteration_seconds):
        """Reports the seconds of one iteration run with
        :attr:`current_size`.

        Args:
            iteration_seconds (float): The iteration's duration.

        Raises:
            ValueError: The time is negative or not a number.
        """
        if self._done:
            return
        seconds = float(iteration_seconds)
        if not seconds >= 0:
            raise ValueError('iteration_seconds must be >= 0, got {!r}'
                             .format(iteration_seconds))
        self.iterations_used += 1
        self._seen += 1
        if self._seen <= self.skip_first:
            return
        self._samples.append(seconds)
        if len(self._samples) < self.trial_iterations:
            return
        samples = sorted(self._samples)
        middle = len(samples) // 2
        median = samples[middle] if len(samples) % 2 else \
            0.5 * (samples[middle - 1] + samples[middle])
        self.history.append((self._size, median))
        slower = len(self.history) >= 2 and \
            self.history[-1][1] > self.history[-2][1]
        if slower or self._size >= self.n_stages:
            self._best = self.best
            self._done = True
            return
        self._size = min(self.n_stages, self._size * 2)
        self._samples = []
        self._seen = 0
