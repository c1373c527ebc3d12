#!/usr/bin/env python
"""Chainer 7.8.1's examples/mnist/train_mnist_data_parallel_updater.py in
its shape (MultiprocessParallelUpdater, one iterator per device), with the
one-line switch to CGDP (``--updater cgdp``) and small sizes.

MultiprocessParallelUpdater needs GPUs; ``--updater standard`` trains what
it computes (summed gradients with ``lr / N``, Adam's ``eps * N``: the mean
with the user's hyperparameters) on one device, StandardUpdater on the
concatenated batches. SerialIterators with their own order samplers stand
in for the example's MultiprocessIterators, so that the two runs see the
same batches.
"""
import cgdp_chainer  # first, as the switch asks

import argparse
import os
import sys

import chainer
import chainer.links as L
from chainer import training
from chainer.training import extensions
import chainerx
import numpy

import example_models
from equivalence import Concatenated


def main():
    parser = argparse.ArgumentParser(description='Chainer example: MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=6)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--out', '-o', default='result_data_parallel')
    parser.add_argument('--resume', '-r', default='')
    parser.add_argument('--unit', '-u', type=int, default=16)
    parser.add_argument('--devices', '-d', type=str, nargs='*',
                        default=['0', '1', '2', '3'])
    parser.add_argument('--ljob', '-j', type=int, default=4)
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    args = parser.parse_args()
    numpy.random.seed(0)  # the weights

    devices = tuple([chainer.get_device(d) for d in args.devices])
    if any(device.xp is chainerx for device in devices):
        sys.stderr.write('This example does not support ChainerX devices.\n')
        sys.exit(1)
    print('Devices: {}'.format(args.devices))

    model = L.Classifier(example_models.MLP(args.unit, 10))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train, test = chainer.datasets.get_mnist()

    train_iters = [
        chainer.iterators.SerialIterator(
            part, args.batchsize,
            order_sampler=chainer.iterators.ShuffleOrderSampler(
                numpy.random.RandomState(index)))
        for index, part in enumerate(chainer.datasets.split_dataset_n_random(
            train, args.ljob, seed=0))]
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(train_iters, optimizer,
                                           devices=(devices))
    else:
        updater = training.updaters.StandardUpdater(
            Concatenated(train_iters), optimizer, device=devices[0])

    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    trainer.extend(extensions.Evaluator(test_iter, model, device=devices[0]))
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
