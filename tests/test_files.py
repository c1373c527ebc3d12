"""Tests of cgdp_chainer.files: atomic writes and output-path probes."""
import json
import os
import threading

import numpy
import pytest

from cgdp_chainer import files
from cgdp_chainer import timeline as timeline_module


class Interrupted(Exception):
    """Stands for a crash in the middle of writing."""


def _listing(folder):
    return sorted(os.listdir(str(folder)))


def test_atomic_write_replaces_the_file_when_complete(tmp_path):
    path = str(tmp_path / 'data.json')
    with open(path, 'w') as f:
        f.write('old')
    with files.atomic_write(path) as f:
        f.write('new ')
        # Until the block ends, readers still see the previous content.
        with open(path) as reader:
            assert reader.read() == 'old'
        f.write('content')
    with open(path) as reader:
        assert reader.read() == 'new content'
    assert _listing(tmp_path) == ['data.json']


def test_a_write_that_fails_midway_leaves_the_previous_content(tmp_path):
    path = str(tmp_path / 'summary.csv')
    with open(path, 'w') as f:
        f.write('previous\n')
    with pytest.raises(Interrupted):
        with files.atomic_write(path) as f:
            f.write('half of the new')
            f.flush()
            raise Interrupted()
    with open(path) as reader:
        assert reader.read() == 'previous\n'
    assert _listing(tmp_path) == ['summary.csv']


def test_a_failed_first_write_leaves_no_file(tmp_path):
    path = str(tmp_path / 'new.csv')
    with pytest.raises(Interrupted):
        with files.atomic_write(path, 'wb') as f:
            f.write(b'partial')
            raise Interrupted()
    assert _listing(tmp_path) == []


def test_atomic_path_keeps_the_extension_for_name_based_writers(tmp_path):
    path = str(tmp_path / 'arrays.npz')
    with files.atomic_path(path) as temporary:
        assert os.path.dirname(temporary) == str(tmp_path)
        assert temporary.endswith('.npz')
        # numpy adds '.npz' to names without it: the name must keep it.
        numpy.savez(temporary, x=numpy.arange(3))
    with numpy.load(path) as arrays:
        numpy.testing.assert_array_equal(arrays['x'], [0, 1, 2])
    assert _listing(tmp_path) == ['arrays.npz']


def test_written_files_get_the_usual_permissions(tmp_path):
    plain = str(tmp_path / 'plain')
    open(plain, 'w').close()
    atomic = str(tmp_path / 'atomic')
    with files.atomic_write(atomic) as f:
        f.write('x')
    assert os.stat(atomic).st_mode == os.stat(plain).st_mode


def test_atomic_write_refuses_other_modes(tmp_path):
    with pytest.raises(ValueError, match="'w' or 'wb'"):
        with files.atomic_write(str(tmp_path / 'x'), 'a'):
            pass


def test_chrome_trace_export_is_complete_json_and_leaves_no_temporary(
        tmp_path):
    timeline = timeline_module.Timeline()
    timeline.record(0, 0, 'forward', 0, 0.0, 0.5)
    path = str(tmp_path / 'trace.json')
    with open(path, 'w') as f:
        f.write('an earlier trace')
    timeline.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)['traceEvents']
    assert [event['name'] for event in events
            if event['ph'] == 'X'] == ['forward c0']
    assert _listing(tmp_path) == ['trace.json']


def test_writable_folder_probe_accepts_new_and_existing_folders(tmp_path):
    files.check_writable_folder(str(tmp_path))
    files.check_writable_folder(str(tmp_path / 'new' / 'nested'))
    files.check_writable_file(str(tmp_path / 'new' / 'trace.json'))
    # Probing creates nothing.
    assert _listing(tmp_path) == []


def test_writable_folder_probe_names_the_file_in_the_way(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(ValueError, match='is a file, not a folder'):
        files.check_writable_folder(str(blocker))
    with pytest.raises(ValueError) as info:
        files.check_writable_folder(str(blocker / 'sub'))
    assert 'cannot create folder' in str(info.value)
    assert str(blocker) in str(info.value)
    with pytest.raises(ValueError, match='is a folder, not a file'):
        files.check_writable_file(str(tmp_path))
    assert _listing(tmp_path) == ['file']


@pytest.mark.skipif(not os.path.isdir('/proc/self'),
                    reason='needs a read-only /proc')
def test_writable_folder_probe_reports_a_folder_that_takes_no_files():
    # /proc takes no new files, even for root (who may write anywhere else).
    with pytest.raises(ValueError, match='cannot write into folder /proc'):
        files.check_writable_folder('/proc')


def test_chrome_trace_names_replica_host_and_communication_tracks():
    timeline = timeline_module.Timeline()
    timeline.name_tracks(['replica 0 @numpy', 'replica 1 @cupy:1'], rank=3)
    timeline.record(0, 1, 'backward', 0, 0.0, 0.5)
    with timeline.span(0, 'host', 'update', 0):
        pass
    timeline.record(0, 'host', 'allreduce', 0, 0.1, 0.2,
                    thread='cgdp-allreduce')
    trace = timeline.to_chrome_trace()['traceEvents']
    names = {e['tid']: e['args']['name'] for e in trace
             if e['name'] == 'thread_name'}
    assert sorted(names.values()) == [
        'communication thread cgdp-allreduce',
        'host thread {}'.format(threading.current_thread().name),
        'replica 0 @numpy', 'replica 1 @cupy:1']
    by_name = {e['name']: names[e['tid']] for e in trace if e['ph'] == 'X'}
    assert by_name == {
        'backward c0': 'replica 1 @cupy:1',
        'update c0': 'host thread {}'.format(
            threading.current_thread().name),
        'allreduce c0': 'communication thread cgdp-allreduce'}
    assert {e['pid'] for e in trace} == {3}
    assert [e['args']['name'] for e in trace
            if e['name'] == 'process_name'] == ['cgdp rank 3']
