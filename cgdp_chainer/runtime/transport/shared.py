"""Arrays in shared memory, laid out once and opened by name in workers.

The user's process creates each segment (``multiprocessing.shared_memory``,
so that its resource tracker removes the segment even if the process is
killed) and describes it with a picklable :class:`ArenaLayout`. Worker
processes map the segment by name without registering it with a resource
tracker of their own: only its creator may remove it.
"""
import collections
import math
import mmap
import os
import pickle
from multiprocessing import shared_memory

import numpy

# Every array starts on a cache line (and a 4 KiB page where it is large),
# so that blocks of two arrays never share a line between processes.
_ALIGN = 64
_PAGE = 4096

ArenaLayout = collections.namedtuple(
    'ArenaLayout', ('segment', 'size', 'entries'))
ArenaLayout.__doc__ = """Where each array of a shared arena lies.

Attributes:
    segment (str): Name of the shared-memory segment.
    size (int): Bytes of the segment.
    entries (tuple): ``(name, shape, dtype string, offset)`` per array.
"""


def _aligned(offset, n_bytes):
    align = _PAGE if n_bytes >= _PAGE else _ALIGN
    return (offset + align - 1) // align * align


def plan_layout(specs):
    """Offsets of arrays packed into one segment.

    Args:
        specs (list): ``(name, shape, dtype)`` per array.

    Returns:
        tuple: ``(entries, size)`` as in :class:`ArenaLayout`.
    """
    entries = []
    offset = 0
    for name, shape, dtype in specs:
        dtype = numpy.dtype(dtype)
        n_bytes = math.prod(shape) * dtype.itemsize
        offset = _aligned(offset, n_bytes)
        entries.append((name, tuple(shape), dtype.str, offset))
        offset += n_bytes
    return tuple(entries), max(offset, 1)


class SharedArena(object):
    """Named arrays in one shared-memory segment.

    Build it with :meth:`create` in the process that owns the memory, or
    :meth:`attach` in a worker given the owner's :attr:`layout`.
    """

    def __init__(self, layout, buffer, closer):
        self.layout = layout
        self._buffer = buffer
        self._closer = closer
        self.arrays = collections.OrderedDict()
        for name, shape, dtype, offset in layout.entries:
            count = math.prod(shape)
            self.arrays[name] = numpy.frombuffer(
                buffer, dtype=numpy.dtype(dtype), count=count,
                offset=offset).reshape(shape)

    @classmethod
    def create(cls, specs, prefix='cgdp'):
        """Allocates a segment for ``specs`` (``(name, shape, dtype)``),
        zero-filled."""
        entries, size = plan_layout(specs)
        segment = shared_memory.SharedMemory(create=True, size=size)
        layout = ArenaLayout(segment.name, size, entries)

        unlinked = []

        def unlink():
            if not unlinked:
                unlinked.append(True)
                segment.unlink()

        def close():
            # Unlinking first: closing fails while an array still maps it.
            unlink()
            try:
                segment.close()
            except BufferError:
                # Arrays of it are still referenced (by user code, say):
                # the mapping goes with the last of them. Dropping the
                # handle keeps SharedMemory's finalizer from trying again,
                # with an error, at exit.
                segment._mmap = None
                raise
        arena = cls(layout, segment.buf, close)
        arena._unlink = unlink
        return arena

    def unlink_name(self):
        """Removes the segment's name (in its creator; the mappings stay
        until closed): once every process has attached, nothing is left in
        ``/dev/shm``, even for a process killed before it closes."""
        unlink = getattr(self, '_unlink', None)
        if unlink is not None:
            unlink()

    @classmethod
    def attach(cls, layout):
        """Maps an existing segment in a worker process."""
        path = os.path.join('/dev/shm', layout.segment.lstrip('/'))
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, layout.size)
        finally:
            os.close(fd)
        return cls(layout, mapped, mapped.close)

    @property
    def n_bytes(self):
        return self.layout.size

    def as_bytes(self):
        """The whole segment as one uint8 array (to page-lock it for
        CUDA copies, for example)."""
        return numpy.frombuffer(self._buffer, dtype=numpy.uint8)

    def close(self):
        """Releases the mapping (and removes the segment, in its creator).

        The arrays of :attr:`arrays` must not be used afterwards.
        """
        if self._closer is None:
            return
        self.arrays = collections.OrderedDict()
        buffer, self._buffer = self._buffer, None
        del buffer
        closer, self._closer = self._closer, None
        try:
            closer()
        except BufferError:
            # An array of the arena is still referenced somewhere: leave
            # the mapping to the garbage collector, but remove the name.
            pass


