"""What replicas report, combined as the whole batch would have reported it.

Each replica reports what the model reports on its share of the batch
(``main/loss``, ``main/accuracy``, counts such as ``main/correct``); the
updater reports one value per key, the one ``StandardUpdater`` would report
on the whole batch. A value that adds up over the examples (a loss summed
over them, a count) is the sum of the replicas' values; a mean over the
examples is the mean of the replicas' values weighted by their shares of
the examples. Which of the two a key is, is found at the first iteration:
deterministic forwards of the master on the whole batch and on each share
(run by :class:`~cgdp_chainer.runtime.replica.loss_reduction.ReductionFinder`)
say whether the whole batch's value is the sum of the shares' or their
share-weighted mean (:func:`compare`, :class:`ReportKinds`). The loss's
reduction is found by the same comparison, within float rounding; its
evidence is :mod:`~cgdp_chainer.runtime.replica.reduction_evidence`'s.

Combined values keep the type the model reported: a Python ``int`` stays an
``int`` and a ``float`` a ``float``, a NumPy scalar a NumPy scalar of its
dtype, an array an array, a ``Variable`` a ``Variable`` (without a graph).
Integers stay exact: a sum of integers is an integer; a mean of integers is
one when it is a whole number, else a float.
"""
import collections
import collections.abc
import numbers

import chainer
import numpy

KINDS = ('sum', 'mean')

# Relative tolerance of the first iteration's comparisons: the whole batch
# and its shares are summed in different orders. Far below the factor of
# about the number of shares between a sum and a mean.
RTOL = 1e-4
RTOL_HALF = 1e-2  # float16 values, or chainer.config.dtype float16


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


def numeric(value):
    """``value`` as a NumPy array for the arithmetic, or None if it is not
    a number, a boolean or an array of them (a :class:`VariableValue` or
    ``Variable``: its array)."""
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
        (the loss's evidence only) ``'indistinct'``: a loss's match that
        the shares' losses cannot show (see
        :func:`~cgdp_chainer.runtime.replica.reduction_evidence.shows_form`).
    whole, parts: The values compared (as reported).
    sum, mean (numpy.ndarray or None): The shares' sum and weighted mean.
    again: None, or (for a loss that draws random numbers, see
        :func:`~cgdp_chainer.runtime.replica.reduction_evidence.within_noise`)
        the whole batch's loss from a second forward with other random
        numbers; ``kind`` was then decided within the sampling noise.
    tolerance (dict or None): Where :func:`compare` was given a
        ``tolerance`` rule, ``'sum'`` and ``'mean'``: how far the whole
        batch's value may be from each.
"""


def compare(whole, parts, counts, tolerance=None):
    """Whether a value of the whole batch is the sum or the mean of the
    values of its shares.

    Integers are compared exactly. Floats within ``tolerance``'s bounds;
    by default, for reported values, within :data:`RTOL` (or
    :data:`RTOL_HALF` for float16) of the larger of the whole batch's
    value and the sum of the shares' magnitudes.

    Args:
        whole: The value on the whole batch.
        parts (list): The value on each share.
        counts (list of int): Each share's examples.
        tolerance (callable or None): ``tolerance(arrays, counts)``, with
            ``arrays`` the whole batch's value then each share's (NumPy
            arrays in their reported dtypes), gives a dict of ``'sum'``
            and ``'mean'`` to how far the whole batch's value may be from
            each (the loss's float rounding, see
            :func:`~cgdp_chainer.runtime.replica.reduction_evidence.compare_loss`);
            given, the comparison keeps them.

    Returns:
        Comparison: What was found.
    """
    arrays = [numeric(value) for value in [whole] + list(parts)]
    if any(array is None for array in arrays):
        return Comparison('unknown', whole, parts, None, None)
    target, shares = arrays[0], arrays[1:]
    if any(array.shape != target.shape for array in shares):
        return Comparison('shapes', whole, parts, None, None)
    total = sum(counts)
    if _is_integral(arrays):
        ints = [array.astype(numpy.int64) for array in arrays]
        added = numpy.asarray(sum(ints[1:]))
        weighted = numpy.asarray(sum(count * array for count, array in
                                     zip(counts, ints[1:])))
        is_sum = numpy.array_equal(ints[0], added)
        is_mean = numpy.array_equal(ints[0] * total, weighted)
        mean = weighted / total
        exact = numpy.zeros(target.shape)
        bounds = {'sum': exact, 'mean': exact}
    else:
        floats = [array.astype(numpy.float64) for array in arrays]
        added = numpy.asarray(sum(floats[1:]))
        mean = numpy.asarray(sum(count / total * array for count, array in
                                 zip(counts, floats[1:])))
        bounds = (tolerance or _reported_tolerance)(arrays, counts)
        is_sum = bool(numpy.all(numpy.abs(floats[0] - added) <=
                                bounds['sum']))
        is_mean = bool(numpy.all(numpy.abs(floats[0] - mean) <=
                                 bounds['mean']))
    kind = 'both' if is_sum and is_mean else 'sum' if is_sum else \
        'mean' if is_mean else 'neither'
    return Comparison(kind, whole, parts, added, mean,
                      tolerance=bounds if tolerance else None)


def _reported_tolerance(arrays, counts):
    """:func:`compare`'s bounds for reported values (see :data:`RTOL`)."""
    floats = [array.astype(numpy.float64) for array in arrays]
    scale = numpy.maximum(numpy.abs(floats[0]), numpy.asarray(
        sum(numpy.abs(array) for array in floats[1:])))
    bound = (RTOL_HALF if _computed_in_half(arrays) else RTOL) * scale
    return {'sum': bound, 'mean': bound}


def _computed_in_half(arrays):
    return any(array.dtype == numpy.float16 for array in arrays) or \
        numpy.dtype(chainer.get_dtype()) == numpy.float16


def kind_by_type(value):
    """The kind of a value the first iteration could not tell: integers
    (counts) add up, anything else is a mean."""
    array = numeric(value)
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
                        key, numeric(value).shape,
                        [numeric(part[key]).shape for part in parts]))
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
        value = numeric(combined.get(key))
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
    arrays = [numeric(value) for value in values]
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
        numeric(value[0]) is not None and numeric(value[1]) is not None \
        and numeric(value[1]).ndim == 0


def _combine_pairs(key, values, counts):
    """``(value, weight)`` pairs as one: the weight-weighted mean of the
    values, with the sum of the weights (the whole batch's pair when each
    value is a mean over its weight's examples)."""
    weights = [float(numeric(weight)) for _, weight in values]
    total = sum(weights)
    if total == 0:
        value = combine(key, [v for v, _ in values], counts, 'mean')
    else:
        arrays = [numeric(v).astype(numpy.float64) for v, _ in values]
        result = sum(w / total * array for w, array in zip(weights, arrays))
        dtype = numpy.result_type(*[numeric(v) for v, _ in values])
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
