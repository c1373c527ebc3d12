"""What the cost model feeds a model: synthetic inputs and class labels.

The cost model counts and times a model on a synthetic batch: inputs ``x``
of a per-example shape (:func:`parse_input_shape`: ``C,H,W`` for images, a
flat width ``F`` for an MLP) and class labels ``t``. A model comes in one
of two forms (:func:`computes_loss` tells them apart):

- a *predictor*, ``link(x)`` giving scores ``(N, K)`` (or a tuple of such
  outputs, main output first): it is profiled inside the project's
  classifier (softmax cross entropy), and ``K`` is read from its output;
- a *loss chain*, ``link(x, t)`` returning a scalar loss: a
  ``chainer.links.Classifier`` or any chain whose ``forward`` takes
  ``(x, t)``; it is profiled as it is, with the user's loss. ``t`` holds
  class indices (``int32``, shape ``(N,)``); ``K`` is read from the array
  the loss meets the labels with (the ``(N, K)`` input of the first
  function that takes ``t``).

:func:`probe_model` checks either with one small forward on the CPU and
returns a :class:`ProbedModel`, or raises ``ValueError`` saying what is
wrong and what to give instead.
"""
import inspect

import chainer
import chainer.links
import numpy

# The per-example input shapes the cost model takes, for messages.
INPUT_SHAPE_FORMS = ('C,H,W for images (e.g. 3,32,32) or a flat width F '
                     '(e.g. 20): one to three positive integers, '
                     'comma-separated, without the batch')
MAX_INPUT_DIMS = 3
# Examples in the probe's batch: two, so that batch normalization has a
# batch statistic to compute.
PROBE_BATCH = 2


def parse_input_shape(text):
    """The per-example input shape a command line gives.

    Args:
        text (str): E.g. ``'3,32,32'`` or ``'20'``.

    Returns:
        tuple of int: The shape.

    Raises:
        ValueError: Not one to :data:`MAX_INPUT_DIMS` positive integers.
    """
    parts = [part.strip() for part in str(text).split(',')]
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        shape = ()
    if not 1 <= len(shape) <= MAX_INPUT_DIMS or min(shape) <= 0:
        raise ValueError('{!r} is not an input shape; give {}'.format(
            text, INPUT_SHAPE_FORMS))
    return shape


def describe_shape(shape):
    """``'3x32x32'``: a shape for messages and reports."""
    return 'x'.join(str(side) for side in shape)


def sample_input(input_shape, batch, seed=0):
    """Uniform inputs in [-1, 1), float32, of shape ``(batch,) +
    input_shape``, from a generator of their own (NumPy's global state is
    left alone)."""
    rng = numpy.random.RandomState(seed)
    return rng.uniform(-1, 1, (batch,) + tuple(input_shape)).astype(
        numpy.float32)


def sample_labels(n_outputs, batch, seed=0):
    """Class indices below ``n_outputs`` (all zero where it is unknown),
    int32, shape ``(batch,)``."""
    if not n_outputs:
        return numpy.zeros(batch, dtype=numpy.int32)
    rng = numpy.random.RandomState(seed + 1)
    return rng.randint(0, n_outputs, batch).astype(numpy.int32)


