"""CGDPUpdater's worker processes: real processes killed, a dying parent,
models that cannot travel, scripts without the main guard, BLAS threads."""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy
import pytest

import cgdp_chainer
import chainer
import chainer.links as L

import staged_models

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _updater(model=None, n=2, **kwargs):
    model = model or L.Classifier(staged_models.StagedMLP())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), 6, shuffle=False)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * n,
                                    chunk_size=2, **kwargs)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            return f.read().split()[2] != 'Z'
    except OSError:
        return False


def test_a_killed_worker_makes_update_raise_naming_it():
    before = threading.active_count()
    updater = _updater(n=3)
    updater.update()
    workers = multiprocessing.active_children()
    assert len(workers) == 3
    victim = sorted(workers, key=lambda p: p.name)[1]
    assert victim.name == 'cgdp-replica-1'
    os.kill(victim.pid, signal.SIGKILL)
    outcome = {}

    def train_on():
        try:
            for _ in range(50):
                updater.update()
        except RuntimeError as error:
            outcome['error'] = error
    # A hang bound, not a timing: the dead worker is noticed by its
    # process sentinel, not after a time-out of minutes.
    trainer = threading.Thread(target=train_on)
    trainer.start()
    trainer.join(timeout=30)
    assert not trainer.is_alive(), 'update() hung after a worker died'
    assert 'error' in outcome, 'training went on with a dead worker'
    message = str(outcome['error'])
    assert 'replica 1 (@numpy' in message
    assert 'SIGKILL' in message
    updater.finalize()
    assert multiprocessing.active_children() == []
    assert threading.active_count() == before
    for worker in workers:
        assert not _alive(worker.pid)


def test_workers_stay_alive_across_iterations_and_finalize_leaves_none():
    updater = _updater()
    updater.update()
    first = sorted(p.pid for p in multiprocessing.active_children())
    updater.update()
    updater.update()
    assert sorted(p.pid for p in multiprocessing.active_children()) == first
    startup = updater.startup_seconds
    assert startup is not None and startup > 0  # recorded, not judged
    updater.finalize()
    assert multiprocessing.active_children() == []
    # The master keeps its trained arrays after the shared memory is gone.
    model = updater.get_optimizer('main').target
    assert all(numpy.isfinite(p.array).all() for p in model.params())


def test_blas_threads_are_set_in_each_worker():
    observed = {}
    for blas_threads in (None, 1):
        model = L.Classifier(staged_models.ProbedMLP())
        updater = _updater(model, blas_threads=blas_threads)
        observation = {}
        with chainer.Reporter().scope(observation):
            updater.update()
        updater.finalize()
        observed[blas_threads] = observation['main/predictor/probe/'
                                             'blas_threads']
    # Default: the cores shared by the CPU replicas.
    cores = len(os.sched_getaffinity(0))
    assert observed[None] == max(1, cores // 2)
    assert observed[1] == 1


class _HoldsAWeakReference(staged_models.StagedMLP):
    """A weak reference to something outside the model: no pickle can
    carry it, a deep copy (thread workers) keeps it as it is."""

    def __init__(self):
        super(_HoldsAWeakReference, self).__init__()
        self.note = weakref.ref(staged_models)


def test_a_model_that_cannot_be_pickled_is_refused_at_construction():
    with pytest.raises(ValueError, match="cannot be pickled for "
                                         "workers='process'.*workers='thread'"):
        _updater(L.Classifier(_HoldsAWeakReference()))
    # The same model trains with thread workers.
    updater = _updater(L.Classifier(_HoldsAWeakReference()), workers='thread')
    updater.update()
    updater.finalize()


def test_a_locally_defined_model_and_a_lambda_loss_func_travel_by_value():
    class Local(staged_models.StagedMLP):
        pass
    model = L.Classifier(Local())
    updater = _updater(model, loss_func=lambda x, t: model(x, t))
    updater.update()
    updater.finalize()
    assert all(numpy.isfinite(p.array).all() for p in model.params())


def test_a_loss_func_that_cannot_be_pickled_is_refused():
    lock = threading.Lock()

    def locked_loss(x, t):
        with lock:
            return chainer.functions.sum(x)
    with pytest.raises(ValueError, match='loss_func cannot be pickled'):
        _updater(L.Classifier(staged_models.StagedMLP()),
                 loss_func=locked_loss)


def _run_script(tmp_path, body, timeout=120, **fields):
    script = tmp_path / 'script.py'
    script.write_text(textwrap.dedent(body).format(tests=TESTS, root=ROOT,
                                                   **fields))
    return subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=timeout, cwd=str(tmp_path))


