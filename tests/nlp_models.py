"""Tiny models in the shape of Chainer's NLP examples (seq2seq, text
classification): recurrent layers over lists of sequences of different
lengths, fed by converters that return dicts and tuples of such lists."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy

END = 1  # the token that closes every target sequence


def _embed_each(embed, sequences):
    """Embeds a list of id sequences with one call; a list back."""
    lengths = numpy.cumsum([len(s) for s in sequences[:-1]])
    return F.split_axis(embed(F.concat(sequences, axis=0)), lengths, 0)


def _ragged_to(device, sequences):
    """A list of arrays of different lengths on ``device`` (one copy of
    their concatenation, split again); as they are if ``device`` is None
    (StandardUpdater without a device)."""
    if device is None:
        return list(sequences)
    whole = device.send(numpy.concatenate(sequences, axis=0))
    lengths = numpy.cumsum([len(s) for s in sequences[:-1]])
    return device.xp.split(whole, lengths)


class TinySeq2seq(chainer.Chain):
    """An encoder-decoder: embeddings, NStepLSTM encoder and decoder (with
    dropout, off under ``train=False``) and an output layer."""

    def __init__(self, n_vocab=7, n_units=4, seed=0):
        super(TinySeq2seq, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.source_embed = L.EmbedID(
                n_vocab, n_units, initialW=rng.normal(
                    0, 1, (n_vocab, n_units)).astype(numpy.float32))
            self.target_embed = L.EmbedID(
                n_vocab, n_units, initialW=rng.normal(
                    0, 1, (n_vocab, n_units)).astype(numpy.float32))
            self.encoder = L.NStepLSTM(1, n_units, n_units, 0.3)
            self.decoder = L.NStepLSTM(1, n_units, n_units, 0.3)
            self.out = L.Linear(n_units, n_vocab, initialW=rng.normal(
                0, 0.5, (n_vocab, n_units)).astype(numpy.float32))

    def forward(self, xs, ys):
        end = self.xp.array([END], numpy.int32)
        decoder_in = [F.concat([end, y], axis=0) for y in ys]
        decoder_target = F.concat([F.concat([y, end], axis=0) for y in ys],
                                  axis=0)
        h, c, _ = self.encoder(None, None, _embed_each(
            self.source_embed, [x[::-1] for x in xs]))
        _, _, outputs = self.decoder(h, c, _embed_each(self.target_embed,
                                                       decoder_in))
        scores = self.out(F.concat(outputs, axis=0))
        # Summed over the words, averaged over the sentences of the batch.
        loss = F.sum(F.softmax_cross_entropy(
            scores, decoder_target, reduce='no')) / len(xs)
        chainer.report({'loss': loss}, self)
        return loss


def sentence_pairs(n=12, n_vocab=7, seed=0):
    """``(source, target)`` id sequences of 1 to 5 tokens."""
    rng = numpy.random.RandomState(seed)
    return [(rng.randint(2, n_vocab, rng.randint(1, 6)).astype(numpy.int32),
             rng.randint(2, n_vocab, rng.randint(1, 6)).astype(numpy.int32))
            for _ in range(n)]


@chainer.dataset.converter()
def convert_pairs(batch, device):
    """``{'xs': [sources], 'ys': [targets]}``, each a list of arrays of
    different lengths (the seq2seq example's form)."""
    return {'xs': _ragged_to(device, [x for x, _ in batch]),
            'ys': _ragged_to(device, [y for _, y in batch])}


class TinyTextClassifier(chainer.Chain):
    """Embeds each text, encodes it with an NStepLSTM and classifies its
    last state."""

    def __init__(self, n_vocab=7, n_units=4, n_classes=3, seed=1):
        super(TinyTextClassifier, self).__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units, initialW=rng.normal(
                0, 1, (n_vocab, n_units)).astype(numpy.float32))
            self.encoder = L.NStepLSTM(1, n_units, n_units, 0.3)
            self.out = L.Linear(n_units, n_classes, initialW=rng.normal(
                0, 0.5, (n_classes, n_units)).astype(numpy.float32))

    def forward(self, xs, labels):
        h, _, _ = self.encoder(None, None, _embed_each(self.embed, xs))
        loss = F.softmax_cross_entropy(self.out(h[-1]), labels)
        chainer.report({'loss': loss}, self)
        return loss


def labelled_texts(n=12, n_vocab=7, n_classes=3, seed=2):
    """``(ids, label)`` pairs, texts of 1 to 6 tokens."""
    rng = numpy.random.RandomState(seed)
    return [(rng.randint(0, n_vocab, rng.randint(1, 7)).astype(numpy.int32),
             numpy.int32(rng.randint(n_classes))) for _ in range(n)]


@chainer.dataset.converter()
def convert_texts(batch, device):
    """``([texts], labels)``: a tuple of a list of arrays of different
    lengths and one array."""
    labels = numpy.array([y for _, y in batch], numpy.int32)
    return (_ragged_to(device, [x for x, _ in batch]),
            labels if device is None else device.send(labels))
