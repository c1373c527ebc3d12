#!/usr/bin/env python
"""Chainer 7.8.1's examples/mnist/train_mnist_data_parallel.py in its shape
(ParallelUpdater, devices={'main': ..., 'second': ...}), with the one-line
switch to CGDP (``--updater cgdp``) and small sizes."""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
import chainer.links as L
from chainer import training
from chainer.training import extensions
import chainerx
import numpy

import example_models


def main():
    parser = argparse.ArgumentParser(description='Chainer example: MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=12)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--out', '-o', default='result_data_parallel')
    parser.add_argument('--resume', '-r', default='')
    parser.add_argument('--unit', '-u', type=int, default=16)
    parser.add_argument('--device0', '-d', type=str, default='0')
    parser.add_argument('--device1', '-D', type=str, default='1')
    parser.add_argument('--updater', choices=('parallel', 'cgdp'),
                        default='cgdp')
    args = parser.parse_args()
    numpy.random.seed(0)  # the weights
    device0 = chainer.get_device(args.device0)
    device1 = chainer.get_device(args.device1)
    print('Devices: {}, {}'.format(device0, device1))

    device0.use()

    model = L.Classifier(example_models.MLP(args.unit, 10))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize,
                                                 shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize,
                                                 repeat=False, shuffle=False)

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(
            train_iter,
            optimizer,
            devices={'main': device0, 'second': device1},
        )
    else:
        updater = training.updaters.ParallelUpdater(
            train_iter,
            optimizer,
            devices={'main': device0, 'second': device1},
        )
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    trainer.extend(extensions.Evaluator(test_iter, model, device=device0))
    if device0.xp is not chainerx:
        trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(), trigger=(args.epoch, 'epoch'))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy', 'elapsed_time']))

    if args.resume:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
