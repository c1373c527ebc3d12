"""A Trainer with a multi-node evaluator, a snapshot, and a resumed run.

Run: mpiexec -n 2 python tests/mpi_scripts/anyloop_trainer_resume.py
--impl chainermn|cgdp --out DIR [--resume SNAPSHOT]
[--device numpy|standin|gpu]

In the shape of Chainer v7.8.1's examples/chainermn/mnist/train_mnist.py,
cut down to a tiny MLP on random data that rank 0 makes: the optimizer
wrapped by ``create_multi_node_optimizer`` in a ``StandardUpdater``, the
evaluator wrapped by ``chainermn.create_multi_node_evaluator``, LogReport
on rank 0, a snapshot of the trainer at iteration ``--snapshot-at``, and
the example's resume, ``chainer.serializers.load_npz(args.resume,
trainer)``. Every rank writes a snapshot of its own
(``snapshot_rank<r>_iter_<i>`` under ``DIR/trainer``), as its iterator
walks its own shard; ``--resume`` names rank 0's, and each rank loads its
own beside it.

ChainerMN's first ``update()`` in a process broadcasts rank 0's weights and
takes no step, in a resumed run as in a new one. The script spends that
update before the trainer runs (``optimizer.update()`` with no loss), so
that every iteration of either run is a step and the resumed run ends
where the uninterrupted one does. The ranks build their models from
different seeds; that broadcast makes them one.

On '--device gpu' the model is on the rank's GPU before the optimizer is
set up, and the updater and the evaluator get that device (they send the
batches there); the snapshot holds host copies, which the resumed run
loads into the GPU's arrays.

With ``--saver checkpointer`` the trainer's state is kept by ChainerMN's
fault-tolerance extension instead, ``chainermn.create_multi_node_
checkpointer``, at iteration ``--snapshot-at``. As it removes its files
when the run ends, the run copies them into ``DIR/kept`` then (what a job
killed after that iteration would leave), and ``--resume`` naming such a
folder starts a run from a copy of it with ``checkpointer.maybe_load(
trainer, optimizer)``.

MomentumSGD (its state, the velocity, goes into the snapshot) instead of
the example's Adam, which amplifies rounding noise.
"""
import os
import shutil

import _anyloop  # first: it imports cgdp_chainer before Chainer

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
from chainer import training  # NOQA: E402
from chainer.training import extensions  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

N_FEATURES, N_UNITS, N_CLASSES = 6, 8, 3
N_TRAIN, N_TEST = 32, 16
BATCHSIZE = 4
EVALUATE_EVERY = 2


class MLP(chainer.Chain):

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(N_FEATURES, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def add_arguments(parser):
    parser.add_argument('--iterations', type=int, default=6)
    parser.add_argument('--snapshot-at', type=int, default=3)
    parser.add_argument('--resume', default='',
                        help="rank 0's snapshot to resume from (with "
                        "--saver checkpointer: the folder of the kept "
                        "checkpoints)")
    parser.add_argument('--saver', choices=('snapshot', 'checkpointer'),
                        default='snapshot')


def build_trainer(comm, create_multi_node_optimizer, args, observed):
    numpy.random.seed(comm.rank)  # the ranks start apart
    device = _anyloop.device_of(args, comm)
    model = L.Classifier(MLP(N_UNITS, N_CLASSES))
    model.to_device(device)
    optimizer = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), comm)
    optimizer.setup(model)

    train, test = _anyloop.scattered_datasets(comm, N_TRAIN, N_TEST,
                                              N_FEATURES, N_CLASSES)
    # No shuffling beyond scatter_dataset's: a snapshot keeps the iterator's
    # order and position, not a sampler's random state.
    train_iter = chainer.iterators.SerialIterator(train, BATCHSIZE,
                                                  shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, BATCHSIZE,
                                                 repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer,
                                       device=device)
    trainer = training.Trainer(updater, (args.iterations, 'iteration'),
                               out=os.path.join(args.out, 'trainer'))

    evaluator = extensions.Evaluator(test_iter, model, device=device)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator, trigger=(EVALUATE_EVERY, 'iteration'))
    def at_snapshot():  # a trigger keeps state: one per extension
        return training.triggers.ManualScheduleTrigger(
            [args.snapshot_at], 'iteration')
    checkpointer = None
    if args.saver == 'snapshot':
        trainer.extend(extensions.snapshot(
            filename='snapshot_rank{}_iter_{{.updater.iteration}}'.format(
                comm.rank)), trigger=at_snapshot())
    else:
        checkpoints = os.path.join(args.out, 'checkpoints')
        if args.resume:
            # A copy: the checkpointer removes what it loaded at the end.
            shutil.copytree(args.resume, checkpoints, dirs_exist_ok=True)
        checkpointer = chainermn.create_multi_node_checkpointer(
            'anyloop', comm, path=checkpoints)
        trainer.extend(checkpointer, trigger=at_snapshot())
        if not args.resume:
            trainer.extend(kept(checkpointer, os.path.join(args.out, 'kept')),
                           name='keep', trigger=at_snapshot())
    _anyloop.record_observations(trainer, comm, observed)
    return model, optimizer, trainer, checkpointer


def kept(checkpointer, folder):
    """An extension that copies the checkpointer's files into ``folder``
    (called after the checkpointer, at the same iteration)."""
    def keep(trainer):
        os.makedirs(folder, exist_ok=True)
        for name in checkpointer.files:
            shutil.copy(os.path.join(checkpointer.path, name), folder)
    return keep


def own_snapshot(rank_0_snapshot, comm):
    """This rank's snapshot beside rank 0's."""
    folder, name = os.path.split(rank_0_snapshot)
    assert name.startswith('snapshot_rank0_'), rank_0_snapshot
    return os.path.join(folder, name.replace(
        'snapshot_rank0_', 'snapshot_rank{}_'.format(comm.rank), 1))


def logged(trainer):
    """Rank 0's LogReport entries, without the wall-clock times."""
    if 'LogReport' not in trainer._extensions:
        return None
    return [{key: value for key, value in entry.items()
             if key != 'elapsed_time'}
            for entry in trainer.get_extension('LogReport').log]


def main():
    args = _anyloop.parse_args(__doc__.splitlines()[0], add_arguments)
    comm = _anyloop.start(args)
    with _anyloop.abort_on_exception(comm):
        observed = []
        model, optimizer, trainer, checkpointer = build_trainer(
            comm,
            _anyloop.multi_node_optimizer_factory(args.impl, args.device),
            args, observed)
        if args.resume and checkpointer is not None:
            checkpointer.maybe_load(trainer, optimizer)
            assert trainer.updater.iteration == args.snapshot_at, \
                trainer.updater.iteration
        elif args.resume:
            chainer.serializers.load_npz(own_snapshot(args.resume, comm),
                                         trainer)
        optimizer.update()  # ChainerMN's first update: the broadcast
        trainer.run()
        values = {'observed': observed, 'log': logged(trainer),
                  'iteration': trainer.updater.iteration, 't': optimizer.t}
        _anyloop.write_results(comm, args.out, {'model': model}, values)
        _anyloop.finish(comm, 'anyloop-trainer-resume')


if __name__ == '__main__':
    main()
