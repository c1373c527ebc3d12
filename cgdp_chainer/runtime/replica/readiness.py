"""Per-parameter gradient readiness during one ordinary backward pass.

Chainer 7.8.1 sets a leaf's gradient only at the very end of
``Variable.backward()`` (``chainer/_backprop.py``, ``_backprop_to_all``), so
no public hook sees a parameter's gradient while the backward runs. This
module runs the same traversal (on Chainer's own ``_backprop_utils``:
``GradTable`` and ``backprop_step``, visited in the same rank order) and
hands a parameter over the moment the backward of its last consumer (a
function node taking it as an input) has run. Chainer is pinned at its last
release, so depending on these internals is safe; ``tests/test_readiness.py``
checks them so that a change would be caught.

On top of the ready order:

- :class:`ChunkPlan` groups consecutive layers (links that own parameters)
  in backward order into chunks, by count, by bytes or by explicit
  boundaries, from the first iteration's ready order;
  :class:`ChunkReadiness` reports each chunk when its last parameter is
  ready.
- :class:`ChunkWaitHook` makes the next forward of a layer wait only for its
  own chunk's new weights; :class:`ParameterUses` finds, in the first
  forward, parameters used outside their own link, for the hook to cover.
- The traversal's own checks refuse what a per-parameter hand-over cannot
  support (``F.forget``, a gradient set behind the traversal). Loss
  scaling works as in ``loss.backward(loss_scale=...)``. A loss whose graph
  holds the graph of an earlier backward (``chainer.grad(...,
  enable_double_backprop=True)``, a gradient penalty) is an ordinary graph
  to the traversal and works.
- :func:`initialize_from_first_batch` initializes lazy parameters exactly as
  ``StandardUpdater`` would.
"""
import collections
import hashlib
import heapq
import json
import warnings

import chainer
from chainer import _backprop_utils
from chainer import backend
from chainer.functions.util import forget as forget_module
import chainerx


BackwardReport = collections.namedtuple('BackwardReport', ['order', 'unused'])
BackwardReport.__doc__ = """What one readiness backward saw.

Attributes:
    order (tuple of str): Every parameter name once, in the order
        ``on_ready`` was called (the unused ones first).
    unused (tuple of str): The names of parameters that were not in this
        iteration's graph, in the order of the model's parameters.
"""


def owner_of(name):
    """The path of the link that directly owns a parameter.

    Args:
        name (str): A parameter path as ``Link.namedparams()`` gives it,
            e.g. ``'/predictor/l1/W'``.

    Returns:
        str: The owning link's path as ``Link.namedlinks()`` gives it,
        e.g. ``'/predictor/l1'``; ``'/'`` for a parameter registered on the
        root link itself.
    """
    owner = name.rsplit('/', 1)[0]
    return owner or '/'


def count_layers(link):
    """The layers of a model as chunks count them: the links that directly
    own parameters (:func:`owner_of`), so the largest integer chunk size.

    Args:
        link (chainer.Link): The model.
    """
    return len({owner_of(name) for name, _ in link.namedparams()})


class UnsupportedGraphError(RuntimeError):
    """The graph holds something a per-parameter hand-over cannot support."""


