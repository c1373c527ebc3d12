"""NumPy's and Python's global random states, as the input path keeps them
``StandardUpdater``'s: taken, compared and set, and an iterator's epoch-end
shuffle drawn ahead from a copy of them.

A batch read ahead from copies of the states taken where
``StandardUpdater`` would draw it is exact only if nothing drew on the
caller's states since; :class:`RandomStates` tells that (comparing whole
states: a draw of any kind moves the Mersenne Twister's position or its
key).

A batch read ahead in a thread of the caller's process would draw, if its
dataset draws, from the caller's own states, at another time than
``StandardUpdater``'s: :class:`DrawRefusal` stops any such draw before it
is made, so that the thread's read is dropped and the batch drawn anew on
the caller. It sees NumPy 1's draws, not NumPy 2's
(:meth:`DrawRefusal.sees_every_draw`): the input path then proves each read
in the reader process instead.
"""
import random
import sys
import types

import chainer
import numpy

from cgdp_chainer import randomness


class RandomStates(object):
    """NumPy's and Python's global random states at one moment.

    Args:
        numpy_state (tuple): As ``numpy.random.get_state()`` returns it.
        python_state (tuple): As ``random.getstate()`` returns it.
    """

    def __init__(self, numpy_state, python_state):
        self.numpy_state = numpy_state
        self.python_state = python_state

    @classmethod
    def now(cls):
        """The caller's states now (draws nothing)."""
        return cls(numpy.random.get_state(), random.getstate())

    def are_current(self):
        """Whether the global states are these (nothing drew since)."""
        return self.same_as(RandomStates.now())

    def same_as(self, other):
        """Whether ``other`` (RandomStates) holds these very states."""
        return (randomness.same_numpy_state(other.numpy_state,
                                            self.numpy_state) and
                other.python_state == self.python_state)

    def install(self):
        """Makes these the global states."""
        numpy.random.set_state(self.numpy_state)
        random.setstate(self.python_state)


class GlobalRandomWatch(object):
    """Tells whether code drew from NumPy's or Python's global random
    state (a dataset whose ``get_example`` augments with them)."""

    def __enter__(self):
        self._before = RandomStates.now()
        self.drew = False
        return self

    def __exit__(self, *exc):
        self.drew = not self._before.are_current()
        return False


class GlobalDrawRefused(BaseException):
    """Raised in a read guarded by :class:`DrawRefusal` in place of a draw
    from NumPy's or Python's global random state. A ``BaseException``: a
    dataset's ``except Exception`` does not swallow it and draw on."""


def _global_generators():
    """The objects whose methods NumPy's and Python's global random
    functions are (``numpy.random.rand`` is a method of NumPy's global
    ``RandomState``, ``random.random`` one of Python's ``Random``)."""
    return (numpy.random.random.__self__, random.random.__self__)


class DrawRefusal(object):
    """Refuses, in the current thread for a block, every call from Python
    code to a method of NumPy's or Python's global random generator (a
    draw, a seed, a state read alike): the call raises
    :class:`GlobalDrawRefused` before it runs, so that the caller's states
    stay as they were.

    It watches with a profile function of the thread (``sys.setprofile``,
    which sees each call of a C function from Python code): a draw that C
    code makes on the global generators without going through Python is
    not seen.

    Attributes:
        refused (str or None): The first refused call's name, else None
            (also where the block swallowed the error).
    """

    def __init__(self):
        self.refused = None
        self._before = None

    @staticmethod
    def sees_every_draw():
        """Whether the global generators' methods are built-in methods,
        whose calls the profile function sees (NumPy 1's; NumPy 2's are
        Cython functions, whose calls it does not: only Python's draws are
        refused then)."""
        return all(isinstance(getattr(generator, 'random'),
                              types.BuiltinMethodType)
                   for generator in _global_generators())

    def _profile_function(self):
        """The profile function: a closure of locals, since it runs at
        every call and return of the thread."""
        numpy_generator, python_generator = _global_generators()
        refusal = self

        def profile(frame, event, arg):
            if event == 'c_call':
                owner = getattr(arg, '__self__', None)
                if owner is numpy_generator or owner is python_generator:
                    refusal.refused = refusal.refused or getattr(
                        arg, '__name__', repr(arg))
                    raise GlobalDrawRefused(refusal.refused)
        return profile

    def __enter__(self):
        self._before = sys.getprofile()
        sys.setprofile(self._profile_function())
        return self

    def __exit__(self, *exc):
        # An error in the profile function unsets it: put back what was.
        sys.setprofile(self._before)
        return False


def draws_only_global_numpy(order_sampler):
    """Whether ``order_sampler`` is Chainer's ``ShuffleOrderSampler`` on
    NumPy's global state (``shuffle=True``'s), whose draw can be made ahead
    from the caller's state and that state put back: it keeps no state of
    its own."""
    return (type(order_sampler) is chainer.iterators.ShuffleOrderSampler and
            # Chainer's attribute: the RandomState it draws from.
            order_sampler._random is numpy.random.random.__self__)


def sample_ahead(draw):
    """Runs ``draw`` (a call that draws from NumPy's global state) as it
    would run now, and puts the state back.

    Returns:
        tuple: ``(result, numpy_state)``: what ``draw`` returned and NumPy's
        global state after it.
    """
    before = numpy.random.get_state()
    try:
        result = draw()
        return result, numpy.random.get_state()
    finally:
        numpy.random.set_state(before)
