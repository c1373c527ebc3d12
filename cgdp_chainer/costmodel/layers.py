"""Per-layer costs of any Chainer model, in the runtime's unit and order.

A *layer* is what the runtime's chunks are made of: a link that directly
owns parameters (:func:`cgdp_chainer.runtime.replica.readiness.count_layers`).
Layers are listed input side first, the reverse of the ready order that
:class:`~cgdp_chainer.runtime.replica.readiness.ReadinessBackward` reports (the
order in which the runtime's chunks form), so that the runtime's chunk ``c``
from the output end is the cost model's chunk ``n - 1 - c``.

Each forward function call belongs to the innermost layer being called, or,
outside every layer (an activation a parent Chain applies, the loss), to the
layer called last before it (to the first layer for what runs before any).
A layer's forward time is the time of its calls (each from the end of the
previous call, so the Python between calls counts); its backward time is the
time from the previous layer's gradients being final to its own, as the
readiness backward reports them: exactly when the runtime could hand it
over. Nothing cuts the graph. On a GPU the pass waits for the device
after each forward call and at each hand-over, so that time goes to the
layer that spent it (the waits cost a little time of their own).
"""
import hashlib
import json
import os
import time
import warnings

import chainer
import chainer.links  # NOQA: the records wrap a network in a Classifier
import numpy

from cgdp_chainer.costmodel import functions as functions_module
from cgdp_chainer.runtime.replica import readiness


def own_layers(target):
    """Paths of the links that directly own parameters, ``{link: path}``."""
    layers = {}
    owners = {readiness.owner_of(name) for name, _ in target.namedparams()}
    for path, link in target.namedlinks():
        if path in owners:
            layers[link] = path
    return layers


class _LayerTracker(chainer.LinkHook):
    """Keeps the stack of layers being called and the last one called."""

    name = 'CostModelLayerTracker'

    def __init__(self, layers):
        self._layers = layers
        self.stack = []
        self.last = None

    def forward_preprocess(self, args):
        path = self._layers.get(args.link)
        if path is not None:
            self.stack.append(path)
            self.last = path

    def forward_postprocess(self, args):
        if args.link in self._layers:
            self.stack.pop()

    @property
    def current(self):
        """The layer a function called now belongs to (None: not yet
        known; it goes to the first layer called)."""
        return self.stack[-1] if self.stack else self.last


class _PassTimer(chainer.FunctionHook):
    """Times each forward call and counts backward calls per layer."""

    name = 'CostModelPassTimer'

    def __init__(self, tracker, sync):
        self._tracker = tracker
        self._sync = sync
        self.in_backward = False
        self.forward_s = {}
        self.forward_calls = {}
        self.backward_calls = {}
        self.layer_of_node = {}
        self._mark = None

    def start(self):
        self._sync()
        self._mark = time.perf_counter()

    def forward_preprocess(self, function, in_data):
        if self.in_backward:
            return
        node = getattr(function, 'node', function)
        layer = self._tracker.current
        self.layer_of_node[id(node)] = layer
        self.forward_calls[layer] = self.forward_calls.get(layer, 0) + 1

    def forward_postprocess(self, function, in_data):
        if self.in_backward:
            return
        self._sync()
        now = time.perf_counter()
        layer = self._tracker.current
        self.forward_s[layer] = self.forward_s.get(layer, 0.0) + (
            now - self._mark)
        self._mark = now

    def backward_preprocess(self, function, in_data, out_grad):
        layer = self.layer_of_node.get(id(function))
        self.backward_calls[layer] = self.backward_calls.get(layer, 0) + 1


def _first_layer_fix(per_layer, first):
    """Moves what was counted before any layer (key None) to ``first``."""
    if None in per_layer:
        per_layer[first] = per_layer.get(first, 0) + per_layer.pop(None)
    return per_layer


