"""The GPU path's logic that the CPU can run: the notifier's error path,
the fallback when the shared memory cannot be page-locked, the NCCL and
cuDNN checks and where cuDNN is recorded."""
import os
import subprocess
import sys
import tarfile
import threading
import types

import chainer
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import devices
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer.runtime.workers import channels
from cgdp_chainer.runtime.transport import transfer
from experiments import modes
from experiments import plot
from experiments import results
from experiments import run_plan


class _Sender(object):
    """Collects what a worker would send to its parent."""

    def __init__(self):
        self.messages = []

    def send(self, message):
        self.messages.append(message)


class _Copied(object):
    """A CUDA event's test double: ``synchronize()`` succeeds or raises."""

    def __init__(self, error=None):
        self.error = error
        self.waited = False

    def synchronize(self):
        self.waited = True
        if self.error is not None:
            raise self.error


def _notifying_link(sender):
    return channels._PipeLink(sender, threading.Event(),
                              chainer.get_device('@numpy'))


def test_the_notifier_announces_a_chunk_after_its_copy():
    sender = _Sender()
    link = _notifying_link(sender)
    copied = _Copied()
    link.deliver(5, 1, copied)
    link.flush()
    link.close()
    assert copied.waited
    assert sender.messages == [('delivered', 5, 1)]


def test_a_failed_copy_wait_is_raised_by_flush_not_a_hang():
    sender = _Sender()
    link = _notifying_link(sender)
    link.deliver(3, 0, _Copied(RuntimeError('cudaErrorIllegalAddress')))
    later = _Copied()
    link.deliver(3, 1, later)
    result = {}

    def flush():
        try:
            link.flush()
        except RuntimeError as error:
            result['error'] = str(error)

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    flusher.join(timeout=30)  # a hang bound, not a timing
    link.close()
    assert not flusher.is_alive(), 'flush() waits forever'
    assert 'chunk 0 of iteration 3' in result['error']
    assert 'cudaErrorIllegalAddress' in result['error']
    # Nothing is announced after the failure: the host must not update
    # from gradients that never arrived.
    assert sender.messages == []
    assert not later.waited


def test_page_lock_reports_the_first_refusal():
    regions = [numpy.zeros(8, numpy.uint8), numpy.zeros(4, numpy.uint8)]
    locked = []

    def register(region):
        if locked:
            raise transfer.PageLockError('cudaErrorMemoryAllocation')
        locked.append(region.nbytes)

    why = transfer.page_lock(regions, register)
    assert locked == [8]
    assert 'PageLockError' in why and 'cudaErrorMemoryAllocation' in why


def test_page_lock_says_nothing_when_every_region_is_locked():
    locked = []
    regions = [numpy.zeros(8, numpy.uint8), numpy.zeros(4, numpy.uint8)]
    assert transfer.page_lock(regions, lambda r: locked.append(r)) is None
    assert len(locked) == 2


def test_a_staged_copy_moves_the_gradients_on_after_the_wait():
    staging = [numpy.arange(3, dtype=numpy.float32),
               numpy.full((2, 2), 7, numpy.float32)]
    slots = [numpy.zeros(3, numpy.float32), numpy.zeros((2, 2), numpy.float32)]
    copied = _Copied()
    ready = transfer.StagedCopy(copied, list(zip(staging, slots)))
    ready.synchronize()
    assert copied.waited
    for source, slot in zip(staging, slots):
        numpy.testing.assert_array_equal(slot, source)


def test_a_staged_copy_that_failed_leaves_the_slots_alone():
    slot = numpy.zeros(3, numpy.float32)
    ready = transfer.StagedCopy(_Copied(RuntimeError('copy failed')),
                                [(numpy.ones(3, numpy.float32), slot)])
    with pytest.raises(RuntimeError, match='copy failed'):
        ready.synchronize()
    assert not slot.any()


@pytest.mark.parametrize('nccl, loaded', [
    (types.SimpleNamespace(available=False), False),
    (types.SimpleNamespace(available=True), True),
    (types.SimpleNamespace(), True),  # CuPy before the flag existed
])
def test_the_nccl_mode_trusts_cupys_flag(nccl, loaded):
    assert modes.nccl_library_loaded(nccl) is loaded


def test_the_nccl_mode_runs_only_where_nccl_is_available():
    runs = modes.nccl_unavailable(['@cupy:0', '@cupy:1']) is None
    assert runs == modes.nccl_available()


def test_cudnn_off_is_said_once_in_the_plan():
    assert 'cuDNN is off' in run_plan.cudnn_note(False)
    assert run_plan.cudnn_note(True) is None
    assert run_plan.cudnn_note(None) is None


def test_env_json_records_cudnn():
    env = results.collect_env(['x'])
    assert env['cudnn'] is devices.cudnn_enabled()
    if devices.cupy_module() is None:
        assert env['cudnn'] is None


@pytest.mark.parametrize('cudnn, words', [
    (False, 'GPUs (@cupy), cuDNN off'), (True, 'GPUs (@cupy), cuDNN on'),
    (None, 'GPUs (@cupy)')])
def test_figure_titles_say_whether_cudnn_was_on(cudnn, words):
    env = {'net': 'alexnet', 'image_size': 224, 'batch_per_device': 32,
           'device_kind': 'GPUs (@cupy)', 'cudnn': cudnn}
    assert plot._setting_line(env).endswith(', ' + words)


def test_a_timeline_note_is_in_the_trace():
    timeline = cgdp_chainer.Timeline()
    timeline.note('replica 0: staged copies')
    trace = timeline.to_chrome_trace()['traceEvents']
    assert [e['name'] for e in trace if e['ph'] == 'i'] == [
        'replica 0: staged copies']
    assert timeline.notes[0][1] == 'replica 0: staged copies'


def test_the_gpu_check_stops_at_its_preflight_without_a_gpu(tmp_path):
    """A dry run of .ci/gpu_check.sh with no GPU visible (here there is
    none anyway; CUDA_VISIBLE_DEVICES hides any): status 1, the missing
    piece named, no test or run started, the summary and the archive
    under $OUT. The preflight's MPI check says whether the mpiexec that
    the tests take (the venv's, where installed) runs a 2-rank job."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTHON=sys.executable,
               OUT=str(tmp_path))
    done = subprocess.run(['bash', os.path.join('.ci', 'gpu_check.sh')],
                          cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'preflight failed: missing' in done.stdout
    assert 'a CUDA GPU that CuPy sees' in done.stdout
    assert sorted(os.listdir(tmp_path)) == ['gpu_check.tar.gz',
                                            'gpu_check_summary.txt']
    summary = (tmp_path / 'gpu_check_summary.txt').read_text()
    assert summary.startswith('status: 1\n')
    assert 'preflight failed' in summary
    with tarfile.open(str(tmp_path / 'gpu_check.tar.gz')) as archive:
        names = {os.path.basename(n) for n in archive.getnames()}
    assert 'preflight.txt' in names and 'gpu_tests.txt' not in names
    if cgdp_mpi.find_mpiexec() is None:
        assert 'mpi: not usable: no mpiexec' in summary
    else:
        assert 'mpi: usable (a 2-rank job under {})'.format(
            cgdp_mpi.find_mpiexec()) in summary
        assert 'mpi_hello.txt' in names
