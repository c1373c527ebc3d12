"""What replicas report, combined as the whole batch would have reported it.

Each replica reports what the model reports on its share of the batch
(``main/loss``, ``main/accuracy``, counts such as ``main/correct``); the
updater reports one value per key, the one ``StandardUpdater`` would report
on the whole batch. A value that adds up over the examples (a loss summed
over them, a count) is the sum of the replicas' values; a mean over the
examples is the mean of the replicas' values weighted by their shares of
the examples. Which of the two a key is, is found at the first iteration:
deterministic forwards of the master (``chainer.config.train`` False, no
backprop, everything they touch put back) on the whole batch and on each
share say whether the whole batch's value is the sum of the shares' or
their share-weighted mean (:func:`probe_forwards`, :func:`compare`,
:class:`ReportKinds`). The same comparison on the loss the model returns
tells the updater's reduction; for a loss that draws random numbers in
every mode, within its sampling noise (:func:`within_noise`).

Combined values keep the type the model reported: a Python ``int`` stays an
``int`` and a ``float`` a ``float``, a NumPy scalar a NumPy scalar of its
dtype, an array an array, a ``Variable`` a ``Variable`` (without a graph).
Integers stay exact: a sum of integers is an integer; a mean of integers is
one when it is a whole number, else a float.
"""
import collections
import collections.abc
import numbers
import random

import chainer
import numpy

from cgdp_chainer.runtime.transport import shared

KINDS = ('sum', 'mean')

# Relative tolerance of the first iteration's comparisons: the whole batch
# and its shares are summed in different orders. Far below the factor of
# about the number of shares between a sum and a mean.
RTOL = 1e-4
RTOL_HALF = 1e-2  # float16 values, or chainer.config.dtype float16

# How far a loss that is a sum or a mean over the examples may be from the
# shares' sum or mean, in units of its dtype's machine epsilon times its
# magnitude (see rounding_tolerance): each of the N examples' terms is
# rounded once as the whole batch's forward adds it up and once as its
# share's does (recursive summation's first-order bound, N units of
# epsilon; NumPy's and CuPy's tree sums stay far below it); this margin
# more covers the sums inside each example's term (log2 of any count of
# pixels or tokens below 2**31 in a tree sum) and the model's arithmetic,
# which computes each example in batches of another size (BLAS blocks them
# differently; measured within 3.5 epsilon on conv and linear nets, float32
# and float64).
ROUNDING_MARGIN = 32
# How near the whole batch's loss must be to the shares' mean weighted by
# their examples, as a fraction of how far apart the shares' losses are,
# for the match to show that those are the loss's weights (the shares'
# losses must also be further apart than the rounding tolerance). A loss
# that is a mean over something else (the pixels it does not ignore, as
# softmax_cross_entropy with ignore_label) weighs the shares by their
# counts of those, and its value then lies elsewhere between the shares'
# losses, by about the weights' difference times their spread: within 1%
# of the spread, the weights are the examples' to about 1%. Shares with
# the same loss (an untrained model that gives every example the same
# loss) show no weights at all.
WEIGHTS_SHOWN_WITHIN = 0.01
# Where the devices' shares are too near, the batch is cut into up to this
# many shares (single examples for a smaller batch), which spread wider.
FINER_SHARES = 32


# How near the whole batch's loss must be to the shares' mean (or sum), and
# how near two draws of it to each other, for a loss that draws random
# numbers in every mode (see within_noise): a quarter of the distance
# between the shares' mean and their sum. Within it, the loss is at least
# three times nearer the kind chosen than the other; and since the noise,
# measured by the two draws, is below it too, that nearness is no accident
# of a noise as large as the distance: to pass for the wrong kind, a draw
# would have to stray three quarters of the distance from its expected
# value while the other draw lands within a quarter of it. A mean and a
# sum over N equal shares differ by a factor of N (>= 2), so for a
# positive loss the distance is at least the loss itself, where the
# noise of a loss that trains is a small part of it (the VAE example's
# two draws on a batch of 12 differ by under 2%).
NOISE_MARGIN = 0.25


class VariableValue(object):
    """A reported ``Variable`` on its way from a replica: its array in host
    memory, without the graph; reported again as a ``Variable``. (Not a
    tuple: ``DictSummary`` reads a tuple as a ``(value, weight)`` pair.)

    Args:
        array (numpy.ndarray): The Variable's array.
    """

    __slots__ = ('array',)

    def __init__(self, array):
        self.array = array

    def __reduce__(self):
        return (VariableValue, (self.array,))


def portable(value, host_arrays=None):
    """A replica's reported value as it leaves the replica: a ``Variable``
    as a :class:`VariableValue`, device arrays in host memory, arrays copied
    (the replica may write them in the next iteration); the rest as it is.

    Args:
        value: What the model reported.
        host_arrays (dict or None): ``id(device array)`` -> its values
            already copied to the host (see :func:`device_arrays`); None:
            each device array is copied now, the host waiting for it.
    """
    if isinstance(value, chainer.Variable):
        return VariableValue(numpy.array(
            _to_host(value.array, host_arrays), copy=True))
    if host_arrays is not None and id(value) in host_arrays:
        return host_arrays[id(value)].copy()
    if isinstance(value, numpy.ndarray):
        return value.copy()
    if _is_device_array(value):
        return numpy.array(_to_host(value, host_arrays), copy=True)
    if type(value) is tuple:
        return tuple(portable(item, host_arrays) for item in value)
    return value


