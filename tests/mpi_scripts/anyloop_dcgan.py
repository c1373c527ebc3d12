"""A GAN: two wrapped optimizers driven by a custom updater.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_dcgan.py --impl
chainermn|cgdp --out DIR [--device numpy|standin|gpu]

In the shape of Chainer v7.8.1's examples/chainermn/dcgan (train_dcgan.py,
updater.py, net.py), cut down to 4x4 one-channel images: a Generator with
BatchNormalization after its Linear and Deconvolution2D layers, a
Discriminator with BatchNormalization (no gamma) and input noise, both
wrapped by ``create_multi_node_optimizer(Adam(alpha, beta1), comm)`` with
the example's WeightDecay hook, and the example's ``DCGANUpdater``, whose
``update_core`` updates the discriminator, then backpropagates the
generator's loss through the discriminator (``opt.update(lossfun, *args)``
form for both), in a Trainer.

The ranks build their models from different seeds: ChainerMN's first
``update()`` of each optimizer broadcasts rank 0's weights and takes no
step, so both ranks train one model from the second iteration on. Few
iterations: Adam's step for a gradient near zero is of the order of
``alpha`` whatever the gradient's size, and amplifies rounding noise.

On '--device gpu' the models, the batches and the updater are on the
rank's GPU; the input noise (``xp.random``) comes from CuPy's random state,
seeded as NumPy's is, so that the runs compared draw the same noise.

Per rank by design: BatchNormalization's statistics, and the
discriminator's ``grad`` after the last update (the generator's backward
goes through the discriminator after its update and adds this rank's
gradient to the mean that the discriminator's optimizer left there).
"""
import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
from chainer import backend  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
from chainer import training  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

N_HIDDEN = 4
N_IMAGES = 32
BATCH_PER_RANK = 4
ITERATIONS = 4


def add_noise(h, sigma=0.2):
    xp = backend.get_array_module(h.array)
    if chainer.config.train:
        return h + sigma * xp.random.randn(*h.shape)
    else:
        return h


