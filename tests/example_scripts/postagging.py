#!/usr/bin/env python
"""Chainer 7.8.1's examples/pos/postagging.py in its shape (a CRF tagger
defined in the script, whose forward loops over ``six.moves.zip`` and
reports integer counts that MicroAverage divides, a converter returning
lists of sentences of different lengths, an Evaluator), on small synthetic
sentences instead of the Brown corpus, with the one-line switch to CGDP
(``--updater cgdp`` over ``--devices``). The iterator keeps its order
(``shuffle=False``) so that the two runs see the same batches."""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
from chainer import datasets
import chainer.links as L
from chainer import reporter
from chainer import training
from chainer.training import extensions
import numpy
import six


class CRF(chainer.Chain):

    def __init__(self, n_vocab, n_pos):
        super(CRF, self).__init__()
        with self.init_scope():
            self.feature = L.EmbedID(n_vocab, n_pos)
            self.crf = L.CRF1d(n_pos)

    def forward(self, xs, ys):
        # h[i] is feature vector for each batch of words.
        hs = [self.feature(x) for x in xs]
        loss = self.crf(hs, ys, transpose=True)
        reporter.report({'loss': loss}, self)

        # To predict labels, call argmax method.
        _, predict = self.crf.argmax(hs, transpose=True)
        correct = 0
        total = 0
        # six.moves is a lazily loaded module object (six._MovedItems),
        # reached through this function's globals: worker processes import
        # it by name.
        for y, p in six.moves.zip(ys, predict):
            # NOTE y is ndarray because
            # it does not pass to transpose_sequence
            correct += self.xp.sum(y == p)
            total += len(y)
        reporter.report({'correct': correct}, self)
        reporter.report({'total': total}, self)

        return loss

    def argmax(self, xs):
        hs = [self.feature(x) for x in xs]
        return self.crf.argmax(hs, transpose=True)


@chainer.dataset.converter()
def convert(batch, device):
    sentences = [
        chainer.dataset.to_device(device, sentence) for sentence, _ in batch]
    poses = [chainer.dataset.to_device(device, pos) for _, pos in batch]
    return {'xs': sentences, 'ys': poses}


def synthetic_sentences(n, n_vocab, n_pos, seed=0):
    """Sentences of 2 to 6 words whose tag follows the word, mostly."""
    rng = numpy.random.RandomState(seed)
    data = []
    for _ in range(n):
        xs = rng.randint(0, n_vocab, rng.randint(2, 7)).astype(numpy.int32)
        noise = rng.randint(0, n_pos, len(xs))
        ys = numpy.where(rng.rand(len(xs)) < 0.8, xs % n_pos,
                         noise).astype(numpy.int32)
        data.append((xs, ys))
    return data


def main():
    parser = argparse.ArgumentParser(
        description='Chainer example: POS-tagging')
    parser.add_argument('--batchsize', '-b', type=int, default=6)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--devices', type=str, nargs='*', default=['-1'])
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    args = parser.parse_args()

    n_vocab, n_pos = 12, 4
    data = synthetic_sentences(40, n_vocab, n_pos)

    device = chainer.get_device(args.device)
    device.use()

    numpy.random.seed(0)  # the weights
    model = CRF(n_vocab, n_pos)
    model.to_device(device)

    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer.WeightDecay(0.0001))

    test_data, train_data = datasets.split_dataset_random(
        data, len(data) // 5, seed=0)

    train_iter = chainer.iterators.SerialIterator(train_data, args.batchsize,
                                                 shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test_data, args.batchsize,
                                                 repeat=False, shuffle=False)
    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(
            train_iter, optimizer, converter=convert, devices=args.devices)
    else:
        updater = training.updaters.StandardUpdater(
            train_iter, optimizer, converter=convert, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    evaluator = extensions.Evaluator(
        test_iter, model, device=device, converter=convert)
    trainer.extend(evaluator, trigger=(1, 'epoch'))
    trainer.extend(extensions.LogReport(trigger=(1, 'epoch')),
                   trigger=(1, 'epoch'))

    trainer.extend(
        extensions.MicroAverage(
            'main/correct', 'main/total', 'main/accuracy'))
    trainer.extend(
        extensions.MicroAverage(
            'validation/main/correct', 'validation/main/total',
            'validation/main/accuracy'))

    trainer.extend(
        extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss',
             'main/accuracy', 'validation/main/accuracy', 'elapsed_time']),
        trigger=(1, 'epoch'))

    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
