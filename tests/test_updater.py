"""CGDPUpdater: equivalence with one device and with ParallelUpdater,
Trainer integration, snapshots, failures and bad input."""
import copy
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy
import pytest

import cgdp_chainer
import chainer
import chainer.links as L
from chainer import optimizer_hooks
from chainer.training import updaters

import equivalence
from equivalence import WORKERS, assert_same_params, cgdp, parallel, standard  # NOQA
import staged_models

ITERATIONS = 3
BATCH = 6


def make_optimizer(kind):
    if kind == 'momentum':
        return chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    if kind == 'adam':
        return chainer.optimizers.Adam(alpha=0.01)
    if kind == 'momentum+decay':
        return chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    raise ValueError(kind)


def setup_optimizer(kind, model):
    optimizer = make_optimizer(kind)
    optimizer.setup(model)
    if kind == 'momentum+decay':
        optimizer.add_hook(optimizer_hooks.WeightDecay(0.01))
    return optimizer


def train(model, optimizer_kind, make_updater, iterations=ITERATIONS,
          batch=BATCH, data=None):
    return equivalence.train(
        model, lambda m: setup_optimizer(optimizer_kind, m), make_updater,
        iterations=iterations, batch=batch, data=data)




@pytest.mark.parametrize('workers', WORKERS)
@pytest.mark.parametrize('optimizer_kind', ['momentum', 'adam',
                                            'momentum+decay'])
@pytest.mark.parametrize('n_devices', [1, 2, 3])
def test_mean_equals_one_device_on_whole_batch(optimizer_kind, n_devices,
                                               workers):
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), optimizer_kind, standard)
    # Layers per chunk (StagedMLP has 4 layers); None: by bytes.
    for chunk_size in (1, 3, None):
        actual = train(copy.deepcopy(base), optimizer_kind,
                       cgdp(n_devices, chunk_size=chunk_size,
                            workers=workers))
        assert_same_params(expected, actual)
    # Guard against a vacuous comparison: training changed the parameters.
    initial = {n: p.array for n, p in base.namedparams()}
    assert any(not numpy.allclose(initial[n], expected[n]) for n in initial)


@pytest.mark.parametrize('optimizer_kind', ['momentum', 'adam',
                                            'momentum+decay'])
@pytest.mark.parametrize('n_devices', [2, 3])
@pytest.mark.parametrize('workers', WORKERS)
def test_sum_equals_parallel_updater(optimizer_kind, n_devices, workers):
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), optimizer_kind, parallel(n_devices))
    actual = train(copy.deepcopy(base), optimizer_kind,
                   cgdp(n_devices, chunk_size=2, reduction='sum',
                        workers=workers))
    assert_same_params(expected, actual)


def test_uneven_split_is_weighted_by_share_of_batch():
    base = L.Classifier(staged_models.StagedMLP())
    data = staged_models.dataset(n=15)
    expected = train(copy.deepcopy(base), 'momentum', standard, batch=5,
                     data=data)
    actual = train(copy.deepcopy(base), 'momentum', cgdp(2), batch=5,
                   data=data)
    assert_same_params(expected, actual)


def test_chunk_boundaries_given_explicitly():
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), 'adam', standard)
    actual = train(copy.deepcopy(base), 'adam', cgdp(2, chunk_size=[0, 1, 3]))
    assert_same_params(expected, actual)


@pytest.mark.parametrize('workers', WORKERS)
def test_auxiliary_output_with_a_loss_func_holding_the_model(workers):
    # loss_func(*in_arrays) as in StandardUpdater; one that holds the model
    # computes on each replica's own copy of it.
    base = staged_models.StagedAux()
    model = copy.deepcopy(base)
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    reference = updaters.StandardUpdater(
        iterator, optimizer, loss_func=staged_models.ModelAuxLoss(model))
    for _ in range(ITERATIONS):
        reference.update()
    expected = {n: p.array.copy() for n, p in model.namedparams()}
    for chunk_size in (1, 2, 4):
        copied = copy.deepcopy(base)

        def make(iterator, optimizer):
            return cgdp_chainer.CGDPUpdater(
                iterator, optimizer, ['@numpy'] * 2, chunk_size=chunk_size,
                loss_func=staged_models.ModelAuxLoss(copied),
                workers=workers)
        actual = train(copied, 'momentum', make)
        assert_same_params(expected, actual)