def run_pass(target, in_arrays, loss_func, sync, layers):
    """One timed forward and readiness backward.

    Args:
        target (chainer.Link): The model.
        in_arrays (tuple): Its inputs.
        loss_func (callable or None): ``loss_func(*in_arrays)``; default
            the target.
        sync (callable): Waits for the device.
        layers (dict): :func:`own_layers` of ``target``.

    Returns:
        dict: ``order`` (layer paths, backward order), ``forward_s``,
        ``backward_s``, ``forward_calls``, ``backward_calls`` (dicts by
        layer path).
    """
    tracker = _LayerTracker(layers)
    timer = _PassTimer(tracker, sync)
    lossfun = loss_func or target
    target.cleargrads()
    with chainer.using_config('train', True), \
            chainer.using_config('enable_backprop', True), tracker, timer:
        timer.start()
        loss = lossfun(*in_arrays)
        first = next((k for k in timer.forward_calls if k is not None),
                     None)
        ready_at = {}

        def on_ready(name, used):
            sync()
            ready_at[name] = time.perf_counter()
        backward = readiness.ReadinessBackward(target.namedparams())
        timer.in_backward = True
        sync()
        start = time.perf_counter()
        report = backward.backward(loss, on_ready)
        sync()
        end = time.perf_counter()
    del loss
    plan = readiness.ChunkPlan.from_ready_order(report.order, report.unused,
                                                chunk_size=1)
    order = [chunk[0] for chunk in plan.layers]
    backward_s = {}
    previous = start
    for path, names in zip(order, plan.chunks):
        if all(n in report.unused for n in names):
            backward_s[path] = 0.0
            continue
        done = max(ready_at[n] for n in names)
        backward_s[path] = max(0.0, done - previous)
        previous = max(previous, done)
    used = [p for p in order if backward_s[p] > 0.0] or order
    # The backward past the last parameter (to the input) is the input
    # side layer's.
    backward_s[used[-1]] += max(0.0, end - previous)
    first = first or order[-1]
    return {'order': order,
            'forward_s': _first_layer_fix(timer.forward_s, first),
            'backward_s': backward_s,
            'forward_calls': _first_layer_fix(timer.forward_calls, first),
            'backward_calls': _first_layer_fix(timer.backward_calls, first)}


def function_costs_by_layer(target, in_arrays, loss_func=None):
    """Per layer, the :class:`~cgdp_chainer.costmodel.functions.FunctionCost`
    of each of its forward calls (attributed as in the module docstring).

    Args:
        target (chainer.Link): The model.
        in_arrays (tuple): Its inputs (the first is the network input,
            which needs no gradient).
        loss_func (callable or None): ``loss_func(*in_arrays)``.

    Returns:
        dict: Layer path -> list of FunctionCost.
    """
    layers = own_layers(target)
    tracker = _LayerTracker(layers)
    hook = functions_module.FunctionCostHook(no_grad_inputs=in_arrays[:1])

    class _Tagger(chainer.FunctionHook):
        name = 'CostModelTagger'

        def forward_preprocess(self, function, in_data):
            hook.tag = tracker.current

    lossfun = loss_func or target
    # The tagger must run before the cost hook: hooks run in the order
    # they were entered.
    with chainer.using_config('train', True), \
            chainer.using_config('enable_backprop', True), tracker, \
            _Tagger(), hook:
        loss = lossfun(*in_arrays)
    costs = hook.costs()
    del loss
    first = next((t for t in hook.tags if t is not None), None)
    by_layer = {}
    for tag, cost in zip(hook.tags, costs):
        by_layer.setdefault(tag if tag is not None else first, []).append(
            cost)
    target.cleargrads()
    return by_layer


def parameter_stats(target):
    """Parameter bytes and arrays per layer path."""
    stats = {}
    for name, param in target.namedparams():
        path = readiness.owner_of(name)
        entry = stats.setdefault(path, {'param_bytes': 0, 'param_arrays': 0})
        if param.array is not None:
            entry['param_bytes'] += int(param.array.nbytes)
            entry['param_arrays'] += 1
    return stats


def function_records(costs, batch):
    """A layer's function costs as the profile stores them, per image where
    they grow with the batch.

    Returns:
        list of dict: ``kind``, ``flops``, ``bytes``, ``backward_flops``,
        ``backward_bytes`` (per image) and ``param_bytes`` (per call, read
        once whatever the batch; backward reads and writes twice as much).
    """
    records = []
    for c in costs:
        fixed = c.param_bytes
        records.append({
            'label': c.label, 'kind': c.kind,
            'flops': c.flops / float(batch),
            'bytes': max(0, c.bytes_read + c.bytes_written - fixed)
            / float(batch),
            'backward_flops': c.backward_flops / float(batch),
            'backward_bytes': max(0, c.backward_bytes - 2 * fixed)
            / float(batch),
            'param_bytes': fixed})
    return records


def add_function_costs(records, target, in_arrays, loss_func=None):
    """Adds each layer's function costs to its record (in place).

    Each record gets ``functions`` (see :func:`function_records`),
    ``forward_flops`` and ``backward_flops`` (per image, every function),
    ``counted_layers`` (its matrix products), ``param_bytes`` and
    ``param_arrays``.

    Args:
        records (list of dict): Layer records with ``name`` (the path).
        target (chainer.Link): The model.
        in_arrays (tuple): ``(x, labels...)``.
        loss_func (callable or None): ``loss_func(*in_arrays)``.

    Returns:
        list of dict: ``records``.
    """
    batch = int(in_arrays[0].shape[0])
    costs = function_costs_by_layer(target, in_arrays, loss_func)
    params = parameter_stats(target)
    for record in records:
        functions = function_records(costs.get(record['name'], []), batch)
        record['functions'] = functions
        record['forward_flops'] = sum(f['flops'] for f in functions)
        record['backward_flops'] = sum(f['backward_flops']
                                       for f in functions)
        record['counted_layers'] = sum(1 for f in functions
                                       if f['kind'] == 'matmul')
        record.update(params.get(record['name'],
                                 {'param_bytes': 0, 'param_arrays': 0}))
    return records