class ReadinessBackward(object):

    """``loss.backward()`` that reports each parameter as soon as it is final.

    Built once per replica from its named parameters; :meth:`backward` then
    runs once per iteration.

    Args:
        named_params (iterable of (str, chainer.Parameter)): The parameters
            to watch, e.g. ``replica.namedparams()``. A Parameter reachable
            under two names (assigned to two links) is reported under both.

    Raises:
        ValueError: A name is repeated or an item is not a
            ``(str, chainer.Variable)`` pair.
    """

    def __init__(self, named_params):
        params = []
        seen = set()
        for item in named_params:
            if (not isinstance(item, tuple) or len(item) != 2
                    or not isinstance(item[0], str)
                    or not isinstance(item[1], chainer.Variable)):
                raise ValueError(
                    'named_params must yield (name, chainer.Parameter) '
                    'pairs, as Link.namedparams() does; got {!r}'.format(
                        item))
            if item[0] in seen:
                raise ValueError(
                    'named_params repeats the name {!r}; each parameter '
                    'name must be unique'.format(item[0]))
            seen.add(item[0])
            params.append(item)
        self._params = tuple(params)

    @property
    def names(self):
        """tuple of str: The watched parameter names, in the given order."""
        return tuple(name for name, _ in self._params)

    def backward(self, loss, on_ready, retain_grad=False, loss_scale=None):
        """``loss.backward(retain_grad, loss_scale)``, reporting each
        parameter once ready.

        Sets exactly the gradients ``loss.backward()`` sets, in the same
        order of accumulation (so bitwise the same), accumulating into a
        gradient a parameter already has, and freeing intermediate gradients
        unless ``retain_grad``. Function hooks run as in ``backward()``.

        Args:
            loss (chainer.Variable): The variable to backpropagate from; a
                scalar whose ``grad`` is ``None`` starts from 1, as in
                ``Variable.backward``.
            on_ready (callable): ``on_ready(name, used)``, called once per
                watched parameter. First, before any backward computation,
                for every parameter not in this graph, with ``used=False``
                (its gradient is whatever it held before: ``None`` after
                ``cleargrads()``); then, with ``used=True``, as soon as the
                backward of the parameter's last consumer has run, when
                ``param.grad_var`` holds its final gradient. Runs in the
                calling thread; an exception from it stops the backward
                and propagates.
            retain_grad (bool): As in ``Variable.backward``.
            loss_scale (float or None): As in ``Variable.backward``: it
                multiplies a gradient started from ones; each leaf given a
                gradient records it (``_loss_scale``, for the update rule).

        Returns:
            BackwardReport: The ready order and the unused names.

        Raises:
            UnsupportedGraphError: The graph holds ``F.forget``, a
                function's backward runs a backward of its own that reaches
                a watched parameter, or anything else gives a parameter a
                gradient during the backward. (A parameter outside the
                graph, cut by ``unchain_backward()`` say, is unused.)
            ValueError: ``loss`` is not a Variable, holds a ChainerX array,
                or ``on_ready`` is not callable.
        """
        _check_backward_arguments(loss, on_ready)
        names_of = {}
        for name, param in self._params:
            names_of.setdefault(param.node, []).append(name)
        params_of = {name: param for name, param in self._params}
        # Counting first refuses an unsupported graph before any work.
        consumers = _count_consumers(loss.node, names_of)

        loss_scale = _start_gradient(loss, loss_scale)
        root = loss.node
        root_grad = loss.grad_var
        loss.grad_var = None

        order = []
        # Reported first: their chunks may leave (and their param.grad be
        # given the host's arrays) while the traversal runs, which never
        # touches them again.
        unused = tuple(name for name, param in self._params
                       if param.node not in consumers)
        for name in unused:
            order.append(name)
            on_ready(name, False)

        def ready(node, grad):
            # One node may be listed under several names (a Parameter
            # assigned to two links): one object, set once.
            name = names_of[node][0]
            param = params_of[name]
            if param.grad_var is not None:
                raise UnsupportedGraphError(_outside_message(name))
            param.grad_var = grad
            param._loss_scale = loss_scale
            for name in names_of[node]:
                order.append(name)
                on_ready(name, True)

        with chainer.using_config('enable_backprop', False):
            _traverse(root, root_grad, retain_grad, consumers, ready,
                      loss_scale, names_of)
        return BackwardReport(tuple(order), unused)


def _check_backward_arguments(loss, on_ready):
    if not isinstance(loss, chainer.Variable):
        raise ValueError('loss must be a chainer.Variable, not {}'.format(
            type(loss).__name__))
    if not callable(on_ready):
        raise ValueError('on_ready must be callable as on_ready(name, used)')
    if loss.xp is chainerx:
        raise ValueError(
            'loss holds a ChainerX array; the readiness backward supports '
            'NumPy and CuPy arrays only')


def _outside_message(name):
    return (
        'parameter {} was given a gradient during the backward by something '
        'other than the functions of the loss\'s graph (a function hook or '
        'a function\'s backward that writes param.grad); the readiness '
        'backward cannot tell when it is final: leave param.grad to the '
        'backward'.format(name))


def _start_gradient(loss, loss_scale=None):
    """As Variable.backward: a one-element loss without a gradient starts
    from ones, times the loss scale; returns the scale as a float (or
    None)."""
    if loss_scale:
        loss_scale = float(loss_scale)
    if loss.array.size == 1 and loss.grad_var is None:
        if loss.array.ndim != 0:
            warnings.warn(
                'Treating a variable with only one element as a scalar in '
                'the readiness backward is deprecated, as in '
                'Variable.backward; apply chainer.functions.squeeze.',
                DeprecationWarning)
        with chainer.using_device(loss.device):
            loss.grad = loss.device.xp.ones_like(loss.array)
        if loss_scale is not None:
            loss.grad *= loss_scale
    return loss_scale


