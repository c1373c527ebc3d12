#!/usr/bin/env python
"""Chainer 7.8.1's examples/vae/train_vae.py in its shape (the model and
its loss in vae_net.py, which is the example's net.py; a StandardUpdater
with ``loss_func=avg_elbo_loss``, whose loss samples z in every mode; an
Evaluator, DumpGraph, a snapshot, LogReport and PrintReport), on small
MNIST-shaped data, with the one-line switch to CGDP (``--updater cgdp``
over ``--devices``, with ``--workers``). The weights are drawn under seed 0
and the training's random numbers under ``--seed``; the iterator keeps its
order (``shuffle=False``) so that the runs see the same batches. The
script ends by saving the model, and instead of the example's images."""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
from chainer import training
from chainer.training import extensions
import numpy as np

import vae_net as net


def main():
    parser = argparse.ArgumentParser(description='Chainer example: VAE')
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--devices', type=str, nargs='*', default=['-1', '-1'])
    parser.add_argument('--workers', default='process')
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    parser.add_argument('--out', '-o', default='results')
    parser.add_argument('--epoch', '-e', default=2, type=int)
    parser.add_argument('--dim-z', '-z', default=4, type=int)
    parser.add_argument('--dim-h', default=32, type=int)
    parser.add_argument('--beta', default=1.0, type=float)
    parser.add_argument('--k', '-k', default=1, type=int)
    parser.add_argument('--batch-size', '-b', type=int, default=12)
    parser.add_argument('--seed', type=int, default=1)
    args = parser.parse_args()

    device = chainer.get_device(args.device)
    device.use()

    # Prepare VAE model, defined in net.py
    np.random.seed(0)  # the weights
    encoder = net.make_encoder(784, args.dim_z, args.dim_h)
    decoder = net.make_decoder(784, args.dim_z, args.dim_h)
    prior = net.make_prior(args.dim_z)
    avg_elbo_loss = net.AvgELBOLoss(encoder, decoder, prior,
                                    beta=args.beta, k=args.k)
    avg_elbo_loss.to_device(device)

    # Setup an optimizer
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(avg_elbo_loss)

    # Load the MNIST dataset
    train, test = chainer.datasets.get_mnist(withlabel=False)
    train, _ = chainer.datasets.split_dataset(train, 48)
    test, _ = chainer.datasets.split_dataset(test, 16)

    np.random.seed(args.seed)  # the training's random numbers
    train_iter = chainer.iterators.SerialIterator(train, args.batch_size,
                                                  shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, args.batch_size,
                                                 repeat=False, shuffle=False)

    # Set up an updater. StandardUpdater can explicitly specify a loss function
    # used in the training with 'loss_func' option
    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(
            train_iter, optimizer, devices=args.devices,
            loss_func=avg_elbo_loss, workers=args.workers)
    else:
        updater = training.updaters.StandardUpdater(
            train_iter, optimizer, device=device, loss_func=avg_elbo_loss)

    # Set up the trainer and extensions.
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    trainer.extend(extensions.Evaluator(
        test_iter, avg_elbo_loss, device=device))
    trainer.extend(extensions.DumpGraph('main/loss'))
    trainer.extend(extensions.snapshot(), trigger=(args.epoch, 'epoch'))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/reconstr', 'main/kl_penalty', 'elapsed_time']))

    # Run the training
    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'),
                                 avg_elbo_loss)


if __name__ == '__main__':
    main()
