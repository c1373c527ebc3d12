"""The call forms of Chainer's updaters that ``CGDPUpdater`` takes, checked
before any work: one iterator (or a dict with ``'main'``) whose batch the
devices split, or a list of iterators, one per device
(``MultiprocessParallelUpdater``'s); the options; and the reduction each
form implies.
"""
import collections

from chainer.dataset import iterator as iterator_module

from cgdp_chainer import blas
from cgdp_chainer import timeline as timeline_module
from cgdp_chainer.runtime.host import accumulator
from cgdp_chainer.runtime.workers import channels

REDUCTIONS = ('mean', 'sum')


def default_reduction(devices, iterator_list):
    """The reduction that keeps a switched script's result (see
    ``CGDPUpdater``'s ``reduction``).

    Args:
        devices: The ``devices`` argument as given.
        iterator_list (bool): Whether one iterator per device was given.

    Returns:
        str or None: ``'sum'`` for one iterator with a dict of devices
        (``ParallelUpdater``'s arithmetic); None otherwise (a list of
        devices, or one iterator per device): the reduction that gives
        ``StandardUpdater``'s result on the whole batch (the concatenated
        batches in the list form), found from the loss at the first
        iteration (``'mean'`` for a mean over the examples, ``'sum'`` for a
        loss that adds up over them).
    """
    if not iterator_list and isinstance(devices, dict):
        return 'sum'
    return None


ITERATOR_FORMS = ('a chainer.dataset.Iterator, a dict of them with a '
                  "'main' key, or a list or tuple of them, one per device "
                  "(MultiprocessParallelUpdater's form)")


def check_devices_keyword(devices, device):
    """Refuses StandardUpdater's ``device=`` (one device) and a missing
    ``devices``, naming the list CGDP takes.

    Raises:
        TypeError: ``device`` given, or ``devices`` missing.
    """
    if device is not None:
        raise TypeError(
            'CGDPUpdater takes devices=, a list with a device per replica, '
            'not device=: devices=[{0!r}, {0!r}] runs two replicas on '
            '{0!r}'.format(device))
    if devices is None:
        raise TypeError('CGDPUpdater needs devices=, a list with a device '
                        'per replica, e.g. devices=[-1, -1] (two on the CPU)')


def device_iterators(iterator, n_devices):
    """Checks ``iterator``; returns the list of one iterator per device, or
    None for a single iterator (or a dict of them) whose batch the devices
    split.

    Raises:
        ValueError: A wrong type, a dict without ``'main'``, or a list
            whose length differs from the devices' count.
    """
    if isinstance(iterator, iterator_module.Iterator):
        return None
    if isinstance(iterator, dict):
        if 'main' not in iterator:
            raise ValueError(
                "iterator is a dict without a 'main' key (keys: {}); pass "
                '{}'.format(sorted(map(str, iterator)), ITERATOR_FORMS))
        return None
    if not isinstance(iterator, (list, tuple)):
        raise ValueError('iterator must be {}; got {!r}'.format(
            ITERATOR_FORMS, iterator))
    for index, item in enumerate(iterator):
        if not isinstance(item, iterator_module.Iterator):
            raise ValueError(
                'iterator {} of the list is a {}, not a '
                'chainer.dataset.Iterator; iterator must be {}'.format(
                    index, type(item).__name__, ITERATOR_FORMS))
    if len(iterator) != n_devices:
        raise ValueError(
            'iterator is a list of {} iterators for {} devices; give one '
            'iterator per device'.format(len(iterator), n_devices))
    return list(iterator)


def check_batch_size(iterator, n_devices):
    """Raises ValueError where the iterator's batch (when it tells its
    size) is too small to give every device an example (the first batch
    must, see :func:`check_first_batch`)."""
    batch_size = getattr(iterator, 'batch_size', None)
    if batch_size is not None and batch_size < n_devices:
        raise ValueError(
            'batch size {} is smaller than the number of devices ({}): '
            'every device needs at least one example (only a last, '
            'shorter batch may leave one without)'.format(
                batch_size, n_devices))


def check_first_batch(counts):
    """Raises ValueError where the first batch leaves a device without an
    example: its iteration learns the model's graph (the chunks, the
    parameters used outside their link) from every replica. A later batch
    may be shorter (see :mod:`~cgdp_chainer.runtime.input.batches`)."""
    if 0 in counts:
        raise ValueError(
            'the first batch has {} examples, fewer than the {} devices; '
            'the first iteration learns the graph on every device: give a '
            'first batch of at least {} examples (later ones may be '
            'shorter) or fewer devices'.format(
                sum(counts), len(counts), len(counts)))


def iterator_names(iterators):
    """The list form's iterators by name, the first as ``'main'`` (whose
    epoch the trainer follows): StandardUpdater snapshots and finalizes
    every named iterator."""
    named = collections.OrderedDict([('main', iterators[0])])
    for index, iterator in enumerate(iterators[1:], start=1):
        named['replica{}'.format(index)] = iterator
    return named


def check_device_copies(device_copies, workers, timeline):
    """Raises ValueError where CGDPUpdater's stand-in of CUDA's copies (a
    tests' option) cannot run: it is given to thread replicas, whose GPU
    path takes no timeline on it (the timeline's clock is CUDA's)."""
    if device_copies is not None and (
            workers != 'thread' or not callable(device_copies) or
            timeline is not None):
        raise ValueError(
            'device_copies (a stand-in of CUDA\'s copies, for tests) must '
            "be callable as device_copies(device), with workers='thread' "
            'and no timeline')


def check_arguments(reduction, timeline, blas_threads, host_threads,
                     workers, start_method, converter, loss_func):
    """Raises ValueError naming the first wrong argument of CGDPUpdater
    (``devices`` and ``iterator`` are checked where they are parsed)."""
    if reduction is not None and reduction not in REDUCTIONS:
        raise ValueError('unknown reduction {!r}; valid: {} or None (chosen '
                         'from the call form)'.format(
                             reduction, ', '.join(REDUCTIONS)))
    if workers not in channels.WORKER_KINDS:
        raise ValueError('unknown workers {!r}; valid: {}'.format(
            workers, ', '.join(channels.WORKER_KINDS)))
    if start_method not in channels.START_METHODS:
        raise ValueError('unknown start_method {!r}; valid: {}'.format(
            start_method, ', '.join(channels.START_METHODS)))
    blas.threads_per_replica(2, blas_threads)  # raises on a bad value
    accumulator.check_host_threads(host_threads)
    timeline_module.check_timeline(timeline)
    if not callable(converter):
        raise ValueError('converter must be callable; got {!r}'.format(
            converter))
    if loss_func is not None and not callable(loss_func):
        raise ValueError('loss_func must be callable or None; got '
                         '{!r}'.format(loss_func))
