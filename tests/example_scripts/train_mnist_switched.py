#!/usr/bin/env python
"""Chainer 7.8.1's examples/mnist/train_mnist.py in its shape (one device
given by -d, StandardUpdater, an Evaluator called before training, every
extension of the example), with its updater line switched to CGDP
(``--updater cgdp``: ``CGDPUpdater(train_iter, optimizer,
devices=[device])``) and small sizes."""
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


def _seed(device):
    """Both runs start from the same random state: the lazy layers draw
    their first weights from it (CuPy's on a GPU) and the iterator its
    order (NumPy's)."""
    numpy.random.seed(0)
    if device.xp is not numpy and device.xp is not chainerx:
        import cupy
        cupy.random.seed(0)


def _parse():
    parser = argparse.ArgumentParser(description='Chainer example: MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=12)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--frequency', '-f', type=int, default=-1)
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--resume', '-r', type=str)
    parser.add_argument('--autoload', action='store_true')
    parser.add_argument('--unit', '-u', type=int, default=16)
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    parser.add_argument('--workers', choices=('process', 'thread'),
                        default='process')
    return parser.parse_args()


def _extend(trainer, test_iter, model, device, args):
    """The example's extensions, with its triggers."""
    trainer.extend(extensions.Evaluator(test_iter, model, device=device),
                   call_before_training=True)
    if device.xp is not chainerx:
        trainer.extend(extensions.DumpGraph('main/loss'))
    frequency = args.epoch if args.frequency == -1 else max(1, args.frequency)
    trainer.extend(extensions.snapshot(n_retains=1, autoload=args.autoload),
                   trigger=(frequency, 'epoch'))
    trainer.extend(extensions.LogReport(), call_before_training=True)
    if extensions.PlotReport.available():
        for kind in ('loss', 'accuracy'):
            trainer.extend(extensions.PlotReport(
                ['main/' + kind, 'validation/main/' + kind], 'epoch',
                file_name=kind + '.png'), call_before_training=True)
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy', 'elapsed_time']),
        call_before_training=True)
    trainer.extend(extensions.ProgressBar())


def main():
    args = _parse()
    device = chainer.get_device(args.device)
    print('Device: {}'.format(device))
    _seed(device)

    model = L.Classifier(example_models.LazyMLP(args.unit, 10))
    model.to_device(device)
    device.use()
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize,
                                                 repeat=False, shuffle=False)

    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(train_iter, optimizer,
                                           devices=[device],
                                           workers=args.workers)
    else:
        updater = training.updaters.StandardUpdater(
            train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    _extend(trainer, test_iter, model, device, args)

    if args.resume is not None:
        chainer.serializers.load_npz(args.resume, trainer)
    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