def _count_consumers(root, names_of):
    """Counts, per watched parameter node, the function nodes taking it.

    Only the inputs that require a gradient are followed, as the backward
    follows only those.

    Returns:
        dict: Parameter node to the number of distinct consuming functions.
    """
    counts = {}
    if root.creator_node is None:
        return counts
    seen = {root.creator_node}
    stack = [root.creator_node]
    while stack:
        func = stack.pop()
        if isinstance(func, forget_module.Forget):
            raise UnsupportedGraphError(
                'the graph holds F.forget ({}): its backward recomputes the '
                'forward and runs a backward of its own, which sets the '
                'gradients of the parameters inside it behind the readiness '
                'traversal; call the function without F.forget'.format(
                    func.label))
        for x in dict.fromkeys(func.inputs):
            if not x.requires_grad:
                continue
            creator = x.creator_node
            if creator is None:
                if x in names_of:
                    counts[x] = counts.get(x, 0) + 1
            elif creator not in seen:
                seen.add(creator)
                stack.append(creator)
    return counts


def _traverse(root, root_grad, retain_grad, consumers, ready,
              loss_scale=None, names_of=None):
    """Chainer 7.8.1's ``_backprop_to_all`` for one output, handing each
    watched leaf to ``ready(node, grad)`` after its last consumer.

    The visiting order, the gradient table and each step are Chainer's, so
    every gradient is accumulated in the same order as in
    ``loss.backward()``. A backward run inside a function's backward that
    reaches a watched parameter (``names_of``: node to names) is refused
    where it starts.
    """
    traversal = _Traversal(retain_grad, consumers, ready, loss_scale)
    with _NestedBackwardWatch(traversal, names_of or {}):
        traversal.run(root, root_grad)


class _NestedBackwardWatch(chainer.FunctionHook):
    """Refuses a backward that a function's backward runs of its own and
    that reaches a watched parameter.

    Registered in the traversing thread after the traversal took its
    hooks, so only a backward started inside a step (Chainer's
    ``Variable.backward`` or ``chainer.grad`` call the thread's hooks)
    calls it. Such a backward would set the parameter's gradient behind
    the traversal: after its chunk may have left (the parameter is not in
    the outer graph), or before its last consumer ran.
    """

    name = 'CGDPNestedBackwardWatch'

    def __init__(self, traversal, names_of):
        self._traversal = traversal
        self._names_of = names_of

    def backward_preprocess(self, function, in_data, out_grad):
        for x in function.inputs:
            names = self._names_of.get(x)
            if names and x.requires_grad:
                outer = self._traversal.current
                raise UnsupportedGraphError(
                    'the backward of {} runs a backward of its own (through '
                    '{}) that gives parameter {} a gradient behind the '
                    'readiness traversal, which then cannot tell when it is '
                    'final; compute that parameter\'s use in the forward, '
                    'in the loss\'s graph'.format(
                        'a function' if outer is None else outer.label,
                        function.label, names[0]))


