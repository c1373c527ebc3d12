"""One iteration's batch, in any form an iterator returns, split over the
devices.

An iterator returns either a *list of examples* (Chainer's iterators), which
is split as ``ParallelUpdater`` splits it (device ``i`` of ``n`` gets
``batch[i::n]``) and each share converted on its own, or a batch that is
already batched (a tuple or dict of arrays, an array: the word2vec
example's ``WindowIterator`` returns ``(center, contexts)``), which
``StandardUpdater`` hands to the converter as it is. Such a batch is
converted whole on the host, then every array of the converter's output is
split along its first axis, which must be the examples' axis of them all:
device ``i`` gets a contiguous run of that axis, its share of the examples
being its fraction of it.

A batch with fewer examples than devices (the last of an epoch without
repeat) trains as ``StandardUpdater`` trains it: a device whose share holds
no example gets ``None`` for its share (converters refuse an empty batch),
runs no forward and hands over zero gradients with a weight of 0.
"""
import numpy

from cgdp_chainer.runtime.transport import shared

# What a pre-batched output can hold, in words for the refusals.
_PREBATCHED_FORMS = (
    'a pre-batched batch (one the iterator returns as something other than '
    'a list of examples) is converted whole, then every array of the '
    "converter's output is split along its first axis")


class Batch(object):
    """One iteration's examples: each device's converted share, how many
    examples each holds, and the whole batch converted; conversions happen
    when first asked for (the whole batch first, as ``StandardUpdater``
    converts it, where the first iteration needs it).

    Args:
        counts (list of int): The examples of each share.
        make_inputs (callable): Returns the converted share of each device,
            in host memory.
        whole (callable): Returns the whole batch converted, as
            ``StandardUpdater`` converts it.
        split (callable): ``split(k)``: ``(inputs, counts)`` of the whole
            batch cut into ``k`` shares, or None if it holds fewer than
            ``k`` examples (for comparisons on one device).
        form (str): The batch's form in words, for messages.
    """

    def __init__(self, counts, make_inputs, whole, split, form):
        self.counts = [int(count) for count in counts]
        self._make_inputs = make_inputs
        self._inputs = None
        self._whole = whole
        self._whole_inputs = None
        self.split = split
        self.form = form

    @property
    def shares(self):
        """Each device's fraction of the batch's examples (its weight in
        ``reduction='mean'``)."""
        total = sum(self.counts)
        return [count / total for count in self.counts]

    @property
    def inputs(self):
        """The converted share of each device (computed once)."""
        if self._inputs is None:
            self._inputs = self._make_inputs()
        return self._inputs

    @property
    def whole_inputs(self):
        """The whole batch converted (computed once)."""
        if self._whole_inputs is None:
            self._whole_inputs = self._whole()
        return self._whole_inputs


def is_list_of_examples(batch):
    """Whether ``batch`` is split by examples (a list), not converted whole
    and split along its arrays' first axis (anything else)."""
    return isinstance(batch, list)


def convert_share(convert, share):
    """``convert(share)``, or None for a share without examples (see the
    module's docstring)."""
    return convert(share) if len(share) else None


def _one_by_one(convert):
    return lambda shares: [convert_share(convert, share) for share in shares]


def from_iterator_batch(batch, n, convert, convert_shares=None):
    """The batch of a single iterator, split over ``n`` devices.

    Args:
        batch: What the iterator's ``next()`` returned.
        n (int): Devices.
        convert (callable): ``convert(examples)``: the converter with the
            host device.
        convert_shares (callable or None): ``convert_shares(shares)``: each
            share converted (in parallel); by default one by one.

    Returns:
        Batch: The devices' shares.

    Raises:
        ValueError: An empty batch, or a pre-batched batch whose converted
            arrays cannot be split (see :func:`split_converted`).
    """
    if is_list_of_examples(batch):
        if not batch:
            raise ValueError('the iterator gave an empty batch')
        convert_shares = convert_shares or _one_by_one(convert)
        return Batch([len(batch[i::n]) for i in range(n)],
                     lambda: convert_shares([batch[i::n] for i in range(n)]),
                     lambda: convert(batch), _example_splitter(batch, convert),
                     'a list of examples')
    whole = convert(batch)
    form = 'a pre-batched {}'.format(type(batch).__name__)
    inputs, counts = split_converted(whole, n, form)
    return Batch(counts, lambda: inputs, lambda: whole,
                 _converted_splitter(whole, form), form)


