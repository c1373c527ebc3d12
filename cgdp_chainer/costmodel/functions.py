"""FLOPs and bytes of every Chainer function a forward runs, for any model.

:class:`FunctionCostHook` is a :class:`chainer.FunctionHook`: it sees every
function call of a forward pass and records, per call, its kind, its FLOPs
and the bytes it reads and writes, and the same for its backward, derived
per kind (see :func:`backward_costs`). The per-function formulas follow the
conventions of chainer-computational-cost (a public reference that does not
import on Chainer 7.8.1): a multiply-add is 2 FLOPs, a comparison or an
addition 1; bytes are those of the input and output arrays, each read or
written once.

Kinds:

* ``'matmul'``: convolution, deconvolution and linear: ``2 x`` multiply-adds
  (the bias add, under ``1 / (2 K K Cin)`` of the rest, is not counted);
* ``'normalization'``, ``'pooling'``, ``'activation'``, ``'elementwise'``,
  ``'loss'``: a fixed number of FLOPs per element
  (:data:`FLOPS_PER_ELEMENT`, per output element for pooling's window);
* ``'layout'``: concat, split, slicing, copies, broadcasting: no FLOPs, the
  bytes moved;
* ``'view'``: reshape and the like: nothing (NumPy and CuPy make a view);
* ``'other'``: any other function: its bytes only.

Output sizes are read from the graph after the forward (the hook must run
with ``enable_backprop``); an output nobody kept counts as large as the
function's first input.
"""
import collections

import chainer
import numpy

MATMUL = ('Convolution2DFunction', 'ConvolutionND', 'Deconvolution2DFunction',
          'DeconvolutionND', 'LinearFunction', 'MatMul')
VIEWS = ('Reshape', 'Squeeze', 'ExpandDims', 'Flatten')
LAYOUT = ('Concat', 'SplitAxis', 'GetItem', 'Copy', 'Transpose', 'Pad',
          'BroadcastTo', 'Stack', 'Separate', 'Tile', 'Swapaxes', 'Cast')
POOLING = ('MaxPooling2D', 'MaxPoolingND', 'AveragePooling2D',
           'AveragePoolingND')

# FLOPs per element of the output (per element of the first input for the
# losses and reductions), by function class. Batch normalization in
# training: the mean and the variance (3 per element: a sum, a difference
# and a square-add) and the normalized, scaled and shifted output (4); with
# fixed statistics only the latter. Local response normalization: a square
# and an add per neighbour in its window of 5, then the scale's power and a
# product (2 x 5 + 4). Sigmoid and tanh: an exponential, an add and a
# division. Softmax: an exponential, a sum and a division; the cross
# entropy adds a log and a subtraction. Dropout: a random draw and a
# product.
FLOPS_PER_ELEMENT = {
    'BatchNormalization': ('normalization', 7),
    'FixedBatchNormalization': ('normalization', 4),
    'LocalResponseNormalization': ('normalization', 14),
    'ReLU': ('activation', 1),
    'LeakyReLU': ('activation', 2),
    'ClippedReLU': ('activation', 2),
    'ELU': ('activation', 3),
    'Sigmoid': ('activation', 3),
    'Tanh': ('activation', 3),
    'Softmax': ('activation', 3),
    'LogSoftmax': ('activation', 4),
    'Add': ('elementwise', 1),
    'AddConstant': ('elementwise', 1),
    'Sub': ('elementwise', 1),
    'SubFromConstant': ('elementwise', 1),
    'Mul': ('elementwise', 1),
    'MulConstant': ('elementwise', 1),
    'Div': ('elementwise', 1),
    'DivFromConstant': ('elementwise', 1),
    'Neg': ('elementwise', 1),
    'Absolute': ('elementwise', 1),
    'Maximum': ('elementwise', 1),
    'Minimum': ('elementwise', 1),
    'Sqrt': ('elementwise', 1),
    'Exp': ('elementwise', 1),
    'Log': ('elementwise', 1),
    'PowVarConst': ('elementwise', 1),
    'Dropout': ('elementwise', 2),
    'Sum': ('elementwise', 1),
    'Mean': ('elementwise', 1),
    'Average': ('elementwise', 1),
    'SoftmaxCrossEntropy': ('loss', 5),
    'Accuracy': ('loss', 1),
}

# Backward FLOPs per forward FLOP, by kind: an activation or element-wise
# function's gradient is about as much arithmetic as its forward; batch
# normalization's gradient needs two more reductions (about 1.5x).
BACKWARD_FLOP_RATIO = {
    'normalization': 1.5, 'pooling': 1.0, 'activation': 1.0,
    'elementwise': 1.0, 'loss': 1.0, 'layout': 0.0, 'view': 0.0,
    'other': 0.0,
}