class _Traversal(object):
    """The state of one :func:`_traverse`: candidate functions by rank, the
    gradient table, and the consumers each watched leaf still waits for."""

    def __init__(self, retain_grad, consumers, ready, loss_scale=None):
        self.retain_grad = retain_grad
        self.loss_scale = loss_scale
        self.remaining = dict(consumers)
        self.ready = ready
        self.cand_funcs = []
        self.seen_set = set()
        self.grads = _backprop_utils.GradTable(accumulate_grad_inputs=True)
        self.leaf_nodes = set()
        self.is_debug = chainer.is_debug()
        # A copy: the nested backward's watch registers itself after this.
        self.base_hooks = tuple(chainer.get_function_hooks().values())
        # The function whose backward step runs (for the watch's message).
        self.current = None

    def add_cand(self, cand):
        if cand not in self.seen_set:
            # Negated rank: heapq is a min-heap and the deepest goes first.
            heapq.heappush(self.cand_funcs,
                           (-cand.rank, len(self.seen_set), cand))
            self.seen_set.add(cand)

    def run(self, root, root_grad):
        self.grads.accumulate(root, root_grad)
        if root.creator_node is None:
            self.leaf_nodes.add(root)
        else:
            self.add_cand(root.creator_node)
        while self.cand_funcs:
            _, _, func = heapq.heappop(self.cand_funcs)
            in_grad = self._backprop(func)
            if in_grad is not None:
                self._follow(func, in_grad)
        self._finish()

    def _hooks(self, func):
        local_hooks = func.local_function_hooks
        if not local_hooks:
            return self.base_hooks
        hooks = collections.OrderedDict(chainer.get_function_hooks())
        hooks.pop(_NestedBackwardWatch.name, None)
        hooks.update(local_hooks)
        return hooks.values()

    def _backprop(self, func):
        """One function's backward step, with the function hooks; returns
        its inputs' gradients (None if no input needs one)."""
        inputs = func.inputs
        target_input_indexes = tuple([
            i for i, x in enumerate(inputs) if x.requires_grad])
        outputs = [y() for y in func.outputs]  # weak references
        out_grad = tuple([
            self.grads.pop(y) if y is not None and y.creator_node is not None
            else None for y in outputs])
        if not target_input_indexes:
            return None
        self.current = func

        in_data = [x.data for x in inputs]
        out_grad_array = [None if g is None else g.raw_array
                          for g in out_grad]
        hooks = self._hooks(func)
        with chainer.using_device(
                backend.get_device_from_array(*(in_data + out_grad_array))):
            for hook in hooks:
                hook.backward_preprocess(
                    func, tuple(in_data), tuple(out_grad_array))

            # An ordered dict, as Chainer keeps it, for the same order of
            # accumulation.
            in_grad = collections.OrderedDict()
            for i in target_input_indexes:
                x = inputs[i]
                if x not in in_grad:
                    in_grad[x] = self.grads.get_as_list(x)

            _backprop_utils.backprop_step(
                func, target_input_indexes, out_grad, in_grad, self.is_debug)

            for hook in hooks:
                hook.backward_postprocess(
                    func, tuple(in_data), tuple(out_grad_array))

        if self.retain_grad:
            for y, gy in zip(outputs, out_grad):
                if y is not None:
                    y._set_grad_var_if_available(gy)
        return in_grad

    def _follow(self, func, in_grad):
        """Queues the inputs' creators and hands over every watched leaf
        whose last consumer this was."""
        finished = []
        for x, gx in in_grad.items():
            if x in self.remaining:
                self.remaining[x] -= 1
                if self.remaining[x] == 0:
                    finished.append(x)
            if not gx:
                continue
            for gx_elem in gx:
                if gx_elem is not None:
                    chainer.variable._check_grad_type(
                        func, x, True, gx_elem.raw_array)
            if x.creator_node is None:
                if x not in self.remaining:
                    self.leaf_nodes.add(x)
            else:
                self.add_cand(x.creator_node)
        del gx, in_grad

        for x in finished:
            del self.remaining[x]
            self.ready(x, self.grads.pop(x))

    def _finish(self):
        for x in self.leaf_nodes:
            x_var = x.get_variable_or_none()
            gx = self.grads.pop(x)
            if x_var is not None:
                x_var.grad_var = gx
                x_var._loss_scale = self.loss_scale
        # Watched parameters whose consumers were never visited (a gradient
        # of None cut their branch off) are final now, as in
        # loss.backward().
        for x in list(self.remaining):
            self.ready(x, self.grads.pop(x))
        self.grads.assert_no_grads()


