#!/usr/bin/env python
"""Chainer 7.8.1's examples/imagenet/train_imagenet_data_parallel.py in its
shape (MultiprocessParallelUpdater, MomentumSGD, one iterator per device,
snapshot_object, observe_lr), with the one-line switch to CGDP
(``--updater cgdp``), MNIST-shaped images instead of ILSVRC2012 lists and a
tiny network. ``--updater standard`` trains MultiprocessParallelUpdater's
result on one device (see train_mnist_data_parallel_updater.py).
"""
import cgdp_chainer  # first, as the switch asks

import argparse
import sys

import numpy as np

import chainer
from chainer import training
from chainer.training import extensions
from chainer.training import updaters
import chainerx

import example_models
from equivalence import Concatenated


def main():
    parser = argparse.ArgumentParser(
        description='Learning convnet from ILSVRC2012 dataset')
    parser.add_argument('--batchsize', '-B', type=int, default=4)
    parser.add_argument('--epoch', '-E', type=int, default=1)
    parser.add_argument('--devices', '-d', type=str, nargs='*',
                        default=['0', '1', '2', '3'])
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--resume', '-r', default='')
    parser.add_argument('--val_batchsize', '-b', type=int, default=8)
    parser.add_argument('--test', action='store_true')
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    parser.set_defaults(test=False)
    args = parser.parse_args()
    np.random.seed(0)  # the weights

    devices = tuple([chainer.get_device(d) for d in args.devices])
    if any(device.xp is chainerx for device in devices):
        sys.stderr.write('This example does not support ChainerX devices.\n')
        sys.exit(1)

    model = example_models.TinyConvNet()

    train, val = chainer.datasets.get_mnist(ndim=3)
    train_iters = [
        chainer.iterators.SerialIterator(
            part, args.batchsize,
            order_sampler=chainer.iterators.ShuffleOrderSampler(
                np.random.RandomState(index)))
        for index, part in enumerate(chainer.datasets.split_dataset_n_random(
            train, len(devices), seed=0))]
    val_iter = chainer.iterators.SerialIterator(
        val, args.val_batchsize, repeat=False, shuffle=False)

    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(train_iters, optimizer,
                                           devices=devices)
    else:
        updater = updaters.StandardUpdater(Concatenated(train_iters),
                                           optimizer, device=devices[0])
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), args.out)

    if args.test:
        val_interval = 1, 'epoch'
        log_interval = 1, 'epoch'
    else:
        val_interval = 100000, 'iteration'
        log_interval = 1000, 'iteration'

    trainer.extend(extensions.Evaluator(val_iter, model, device=devices[0]),
                   trigger=val_interval)
    trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(), trigger=val_interval)
    trainer.extend(extensions.snapshot_object(
        model, 'model_iter_{.updater.iteration}'), trigger=val_interval)
    trainer.extend(extensions.LogReport(trigger=log_interval))
    trainer.extend(extensions.observe_lr(), trigger=log_interval)
    trainer.extend(extensions.PrintReport([
        'epoch', 'iteration', 'main/loss', 'validation/main/loss',
        'main/accuracy', 'validation/main/accuracy', 'lr'
    ]), trigger=log_interval)

    if args.resume:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == '__main__':
    main()
