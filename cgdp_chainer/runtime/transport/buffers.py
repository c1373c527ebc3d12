"""One flat buffer for a model's parameters, in which each chunk is a slice.

The master's parameters, each replica's gradient slots, the master's
gradients and the fused optimizer state all follow one
:class:`FlatLayout`: every parameter is a view into one flat buffer, at the
same offset in each. Once the chunk plan is formed the layout follows its
layer order (input side first), so that every chunk, for any chunk size
the plan may take later (the ``'auto'`` search cuts the same layer sequence
differently), is one contiguous slice of each buffer: a chunk's hand-over is
one copy per direction, and the host's reduce and update of a chunk is one
fused call over flat slices, as PyTorch DDP's buckets and Apex's flat master
parameters are.

Parameters of one dtype follow each other without gaps, so a chunk of
float32 parameters is one float32 run; where the dtype changes, the next
parameter starts on a cache line.
"""
import collections
import math
import threading

import numpy

# Where the dtype changes, the next run starts on a cache line (so that two
# runs never share one between threads).
_RUN_ALIGN = 64

Run = collections.namedtuple('Run', ('dtype', 'start', 'stop', 'names'))
Run.__doc__ = """A slice of a chunk whose parameters share one dtype.

Attributes:
    dtype (numpy.dtype): Their dtype.
    start (int): Its first byte in the flat buffer.
    stop (int): The byte after its last.
    names (tuple of str): The parameters in it, in buffer order.
"""

Span = collections.namedtuple('Span', ('start', 'stop', 'runs'))
Span.__doc__ = """A chunk's slice of the flat buffer.

Attributes:
    start (int): Its first byte.
    stop (int): The byte after its last.
    runs (tuple of Run): Its runs of one dtype each, in buffer order.
"""


