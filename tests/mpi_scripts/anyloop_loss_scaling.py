"""Loss scaling in both call forms: static, and dynamic.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_loss_scaling.py --impl
chainermn|cgdp --out DIR [--device numpy|standin|gpu]

Two classifiers, each with its own wrapped optimizer:

* ``static``: MomentumSGD with ``set_loss_scale(128)``, trained in a custom
  loop whose backward runs in user code, as Chainer's mixed-precision
  examples do: ``loss.backward(loss_scale=optimizer._loss_scale);
  optimizer.update()``;
* ``dynamic``: Adam with ``loss_scaling()`` (dynamic: an iteration whose
  gradient is not finite anywhere is skipped and the scale halved), trained
  with ``optimizer.update(model, x, t)``; one batch holds an infinite value,
  so one iteration is skipped (the scale is halved, the weights stay).

* ``half``: a float16 model (its parameters and batches in half
  precision), MomentumSGD with ``use_fp32_update()`` (float32 master
  copies in the update rules, as Chainer's mixed16 examples set) and
  dynamic loss scaling, trained with ``optimizer.update(model, x, t)``.
  Its gradients' mean over the ranks is summed in float32 and rounded back
  once, as ChainerMN's communicators do.

On '--device gpu' the models and the batches are on the rank's GPU.
"""
import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402

import _common  # NOQA: E402

ITERATIONS = 5
SKIPPED_AT = 2  # this iteration's batch holds an infinite value


def batch(comm, step):
    random = numpy.random.RandomState(100 * comm.rank + step)
    x = random.randn(8, 6).astype(numpy.float32)
    t = random.randint(0, 3, 8).astype(numpy.int32)
    return x, t


def half_model(seed):
    """A classifier whose parameters are float16."""
    model = L.Classifier(_common.StagedMLP((6, 10, 3), seed=seed))
    for param in model.params():
        param.array = param.array.astype(numpy.float16)
    return model


def train(comm, create_multi_node_optimizer, device):
    static = L.Classifier(_common.StagedMLP((6, 10, 3), seed=0))
    dynamic = L.Classifier(_common.StagedMLP((6, 10, 3), seed=1))
    static.to_device(device)
    dynamic.to_device(device)
    static_optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.05), comm).setup(static)
    static_optimizer.set_loss_scale(128.0)
    dynamic_optimizer = create_multi_node_optimizer(
        chainer.optimizers.Adam(alpha=1e-3), comm).setup(dynamic)
    dynamic_optimizer.loss_scaling(interval=2)
    half = half_model(seed=2)
    half.to_device(device)
    half_optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.05), comm).setup(half)
    half_optimizer.use_fp32_update()
    half_optimizer.loss_scaling(interval=2, scale=16.0)
    scales = []
    for step in range(ITERATIONS):
        x, t = batch(comm, step)
        # Chainer's float32 update of a float16 model does not skip a
        # non-finite step (its weights become NaN): a clean batch.
        half_optimizer.update(half, *device.send(
            (x.astype(numpy.float16), t)))
        static.cleargrads()
        loss = static(*device.send((x, t)))
        loss.backward(loss_scale=static_optimizer._loss_scale)
        static_optimizer.update()
        if step == SKIPPED_AT and comm.rank == 1:
            x = x.copy()
            x[0, 0] = numpy.inf
        dynamic_optimizer.update(dynamic, *device.send((x, t)))
        scales.append(float(dynamic_optimizer._loss_scale))
    return {'static': static, 'dynamic': dynamic, 'half': half}, {
        'static_t': static_optimizer.t, 'dynamic_t': dynamic_optimizer.t,
        'half_t': half_optimizer.t, 'dynamic_scales': scales,
        'half_scale': float(half_optimizer._loss_scale)}


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0])
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        models, values = train(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            _anyloop.device_of(args, comm))
        # The skipped iteration halved the scale, which grows otherwise.
        scales = values['dynamic_scales']
        assert scales[SKIPPED_AT] < scales[SKIPPED_AT - 1], scales
        _anyloop.write_results(comm, args.out, models, values)
        _anyloop.finish(comm, 'anyloop-loss-scaling')


if __name__ == '__main__':
    main()
