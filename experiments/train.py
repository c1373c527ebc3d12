"""Trains a network with a chosen data parallel updater.

Example::

    python -m experiments.train --net resnet152 --updater cgdp \\
        --devices @numpy,@numpy --batchsize 8 --image-size 64 \\
        --iterations 20 --out result

``--net`` is one of the four reference networks or ``module:callable``,
any model (see :mod:`models.custom`), e.g. ``--net models.examples:tiny``.

Runs on Chainer's :class:`~chainer.training.Trainer` with a log, a printed
report, a progress bar and snapshots (``snapshot_iter_N`` every
``--snapshot-every`` iterations and at the end). Training is deterministic:
the model's initial weights, the synthetic data, the order of the examples,
the augmentation of real images and the global random state used by dropout
all derive from ``--seed`` and the iteration, so ``--resume`` from a snapshot
ends with exactly the parameters of an uninterrupted run.

Nothing is overwritten without asking: every value and path is checked
before any work starts, and a ``--out`` folder that already holds files is
refused unless ``--resume`` continues the run whose snapshots it holds, or
``--force`` replaces the earlier run's log and snapshots (see
:func:`check_outputs`). Resuming from a snapshot taken at ``--iterations``
reports that the run is complete and trains nothing (exit 0); one taken
later is refused (exit 2). Snapshots are written by Chainer's snapshot
writer, which saves to a temporary folder in ``--out`` and moves the file
into place, and the trace through :mod:`cgdp_chainer.files`, so a crash
leaves the previous file or the complete new one.

:func:`build_model`, :func:`build_optimizer`, :func:`build_iterator` and
:func:`build_updater` are the construction steps, reused by the other
experiment scripts.

Several processes (MPI)::

    mpiexec -n 2 python -m experiments.train --net resnet152 \
        --updater cgdp --devices @numpy,@numpy --batchsize 8 ...

Under an MPI launch (:func:`cgdp_chainer.mpi.launched_with_mpi`) every rank
trains on its shard of the data (:func:`cgdp_chainer.mpi.shard_dataset`, one
shuffled split shared by all ranks) and ``--batchsize`` is the batch of ONE
rank, spread over its ``--devices``: the global batch is ranks x batchsize.
``--updater cgdp`` sums each chunk's gradients over the local devices and
then across the ranks (``CGDPUpdater(..., mpi_comm=MPI.COMM_WORLD)``);
``--updater chainermn`` is the ChainerMN baseline, one device per rank
(:func:`cgdp_chainer.mpi.make_chainermn_updater`); ``standard`` and
``parallel`` do not communicate and are refused with more than one rank.
Several ranks on one machine take distinct GPUs (see :func:`rank_devices`).
Rank 0 alone writes the log, the snapshots, the trace and prints the
report and progress bar (its log shows rank 0's loss over its share of the
batch); an exception or Ctrl-C on any rank aborts the whole job
(:func:`cgdp_chainer.mpi.install_abort_hooks`), so no rank waits forever.
"""
import os
import re
import sys
import time
import zipfile

from experiments import cli  # NOQA: first, it silences import-time warnings

from cgdp_chainer import datasets
from cgdp_chainer import devices as devices_module
from cgdp_chainer import mpi as cgdp_mpi

import chainer
from chainer import training
from chainer.training import extensions
import numpy

UPDATERS = ('standard', 'parallel', 'cgdp', 'chainermn')
# Updaters that communicate across MPI ranks.
MPI_UPDATERS = ('cgdp', 'chainermn')
# 'find': CGDPUpdater's own default (reduction=None), found at the first
# iteration from the model's loss; the command line's default.
FIND_REDUCTION = 'find'
REDUCTIONS = (FIND_REDUCTION, 'mean', 'sum')
# None: CGDPUpdater's own default (chunks of at least 1 MiB of parameters).
DEFAULT_CHUNK_SIZE = None
# build_updater's reduction when none is given: the experiments train
# classifiers whose loss is a mean, and skip the check that finds it.
DEFAULT_REDUCTION = 'mean'
# The command line's updater: the one this project is about.
DEFAULT_UPDATER = 'cgdp'
REPORT_ENTRIES = ['iteration', 'main/loss', 'main/accuracy', 'elapsed_time']
# The files a run writes into --out: the log and the snapshots.
LOG_FILE = 'log'
SNAPSHOT_PATTERN = re.compile(r'^snapshot_iter_(\d+)$')
# Where a snapshot of this script (any updater) keeps the iteration.
_SNAPSHOT_ITERATION_KEY = 'updater/iteration'

# Tag of the stream that reseeds the global random state (see
# ReseedGlobalRandom); distinct from the streams of cgdp_chainer.datasets.
_STREAM_GLOBAL = 101


def build_model(net, n_classes=1000, seed=0):
    """The network ``net`` with fixed initial weights, wrapped for training.

    Args:
        net (str): A name in ``models.NETWORKS``, or ``module:callable``
            (:func:`models.get_model`; its classes are its own).
        n_classes (int): Number of output classes.
        seed (int): Seed of the initial weights.

    Returns:
        models.Classifier: The classifier; its ``predictor`` is the network.
    """
    import models
    return models.Classifier(
        models.get_model(net, n_classes=n_classes, seed=seed))