def _is_device_array(value):
    return not isinstance(value, (numpy.ndarray, numpy.generic)) and \
        hasattr(value, 'shape') and hasattr(value, 'dtype')


def _to_host(array, host_arrays):
    if host_arrays is not None and id(array) in host_arrays:
        return host_arrays[id(array)]
    return chainer.backends.cuda.to_cpu(array)


def device_arrays(value, is_device):
    """The arrays of a reported value that :func:`portable` would copy from
    a device (in order, each once).

    Args:
        value: What the model reported.
        is_device (callable): ``is_device(array)``: whether ``array`` is
            in the replica's device memory.
    """
    found = {}

    def visit(item):
        if isinstance(item, chainer.Variable):
            item = item.array
        if hasattr(item, 'shape') and not isinstance(item, numpy.generic) \
                and is_device(item):
            found.setdefault(id(item), item)
        elif type(item) is tuple:
            for part in item:
                visit(part)

    visit(value)
    return list(found.values())


class PendingObservation(collections.abc.Mapping):
    """A GPU replica's reported values while their copies to the host run.

    The copies were started on the replica's copy stream (see
    ``ChunkedCudaTransfer.read_back``). Read as a mapping (or
    :func:`settled`), it is what :func:`portable` gives of each value,
    waiting only for copies not yet done: none, once the host has waited
    for the gradients that followed them on that stream. Pickled, it is
    that dict.

    Args:
        read_back (callable): ``read_back(device arrays)`` starts their
            copies: returns ``(host arrays, event)``.
        is_device (callable): ``is_device(array)``: whether ``array`` is
            in the replica's device memory.
    """

    def __init__(self, read_back, is_device):
        self._read_back = read_back
        self._is_device = is_device
        self._values = {}
        self._host_arrays = {}
        self._events = []
        self._order = []
        self._settled = None

    def take(self, observation):
        """Starts the copies of the values reported so far that are not on
        their way yet (a value reported again is read again)."""
        arrays = []
        for key, value in observation.items():
            if key in self._values and self._values[key] is value:
                continue
            self._values[key] = value
            arrays.extend(array for array in device_arrays(
                value, self._is_device) if id(array) not in self._host_arrays)
        self._order = list(observation)
        self._settled = None
        if not arrays:
            return
        hosts, copied = self._read_back(arrays)
        for array, host in zip(arrays, hosts):
            self._host_arrays[id(array)] = host
        self._events.append(copied)

    def settled(self):
        """The observation as :func:`portable` makes it, in host memory.

        Returns:
            dict: Key -> portable value, in the order reported.
        """
        if self._settled is None:
            for event in self._events:
                if not getattr(event, 'done', False):
                    event.synchronize()
            self._events = []
            self._settled = {
                key: portable(self._values[key], self._host_arrays)
                for key in self._order}
        return self._settled

    def __getitem__(self, key):
        return self.settled()[key]

    def __iter__(self):
        return iter(self.settled())

    def __len__(self):
        return len(self._order)

    def __reduce__(self):
        return (dict, (self.settled(),))


def settled(observation):
    """A replica's observation in host memory: a
    :class:`PendingObservation` settled, a dict as it is."""
    if isinstance(observation, PendingObservation):
        return observation.settled()
    return observation


def _numeric(value):
    """``value`` as a NumPy array for the arithmetic, or None if it is not
    a number, a boolean or an array of them."""
    if isinstance(value, (VariableValue, chainer.Variable)):
        value = value.array
    if isinstance(value, (numbers.Number, numpy.generic, numpy.ndarray)):
        array = numpy.asarray(value)
        if array.dtype.kind in 'biuf':
            return array
    return None


def _is_integral(arrays):
    return all(array.dtype.kind in 'biu' for array in arrays)


Comparison = collections.namedtuple(
    'Comparison', ('kind', 'whole', 'parts', 'sum', 'mean', 'again',
                   'tolerance'),
    defaults=(None, None))
Comparison.__doc__ = """The whole batch's value against its shares' values.

Attributes:
    kind (str): ``'sum'`` (the whole batch's value is the sum of the
        shares'), ``'mean'`` (their mean weighted by the shares' examples),
        ``'both'`` (both match, e.g. zeros), ``'neither'``, ``'shapes'``
        (arrays whose shapes differ between the whole batch and the shares:
        a value per example), ``'unknown'`` (missing, or not a number), or
        ``'indistinct'`` (a loss's match that the shares' losses cannot
        show: too near each other to show a mean's weights, or fewer than
        two that are not zero; see :func:`shows_form`).
    whole, parts: The values compared (as reported).
    sum, mean (numpy.ndarray or None): The shares' sum and weighted mean.
    again: None, or (for a value that draws random numbers, see
        :func:`within_noise`) the whole batch's value from a second forward
        with other random numbers; ``kind`` was then decided within the
        sampling noise.
    tolerance (dict or None): For a loss compared within rounding
        (:func:`rounding_tolerance`), ``'sum'`` and ``'mean'``: how far
        the whole batch's loss may be from each.
"""