class FlatLayout(object):
    """Where each parameter lies in a flat buffer of bytes.

    Args:
        specs (sequence): ``(name, shape, dtype)`` per parameter, in buffer
            order.
    """

    def __init__(self, specs):
        self.names = tuple(name for name, _, _ in specs)
        self.entries = collections.OrderedDict()
        offset = 0
        previous = None
        for name, shape, dtype in specs:
            dtype = numpy.dtype(dtype)
            if dtype != previous:
                offset = -(-offset // _RUN_ALIGN) * _RUN_ALIGN
                previous = dtype
            n_bytes = math.prod(shape) * dtype.itemsize
            self.entries[name] = (offset, tuple(shape), dtype)
            offset += n_bytes
        self.nbytes = offset
        # The most bytes any order of the same parameters needs.
        self.capacity = sum(math.prod(shape) * numpy.dtype(dtype).itemsize
                            for _, shape, dtype in specs) + \
            _RUN_ALIGN * (len(specs) + 1)
        self._position = {name: i for i, name in enumerate(self.names)}
        self._spans = {}

    @classmethod
    def of_arrays(cls, arrays):
        """The layout of a mapping of name -> array (anything with
        ``shape`` and ``dtype``), in its order."""
        return cls([(name, a.shape, a.dtype) for name, a in arrays.items()])

    def reordered(self, names):
        """The same parameters laid out in the order of ``names``."""
        if sorted(names) != sorted(self.names):
            raise ValueError('a new order must name each parameter of the '
                             'layout once')
        return FlatLayout([(name,) + self.entries[name][1:]
                           for name in names])

    def __eq__(self, other):
        return isinstance(other, FlatLayout) and \
            self.entries == other.entries

    def __ne__(self, other):
        return not self == other

    def __getstate__(self):
        return {'specs': [(name, shape, dtype.str) for name, (_, shape, dtype)
                          in self.entries.items()]}

    def __setstate__(self, state):
        self.__init__(state['specs'])

    def views(self, buffer, names=None):
        """Each parameter's array in ``buffer``.

        Args:
            buffer: A flat ``uint8`` array (NumPy or CuPy) of at least
                :attr:`nbytes` bytes.
            names (iterable or None): The parameters to view (default: all).

        Returns:
            collections.OrderedDict: Name -> a view of its shape and dtype.
        """
        views = collections.OrderedDict()
        for name in self.names if names is None else names:
            offset, shape, dtype = self.entries[name]
            n_bytes = math.prod(shape) * dtype.itemsize
            views[name] = buffer[offset:offset + n_bytes].view(
                dtype).reshape(shape)
        return views

    def contiguous(self, names):
        """Whether ``names`` lie next to each other in this layout (in any
        order among themselves)."""
        positions = sorted(self._position[name] for name in names)
        return bool(positions) and positions[-1] - positions[0] + 1 == \
            len(positions)

    def span(self, names):
        """The slice of the buffer that ``names`` (a chunk) occupy.

        Raises:
            ValueError: They do not lie next to each other.
        """
        key = tuple(names)
        span = self._spans.get(key)
        if span is not None:
            return span
        if not self.contiguous(key):
            raise ValueError('the parameters of a chunk must lie next to '
                             'each other in the flat layout')
        ordered = sorted(key, key=self._position.__getitem__)
        runs, run = [], []
        for name in ordered:
            if run and self.entries[run[-1]][2] != self.entries[name][2]:
                runs.append(self._run(run))
                run = []
            run.append(name)
        runs.append(self._run(run))
        span = Span(runs[0].start, runs[-1].stop, tuple(runs))
        self._spans[key] = span
        return span

    def run_of(self, names):
        """The :class:`Run` of parameters of one dtype that lie next to each
        other, given in buffer order."""
        return self._run(tuple(names))

    def _run(self, names):
        first, (_, last_shape, dtype) = self.entries[names[0]][0], \
            self.entries[names[-1]]
        stop = self.entries[names[-1]][0] + \
            math.prod(last_shape) * dtype.itemsize
        return Run(dtype, first, stop, tuple(names))


def place(layout, buffer, values):
    """Writes ``values`` (name -> array) to their places of ``layout`` in
    ``buffer``; returns the views, name -> array, as
    :meth:`FlatLayout.views` does."""
    views = layout.views(buffer)
    for name, value in values.items():
        views[name][...] = value
    return views


def typed(buffer, run):
    """A run of a flat buffer as a 1-D array of the run's dtype."""
    return buffer[run.start:run.stop].view(run.dtype)


def host_buffer(n_bytes, allocate=None):
    """A flat host buffer of ``n_bytes`` (zeros), aligned to a cache line.

    Args:
        n_bytes (int): Its size.
        allocate (callable or None): ``allocate(n_bytes)`` returns a
            ``uint8`` array (pinned memory, say); default: NumPy's.
    """
    if allocate is not None:
        buffer = allocate(n_bytes + _RUN_ALIGN)
        buffer[...] = 0
    else:
        buffer = numpy.zeros(n_bytes + _RUN_ALIGN, numpy.uint8)
    skip = -buffer.ctypes.data % _RUN_ALIGN
    return buffer[skip:skip + n_bytes]


class FlatMaster(object):
    """The master's parameter arrays as views of one flat host buffer.

    Update rules that rebind a parameter's array instead of writing in place
    are followed by :meth:`sync`, which copies the new values back into the
    buffer, so replicas always read the current weights; so is user code
    that replaced an array between iterations.

    Args:
        master_params (dict): Parameter path -> master parameter, in the
            order of ``layout``.
        layout (FlatLayout): Where each lies.
        buffer (numpy.ndarray): Flat ``uint8`` host memory (shared, pinned
            or private) of at least ``layout.capacity`` bytes.
    """

    def __init__(self, master_params, layout, buffer, write=True):
        if buffer.size < layout.capacity:
            raise ValueError('the flat buffer holds {} bytes; the layout '
                             'needs {}'.format(buffer.size, layout.capacity))
        self.master_params = master_params
        self.buffer = buffer
        if write:
            self._place(layout, {name: param.array
                                 for name, param in master_params.items()})
        else:
            self._view(layout)

    @classmethod
    def attached(cls, master_params, layout, buffer):
        """The parameters as views of a buffer that another process
        filled (the ranks of one node share one): nothing is written."""
        return cls(master_params, layout, buffer, write=False)

    def _view(self, layout):
        self.layout = layout
        self.arrays = layout.views(self.buffer)
        for name, param in self.master_params.items():
            param.array = self.arrays[name]

    def _place(self, layout, values):
        self.layout = layout
        self.arrays = place(layout, self.buffer, values)
        for name, param in self.master_params.items():
            param.array = self.arrays[name]

    def replaced(self, names):
        """The parameters of ``names`` whose arrays are no longer the
        buffer's views (user code assigned ``param.array``)."""
        return [name for name in names
                if self.master_params[name].array is not self.arrays[name]]

    def sync(self, names):
        """Copies into the buffer the parameters of ``names`` whose arrays
        were replaced, and makes them views again."""
        for name in self.replaced(names):
            param = self.master_params[name]
            shared = self.arrays[name]
            shared[...] = param.array
            param.array = shared

    def relayout(self, layout):
        """Moves every parameter to its place in ``layout``, in the same
        buffer (nothing may read the buffer meanwhile)."""
        self._place(layout, {name: param.array.copy()
                             for name, param in self.master_params.items()})

    def release(self):
        """Gives the master private copies of its arrays again (before the
        buffer is freed: the user keeps the trained model)."""
        for name, param in self.master_params.items():
            if param.array is self.arrays.get(name):
                param.array = param.array.copy()
            if param.grad is not None and param.grad.base is not None:
                # A flat buffer's view lent as the gradient.
                param.grad = param.grad.copy()
        self.arrays = {}
        self.buffer = None


class FlatState(object):
    """The fused update rules' state arrays as views of flat buffers, one
    per state key (``'v'``, ``'m'``, ...), laid out as the parameters.

    Chainer's update rules, serializers and snapshots keep working on each
    rule's ``state`` dict, whose arrays are the views.

    Args:
        layout (FlatLayout): The parameters' layout.
        allocate (callable or None): ``allocate(key)`` returns the flat
            buffer of a state key (shared memory, say); default: a private
            :func:`host_buffer`.
    """

    def __init__(self, layout, allocate=None):
        self.layout = layout
        self._allocate = allocate or (
            lambda key: host_buffer(self.layout.capacity))
        self._buffers = {}
        self._views = {}
        # Per state key, the names whose rule's state holds the view.
        self._bound = {}
        self._lock = threading.Lock()

    def bind(self, name, rule, keys, copy=True):
        """Makes ``rule.state[key]`` a view of the flat buffer of ``key``
        for each of ``keys`` (copying the values in where it is not, unless
        ``copy`` is False: another process wrote them)."""
        state = rule.state
        for key in keys:
            views = self._views_of(key)
            view = views[name]
            if state[key] is not view:
                if copy:
                    view[...] = state[key]
                state[key] = view
            self._bound[key][name] = rule

    def _views_of(self, key):
        # Host threads form chunks' runs at once: one buffer per key.
        with self._lock:
            views = self._views.get(key)
            if views is None:
                self._buffers[key] = self._allocate(key)
                views = self._views[key] = self.layout.views(
                    self._buffers[key])
                self._bound[key] = {}
            return views

    def release(self):
        """Gives every bound rule private copies of its state arrays
        again (before the buffers are freed: the optimizer keeps its
        state)."""
        for key, bound in self._bound.items():
            views = self._views[key]
            for name, rule in bound.items():
                state = rule.state
                if state is not None and state.get(key) is views[name]:
                    state[key] = state[key].copy()
        self._buffers, self._views, self._bound = {}, {}, {}

    def typed(self, key, run):
        """The flat buffer of ``key`` over ``run``."""
        return typed(self._buffers[key], run)

    def relayout(self, layout):
        """Moves every bound state array to its place in ``layout``."""
        for key, bound in self._bound.items():
            bound = {name: rule for name, rule in bound.items()
                     if rule.state is not None and key in rule.state}
            self._bound[key] = bound
            views = self._views[key] = place(
                layout, self._buffers[key],
                {name: rule.state[key].copy() for name, rule in bound.items()})
            for name, rule in bound.items():
                rule.state[key] = views[name]
        self.layout = layout


def layer_order(plan):
    """The order of parameters that makes every chunk of ``plan``, and of
    any plan cut from the same sequence of layers, a slice: that sequence
    reversed (the input side first, as the runtime counts chunks)."""
    return [name for chunk in plan.chunks for name in chunk][::-1]