def test_whole_gradient_hook_updates_after_last_chunk():
    base = L.Classifier(staged_models.StagedMLP())

    def with_clipping(make):
        def wrapped(iterator, optimizer):
            optimizer.add_hook(optimizer_hooks.GradientClipping(0.05))
            return make(iterator, optimizer)
        return wrapped

    expected = train(copy.deepcopy(base), 'momentum', with_clipping(standard))
    with pytest.warns(UserWarning, match='need the whole gradient'):
        actual = train(copy.deepcopy(base), 'momentum',
                       with_clipping(cgdp(2, chunk_size=2)))
    assert_same_params(expected, actual)


def test_model_without_stages_trains_in_chunks_without_a_warning():
    base = L.Classifier(staged_models.Plain())
    expected = train(copy.deepcopy(base), 'momentum', standard)
    model = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        optimizer = setup_optimizer('momentum', model)
        iterator = chainer.iterators.SerialIterator(
            staged_models.dataset(), BATCH, shuffle=False)
        updater = cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                           ['@numpy'] * 2, chunk_size=1)
        for _ in range(ITERATIONS):
            updater.update()
        updater.finalize()
    assert len(updater.chunks) == 4
    assert_same_params(expected, {n: p.array for n, p in
                                  model.namedparams()})


def test_optimizer_t_advances_once_per_iteration():
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup_optimizer('adam', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=1)
    for _ in range(4):
        updater.update()
    updater.finalize()
    assert optimizer.t == 4
    assert all(p.update_rule.t == 4 for p in model.params())


def test_a_model_from_models_package():
    models = pytest.importorskip('models')
    base = models.Classifier(models.get_model('alexnet', n_classes=10,
                                              seed=0))
    rng = numpy.random.RandomState(0)
    data = chainer.datasets.TupleDataset(
        rng.normal(size=(8, 3, 64, 64)).astype(numpy.float32),
        rng.randint(0, 10, 8).astype(numpy.int32))
    # Dropout draws different masks on different replicas, so it is off
    # here; the replicas take the caller's configuration, in threads and in
    # worker processes alike.
    with chainer.using_config('train', False):
        expected = train(copy.deepcopy(base), 'momentum', standard, batch=4,
                         data=data, iterations=2)
        for workers in WORKERS:
            actual = train(copy.deepcopy(base), 'momentum',
                           cgdp(2, chunk_size=3, workers=workers),
                           batch=4, data=data, iterations=2)
            assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)


def test_trainer_reports_loss_accuracy_and_evaluates(tmp_path):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup_optimizer('momentum', model)
    data = staged_models.dataset()
    iterator = chainer.iterators.SerialIterator(data, BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2)
    trainer = chainer.training.Trainer(updater, (4, 'iteration'),
                                       out=str(tmp_path))
    seen = []

    @chainer.training.make_extension(trigger=(1, 'iteration'))
    def check_model_is_trained(trainer):
        # The user's model holds the parameters of this very iteration.
        seen.append(model.predictor.layers[0].W.array.copy())

    trainer.extend(check_model_is_trained)
    trainer.extend(chainer.training.extensions.Evaluator(
        chainer.iterators.SerialIterator(data, BATCH, repeat=False,
                                         shuffle=False), model),
        trigger=(1, 'iteration'))
    log = chainer.training.extensions.LogReport(trigger=(1, 'iteration'))
    trainer.extend(log)
    trainer.run()
    assert len(log.log) == 4
    for entry in log.log:
        assert numpy.isfinite(entry['main/loss'])
        assert 0.0 <= entry['main/accuracy'] <= 1.0
        assert 'validation/main/loss' in entry
    assert not numpy.allclose(seen[0], seen[-1])
    assert threading.active_count() == _baseline_threads


_baseline_threads = threading.active_count()