def compare(whole, parts, counts, rounding=False):
    """Whether a value of the whole batch is the sum or the mean of the
    values of its shares.

    Integers are compared exactly. Floats, for reported values, within
    :data:`RTOL` (or :data:`RTOL_HALF` for float16) of the larger of the
    whole batch's value and the sum of the shares' magnitudes; for the
    loss (``rounding``), within its float rounding
    (:func:`rounding_tolerance`).

    Args:
        whole: The value on the whole batch.
        parts (list): The value on each share.
        counts (list of int): Each share's examples.
        rounding (bool): Whether to compare within float rounding.

    Returns:
        Comparison: What was found.
    """
    arrays = [_numeric(value) for value in [whole] + list(parts)]
    if any(array is None for array in arrays):
        return Comparison('unknown', whole, parts, None, None)
    target, shares = arrays[0], arrays[1:]
    if any(array.shape != target.shape for array in shares):
        return Comparison('shapes', whole, parts, None, None)
    total = sum(counts)
    tolerance = None
    if _is_integral(arrays):
        ints = [array.astype(numpy.int64) for array in arrays]
        added = numpy.asarray(sum(ints[1:]))
        weighted = numpy.asarray(sum(count * array for count, array in
                                     zip(counts, ints[1:])))
        is_sum = numpy.array_equal(ints[0], added)
        is_mean = numpy.array_equal(ints[0] * total, weighted)
        mean = weighted / total
        exact = numpy.zeros(target.shape)
        tolerance = {'sum': exact, 'mean': exact}
    else:
        floats = [array.astype(numpy.float64) for array in arrays]
        added = numpy.asarray(sum(floats[1:]))
        mean = numpy.asarray(sum(count / total * array for count, array in
                                 zip(counts, floats[1:])))
        if rounding:
            tolerance = rounding_tolerance(arrays, counts)
        else:
            scale = numpy.maximum(numpy.abs(floats[0]), numpy.asarray(
                sum(numpy.abs(array) for array in floats[1:])))
            bound = (RTOL_HALF if _computed_in_half(arrays) else RTOL) * scale
            tolerance = {'sum': bound, 'mean': bound}
        is_sum = bool(numpy.all(numpy.abs(floats[0] - added) <=
                                tolerance['sum']))
        is_mean = bool(numpy.all(numpy.abs(floats[0] - mean) <=
                                 tolerance['mean']))
    kind = 'both' if is_sum and is_mean else 'sum' if is_sum else \
        'mean' if is_mean else 'neither'
    return Comparison(kind, whole, parts, added, mean,
                      tolerance=tolerance if rounding else None)


def _computed_in_half(arrays):
    return any(array.dtype == numpy.float16 for array in arrays) or \
        numpy.dtype(chainer.get_dtype()) == numpy.float16


def rounding_tolerance(arrays, counts):
    """How far a loss that is a sum or a mean over the examples may be
    from the shares' sum or weighted mean by float rounding alone:
    ``(N + ROUNDING_MARGIN) * eps * scale``, with N the batch's examples,
    ``eps`` the machine epsilon of the least precise of the values' dtypes
    and ``chainer.config.dtype`` (the forwards computed in it), and
    ``scale`` the larger of the whole batch's magnitude and the shares'
    (their sum's for the sum, their weighted mean's for the mean); see
    :data:`ROUNDING_MARGIN`.

    Args:
        arrays (list of numpy.ndarray): The whole batch's value, then each
            share's (floats).
        counts (list of int): Each share's examples.

    Returns:
        dict: ``'sum'`` and ``'mean'`` to the tolerance (arrays of the
        values' shape).
    """
    dtypes = [array.dtype for array in arrays if array.dtype.kind == 'f']
    dtypes.append(numpy.dtype(chainer.get_dtype()))
    eps = max(float(numpy.finfo(dtype).eps) for dtype in dtypes)
    total = sum(counts)
    units = (total + ROUNDING_MARGIN) * eps
    whole = numpy.abs(arrays[0].astype(numpy.float64))
    magnitudes = [numpy.abs(array.astype(numpy.float64))
                  for array in arrays[1:]]
    return {'sum': units * numpy.maximum(whole, sum(magnitudes)),
            'mean': units * numpy.maximum(whole, sum(
                count / total * magnitude
                for count, magnitude in zip(counts, magnitudes)))}


def informative_parts(comparison):
    """The shares whose loss is not exactly zero: a share whose loss is
    zero (a constant without a graph, as SSD's loss on a share without a
    positive box) adds nothing to a sum and weighs nothing in a mean over
    what it lacks, so it tells nothing about the form.

    Args:
        comparison (Comparison): From :func:`compare`.

    Returns:
        list of numpy.ndarray: Those shares' values, as float64.
    """
    parts = [_numeric(part).astype(numpy.float64)
             for part in comparison.parts]
    return [part for part in parts if numpy.any(part != 0)]


