"""Cutting a staged network into chunks and running it chunk by chunk.

The CGDP runtime no longer uses this module: it hands chunks of layers over
as their gradients become ready during one ordinary backward, for any model
(:mod:`cgdp_chainer.runtime.readiness`). What is here serves the cost
model's per-stage profile (:mod:`cgdp_chainer.costmodel.profiler`) and its
workload description, for networks that declare stages.

A network exposes ``stages`` (see ``docs/INTERFACES.md``): callables whose
application in order is its forward pass. A *chunk* is a run of consecutive
stages. Running the forward with the graph cut between chunks lets the
backward proceed one chunk at a time, from the output end, so that each
chunk's parameter gradients are final as soon as its own backward ends.
"""
import chainer
from chainer import links


def find_stages(target):
    """Returns the stage list of a model, or ``None`` if it has none.

    Args:
        target (chainer.Link): The optimizer's target: a staged network, or
            a :class:`chainer.links.Classifier` around one.
    """
    predictor = target.predictor if isinstance(
        target, links.Classifier) else target
    stages = getattr(predictor, 'stages', None)
    return list(stages) if stages is not None else None


def find_head(target, loss_func):
    """Returns ``head(y, *labels) -> loss`` for a staged target.

    Args:
        target (chainer.Link): The optimizer's target.
        loss_func (callable or None): A user-given ``loss_func(y, *labels)``;
            it wins over the target's own head.

    Raises:
        ValueError: Neither ``loss_func`` nor a head can be found.
    """
    if loss_func is not None:
        return loss_func
    if hasattr(target, 'head'):
        return target.head
    if isinstance(target, links.Classifier):
        return _ClassifierHead(target)
    raise ValueError(
        '{} has stages but no way to compute a loss from their output: '
        'wrap it in chainer.links.Classifier or models.Classifier, or pass '
        'loss_func(y, *labels)'.format(type(target).__name__))


class _ClassifierHead(object):
    """What :meth:`chainer.links.Classifier.forward` does after the
    predictor: the loss, the accuracy, and their reports."""

    def __init__(self, classifier):
        self.classifier = classifier

    def __call__(self, y, t):
        c = self.classifier
        loss = c.lossfun(y, t)
        chainer.reporter.report({'loss': loss}, c)
        if c.compute_accuracy:
            chainer.reporter.report({'accuracy': c.accfun(y, t)}, c)
        return loss


def plan_chunks(n_stages, chunk_size):
    """Groups stage indices into chunks.

    Args:
        n_stages (int): Number of stages.
        chunk_size (int or sequence of int): Stages per chunk, grouped from
            the output end so that a shorter remainder chunk falls on the
            input side, whose sync is the one left exposed; or the indices
            at which chunks start (must begin with 0, strictly increasing).

    Returns:
        list of (int, int): ``(start, stop)`` stage ranges, input side first.

    Raises:
        ValueError: ``chunk_size`` is out of range or the boundaries are
            malformed.
    """
    if isinstance(chunk_size, (list, tuple)):
        starts = list(chunk_size)
        if (not starts or starts[0] != 0 or any(
                not isinstance(s, int) for s in starts) or any(
                b <= a for a, b in zip(starts, starts[1:]))
                or starts[-1] >= n_stages):
            raise ValueError(
                'chunk boundaries {!r} must be strictly increasing stage '
                'indices starting at 0 and below the number of stages '
                '({})'.format(starts, n_stages))
        stops = starts[1:] + [n_stages]
        return list(zip(starts, stops))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(
            'chunk_size must be an int from 1 to {}, a list of chunk '
            "boundaries, 'auto' or 'model'; got {!r}".format(
                n_stages, chunk_size))
    if not 1 <= chunk_size <= n_stages:
        raise ValueError(
            'chunk_size={} is out of range: the model has {} stages, so use '
            '1 to {}'.format(chunk_size, n_stages, n_stages))
    chunks = []
    stop = n_stages
    while stop > 0:
        start = max(0, stop - chunk_size)
        chunks.append((start, stop))
        stop = start
    return chunks[::-1]