def test_snapshot_resume_in_fresh_process_is_exact(tmp_path):
    script = tmp_path / 'run.py'
    script.write_text(textwrap.dedent('''
        import sys
        sys.path.insert(0, {tests!r})
        import cgdp_chainer
        import chainer, numpy
        import chainer.links as L
        import staged_models
        def main():
            mode, path = sys.argv[1], sys.argv[2]
            iterations = int(sys.argv[3])
            model = L.Classifier(staged_models.StagedMLP())
            optimizer = chainer.optimizers.Adam(alpha=0.01)
            optimizer.setup(model)
            iterator = chainer.iterators.SerialIterator(
                staged_models.dataset(), 4,
                order_sampler=chainer.iterators.ShuffleOrderSampler(
                    numpy.random.RandomState(3)))
            updater = cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                               ['@numpy'] * 2, chunk_size=2)
            if mode == 'resume':
                chainer.serializers.load_npz(path, updater)
            for _ in range(iterations):
                updater.update()
            if mode == 'save':
                chainer.serializers.save_npz(path, updater)
            else:
                numpy.savez(path + '.params.npz',
                            **{{n: p.array for n, p in model.namedparams()}})
            updater.finalize()

        if __name__ == '__main__':
            main()
    ''').format(tests=os.path.dirname(__file__)))
    snapshot = str(tmp_path / 'snap.npz')
    straight = str(tmp_path / 'straight.npz')

    def run(*args):
        result = subprocess.run([sys.executable, str(script)] + list(args),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr

    run('save', snapshot, '3')
    run('resume', snapshot, '3')
    run('straight', straight, '6')
    resumed = numpy.load(snapshot + '.params.npz')
    uninterrupted = numpy.load(straight + '.params.npz')
    for name in uninterrupted.files:
        numpy.testing.assert_array_equal(resumed[name], uninterrupted[name])


def _run_until_error(updater, iterations=5):
    outcome = {}

    def target():
        try:
            for _ in range(iterations):
                updater.update()
        except BaseException as error:
            outcome['error'] = error
        finally:
            updater.finalize()
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), 'update() hung after a thread failed'
    return outcome.get('error')


@pytest.mark.parametrize('workers', WORKERS)
def test_failure_in_a_replica_surfaces_with_traceback(workers):
    before = threading.active_count()
    # Replica 1 raises in its second iteration.
    model = L.Classifier(staged_models.FaultyMLP(at_call=2, replica=1))
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 3,
                                       chunk_size=2, workers=workers)
    error = _run_until_error(updater)
    assert isinstance(error, RuntimeError)
    assert 'injected step failure' in str(error)
    if workers == 'thread':
        frames = [frame.name for frame in
                  __import__('traceback').extract_tb(error.__traceback__)]
        assert 'forward' in frames  # the stage's own frame is kept
    else:
        # The worker's traceback text, down to the stage's own frame.
        assert 'Traceback' in str(error)
        assert 'in forward' in str(error)
        assert 'staged_models.py' in str(error)
    assert any('replica 1 (@numpy)' in note for note in error.__notes__)
    assert updater.iteration == 1
    assert threading.active_count() == before
    assert multiprocessing.active_children() == []


def test_failure_in_the_host_update_surfaces_and_stops_threads():
    before = threading.active_count()

    class FailingHook(object):
        name = 'failing'
        call_for_each_param = True
        timing = 'pre'

        def __call__(self, rule, param):
            if rule.t == 2:
                raise ValueError('injected host failure')

    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup_optimizer('momentum', model)
    optimizer.add_hook(FailingHook())
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2)
    error = _run_until_error(updater)
    assert isinstance(error, ValueError)
    assert 'injected host failure' in str(error)
    assert any('host accumulator' in note for note in error.__notes__)
    assert threading.active_count() == before
    assert multiprocessing.active_children() == []
    with pytest.raises(RuntimeError, match='finalized or stopped'):
        updater.update()


def _updater(devices=('@numpy', '@numpy'), batch=BATCH, **kwargs):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), batch, shuffle=False)
    if isinstance(devices, tuple):
        devices = list(devices)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer, devices, **kwargs)


