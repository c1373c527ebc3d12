"""Shared by the ChainerMN-shaped scripts that tests/test_any_loop.py runs.

Each script is a Chainer 7.8.1 example cut down to a tiny model, with one
line that differs between the runs it is compared across: the module whose
``create_multi_node_optimizer`` wraps the actual optimizers, chosen by
``--impl chainermn`` (``chainermn``) or ``--impl cgdp`` (``cgdp_chainer``).
Everything else (the communicator, see :func:`start`; the device; the
data, scattered with ``chainermn.scatter_dataset``; the seeds) is the same.

Each rank writes, atomically, into ``--out``:

* ``rank<r>.npz``: every parameter of every model after training, as
  ``<model>/<path>``; each parameter's ``grad`` after the last update as
  ``grad/<model>/<path>`` (absent where it is None); each persistent value
  (BatchNormalization statistics) as ``persistent/<model>/<path>``; and
  whatever else the script names as ``state/...`` (an LSTM's state);
* ``rank<r>.json``: ``{"rank", "values", "per_rank"}``: the values that the
  script reported or logged, and the key prefixes of the npz that differ
  between ranks by design (everything else must be bit-identical).
"""
import argparse
import functools
import importlib
import json
import os
import sys

import _common  # first: it imports cgdp_chainer before Chainer
from _common import cgdp_mpi

import chainer  # NOQA: E402
import chainermn  # NOQA: E402
import numpy  # NOQA: E402

from cgdp_chainer import files  # NOQA: E402

# --impl -> the module whose create_multi_node_optimizer the script calls
# (and the options it gets: 'cgdp-rank-hosts' gives every rank a host of
# its own where the ranks of a machine would share one).
MODULES = {'chainermn': 'chainermn', 'cgdp': 'cgdp_chainer',
           'cgdp-rank-hosts': 'cgdp_chainer'}
OPTIONS = {'cgdp-rank-hosts': {'node_host': False}}

# --device: where the models train. 'standin': on '@numpy', but CGDP's runs
# go through the GPU path of the optimizer form (host shadow, the chunked
# CUDA transfer, copies) with the CPU stand-in of CuPy's copies
# (tests/cuda_standin.py); ChainerMN's run is the plain '@numpy' one.
# 'gpu': every run on the rank's GPU ('@cupy:<intra rank % GPUs>', so two
# ranks share a machine's only GPU), in the scripts that take it.
DEVICES = ('numpy', 'standin', 'gpu')


def device_of(args, comm):
    """The Chainer device of this rank's models for ``--device``, made the
    current one (as Chainer's examples do with ``device.use()``)."""
    if args.device != 'gpu':
        return chainer.get_device('@numpy')
    import cupy
    device = chainer.get_device('@cupy:{}'.format(
        comm.intra_rank % cupy.cuda.runtime.getDeviceCount()))
    device.use()
    return device


def seed(value, device):
    """Seeds NumPy's global random state and, on a GPU, CuPy's: what
    ``xp.random`` and ``F.dropout`` draw from there, so that the runs that
    are compared draw the same numbers."""
    numpy.random.seed(value)
    if device.xp is not numpy:
        device.xp.random.seed(value)

# --comm: ChainerMN's communicator. 'naive' (ChainerMN's own, on the CPU),
# or 'staged': cgdp_chainer.mpi.host_staged's, whose reductions and
# broadcasts copy device arrays to the host for MPI (which is not
# CUDA-aware here) and back; the default on 'gpu'. On the CPU 'staged'
# stages every host array as it would a device array, so that a CPU run
# compares the staging with the naive communicator.
COMMUNICATORS = ('naive', 'staged')

# Per rank by design in every script: BatchNormalization's running
# statistics (each rank normalizes its own batches) and recurrent state.
PER_RANK = ('persistent/', 'state/')


