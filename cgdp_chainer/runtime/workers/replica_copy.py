"""How a replica is made from the master model, for both worker kinds.

A replica is the master pickled by value with cloudpickle, the tool that
Ray, Dask and loky use to ship Python objects between processes: lambdas,
closures, locally defined classes and functions of ``__main__`` travel by
value, and since the model and ``loss_func`` travel in one pickle, a
function that captures the model or one of its links (Chainer's memnn
example: ``self.W = lambda u: F.linear(u, self.embeds[-1].W)``) captures
the replica's in the copy. Worker processes unpickle the bytes; thread
workers unpickle the same bytes in memory. Either way the master's
parameter arrays are left out of the pickle (``persistent_id``): a worker
process maps them from shared memory, a thread replica shares the master's
arrays, as its host-resident transfer does anyway; gradients and update
rules are left out too.

What the model's functions reach and a worker can import travels by
reference: modules, functions and classes of importable modules
(cloudpickle's own rule), and any other object that ``sys.modules`` holds,
such as ``six.moves``, a lazily loaded module object of a class of its own
(:func:`module_names`); by value only what must travel. What cannot be
pickled at all is refused naming the path to it
(:func:`path_to_unpicklable`).

What a copy by value cannot fix, a function copied by reference (one
defined at module level of an importable module) whose globals name the
master, is found by :func:`check_no_master_references` and refused before
any work, naming the attribute.
"""
import copy
import copyreg
import io
import pickle
import sys
import types
import weakref

import chainer
import cloudpickle
import numpy

from cgdp_chainer.runtime.replica import static_graph_models


class _ReplicaPickler(cloudpickle.Pickler):
    """Pickles the master as a replica, leaving out what the worker gets
    from shared memory or the master (parameter arrays) or must not have
    (gradients, the optimizer's update rules and their state, a static
    schedule of the master's, what its forwards left on its links).

    Args:
        file: Where the pickle goes.
        master_params (dict): Parameter path -> the master's parameter.
        leftovers (set): ``id`` of each object that travels as None
            (see :func:`forward_leftovers`).
    """

    def __init__(self, file, master_params, leftovers=frozenset()):
        super(_ReplicaPickler, self).__init__(file, pickle.HIGHEST_PROTOCOL)
        self._leftovers = leftovers
        self._arrays = {id(p.array): name for name, p in master_params.items()
                        if p.array is not None}
        # A lazy parameter (array None) has no gradient to leave out yet.
        self._grads = {id(p.grad) for p in master_params.values()
                       if p.array is not None and p.grad is not None}

        # Metaclass -> an importable class made with it (see reducer_override).
        self._made_with = {}
        self._module_names = module_names()

    def reducer_override(self, obj):
        # cloudpickle rebuilds a class defined in __main__ or in a function
        # with its metaclass, which it pickles by value if that cannot be
        # imported by name: Chainer's (chainer.utils.meta's base_metaclass,
        # made by a function) would come back as a second metaclass that
        # conflicts with the one of chainer.Link. Such a metaclass is
        # pickled as type(C) of an importable class C made with it.
        if isinstance(obj, chainer.Sequential):
            # Its __reduce__ refuses lambdas among its layers, which only
            # the standard pickle cannot carry: the default reduction.
            return copyreg.__newobj__, (type(obj),), vars(obj)
        if type(obj) is not types.ModuleType:  # cloudpickle's own rule
            module_name = self._module_names.get(id(obj))
            if module_name is not None:
                return import_by_name, (module_name,)
        if isinstance(obj, type):
            if issubclass(obj, type):
                made_with = self._made_with.get(id(obj))
                if made_with is not None and not _importable(obj):
                    return type, (made_with,)
            else:
                for base in obj.__mro__:
                    meta = type(base)
                    if meta is not type and id(meta) not in self._made_with \
                            and _importable(base):
                        self._made_with[id(meta)] = base
        return super(_ReplicaPickler, self).reducer_override(obj)

    def persistent_id(self, obj):
        if isinstance(obj, numpy.ndarray):
            name = self._arrays.get(id(obj))
            if name is not None:
                return ('param', name)
            if id(obj) in self._grads:
                return ('none',)
        elif id(obj) in self._leftovers or isinstance(
                obj, (chainer.UpdateRule, static_graph_models.SCHEDULE_TYPES)):
            # A replica runs define-by-run: a static schedule that the
            # master's own calls built stays the master's.
            return ('none',)
        return None


