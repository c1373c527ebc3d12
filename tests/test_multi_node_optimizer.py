"""cgdp_chainer.create_multi_node_optimizer: what it refuses before any
work, and (under 2 MPI ranks) what it overlaps.

The equivalence with ChainerMN's optimizer on ChainerMN-shaped scripts is
in tests/test_any_loop.py.
"""
import chainer
import chainer.links as L
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer.runtime.host.accumulator import optimizer_hooks
from test_mpi import assert_ok, mpiexec, run_mpi  # NOQA: F401 (fixture)


def _optimizer(model=None):
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model or L.Linear(3, 2))
    return optimizer


# A communicator that is never reached: each refusal below comes first.
UNREACHED = object()


def test_double_buffering_is_refused_with_the_fix():
    with pytest.raises(ValueError, match='double_buffering') as error:
        cgdp_chainer.create_multi_node_optimizer(
            _optimizer(), UNREACHED, double_buffering=True)
    assert 'leave double_buffering out' in str(error.value)


def test_zero_fill_false_is_refused_with_the_fix():
    with pytest.raises(ValueError, match='zero_fill') as error:
        cgdp_chainer.create_multi_node_optimizer(
            _optimizer(), UNREACHED, zero_fill=False)
    assert 'leave zero_fill out' in str(error.value)


def test_an_actual_optimizer_that_is_not_a_gradient_method_is_refused():
    class Wrapper(object):
        def __init__(self, actual):
            self.actual = actual

        def update(self, *args, **kwds):
            self.actual.update(*args, **kwds)

    with pytest.raises(ValueError, match='Wrapper is not a '
                       'chainer.GradientMethod') as error:
        cgdp_chainer.create_multi_node_optimizer(
            Wrapper(_optimizer()), UNREACHED)
    assert 'chainermn.create_multi_node_optimizer' in str(error.value)


@pytest.mark.parametrize('options, words', [
    ({'chunk_size': 'auto'}, "the 'auto' search"),
    ({'chunk_size': 0}, 'chunk_size=0 is out of range'),
    ({'chunk_size': 2, 'chunk_bytes': 10}, 'not both'),
    ({'chunk_bytes': -1}, 'chunk_bytes must be a positive integer'),
    ({'host_threads': 0}, 'host_threads must be a positive integer'),
    ({'timeline': 'trace.json'}, 'timeline must be a cgdp_chainer.Timeline'),
])
def test_bad_cgdp_options_are_refused_naming_them(options, words):
    with pytest.raises(ValueError) as error:
        cgdp_chainer.create_multi_node_optimizer(_optimizer(), UNREACHED,
                                                 **options)
    assert words in str(error.value)


def test_a_communicator_of_another_type_is_refused():
    with pytest.raises(ValueError, match='ChainerMN communicator or an '
                       'mpi4py communicator'):
        cgdp_chainer.create_multi_node_optimizer(_optimizer(), 'world')


def test_a_lone_rank_of_a_multi_rank_launch_is_refused():
    # The launcher (Open MPI's variables) started 2 ranks, but this
    # process's MPI holds it alone (another MPI library: a singleton).
    from cgdp_chainer.runtime import multi_node_optimizer
    with pytest.raises(ValueError, match='one of 2 ranks') as error:
        multi_node_optimizer._refuse_lone_rank(
            1, cgdp_mpi.launcher_size(
                {'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '0'}))
    assert '.venv/bin/mpiexec' in str(error.value)
    for size, environ in ((1, {}), (2, {'PMI_SIZE': '2'}),
                          (1, {'PMI_SIZE': '1'})):
        multi_node_optimizer._refuse_lone_rank(
            size, cgdp_mpi.launcher_size(environ))  # taken


def test_attributes_pass_through_to_the_actual_optimizer():
    actual = chainer.optimizers.MomentumSGD(lr=0.1)
    model = L.Linear(3, 2)
    optimizer = cgdp_chainer.create_multi_node_optimizer(
        actual, _MpiShapedComm())
    assert optimizer.setup(model) is optimizer
    assert optimizer.target is model and actual.target is model
    optimizer.lr = 0.05
    assert actual.lr == 0.05
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(1e-4))
    pre, _ = optimizer_hooks(actual)
    assert [type(hook) for hook in pre] == [
        chainer.optimizer_hooks.WeightDecay]
    optimizer.new_epoch()
    assert actual.epoch == 1
    assert optimizer.chunk_plan is None  # formed at the first update


class _MpiShapedComm(object):
    """Stands for a communicator where none is used (nothing here
    communicates before the first update)."""

    def Get_size(self):
        return 1


@pytest.mark.mpi
def test_chunks_leave_during_the_optimizers_backward_and_changes_are_refused(
        mpiexec):
    # The script: the output-side layer's new weights are in the model
    # before the backward reaches the input-side layer; after a user's
    # loss.backward() they move only in update(); a reshaped parameter and
    # models that differ between ranks are refused.
    assert_ok(run_mpi('optimizer_overlap.py', timeout=120),
              'optimizer-overlap')


@pytest.mark.mpi
def test_cut_graphs_and_rule_hooks_train_as_with_chainermn(mpiexec):
    # The script: a first layer cut off by unchain_backward() (also frozen,
    # also with a host per rank), a branch used in odd iterations only,
    # and ChainerCV's GradientScaling on a layer's rules (the node's host
    # still shared), each in both call forms, equal to ChainerMN's
    # optimizer on the same batches.
    assert_ok(run_mpi('optimizer_cut_graphs.py', timeout=120),
              'optimizer-cut-graphs')


@pytest.mark.mpi
def test_another_ranks_failure_is_named_in_every_run(mpiexec):
    # The script: 20 runs in one job; rank 1 fails in a host thread or in
    # its loss function, both ranks catch: rank 1 its own error, rank 0 one
    # naming rank 1 and its error (never a bare Aborted).
    job = run_mpi('optimizer_failures.py', timeout=150)
    assert_ok(job, 'optimizer-failures')
    assert job.segments_left == []


def test_uninitialized_and_device_parameters_are_named():
    from cgdp_chainer.runtime import multi_node_optimizer
    lazy = L.Linear(None, 2)
    with pytest.raises(ValueError, match='parameter /W is not initialized'):
        multi_node_optimizer._refuse_device_arrays(lazy)
    model = L.Linear(3, 2)
    model.W.array = numpy.asfortranarray(model.W.array)  # still NumPy
    multi_node_optimizer._refuse_device_arrays(model)  # taken


@pytest.mark.mpi
def test_a_rank_failing_in_its_own_loop_ends_the_whole_job(mpiexec):
    # Rank 1 raises in the script's loop while rank 0 waits for its chunks
    # in update(): without the optimizer's abort hooks the job hangs and
    # run_mpi fails the test after the bound (liveness, not speed).
    job = run_mpi('optimizer_rank_fails.py', timeout=60)
    assert job.returncode != 0, job.output
    assert '[rank 1] ValueError: rank 1 fails in its own loop' in \
        job.output, job.output
    assert 'OK ' not in job.output
    assert job.segments_left == []