@pytest.mark.parametrize('kwargs, message', [
    (dict(devices=[]), 'no devices'),
    (dict(devices=['@numpy', 'gpu0']), "unknown device 'gpu0'"),
    # No machine has GPU 64: refused without CuPy and with it alike.
    (dict(devices=['@numpy', '@cupy:64']),
     r'needs CuPy|asks for GPU 64, but this machine has'),
    (dict(devices=['@numpy'] * 3, batch=2), 'smaller than the number'),
    (dict(chunk_size=0), 'out of range'),
    (dict(chunk_size=8), 'out of range'),
    (dict(chunk_size='fastest'), "unknown chunk_size 'fastest'"),
    (dict(chunk_size=[3, 1]), 'strictly increasing layer indices'),
    (dict(chunk_size=[0, 4]), 'strictly increasing layer indices'),
    (dict(chunk_bytes=0), 'chunk_bytes must be a positive integer'),
    (dict(chunk_size=2, chunk_bytes=100), 'not both'),
    (dict(reduction='max'), "unknown reduction 'max'"),
    (dict(devices=3), 'devices must be a list'),
    (dict(host_threads=0), 'host_threads must be a positive integer'),
    (dict(host_threads=1.5), 'host_threads must be a positive integer'),
    (dict(blas_threads=0), 'blas_threads must be a positive integer'),
    (dict(workers='fiber'), "unknown workers 'fiber'; valid: process, "
                            'thread'),
    (dict(start_method='fork'), "unknown start_method 'fork'"),
    (dict(timeline='trace.json'), 'timeline must be a cgdp_chainer'),
    (dict(converter='concat'), 'converter must be callable'),
    (dict(loss_func='mse'), 'loss_func must be callable'),
])
def test_bad_input_is_refused_before_training(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _updater(**kwargs)


@pytest.mark.parametrize('workers', WORKERS)
def test_timeline_records_every_phase_and_exports_a_trace(tmp_path, workers):
    import json
    timeline = cgdp_chainer.Timeline()
    updater = _updater(chunk_size=2, timeline=timeline, workers=workers)
    for _ in range(2):
        updater.update()
    updater.finalize()
    kinds = {(e.device, e.kind) for e in timeline.events}
    for device in (0, 1):
        assert (device, 'forward') in kinds and (device, 'backward') in kinds
    for kind in ('reduce', 'update', 'h2d'):
        assert ('host', kind) in kinds
    chunks = {e.chunk for e in timeline.events if e.kind == 'backward'}
    assert chunks == set(range(len(updater.chunks)))
    summaries = timeline.iteration_summaries
    assert [s['iteration'] for s in summaries] == [0, 1]
    for s in summaries:
        events = timeline.events_of(s['iteration'])
        # Every event of an iteration lies inside its update() call.
        for event in events:
            assert s['start'] <= event.start <= event.end <= s['end']
        # The summary is derived from the events: compute is the mean per
        # device of forward + backward time, and the exposed sync runs from
        # the last backward to (at least) the last publish.
        per_device = [sum(e.end - e.start for e in events
                          if e.device == d and e.kind in ('forward',
                                                          'backward'))
                      for d in (0, 1)]
        assert s['compute'] == pytest.approx(sum(per_device) / 2)
        last_backward = max(e.end for e in events if e.kind == 'backward')
        last_publish = max(e.end for e in events
                           if e.device == 'host' and e.kind == 'h2d')
        assert s['exposed_sync'] >= last_publish - last_backward - 1e-9
        assert s['exposed_sync'] <= s['end'] - last_backward + 1e-9
    path = tmp_path / 'trace.json'
    timeline.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    complete = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    assert len(complete) == len(timeline.events)
    assert {e['ph'] for e in trace['traceEvents']} == {'X', 'M'}
    names = {e['tid']: e['args']['name'] for e in trace['traceEvents']
             if e['name'] == 'thread_name'}
    tracks = {names[e['tid']] for e in complete}
    assert {'replica 0 @numpy', 'replica 1 @numpy'} <= tracks
    assert all(name.startswith(('replica', 'host thread cgdp-host'))
               for name in tracks)


@pytest.mark.parametrize('workers', WORKERS)
def test_host_update_of_output_chunk_overlaps_the_input_chunk_backward(
        workers):
    # Chunk 0's backward is made long; the host must update the output-side
    # chunk while the replicas are still in it: the overlap CGDP is for.
    timeline = cgdp_chainer.Timeline()
    model = L.Classifier(staged_models.SlowInputSideMLP(seconds=0.3))
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(
        iterator, optimizer, ['@numpy'] * 2, chunk_size=2,
        timeline=timeline, workers=workers)
    # The first iteration learns the ready order (one chunk); the second
    # runs with the chunks.
    updater.update()
    updater.update()
    updater.finalize()
    assert len(updater.chunks) == 2
    events = timeline.events_of(1)
    output_chunk = len(updater.chunks) - 1
    update_end = [e.end for e in events if e.device == 'host'
                  and e.kind == 'update' and e.chunk == output_chunk]
    chunk0_backward_end = [e.end for e in events
                           if e.kind == 'backward' and e.chunk == 0]
    assert len(update_end) == 1 and len(chunk0_backward_end) == 2
    assert update_end[0] < min(chunk0_backward_end)


def test_host_reduction_order_within_a_chunk_backward_is_per_chunk():
    # Each chunk's update happens before the next iteration, and the
    # host processes a chunk only after every device delivered it.
    timeline = cgdp_chainer.Timeline()
    updater = _updater(devices=['@numpy'] * 3, chunk_size=1,
                       timeline=timeline)
    updater.update()
    updater.update()
    updater.finalize()
    events = timeline.events_of(1)
    assert len(updater.chunks) == 4
    for chunk in range(len(updater.chunks)):
        backward_ends = [e.end for e in events
                         if e.kind == 'backward' and e.chunk == chunk]
        reduce_start = [e.start for e in events
                        if e.kind == 'reduce' and e.chunk == chunk][0]
        assert len(backward_ends) == 3
        assert reduce_start >= max(backward_ends)


@pytest.mark.gpu
def test_two_gpu_replicas_equal_one_device_on_whole_batch():
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), 'momentum', standard)
    gpus = equivalence.two_gpu_replicas()

    def make(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(iterator, optimizer, gpus,
                                        chunk_size=2)
    actual = train(copy.deepcopy(base), 'momentum', make)
    assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_and_cpu_replicas_together_with_timeline():
    timeline = cgdp_chainer.Timeline()
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), 'adam', standard)

    def make(iterator, optimizer):
        return cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                        ['@cupy:0', '@numpy'], chunk_size=1,
                                        timeline=timeline)
    actual = train(copy.deepcopy(base), 'adam', make)
    assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)
    assert any(e.device == 0 and e.kind == 'backward'
               for e in timeline.events)