def build_optimizer(model, lr=0.01, momentum=0.9):
    """MomentumSGD set up on ``model``.

    Args:
        model (chainer.Link): The model to optimize.
        lr (float): Learning rate.
        momentum (float): Momentum.

    Returns:
        chainer.optimizers.MomentumSGD: The optimizer.
    """
    optimizer = chainer.optimizers.MomentumSGD(lr=lr, momentum=momentum)
    optimizer.setup(model)
    return optimizer


def build_dataset(image_size, n_classes=1000, seed=0, length=1024,
                  train_list=None, root='.'):
    """The training data: synthetic, or the images of a list file.

    Args:
        image_size (int): Side of the images given to the network (the crop
            size for real images).
        n_classes (int): Number of classes (labels of a list must be below).
        seed (int): Seed of the synthetic data or of the augmentation.
        length (int): Number of synthetic examples.
        train_list (str or None): A ``PATH LABEL`` list file; synthetic data
            if ``None``.
        root (str): Folder the list's paths are relative to.

    Returns:
        chainer.dataset.DatasetMixin: The dataset.

    Raises:
        cgdp_chainer.datasets.ImageListError: The list is missing or bad.
    """
    if train_list is None:
        return datasets.SyntheticImageNet(length, image_size,
                                          n_classes=n_classes, seed=seed)
    return datasets.image_list_dataset(train_list, root, image_size,
                                       train=True, seed=seed,
                                       n_classes=n_classes)


def build_iterator(dataset, batchsize, seed=0):
    """A repeating iterator whose shuffled order depends only on ``seed``.

    Args:
        dataset: The training dataset.
        batchsize (int): Examples per iteration, over all devices.
        seed (int): Seed of the order.

    Returns:
        cgdp_chainer.datasets.SeededSerialIterator: The iterator.
    """
    return datasets.SeededSerialIterator(dataset, batchsize, seed=seed)


class _ResumableParallelUpdater(training.updaters.ParallelUpdater):
    """Chainer's ParallelUpdater, with replicas refreshed after a resume.

    ParallelUpdater copies the model into its replicas when it is built and
    copies the parameters back only after each update, so after loading a
    snapshot the replicas would compute the first gradients from the initial
    weights. Copying the loaded parameters into them fixes that; everything
    else is Chainer's.
    """

    def serialize(self, serializer):
        super(_ResumableParallelUpdater, self).serialize(serializer)
        if isinstance(serializer, chainer.serializer.Deserializer):
            main_model = self.get_optimizer('main').target
            for model in self._models.values():
                if model is not main_model:
                    model.copyparams(main_model)


def _device_specs(devices):
    return [device if isinstance(device, str) else device.name
            for device in devices]


def build_updater(kind, iterator, optimizer, devices, chunk_size=None,
                  reduction=None, timeline=None, comm=None, **cgdp_options):
    """The updater of one of the training modes.

    Args:
        kind (str): ``'standard'`` (StandardUpdater on one device),
            ``'parallel'`` (Chainer's ParallelUpdater, devices named
            ``main``, ``replica1``, ...), ``'cgdp'``
            (:class:`cgdp_chainer.CGDPUpdater`) or ``'chainermn'`` (the
            ChainerMN baseline, one device per rank; needs ``comm``).
        iterator: The training iterator (this rank's, under MPI).
        optimizer: The optimizer, set up on the model.
        devices (sequence): Device specifiers or Chainer devices, one per
            replica (of this rank).
        chunk_size (int, str or None): CGDP chunk size (``'auto'``,
            ``'model'`` or a positive int); CGDP's default if ``None``.
        reduction (str or None): CGDP gradient reduction, ``'mean'`` or
            ``'sum'``, or :data:`FIND_REDUCTION` (CGDPUpdater finds it at
            the first iteration); :data:`DEFAULT_REDUCTION` if ``None``.
        timeline (cgdp_chainer.Timeline or None): CGDP event recorder.
        comm (mpi4py.MPI.Comm or None): The ranks to train with: CGDP's
            ``mpi_comm``, or ChainerMN's communicator. Collective when
            given: every rank builds its updater at the same point.
        **cgdp_options: Further keyword arguments of CGDPUpdater (e.g.
            ``blas_threads``).

    Returns:
        chainer.training.Updater: The updater (it places the model).

    Raises:
        ValueError: Unknown kind or device, more than one device for
            ``'standard'`` or ``'chainermn'``, CGDP options for another
            kind, ``'chainermn'`` without ``comm``, or ``'standard'`` or
            ``'parallel'`` with a ``comm`` of more than one rank.
    """
    specs = _device_specs(devices)
    parsed = devices_module.parse_devices(specs)
    if kind != 'cgdp':
        _refuse_cgdp_options(kind, chunk_size, reduction, timeline,
                             cgdp_options)
    if kind in ('standard', 'parallel'):
        _refuse_several_ranks(kind, comm)
    if kind == 'standard':
        return _standard_updater(iterator, optimizer, parsed)
    if kind == 'parallel':
        return _parallel_updater(iterator, optimizer, parsed)
    if kind == 'cgdp':
        return _cgdp_updater(iterator, optimizer, specs, chunk_size,
                             reduction, timeline, comm, cgdp_options)
    if kind == 'chainermn':
        return _chainermn_updater(iterator, optimizer, parsed, comm)
    raise ValueError('unknown updater {!r}; choose from {}'.format(
        kind, ', '.join(UPDATERS)))