@pytest.mark.parametrize('start_method', [
    'spawn', pytest.param('forkserver', marks=pytest.mark.slow)])
def test_a_script_without_the_main_guard_trains_as_standard_updater(
        tmp_path, start_method):
    # Training code at module level, as in Chainer's WaveNet example, a
    # model class of the script's own, and a lazy layer whose output on the
    # master's first forward is large: the workers never run the script
    # (it notes every run), and train as StandardUpdater.
    result = _run_script(tmp_path, '''
        import os, sys
        with open('runs', 'a') as f:
            f.write('{{}}\\n'.format(os.getpid()))
        sys.path[:0] = [{root!r}, {tests!r}]
        import numpy, cgdp_chainer, chainer
        import chainer.functions as F
        import chainer.links as L
        import staged_models


        class ScriptNet(chainer.Chain):
            def __init__(self):
                super().__init__()
                with self.init_scope():
                    self.wide = L.Linear(None, 20000)
                    self.out = L.Linear(None, 5)

            def forward(self, x):
                return self.out(F.relu(self.wide(x)))


        def train(make_updater):
            numpy.random.seed(0)
            model = L.Classifier(ScriptNet())
            optimizer = chainer.optimizers.SGD(lr=0.1)
            optimizer.setup(model)
            iterator = chainer.iterators.SerialIterator(
                staged_models.dataset(), 4, shuffle=False)
            updater = make_updater(iterator, optimizer)
            for _ in range(2):
                updater.update()
            updater.finalize()
            return {{name: p.array for name, p in model.namedparams()}}


        expected = train(chainer.training.updaters.StandardUpdater)
        actual = train(lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy', '@numpy'],
            start_method={start_method!r}))
        assert sorted(actual) == sorted(expected)
        print('max difference', max(
            float(abs(actual[name] - expected[name]).max())
            for name in expected))
        with open('runs') as f:
            print('script runs', len(f.read().split()))
    ''', start_method=start_method)
    assert result.returncode == 0, result.stderr
    difference = float(result.stdout.split('max difference ')[1].split()[0])
    assert difference < 1e-5, result.stdout
    assert 'script runs 1' in result.stdout


def _shared_memory_mapped_here():
    """The shared-memory segments this process maps."""
    with open('/proc/self/maps') as f:
        return {line.split()[-1] for line in f
                if len(line.split()) > 5 and
                line.split()[-1].startswith('/dev/shm/')}