def matches_mean(comparison):
    """Whether a loss's comparison within rounding found the whole batch's
    loss within its tolerance of the shares' mean weighted by their
    examples, whether or not the shares show it (:func:`shows_form`), or
    (a loss decided within its sampling noise) found ``'mean'``.

    Args:
        comparison (Comparison): A loss's, from :func:`compare` with
            ``rounding``.
    """
    if comparison.kind in ('mean', 'both'):
        return True
    if comparison.kind != 'indistinct':
        return False
    whole = _numeric(comparison.whole).astype(numpy.float64)
    return bool(numpy.all(numpy.abs(whole - comparison.mean) <=
                          comparison.tolerance['mean']))


def all_finite(comparison):
    """Whether the whole batch's value and every share's are finite
    numbers (not a float overflow or NaN).

    Args:
        comparison (Comparison): From :func:`compare`.
    """
    values = [_numeric(value) for value in
              [comparison.whole] + list(comparison.parts)]
    return all(value is not None and bool(numpy.all(numpy.isfinite(value)))
               for value in values)


def shows_form(comparison):
    """Whether a loss's match within rounding (:func:`compare` with
    ``rounding``) shows its form: two shares or more whose losses are not
    zero (:func:`informative_parts`); for the sum, the whole batch's loss
    beyond their range by more than the tolerance (no mean of them,
    however weighted, lies there); for the mean, their losses
    spread (the largest difference between two of them) wider than the
    rounding tolerance, with the whole batch's loss within
    :data:`WEIGHTS_SHOWN_WITHIN` of that spread from their weighted mean,
    so that the match shows the weights to be the shares' examples.

    Args:
        comparison (Comparison): A loss's, that found ``'sum'`` or
            ``'mean'``.
    """
    parts = informative_parts(comparison)
    if len(parts) < 2:
        return False
    parts = numpy.asarray(parts)
    whole = _numeric(comparison.whole).astype(numpy.float64)
    if comparison.kind == 'sum':
        # Outside the shares' range: no mean of them, however weighted.
        outside = numpy.maximum(parts.min(axis=0) - whole,
                                whole - parts.max(axis=0))
        return bool(numpy.any(outside > comparison.tolerance['sum']))
    spread = float(numpy.max(parts.max(axis=0) - parts.min(axis=0)))
    off = float(numpy.max(numpy.abs(whole - comparison.mean)))
    tolerance = float(numpy.max(comparison.tolerance['mean']))
    return spread > tolerance and off <= WEIGHTS_SHOWN_WITHIN * spread


def within_noise(comparison, again):
    """Decides a comparison that found neither kind, where the value draws
    random numbers in every mode (a VAE's sampled ``z``, ``F.gaussian``, a
    sampled negative set), without bit-equal forwards.

    ``again`` is the whole batch's value from a second forward with other
    random numbers. Equal to the first: the value is deterministic, and
    neither stays neither. Otherwise the kind is the one the whole batch's
    value is nearest, if it is within :data:`NOISE_MARGIN` of the distance
    between the shares' mean and their sum, and the two draws are as near
    each other (distances: Euclidean norms, over the elements of arrays).

    Args:
        comparison (Comparison): From :func:`compare`.
        again: The whole batch's value from a second forward.

    Returns:
        Comparison: ``comparison`` itself where this does not apply (a
        kind other than ``'neither'``, a deterministic value, ``again`` not
        a finite number of the same shape); else ``comparison`` with
        ``again`` set and ``kind`` ``'sum'``, ``'mean'`` or (the noise is
        too large to tell) ``'neither'``.
    """
    if comparison.kind != 'neither':
        return comparison
    first, second = _numeric(comparison.whole), _numeric(again)
    if second is None or second.shape != first.shape or \
            numpy.array_equal(first, second) or \
            not numpy.all(numpy.isfinite(second)):
        return comparison
    distances = noise_distances(comparison._replace(again=again))
    margin = NOISE_MARGIN * distances['between']
    kind = 'neither'
    if distances['draws'] <= margin:
        for candidate in KINDS:
            if distances[candidate] <= margin:
                kind = candidate
    return comparison._replace(kind=kind, again=again)


def noise_distances(comparison):
    """The distances :func:`within_noise` decides by.

    Args:
        comparison (Comparison): One with ``again`` set.

    Returns:
        dict: ``'sum'`` and ``'mean'``: from the whole batch's value to the
        shares' sum and weighted mean; ``'between'``: from that sum to that
        mean; ``'draws'``: between the two draws on the whole batch.
    """
    def distance(a, b):
        difference = numpy.asarray(a, numpy.float64) - \
            numpy.asarray(b, numpy.float64)
        return float(numpy.sqrt(numpy.sum(difference * difference)))
    first = _numeric(comparison.whole)
    return {'sum': distance(first, comparison.sum),
            'mean': distance(first, comparison.mean),
            'between': distance(comparison.sum, comparison.mean),
            'draws': distance(first, _numeric(comparison.again))}


def kind_by_type(value):
    """The kind of a value the first iteration could not tell: integers
    (counts) add up, anything else is a mean."""
    array = _numeric(value)
    if array is not None and array.dtype.kind in 'iu':
        return 'sum'
    return 'mean'


