"""The recursive network of Chainer 7.8.1's examples/sentiment/
train_sentiment.py, and small synthetic trees in its data's form
(picklable: CGDP's worker processes import them)."""
import collections

import chainer
from chainer.backends import cuda
import chainer.functions as F
import chainer.links as L
from chainer import reporter
import numpy as np


class RecursiveNet(chainer.Chain):
    """The example's model: its loss adds up over the trees of the batch
    (and over the nodes of each), and it reports the node counts."""

    def __init__(self, n_vocab, n_units, n_label):
        super(RecursiveNet, self).__init__()
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units)
            self.l = L.Linear(n_units * 2, n_units)
            self.w = L.Linear(n_units, n_label)

    def forward(self, x):
        accum_loss = 0.0
        result = collections.defaultdict(lambda: 0)
        for tree in x:
            loss, _ = self.traverse(tree, evaluate=result)
            accum_loss += loss

        reporter.report({'loss': accum_loss}, self)
        reporter.report({'total': result['total_node']}, self)
        reporter.report({'correct': result['correct_node']}, self)
        return accum_loss

    def leaf(self, x):
        return self.embed(x)

    def node(self, left, right):
        return F.tanh(self.l(F.concat((left, right))))

    def label(self, v):
        return self.w(v)

    def traverse(self, node, evaluate, root=True):
        if isinstance(node['node'], int):
            word = self.xp.array([node['node']], np.int32)
            loss = 0
            v = self.leaf(word)
        else:
            left_node, right_node = node['node']
            left_loss, left = self.traverse(
                left_node, evaluate=evaluate, root=False)
            right_loss, right = self.traverse(
                right_node, evaluate=evaluate, root=False)
            v = self.node(left, right)
            loss = left_loss + right_loss

        y = self.label(v)

        label = self.xp.array([node['label']], np.int32)
        t = chainer.Variable(label, requires_grad=False)
        loss += F.softmax_cross_entropy(y, t)

        predict = cuda.to_cpu(y.array.argmax(1))
        if predict[0] == node['label']:
            evaluate['correct_node'] += 1
        evaluate['total_node'] += 1

        if root:
            if predict[0] == node['label']:
                evaluate['correct_root'] += 1
            evaluate['total_root'] += 1

        return loss, v


def random_tree(rng, n_vocab, n_label, depth=0):
    """A tree in the form of the example's ``convert_tree``: leaves
    ``{'label', 'node': word}``, inner nodes ``{'label', 'node': (left,
    right)}``."""
    label = int(rng.randint(n_label))
    if depth >= 2 or rng.rand() < 0.3:
        return {'label': label, 'node': int(rng.randint(n_vocab))}
    return {'label': label, 'node': (
        random_tree(rng, n_vocab, n_label, depth + 1),
        random_tree(rng, n_vocab, n_label, depth + 1))}