def computes_loss(link):
    """Whether ``link(x, t)`` computes its own loss: a
    ``chainer.links.Classifier``, or a link whose ``forward`` requires two
    or more positional arguments."""
    if isinstance(link, chainer.links.Classifier):
        return True
    try:
        parameters = inspect.signature(link.forward).parameters.values()
    except (TypeError, ValueError):  # no signature to read: a predictor
        return False
    required = [p for p in parameters if p.default is p.empty and p.kind in
                (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) >= 2


class ProbedModel(object):
    """A model that passed :func:`probe_model`, ready to be profiled.

    Args:
        loss_chain (chainer.Link): What computes the loss from ``(x, t)``:
            the user's loss chain, or the predictor inside the project's
            classifier.
        input_shape (tuple of int): Per-example input shape.
        n_outputs (int or None): Scores per example read from the model
            (``None``: a loss chain whose loss took no ``(N, K)`` array
            beside the labels).
        user_loss (bool): Whether the loss is the user's.
        name (str): What the model is called (the ``--net`` value).
    """

    def __init__(self, loss_chain, input_shape, n_outputs, user_loss, name):
        self.name = name
        self.loss_chain = loss_chain
        self.input_shape = tuple(input_shape)
        self.n_outputs = n_outputs
        self.user_loss = user_loss

    def in_arrays(self, batch, device=None, seed=0):
        """``(x, t)`` of ``batch`` examples, on ``device`` if given."""
        x = sample_input(self.input_shape, batch, seed)
        t = sample_labels(self.n_outputs, batch, seed)
        if device is None:
            return x, t
        return device.send(x), device.send(t)


class _LabelWidth(chainer.FunctionHook):
    """Finds the width ``K`` of the ``(N, K)`` array that the first
    function taking the labels ``t`` gets beside them."""

    name = 'CostModelLabelWidth'

    def __init__(self, labels):
        self._labels = labels
        self.width = None

    def forward_preprocess(self, function, in_data):
        if self.width is not None or \
                not any(data is self._labels for data in in_data):
            return
        for data in in_data:
            shape = getattr(data, 'shape', ())
            if data is not self._labels and len(shape) == 2 and \
                    shape[0] == self._labels.shape[0]:
                self.width = int(shape[1])
                return


def _quiet_forward(call, name, what, shape):
    """``call()`` as :func:`cgdp_chainer.models.custom.quiet_forward` runs
    it, its failure naming the model, what failed and the inputs' shape."""
    from cgdp_chainer.models import custom
    return custom.quiet_forward(call, '--net {}: {} on inputs of shape {} '
                                'failed'.format(name, what,
                                                describe_shape(shape)))


def _predictor_width(link, name, input_shape):
    """Scores per example of a predictor; ValueError unless it maps ``x``
    to ``(N, K)`` scores (or a tuple of them, the main one first)."""
    x = sample_input(input_shape, PROBE_BATCH)
    y = _quiet_forward(lambda: link(x), name, 'its forward', input_shape)
    outputs = y if isinstance(y, tuple) else (y,)
    shape = tuple(getattr(outputs[0], 'shape', ()) or ())
    if len(shape) != 2 or shape[0] != PROBE_BATCH or \
            any(tuple(getattr(o, 'shape', ())) != shape for o in outputs):
        got = 'shape {}'.format(shape) if shape else 'a {}'.format(
            type(outputs[0]).__name__)
        raise ValueError(
            '--net {}: {} examples of shape {} gave {}, not class scores of '
            'shape ({}, K); for another output, return a chain whose '
            'forward(x, t) computes the loss'.format(
                name, PROBE_BATCH, describe_shape(input_shape), got,
                PROBE_BATCH))
    return shape[1]


def _loss_chain_width(link, name, input_shape):
    """Scores per example a loss chain's loss meets the labels with (or
    ``None``); ValueError unless ``link(x, t)`` gives a scalar loss."""
    x = sample_input(input_shape, PROBE_BATCH)
    t = sample_labels(None, PROBE_BATCH)
    finder = _LabelWidth(t)

    def call():
        with finder:
            return link(x, t)
    loss = _quiet_forward(call, name, 'its loss with class labels t (int32, '
                          'shape ({},); the cost model gives class indices: '
                          'for other targets, return the predictor and its '
                          'time is costed with softmax cross entropy)'.format(
                              PROBE_BATCH), input_shape)
    if not isinstance(loss, chainer.Variable) or loss.size != 1:
        raise ValueError('--net {}: link(x, t) gave {}, not a scalar loss '
                         'Variable'.format(name, type(loss).__name__ if not
                                           hasattr(loss, 'shape') else
                                           'shape {}'.format(loss.shape)))
    return finder.width


def probe_model(link, input_shape, name):
    """Checks ``link`` on one small batch on the CPU and makes it ready for
    profiling.

    Args:
        link (chainer.Link): A predictor or a loss chain (see the module
            docstring); it is moved to the CPU.
        input_shape (tuple of int): Per-example input shape.
        name (str): What the messages call the model (the ``--net`` value).

    Returns:
        ProbedModel: The loss chain, the input shape and the outputs read.

    Raises:
        ValueError: The forward or the loss fails, or a predictor's output
            is not ``(N, K)`` scores.
    """
    link.to_device('@numpy')
    if computes_loss(link):
        width = _loss_chain_width(link, name, input_shape)
        return ProbedModel(link, input_shape, width, True, name)
    width = _predictor_width(link, name, input_shape)
    from cgdp_chainer import models  # the project's classifier (auxiliary outputs too)
    return ProbedModel(models.Classifier(link), input_shape, width, False,
                       name)