def module_names():
    """``id(obj) -> name`` for every object that ``sys.modules`` holds
    under a name that a worker process can import it by.

    cloudpickle pickles objects of exactly ``types.ModuleType`` by
    reference, but not module objects of classes of their own (lazily
    loaded ones: ``six.moves`` is a ``six._MovedItems``, which cloudpickle
    reaches through the globals of a function that uses
    ``six.moves.zip``, and then cannot pickle), nor other objects that a
    library puts in ``sys.modules``. The worker imports them by name
    (:func:`import_by_name`). Left out: ``__main__`` (the script, whose
    functions and classes travel by value) and modules registered with
    ``cloudpickle.register_pickle_by_value``.

    Returns:
        dict: From ``id`` to the name, the object's own ``__name__`` where
        ``sys.modules`` holds it under that name.
    """
    by_value = cloudpickle.list_registry_pickle_by_value()
    names = {}
    for name, obj in list(sys.modules.items()):
        if obj is None or name in ('__main__', '__mp_main__') or any(
                name == root or name.startswith(root + '.')
                for root in by_value):
            continue
        own = getattr(obj, '__name__', None)
        if id(obj) not in names or name == own:
            names[id(obj)] = name
    return names


def import_by_name(name):
    """The object that ``sys.modules`` holds under ``name`` once it is
    imported (``__import__`` returns the top-level package instead).

    Args:
        name (str): A name from :func:`module_names`.
    """
    __import__(name)
    return sys.modules[name]


def _importable(cls):
    """Whether pickle can refer to ``cls`` by name in a worker process
    (cloudpickle pickles what ``__main__`` defines by value)."""
    module = sys.modules.get(getattr(cls, '__module__', None) or '')
    if module is None or module.__name__ == '__main__':
        return False
    found = module
    for part in cls.__qualname__.split('.'):
        found = getattr(found, part, None)
    return found is cls


class _ReplicaUnpickler(pickle.Unpickler):

    def __init__(self, file, master_arrays):
        super(_ReplicaUnpickler, self).__init__(file)
        self._master_arrays = master_arrays

    def persistent_load(self, pid):
        if pid[0] == 'param':
            return self._master_arrays[pid[1]]
        return None


def pickle_replica(master, loss_func, master_params):
    """The bytes of a replica and its ``loss_func``, parameters left out.

    Args:
        master (chainer.Link): The master model.
        loss_func (callable or None): As for ``CGDPUpdater``.
        master_params (dict): Parameter path -> the master's parameter.

    Raises:
        ValueError: Something in the model or ``loss_func`` cannot be
            pickled even by value (a lock, an open file, a weak reference);
            the message names it and the fix.
    """
    _pickle_or_explain(loss_func, 'loss_func')
    buffer = io.BytesIO()
    leftovers = {id(value) for value in forward_leftovers(
        _links_of(master, loss_func))}
    try:
        _ReplicaPickler(buffer, master_params, leftovers).dump(
            (master, loss_func))
    except Exception as error:
        found = path_to_unpicklable(
            [('the model', master), ('loss_func', loss_func)], master_params)
        raise ValueError(
            "the model cannot be pickled for workers='process' ({}: {}{}). "
            'Lambdas, closures and local classes are fine; keep no open '
            'files, locks, weak references or other live resources in it; '
            "or pass workers='thread'".format(
                type(error).__name__, error,
                '' if found is None else '; at {}, a {}'.format(
                    found[0], type(found[1]).__name__))) from error
    return buffer.getvalue()


