#!/usr/bin/env python
"""Chainer 7.8.1's examples/static_graph_optimizations/mnist/train_mnist.py
in its shape (an MLP whose ``__call__`` is ``@static_graph``, lazily
initialized layers, StandardUpdater, an Evaluator of the model), with the
one-line switch to CGDP (``--updater cgdp``; ``--workers`` picks its worker
kind) and small sizes. The script ends by saving the model, so that the
two runs' parameters can be compared.
"""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import static_graph
from chainer import training
from chainer.training import extensions
import numpy


# Network definition
class MLP(chainer.Chain):

    """A fully-connected neural network for digit classification.

    """

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            # the size of the inputs to each layer will be inferred
            self.l1 = L.Linear(None, n_units)  # n_in -> n_units
            self.l2 = L.Linear(None, n_units)  # n_units -> n_units
            self.l3 = L.Linear(None, n_out)  # n_units -> n_out

    @static_graph
    def __call__(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def main():
    parser = argparse.ArgumentParser(description='Chainer example: MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=12)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--unit', '-u', type=int, default=16)
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    parser.add_argument('--workers', choices=('process', 'thread'),
                        default='process')
    args = parser.parse_args()
    numpy.random.seed(0)  # the weights and the iterator's shuffles

    device = chainer.get_device(args.device)
    print('Device: {}'.format(device))
    device.use()

    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)

    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize,
                                                 repeat=False, shuffle=False)

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(
            train_iter, optimizer, devices=[device, device],
            workers=args.workers)
    else:
        updater = training.updaters.StandardUpdater(
            train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # The model's own calls in test mode: its static schedule, built at the
    # first evaluation and replayed at the next.
    trainer.extend(extensions.Evaluator(test_iter, model, device=device))
    trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(), trigger=(args.epoch, 'epoch'))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy', 'elapsed_time']))

    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