def test_a_worker_killed_while_starting_surfaces_leaving_nothing(tmp_path):
    # The replica's pickle holds an object that, unpickled in a worker,
    # says its pid and stalls there; the worker is killed while it starts.
    pid_file = str(tmp_path / 'worker_pid')
    parent = os.getpid()

    def stall_in_a_worker():
        if os.getpid() != parent:
            written = '{}.{}'.format(pid_file, os.getpid())
            with open(written, 'w') as f:
                f.write(str(os.getpid()))
            os.replace(written, pid_file)
            time.sleep(120)

    class StallsInWorker(object):
        def __reduce__(self):
            return stall_in_a_worker, ()

    model = L.Classifier(staged_models.StagedMLP())
    model.stall = StallsInWorker()
    # Large enough to block a pipe that no one reads (64 KiB).
    model.table = numpy.zeros(1 << 20, numpy.float32)
    updater = _updater(model)
    outcome = {}

    def first_update():
        try:
            updater.update()
        except RuntimeError as error:
            outcome['error'] = error
            outcome['raised'] = time.monotonic()
    trainer = threading.Thread(target=first_update)
    trainer.start()
    deadline = time.monotonic() + 90  # a hang bound
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        assert trainer.is_alive(), outcome
        time.sleep(0.05)
    segments = _shared_memory_mapped_here()
    assert segments  # the master's and the replica's arenas, at least
    with open(pid_file) as f:
        worker = int(f.read())
    assert worker in [p.pid for p in multiprocessing.active_children()]
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    trainer.join(timeout=30)  # a hang bound, not a timing
    assert not trainer.is_alive(), 'update() hung after a worker died'
    message = str(outcome['error'])
    assert 'while starting' in message and 'SIGKILL' in message
    assert "workers='thread'" in message
    assert "if __name__ == '__main__'" not in message
    print('the kill surfaced after {:.2f} s'.format(
        outcome['raised'] - killed))
    updater.finalize()
    assert not any(os.path.exists(path) for path in segments)
    assert multiprocessing.active_children() == []


def test_a_model_module_that_fails_to_import_in_a_worker_names_the_fix(
        tmp_path, monkeypatch):
    # The model's class comes from a module that imports only in the
    # user's process: the worker, which imports it by name, fails while
    # it starts, and the caller hears why and what to do.
    (tmp_path / 'parent_only_model.py').write_text(textwrap.dedent('''
        import os
        import staged_models
        if os.getpid() != int(os.environ['CGDP_TEST_PARENT']):
            raise ImportError('this module imports in the parent only')


        class ParentOnlyMLP(staged_models.StagedMLP):
            pass
    '''))
    monkeypatch.setenv('CGDP_TEST_PARENT', str(os.getpid()))
    monkeypatch.syspath_prepend(str(tmp_path))
    import parent_only_model
    try:
        updater = _updater(L.Classifier(parent_only_model.ParentOnlyMLP()))
        segments_before = _shared_memory_mapped_here()
        with pytest.raises(RuntimeError) as raised:
            updater.update()
    finally:
        del sys.modules['parent_only_model']  # later pickles: by value
    message = str(raised.value)
    assert 'replica 0 (@numpy' in message or 'replica 1 (@numpy' in message
    assert 'while starting' in message
    assert 'this module imports in the parent only' in message
    assert "import without error in a fresh process; or pass " \
        "workers='thread'" in message
    assert multiprocessing.active_children() == []
    assert _shared_memory_mapped_here() <= segments_before
    updater.finalize()


class _FailsOnTheMaster(staged_models.StagedMLP):
    """A lazy layer, and a forward that raises: the master's first
    forward, while the workers launched ahead boot, fails."""

    def __init__(self):
        super(_FailsOnTheMaster, self).__init__()
        with self.init_scope():
            self.lazy = L.Linear(None, 3)

    def forward(self, x):
        raise ValueError('the forward failed on purpose')


def test_workers_launched_ahead_end_when_the_first_forward_fails():
    updater = _updater(L.Classifier(_FailsOnTheMaster()))
    with pytest.raises(ValueError, match='failed on purpose'):
        updater.update()
    # Ended by update() itself, not left for finalize() or exit.
    assert multiprocessing.active_children() == []
    updater.finalize()


def test_a_model_defined_in_the_script_works_with_the_main_guard(tmp_path):
    result = _run_script(tmp_path, '''
        import sys
        sys.path[:0] = [{root!r}, {tests!r}]
        import cgdp_chainer, chainer
        import chainer.links as L
        import staged_models


        class ScriptMLP(staged_models.StagedMLP):
            pass


        if __name__ == '__main__':
            model = L.Classifier(ScriptMLP())
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            iterator = chainer.iterators.SerialIterator(
                staged_models.dataset(), 4)
            updater = cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                               ['@numpy', '@numpy'])
            for _ in range(2):
                updater.update()
            updater.finalize()
            print('trained', updater.iteration)
    ''')
    assert result.returncode == 0, result.stderr
    assert 'trained 2' in result.stdout


