"""Per-stage FLOPs and parameter sizes of a staged network.

The FLOPs of a network are counted by running its stages once under a Chainer
:class:`~chainer.FunctionHook` that looks at every convolution, deconvolution
and linear node and counts its multiply-adds from the shapes it sees. That
works for any network that follows the stage protocol (docs/INTERFACES.md)
without knowing its layers. Other layers (normalisation, activations,
pooling) are memory-bound and not counted; the cost model's efficiency factor
covers them. The same hook counts every function call of each stage (the
host-side work Chainer does per call, see
:func:`cgdp_chainer.costmodel.profiler.measure_function_overhead`) and the
counted layers (each pays a size-dependent efficiency on GPU presets, see
:class:`cgdp_chainer.costmodel.hardware.Hardware`).

Backward multiply-adds per node are those of the weight gradient plus, unless
the node's input is the network input (which needs no gradient), those of the
input gradient; each equals the forward count.

Counting a 224-px network means one real forward pass at batch 1, seconds on a
CPU; :func:`cached_stage_costs` keeps the results in a JSON file keyed by the
network, the image size and a hash of the ``models`` sources.
"""
import hashlib
import json
import os

from cgdp_chainer import _compat  # NOQA: must run before Chainer is used

import chainer
import numpy

CONV_FUNCTIONS = ('Convolution2DFunction', 'ConvolutionND')
DECONV_FUNCTIONS = ('Deconvolution2DFunction', 'DeconvolutionND')
LINEAR_FUNCTIONS = ('LinearFunction',)

DEFAULT_CACHE = os.path.join('results', 'costmodel', 'flops_cache.json')
# Part of the cache key: a new field in the records makes old entries stale.
RECORD_VERSION = 2


def _conv_macs(function, x_shape, w_shape):
    """Multiply-adds of one N-d convolution from its input and filter shapes.

    Every output element takes ``in_channels / groups * prod(kernel)``
    multiply-adds; the output's spatial size follows Chainer's own formula.
    """
    from chainer.utils import conv
    batch = x_shape[0]
    out_channels = w_shape[0]
    in_per_group = w_shape[1]
    kernel = w_shape[2:]
    spatial_in = x_shape[2:]
    ndim = len(kernel)
    strides = _tuple(getattr(function, 'stride', None), ndim) if ndim != 2 \
        else (function.sy, function.sx)
    pads = _tuple(getattr(function, 'pad', None), ndim) if ndim != 2 \
        else (function.ph, function.pw)
    dilations = (function.dy, function.dx) if ndim == 2 else _tuple(
        getattr(function, 'dilate', 1), ndim)
    cover_all = bool(getattr(function, 'cover_all', False))
    out_spatial = [conv.get_conv_outsize(size, k, s, p, cover_all=cover_all,
                                         d=d)
                   for size, k, s, p, d in zip(spatial_in, kernel, strides,
                                               pads, dilations)]
    return int(batch * out_channels * numpy.prod(out_spatial)
               * in_per_group * numpy.prod(kernel))


def _deconv_macs(x_shape, w_shape, groups):
    """Multiply-adds of one deconvolution: each input element is scattered
    through ``out_channels / groups * prod(kernel)`` weights."""
    batch, in_channels = x_shape[:2]
    out_per_group = w_shape[1]
    kernel = w_shape[2:]
    return int(batch * in_channels * numpy.prod(x_shape[2:]) * out_per_group
               * numpy.prod(kernel))


def _tuple(value, ndim):
    if value is None:
        return (1,) * ndim
    if isinstance(value, int):
        return (value,) * ndim
    return tuple(value)


class StageCostHook(chainer.FunctionHook):
    """Counts multiply-adds of convolution, deconvolution and linear nodes,
    and every function call.

    The counts go to ``stage`` (an index the caller sets before each stage
    runs). A node whose input is ``no_grad_input`` (the network input) is
    charged no input gradient in backward.

    Attributes:
        forward_macs (dict): Stage index -> forward multiply-adds.
        backward_macs (dict): Stage index -> backward multiply-adds.
        nodes (list): ``(stage, function name, forward macs)`` per node.
        calls (dict): Stage index -> function calls in the forward.
    """

    name = 'StageCostHook'

    def __init__(self):
        self.stage = 0
        self.no_grad_input = None
        self.forward_macs = {}
        self.backward_macs = {}
        self.nodes = []
        self.calls = {}

    def forward_preprocess(self, function, in_data):
        self.calls[self.stage] = self.calls.get(self.stage, 0) + 1
        label = function.label
        if label in CONV_FUNCTIONS:
            macs = _conv_macs(function, in_data[0].shape, in_data[1].shape)
        elif label in DECONV_FUNCTIONS:
            macs = _deconv_macs(in_data[0].shape, in_data[1].shape,
                                getattr(function, 'groups', 1))
        elif label in LINEAR_FUNCTIONS:
            x_shape, w_shape = in_data[0].shape, in_data[1].shape
            batch = int(numpy.prod(x_shape[:-1]))
            macs = int(batch * w_shape[0] * w_shape[1])
        else:
            return
        input_needs_grad = in_data[0] is not self.no_grad_input
        backward = macs * (2 if input_needs_grad else 1)
        self.forward_macs[self.stage] = (
            self.forward_macs.get(self.stage, 0) + macs)
        self.backward_macs[self.stage] = (
            self.backward_macs.get(self.stage, 0) + backward)
        self.nodes.append((self.stage, label, macs))


def stage_name(stage, index):
    """A readable name for a stage (its Link name or function name)."""
    name = getattr(stage, 'name', None)
    if name:
        return str(name)
    name = getattr(stage, '__name__', None)
    if name:
        return str(name)
    return '{}{}'.format(type(stage).__name__, index)


