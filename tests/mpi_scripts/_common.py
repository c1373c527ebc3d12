"""Shared by the scripts that tests/test_mpi.py runs under mpiexec.

Each script prints ``OK <name> rank <r>`` for every rank on success (all
from rank 0, see :func:`report`); anything else (an assertion, an
exception) aborts the job through ``cgdp_chainer.mpi.abort_on_exception``,
so the test sees a non-zero status and the failing rank's traceback.
"""
import os
import sys

# The scripts run as ``python tests/mpi_scripts/X.py``: make the repository
# importable even where the package is not installed.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import cgdp_chainer  # NOQA: E402  (its compat module must precede Chainer)
from cgdp_chainer import mpi as cgdp_mpi  # NOQA: E402
import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import chainer.links as L  # NOQA: E402
import numpy  # NOQA: E402


# A hung job dumps every thread's stack and exits after this many seconds,
# before the test's own timeout (60 s) kills it without a word.
WATCHDOG_SECONDS = float(os.environ.get('CGDP_MPI_WATCHDOG', 45))


def start_mpi():
    """``MPI.COMM_WORLD``, with MPI started with thread support, and the
    hang watchdog armed."""
    import faulthandler
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    MPI = cgdp_mpi.init_mpi()
    return MPI.COMM_WORLD


def report(comm, lines):
    """Prints every rank's ``lines`` from rank 0, in rank order.

    mpiexec forwards the ranks' output through one pipe and may interleave
    their writes mid-line; printing from one rank keeps lines whole.
    Collective.
    """
    gathered = comm.gather(list(lines), root=0)
    if comm.Get_rank() == 0:
        sys.stdout.write(''.join(line + '\n' for rank_lines in gathered
                                 for line in rank_lines))
        sys.stdout.flush()


def report_ok(comm, name, lines=()):
    """``lines``, then the line that the tests count, one per rank."""
    report(comm, list(lines) + ['OK {} rank {}'.format(name,
                                                        comm.Get_rank())])


def numbered_dataset(n_examples, n_features, n_classes, seed=0):
    """A small, fixed classification dataset (float32 features)."""
    import chainer
    import numpy
    random = numpy.random.RandomState(seed)
    x = random.uniform(-1, 1, (n_examples, n_features)).astype(numpy.float32)
    t = random.randint(0, n_classes, n_examples).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def assert_same_parameters(model, reference, rtol=1e-5, atol=1e-7):
    """Raises AssertionError naming the first parameter that differs."""
    import numpy
    ours = dict(model.namedparams())
    theirs = dict(reference.namedparams())
    assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
    for name in sorted(ours):
        numpy.testing.assert_allclose(
            ours[name].array, theirs[name].array, rtol=rtol, atol=atol,
            err_msg='parameter {} differs'.format(name))


def parameters_changed(model, initial):
    """True if any parameter moved from ``initial`` (name -> array)."""
    import numpy
    return any(not numpy.array_equal(param.array, initial[name])
               for name, param in model.namedparams())


def staged_updates(dataset, batch_size, make_optimizer, make_updater,
                   iterations, after_update=lambda model, optimizer: None):
    """Trains :func:`staged_mlp` (seed 0) for ``iterations`` updates over
    ``dataset`` in order, then finalizes the updater.

    Args:
        make_optimizer (callable): ``make_optimizer(model) -> optimizer``.
        make_updater (callable): ``make_updater(iterator, optimizer)``.
        after_update (callable): ``after_update(model, optimizer)``, after
            each update: what it returns is kept.

    Returns:
        tuple: The model, and what ``after_update`` returned each time.
    """
    model = staged_mlp(seed=0)
    optimizer = make_optimizer(model)
    iterator = chainer.iterators.SerialIterator(dataset, batch_size,
                                                shuffle=False)
    updater = make_updater(iterator, optimizer)
    kept = []
    try:
        for _ in range(iterations):
            updater.update()
            kept.append(after_update(model, optimizer))
    finally:
        updater.finalize()
    return model, kept


def staged_mlp(sizes=(6, 10, 9, 3), seed=0):
    """A Classifier around an MLP with ``stages`` (for CGDPUpdater).

    Weights come from ``seed``: every rank and every reference built with
    the same seed starts from the same parameters.
    """
    import chainer.links as L
    return L.Classifier(StagedMLP(sizes, seed))


class StagedMLP(chainer.Chain):
    """Linear layers with ReLUs between them, one stage each (at module
    level: CGDP's worker processes unpickle it)."""

    def __init__(self, sizes, seed):
        super(StagedMLP, self).__init__()
        random = numpy.random.RandomState(seed)
        with self.init_scope():
            self.layers = chainer.ChainList(*[
                L.Linear(n_in, n_out, initialW=random.normal(
                    0, 0.5, (n_out, n_in)).astype(numpy.float32))
                for n_in, n_out in zip(sizes, sizes[1:])])

    @property
    def stages(self):
        stages = []
        for index, layer in enumerate(self.layers):
            if index:
                stages.append(F.relu)
            stages.append(layer)
        return stages

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x