def _refuse_cgdp_options(kind, chunk_size, reduction, timeline,
                         cgdp_options):
    """Refuses CGDP's options given to another updater.

    Args:
        kind (str): The updater asked for (not ``'cgdp'``).
        chunk_size, reduction, timeline: As given to :func:`build_updater`
            (None: not given).
        cgdp_options (dict): Further CGDPUpdater keyword arguments given.

    Raises:
        ValueError: One of them was given.
    """
    for name, value in (('chunk_size', chunk_size),
                        ('reduction', reduction), ('timeline', timeline)):
        if value is not None:
            raise ValueError('{} applies only to the cgdp updater, not '
                             '{!r}'.format(name, kind))
    if cgdp_options:
        raise ValueError('{} apply only to the cgdp updater'.format(
            ', '.join(sorted(cgdp_options))))


def _refuse_several_ranks(kind, comm):
    """Refuses a single-process updater on a communicator of several ranks.

    Args:
        kind (str): ``'standard'`` or ``'parallel'``.
        comm (mpi4py.MPI.Comm or None): The ranks to train with.

    Raises:
        ValueError: ``comm`` has more than one rank.
    """
    if comm is not None and cgdp_mpi.as_mpi_comm(comm).Get_size() > 1:
        raise ValueError('the {} updater does not communicate across MPI '
                         'ranks; use cgdp or chainermn'.format(kind))


def _standard_updater(iterator, optimizer, parsed):
    """Chainer's StandardUpdater on the one device of ``parsed``."""
    if len(parsed) != 1:
        raise ValueError('the standard updater takes one device, got '
                         '{}; use parallel or cgdp'.format(len(parsed)))
    return training.updaters.StandardUpdater(
        iterator, optimizer, device=parsed[0])


def _parallel_updater(iterator, optimizer, parsed):
    """Chainer's ParallelUpdater on ``parsed``: ``main``, ``replica1``, ..."""
    device_dict = {'main': parsed[0]}
    for index, device in enumerate(parsed[1:], start=1):
        device_dict['replica{}'.format(index)] = device
    return _ResumableParallelUpdater(iterator, optimizer,
                                     devices=device_dict)


def _cgdp_updater(iterator, optimizer, specs, chunk_size, reduction,
                  timeline, comm, cgdp_options):
    """CGDPUpdater with this script's defaults (see :func:`build_updater`).

    Args:
        iterator: The training iterator.
        optimizer: The optimizer, set up on the model.
        specs (list of str): The device specifiers.
        chunk_size (int, str or None): None: :data:`DEFAULT_CHUNK_SIZE`.
        reduction (str or None): None: :data:`DEFAULT_REDUCTION`;
            :data:`FIND_REDUCTION`: found by CGDPUpdater.
        timeline (cgdp_chainer.Timeline or None): Event recorder.
        comm (mpi4py.MPI.Comm or None): CGDP's ``mpi_comm`` if given.
        cgdp_options (dict): Further CGDPUpdater keyword arguments.
    """
    from cgdp_chainer import CGDPUpdater
    options = dict(cgdp_options)
    if comm is not None:
        options['mpi_comm'] = comm
    return CGDPUpdater(
        iterator, optimizer, specs,
        chunk_size=DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size,
        reduction={None: DEFAULT_REDUCTION, FIND_REDUCTION: None}.get(
            reduction, reduction),
        timeline=timeline, **options)


def _chainermn_updater(iterator, optimizer, parsed, comm):
    """The ChainerMN baseline on the one device of ``parsed`` per rank.

    Args:
        iterator: This rank's training iterator.
        optimizer: The optimizer, set up on the model.
        parsed (list of chainer.backend.Device): This rank's devices.
        comm (mpi4py.MPI.Comm or None): The ranks (required).
    """
    if comm is None:
        raise ValueError('the chainermn updater needs an MPI '
                         'communicator (comm=)')
    if len(parsed) != 1:
        raise ValueError('the chainermn updater takes one device per '
                         'rank, got {}; use cgdp for several'.format(
                             len(parsed)))
    # CGDPUpdater checks this itself; ChainerMN would only broadcast.
    cgdp_mpi.check_consistency(comm, optimizer.target, optimizer)
    return cgdp_mpi.make_chainermn_updater(iterator, optimizer, comm,
                                           parsed[0])