class ChunkPlan(object):

    """Chunks of consecutive layers in backward order, fixed after the first
    iteration.

    A layer is a link that directly owns parameters (a parameter registered
    on a Chain makes that Chain a layer). Layers are ordered by when their
    last parameter became ready; layers entirely unused in the first
    iteration go last (the input side), so that using them later never
    delays an earlier chunk. A chunk is complete when all its parameters are
    ready.

    Build with :meth:`from_ready_order`.

    Args:
        layers (sequence of sequence of (str, sequence of str)): Per chunk,
            in backward order, its layers as ``(layer path, parameter
            names)``.

    Attributes:
        chunks (tuple of tuple of str): Per chunk, its parameter names.
        layers (tuple of tuple of str): Per chunk, its layer paths.
        n_chunks (int): The number of chunks.
        chunk_of (dict): Parameter name to chunk index.
        chunk_of_layer (dict): Layer path to chunk index.
        fingerprint (str): A compact description to compare between
            replicas and MPI ranks: equal fingerprints mean equal plans.
    """

    def __init__(self, layers):
        self._layers = tuple(
            tuple((path, tuple(names)) for path, names in chunk)
            for chunk in layers)
        if not self._layers or not all(self._layers):
            raise ValueError('a chunk plan needs at least one chunk and no '
                             'empty chunk')
        self.chunks = tuple(
            tuple(name for _, names in chunk for name in names)
            for chunk in self._layers)
        self.layers = tuple(
            tuple(path for path, _ in chunk) for chunk in self._layers)
        self.n_chunks = len(self.chunks)
        self.chunk_of = {name: i for i, chunk in enumerate(self.chunks)
                         for name in chunk}
        self.chunk_of_layer = {path: i for i, chunk in enumerate(self.layers)
                               for path in chunk}
        digest = hashlib.sha256(json.dumps(
            [[[path, list(names)] for path, names in chunk]
             for chunk in self._layers]).encode('utf-8')).hexdigest()
        self.fingerprint = '{} chunks of {} layers, sha256 {}'.format(
            self.n_chunks, _runs([len(c) for c in self.layers]),
            digest[:16])

    def __eq__(self, other):
        return isinstance(other, ChunkPlan) and self._layers == other._layers

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self._layers)

    def __repr__(self):
        return '<ChunkPlan {}>'.format(self.fingerprint)

    @classmethod
    def from_ready_order(cls, order, unused=(), chunk_size=None,
                         chunk_bytes=None, boundaries=None, nbytes=None):
        """Forms chunks from one iteration's ready order.

        Give exactly one of ``chunk_size``, ``chunk_bytes`` and
        ``boundaries``.

        Args:
            order (sequence of str): Every parameter name once, in ready
                order (:attr:`BackwardReport.order`).
            unused (sequence of str): The names unused in that iteration
                (:attr:`BackwardReport.unused`).
            chunk_size (int): Layers per chunk, counted from the output end;
                a shorter remainder is the last (input-side) chunk.
            chunk_bytes (int): DDP-like buckets: consecutive layers are
                added to a chunk until its parameters hold at least this
                many bytes.
            boundaries (sequence of int): Layer indices, in backward order,
                at which a new chunk starts (strictly increasing, each in
                ``1 .. n_layers - 1``).
            nbytes (dict): Parameter name to its size in bytes; needed with
                ``chunk_bytes`` (see :func:`parameter_nbytes`).

        Returns:
            ChunkPlan: The plan.

        Raises:
            ValueError: None or several of the options, a value out of
                range, a name repeated in ``order``, an unused name missing
                from it, or ``nbytes`` missing a name.
        """
        order = tuple(order)
        _check_ready_order(order, unused)
        given = [n for n, v in (('chunk_size', chunk_size),
                                ('chunk_bytes', chunk_bytes),
                                ('boundaries', boundaries)) if v is not None]
        if len(given) != 1:
            raise ValueError(
                'give exactly one of chunk_size (layers per chunk), '
                'chunk_bytes (bytes per chunk) or boundaries (layer indices); '
                'got {}'.format(', '.join(given) or 'none'))

        layers = _layers_in_backward_order(order, set(unused))
        n_layers = len(layers)
        if chunk_size is not None:
            starts = _starts_by_size(n_layers, chunk_size)
        elif chunk_bytes is not None:
            starts = _starts_by_bytes(layers, order, chunk_bytes, nbytes)
        else:
            starts = _starts_at_boundaries(n_layers, boundaries)
        ends = starts[1:] + [n_layers]
        return cls([layers[a:b] for a, b in zip(starts, ends)])

    def check_same(self, fingerprints, what='replica'):
        """Checks that every replica or rank formed this plan.

        Args:
            fingerprints (sequence of str): :attr:`fingerprint` of each
                replica or rank, e.g. from ``comm.allgather``.
            what (str): What each entry is, for the message.

        Raises:
            RuntimeError: Some fingerprint differs from this plan's.
        """
        differing = [i for i, f in enumerate(fingerprints)
                     if f != self.fingerprint]
        if differing:
            raise RuntimeError(
                'the chunk plans differ: {} {} formed {!r}, this one {!r}; '
                'every {} must see the same first-iteration graph'.format(
                    what, differing[0], fingerprints[differing[0]],
                    self.fingerprint, what))


def _check_ready_order(order, unused):
    if len(set(order)) != len(order):
        raise ValueError('order must name every parameter once')
    if not order:
        raise ValueError('order is empty: the model has no parameters')
    missing = set(unused).difference(order)
    if missing:
        raise ValueError('unused names not in order: {}'.format(
            ', '.join(sorted(missing))))