def _worker_pids(process, pids):
    """The worker pids a script writes to ``pids`` once it has trained an
    iteration (hang bound: 90 s; the script must stay alive meanwhile)."""
    deadline = time.monotonic() + 90
    while not pids.exists() or not pids.read_text().strip():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return [int(p) for p in pids.read_text().split()]


def test_workers_exit_when_the_users_process_dies(tmp_path):
    pids = tmp_path / 'pids'
    script = tmp_path / 'victim.py'
    script.write_text(textwrap.dedent('''
        import multiprocessing, os, sys, time
        sys.path[:0] = [{root!r}, {tests!r}]
        import cgdp_chainer, chainer
        import chainer.links as L
        import staged_models
        if __name__ == '__main__':
            model = L.Classifier(staged_models.StagedMLP())
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            iterator = chainer.iterators.SerialIterator(
                staged_models.dataset(), 4)
            updater = cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                               ['@numpy', '@numpy'])
            updater.update()
            with open({pids!r}, 'w') as f:
                f.write(' '.join(str(p.pid) for p in
                                 multiprocessing.active_children()))
            time.sleep(60)
    ''').format(root=ROOT, tests=TESTS, pids=str(pids)))
    process = subprocess.Popen([sys.executable, str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        workers = _worker_pids(process, pids)
        assert len(workers) == 2
        process.kill()
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_ctrl_c_to_the_whole_process_group_ends_the_run(tmp_path):
    # A terminal's Ctrl-C reaches the workers too: they must leave it to
    # the user's process, which stops them; nothing is left behind.
    pids = tmp_path / 'pids'
    script = tmp_path / 'group.py'
    script.write_text(textwrap.dedent('''
        import multiprocessing, sys
        sys.path[:0] = [{root!r}, {tests!r}]
        import cgdp_chainer, chainer
        import chainer.links as L
        import staged_models
        if __name__ == '__main__':
            model = L.Classifier(staged_models.SlowLaterMLP(seconds=30))
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            iterator = chainer.iterators.SerialIterator(
                staged_models.dataset(), 4)
            updater = cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                               ['@numpy', '@numpy'])
            updater.update()
            with open({pids!r}, 'w') as f:
                f.write(' '.join(str(p.pid) for p in
                                 multiprocessing.active_children()))
            try:
                updater.update()
            except KeyboardInterrupt:
                print('interrupted at', updater.iteration, flush=True)
            finally:
                updater.finalize()
            print('children left', len(multiprocessing.active_children()))
    ''').format(root=ROOT, tests=TESTS, pids=str(pids)))
    process = subprocess.Popen([sys.executable, str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        workers = _worker_pids(process, pids)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, err
    assert 'interrupted at 1' in out
    assert 'children left 0' in out
    assert not any(_alive(pid) for pid in workers)


def test_signal_round_trip_and_batch_hand_over_are_measurable():
    from cgdp_chainer.runtime.transport import shared
    updater = _updater()
    updater.update()
    round_trip = updater.signal_round_trip_seconds(repeats=20)
    updater.finalize()
    assert 0 < round_trip < 1.0
    # A sub-batch written to shared memory reads back equal.
    buffer, reader = shared.BatchBuffer(), shared.BatchReader()
    arrays = (numpy.arange(12, dtype=numpy.float32).reshape(3, 4),
              numpy.array([1, 2, 3], dtype=numpy.int32))
    try:
        for scale in (1, 50):  # the second write outgrows the segment
            batch = tuple(numpy.tile(a, scale) for a in arrays)
            back = reader.read(buffer.write(batch))
            assert isinstance(back, tuple) and len(back) == 2
            for a, b in zip(batch, back):
                numpy.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype
        as_dict = reader.read(buffer.write({'x': arrays[0]}))
        numpy.testing.assert_array_equal(as_dict['x'], arrays[0])
    finally:
        reader.close()
        buffer.close()
