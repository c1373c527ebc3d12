"""NumPy's and Python's global random states, as the input path keeps them
``StandardUpdater``'s: taken, compared and set, and an iterator's epoch-end
shuffle drawn ahead from a copy of them.

A batch read ahead from copies of the states taken where
``StandardUpdater`` would draw it is exact only if nothing drew on the
caller's states since; :class:`RandomStates` tells that (comparing whole
states: a draw of any kind moves the Mersenne Twister's position or its
key).
"""
import random

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
        return (randomness.same_numpy_state(numpy.random.get_state(),
                                            self.numpy_state) and
                random.getstate() == self.python_state)

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
