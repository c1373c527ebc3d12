"""Truncated BPTT over an LSTM: the backward runs in user code.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_bptt.py --impl
chainermn|cgdp --out DIR [--device numpy|standin|gpu]

In the shape of Chainer v7.8.1's examples/ptb/train_ptb_custom_loop.py
(with train_ptb.py's RNNForLM and ParallelSequentialIterator), cut down to
a 12-word vocabulary and 8 units, on a random word sequence that rank 0
makes and ``chainermn.scatter_dataset`` splits into one contiguous piece
per rank. The loop sums the loss over ``BPROPLEN`` steps of the LSTMs,
whose state lives across iterations (per rank), then
``optimizer.target.cleargrads(); loss.backward(); loss.unchain_backward();
optimizer.update()`` on SGD wrapped by ``create_multi_node_optimizer``, with
``GradientClipping(5)`` (which needs the whole, averaged gradient).

The ranks build the same model (seed 0) and then seed their own dropout.
ChainerMN's first ``update()`` broadcasts rank 0's weights and takes no
step; the script checks that clipping acted at least once (the norm of
the gradient that the update left is the threshold), so that the hook is
tested.

On '--device gpu' the model and the batches are on the rank's GPU, where
dropout draws from CuPy's random state, seeded as NumPy's is.

Per rank by design: the LSTMs' state (``state/l1/c`` ...).
"""
import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
from chainer.dataset import convert  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

N_VOCAB = 12
N_UNITS = 8
N_WORDS = 400
BATCHSIZE = 4
BPROPLEN = 20
ITERATIONS = 6
GRADCLIP = 5


class RNNForLM(chainer.Chain):

    def __init__(self, n_vocab, n_units):
        super(RNNForLM, self).__init__()
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units)
            self.l1 = L.LSTM(n_units, n_units)
            self.l2 = L.LSTM(n_units, n_units)
            self.l3 = L.Linear(n_units, n_vocab)

        for param in self.params():
            param.array[...] = numpy.random.uniform(-0.1, 0.1, param.shape)

    def reset_state(self):
        self.l1.reset_state()
        self.l2.reset_state()

    def forward(self, x):
        h0 = self.embed(x)
        h1 = self.l1(F.dropout(h0))
        h2 = self.l2(F.dropout(h1))
        y = self.l3(F.dropout(h2))
        return y


class ParallelSequentialIterator(chainer.dataset.Iterator):
    """train_ptb.py's iterator: ``batch_size`` positions spread over the
    sequence, each yielding (current word, next word) per call."""

    def __init__(self, dataset, batch_size, repeat=True):
        super(ParallelSequentialIterator, self).__init__()
        self.dataset = dataset
        self.batch_size = batch_size
        self.repeat = repeat
        length = len(dataset)
        self.offsets = [i * length // batch_size for i in range(batch_size)]
        self.epoch = 0
        self.is_new_epoch = False
        self.iteration = 0

    def __next__(self):
        length = len(self.dataset)
        if not self.repeat and self.iteration * self.batch_size >= length:
            raise StopIteration
        cur_words = self.get_words()
        self.iteration += 1
        next_words = self.get_words()
        epoch = self.iteration * self.batch_size // length
        self.is_new_epoch = self.epoch < epoch
        if self.is_new_epoch:
            self.epoch = epoch
        return list(zip(cur_words, next_words))

    def get_words(self):
        return [self.dataset[(offset + self.iteration) % len(self.dataset)]
                for offset in self.offsets]


def words(comm):
    """Rank 0's word sequence, one contiguous piece per rank."""
    if comm.rank == 0:
        train = numpy.random.RandomState(0).randint(
            0, N_VOCAB, N_WORDS).astype(numpy.int32)
    else:
        train = None
    shard = chainermn.scatter_dataset(train, comm)
    return numpy.asarray([shard[i] for i in range(len(shard))])


def gradient_norm(model):
    return float(numpy.sqrt(sum(
        float(chainer.backend.get_array_module(param.grad).sum(
            param.grad ** 2))
        for param in model.params() if param.grad is not None)))


def train(comm, create_multi_node_optimizer, device):
    numpy.random.seed(0)  # the same model on every rank
    rnn = RNNForLM(N_VOCAB, N_UNITS)
    model = L.Classifier(rnn)
    model.compute_accuracy = False  # we only want the perplexity
    model.to_device(device)

    optimizer = create_multi_node_optimizer(
        chainer.optimizers.SGD(lr=1.0), comm)
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer_hooks.GradientClipping(GRADCLIP))

    train_iter = ParallelSequentialIterator(words(comm), BATCHSIZE)
    _anyloop.seed(100 + comm.rank, device)  # dropout, per rank
    losses, norms = [], []
    for iteration in range(ITERATIONS):
        loss = 0
        for i in range(BPROPLEN):
            batch = train_iter.__next__()
            x, t = convert.concat_examples(batch, device)
            loss += optimizer.target(x, t)

        losses.append(float(loss.array))
        optimizer.target.cleargrads()  # Clear the parameter gradients
        loss.backward()  # Backprop
        loss.unchain_backward()  # Truncate the graph
        optimizer.update()  # Update the parameters
        norms.append(gradient_norm(model))
    return rnn, model, optimizer, {'loss': losses, 'grad_norm': norms,
                                   't': optimizer.t}


def lstm_state(rnn):
    return {'{}/{}'.format(name, part): getattr(getattr(rnn, name),
                                                part).array
            for name in ('l1', 'l2') for part in ('c', 'h')}


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0])
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        rnn, model, optimizer, values = train(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            _anyloop.device_of(args, comm))
        assert any(abs(norm - GRADCLIP) < 1e-4 * GRADCLIP
                   for norm in values['grad_norm'][1:]), (
            'GradientClipping({}) never acted: gradient norms {}'.format(
                GRADCLIP, values['grad_norm']))
        _anyloop.write_results(comm, args.out, {'model': model}, values,
                               state=lstm_state(rnn))
        _anyloop.finish(comm, 'anyloop-bptt')


if __name__ == '__main__':
    main()