class BatchBuffer(object):
    """One replica's input arrays for an iteration, in a segment that grows.

    The user's process writes the converted sub-batch (:meth:`write`) and
    sends the returned description; the worker reads it back with
    :class:`BatchReader`. Arrays never go through a pipe as pickles: only
    the structure around them (see :func:`flatten_inputs`) does.
    """

    def __init__(self):
        self._segment = None

    def write(self, in_arrays):
        """Copies the arrays of ``in_arrays`` (whatever a converter returns,
        see :func:`flatten_inputs`) into the segment.

        Returns:
            tuple: ``(segment name, size, pickled structure, entries)``.

        Raises:
            ValueError: Something in ``in_arrays`` cannot be pickled, so it
                cannot reach a worker process.
        """
        structure, flat = flatten_inputs(in_arrays)
        try:
            structure = pickle.dumps(structure, pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise ValueError(
                "the converter returned something that cannot be handed to "
                "workers='process' ({}: {}); return arrays, numbers, None, "
                "and tuples, lists and dicts of them, or pass "
                "workers='thread'".format(type(error).__name__,
                                          error)) from error
        entries, size = plan_layout(
            [(str(i), a.shape, a.dtype) for i, a in enumerate(flat)])
        if self._segment is None or self._segment.size < size:
            self.close()
            self._segment = shared_memory.SharedMemory(
                create=True, size=max(size * 2, _PAGE))
        for (_, shape, dtype, offset), array in zip(entries, flat):
            view = numpy.frombuffer(self._segment.buf, dtype=dtype,
                                    count=array.size,
                                    offset=offset).reshape(shape)
            view[...] = array
            del view
        return (self._segment.name, self._segment.size, structure, entries)

    def close(self):
        if self._segment is not None:
            self._segment.unlink()
            self._segment.close()
            self._segment = None


class BatchReader(object):
    """The worker's side of :class:`BatchBuffer`: copies a sub-batch out of
    the segment named in the job (so the owner may replace it later)."""

    def __init__(self):
        self._name = None
        self._mapped = None

    def read(self, description, copy=True):
        """The sub-batch written by :meth:`BatchBuffer.write`, in the
        containers it had there.

        Args:
            description (tuple): What :meth:`BatchBuffer.write` returned.
            copy (bool): Whether the arrays are copies (the replica computes
                on them) or read-only views of the segment, for a GPU
                replica, which packs them into page-locked memory of its
                own at once for the copy to its device (see
                :mod:`~cgdp_chainer.runtime.transport.input_staging`), so
                that a private copy first would only add a pass over the
                share. The views must be dropped before
                the next :meth:`read`, which may map another segment.
        """
        name, size, structure, entries = description
        if name != self._name:
            self.close()
            path = os.path.join('/dev/shm', name.lstrip('/'))
            fd = os.open(path, os.O_RDONLY)
            try:
                self._mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._name = name
        flat = []
        for _, shape, dtype, offset in entries:
            count = math.prod(shape)
            view = numpy.frombuffer(self._mapped, dtype=numpy.dtype(dtype),
                                    count=count, offset=offset)
            flat.append(view.reshape(shape).copy() if copy else
                        view.reshape(shape))
            del view
        return unflatten_inputs(pickle.loads(structure), flat)

    def close(self):
        if self._mapped is not None:
            try:
                self._mapped.close()
            except BufferError:
                # A view of it is still alive (an error's traceback): it
                # is unmapped once that view is freed.
                pass
            self._mapped = None
            self._name = None


# -- the structure of a converter's output ----------------------------------
#
# A converter returns an array, or containers of arrays nested in any way:
# a tuple or dict of arrays (concat_examples), a dict of lists of arrays of
# different lengths (Chainer's NLP examples), with numbers or None among
# them. The same rule, here only, says what is a container (rebuilt with its
# own type), what is an array (handed over through shared memory, or sent to
# a replica's device) and what is any other value (kept as it is).


def _is_array(value):
    # Object arrays hold Python objects: they are values, not memory.
    return type(value) is numpy.ndarray and not value.dtype.hasobject


def _sequence_type(value):
    """The type to rebuild a sequence with, or None if it is not one."""
    kind = type(value)
    if kind is tuple or kind is list:
        return kind
    if isinstance(value, tuple) and hasattr(kind, '_fields'):
        return kind  # a namedtuple
    return None


def _mapping_type(value):
    kind = type(value)
    return kind if kind is dict or kind is collections.OrderedDict else None


def flatten_inputs(in_arrays):
    """Splits a converter's output into its arrays and a description of
    everything around them.

    Tuples, lists, dicts, ``OrderedDict`` objects and namedtuples are walked
    into, at any depth; NumPy arrays (not of ``object`` dtype) are the
    arrays; anything else (``None``, numbers, strings, NumPy scalars,
    other objects) is kept in the description as it is. An array found
    twice is listed once, so it comes back as one array.

    Args:
        in_arrays: What the converter returned.

    Returns:
        tuple: ``(structure, arrays)``; :func:`unflatten_inputs` rebuilds
        ``in_arrays`` from them.
    """
    arrays = []
    positions = {}

    def describe(value):
        if _is_array(value):
            position = positions.get(id(value))
            if position is None:
                position = positions[id(value)] = len(arrays)
                arrays.append(value)
            return ('array', position)
        sequence = _sequence_type(value)
        if sequence is not None:
            return ('sequence', sequence, [describe(item) for item in value])
        mapping = _mapping_type(value)
        if mapping is not None:
            return ('mapping', mapping,
                    [(key, describe(item)) for key, item in value.items()])
        return ('value', value)

    return describe(in_arrays), arrays


def unflatten_inputs(structure, arrays):
    """Rebuilds what :func:`flatten_inputs` split, with ``arrays`` (the
    same arrays, or their copies, in the same order) in place of the
    original ones.

    Args:
        structure: The description from :func:`flatten_inputs`.
        arrays (list): One array per position.

    Returns:
        The converter's output, with the same container types.
    """
    kind = structure[0]
    if kind == 'array':
        return arrays[structure[1]]
    if kind == 'value':
        return structure[1]
    _, container, items = structure
    if kind == 'mapping':
        return container((key, unflatten_inputs(item, arrays))
                         for key, item in items)
    items = [unflatten_inputs(item, arrays) for item in items]
    if container is tuple or container is list:
        return container(items)
    return container(*items)  # a namedtuple


def map_arrays(func, in_arrays):
    """``in_arrays`` with ``func(array)`` in place of each of its arrays
    (as :func:`flatten_inputs` finds them), the rest as it was.

    Args:
        func (callable): Applied once to each distinct array.
        in_arrays: What a converter returned.
    """
    structure, arrays = flatten_inputs(in_arrays)
    return unflatten_inputs(structure, [func(array) for array in arrays])


def copied_inputs(in_arrays):
    """A converter's output with copies of its arrays (for extra forwards
    that must not touch what the replicas train on)."""
    return map_arrays(numpy.copy, in_arrays)


def call_with(func, in_arrays):
    """Calls a loss function on a converted batch as ``StandardUpdater``
    does: a tuple as positional arguments, a dict as keyword arguments,
    anything else as the one argument.

    Args:
        func (callable): The loss function (or the model).
        in_arrays: The converter's output.
    """
    if isinstance(in_arrays, tuple):
        return func(*in_arrays)
    if isinstance(in_arrays, dict):
        return func(**in_arrays)
    return func(in_arrays)
