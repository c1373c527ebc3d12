"""A custom training loop: ``optimizer.update(model, x, t)``.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_custom_loop.py --impl
chainermn|cgdp --out DIR

In the shape of Chainer v7.8.1's examples/mnist/train_mnist_custom_loop.py
with examples/chainermn/mnist/train_mnist.py's multi-node set-up: an MLP of
lazy layers (``L.Linear(None, n)``) in an ``L.Classifier``, MomentumSGD
wrapped by ``create_multi_node_optimizer`` with a WeightDecay hook, data
made on rank 0 and split by ``chainermn.scatter_dataset``, and the
example's loop: ``optimizer.update(model, x, t)`` per batch, the loss and
accuracy summed per epoch, and an evaluation on the rank's test shard at
the end of each epoch. After each update the script clips the weights in
place (as a WGAN's critic does): an edit between updates that the next
one must start from.

The ranks seed their initializers differently, so the lazy parameters
(created by the first forward, inside the first ``update()``) differ
between them: ChainerMN's first ``update()`` sees new parameters,
broadcasts rank 0's and takes no step.
"""
import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
from chainer import configuration  # NOQA: E402
from chainer.dataset import convert  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

N_FEATURES, N_UNITS, N_CLASSES = 6, 8, 3
N_TRAIN, N_TEST = 48, 16
BATCHSIZE = 8
EPOCHS = 2
CLIP = 0.4  # acts on some of the weights


class MLP(chainer.Chain):

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            # the size of the inputs to each layer will be inferred
            self.l1 = L.Linear(None, n_units)  # n_in -> n_units
            self.l2 = L.Linear(None, n_units)  # n_units -> n_units
            self.l3 = L.Linear(None, n_out)  # n_units -> n_out

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def evaluate(model, test_iter, device):
    sum_loss = sum_accuracy = 0
    count = 0
    # Enable evaluation mode.
    with configuration.using_config('train', False):
        # This is optional but can reduce computational overhead.
        with chainer.using_config('enable_backprop', False):
            for batch in test_iter:
                x, t = convert.concat_examples(batch, device)
                loss = model(x, t)
                sum_loss += float(loss.array) * len(t)
                sum_accuracy += float(model.accuracy.array) * len(t)
                count += len(t)
    test_iter.reset()
    return sum_loss / count, sum_accuracy / count


def train(comm, create_multi_node_optimizer, device):
    model = L.Classifier(MLP(N_UNITS, N_CLASSES))
    model.to_device(device)
    optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), comm)
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(1e-3))

    train, test = _anyloop.scattered_datasets(comm, N_TRAIN, N_TEST,
                                              N_FEATURES, N_CLASSES)
    train_iter = chainer.iterators.SerialIterator(
        train, BATCHSIZE, order_sampler=(
            chainer.iterators.ShuffleOrderSampler(
                numpy.random.RandomState(10 + comm.rank))))
    test_iter = chainer.iterators.SerialIterator(test, BATCHSIZE,
                                                 repeat=False, shuffle=False)

    # The lazy parameters differ per rank (on a GPU, their initializers
    # draw from CuPy's random state).
    _anyloop.seed(comm.rank, device)
    log = []
    train_count = sum_accuracy = sum_loss = 0
    while train_iter.epoch < EPOCHS:
        batch = train_iter.next()
        x, t = convert.concat_examples(batch, device)
        optimizer.update(model, x, t)
        for param in model.params():
            xp = chainer.backend.get_array_module(param.array)
            xp.clip(param.array, -CLIP, CLIP, out=param.array)
        train_count += len(t)
        sum_loss += float(model.loss.array) * len(t)
        sum_accuracy += float(model.accuracy.array) * len(t)

        if train_iter.is_new_epoch:
            test_loss, test_accuracy = evaluate(model, test_iter, device)
            log.append({'epoch': train_iter.epoch,
                        'main/loss': sum_loss / train_count,
                        'main/accuracy': sum_accuracy / train_count,
                        'test/loss': test_loss,
                        'test/accuracy': test_accuracy})
            train_count = sum_accuracy = sum_loss = 0
    return model, {'log': log, 't': optimizer.t}


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0])
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        model, values = train(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            _anyloop.device_of(args, comm))
        _anyloop.write_results(comm, args.out, {'model': model}, values)
        _anyloop.finish(comm, 'anyloop-custom-loop')


if __name__ == '__main__':
    main()