def _example_splitter(examples, convert):
    def split(k):
        if len(examples) < k:
            return None
        shares = [examples[i::k] for i in range(k)]
        return [convert(share) for share in shares], [len(s) for s in shares]
    return split


def _converted_splitter(converted, form):
    def split(k):
        if examples_axis(converted, form) < k:
            return None
        return split_converted(converted, k, form)
    return split


def from_read_ahead(counts, result, convert):
    """A batch of examples read ahead and its shares converted in the
    background (see :mod:`~cgdp_chainer.runtime.input.input_path`).

    Args:
        counts (list of int): The examples of each share (``examples[i::n]``
            for device ``i`` of ``n``).
        result (callable): Waits for the background work; returns
            ``(examples, converted shares)``, or raises what it raised.
        convert (callable): The converter with the host device (for the
            whole batch and the comparisons' splits).
    """
    def examples():
        return result()[0]

    def split(k):
        return _example_splitter(examples(), convert)(k)

    return Batch(counts, lambda: result()[1], lambda: convert(examples()),
                 split, 'a list of examples')


def from_device_batches(batches, convert, convert_shares=None):
    """The batches of the iterator-list form, one per device; the whole
    batch is their concatenation.

    Args:
        batches (list): What each iterator's ``next()`` returned.
        convert (callable): The converter with the host device.
        convert_shares (callable or None): As for
            :func:`from_iterator_batch`.

    Returns:
        Batch: One share per iterator.

    Raises:
        ValueError: An empty batch, or pre-batched outputs that cannot be
            split or concatenated.
    """
    if all(is_list_of_examples(batch) for batch in batches):
        for index, share in enumerate(batches):
            if not share:
                raise ValueError('the iterator of device {} gave an empty '
                                 'batch'.format(index))
        examples = [example for share in batches for example in share]
        convert_shares = convert_shares or _one_by_one(convert)
        return Batch([len(share) for share in batches],
                     lambda: convert_shares(batches),
                     lambda: convert(examples),
                     _example_splitter(examples, convert),
                     'a list of examples per device')
    inputs = [convert(batch) for batch in batches]
    counts = []
    for index, (batch, converted) in enumerate(zip(batches, inputs)):
        form = 'the pre-batched {} of device {}'.format(
            type(batch).__name__, index)
        if is_list_of_examples(batch):
            form = 'the list of examples of device {}'.format(index)
        counts.append(examples_axis(converted, form))
    # Their concatenation is made only where the first iteration needs the
    # whole batch: it copies every array.
    whole = []

    def concatenated():
        if not whole:
            whole.append(concatenate_converted(inputs))
        return whole[0]

    def split(k):
        return _converted_splitter(concatenated(),
                                   'the concatenated batches')(k)

    return Batch(counts, lambda: inputs, concatenated, split,
                 'a batch per device')


def examples_axis(converted, form):
    """The length of the first axis that every array of a converter's output
    shares: its number of examples.

    Args:
        converted: The converter's output.
        form (str): The batch's form in words, for the refusal.

    Raises:
        ValueError: The output holds no array, a list (a ragged list of
            examples, or a list used as a container: which cannot be told),
            an array of objects or of no dimension, or arrays whose first
            dimensions differ.
    """
    structure, arrays = shared.flatten_inputs(converted)
    problem = _unsplittable_part(structure, 'the output')
    if problem is None and not arrays:
        problem = 'the output holds no array'
    if problem is None:
        lengths = {}
        for path, array in _arrays_by_path(structure, arrays, 'the output'):
            if array.ndim == 0:
                problem = '{} is an array of no dimension'.format(path)
                break
            lengths.setdefault(array.shape[0], []).append(path)
        if problem is None and len(lengths) > 1:
            problem = 'its arrays differ in their first dimension: {}'.format(
                '; '.join('{} at {}'.format(
                    length, ', '.join(paths)) for length, paths in sorted(
                        lengths.items())))
        if problem is None:
            return next(iter(lengths))
    raise ValueError(
        'cannot split {} over the devices: {}; {} ({}). Make every array of '
        "the converter's output hold the examples along its first axis "
        '(with tuples, dicts or namedtuples as containers), or have the '
        'iterator return a list of examples, which the devices split before '
        'converting'.format(form, problem, _PREBATCHED_FORMS,
                            _describe(converted)))