def _links_of(master, loss_func):
    """The master's links, and those of the link that ``loss_func`` is
    (or is a bound method of)."""
    links = list(master.links())
    loss_link = getattr(loss_func, '__self__', loss_func)
    if isinstance(loss_link, chainer.Link):
        links.extend(loss_link.links())
    return links


def forward_leftovers(links):
    """What the links' forwards left on them: each attribute's value that
    is a ``chainer.Variable`` computed by a function, with its graph
    (``Classifier``'s ``y``, ``loss`` and ``accuracy``, an LSTM's state).

    A link's own values are parameters, persistents and constants (arrays,
    or Variables made from them, which have no creator); a Variable that a
    function made is the output of a forward, for the batch of that
    forward. A replica starts without them (None), as a link just built
    does, and its own forward sets them again. Left in, the master's first
    forward on the whole batch, which initializes lazy layers, would give
    every worker a copy of its outputs (megabytes for a large layer).

    Args:
        links (list of chainer.Link): The links to look at.

    Returns:
        list: The values, each once.
    """
    found = {}
    for link in links:
        for value in vars(link).values():
            if isinstance(value, chainer.Variable) and \
                    value.creator_node is not None:
                found[id(value)] = value
    return list(found.values())


def _pickles(obj, master_params):
    """Whether :func:`pickle_replica`'s pickler can pickle ``obj``."""
    try:
        _ReplicaPickler(io.BytesIO(), master_params).dump(obj)
    except Exception:
        return False
    return True


def path_to_unpicklable(roots, master_params):
    """The path to an object that cannot be pickled, and the object: from
    the first root that cannot, down through the first of its attributes,
    items, closure variables and globals (and its class, if that travels by
    value) that cannot either, until none of them fails: the object itself
    is the one (or, for a function, what cloudpickle adds to its globals,
    such as the submodules it uses).

    Only called once pickling failed: each step pickles the candidates
    again, so it costs a few pickles of parts of the model.

    Args:
        roots (list): ``(name, object)`` pairs, as the paths begin.
        master_params (dict): As for :func:`pickle_replica`.

    Returns:
        tuple or None: ``(path, object)``, or None if every root pickles.
    """
    candidates = roots
    found = None
    seen = set()
    while True:
        failing = next(((path, obj) for path, obj in candidates
                        if id(obj) not in seen and
                        not isinstance(obj, _TRIVIAL) and
                        not _pickles(obj, master_params)), None)
        if failing is None:
            return found
        found = failing
        path, obj = failing
        seen.add(id(obj))
        candidates = [(path + step, child)
                      for step, child in _pickled_children(obj)]


# What always pickles: not worth a try when looking for what does not.
_TRIVIAL = (str, bytes, int, float, complex, bool, type(None), numpy.ndarray,
            numpy.generic, numpy.dtype)


def _pickled_children(obj):
    """What pickling ``obj`` pickles with it, as ``(step, child)``: its
    references (see :func:`_children`), a class's attributes, and the class
    of an instance if the class travels by value."""
    if isinstance(obj, type):
        return [('.' + name, value) for name, value in vars(obj).items()]
    children = list(_children(obj))
    if not isinstance(obj, (types.FunctionType, types.MethodType)) and \
            not _importable(type(obj)):
        children.append((' (class {})'.format(type(obj).__qualname__),
                         type(obj)))
    return children


def load_replica(replica_bytes, master_arrays):
    """Unpickles :func:`pickle_replica`'s bytes.

    Args:
        replica_bytes (bytes): From :func:`pickle_replica`.
        master_arrays (dict): Parameter path -> the array the replica's
            parameter starts with (the master's own, or its shared copy).

    Returns:
        tuple: ``(replica, loss_func)``.
    """
    return _ReplicaUnpickler(io.BytesIO(replica_bytes), master_arrays).load()