def test_auto_chunk_size_search_trains_exactly_like_fixed_chunks():
    # The trial iterations are real training steps: any chunk size gives
    # the same parameters, so the searched run equals a fixed-size run.
    base = L.Classifier(staged_models.StagedMLP())
    # More than the search's budget (3 sizes x 3 iterations for 4 layers,
    # after the first iteration), so the last iterations run with the
    # chosen size.
    iterations = 16
    expected = train(copy.deepcopy(base), 'momentum', cgdp(2, chunk_size=1),
                     iterations=iterations, data=staged_models.dataset(n=96))
    model = copy.deepcopy(base)
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(n=96), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size='auto')
    observed = []
    reporter = chainer.Reporter()
    for _ in range(iterations):
        observation = {}
        with reporter.scope(observation):
            updater.update()
        observed.append(observation.get('cgdp/chunk_size'))
    updater.finalize()
    actual = {n: p.array.copy() for n, p in model.namedparams()}
    assert_same_params(expected, actual)
    assert updater.chunk_size_search.done
    assert updater.chunk_size == updater.chunk_size_search.best
    assert 1 <= updater.chunk_size <= updater.n_layers
    assert len({size for size, _ in updater.chunk_size_search.history}) >= 2
    assert observed[-1] == updater.chunk_size


def test_model_chosen_chunk_size_inside_a_trainer(tmp_path):
    base = L.Classifier(staged_models.StagedMLP())
    expected = train(copy.deepcopy(base), 'momentum', standard, iterations=2)
    model = copy.deepcopy(base)
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size='model')
    trainer = chainer.training.Trainer(updater, (2, 'iteration'),
                                       out=str(tmp_path))
    trainer.extend(chainer.training.extensions.LogReport(
        trigger=(1, 'iteration')))
    trainer.run()
    assert 1 <= updater.chunk_size <= updater.n_layers
    actual = {n: p.array.copy() for n, p in model.namedparams()}
    assert_same_params(expected, actual)


def test_dropout_with_replica_threads_is_repeatable():
    models = pytest.importorskip('models')
    base = models.Classifier(models.get_model('googlenet', n_classes=4,
                                              seed=0))
    rng = numpy.random.RandomState(0)
    data = chainer.datasets.TupleDataset(
        rng.normal(size=(8, 3, 64, 64)).astype(numpy.float32),
        rng.randint(0, 4, 8).astype(numpy.int32))
    runs = []
    for _ in range(2):
        numpy.random.seed(5)
        runs.append(train(copy.deepcopy(base), 'momentum',
                          cgdp(2, chunk_size=2), iterations=2, batch=4,
                          data=data))
    for name in runs[0]:
        numpy.testing.assert_array_equal(runs[0][name], runs[1][name])


def _interrupt_soon(seconds):
    """Sends SIGINT to this process (as Ctrl-C does) after ``seconds``."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.parametrize('workers', WORKERS)
def test_ctrl_c_during_update_stops_every_thread_and_worker(workers):
    before = threading.active_count()
    # The first iteration is quick, the second lasts seconds: Ctrl-C comes
    # while it runs.
    model = L.Classifier(staged_models.SlowLaterMLP(seconds=3.0))
    optimizer = setup_optimizer('momentum', model)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(), BATCH, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       chunk_size=2, workers=workers)
    updater.update()
    timer = _interrupt_soon(0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            updater.update()
    finally:
        timer.cancel()
    updater.finalize()
    assert updater.iteration == 1
    assert threading.active_count() == before
    assert multiprocessing.active_children() == []
    with pytest.raises(RuntimeError, match='finalized or stopped'):
        updater.update()