def layer_costs(target, in_arrays, loss_func=None, progress=None):
    """Layer records without times: one untimed pass for the ready order
    and the call counts, then the function costs.

    Args:
        target (chainer.Link): The model, its parameters initialised.
        in_arrays (tuple): ``(x, labels...)``.
        loss_func (callable or None): ``loss_func(*in_arrays)``.
        progress (callable or None): ``progress(text)`` is told each stage
            as it starts.

    Returns:
        list of dict: Per layer, input side first: ``index``, ``name``,
        ``forward_calls``, ``backward_calls`` and what
        :func:`add_function_costs` adds.
    """
    progress = progress or (lambda text: None)
    progress('finding the layers: forward and backward 1/2')
    result = run_pass(target, in_arrays, loss_func, lambda: None,
                      own_layers(target))
    target.cleargrads()
    records = [{'index': i, 'name': path,
                'forward_calls': result['forward_calls'].get(path, 0),
                'backward_calls': result['backward_calls'].get(path, 0)}
               for i, path in enumerate(reversed(result['order']))]
    progress('counting FLOPs and bytes of {} layers: forward 2/2'.format(
        len(records)))
    return add_function_costs(records, target, in_arrays, loss_func)


def probed_layer_costs(probed, progress=None):
    """:func:`layer_costs` of a probed model at batch 1, on its samples
    (:mod:`cgdp_chainer.costmodel.samples`); NumPy's global random state
    (dropout) is left as it was.

    Args:
        probed (ProbedModel): The model.
        progress (callable or None): As :func:`layer_costs`.

    Returns:
        list of dict: As :func:`layer_costs`.
    """
    chain = probed.loss_chain
    saved = numpy.random.get_state()
    try:
        with warnings.catch_warnings():
            # One example makes batch normalization warn that its output
            # is zero: true, and no matter for counting.
            warnings.simplefilter('ignore')
            return layer_costs(chain, probed.in_arrays(1, chain.device),
                               progress=progress)
    finally:
        numpy.random.set_state(saved)


DEFAULT_CACHE = os.path.join('results', 'costmodel', 'layer_cache.json')
# Part of the cache key: a new field in the records makes old entries stale.
RECORD_VERSION = 3


def _models_source_hash():
    """Hash of the ``cgdp_chainer.models`` package and of this package's
    counting code: the cache key's version part."""
    from cgdp_chainer import models
    digest = hashlib.sha1()
    roots = [os.path.dirname(os.path.abspath(models.__file__))]
    files = [os.path.abspath(__file__), functions_module.__file__]
    for root in roots:
        for dirpath, _, filenames in sorted(os.walk(root)):
            files.extend(os.path.join(dirpath, f) for f in sorted(filenames)
                         if f.endswith('.py'))
    for path in files:
        with open(path, 'rb') as f:
            digest.update(os.path.basename(path).encode())
            digest.update(f.read())
    return digest.hexdigest()[:16]


def _records_of(net, image_size, n_classes):
    from cgdp_chainer import models
    if isinstance(net, str):
        net = models.get_model(net, n_classes=n_classes, seed=0)
    target = net if isinstance(net, chainer.links.Classifier) else \
        models.Classifier(net)
    x = numpy.zeros((1, 3, image_size, image_size), dtype=numpy.float32)
    t = numpy.zeros(1, dtype=numpy.int32)
    saved = numpy.random.get_state()
    try:
        return layer_costs(target, (target.device.send(x),
                                    target.device.send(t)))
    finally:
        numpy.random.set_state(saved)


def cached_layer_costs(net, image_size, n_classes=1000, cache_path=None):
    """:func:`layer_costs` of a network at batch 1, cached on disk for the
    project's named networks.

    Args:
        net (str or chainer.Link): A name in ``models.NETWORKS``, or a
            network mapping images to class scores (not cached).
        image_size (int): Input height and width.
        n_classes (int): Classifier outputs.
        cache_path (str): JSON cache file (default
            ``results/costmodel/layer_cache.json``).

    Returns:
        list of dict: As :func:`layer_costs`.
    """
    if not isinstance(net, str):
        return _records_of(net, image_size, n_classes)
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
    records = _records_of(net, image_size, n_classes)
    cache[key] = records
    directory = os.path.dirname(cache_path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    tmp = cache_path + '.tmp{}'.format(os.getpid())
    with open(tmp, 'w') as f:
        json.dump(cache, f)
    os.replace(tmp, cache_path)
    return records