def _pickle_or_explain(obj, what):
    try:
        return cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(
            "{} cannot be pickled for workers='process' ({}: {}); keep no "
            'open files, locks or other live resources in it, or pass '
            "workers='thread'".format(what, type(error).__name__,
                                      error)) from error


def thread_replicas(master, loss_func, count):
    """``count`` copies of ``(master, loss_func)`` for thread workers, each
    checked by :func:`check_no_master_references`.

    The same by-value copy as for worker processes; where something cannot
    be pickled, a deep copy instead (which shares functions with the
    master: the check then refuses one that refers to the master).

    Args:
        master (chainer.Link): The master model, on the host.
        loss_func (callable or None): As for ``CGDPUpdater``.
        count (int): How many replicas.

    Returns:
        list of tuple: ``(replica, loss_func)`` each; the replicas'
        parameters hold the master's arrays.
    """
    master_params = dict(master.namedparams())
    master_arrays = {name: p.array for name, p in master_params.items()}
    try:
        replica_bytes = pickle_replica(master, loss_func, master_params)
    except ValueError:
        replica_bytes = None
    copies = []
    for _ in range(count):
        if replica_bytes is not None:
            pair = load_replica(replica_bytes, master_arrays)
        else:
            pair = _deep_copy(master, loss_func, master_params)
        check_no_master_references(master, *pair)
        copies.append(pair)
    return copies


def _deep_copy(master, loss_func, master_params):
    """``copy.deepcopy`` with the master's arrays shared and its gradients,
    update rules and static schedules left out, as in the pickled copy."""
    memo = {}
    for param in master_params.values():
        if param.array is not None:
            memo[id(param.array)] = param.array
            if param.grad is not None:
                memo[id(param.grad)] = None
        if param.update_rule is not None:
            memo[id(param.update_rule)] = None
    links = _links_of(master, loss_func)
    for value in forward_leftovers(links):
        memo[id(value)] = None
    for link in links:
        for value in vars(link).values():
            if isinstance(value, static_graph_models.SCHEDULE_TYPES):
                memo[id(value)] = None
    try:
        return copy.deepcopy((master, loss_func), memo)
    except Exception as error:
        raise ValueError(
            'CGDP cannot copy the model for its replicas ({}: {}): keep no '
            'open files, locks or other live resources in the model or '
            'loss_func'.format(type(error).__name__, error)) from error


def check_replicable(master, loss_func, workers):
    """Refuses, before any work, a model that replicas cannot train: one
    that cannot be copied for ``workers``, one whose copy would still
    compute with the master.

    Cheap: the parameter arrays are not copied.

    Args:
        master (chainer.Link): The master model.
        loss_func (callable or None): As for ``CGDPUpdater``.
        workers (str): ``'process'`` or ``'thread'``.

    Raises:
        ValueError: The message names the problem and the fix.
    """
    master_params = dict(master.namedparams())
    master_arrays = {name: p.array for name, p in master_params.items()}
    if workers == 'process':
        replica_bytes = pickle_replica(master, loss_func, master_params)
        check_no_master_references(
            master, *load_replica(replica_bytes, master_arrays))
    else:
        thread_replicas(master, loss_func, 1)


# ------------------------------------------------------------ the safety net

# Objects the search does not look into: values, arrays, classes, modules,
# code; none of them can hide a reference to a link of the master.
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None),
           numpy.ndarray, numpy.generic, numpy.dtype, type, types.ModuleType,
           types.BuiltinFunctionType, types.CodeType, range, slice)