def check_report_kinds(report_kinds):
    """Checks ``CGDPUpdater``'s ``report_kinds`` argument.

    Args:
        report_kinds (dict or None): Reported key to ``'sum'`` or ``'mean'``.

    Raises:
        ValueError: Not a dict of str to one of :data:`KINDS`.
    """
    if report_kinds is None:
        return
    if not isinstance(report_kinds, dict) or not all(
            isinstance(key, str) and kind in KINDS
            for key, kind in report_kinds.items()):
        raise ValueError(
            "report_kinds must be None or a dict from a reported key (such "
            "as 'main/total') to 'sum' (the value adds up over the "
            "examples) or 'mean'; got {!r}".format(report_kinds))


class ReportKinds(object):
    """How each reported key combines over the replicas: ``'sum'`` or
    ``'mean'``.

    A key takes the kind given in ``overrides``, else the one found at the
    first iteration (:meth:`learn`), else (a key the first iteration could
    not tell, or one that first appears later) :func:`kind_by_type`.

    Args:
        overrides (dict or None): Key to kind, as the user gave them.

    Raises:
        ValueError: ``overrides`` is not a dict of keys to kinds.
    """

    def __init__(self, overrides=None):
        check_report_kinds(overrides)
        self._overrides = dict(overrides or {})
        self._found = collections.OrderedDict()   # key -> kind
        self._untold = collections.OrderedDict()  # key -> why

    def learn(self, whole, parts, counts):
        """Finds each key's kind from deterministic forwards of the master.

        Args:
            whole (dict): The observation of the whole batch.
            parts (list of dict): The observation of each share.
            counts (list of int): Each share's examples.

        Raises:
            ValueError: A key reports arrays whose shape follows the
                examples (a value per example), which no sum or mean of the
                replicas' values gives.
        """
        for key, value in whole.items():
            if any(key not in part for part in parts):
                self._untold[key] = 'not reported on every share'
                continue
            found = compare(value, [part[key] for part in parts], counts)
            if found.kind == 'shapes':
                raise ValueError(
                    '{} is reported as an array of shape {} on the whole '
                    'first batch and of shapes {} on the devices\' shares: '
                    'a value per example cannot be combined from the '
                    'replicas. Report a sum or a mean over the examples '
                    '(or report it from one replica only: '
                    'cgdp_chainer.runtime.workers.worker.replica_index())'.format(
                        key, _numeric(value).shape,
                        [_numeric(part[key]).shape for part in parts]))
            if found.kind in KINDS:
                self._found[key] = found.kind
            elif found.kind != 'unknown':
                self._untold[key] = '{} match'.format(found.kind)
            # Values that are not numbers are not combined by kind.
            combine(key, [part[key] for part in parts], counts, 'mean')

    def kind(self, key, value):
        """The kind of ``key``, whose value (of one replica) is ``value``."""
        if key in self._overrides:
            return self._overrides[key]
        if key in self._found:
            return self._found[key]
        return kind_by_type(value)

    def describe(self, values=None):
        """The kinds in words, for the log: each key with its kind and how
        it was chosen.

        Args:
            values (dict or None): A value of each key (for the type rule).
        """
        values = values or {}
        words = []
        for key in sorted(set(self._found) | set(self._untold) |
                          set(self._overrides)):
            if key in self._overrides:
                how = 'given'
            elif key in self._found:
                how = 'found'
            else:
                how = 'by type; the first iteration could not tell: {}'.format(
                    self._untold[key])
            words.append('{} {} ({})'.format(
                key, self.kind(key, values.get(key)), how))
        return ', '.join(words) or 'none'


def combine_all(observations, counts, kinds):
    """The replicas' observations as one, as the whole batch reports it.

    A key that only some replicas reported is combined over those (a mean
    weighted by their shares among them).

    Args:
        observations (list of dict): Each replica's reported values.
        counts (list of int): Each replica's examples.
        kinds (ReportKinds): How each key combines.

    Returns:
        dict: Key to the combined value.
    """
    keys = []
    for observation in observations:
        keys.extend(key for key in observation if key not in keys)
    combined = {}
    for key in keys:
        present = [(observation[key], count) for observation, count in
                   zip(observations, counts) if key in observation]
        values = [value for value, _ in present]
        combined[key] = combine(key, values, [c for _, c in present],
                                kinds.kind(key, values[0]))
    return combined


def with_graphs(combined, graphs):
    """The replicas' combined values, with the graphs of the master's first
    forward where it reported a value with its graph (for
    ``extensions.DumpGraph``): each such ``Variable`` then holds the
    replicas' value, so that every iteration reports the values its update
    used, the first one too.

    Args:
        combined (dict): From :func:`combine_all`.
        graphs (dict): Key to a ``Variable`` with its creator, from the
            master's forward on the whole first batch.

    Returns:
        dict: What to report.
    """
    result = dict(combined)
    for key, graph in graphs.items():
        value = _numeric(combined.get(key))
        if value is not None and value.size == graph.size:
            graph.array = value.astype(graph.dtype).reshape(graph.shape)
        result[key] = graph
    return result


