"""Ranks that call update() different numbers of times: named, never a
silent hang (cgdp_chainer.mpi.update_counts), in both multi-node forms.

The MPI jobs run tests/mpi_scripts/uneven_updates.py on 2 ranks with a
patience of PATIENCE seconds. Their time bound (JOB_TIMEOUT) is the
liveness check only: the loaded test machine decides how long a job takes.
"""
import re

import chainer
import chainer.links as L
import pytest

import cgdp_chainer
from cgdp_chainer.mpi import update_counts
from test_mpi import (  # NOQA: F401 (fixtures)
    JOB_TIMEOUT, assert_ok, mpiexec, mpiexec_command,
    remove_segments_of_killed_jobs, run_job)

PATIENCE = 2
FORMS = ('optimizer', 'rank-hosts', 'updater')
FIX_WORDS = 'make every rank call update() the same number of times'


def run_case(form, case):
    return run_job(
        mpiexec_command(2, 'uneven_updates.py', '--form', form,
                        '--case', case),
        timeout=JOB_TIMEOUT,
        env={update_counts.PATIENCE_VARIABLE: str(PATIENCE)})


def test_patience_defaults_to_a_minute_and_takes_the_variable():
    variable = update_counts.PATIENCE_VARIABLE
    assert update_counts.patience_seconds({}) == 60.0
    assert update_counts.patience_seconds({variable: ' '}) == 60.0
    assert update_counts.patience_seconds({variable: '2.5'}) == 2.5


@pytest.mark.parametrize('text', ['soon', '0', '-3', 'inf', 'nan'])
def test_a_patience_that_is_not_positive_seconds_is_refused_by_name(text):
    with pytest.raises(ValueError, match=re.escape(
            '{}={!r}'.format(update_counts.PATIENCE_VARIABLE, text))) as error:
        update_counts.patience_seconds(
            {update_counts.PATIENCE_VARIABLE: text})
    assert 'a positive number (default 60)' in str(error.value)


def test_the_optimizer_form_refuses_a_bad_patience_before_any_work(
        monkeypatch):
    monkeypatch.setenv(update_counts.PATIENCE_VARIABLE, 'soon')
    optimizer = chainer.optimizers.SGD().setup(L.Linear(3, 2))
    with pytest.raises(ValueError, match=update_counts.PATIENCE_VARIABLE):
        # The communicator is never reached: the options come first.
        cgdp_chainer.create_multi_node_optimizer(optimizer, object())


def test_the_error_names_every_rank_count_and_the_fix():
    message = update_counts.uneven_message({
        1: (148, update_counts.STOPPED), 0: (149, update_counts.WAITING)})
    assert message.index('rank 0: 149 update() calls, the last one '
                         'waiting') < message.index(
        'rank 1: 148 update() calls, then it stopped')
    assert FIX_WORDS in message


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('form', FORMS)
def test_a_rank_that_ends_its_script_early_ends_the_job_with_the_counts(
        mpiexec, form):
    # Rank 1's script ends after 4 update() calls while rank 0 waits in its
    # 5th: before, rank 0 waited forever (run_job fails the test then).
    job = run_case(form, 'ended')
    print('the job took {:.1f} s'.format(job.seconds))
    assert job.returncode != 0, job.output
    for words in ('UnevenUpdatesError',
                  'rank 0: 5 update() calls, the last one waiting',
                  'rank 1: 4 update() calls, then it stopped', FIX_WORDS):
        assert words in job.output, job.output
    assert 'OK ' not in job.output
    assert job.segments_left == []


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('form', ['optimizer', 'updater',
                                  'updater-chainermn'])
@pytest.mark.parametrize('case, did', [
    ('ends-first', 'its script ended'),
    ('raises-first', 'its script raised ValueError: rank 1 fails loading '
                     'its data on purpose')])