def check_no_master_references(master, replica, loss_func):
    """Raises ValueError if anything reachable from a replica or its
    ``loss_func`` (attributes, containers, functions' closures, defaults
    and the globals they use, bound methods, weak references) is a link or
    parameter of the master: the replica would compute with the master's
    weights, and its gradients would not be its own.

    Args:
        master (chainer.Link): The master model.
        replica (chainer.Link): A copy of it.
        loss_func (callable or None): The replica's ``loss_func``.
    """
    masters = {id(link): ('link', path) for path, link in master.namedlinks()}
    masters.update((id(param), ('parameter', path))
                   for path, param in master.namedparams())
    found = _find_reference((('the model', replica), ('loss_func', loss_func)),
                            masters)
    if found is None:
        return
    path, (kind, name) = found
    raise ValueError(
        "after copying the model for a replica, {} still refers to the "
        "master's {} {!r}: the replica would compute with the master's "
        'weights. {}'.format(path, kind, name, _how_to_fix(path)))


def _how_to_fix(path):
    if ', global ' in path:
        return (
            'A function defined at module level of an importable module is '
            'copied by reference, with its module globals; pass the model '
            'to it as an argument, or keep what refers to the model on the '
            'model (an attribute, lambda, closure or bound method there is '
            'copied with it)')
    if '(weakly referred)' in path:
        return ('A weak reference is not copied; hold the link itself, or '
                'look it up from the model when it is needed')
    return ('Something in the model cannot be pickled, so thread workers '
            'copied it with copy.deepcopy, which shares functions with the '
            'master; make the model picklable (no locks, open files or weak '
            'references) so that it is copied by value')


def _find_reference(roots, masters):
    """The first path from ``roots`` to an object in ``masters``, with
    what it is, or None."""
    seen = set()
    stack = list(roots)
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in masters:
            return path, masters[id(obj)]
        stack.extend((path + step, child) for step, child in _children(obj))
    return None


def _children(obj):
    """``(step, child)`` for what ``obj`` refers to; a step reads as the
    continuation of a path."""
    if isinstance(obj, dict):
        return [('[{!r}]'.format(key), value) for key, value in
                list(obj.items())] + [(' (a key)', key) for key in obj]
    if isinstance(obj, (list, tuple)):
        return [('[{}]'.format(i), item) for i, item in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [(' (an element)', item) for item in obj]
    if isinstance(obj, types.FunctionType):
        return _function_children(obj)
    if isinstance(obj, types.MethodType):
        return [('.__self__', obj.__self__), ('.__func__', obj.__func__)]
    if isinstance(obj, weakref.ref):
        return [(' (weakly referred)', obj())]
    children = []
    if hasattr(obj, '__dict__') and isinstance(vars(obj), dict):
        children.extend(('.' + name, value)
                        for name, value in list(vars(obj).items()))
    for cls in type(obj).__mro__:
        for name in _slot_names(cls):
            if hasattr(obj, name):
                children.append(('.' + name, getattr(obj, name)))
    return children


def _slot_names(cls):
    slots = vars(cls).get('__slots__', ())
    if isinstance(slots, str):
        slots = (slots,)
    return [name for name in slots if name not in ('__dict__', '__weakref__')]


def _function_children(function):
    where = ' (function {}'.format(function.__qualname__)
    children = []
    for name, cell in zip(function.__code__.co_freevars,
                          function.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not filled in yet
            continue
        children.append(('{}, closure variable {!r})'.format(where, name),
                         value))
    for i, value in enumerate(function.__defaults__ or ()):
        children.append(('{}, default {})'.format(where, i), value))
    for name, value in (function.__kwdefaults__ or {}).items():
        children.append(('{}, default {!r})'.format(where, name), value))
    module_globals = function.__globals__
    for name in sorted(_global_names(function.__code__)):
        if name in module_globals:
            children.append(('{}, global {!r} of module {})'.format(
                where, name, module_globals.get('__name__')),
                module_globals[name]))
    children.extend(('.' + name, value)
                    for name, value in vars(function).items())
    return children


def _global_names(code):
    """Names that ``code`` and the code nested in it may read as globals
    (attribute names too: a superset is harmless)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
