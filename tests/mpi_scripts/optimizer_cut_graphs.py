"""Cut graphs and hooks without a fused form, against ChainerMN, in one job.

Run: mpiexec -n 2 python tests/mpi_scripts/optimizer_cut_graphs.py

Every case trains one model twice on the same per-rank batches, with
``chainermn.create_multi_node_optimizer`` and with
``cgdp_chainer.create_multi_node_optimizer``, and compares the parameters
(and ``param.grad``) on every rank:

* ``unchained``: the first layer's output is cut with
  ``unchain_backward()`` (FCIS's extractor after res2), so that layer's
  chunk is complete before the backward starts; also with that layer
  frozen (``disable_update()``), and with a host per rank;
* ``sometimes``: a branch used only in odd iterations, so its parameters
  have no gradient in the others (ChainerMN's zero fill: a zero gradient,
  which still moves them under momentum and weight decay);
* ``scaled``: ChainerCV's ``GradientScaling`` (in tests/any_models.py:
  ChainerCV is not a dependency) on the output layer's parameters, which
  must keep the update fused and the node's host shared.

Each case runs in both call forms: ``optimizer.update(lossfun, ...)`` and
``loss.backward(); optimizer.update()``.
"""
import os
import sys

import _common  # first: it imports cgdp_chainer before Chainer
from _common import cgdp_mpi

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

import cgdp_chainer  # NOQA: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from any_models import GradientScaling  # NOQA: E402

ITERATIONS = 5
N_IN, N_HIDDEN, N_OUT = 6, 8, 4


class CutModel(chainer.Chain):
    """Three layers; ``cut``: the first one's output is unchained;
    ``sometimes``: the middle layer runs in odd calls only."""

    def __init__(self, kind):
        super(CutModel, self).__init__()
        random = numpy.random.RandomState(0)
        sizes = [(N_IN, N_HIDDEN), (N_HIDDEN, N_HIDDEN), (N_HIDDEN, N_OUT)]
        with self.init_scope():
            self.l1, self.l2, self.l3 = [
                L.Linear(n_in, n_out, initialW=random.normal(
                    0, 0.4, (n_out, n_in)).astype(numpy.float32),
                    initial_bias=random.normal(0, 0.1, n_out).astype(
                        numpy.float32))
                for n_in, n_out in sizes]
        self.kind = kind
        self.calls = 0

    def forward(self, x, t):
        h = F.relu(self.l1(x))
        if self.kind == 'unchained':
            h.unchain_backward()
        if self.kind != 'sometimes' or self.calls % 2 == 1:
            h = F.tanh(self.l2(h))
        self.calls += 1
        return F.softmax_cross_entropy(self.l3(h), t)


def build(kind, create, frozen=False, **options):
    model = CutModel(kind)
    optimizer = create(chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9),
                       COMM, **options)
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(1e-2))
    if kind == 'scaled':
        for param in model.l3.params():
            param.update_rule.add_hook(GradientScaling(3.0))
    if frozen:
        model.l1.disable_update()
    return model, optimizer


def batch(step):
    random = numpy.random.RandomState(100 * COMM.rank + step)
    return (random.uniform(-1, 1, (5, N_IN)).astype(numpy.float32),
            random.randint(0, N_OUT, 5).astype(numpy.int32))


def train(kind, create, form, frozen=False, **options):
    model, optimizer = build(kind, create, frozen, **options)
    for step in range(ITERATIONS):
        x, t = batch(step)
        if form == 'lossfun':
            optimizer.update(model, x, t)
        else:
            loss = model(x, t)
            model.cleargrads()
            loss.backward()
            optimizer.update()
    return model, optimizer


def compare(kind, form, frozen=False, **options):
    expected, _ = train(kind, chainermn.create_multi_node_optimizer, form,
                        frozen)
    actual, optimizer = train(
        kind, cgdp_chainer.create_multi_node_optimizer, form, frozen,
        **options)
    _common.assert_same_parameters(actual, expected)
    theirs = dict(expected.namedparams())
    for name, param in actual.namedparams():
        numpy.testing.assert_allclose(
            param.grad, theirs[name].grad, rtol=1e-5, atol=1e-7,
            err_msg='{} {}: grad of {}'.format(kind, form, name))
    initial = dict(CutModel(kind).namedparams())
    moved = [name for name, param in actual.namedparams()
             if not numpy.array_equal(param.array, initial[name].array)]
    shared = optimizer.shares_node_host
    optimizer.close()
    return moved, shared


def main():
    global COMM
    world = _common.start_mpi()
    COMM = chainermn.create_communicator('naive', mpi_comm=world)
    lines = []
    with cgdp_mpi.abort_on_exception(world):
        for form in ('lossfun', 'backward'):
            moved, shared = compare('unchained', form)
            # Weight decay moves the cut layer, as ChainerMN's zero fill.
            assert '/l1/W' in moved and shared, (moved, shared)
            moved, _ = compare('unchained', form, frozen=True)
            assert '/l1/W' not in moved and '/l2/W' in moved, moved
            compare('unchained', form, node_host=False)
            moved, _ = compare('sometimes', form)
            assert '/l2/W' in moved, moved
            moved, shared = compare('scaled', form)
            assert shared, 'GradientScaling made every rank keep a host'
            compare('scaled', form, node_host=False)
            lines.append('{}: equal to ChainerMN'.format(form))
        _common.report_ok(world, 'optimizer-cut-graphs', lines)


if __name__ == '__main__':
    main()