def combine(key, values, counts, kind):
    """One key's values of the replicas as one value of the reported type.

    Args:
        key (str): The key (for messages).
        values (list): Each replica's value (see :func:`portable`).
        counts (list of int): Each replica's examples.
        kind (str): ``'sum'`` or ``'mean'``.

    Raises:
        ValueError: Arrays of different shapes, or values that are not
            numbers and differ between the replicas.
    """
    first = values[0]
    if len(values) == 1:
        return _restored(first)
    if all(_is_weighted_pair(value) for value in values):
        return _combine_pairs(key, values, counts)
    arrays = [_numeric(value) for value in values]
    if any(array is None for array in arrays):
        if all(_equal(value, first) for value in values[1:]):
            return _restored(first)
        raise ValueError(
            '{} is reported as {} by the replicas: values that are not '
            'numbers and differ cannot be combined into the whole batch\'s '
            '(report numbers, or report it from one replica only: '
            'cgdp_chainer.runtime.workers.worker.replica_index())'.format(
                key, ', '.join(repr(value)[:40] for value in values)))
    if any(array.shape != arrays[0].shape for array in arrays):
        raise ValueError(
            '{} is reported as arrays of shapes {} by the replicas: a value '
            'per example cannot be combined into the whole batch\'s; report '
            'a sum or a mean over the examples'.format(
                key, [array.shape for array in arrays]))
    return _as_reported(first, _combine_arrays(arrays, counts, kind))