def parse_args(description, add_arguments=None, out=True):
    """``--impl``, ``--out`` (unless ``out`` is False), and the script's
    own arguments."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--impl', choices=sorted(MODULES), required=True,
                        help='whose create_multi_node_optimizer to call')
    parser.add_argument('--device', choices=DEVICES, default='numpy',
                        help='where the models train (see DEVICES)')
    parser.add_argument('--comm', choices=COMMUNICATORS, default=None,
                        help="ChainerMN's communicator (see COMMUNICATORS;"
                        " default: 'staged' on 'gpu', else 'naive')")
    if out:
        parser.add_argument('--out', required=True,
                            help='folder for rank<r>.npz and rank<r>.json')
    if add_arguments is not None:
        add_arguments(parser)
    return parser.parse_args()


def multi_node_optimizer_factory(impl, device='numpy'):
    """``chainermn.create_multi_node_optimizer`` or
    ``cgdp_chainer.create_multi_node_optimizer``: the one switched call
    (with the CPU stand-in of the GPU path for CGDP where ``device`` is
    'standin')."""
    create = getattr(importlib.import_module(MODULES[impl]),
                     'create_multi_node_optimizer')
    options = dict(OPTIONS.get(impl, {}))
    if device == 'standin' and MODULES[impl] == 'cgdp_chainer':
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if tests not in sys.path:
            sys.path.insert(0, tests)
        import cuda_standin
        options['device_copies'] = cuda_standin.HostDeviceCopies
    return functools.partial(create, **options)


def start(args):
    """MPI started (with the hang watchdog), and ChainerMN's communicator
    over COMM_WORLD that ``--comm`` names: the naive one, as the examples
    create it on the CPU, or the host-staged one (see COMMUNICATORS)."""
    world = _common.start_mpi()
    name = args.comm or ('staged' if args.device == 'gpu' else 'naive')
    if name == 'naive':
        return chainermn.create_communicator('naive', mpi_comm=world)
    from cgdp_chainer.mpi import host_staged
    return host_staged.create_host_staged_communicator(
        world, staged=None if args.device == 'gpu' else stage_every_array)


def stage_every_array(array):
    """The host-staged communicator's ``staged`` on the CPU."""
    return True


def abort_on_exception(comm):
    return cgdp_mpi.abort_on_exception(comm)


def model_arrays(name, model):
    """The npz entries of one model: parameters, grads, persistents."""
    arrays = {}
    host = chainer.backend.CpuDevice().send
    for path, param in sorted(model.namedparams()):
        arrays['{}{}'.format(name, path)] = host(param.array)
        if param.grad is not None:
            arrays['grad/{}{}'.format(name, path)] = host(param.grad)
    for path, link in sorted(model.namedlinks()):
        for persistent in sorted(link._persistent):
            arrays['persistent/{}{}/{}'.format(
                name, path.rstrip('/'), persistent)] = numpy.asarray(
                    host(getattr(link, persistent)))
    return arrays


def write_results(comm, out, models, values, state=None, per_rank=()):
    """Writes this rank's ``rank<r>.npz`` and ``rank<r>.json``.

    Args:
        comm: The ChainerMN communicator.
        out (str): The folder (created if missing).
        models (dict): name -> link.
        values (dict): What the script reported or logged (JSON-able).
        state (dict or None): Further arrays, saved as ``state/<key>``.
        per_rank (tuple of str): Key prefixes besides :data:`PER_RANK` that
            differ between ranks by design.
    """
    os.makedirs(out, exist_ok=True)
    arrays = {}
    for name, model in sorted(models.items()):
        arrays.update(model_arrays(name, model))
    host = chainer.backend.CpuDevice().send
    for key, array in sorted((state or {}).items()):
        arrays['state/' + key] = numpy.asarray(host(array))
    stem = os.path.join(out, 'rank{}'.format(comm.rank))
    with files.atomic_write(stem + '.npz', 'wb') as stream:
        numpy.savez(stream, **arrays)
    with files.atomic_write(stem + '.json') as stream:
        json.dump({'rank': comm.rank, 'values': values,
                   'per_rank': list(PER_RANK) + list(per_rank)},
                  stream, indent=1, sort_keys=True)


def scattered_datasets(comm, n_train, n_test, n_features, n_classes):
    """Rank 0 makes train and test sets (see _common.numbered_dataset);
    every rank gets a shard of each, as ``chainermn.scatter_dataset``
    deals them."""
    if comm.rank == 0:
        train = _common.numbered_dataset(n_train, n_features, n_classes, 1)
        test = _common.numbered_dataset(n_test, n_features, n_classes, 2)
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=3)
    test = chainermn.scatter_dataset(test, comm, shuffle=True, seed=4)
    return train, test


def record_observations(trainer, comm, observed):
    """Appends each iteration's observation to ``observed`` (its values as
    floats, by key), and logs every iteration on rank 0 (``LogReport``)."""
    trainer.extend(lambda trainer: observed.append({
        key: as_float(value)
        for key, value in sorted(trainer.observation.items())}),
        name='record', trigger=(1, 'iteration'))
    if comm.rank == 0:
        trainer.extend(chainer.training.extensions.LogReport(
            trigger=(1, 'iteration')))


def as_float(value):
    """A reported value (Variable, array or number) as a Python float."""
    return float(getattr(value, 'array', value))


def finish(comm, name):
    """The line per rank that the test counts (see _common.report_ok)."""
    _common.report_ok(comm.mpi_comm, name)
