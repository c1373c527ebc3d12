#!/usr/bin/env python
"""Chainer 7.8.1's examples/memnn/train_memnn.py in its shape, with the
one-line switch to CGDP (``--updater cgdp``) and small synthetic bAbI-like
data instead of the bAbI files.

Its model, memnn.MemNN, holds a function that refers to the model itself
(``self.W = lambda u: F.linear(u, self.embeds[-1].W)``) and plain objects
(the memories) that hold its links outside ``init_scope``: every replica's
copy must refer to its own links. The script ends by saving the model, so
that the two runs' parameters can be compared.
"""
import cgdp_chainer  # first, as the switch asks

import argparse
import os

import chainer
import chainer.functions as F
from chainer import initializers
import chainer.links as L
from chainer.training import extensions
import numpy


def bow_encode(embed, sentences):
    """BoW sentence encoder: the sum of the words' embeddings."""
    return F.sum(embed(sentences), axis=-2)


class Memory(object):
    """Memory component in a memory network (as in memnn.py).

    Args:
        A, C (chainer.links.EmbedID): Input and output embeddings.
        TA, TC (chainer.links.EmbedID): Their temporal encodings.
        encoder (callable): Encodes sentences to vectors.
    """

    def __init__(self, A, C, TA, TC, encoder):
        self.A = A
        self.C = C
        self.TA = TA
        self.TC = TC
        self.encoder = encoder

    def register_all(self, sentences):
        self.m = self.encoder(self.A, sentences)
        self.c = self.encoder(self.C, sentences)

    def query(self, u):
        xp = chainer.backend.get_array_module(u)
        size = self.m.shape[1]
        inds = xp.arange(size - 1, -1, -1, dtype=numpy.int32)
        tm = F.broadcast_to(self.TA(inds), self.m.shape)
        tc = F.broadcast_to(self.TC(inds), self.c.shape)
        p = F.softmax(F.matmul(self.m + tm, F.expand_dims(u, -1)))
        o = F.matmul(F.swapaxes(self.c + tc, 2, 1), p)
        return F.squeeze(o, -1) + u


class MemNN(chainer.Chain):
    """End-to-end memory network, as memnn.MemNN."""

    def __init__(self, n_units, n_vocab, encoder, max_memory, hops):
        super(MemNN, self).__init__()
        with self.init_scope():
            self.embeds = chainer.ChainList()
            self.temporals = chainer.ChainList()
        normal = initializers.Normal()
        # Adjacent layers share their embedding matrices.
        for _ in range(hops + 1):
            self.embeds.append(L.EmbedID(n_vocab, n_units, initialW=normal))
            self.temporals.append(
                L.EmbedID(max_memory, n_units, initialW=normal))
        self.memories = [
            Memory(self.embeds[i], self.embeds[i + 1],
                   self.temporals[i], self.temporals[i + 1], encoder)
            for i in range(hops)]
        # The question embedding is the first layer's input embedding.
        self.B = self.embeds[0]
        # The answer prediction matrix is the final output layer's.
        self.W = lambda u: F.linear(u, self.embeds[-1].W)
        self.encoder = encoder

    def fix_ignore_label(self):
        for embed in self.embeds:
            embed.W.array[0, :] = 0

    def register_all(self, sentences):
        for memory in self.memories:
            memory.register_all(sentences)

    def query(self, question):
        u = self.encoder(self.B, question)
        for memory in self.memories:
            u = memory.query(u)
        return self.W(u)

    def forward(self, sentences, question):
        self.register_all(sentences)
        return self.query(question)


def synthetic_stories(n, n_vocab, max_memory, sentence_len, seed):
    """memnn.convert_data's output for random stories: word 0 pads."""
    rng = numpy.random.RandomState(seed)
    return [{'sentences': rng.randint(0, n_vocab, (max_memory, sentence_len))
             .astype(numpy.int32),
             'question': rng.randint(1, n_vocab, sentence_len).astype(
                 numpy.int32),
             'answer': numpy.int32(rng.randint(1, n_vocab))}
            for _ in range(n)]


def train(args):
    device = chainer.get_device(args.device)
    device.use()
    n_vocab = 20
    train_data = synthetic_stories(48, n_vocab, args.max_memory, 6, seed=1)
    test_data = synthetic_stories(16, n_vocab, args.max_memory, 6, seed=2)

    network = MemNN(args.unit, n_vocab, bow_encode, args.max_memory,
                    args.hop)
    model = chainer.links.Classifier(network, label_key='answer')
    opt = chainer.optimizers.Adam()
    model.to_device(device)
    opt.setup(model)

    train_iter = chainer.iterators.SerialIterator(
        train_data, args.batchsize, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(
        test_data, args.batchsize, repeat=False, shuffle=False)
    if args.updater == 'cgdp':
        updater = cgdp_chainer.CGDPUpdater(train_iter, opt,
                                           devices=[device, device])
    else:
        updater = chainer.training.StandardUpdater(train_iter, opt,
                                                   device=device)
    trainer = chainer.training.Trainer(updater, (args.epoch, 'epoch'),
                                       out=args.out)

    @chainer.training.make_extension()
    def fix_ignore_label(trainer):
        network.fix_ignore_label()

    trainer.extend(fix_ignore_label)
    trainer.extend(extensions.Evaluator(test_iter, model, device=device))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss',
         'main/accuracy', 'validation/main/accuracy']))
    trainer.run()
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


def main():
    parser = argparse.ArgumentParser(
        description='Chainer example: End-to-end memory networks')
    parser.add_argument('--batchsize', '-b', type=int, default=12)
    parser.add_argument('--epoch', '-e', type=int, default=2)
    parser.add_argument('--device', '-d', type=str, default='-1')
    parser.add_argument('--unit', '-u', type=int, default=8)
    parser.add_argument('--hop', '-H', type=int, default=3)
    parser.add_argument('--max-memory', type=int, default=5)
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--updater', choices=('standard', 'cgdp'),
                        default='cgdp')
    args = parser.parse_args()
    numpy.random.seed(0)  # the weights
    train(args)


if __name__ == '__main__':
    main()