def _combine_arrays(arrays, counts, kind):
    dtype = numpy.result_type(*arrays)
    total = sum(counts)
    if dtype.kind in 'biu':
        ints = [array.astype(numpy.int64) for array in arrays]
        if kind == 'sum':
            added = numpy.asarray(sum(ints))
            return added if dtype.kind == 'b' else added.astype(dtype)
        weighted = numpy.asarray(sum(count * array for count, array in
                                     zip(counts, ints)))
        if numpy.all(weighted % total == 0):
            return numpy.asarray(weighted // total).astype(dtype)
        return numpy.asarray(weighted / total)
    floats = [array.astype(numpy.float64) for array in arrays]
    if kind == 'sum':
        result = sum(floats)
    else:
        result = sum(count / total * array for count, array in
                     zip(counts, floats))
    return numpy.asarray(result).astype(dtype)


def _restored(value):
    """A replica's value as the model reported it (a :class:`VariableValue`
    as a ``Variable`` again)."""
    if isinstance(value, VariableValue):
        return chainer.Variable(value.array)
    if type(value) is tuple:
        return tuple(_restored(item) for item in value)
    return value


def _as_reported(first, result):
    """``result`` (a NumPy array) in the type of ``first``, the value a
    replica reported."""
    if isinstance(first, (VariableValue, chainer.Variable)):
        return chainer.Variable(result)
    if isinstance(first, numpy.ndarray):
        return result
    if isinstance(first, numpy.generic):
        return result[()]
    if isinstance(first, bool) and result.dtype.kind == 'b':
        return bool(result)
    if isinstance(first, numbers.Integral) and result.dtype.kind in 'biu':
        return int(result)
    return float(result)


def _is_weighted_pair(value):
    # DictSummary reads a (value, weight) pair as a weighted value.
    return type(value) is tuple and len(value) == 2 and \
        _numeric(value[0]) is not None and _numeric(value[1]) is not None \
        and _numeric(value[1]).ndim == 0


def _combine_pairs(key, values, counts):
    """``(value, weight)`` pairs as one: the weight-weighted mean of the
    values, with the sum of the weights (the whole batch's pair when each
    value is a mean over its weight's examples)."""
    weights = [float(_numeric(weight)) for _, weight in values]
    total = sum(weights)
    if total == 0:
        value = combine(key, [v for v, _ in values], counts, 'mean')
    else:
        arrays = [_numeric(v).astype(numpy.float64) for v, _ in values]
        result = sum(w / total * array for w, array in zip(weights, arrays))
        dtype = numpy.result_type(*[_numeric(v) for v, _ in values])
        if dtype.kind != 'f':
            dtype = numpy.float64
        value = _as_reported(values[0][0],
                             numpy.asarray(result).astype(dtype))
    weight = combine(key, [w for _, w in values], counts, 'sum')
    return (value, weight)


def _equal(a, b):
    try:
        return bool(a == b)
    except Exception:
        return a is b


Forward = collections.namedtuple('Forward', ('loss', 'observation'))
Forward.__doc__ = """One deterministic forward of the master.

Attributes:
    loss: The returned loss (a :class:`VariableValue`), or what the loss
        function returned if it was not a ``Variable``.
    observation (dict): Its reported values (see :func:`portable`).
"""


def probe_forwards(link, loss_func, inputs_list, seed=None):
    """Forwards of ``link`` that leave no trace, for the first iteration's
    comparisons.

    Each runs with ``chainer.config.train`` False (dropout off,
    BatchNormalization on its statistics: deterministic) and backprop off,
    in a private reporter, from the same state: after each, every link's
    attributes and persistent values (and the states of random generators
    held as its attributes) are put back; after all, NumPy's global random
    state and Python's ``random`` state too, so that the training that
    follows is the one without these forwards.

    Args:
        link (chainer.Link): The master model.
        loss_func (callable or None): The loss function (default: ``link``).
        inputs_list (list): Converted inputs, one forward each.
        seed (numpy.ndarray or None): If given, NumPy's global random state
            and Python's ``random`` are seeded from it for these forwards
            (a model that draws random numbers then draws others than from
            the caller's state); either way both are put back after.

    Returns:
        list of Forward: One per inputs.
    """
    saved = _LinkState(link)
    numpy_state = numpy.random.get_state()
    python_state = random.getstate()
    if seed is not None:
        numpy.random.seed(seed)
        random.seed(int(seed[0]))
    reporter = chainer.Reporter()
    reporter.add_observer('main', link)
    reporter.add_observers('main', link.namedlinks(skipself=True))
    forwards = []
    try:
        with chainer.using_config('train', False), \
                chainer.no_backprop_mode():
            for in_arrays in inputs_list:
                observation = {}
                with reporter.scope(observation):
                    loss = shared.call_with(loss_func or link, in_arrays)
                # Every forward starts from the same state (a model that
                # counts its calls takes the same branch in each).
                saved.restore()
                forwards.append(Forward(
                    portable(loss) if isinstance(loss, chainer.Variable)
                    else loss,
                    {key: portable(value)
                     for key, value in observation.items()}))
    finally:
        saved.restore()
        numpy.random.set_state(numpy_state)
        random.setstate(python_state)
    return forwards


class _LinkState(object):
    """Every link's attributes (what a forward may rebind: an RNN's state,
    a Classifier's ``y`` and ``loss``), its persistent arrays' values and
    the states of the NumPy random generators it holds (which a forward
    advances in place; the replicas are copied from the master after the
    probes and must draw what they would have drawn without them)."""

    def __init__(self, link):
        self._links = []
        for _, sublink in link.namedlinks():
            arrays = {name: numpy.array(value, copy=True)
                      for name, value in sublink.__dict__.items()
                      if name in sublink._persistent and
                      isinstance(value, numpy.ndarray)}
            generators = [(value, _generator_state(value)) for value in
                          sublink.__dict__.values()
                          if _generator_state(value) is not None]
            self._links.append((sublink, dict(sublink.__dict__), arrays,
                                generators))

    def restore(self):
        for sublink, attributes, arrays, generators in self._links:
            sublink.__dict__.clear()
            sublink.__dict__.update(attributes)
            for name, value in arrays.items():
                sublink.__dict__[name][...] = value
            for generator, state in generators:
                _set_generator_state(generator, state)


def _generator_state(value):
    """The state of a NumPy random generator, or None for anything else."""
    if isinstance(value, numpy.random.RandomState):
        return value.get_state()
    if isinstance(value, numpy.random.Generator):
        return value.bit_generator.state
    return None


def _set_generator_state(generator, state):
    if isinstance(generator, numpy.random.RandomState):
        generator.set_state(state)
    else:
        generator.bit_generator.state = state


def _number_words(value):
    array = _numeric(value)
    if array is None:
        return type(value).__name__
    if array.ndim == 0:
        return '{:.7g}'.format(float(array))
    return 'an array of shape {} (total {:.7g})'.format(
        array.shape, float(array.sum()))


def describe_loss(comparison):
    """The first iteration's comparison of the loss in words: the whole
    batch's loss, the shares', their sum and their weighted mean; and, if
    it was decided within the sampling noise, the second draw and the
    distances (see :func:`within_noise`).

    Args:
        comparison (Comparison): The loss's comparison.
    """
    words = ('a forward of the model (chainer.config.train False) on the '
             'whole batch gave the loss {}, on the {} shares {}: their sum '
             'is {}, their mean weighted by their examples {}'.format(
                 _number_words(comparison.whole), len(comparison.parts),
                 ', '.join(_number_words(part) for part in comparison.parts),
                 _number_words(comparison.sum)
                 if comparison.sum is not None else '-',
                 _number_words(comparison.mean)
                 if comparison.mean is not None else '-'))
    if comparison.again is None:
        return words
    distances = noise_distances(comparison)
    return ('{}; a second forward on the whole batch, with other random '
            'numbers, gave {}: the loss draws random numbers in test mode. '
            'It is {:.4g} from the shares\' mean and {:.4g} from their sum '
            '({:.4g} apart), its two draws {:.4g} apart; a reduction is '
            'found where the loss is within {:g} of the sum-mean distance '
            '({:.4g}) of one and the two draws are as near each '
            'other'.format(
                words, _number_words(comparison.again), distances['mean'],
                distances['sum'], distances['between'], distances['draws'],
                NOISE_MARGIN, NOISE_MARGIN * distances['between']))


_REDUCTION_CHOICES = (
    "Give CGDPUpdater(..., reduction='mean') to train as ChainerMN does: "
    "each device's loss as the model computes it on its share (a mean "
    "over what that share holds), weighted by the share's examples; a loss "
    "that is a mean over the examples (softmax_cross_entropy(..., "
    "normalize=False) with ignore_label, a loss divided by the batch's "
    "examples rather than by a count of positives) then gives "
    "StandardUpdater's exact result, and the default finds it. Give "
    "reduction='sum' if the loss adds up over the examples (the devices' "
    "gradients are then summed)")


def reduction_refusal(comparison, other_ranks=False, failure=None,
                      iteration=None):
    """Why the reduction could not be found, and what to do, in words.

    Args:
        comparison (Comparison or None): This rank's comparison of the loss
            (None: its batch of one example could not be split, or the
            forwards failed).
        other_ranks (bool): Whether this rank found one but another MPI
            rank found another, or none.
        failure (str or None): What the forwards raised, in words.
        iteration (int or None): For the check of a later batch, its
            iteration (counted from 1), whose update was not run.
    """
    if failure is not None:
        why = ('the forwards of the model that compare the whole batch\'s '
               'loss with its shares\' (chainer.config.train False, no '
               'backprop) raised {}'.format(failure))
    elif other_ranks and iteration is not None:
        why = ("another MPI rank's batch does not show it (see its error); "
               'this rank\'s {}'.format(
                   'batch holds one example, which cannot be split'
                   if comparison is None else 'comparison: ' +
                   describe_loss(comparison)))
    elif other_ranks:
        why = ("this MPI rank found {!r} ({}), but another rank found "
               "another reduction or none (see its error)".format(
                   comparison.kind, describe_loss(comparison)))
    elif iteration is not None:
        why = ('{}: the whole batch\'s loss is not their mean within {} '
               '(a loss normalized by a count of positive boxes, pixels or '
               'tokens that differs between the shares, say)'.format(
                   describe_loss(comparison), 'the sampling noise'
                   if comparison.again is not None else
                   'float rounding ({})'.format(
                       _tolerance_words(comparison))))
    else:
        why = _why_untold(comparison)
    if iteration is not None:
        return ("CGDP found reduction='mean' at the first iteration, but "
                "the batch of iteration {} does not confirm it, so its "
                "update was not run (the earlier ones matched "
                "StandardUpdater's): {}. {}.".format(
                    iteration, why, _REDUCTION_CHOICES))
    return ("CGDP cannot tell how the devices' gradients must be combined: "
            '{}. {}.'.format(why, _REDUCTION_CHOICES))


def _why_untold(comparison):
    """Why a comparison of the loss found no reduction, in words."""
    if comparison is None:
        why = ('the batch holds one example on one device, which cannot be '
               'split into shares to compare their losses with the whole '
               "batch's")
    elif comparison.kind == 'both':
        why = ('{}: both match (e.g. zero losses), so whether the loss adds '
               'up over the examples or averages them cannot be told'.format(
                   describe_loss(comparison)))
    elif comparison.kind == 'indistinct' and \
            len(informative_parts(comparison)) < 2:
        why = ('{}: the whole batch\'s loss matches, but fewer than two '
               'shares have a loss that is not zero, even on {} shares; a '
               'share whose loss is zero (or a constant without a graph, '
               'as SSD\'s multibox loss on a share without a positive box) '
               'tells nothing of the form: a loss normalized by a count of '
               'what the other shares hold would match too'.format(
                   describe_loss(comparison), len(comparison.parts)))
    elif comparison.kind == 'indistinct':
        why = ('{}: the whole batch\'s loss matches the mean within float '
               'rounding ({:.3g}), but not within {:g} of the shares\' '
               'spread, or the spread is within that rounding: too small '
               'to show that it weighs them by their examples rather than '
               'by something else (a mean over '
               'the pixels or tokens that are not ignored, as '
               'softmax_cross_entropy with ignore_label: then neither '
               "reduction gives StandardUpdater's result exactly), even "
               'on {} finer shares'.format(
                   describe_loss(comparison),
                   float(numpy.max(comparison.tolerance['mean'])),
                   WEIGHTS_SHOWN_WITHIN, len(comparison.parts)))
    elif comparison.kind == 'neither' and comparison.again is not None:
        why = ('{}. Neither matches within the sampling noise: it is too '
               'large against the distance between the shares\' sum and '
               'mean to tell them apart'.format(describe_loss(comparison)))
    elif comparison.kind == 'neither':
        why = ('{}: neither matches, and a second forward on the whole '
               'batch gave the same loss (float rounding allows {}). The '
               'loss is neither a sum nor a mean over the examples (a mean '
               'over the tokens of sequences of different lengths, over '
               'the pixels a loss does not ignore, or normalized by a '
               'count of positive boxes, say: then neither reduction gives '
               "StandardUpdater's result exactly), or its forward draws "
               'random numbers from a generator of its own, which drew the '
               'same again'.format(describe_loss(comparison),
                                   _tolerance_words(comparison)))
    elif comparison.kind == 'shapes':
        why = ('the loss is an array whose shape follows the batch ({} on '
               'the whole batch, {} on the shares)'.format(
                   _number_words(comparison.whole),
                   ', '.join(_number_words(p) for p in comparison.parts)))
    else:
        why = ('with chainer.config.train False the loss function returned '
               '{} (on the whole batch), not a Variable of numbers'.format(
                   type(comparison.whole).__name__))
    return why


def _tolerance_words(comparison):
    if comparison.tolerance is None:
        return 'exactly'
    return ('{:.3g} of the sum, {:.3g} of the mean: (examples + {}) times '
            'the machine epsilon times the loss\'s magnitude'.format(
                float(numpy.max(comparison.tolerance['sum'])),
                float(numpy.max(comparison.tolerance['mean'])),
                ROUNDING_MARGIN))