class Generator(chainer.Chain):

    def __init__(self, n_hidden, bottom_width=2, ch=4, wscale=0.02):
        super(Generator, self).__init__()
        self.n_hidden = n_hidden
        self.ch = ch
        self.bottom_width = bottom_width
        with self.init_scope():
            w = chainer.initializers.Normal(wscale)
            self.l0 = L.Linear(self.n_hidden, bottom_width * bottom_width * ch,
                               initialW=w)
            self.dc1 = L.Deconvolution2D(ch, ch // 2, 4, 2, 1, initialW=w)
            self.dc2 = L.Deconvolution2D(ch // 2, 1, 3, 1, 1, initialW=w)
            self.bn0 = L.BatchNormalization(bottom_width * bottom_width * ch)
            self.bn1 = L.BatchNormalization(ch // 2)

    def make_hidden(self, batchsize):
        return numpy.random.uniform(-1, 1, (batchsize, self.n_hidden, 1, 1))\
            .astype(numpy.float32)

    def __call__(self, z):
        h = F.reshape(F.relu(self.bn0(self.l0(z))),
                      (len(z), self.ch, self.bottom_width, self.bottom_width))
        h = F.relu(self.bn1(self.dc1(h)))
        return F.sigmoid(self.dc2(h))


class Discriminator(chainer.Chain):

    def __init__(self, bottom_width=2, ch=4, wscale=0.02):
        w = chainer.initializers.Normal(wscale)
        super(Discriminator, self).__init__()
        with self.init_scope():
            self.c0_0 = L.Convolution2D(1, ch // 2, 3, 1, 1, initialW=w)
            self.c0_1 = L.Convolution2D(ch // 2, ch, 4, 2, 1, initialW=w)
            self.l4 = L.Linear(bottom_width * bottom_width * ch, 1, initialW=w)
            self.bn0_1 = L.BatchNormalization(ch, use_gamma=False)

    def __call__(self, x):
        h = add_noise(x)
        h = F.leaky_relu(add_noise(self.c0_0(h)))
        h = F.leaky_relu(add_noise(self.bn0_1(self.c0_1(h))))
        return self.l4(h)


class DCGANUpdater(chainer.training.StandardUpdater):

    def __init__(self, *args, **kwargs):
        self.gen, self.dis = kwargs.pop('models')
        super(DCGANUpdater, self).__init__(*args, **kwargs)

    def loss_dis(self, dis, y_fake, y_real):
        batchsize = len(y_fake)
        L1 = F.sum(F.softplus(-y_real)) / batchsize
        L2 = F.sum(F.softplus(y_fake)) / batchsize
        loss = L1 + L2
        chainer.report({'loss': loss}, dis)
        return loss

    def loss_gen(self, gen, y_fake):
        batchsize = len(y_fake)
        loss = F.sum(F.softplus(-y_fake)) / batchsize
        chainer.report({'loss': loss}, gen)
        return loss

    def update_core(self):
        gen_optimizer = self.get_optimizer('gen')
        dis_optimizer = self.get_optimizer('dis')

        batch = self.get_iterator('main').next()
        x_real = chainer.Variable(self.converter(batch, self.device)) / 255.
        xp = chainer.backend.get_array_module(x_real.array)

        gen, dis = self.gen, self.dis
        batchsize = len(batch)

        y_real = dis(x_real)

        z = chainer.Variable(xp.asarray(gen.make_hidden(batchsize)))
        x_fake = gen(z)
        y_fake = dis(x_fake)

        dis_optimizer.update(self.loss_dis, dis, y_fake, y_real)
        gen_optimizer.update(self.loss_gen, gen, y_fake)


def images(comm):
    """Rank 0 makes 4x4 'images' in [0, 255]; every rank gets a shard."""
    if comm.rank == 0:
        random = numpy.random.RandomState(0)
        train = random.uniform(0, 255, (N_IMAGES, 1, 4, 4)).astype(
            numpy.float32)
    else:
        train = None
    return chainermn.scatter_dataset(train, comm, shuffle=True, seed=1)


def train(comm, create_multi_node_optimizer, device, out):
    numpy.random.seed(comm.rank)  # the ranks start apart
    gen = Generator(n_hidden=N_HIDDEN)
    dis = Discriminator()
    gen.to_device(device)  # Copy the model to the device
    dis.to_device(device)

    def make_optimizer(model, comm, alpha=0.0002, beta1=0.5):
        optimizer = create_multi_node_optimizer(
            chainer.optimizers.Adam(alpha=alpha, beta1=beta1), comm)
        optimizer.setup(model)
        optimizer.add_hook(chainer.optimizer.WeightDecay(0.0001), 'hook_dec')
        return optimizer

    opt_gen = make_optimizer(gen, comm)
    opt_dis = make_optimizer(dis, comm)

    train_iter = chainer.iterators.SerialIterator(
        images(comm), BATCH_PER_RANK, order_sampler=(
            chainer.iterators.ShuffleOrderSampler(
                numpy.random.RandomState(10 + comm.rank))))
    updater = DCGANUpdater(
        models=(gen, dis), iterator=train_iter,
        optimizer={'gen': opt_gen, 'dis': opt_dis}, device=device)
    trainer = training.Trainer(updater, (ITERATIONS, 'iteration'), out=out)

    observed = []
    _anyloop.record_observations(trainer, comm, observed)

    _anyloop.seed(100 + comm.rank, device)  # z and the noise, per rank
    trainer.run()
    return gen, dis, opt_gen, opt_dis, observed


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0])
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        gen, dis, opt_gen, opt_dis, observed = train(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            _anyloop.device_of(args, comm), args.out + '/trainer')
        values = {'observed': observed, 'gen_t': opt_gen.t,
                  'dis_t': opt_dis.t}
        _anyloop.write_results(comm, args.out, {'gen': gen, 'dis': dis},
                               values, per_rank=('grad/dis/',))
        _anyloop.finish(comm, 'anyloop-dcgan')


if __name__ == '__main__':
    main()