def _starts_by_size(n_layers, chunk_size):
    """First layer of each chunk of ``chunk_size`` layers."""
    if (isinstance(chunk_size, bool)
            or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError('chunk_size must be a positive int (layers '
                         'per chunk), not {!r}'.format(chunk_size))
    return list(range(0, n_layers, chunk_size))


def _starts_by_bytes(layers, order, chunk_bytes, nbytes):
    """First layer of each chunk that fills to at least ``chunk_bytes``."""
    if (isinstance(chunk_bytes, bool)
            or not isinstance(chunk_bytes, int) or chunk_bytes < 1):
        raise ValueError('chunk_bytes must be a positive int, not '
                         '{!r}'.format(chunk_bytes))
    if nbytes is None:
        raise ValueError('chunk_bytes needs nbytes, a mapping of '
                         'parameter name to bytes')
    lacking = [n for n in order if n not in nbytes]
    if lacking:
        raise ValueError('nbytes lacks {}'.format(', '.join(lacking)))
    starts = [0]
    filled = 0
    for i, (_, names) in enumerate(layers):
        if filled >= chunk_bytes:
            starts.append(i)
            filled = 0
        filled += sum(nbytes[n] for n in names)
    return starts


def _starts_at_boundaries(n_layers, boundaries):
    """Chunk 0 at layer 0, then one chunk at each boundary."""
    starts = [0] + list(boundaries)
    if any(isinstance(b, bool) or not isinstance(b, int)
           for b in starts) or any(
               b <= a for a, b in zip(starts, starts[1:])) or (
                   starts[-1] >= n_layers):
        raise ValueError(
            'boundaries must be strictly increasing layer indices in '
            '1 .. {} (the model has {} layers), not {!r}'.format(
                n_layers - 1, n_layers, list(boundaries)))
    return starts


class ChunkReadiness(object):

    """Turns parameter readiness into chunk readiness.

    Pass it as ``on_ready`` to :meth:`ReadinessBackward.backward`; it calls
    ``on_chunk_ready(chunk_index)`` as soon as every parameter of that chunk
    is ready, once per chunk per backward. Call :meth:`start` before each
    backward.

    Args:
        plan (ChunkPlan): The chunks.
        on_chunk_ready (callable): ``on_chunk_ready(chunk_index)``.

    Raises:
        ValueError: ``on_chunk_ready`` is not callable.
    """

    def __init__(self, plan, on_chunk_ready):
        if not callable(on_chunk_ready):
            raise ValueError('on_chunk_ready must be callable as '
                             'on_chunk_ready(chunk_index)')
        self._plan = plan
        self._on_chunk_ready = on_chunk_ready
        self._left = None

    def start(self):
        """Begins a backward: every chunk waits for all its parameters."""
        self._left = [len(chunk) for chunk in self._plan.chunks]

    def __call__(self, name, used):
        if self._left is None:
            raise RuntimeError('ChunkReadiness.start() must be called before '
                               'each backward')
        chunk = self._plan.chunk_of.get(name)
        if chunk is None:
            raise ValueError('parameter {} is not in the chunk plan ({}); '
                             'the plan must come from the same model'.format(
                                 name, self._plan.fingerprint))
        self._left[chunk] -= 1
        if self._left[chunk] == 0:
            self._on_chunk_ready(chunk)

    @property
    def complete(self):
        """bool: Whether every chunk of this backward has been reported."""
        return self._left is not None and not any(self._left)


def _runs(counts):
    # '10x3+1' for [10, 10, 10, 1]: short even for hundreds of chunks.
    parts = []
    for count in counts:
        if parts and parts[-1][0] == count:
            parts[-1][1] += 1
        else:
            parts.append([count, 1])
    return '+'.join(str(c) if n == 1 else '{}x{}'.format(c, n)
                    for c, n in parts)


def _layers_in_backward_order(order, unused):
    position = {}
    members = collections.OrderedDict()
    for i, name in enumerate(order):
        owner = owner_of(name)
        members.setdefault(owner, []).append(name)
        if name not in unused:
            position[owner] = i
    used = sorted((p for p in members if p in position),
                  key=lambda p: position[p])
    idle = [p for p in members if p not in position]
    return [(p, tuple(members[p])) for p in used + idle]


def parameter_nbytes(named_params):
    """Bytes of each parameter, for :meth:`ChunkPlan.from_ready_order`.

    Args:
        named_params (iterable of (str, chainer.Parameter)): E.g.
            ``model.namedparams()``.

    Returns:
        dict: Name to ``param.array.nbytes``.

    Raises:
        ValueError: A parameter is not initialized yet.
    """
    sizes = {}
    for name, param in named_params:
        if param.array is None:
            raise ValueError('parameter {} is not initialized; its size is '
                             'unknown'.format(name))
        sizes[name] = param.array.nbytes
    return sizes


class ParameterUses(object):

    """Finds, during one forward, parameters used outside their own link.

    :class:`ChunkWaitHook` waits for a parameter's chunk when the link that
    owns it is called. A parameter used before its owner has been called in
    the forward (``F.linear(h, self.embed.W)`` in a parent's ``forward``,
    ``self.l.forward(x)`` instead of ``self.l(x)``, or a weight tied by
    reference into another link) would escape that wait; this records, for
    each such parameter, the innermost link being called at its first such
    use, so that the hook waits there too.

    Use it around the first iteration's forward, in the thread running it
    (it registers a link hook and a function hook for that thread)::

        with ParameterUses(model) as uses:
            loss = model(*in_arrays)
        hook = ChunkWaitHook(model, plan, wait, uses=uses)

    Parameters are recognized by their arrays, which must stay in place
    during that forward (nothing publishes weights in the first iteration).
    A lazy parameter (array ``None`` on entry) is not watched: its first use
    is its own link's call, which initializes it.

    Args:
        model (chainer.Link): The model whose forward is watched; parameter
            names are relative to it, as in ``model.namedparams()``.

    Attributes:
        outside (dict): Parameter name to the path of the link being called
            at its first use before its owner was called, or ``None`` if no
            link of ``model`` was being called then.
    """

    def __init__(self, model):
        self._model = model
        self._path_of = {link: path for path, link in model.namedlinks()}
        self._by_array = {}
        self._entered = set()
        self._stack = []
        self.outside = {}
        self._link_hook = _CallTracker(self)
        self._function_hook = _UseTracker(self)

    def __enter__(self):
        self._by_array = {
            id(param.array): (name, owner_of(name))
            for name, param in self._model.namedparams()
            if param.array is not None}
        self._entered = set()
        self._stack = []
        self._link_hook.__enter__()
        self._function_hook.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._function_hook.__exit__(*exc_info)
        self._link_hook.__exit__(*exc_info)
        self._by_array = {}

    def _called(self, link):
        path = self._path_of.get(link)
        self._stack.append(path)
        if path is not None:
            self._entered.add(path)

    def _returned(self, link):
        self._stack.pop()

    def _used(self, in_data):
        for array in in_data:
            hit = self._by_array.get(id(array))
            if hit is None:
                continue
            name, owner = hit
            if owner not in self._entered and name not in self.outside:
                active = [p for p in self._stack if p is not None]
                self.outside[name] = active[-1] if active else None


class _CallTracker(chainer.LinkHook):

    name = 'ParameterUsesCalls'

    def __init__(self, uses):
        self._uses = uses

    def forward_preprocess(self, args):
        self._uses._called(args.link)

    def forward_postprocess(self, args):
        self._uses._returned(args.link)


class _UseTracker(chainer.FunctionHook):

    name = 'ParameterUsesFunctions'

    def __init__(self, uses):
        self._uses = uses

    def forward_preprocess(self, function, in_data):
        self._uses._used(in_data)


class ChunkWaitHook(chainer.LinkHook):

    """Makes a layer's forward wait for its own chunk's new weights.

    Fires before every call of a link that directly owns parameters (a link
    called twice, as with tied weights, waits each time, which returns at
    once the second time); Chains without parameters of their own and links
    without parameters never wait. A Chain's own parameters are waited for
    when the Chain is called.

    Use it either registered on the waiting links (:meth:`install`, which
    works in any thread) or as a context manager around the forward
    (``with hook:``; Chainer keeps such hooks per thread).

    A parameter used before its owning link is called in the forward is
    covered only with ``uses`` (see :class:`ParameterUses`).

    Args:
        model (chainer.Link): The replica whose forward waits.
        plan (ChunkPlan): The chunks.
        wait (callable): ``wait(chunk_index)``; blocks until that chunk's
            new weights are in place.
        uses (ParameterUses): Optional; parameters used outside their own
            link, found in the first forward: the link being called at that
            use waits for their chunks too.

    Raises:
        ValueError: A layer of ``model`` is not in ``plan`` (a plan of
            another model), ``wait`` is not callable, or ``uses`` holds a
            parameter used while no link of the model was being called
            (no link call could wait for it).
    """

    name = 'ChunkWaitHook'

    def __init__(self, model, plan, wait, uses=None):
        if not callable(wait):
            raise ValueError('wait must be callable as wait(chunk_index)')
        self._wait = wait
        links = dict(model.namedlinks())
        chunks_of = {}
        for path, link in links.items():
            own = [n for n, _ in link.namedparams() if n.count('/') == 1]
            if not own:
                continue
            if path not in plan.chunk_of_layer:
                raise ValueError(
                    'layer {} of the model is not in the chunk plan ({}); '
                    'the plan must come from this model\'s parameter '
                    'names'.format(path, plan.fingerprint))
            chunks_of.setdefault(path, set()).add(plan.chunk_of_layer[path])
        for name, path in sorted((uses.outside if uses else {}).items()):
            if path is None:
                raise ValueError(
                    'parameter {} is used while no link of the model is '
                    'being called, so no link call can wait for its new '
                    'weights; use it inside a link\'s forward'.format(name))
            if name not in plan.chunk_of:
                raise ValueError('parameter {} is not in the chunk plan '
                                 '({})'.format(name, plan.fingerprint))
            chunks_of.setdefault(path, set()).add(plan.chunk_of[name])
        # The latest-completing chunk first: the others are then done.
        self._chunks_of_link = {
            links[path]: tuple(sorted(chunks, reverse=True))
            for path, chunks in chunks_of.items()}
        self._installed = []

    def chunks_of(self, link):
        """The chunks a link's call waits for (empty if it never waits).

        Args:
            link (chainer.Link): A link of the model.

        Returns:
            tuple of int: Chunk indices, in the order waited.
        """
        return self._chunks_of_link.get(link, ())

    def install(self):
        """Registers this hook on every link that waits."""
        if self._installed:
            raise RuntimeError('ChunkWaitHook is already installed')
        for link in self._chunks_of_link:
            link.add_hook(self)
            self._installed.append(link)

    def uninstall(self):
        """Removes this hook from the links :meth:`install` registered it on.
        """
        for link in self._installed:
            link.delete_hook(self.name)
        self._installed = []

    def forward_preprocess(self, args):
        for chunk in self._chunks_of_link.get(args.link, ()):
            self._wait(chunk)


def has_uninitialized_params(link):
    """Whether a link holds parameters still waiting for their first input.

    Args:
        link (chainer.Link): E.g. the master model.

    Returns:
        bool: ``True`` if any parameter's array is ``None``.
    """
    return any(param.array is None for param in link.params())


def refuse_uninitialized(link):
    """Raises ValueError naming the parameters that the first forward left
    uninitialized (lazy layers the loss never called): CGDP lays every
    parameter out in its flat buffers before training, so it needs their
    shapes.

    Args:
        link (chainer.Link): The master, after its first forward.
    """
    missing = [name for name, param in link.namedparams()
               if param.array is None]
    if missing:
        raise ValueError(
            'the first forward left {} uninitialized (a lazy layer the '
            'loss does not call); CGDP lays every parameter out before '
            'training, so give the layer its input size (e.g. '
            'L.Linear(in_size, out_size)), call it once before training, '
            'or remove it from the model'.format(', '.join(missing)))


def initialize_from_first_batch(lossfun, in_arrays):
    """Runs the loss forward once on the master with the whole first batch.

    This is what ``StandardUpdater`` does at its first iteration, so lazy
    parameters (``L.Linear(None, n)``) get exactly its values: initializers
    draw from NumPy's global random state in call order, and anything else
    drawing from it in the forward (``F.dropout``'s mask, sized by the
    batch) sits between those draws, so only the whole batch reproduces the
    order and amounts of drawing. The global random state afterwards is also
    the one ``StandardUpdater`` leaves.

    Side effects are ``StandardUpdater``'s first forward's: the loss
    function reports its observations (``main/loss``) into the current
    reporter scope and BatchNormalization updates the master's running
    statistics once (the updater keeps them as they were with
    :class:`~cgdp_chainer.runtime.host.master.StatisticsKept`).

    Args:
        lossfun (callable): The loss function, e.g. the master model
            (``optimizer.target``), as ``StandardUpdater``'s ``loss_func``.
        in_arrays (tuple, dict or array): The converted first batch, as the
            converter returns it: a tuple is passed as positional arguments,
            a dict as keyword arguments, anything else as one argument.

    Returns:
        chainer.Variable: The loss with its graph (on the master's
        parameters), e.g. to report as ``main/loss`` for
        ``extensions.DumpGraph('main/loss')``.

    Raises:
        ValueError: ``lossfun`` does not return a chainer.Variable.
    """
    with chainer.using_config('train', True):
        if isinstance(in_arrays, tuple):
            loss = lossfun(*in_arrays)
        elif isinstance(in_arrays, dict):
            loss = lossfun(**in_arrays)
        else:
            loss = lossfun(in_arrays)
    if not isinstance(loss, chainer.Variable):
        raise ValueError('the loss function must return a chainer.Variable, '
                         'not {}'.format(type(loss).__name__))
    return loss