def stage_param_stats(model, stages=None):
    """Parameter bytes and array counts per stage.

    Parameters are assigned to stages as the runtime assigns them to chunks
    (:func:`cgdp_chainer.chunking.assign_parameters` with one stage per
    chunk): a parameter outside every stage's Link (e.g. a layer called from
    a plain-function stage, or a model-level parameter) counts with the
    lowest stage that uses it, or stage 0.

    Args:
        model (chainer.Link): A staged network, or a classifier around one.
        stages (list or None): Its stages (default: found on ``model``).

    Returns:
        list of dict: ``param_bytes`` and ``param_arrays`` per stage, in
        stage order. Uninitialised parameters count 0 bytes.
    """
    from cgdp_chainer import chunking
    if stages is None:
        stages = chunking.find_stages(model)
    chunks = [(i, i + 1) for i in range(len(stages))]
    names = chunking.assign_parameters(model, stages, chunks)
    params = dict(model.namedparams())
    stats = []
    for stage_names in names:
        arrays = [params[n].array for n in stage_names
                  if params[n].array is not None]
        stats.append({'param_bytes': int(sum(a.nbytes for a in arrays)),
                      'param_arrays': len(arrays)})
    return stats


def stage_costs(model, image_size=None, batch=1, channels=3, train=True,
                x=None):
    """Counts per-stage multiply-adds and parameter sizes of a staged network.

    Runs the stages once, on the model's device, at ``batch`` images of
    ``image_size`` px, without building a graph. Counts scale linearly with
    the batch size.

    Args:
        model (chainer.Link): A staged network (``model.stages``), or a
            classifier around one.
        image_size (int): Height and width of the input images.
        batch (int): Images per run (1 is enough: counts are per image times
            batch).
        channels (int): Input channels.
        train (bool): Run in training mode (auxiliary classifiers count).
        x (array or None): An input batch to count with instead of
            zero images (for networks whose input is not an image); its
            first axis is the batch.

    Returns:
        list of dict: Per stage: ``name``, ``forward_macs``,
        ``backward_macs`` (for ``batch`` images), ``forward_flops`` and
        ``backward_flops`` per image (2 FLOPs per multiply-add),
        ``param_bytes``, ``param_arrays``, ``forward_calls`` (Chainer
        function calls; the backward runs one backward per call, so it is
        taken to make as many) and ``counted_layers`` (convolution,
        deconvolution and linear calls).
    """
    from cgdp_chainer import chunking
    stages = chunking.find_stages(model)
    if stages is None:
        raise ValueError('{} has no stages (see docs/INTERFACES.md)'.format(
            type(model).__name__))
    if x is None:
        if image_size is None or image_size < 1 or batch < 1:
            raise ValueError('image_size and batch must be >= 1, got {!r} '
                             'and {!r}'.format(image_size, batch))
        x = numpy.zeros((batch, channels, image_size, image_size),
                        dtype=numpy.float32)
        x = model.device.send(x)
    batch = int(x.shape[0])
    hook = StageCostHook()
    hook.no_grad_input = x
    with chainer.using_config('train', train), \
            chainer.using_config('enable_backprop', False), \
            chainer.using_config('type_check', False), hook:
        h = x
        for index, stage in enumerate(stages):
            hook.stage = index
            h = stage(h)
    params = stage_param_stats(model, stages)
    costs = []
    for index, stage in enumerate(stages):
        forward = hook.forward_macs.get(index, 0)
        backward = hook.backward_macs.get(index, 0)
        costs.append({
            'name': stage_name(stage, index),
            'forward_macs': forward,
            'backward_macs': backward,
            'forward_flops': 2.0 * forward / batch,
            'backward_flops': 2.0 * backward / batch,
            'param_bytes': params[index]['param_bytes'],
            'param_arrays': params[index]['param_arrays'],
            'forward_calls': hook.calls.get(index, 0),
            'counted_layers': sum(1 for node in hook.nodes
                                  if node[0] == index),
        })
    return costs


def _models_source_hash():
    """Hash of the ``models`` package sources: the cache key's version part.
    """
    import models
    root = os.path.dirname(os.path.abspath(models.__file__))
    digest = hashlib.sha1()
    for dirpath, _, filenames in sorted(os.walk(root)):
        for filename in sorted(filenames):
            if filename.endswith('.py'):
                with open(os.path.join(dirpath, filename), 'rb') as f:
                    digest.update(filename.encode())
                    digest.update(f.read())
    return digest.hexdigest()[:16]


def cached_stage_costs(net, image_size, n_classes=1000, cache_path=None):
    """:func:`stage_costs` of ``models.get_model(net)``, cached on disk.

    Args:
        net (str): A name in ``models.NETWORKS``.
        image_size (int): Input height and width.
        n_classes (int): Classifier outputs.
        cache_path (str): JSON cache file (default
            ``results/costmodel/flops_cache.json``).

    Returns:
        list of dict: As :func:`stage_costs` (batch 1).
    """
    import models
    cache_path = cache_path or DEFAULT_CACHE
    key = '{}|{}|{}|{}|v{}'.format(net, image_size, n_classes,
                                   _models_source_hash(), RECORD_VERSION)
    cache = {}
    if os.path.exists(cache_path):
        try:
            with open(cache_path) as f:
                cache = json.load(f)
        except (OSError, ValueError):
            cache = {}
    if key in cache:
        return cache[key]
    model = models.get_model(net, n_classes=n_classes, seed=0)
    costs = stage_costs(model, image_size)
    cache[key] = costs
    directory = os.path.dirname(cache_path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    tmp = cache_path + '.tmp{}'.format(os.getpid())
    with open(tmp, 'w') as f:
        json.dump(cache, f, indent=1)
    os.replace(tmp, cache_path)
    return costs