def _global_seed(seed, iteration, rank=0):
    entropy = [_STREAM_GLOBAL, seed, iteration]
    if rank:
        # Other ranks draw other dropout masks; rank 0 (and a run without
        # MPI) keeps the single-process stream.
        entropy.append(rank)
    sequence = numpy.random.SeedSequence(entropy)
    return int(sequence.generate_state(1)[0])


class ReseedGlobalRandom(training.Extension):
    """Reseeds the global random states from ``(seed, iteration)``.

    Dropout draws its masks from NumPy's (or CuPy's) global random state,
    which snapshots do not save. Reseeding before every iteration from the
    seed and the iteration number makes the masks of iteration ``k`` the same
    whether or not the run was resumed on the way.

    Args:
        seed (int): The run's seed.
        rank (int): The MPI rank (0 without MPI); ranks draw different
            masks for their different examples.
    """

    trigger = 1, 'iteration'
    priority = training.PRIORITY_WRITER

    def __init__(self, seed, rank=0):
        self.seed = seed
        self.rank = rank

    def _reseed(self, trainer):
        value = _global_seed(self.seed, trainer.updater.iteration, self.rank)
        numpy.random.seed(value)
        cupy = devices_module.cupy_module()
        if cupy is not None:
            cupy.random.seed(value)

    def initialize(self, trainer):
        # Before the first iteration of this run (after a resume, too).
        self._reseed(trainer)

    def __call__(self, trainer):
        # After iteration k, for iteration k + 1.
        self._reseed(trainer)


def _save_npz_uncompressed(filename, obj):
    # Weights and momenta are noise to zlib: compressing a ResNet-152
    # snapshot takes tens of seconds and saves almost nothing. Chainer's
    # snapshot writer passes a name in a temporary folder inside --out and
    # moves the finished file into place, so a crash while saving leaves
    # the previous snapshot of that name (or none), never a cut one.
    chainer.serializers.save_npz(filename, obj, compression=False)


