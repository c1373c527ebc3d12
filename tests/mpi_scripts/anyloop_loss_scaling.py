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

No float16 model: CGDP's multi-node reduction (cgdp_chainer.mpi.allreduce.
ChunkAllreducer) refuses float16 gradients (MPI has no half sum).

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
    scales = []
    for step in range(ITERATIONS):
        x, t = batch(comm, step)
        static.cleargrads()
        loss = static(*device.send((x, t)))
        loss.backward(loss_scale=static_optimizer._loss_scale)
        static_optimizer.update()
        if step == SKIPPED_AT and comm.rank == 1:
            x = x.copy()
            x[0, 0] = numpy.inf
        dynamic_optimizer.update(dynamic, *device.send((x, t)))
        scales.append(float(dynamic_optimizer._loss_scale))
    return {'static': static, 'dynamic': dynamic}, {
        'static_t': static_optimizer.t, 'dynamic_t': dynamic_optimizer.t,
        'dynamic_scales': scales}


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