FunctionCost = collections.namedtuple('FunctionCost', [
    'label', 'kind', 'flops', 'bytes_read', 'bytes_written',
    'backward_flops', 'backward_bytes', 'param_bytes'])
FunctionCost.__doc__ = """The cost of one function call.

Attributes:
    label (str): The function's class name.
    kind (str): See the module docstring.
    flops (int): Forward FLOPs.
    bytes_read, bytes_written (int): Forward bytes of inputs and outputs.
    backward_flops (int), backward_bytes (int): Its backward's, derived by
        :func:`backward_costs`.
    param_bytes (int): Of ``bytes_read``, the bytes of parameters (which do
        not grow with the batch).
"""


def kind_of(label):
    """The kind (see the module docstring) of a function class name."""
    if label in MATMUL:
        return 'matmul'
    if label in POOLING:
        return 'pooling'
    if label in VIEWS:
        return 'view'
    if label in LAYOUT:
        return 'layout'
    if label in FLOPS_PER_ELEMENT:
        return FLOPS_PER_ELEMENT[label][0]
    return 'other'


def _tuple(value, ndim):
    if value is None:
        return (1,) * ndim
    if isinstance(value, (int, numpy.integer)):
        return (int(value),) * ndim
    return tuple(int(v) for v in value)


def _conv_macs(function, x_shape, w_shape):
    """Multiply-adds of a convolution: per output element, ``Cin / groups x
    prod(kernel)``; the output's size follows Chainer's own formula (so an
    output nobody kept is counted right too)."""
    from chainer.utils import conv
    ndim = len(w_shape) - 2
    if ndim == 2 and hasattr(function, 'sy'):
        strides, pads = (function.sy, function.sx), (function.ph, function.pw)
        dilations = (function.dy, function.dx)
    else:
        strides = _tuple(getattr(function, 'stride', None), ndim)
        pads = _tuple(getattr(function, 'pad', 0), ndim)
        dilations = _tuple(getattr(function, 'dilate', 1), ndim)
    cover_all = bool(getattr(function, 'cover_all', False))
    out_spatial = [conv.get_conv_outsize(size, k, s, p, cover_all=cover_all,
                                         d=d)
                   for size, k, s, p, d in zip(x_shape[2:], w_shape[2:],
                                               strides, pads, dilations)]
    return int(x_shape[0] * w_shape[0] * numpy.prod(out_spatial)
               * w_shape[1] * numpy.prod(w_shape[2:]))


def _deconv_macs(x_shape, w_shape):
    """Multiply-adds of a deconvolution: each input element is scattered
    through ``Cout / groups x prod(kernel)`` weights."""
    return int(numpy.prod(x_shape) * w_shape[1] * numpy.prod(w_shape[2:]))


def _pool_window(function):
    """Elements of a pooling window."""
    if hasattr(function, 'ksize'):
        return int(numpy.prod(_tuple(function.ksize, 2)))
    return int(function.kh * function.kw)


def forward_flops(function, label, kind, in_shapes, out_shapes):
    """Forward FLOPs of one call (see the module docstring)."""
    if kind == 'matmul':
        x_shape, w_shape = in_shapes[0], in_shapes[1]
        if label == 'LinearFunction':
            return 2 * int(numpy.prod(x_shape[:-1])) * int(
                numpy.prod(w_shape))
        if label.startswith('Deconvolution'):
            return 2 * _deconv_macs(x_shape, w_shape)
        if label == 'MatMul':
            return 2 * int(numpy.prod(out_shapes[0])) * int(x_shape[-1])
        return 2 * _conv_macs(function, x_shape, w_shape)
    if kind == 'pooling':
        per_window = _pool_window(function)
        return int(numpy.prod(out_shapes[0])) * per_window
    if label in FLOPS_PER_ELEMENT:
        per_element = FLOPS_PER_ELEMENT[label][1]
        if kind in ('loss',) or label in ('Sum', 'Mean', 'Average'):
            return per_element * int(numpy.prod(in_shapes[0]))
        return per_element * max(int(numpy.prod(s)) for s in out_shapes)
    return 0


