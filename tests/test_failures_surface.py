"""No error is ever lost: a failure in a replica, a worker process or a
host thread surfaces in the caller with its type, message and place, in
every run of a loop (the race that let a bare ``Aborted`` win is timing,
so one run proves little); another rank's failure, in
tests/mpi_scripts/optimizer_failures.py."""
import multiprocessing
import threading
import time
import traceback

import chainer
import chainer.links as L
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.host import accumulator

import staged_models

RUNS = 20
# A worker process takes seconds to start: fewer runs of that kind (its
# error travels as a message sent after it is recorded, with no race).
PROCESS_RUNS = 6


class FailingScaling(object):
    """A rule hook (as ChainerCV's GradientScaling) that raises at the
    rule's second update: it runs in a host thread."""

    name = 'FailingScaling'

    def __call__(self, rule, param):
        if rule.t == 2:
            raise ValueError('injected failure in a rule hook')
        param.grad *= 2


def _updater(model, workers, hooked=False):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.05)
    optimizer.setup(model)
    if hooked:
        model.predictor.layers[0].W.update_rule.add_hook(FailingScaling())
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                    chunk_size=1, workers=workers)


def _first_error(updater, iterations=4):
    try:
        for _ in range(iterations):
            updater.update()
    except BaseException as error:
        return error
    finally:
        updater.finalize()
    return None


def _frames(error):
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def test_a_host_thread_failure_surfaces_in_every_run():
    before = threading.active_count()
    for run in range(RUNS):
        model = L.Classifier(staged_models.StagedMLP())
        error = _first_error(_updater(model, 'thread', hooked=True))
        assert isinstance(error, ValueError), (run, repr(error))
        assert 'injected failure in a rule hook' in str(error), run
        assert any('host accumulator' in note for note in error.__notes__)
        assert '__call__' in _frames(error), run  # the hook's own frame
    assert threading.active_count() == before


@pytest.mark.parametrize('workers, runs', [
    ('thread', RUNS),
    pytest.param('process', PROCESS_RUNS, marks=pytest.mark.slow)])
def test_a_replica_failure_surfaces_in_every_run(workers, runs):
    for run in range(runs):
        model = L.Classifier(staged_models.FaultyMLP(at_call=2, replica=1))
        error = _first_error(_updater(model, workers))
        assert isinstance(error, RuntimeError), (run, repr(error))
        assert not isinstance(error, accumulator.Aborted), run
        assert 'injected step failure' in str(error), run
        assert any('replica 1 (@numpy)' in note
                   for note in error.__notes__), run
        if workers == 'process':
            assert 'in forward' in str(error), run  # the worker's traceback
        else:
            assert 'forward' in _frames(error), run
    assert multiprocessing.active_children() == []


def test_a_thread_that_stops_first_never_hides_the_failure():
    # The race, made certain: a thread sees the stop and raises Aborted
    # before the failing thread has recorded its error.
    failures = accumulator.FailureBox()
    failures.fail(accumulator.Aborted(), 'replica 0 worker')
    assert failures.failed and failures.error is None

    def fail_late():
        time.sleep(0.2)
        try:
            raise KeyError('the original failure')
        except KeyError as error:
            failures.fail(error, 'host accumulator')

    late = threading.Thread(target=fail_late)
    late.start()
    surfaced = failures.surfaced(accumulator.Aborted())
    late.join()
    assert isinstance(surfaced, KeyError)
    assert 'the original failure' in str(surfaced)
    assert 'fail_late' in _frames(surfaced)
    assert failures.surfaced(ValueError('own')).args == ('own',)


def test_a_stop_with_nothing_recorded_is_no_bare_aborted(monkeypatch):
    monkeypatch.setattr(accumulator.FailureBox, 'RECORD_GRACE_SECONDS', 0.05)
    failures = accumulator.FailureBox()
    failures.fail(accumulator.Aborted(), 'caller')
    surfaced = failures.surfaced(accumulator.Aborted())
    assert type(surfaced) is RuntimeError
    assert 'no failure was recorded' in str(surfaced)