def _default_interval(iterations):
    return max(1, min(10, iterations // 10))


def build_trainer(updater, iterations, out, snapshot_every=None,
                  log_interval=None, seed=0, rank=0):
    """The Trainer with log, printed report, progress bar and snapshots.

    Under MPI only rank 0 gets the extensions that write (log, report,
    progress bar, snapshots); every rank reseeds its random state.

    Args:
        updater: The updater.
        iterations (int): Stop after this many iterations in total.
        out (str): Output folder (``log``, ``snapshot_iter_N``).
        snapshot_every (int or None): Also snapshot every so many
            iterations; only at the end if ``None``.
        log_interval (int or None): Iterations between log entries and
            progress bar updates; between 1 and 10 by default.
        seed (int): Seed for the global random states (dropout).
        rank (int): The MPI rank (0 without MPI).

    Returns:
        chainer.training.Trainer: The trainer.
    """
    trainer = training.Trainer(updater, (iterations, 'iteration'), out=out)
    trainer.extend(ReseedGlobalRandom(seed, rank))
    if rank != 0:
        return trainer
    interval = log_interval or _default_interval(iterations)

    def snapshot_due(trainer):
        iteration = trainer.updater.iteration
        return iteration == iterations or bool(
            snapshot_every and iteration % snapshot_every == 0)

    trainer.extend(extensions.LogReport(trigger=(interval, 'iteration')))
    # Chainer binds sys.stdout as a default argument at import time; passing
    # the current one lets callers (and pytest) redirect the output.
    trainer.extend(extensions.PrintReport(REPORT_ENTRIES, out=sys.stdout))
    trainer.extend(extensions.ProgressBar(update_interval=interval,
                                          out=sys.stdout))
    trainer.extend(
        extensions.snapshot(savefun=_save_npz_uncompressed,
                            filename='snapshot_iter_{.updater.iteration}'),
        trigger=snapshot_due)
    return trainer


def build_parser():
    """The command-line parser of this script."""
    parser = cli.ArgumentParser(
        prog='python -m experiments.train',
        description='Train a network with the standard, parallel '
                    'or CGDP updater; under mpiexec with CGDP or ChainerMN '
                    'across the ranks.')
    parser.add_argument('--net', required=True, type=cli.net_spec,
                        help='network: alexnet, googlenet, vgg16, resnet152, '
                             'or module:callable, a function that returns a '
                             'chainer.Link giving class scores (e.g. '
                             'models.examples:resnet50)')
    parser.add_argument('--updater', choices=UPDATERS, default=DEFAULT_UPDATER,
                        help='standard: one device; parallel: Chainer\'s '
                             'ParallelUpdater; cgdp: CGDPUpdater (across the '
                             'ranks under mpiexec); chainermn: the ChainerMN '
                             'baseline, one device per rank, needs mpiexec '
                             '(default: %(default)s)')
    device_group = parser.add_mutually_exclusive_group()
    device_group.add_argument(
        '--devices', type=cli.device_list, dest='devices', metavar='LIST',
        help="comma-separated replicas: '@numpy' or -1 (may repeat), "
             "'@cupy:N' or N (GPU N), as in -1,-1 or 0,1 (default: @numpy)")
    device_group.add_argument('--device', type=cli.single_device,
                              dest='devices', metavar='DEVICE',
                              help='one device (alias of --devices)')
    parser.add_argument('--batchsize', '-b', type=cli.positive_int,
                        default=8, metavar='N',
                        help='examples per iteration, over all devices '
                             'of this process; under mpiexec per rank, so '
                             'the global batch is ranks x N (default: 8)')
    parser.add_argument('--image-size', type=cli.positive_int, default=224,
                        metavar='PX', help='side of the input images, the '
                        'crop size for --train-list (default: 224)')
    parser.add_argument('--iterations', type=cli.positive_int, default=20,
                        metavar='N', help='iterations in total (default: 20)')
    parser.add_argument('--classes', type=cli.positive_int, default=1000,
                        metavar='N', help='number of classes (default: 1000)')
    parser.add_argument('--out', '-o', default='result', metavar='DIR',
                        help='folder of the log and snapshots '
                             '(default: result)')
    parser.add_argument('--resume', metavar='SNAPSHOT',
                        help='snapshot file to resume from; --out may be '
                             'the snapshot\'s own folder')
    parser.add_argument('--force', action='store_true',
                        help='replace the log and snapshots of an earlier '
                             'run in --out (and an existing --trace file) '
                             'instead of refusing')
    parser.add_argument('--snapshot-every', type=cli.positive_int,
                        metavar='K', help='also snapshot every K iterations '
                                          '(default: only at the end)')
    parser.add_argument('--log-interval', type=cli.positive_int, metavar='N',
                        help='iterations between log entries and progress '
                             'bar updates (default: 1 to 10)')
    parser.add_argument('--train-list', metavar='LIST',
                        help='"PATH LABEL" list of training images; '
                             'synthetic data if not given')
    parser.add_argument('--root', default='.', metavar='DIR',
                        help='folder the --train-list paths are relative to')
    parser.add_argument('--train-length', type=cli.positive_int,
                        default=1024, metavar='N',
                        help='number of synthetic examples (default: 1024)')
    parser.add_argument('--chunk-size', type=cli.chunk_size, metavar='SIZE',
                        help="CGDP chunk size: N layers, 'auto' or 'model' "
                             "(default: the updater's, chunks of at least "
                             "1 MiB)")
    parser.add_argument('--reduction', choices=REDUCTIONS,
                        help="CGDP gradient reduction; find (default): "
                             "found from the loss at the first iteration")
    parser.add_argument('--trace', metavar='FILE',
                        help='write a Chrome trace JSON of the CGDP '
                             'timeline to this file')
    parser.add_argument('--seed', type=cli.non_negative_int, default=0,
                        help='seed of the weights, data, order and dropout '
                             '(default: 0)')
    parser.add_argument('--lr', type=cli.positive_float, default=0.01,
                        help='MomentumSGD learning rate (default: 0.01)')
    parser.add_argument('--momentum', type=float, default=0.9,
                        help='MomentumSGD momentum (default: 0.9)')
    return parser


def parse_args(argv=None):
    """Parses and checks the command line; exits with 2 on bad input.

    Args:
        argv (list of str or None): Arguments; ``sys.argv[1:]`` if ``None``.

    Returns:
        argparse.Namespace: The arguments, ``devices`` a list of specifiers,
        and ``resume_iteration``, the iteration of the ``--resume``
        snapshot (``None`` without one).
    """
    args = build_parser().parse_args(argv)
    if args.devices is None:
        args.devices = ['@numpy']
    n_devices = len(args.devices)
    if args.batchsize < n_devices:
        cli.fail('--batchsize {} is smaller than the number of devices ({}); '
                 'every device needs at least one example'.format(
                     args.batchsize, n_devices))
    if args.updater == 'standard' and n_devices != 1:
        cli.fail('--updater standard runs on one device, got {}; use '
                 '--updater parallel or cgdp'.format(n_devices))
    if args.updater == 'chainermn':
        if not cgdp_mpi.launched_with_mpi():
            cli.fail('--updater chainermn runs one process per device and '
                     'needs an MPI launch: mpiexec -n R python -m '
                     'experiments.train --updater chainermn ...')
        if n_devices != 1:
            cli.fail('--updater chainermn takes one device per rank, got '
                     '{}; use --updater cgdp for several devices per '
                     'rank'.format(n_devices))
    if args.updater != 'cgdp':
        for option, value in (('--chunk-size', args.chunk_size),
                              ('--reduction', args.reduction),
                              ('--trace', args.trace)):
            if value is not None:
                cli.fail('{} applies only to --updater cgdp'.format(option))
    if not 0 <= args.momentum < 1:
        cli.fail('--momentum must be in [0, 1), got {}'.format(
            args.momentum))
    if args.train_list is None and args.root != '.':
        cli.fail('--root applies only with --train-list')
    # After the cheap checks: a module:callable model is built and probed.
    cli.check_net(args.net, args.classes, args.image_size)
    args.resume_iteration = None
    if args.resume is not None:
        args.resume_iteration = snapshot_iteration(args.resume)
        if args.resume_iteration > args.iterations:
            cli.fail('snapshot {} is at iteration {}, past --iterations {}; '
                     'pass --iterations {} or more to continue that '
                     'run'.format(args.resume, args.resume_iteration,
                                  args.iterations,
                                  args.resume_iteration + 1))
    return args


def snapshot_iteration(path):
    """The iteration a snapshot of this script was taken at; exits with 2
    if ``path`` is not such a snapshot.

    Reads only that entry of the file, not the weights.

    Args:
        path (str): The ``--resume`` file.

    Returns:
        int: The updater's iteration stored in the snapshot.
    """
    if not os.path.isfile(path):
        cli.fail('--resume: snapshot {!r} does not exist'.format(path))
    try:
        with numpy.load(path) as arrays:
            if _SNAPSHOT_ITERATION_KEY not in arrays.files:
                cli.fail('--resume: {} is not a snapshot of '
                         'experiments.train (it has no {})'.format(
                             path, _SNAPSHOT_ITERATION_KEY))
            return int(arrays[_SNAPSHOT_ITERATION_KEY])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        # Not an npz file, or one cut short: bad input, not a bug.
        cli.fail('--resume: cannot read snapshot {}: {}: {}'.format(
            path, type(error).__name__, error))


def _snapshots(folder):
    """``{iteration: file name}`` of the snapshots in ``folder``."""
    found = {}
    for name in os.listdir(folder):
        match = SNAPSHOT_PATTERN.match(name)
        if match:
            found[int(match.group(1))] = name
    return found


def _same_folder(first, second):
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _names(names, limit=4):
    names = sorted(names)
    shown = ', '.join(names[:limit])
    if len(names) > limit:
        shown += ' and {} more'.format(len(names) - limit)
    return shown


def check_outputs(args):
    """Checks ``--out`` and ``--trace`` before any work; exits with 2.

    Both are probed for writing (nothing is created). ``--out`` must be
    new or empty, with two exceptions: with ``--resume`` it may be the
    snapshot's own folder, as long as it holds no snapshot taken after the
    one resumed from (those belong to the run being replayed); and
    ``--force`` accepts any folder, replacing the earlier run's log and
    snapshots. An existing ``--trace`` file is replaced only with
    ``--force``.

    Args:
        args (argparse.Namespace): The checked arguments.

    Returns:
        list of str: The files of an earlier run to remove before training
        (only with ``--force``), paths under ``--out``.
    """
    cli.check_output_folder('--out', args.out)
    if args.trace is not None:
        cli.check_output_file('--trace', args.trace)
        if os.path.exists(args.trace) and not args.force:
            cli.fail('--trace {} already exists; choose another file, or '
                     'pass --force to replace it'.format(args.trace))
    if not os.path.isdir(args.out) or not os.listdir(args.out):
        return []
    snapshots = _snapshots(args.out)
    own_folder = args.resume is not None and _same_folder(
        os.path.dirname(os.path.abspath(args.resume)), args.out)
    if own_folder:
        later = [name for iteration, name in snapshots.items()
                 if iteration > args.resume_iteration]
        if later and not args.force:
            cli.fail('--out {} holds snapshots taken after iteration {} of '
                     'the run being resumed ({}); resuming into it would mix '
                     'two runs: choose a new --out, or pass --force to '
                     'remove them'.format(args.out, args.resume_iteration,
                                          _names(later)))
        return [os.path.join(args.out, name) for name in later]
    if not args.force:
        held = _names(os.listdir(args.out))
        cli.fail('--out {} already holds files ({}) of an earlier run; '
                 'choose a new --out, resume with --resume {}, or pass '
                 '--force to replace its log and snapshots'.format(
                     args.out, held, os.path.join(
                         args.out, snapshots[max(snapshots)]) if snapshots
                     else 'SNAPSHOT'))
    earlier = list(snapshots.values())
    if os.path.isfile(os.path.join(args.out, LOG_FILE)):
        earlier.append(LOG_FILE)
    return [os.path.join(args.out, name) for name in earlier]


def prepare_outputs(args, replaced):
    """Removes the files ``--force`` replaces and creates the folders.

    Called once every check has passed, just before training.

    Args:
        args (argparse.Namespace): The checked arguments.
        replaced (list of str): Files from :func:`check_outputs`.
    """
    for path in replaced:
        os.remove(path)
    if replaced:
        print('--force: removed {} of an earlier run from {}'.format(
            _names([os.path.basename(p) for p in replaced]), args.out),
            flush=True)
    os.makedirs(args.out, exist_ok=True)
    if args.trace is not None:
        os.makedirs(os.path.dirname(os.path.abspath(args.trace)),
                    exist_ok=True)


def _shard(dataset, comm, seed):
    """This rank's shard of ``dataset`` (one shuffled split for all ranks).

    The split is shuffled, so that a list sorted by class does not give
    each rank a few classes only; the dataset's ``set_epoch`` (real images'
    augmentation) stays reachable for the iterator.
    """
    shard = cgdp_mpi.shard_dataset(dataset, comm, shuffle=True, seed=seed)
    set_epoch = getattr(dataset, 'set_epoch', None)
    if set_epoch is not None:
        shard.set_epoch = set_epoch
    return shard


def run(args, comm=None):
    """Trains as ``args`` say (see :func:`parse_args`).

    Every remaining check comes before any file is written: the outputs
    (:func:`check_outputs`, on rank 0), the chunk size against the built
    network's stages, and the training list with its images' headers. A
    training image that fails to decode during the run ends it with one
    ``error:`` line naming the list line (exit 2); the snapshots written
    until then are kept.

    Args:
        args (argparse.Namespace): Checked arguments.
        comm (mpi4py.MPI.Comm or None): The ranks to train with (see the
            module's docstring); ``None``: one process.

    Returns:
        chainer.training.Trainer: The trainer after the run.
    """
    rank = 0 if comm is None else comm.Get_rank()
    replaced = check_outputs(args) if rank == 0 else []
    model = _checked_model(args)
    dataset = _checked_dataset(args)
    if rank == 0:
        prepare_outputs(args, replaced)
    if comm is not None:
        dataset = _rank_dataset(dataset, comm, args)
    optimizer = build_optimizer(model, lr=args.lr, momentum=args.momentum)
    iterator = build_iterator(dataset, args.batchsize, seed=args.seed)
    timeline = None
    if args.trace is not None and rank == 0:
        from cgdp_chainer import Timeline
        timeline = Timeline()
    # CGDP derives its replicas' random streams from the global state as
    # the updater is built (cgdp_chainer.randomness): from --seed, too.
    numpy.random.seed(_global_seed(args.seed, 0, rank))
    updater = build_updater(args.updater, iterator, optimizer, args.devices,
                            chunk_size=args.chunk_size,
                            reduction=args.reduction or (
                                FIND_REDUCTION if args.updater == 'cgdp'
                                else None), timeline=timeline,
                            comm=comm)
    trainer, seconds = _train(args, updater, rank)
    if rank != 0:
        return trainer
    _report(args, updater, timeline, seconds)
    return trainer


def _checked_model(args):
    """The network of ``args``, its chunk size checked against its layers.

    Args:
        args (argparse.Namespace): Checked arguments.

    Returns:
        models.Classifier: The model (see :func:`build_model`).
    """
    model = build_model(args.net, n_classes=args.classes, seed=args.seed)
    if args.updater == 'cgdp':
        from cgdp_chainer.runtime.replica import readiness
        cli.check_chunk_size(args.chunk_size, args.net,
                             readiness.count_layers(model))
    return model


def _checked_dataset(args):
    """The training data of ``args``; a bad list or image exits with 2.

    Args:
        args (argparse.Namespace): Checked arguments.

    Returns:
        chainer.dataset.DatasetMixin: The dataset (see
        :func:`build_dataset`).
    """
    try:
        return build_dataset(args.image_size, n_classes=args.classes,
                             seed=args.seed, length=args.train_length,
                             train_list=args.train_list, root=args.root)
    except datasets.ImageListError as error:
        cli.fail(str(error))


def _rank_dataset(dataset, comm, args):
    """This rank's shard of ``dataset``; rank 0 describes the split.

    Args:
        dataset: The whole training data.
        comm (mpi4py.MPI.Comm): The ranks to train with.
        args (argparse.Namespace): Checked arguments.

    Returns:
        The shard (see :func:`_shard`).
    """
    dataset = _shard(dataset, comm, args.seed)
    if comm.Get_rank() == 0:
        size = comm.Get_size()
        print('MPI: {} ranks x {} device(s); batch {} per rank, {} in '
              'all; {} examples per rank; rank 0 writes the log and '
              'snapshots'.format(size, len(args.devices), args.batchsize,
                                 args.batchsize * size, len(dataset)),
              flush=True)
    return dataset


def _train(args, updater, rank):
    """Builds the trainer, resumes it if asked, and trains.

    The updater is finalized here if training never starts (the trainer
    finalizes it once it runs).

    Args:
        args (argparse.Namespace): Checked arguments.
        updater: The updater (see :func:`build_updater`).
        rank (int): The MPI rank (0 without MPI).

    Returns:
        tuple: ``(trainer, seconds)``: the trainer after the run and the
        seconds its run took.
    """
    started = False
    try:
        trainer = build_trainer(updater, args.iterations, args.out,
                                snapshot_every=args.snapshot_every,
                                log_interval=args.log_interval,
                                seed=args.seed, rank=rank)
        if args.resume is not None:
            _resume(trainer, args.resume)
        start_time = time.perf_counter()
        started = True
        _run_trainer(trainer, updater, args.out, rank)
    finally:
        if not started:
            updater.finalize()
    return trainer, time.perf_counter() - start_time


def _resume(trainer, path):
    """Loads the snapshot ``path`` into ``trainer``; exits with 2 if bad.

    Args:
        trainer (chainer.training.Trainer): The trainer.
        path (str): The ``--resume`` snapshot.
    """
    try:
        chainer.serializers.load_npz(path, trainer)
    except Exception as error:
        # Another network's snapshot, or a file damaged beyond its
        # iteration entry: bad input, not a bug.
        cli.fail('cannot resume from {!r}: {}: {}'.format(
            path, type(error).__name__, error))


def _run_trainer(trainer, updater, out, rank):
    """Runs ``trainer``; an image that fails to decode exits with 2.

    Args:
        trainer (chainer.training.Trainer): The trainer.
        updater: Its updater (for the iteration reached).
        out (str): The ``--out`` folder (for the snapshots kept).
        rank (int): The MPI rank (0 without MPI).
    """
    try:
        # Chainer's own report of a loop exception is a second
        # traceback; an unexpected error still gets Python's.
        trainer.run(show_loop_exception_msg=False)
    except datasets.ImageListError as error:
        # The trainer has finalized the updater and kept its snapshots.
        kept = _snapshots(out) if rank == 0 else {}
        cli.fail('{}; training stopped after iteration {} ({})'.format(
            error, updater.iteration,
            'kept {} in {}'.format(_names(kept.values()), out)
            if kept else 'no snapshot was taken'))


def _report(args, updater, timeline, seconds):
    """Writes the trace and prints what was trained (rank 0).

    Args:
        args (argparse.Namespace): Checked arguments.
        updater: The updater after the run.
        timeline (cgdp_chainer.Timeline or None): The recorded events.
        seconds (float): The training time.
    """
    if timeline is not None:
        timeline.export_chrome_trace(args.trace)
        print('wrote the Chrome trace to {}'.format(args.trace))
    print('trained {} to iteration {} in {:.1f} s; log and snapshots in '
          '{}'.format(args.net, updater.iteration, seconds, args.out))


def rank_devices(specs, local_rank):
    """This rank's devices when several ranks share a machine.

    ``--devices`` names the GPUs of the first rank on each machine; the
    rank with local rank L (L-th on its machine) takes the same number of
    GPUs from ``L x len(specs)`` on, so ``mpiexec -ppn 4 ... --device
    @cupy:0`` gives the four ranks of a node GPUs 0, 1, 2 and 3. CPU
    replicas stay as they are.

    Args:
        specs (list of str): The ``--devices`` specifiers.
        local_rank (int): This rank's index among the ranks on its machine.

    Returns:
        list of str: The specifiers this rank uses.
    """
    shifted = []
    for spec in specs:
        if spec.startswith('@cupy:'):
            spec = '@cupy:{}'.format(int(spec.split(':', 1)[1])
                                     + local_rank * len(specs))
        shifted.append(spec)
    return shifted


def run_mpi(args, comm):
    """:func:`run` on every rank of ``comm``, ending the job on failure.

    An exception (or Ctrl-C) on any rank aborts the whole job with that
    rank's traceback; bad input found on one rank (its ``error:`` line
    printed) aborts it with status 2. Either way no rank waits forever in
    a collective that another rank will never join.

    Args:
        args (argparse.Namespace): Checked arguments.
        comm (mpi4py.MPI.Comm): The world communicator.

    Returns:
        chainer.training.Trainer: The trainer after the run.
    """
    if comm.Get_size() > 1 and args.updater not in MPI_UPDATERS:
        # Every rank reaches this verdict: a clean exit 2 everywhere.
        cli.fail('--updater {} does not communicate across MPI ranks ({} '
                 'ranks here); use --updater cgdp or chainermn under '
                 'mpiexec'.format(args.updater, comm.Get_size()))
    cgdp_mpi.install_abort_hooks(comm)
    try:
        local_rank, local_size = cgdp_mpi.node_ranks(comm)
        if local_size > 1:
            args.devices = rank_devices(args.devices, local_rank)
            try:
                devices_module.parse_devices(args.devices)
            except ValueError as error:
                cli.fail('rank {} ({} of {} ranks on its machine) would use '
                         '{}: {}'.format(comm.Get_rank(), local_rank + 1,
                                         local_size, ','.join(args.devices),
                                         error))
        return run(args, comm)
    except SystemExit as error:
        if error.code in (None, 0):
            raise
        sys.stderr.flush()
        code = error.code if isinstance(error.code, int) else 1
        comm.Abort(code)
        raise


def main(argv=None):
    """Command-line entry point.

    Args:
        argv (list of str or None): Arguments; ``sys.argv[1:]`` if ``None``.

    Returns:
        int: Exit status 0 (bad input exits with 2 through SystemExit).
    """
    args = parse_args(argv)
    if args.resume_iteration == args.iterations:
        print('snapshot {} is at iteration {}, which is --iterations: that '
              'run is complete, nothing to train (pass a larger '
              '--iterations to continue it)'.format(args.resume,
                                                    args.iterations))
        return 0
    comm = cgdp_mpi.world()  # None (and MPI untouched) without mpiexec
    if comm is None:
        run(args)
    else:
        run_mpi(args, comm)
    return 0


if __name__ == '__main__':
    sys.exit(main())
