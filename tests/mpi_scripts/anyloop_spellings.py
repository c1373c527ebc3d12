"""Optimizers and hooks as real scripts spell them, and a frozen layer.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_spellings.py --impl
chainermn|cgdp --out DIR [--device numpy|standin]

Six MLP classifiers trained side by side on each rank's shard, each by
its own optimizer wrapped by ``create_multi_node_optimizer``, spelled as
Chainer's and ChainerCV's examples spell them: ``Adam`` with the deprecated
``chainer.optimizer.WeightDecay`` (dcgan, pix2pix, pos, pspnet),
``CorrectedMomentumSGD`` (the imagenet examples) with
``chainer.optimizer.Lasso``, ``RMSprop`` (eps inside the square root)
with ``chainer.optimizer.GradientHardClipping``, ``AdaGrad`` with
``chainer.optimizer.WeightDecay``, ``AdaDelta`` with
``chainer.optimizer.Lasso`` and ``RMSpropGraves``. The first layer of
every model is frozen (``disable_update()``, as ChainerCV's FPN freezes
its first convolution and BatchNormalization): its gradient is still the
mean over the ranks after each update, with the hooks applied, and it never
changes.

The loop is the custom one of examples/mnist/train_mnist_custom_loop.py:
``optimizer.update(model, x, t)`` per batch; the loss per epoch is
reported.
"""
import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
from chainer.dataset import convert  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

import _common  # NOQA: E402

N_FEATURES, N_UNITS, N_CLASSES = 6, 8, 3
N_TRAIN = 48
BATCHSIZE = 8
EPOCHS = 2


def spellings():
    """name -> (optimizer, hooks), as the examples spell them."""
    return {
        'adam': (chainer.optimizers.Adam(alpha=0.01, beta1=0.5),
                 [chainer.optimizer.WeightDecay(1e-3)]),
        'corrected': (chainer.optimizers.CorrectedMomentumSGD(lr=0.05),
                      [chainer.optimizer.Lasso(1e-3)]),
        'rmsprop': (chainer.optimizers.RMSprop(lr=0.01, eps=1e-4,
                                               eps_inside_sqrt=True),
                    [chainer.optimizer.GradientHardClipping(-0.5, 0.5)]),
        'adagrad': (chainer.optimizers.AdaGrad(lr=0.05),
                    [chainer.optimizer.WeightDecay(1e-3)]),
        'adadelta': (chainer.optimizers.AdaDelta(rho=0.9, eps=1e-4),
                     [chainer.optimizer.Lasso(1e-3)]),
        'rmsprop_graves': (chainer.optimizers.RMSpropGraves(lr=0.01), []),
    }


class MLP(chainer.Chain):

    def __init__(self, seed):
        super(MLP, self).__init__()
        initializer = chainer.initializers.Normal(
            0.5, rng=numpy.random.RandomState(seed))
        with self.init_scope():
            self.l1 = L.Linear(N_FEATURES, N_UNITS, initialW=initializer)
            self.l2 = L.Linear(N_UNITS, N_UNITS, initialW=initializer)
            self.l3 = L.Linear(N_UNITS, N_CLASSES, initialW=initializer)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def train(comm, create_multi_node_optimizer, device):
    if comm.rank == 0:
        data = _common.numbered_dataset(N_TRAIN, N_FEATURES, N_CLASSES, 1)
    else:
        data = None
    data = chainermn.scatter_dataset(data, comm, shuffle=True, seed=3)
    models, optimizers = {}, {}
    for index, (name, (actual, hooks)) in enumerate(
            sorted(spellings().items())):
        model = L.Classifier(MLP(seed=index))
        model.to_device(device)
        optimizer = create_multi_node_optimizer(actual, comm)
        optimizer.setup(model)
        for hook in hooks:
            optimizer.add_hook(hook)
        model.predictor.l1.disable_update()
        models[name], optimizers[name] = model, optimizer
    frozen = {(name, path): param.array.copy()
              for name, model in models.items()
              for path, param in model.predictor.l1.namedparams()}
    iterator = chainer.iterators.SerialIterator(
        data, BATCHSIZE, order_sampler=chainer.iterators.ShuffleOrderSampler(
            numpy.random.RandomState(10 + comm.rank)))
    log = []
    losses = {name: 0.0 for name in models}
    count = 0
    while iterator.epoch < EPOCHS:
        x, t = convert.concat_examples(iterator.next(), device)
        for name, model in sorted(models.items()):
            optimizers[name].update(model, x, t)
            losses[name] += float(model.loss.array) * len(t)
        count += len(t)
        if iterator.is_new_epoch:
            log.append({name: loss / count for name, loss in losses.items()})
            losses = {name: 0.0 for name in models}
            count = 0
    for (name, path), initial in sorted(frozen.items()):
        now = getattr(models[name].predictor.l1, path.lstrip('/')).array
        if not (now == initial).all():
            raise AssertionError('the frozen {}/l1{} changed'.format(
                name, path))
    return models, {'log': log,
                    't': {name: o.t for name, o in optimizers.items()}}


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0])
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        models, values = train(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            _anyloop.device_of(args, comm))
        _anyloop.write_results(comm, args.out, models, values)
        _anyloop.finish(comm, 'anyloop-spellings')


if __name__ == '__main__':
    main()
