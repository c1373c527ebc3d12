#!/usr/bin/env python
"""Chainer 7.8.1's examples/sentiment/train_sentiment.py in its shape (a
recursive network whose loss adds up over the trees, StandardUpdater with
the example's converter, MicroAverage over the reported node counts), on
small synthetic trees, with the one-line switch to CGDP (``--updater
cgdp`` over ``--devices``). The iterator keeps its order (``shuffle=False``)
so that the two runs see the same batches."""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
from chainer import optimizers
from chainer.training import extensions
import numpy as np

import sentiment_models


@chainer.dataset.converter()
def convert(batch, _):
    return batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--devices', type=str, nargs='*', default=['-1'])
    parser.add_argument('--out', '-o', default='result', type=str)
    parser.add_argument('--epoch', '-e', default=2, type=int)
    parser.add_argument('--unit', '-u', default=6, type=int)
    parser.add_argument('--batchsize', '-b', type=int, default=6)
    parser.add_argument('--label', '-l', type=int, default=5)
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    args = parser.parse_args()

    rng = np.random.RandomState(0)
    n_vocab = 10
    train_data = [sentiment_models.random_tree(rng, n_vocab, args.label)
                  for _ in range(24)]
    train_iter = chainer.iterators.SerialIterator(train_data, args.batchsize,
                                                 shuffle=False)

    np.random.seed(0)  # the weights
    device = chainer.get_device(args.device)
    device.use()
    model = sentiment_models.RecursiveNet(n_vocab, args.unit, args.label)
    model.to_device(device)

    optimizer = optimizers.AdaGrad(lr=0.1)
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(0.0001))

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(
            train_iter, optimizer, converter=convert, devices=args.devices)
    else:
        updater = chainer.training.StandardUpdater(
            train_iter, optimizer, converter=convert, device=device)

    trainer = chainer.training.Trainer(updater, (args.epoch, 'epoch'),
                                       args.out)
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.MicroAverage(
        'main/correct', 'main/total', 'main/accuracy'))
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'main/accuracy', 'elapsed_time']))
    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