def assign_parameters(model, stages, chunks):
    """Names of the parameters whose gradients each chunk finalizes.

    A parameter used by several chunks, or by no stage (a model-level
    parameter), goes to the lowest chunk: the last one whose backward ends,
    so its gradient is final when that chunk is handed over.

    Args:
        model (chainer.Link): The model that owns the stages.
        stages (list): ``model``'s stages.
        chunks (list of (int, int)): From :func:`plan_chunks`.

    Returns:
        list of list of str: Parameter paths (as in ``model.namedparams()``)
        per chunk, each in ``namedparams`` order.
    """
    names = {id(p): name for name, p in model.namedparams()}
    owner = {}
    for index, (start, stop) in enumerate(chunks):
        for stage in stages[start:stop]:
            if not isinstance(stage, chainer.Link):
                continue
            for param in stage.params():
                name = names.get(id(param))
                if name is None:
                    raise ValueError(
                        'a stage of {} holds a parameter that is not part '
                        'of the model'.format(type(model).__name__))
                owner[name] = min(owner.get(name, index), index)
    per_chunk = [[] for _ in chunks]
    for name in names.values():
        per_chunk[owner.get(name, 0)].append(name)
    return per_chunk


def flatten_carry(carry):
    """The Variables of a carry (a Variable or a tuple of them), in order."""
    if isinstance(carry, tuple):
        return list(carry)
    return [carry]


def cut_carry(carry):
    """Fresh leaf Variables holding the carry's values, same structure.

    The backward of the chunk before the cut stops at these leaves; their
    gradients are what it then receives.
    """
    def leaf(v):
        array = v.array if isinstance(v, chainer.Variable) else v
        return chainer.Variable(array, requires_grad=True)
    if isinstance(carry, tuple):
        return tuple(leaf(v) for v in carry)
    return leaf(carry)


class ChunkedPass(object):
    """Forward over all chunks with cuts between them, then chunk-wise
    backward from the output end.

    Args:
        stages (list): The replica's stages.
        chunks (list of (int, int)): From :func:`plan_chunks`.
        head (callable): ``head(y, *labels) -> loss``.
    """

    def __init__(self, stages, chunks, head):
        self.stages = stages
        self.chunks = chunks
        self.head = head
        self._inputs = None
        self._outputs = None
        self.loss = None

    def forward_chunk(self, index, carry):
        """Runs chunk ``index`` on ``carry`` (the previous chunk's output, or
        the input array for chunk 0) and returns its output."""
        if index == 0:
            self._inputs = [None] * len(self.chunks)
            self._outputs = [None] * len(self.chunks)
        else:
            carry = cut_carry(carry)
            self._inputs[index] = carry
        start, stop = self.chunks[index]
        for stage in self.stages[start:stop]:
            carry = stage(carry)
        self._outputs[index] = carry
        return carry

    def forward_head(self, labels):
        """Computes the loss from the last chunk's output."""
        self.loss = self.head(self._outputs[-1], *labels)
        return self.loss

    def backward_chunk(self, index):
        """Backward of chunk ``index``; call from the last chunk down to 0.

        Afterwards, the gradients of the chunk's parameters are final.
        """
        if index == len(self.chunks) - 1:
            self.loss.backward()
            self.loss = chainer.Variable(self.loss.array)  # drop the graph
        else:
            outputs = flatten_carry(self._outputs[index])
            received = flatten_carry(self._inputs[index + 1])
            roots, grads = [], []
            own_inputs = {id(v) for v in flatten_carry(self._inputs[index])} \
                if index > 0 else set()
            for out, leaf in zip(outputs, received):
                grad = leaf.grad_var
                if grad is None:
                    continue
                if id(out) in own_inputs and out.creator is None:
                    # Passed through the chunk unchanged (an auxiliary
                    # output riding along): hand the gradient on directly.
                    out.grad_var = grad if out.grad_var is None \
                        else out.grad_var + grad
                    continue
                roots.append(out)
                grads.append(grad)
            if roots:
                chainer.backward(roots, grads)
            self._inputs[index + 1] = None
        self._outputs[index] = None
