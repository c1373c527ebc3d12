"""What the equivalence tests share: training a model with an updater and
comparing parameters (CGDP against StandardUpdater and ParallelUpdater)."""
import chainer
from chainer.training import updaters
import numpy

import cgdp_chainer

import staged_models

WORKERS = ['process', 'thread']


def train(model, setup_optimizer, make_updater, iterations=3, batch=6,
          data=None):
    """Trains ``model`` and returns a copy of its parameters.

    Args:
        model (chainer.Link): The model (changed in place).
        setup_optimizer (callable): ``setup_optimizer(model) -> optimizer``.
        make_updater (callable): ``make_updater(iterator, optimizer)``.
        iterations (int): Updates to run.
        batch (int): Global batch size.
        data: The dataset (default: :func:`staged_models.dataset`).
    """
    optimizer = setup_optimizer(model)
    iterator = chainer.iterators.SerialIterator(
        data if data is not None else staged_models.dataset(), batch,
        shuffle=False)
    updater = make_updater(iterator, optimizer)
    try:
        for _ in range(iterations):
            updater.update()
    finally:
        updater.finalize()
    return {name: chainer.backends.cuda.to_cpu(p.array).copy()
            for name, p in model.namedparams()}


class Concatenated(chainer.dataset.Iterator):
    """The batches of several iterators as one: one device's view of
    ``CGDPUpdater``'s iterator-list form (and of
    ``MultiprocessParallelUpdater``'s). Epochs follow the first."""

    def __init__(self, iterators):
        self.iterators = list(iterators)

    def __next__(self):
        return [example for iterator in self.iterators
                for example in iterator.next()]

    @property
    def epoch(self):
        return self.iterators[0].epoch

    @property
    def epoch_detail(self):
        return self.iterators[0].epoch_detail

    @property
    def previous_epoch_detail(self):
        return self.iterators[0].previous_epoch_detail

    @property
    def is_new_epoch(self):
        return self.iterators[0].is_new_epoch

    def serialize(self, serializer):
        for index, iterator in enumerate(self.iterators):
            iterator.serialize(serializer['iterator{}'.format(index)])


def assert_same_params(expected, actual, rtol=1e-5, atol=1e-6):
    assert expected.keys() == actual.keys()
    for name in expected:
        numpy.testing.assert_allclose(actual[name], expected[name], rtol=rtol,
                                      atol=atol, err_msg=name)


def standard(iterator, optimizer):
    return updaters.StandardUpdater(iterator, optimizer)


def parallel(n):
    """ParallelUpdater over ``n`` '@numpy' devices."""
    def make(iterator, optimizer):
        devices = {'main': '@numpy'}
        devices.update({'replica{}'.format(i): '@numpy' for i in range(1, n)})
        return updaters.ParallelUpdater(iterator, optimizer, devices=devices)
    return make


def two_gpu_replicas():
    """Two GPU replicas: on GPUs 0 and 1, or both on GPU 0 where it is the
    only one (a device named twice is two replicas), so that one GPU runs
    the multi-replica GPU paths."""
    from cgdp_chainer import devices
    return ['@cupy:0', '@cupy:1' if devices.gpu_count() > 1 else '@cupy:0']


def cgdp(n, devices=None, **kwargs):
    """CGDPUpdater over ``n`` '@numpy' replicas (or ``devices``)."""
    def make(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, devices or ['@numpy'] * n, **kwargs)
    return make