def backward_costs(kind, flops, bytes_read, bytes_written, param_bytes,
                   input_needs_grad):
    """Backward FLOPs and bytes of one call, from its forward's.

    A matrix product computes the weight gradient (as many FLOPs as the
    forward) and, unless its input is the network's input, the input
    gradient (as many again); it reads the output gradient, the input and
    the weights and writes the input and weight gradients. Any other
    function reads its output gradient and what it kept of the forward
    (about its inputs) and writes its input gradients:
    ``bytes_written + 2 x bytes_read``, FLOPs by
    :data:`BACKWARD_FLOP_RATIO`. A view or layout function moves its
    gradient back (its forward bytes).

    Returns:
        tuple of int: ``(backward FLOPs, backward bytes)``.
    """
    if kind == 'matmul':
        backward = flops * (2 if input_needs_grad else 1)
        data = bytes_read - param_bytes
        moved = bytes_written + data + param_bytes + (
            data if input_needs_grad else 0) + param_bytes
        return backward, moved
    if kind == 'view':
        return 0, 0
    if kind == 'layout':
        return 0, bytes_read + bytes_written
    ratio = BACKWARD_FLOP_RATIO[kind]
    return int(ratio * flops), bytes_written + 2 * bytes_read


class FunctionCostHook(chainer.FunctionHook):
    """Records the cost of every function call of a forward.

    Use it around a forward with ``enable_backprop`` on (output sizes come
    from the graph); then :meth:`costs` gives one :class:`FunctionCost` per
    call, in call order. A caller may set :attr:`tag` before calls (e.g. the
    layer being run) to find it again in :attr:`tags`.

    Args:
        no_grad_inputs (sequence of arrays): Arrays whose gradient is never
            needed (the network's input): a matrix product taking one as its
            input is charged no input gradient.
    """

    name = 'FunctionCostHook'

    def __init__(self, no_grad_inputs=()):
        self._no_grad = {id(a) for a in no_grad_inputs}
        self._calls = []
        self.tag = None
        self.tags = []

    def forward_preprocess(self, function, in_data):
        node = getattr(function, 'node', function)
        self._calls.append((node, type(function).__name__,
                            [getattr(a, 'shape', ()) for a in in_data],
                            [int(getattr(a, 'nbytes', 0)) for a in in_data],
                            id(in_data[0]) not in self._no_grad
                            if in_data else True))
        self.tags.append(self.tag)

    def costs(self):
        """list of FunctionCost: One per call so far, in call order."""
        return [self._cost(*call) for call in self._calls]

    @staticmethod
    def _cost(node, label, in_shapes, in_bytes, input_needs_grad):
        kind = kind_of(label)
        outputs = [ref() for ref in (getattr(node, 'outputs', None) or ())]
        out_shapes = [o.shape for o in outputs if o is not None]
        out_bytes = [int(numpy.prod(o.shape)) * numpy.dtype(o.dtype).itemsize
                     for o in outputs if o is not None]
        if not out_shapes:  # nobody kept the outputs
            out_shapes = [in_shapes[0] if in_shapes else ()]
            out_bytes = [in_bytes[0] if in_bytes else 0]
        flops = forward_flops(node, label, kind, in_shapes, out_shapes)
        params = {id(x) for x in node.inputs
                  if isinstance(x.get_variable_or_none(), chainer.Parameter)}
        param_bytes = sum(b for x, b in zip(node.inputs, in_bytes)
                          if id(x) in params)
        if kind == 'view':
            read = written = 0
        else:
            read, written = sum(in_bytes), sum(out_bytes)
        backward_flops, backward_bytes = backward_costs(
            kind, flops, read, written, param_bytes, input_needs_grad)
        return FunctionCost(label, kind, int(flops), int(read), int(written),
                            int(backward_flops), int(backward_bytes),
                            int(param_bytes))


def count_forward(forward, no_grad_inputs=()):
    """Runs ``forward()`` in training mode under a :class:`FunctionCostHook`.

    Args:
        forward (callable): Runs the forward (e.g. ``lambda: model(x, t)``).
        no_grad_inputs (sequence of arrays): See :class:`FunctionCostHook`.

    Returns:
        list of FunctionCost: One per call.
    """
    hook = FunctionCostHook(no_grad_inputs)
    with chainer.using_config('train', True), \
            chainer.using_config('enable_backprop', True), hook:
        result = forward()
    costs = hook.costs()
    del result
    return costs


def totals(costs, kinds=None):
    """Sums of FLOPs and bytes over function costs.

    Args:
        costs (iterable of FunctionCost): E.g. from :func:`count_forward`.
        kinds (container of str or None): Only these kinds.

    Returns:
        dict: ``flops``, ``bytes`` (read plus written), ``backward_flops``
        and ``backward_bytes``.
    """
    total = {'flops': 0, 'bytes': 0, 'backward_flops': 0,
             'backward_bytes': 0}
    for c in costs:
        if kinds is not None and c.kind not in kinds:
            continue
        total['flops'] += c.flops
        total['bytes'] += c.bytes_read + c.bytes_written
        total['backward_flops'] += c.backward_flops
        total['backward_bytes'] += c.backward_bytes
    return total
