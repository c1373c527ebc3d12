"""Which classes the fused host update takes as one of its own.

Real scripts spell optimizers and hooks many ways: Chainer's deprecated
aliases (``chainer.optimizer.WeightDecay``, a subclass of
``chainer.optimizer_hooks.WeightDecay`` that only warns in ``__init__``),
a user's subclass that sets defaults, ``AdamW`` (``Adam`` with other
defaults). Such a class computes what its base computes, and the fused
update takes it as its base. A subclass that redefines anything its base's
update may call (``__call__``, ``update_core_cpu``, ``init_state``, ...)
keeps Chainer's path.

The decision reads the classes' own dictionaries, not a list of names: a
class between the subclass and the base (in the subclass's MRO) may define
``__init__``, data attributes and methods the base does not have, and
nothing else that the base has.
"""
import functools

# Methods a subclass may redefine without changing what the base's update
# computes: construction only.
_ALLOWED = frozenset(['__init__'])
# The class machinery every class dictionary holds.
_CLASS_ENTRIES = frozenset([
    '__module__', '__doc__', '__qualname__', '__dict__', '__weakref__',
    '__annotations__', '__firstlineno__', '__static_attributes__',
    '__orig_bases__', '__parameters__', '__slots__'])
# Attribute access: every attribute the update reads goes through these,
# although the base's own come from ``object``.
_ACCESS = frozenset(['__getattribute__', '__getattr__'])


def _is_method(value):
    """Whether a class dictionary's entry is code that runs on access or
    call (a function, a property, a class or static method, any
    descriptor), rather than plain data (``name``, ``timing``)."""
    return callable(value) or hasattr(type(value), '__get__')


def _base_names(base):
    """The names the base's update may reach through ``self``: every entry
    of its classes but ``object``, and attribute access."""
    names = set(_ACCESS)
    for cls in base.__mro__:
        if cls is not object:
            names.update(cls.__dict__)
    return names


@functools.lru_cache(maxsize=None)
def overrides(cls, base):
    """What ``cls`` redefines of ``base``'s methods, other than
    ``__init__``.

    Args:
        cls (type): A subclass of ``base`` (or ``base`` itself).
        base (type): The class with a fused form.

    Returns:
        tuple of str: The redefined names, sorted; empty where ``cls``
        computes what ``base`` does.
    """
    reached = _base_names(base)
    found = set()
    for klass in cls.__mro__:
        if klass is base:
            break
        for name, value in klass.__dict__.items():
            if name in _ALLOWED or name in _CLASS_ENTRIES:
                continue
            if name in reached and _is_method(value):
                found.add(name)
    return tuple(sorted(found))


def nearest(cls, bases):
    """The first class of ``cls``'s MRO among ``bases``, or None.

    Args:
        cls (type): Any class.
        bases (collections.abc.Container): Classes with a fused form.
    """
    for klass in cls.__mro__:
        if klass in bases:
            return klass
    return None


def fused_as(cls, bases):
    """The class of ``bases`` that ``cls`` is fused as, or None.

    Args:
        cls (type): An optimizer's, hook's or update rule's class.
        bases (collections.abc.Container): Classes with a fused form.
    """
    base = nearest(cls, bases)
    if base is None or overrides(cls, base):
        return None
    return base


def why_not(cls, bases):
    """``cls`` named for a message saying it is not fused, or None where it
    is.

    Args:
        cls (type): An optimizer's, hook's or update rule's class.
        bases (collections.abc.Container): Classes with a fused form.

    Returns:
        str or None: The class's name where no base of it has a fused form
        (``'AdaDelta'``), and what it changes where one has
        (``'MyDecay (a subclass of WeightDecay that overrides __call__)'``).
    """
    base = nearest(cls, bases)
    if base is None:
        return cls.__name__
    changed = overrides(cls, base)
    if not changed:
        return None
    return '{} (a subclass of {} that overrides {})'.format(
        cls.__name__, base.__name__, ', '.join(changed))