def split_converted(converted, n, form):
    """Every array of a converter's output split along its first axis into
    ``n`` contiguous runs (the first ``length % n`` one longer); other
    values (numbers, strings, None) go to every share as they are.

    Args:
        converted: The converter's output for the whole batch.
        n (int): Devices.
        form (str): The batch's form in words, for messages.

    Returns:
        tuple: ``(shares, counts)``: each device's output, in the same
        containers (None for a device without examples), and its number of
        examples.

    Raises:
        ValueError: See :func:`examples_axis`; or no example at all.
    """
    length = examples_axis(converted, form)
    if length == 0:
        raise ValueError(
            'cannot split {} over the devices: it holds no example along '
            'the first axis of its arrays'.format(form))
    counts = [length // n + (1 if i < length % n else 0) for i in range(n)]
    structure, arrays = shared.flatten_inputs(converted)
    shares = []
    start = 0
    for count in counts:
        shares.append(shared.unflatten_inputs(
            structure, [array[start:start + count] for array in arrays])
            if count else None)
        start += count
    return shares, counts


def concatenate_converted(outputs):
    """Converter outputs of the same structure as one: each array the
    concatenation of theirs along the first axis (the iterator-list form's
    whole batch, when its batches are pre-batched).

    Args:
        outputs (list): The converted batch of each device.

    Raises:
        ValueError: The outputs differ in their structure.
    """
    flat = [shared.flatten_inputs(output) for output in outputs]
    structure = flat[0][0]
    for index, (other, arrays) in enumerate(flat[1:], start=1):
        if _shape_of(other) != _shape_of(structure) or \
                len(arrays) != len(flat[0][1]):
            raise ValueError(
                'the converted batches of devices 0 and {} differ in form '
                '({} and {}); the iterator-list form trains as one device '
                'on their concatenation, which needs the same containers '
                'and arrays in every device'.format(
                    index, _describe(outputs[0]), _describe(outputs[index])))
    arrays = [numpy.concatenate([arrays[position] for _, arrays in flat],
                                axis=0)
              for position in range(len(flat[0][1]))]
    return shared.unflatten_inputs(structure, arrays)


def _shape_of(structure):
    """A structure without its plain values (which may differ)."""
    kind = structure[0]
    if kind == 'array':
        return structure
    if kind == 'value':
        return ('value',)
    _, container, items = structure
    if kind == 'mapping':
        return (kind, container, [(key, _shape_of(item))
                                  for key, item in items])
    return (kind, container, [_shape_of(item) for item in items])


def _children(structure, path):
    """``(path, item)`` of a container's items."""
    kind, container, items = structure
    if kind == 'mapping':
        return [('{}[{!r}]'.format(path, key), item) for key, item in items]
    if hasattr(container, '_fields'):
        return [('{}.{}'.format(path, field), item)
                for field, item in zip(container._fields, items)]
    return [('{}[{}]'.format(path, index), item)
            for index, item in enumerate(items)]


def _unsplittable_part(structure, path):
    """Words for the first part that cannot be split along the examples'
    axis (a list, an array of objects), or None."""
    kind = structure[0]
    if kind == 'array':
        return None
    if kind == 'value':
        value = structure[1]
        if isinstance(value, numpy.ndarray):
            return '{} is an array of objects'.format(path)
        return None
    if kind == 'sequence' and structure[1] is list:
        return ('{} is a list (of {} items): a ragged list of examples and '
                'a list used as a container cannot be told apart'.format(
                    path, len(structure[2])))
    for child_path, item in _children(structure, path):
        problem = _unsplittable_part(item, child_path)
        if problem is not None:
            return problem
    return None


def _arrays_by_path(structure, arrays, path):
    kind = structure[0]
    if kind == 'array':
        return [(path, arrays[structure[1]])]
    if kind == 'value':
        return []
    found = []
    for child_path, item in _children(structure, path):
        found.extend(_arrays_by_path(item, arrays, child_path))
    return found


def _describe(value, depth=0):
    """A converter's output in words: containers with the shapes of their
    arrays, e.g. ``tuple(array (8,) int32, array (8, 4) int32)``."""
    if isinstance(value, numpy.ndarray):
        return 'array {} {}'.format(value.shape, value.dtype)
    if depth < 3 and isinstance(value, (tuple, list)):
        return '{}({})'.format(type(value).__name__, ', '.join(
            _describe(item, depth + 1) for item in value[:6]) + (
                ', ...' if len(value) > 6 else ''))
    if depth < 3 and isinstance(value, dict):
        return '{}({})'.format(type(value).__name__, ', '.join(
            '{!r}: {}'.format(key, _describe(item, depth + 1))
            for key, item in list(value.items())[:6]))
    return type(value).__name__
