"""Progress output of the weak-scaling experiment.

:class:`Progress` draws one line on stderr, weighted by each step's
expected cost so that its estimate of the time left does not jump when the
runs move on to more devices; :func:`say` prints a line on stdout without
mixing it into the bar. Under MPI only rank 0 prints: the other ranks draw
into :data:`DEVNULL`. :class:`StageLog` writes one short line per stage
on stderr, for commands whose steps are few and uneven.
"""
import sys
import time


def minutes(seconds):
    """``m:ss``.

    Args:
        seconds (float): A duration.
    """
    return '{}:{:02d}'.format(int(seconds) // 60, int(seconds) % 60)


class Progress(object):
    """A one-line progress bar on stderr with an estimate of time left.

    Args:
        total (float): Sum of the weights of all steps.
        stream: Where to draw (default ``sys.stderr``).
    """

    WIDTH = 28
    # Without a terminal, redraws become lines: print at most this often.
    LOG_EVERY_SECONDS = 20.0

    def __init__(self, total, stream=None):
        self.total = max(total, 1e-12)
        self.done = 0.0
        self.stream = stream or sys.stderr
        self.is_tty = hasattr(self.stream, 'isatty') and self.stream.isatty()
        self.started = None
        self._last_log = 0.0
        self._shown = False

    def advance(self, weight, label):
        """Marks a step of ``weight`` as done and redraws.

        Args:
            weight (float): The step's weight.
            label (str): What is running (shown after the bar).
        """
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.done = min(self.total, self.done + weight)
        elapsed = now - self.started
        fraction = self.done / self.total
        left = elapsed / fraction * (1 - fraction) if fraction > 0 else 0
        filled = int(round(self.WIDTH * fraction))
        line = '[{}{}] {:3.0f}%  {}  elapsed {}  left ~{}'.format(
            '#' * filled, '.' * (self.WIDTH - filled), 100 * fraction, label,
            minutes(elapsed), minutes(left))
        if self.is_tty:
            self.stream.write('\r\033[K' + line)
            self._shown = True
        elif now - self._last_log >= self.LOG_EVERY_SECONDS or fraction >= 1:
            self.stream.write(line + '\n')
            self._last_log = now
        self.stream.flush()

    def start_clock(self):
        """Starts the elapsed time (before the first step's work)."""
        if self.started is None:
            self.started = time.monotonic()

    def clear(self):
        """Removes the bar so that a message can be printed."""
        if self.is_tty and self._shown:
            self.stream.write('\r\033[K')
            self.stream.flush()
            self._shown = False


class StageLog(object):
    """One short line on stderr per stage, with the seconds since the
    first: ``[  2.1 s] predicting on minsky 1/3``.

    Called as ``log(text)``, so that library code that takes a
    ``progress`` callable can report its stages through it.

    Args:
        stream: Where to write (default ``sys.stderr``).
    """

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.started = None

    def __call__(self, text):
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.stream.write('[{:6.1f} s] {}\n'.format(now - self.started,
                                                     text))
        self.stream.flush()


def say(progress, text):
    """Prints a line on stdout without mixing it into the progress bar.

    Args:
        progress (Progress or None): The bar to clear first.
        text (str): The line.
    """
    if progress is not None:
        progress.clear()
    print(text, flush=True)


class DevNull(object):
    """A stream that drops what is written (other ranks' output)."""

    def write(self, text):
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


DEVNULL = DevNull()