def test_a_rank_that_ends_before_its_first_update_is_named_at_once(
        mpiexec, form, case, did):
    # Rank 1 builds its optimizer or updater, then its script ends (or
    # raises) before its first update(), while rank 0 calls update():
    # before, rank 0 waited in its first collective forever (the scripts'
    # watchdog, or run_job, ended the job then).
    job = run_case(form, case)
    print('the job took {:.1f} s'.format(job.seconds))
    assert_ended_with(job, [
        'PeerEndedError: rank 1 ended before its first update() ({}), so '
        'the first update() of rank 0 would wait for it forever'.format(
            did)])


def assert_ended_with(job, words):
    """The job failed, by the project's hand (not the scripts' hang
    watchdog), saying each of ``words``, and left nothing in /dev/shm."""
    assert job.returncode != 0, job.output
    for each in words:
        assert each in job.output, job.output
    assert 'Timeout' not in job.output, job.output  # not the watchdog
    assert 'OK ' not in job.output
    assert job.segments_left == []


@pytest.mark.mpi
@pytest.mark.slow
def test_a_rank_raising_before_its_first_update_still_aborts_the_job(
        mpiexec):
    # Rank 0 waits in a barrier of the script's, where no word reaches it:
    # rank 1's abort hook, after the patience, ends the job as before.
    job = run_case('optimizer', 'raises-first-elsewhere')
    assert_ended_with(job, [
        '[rank 1] ValueError: rank 1 fails loading its data on purpose',
        'Calling MPI_Abort'])


@pytest.mark.mpi
@pytest.mark.slow
def test_ranks_that_all_end_before_their_first_update_end_cleanly(mpiexec):
    # Each rank tells the others that it ended; each hears the others'
    # word, so none waits for an answer, and every rank finalizes.
    job = run_case('updater', 'all-end-first')
    assert_ok(job, 'uneven-updater-all-end-first')
    assert 'Error' not in job.output, job.output
    assert job.segments_left == []


@pytest.mark.mpi
@pytest.mark.slow
def test_an_updater_rank_whose_update_raises_ends_the_job_without_hooks(
        mpiexec):
    # Rank 1's 4th update() raises (its batch), no abort hooks anywhere,
    # while rank 0 waits in its 4th: before, rank 0 waited forever.
    job = run_case('updater', 'raises')
    assert job.returncode != 0, job.output
    for words in ('ValueError: batch 4 fails on purpose',
                  'RuntimeError: rank 1 stopped on an error in its update() '
                  'call 4 (ValueError: batch 4 fails on purpose), so '
                  'update() call 4 of this rank would wait for it '
                  'forever'):
        assert words in job.output, job.output
    assert 'OK ' not in job.output
    assert job.segments_left == []


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('form', FORMS)
def test_a_rank_blocked_in_a_barrier_is_named_and_the_job_goes_on(
        mpiexec, form):
    # Rank 1 waits 3 x PATIENCE in a barrier of its own before its 4th
    # update(), while rank 0 waits in its 4th: rank 0 names rank 1 and
    # both counts, waits on, and both ranks end with the same weights.
    job = run_case(form, 'blocked')
    assert_ok(job, 'uneven-{}-blocked'.format(form))
    assert re.search(
        r'^\[rank 0\] CGDP: update\(\) call 4 of this rank has waited \d+ s '
        r'for rank 1, which has called update\(\) 3 times and ',
        job.output, re.MULTILINE), job.output
    assert '{}={} s'.format(update_counts.PATIENCE_VARIABLE, PATIENCE) in \
        job.output
    assert job.segments_left == []


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('form', ['optimizer', 'updater'])
def test_a_rank_slower_than_the_patience_is_no_error(mpiexec, form):
    # Rank 0 sleeps 2 x PATIENCE before its 4th update(): rank 1 may say
    # it waits, but nothing fails and the ranks end alike.
    job = run_case(form, 'slow')
    assert_ok(job, 'uneven-{}-slow'.format(form))
    assert 'Error' not in job.output, job.output
    assert job.segments_left == []
