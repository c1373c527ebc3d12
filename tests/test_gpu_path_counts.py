"""What a GPU replica's iteration costs its host, counted per iteration on
the CPU stand-in of CuPy's copies (tests/cuda_standin.py).

A replica of the updater (:class:`ReplicaWorker` over a
:class:`ChunkedCudaTransfer`) trains a small classifier on the stand-in's
device; a host thread waits for each chunk's gradients and publishes it, as
the host accumulator does. Counted per iteration, after the first:

* pageable host-device copies: none (its share is staged in page-locked
  memory; ``device.send`` of a host array is a pageable copy);
* the share's copy: one, on a stream of its own (not the compute stream);
* host-blocking waits: the hand-over's (one per chunk, in the host
  thread), none in the replica's thread, and none to read the reported
  values, whose copies ride ahead of the gradients on the copy stream.

The reported values are what a replica on '@numpy' reports, in value and
type. The first three tests fail on the code before the input staging and
the reported values' read-back (1cc5d15): there, the share went by
``device.send`` (two pageable copies on the compute stream, each a wait in
the replica's thread) and the values by ``to_cpu`` (a wait for the compute
stream on a GPU; on the stand-in, outside its counts, hence the third
test's count of their copies).
"""
import collections
import queue
import threading

import chainer
import chainer.links as L
import numpy
import pytest

import cgdp_chainer
import cuda_standin
import staged_models

from cgdp_chainer.runtime.replica import observations
from cgdp_chainer.runtime.replica import random_streams
from cgdp_chainer.runtime.replica import readiness
from cgdp_chainer.runtime.workers import worker as worker_module
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import cuda_transfer
from cgdp_chainer.runtime.transport import input_staging
from cgdp_chainer.runtime.transport import transfer as transfer_module

ITERATIONS = 4
BATCH = 6


class _WaitingHost(object):
    """The host accumulator's part that the counts see: in a thread of its
    own, waits for each delivered chunk's gradients, then publishes the
    chunk back (the weights are the master's, unchanged)."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.chunk_names = None
        self.thread_ids = set()
        self._queue = queue.Queue()
        self._done = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self.thread_ids.add(threading.get_ident())
        while True:
            item = self._queue.get()
            if item is None:
                return
            chunk, ready = item
            self.transfer.wait_grads(ready)
            if self.chunk_names is not None:
                self.transfer.publish(chunk, self.chunk_names[chunk])
            self._done.release()

    def deliver(self, iteration, chunk, ready):
        self._queue.put((chunk, ready))

    def check(self):
        pass

    def wait(self, n_chunks):
        for _ in range(n_chunks):
            assert self._done.acquire(timeout=30), 'the host thread hangs'

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=30)


def _model():
    return L.Classifier(staged_models.StagedMLP())


def _batches():
    data = staged_models.dataset(n=BATCH * ITERATIONS)
    return [chainer.dataset.concat_examples(
        data[i * BATCH:(i + 1) * BATCH]) for i in range(ITERATIONS)]


class _Replica(object):
    """A replica worker, its transfer and its host, on a device of either
    kind: the stand-in GPU or '@numpy'."""

    def __init__(self, gpu):
        model = _model()
        params = collections.OrderedDict(model.namedparams())
        names = list(params)
        if gpu:
            self.copies = cuda_standin.HostDeviceCopies()
            self.device = cuda_standin.StandinDevice(self.copies)
            layout = buffers.FlatLayout.of_arrays(
                {name: param.array for name, param in params.items()})
            self.master = self.copies.pinned_buffer(layout.capacity)
            buffers.place(layout, self.master,
                          {name: p.array for name, p in params.items()})
            self.transfer = cuda_transfer.ChunkedCudaTransfer(
                layout, self.master, None, params, self.device,
                copies=self.copies)
        else:
            self.copies = None
            self.device = chainer.get_device('@numpy')
            master_params = {name: chainer.Parameter(p.array.copy())
                             for name, p in params.items()}
            layout = buffers.FlatLayout.of_arrays(
                {name: p.array for name, p in master_params.items()})
            self.master = buffers.FlatMaster(
                master_params, layout, buffers.host_buffer(layout.capacity))
            self.transfer = transfer_module.HostResidentTransfer(
                self.master, params)
        self.layout = layout
        self.host = _WaitingHost(self.transfer)
        self.worker = worker_module.ReplicaWorker(
            0, self.device, model, self.transfer, self.host)
        self.streams = random_streams.ReplicaStreams([self.device], 'thread')
        self.names = names
        self.plan = None

    def run(self, iteration, in_arrays):
        """One iteration (the first forms a plan of one layer per chunk and
        lays the buffers out by it)."""
        forming = self.plan is None
        job_plan, layout = None, None
        if iteration == 1:
            job_plan = self.plan
            layout = self.layout
        job = worker_module.Job(
            iteration=iteration, seed=self.streams.seed(0, iteration),
            plan=job_plan,
            fingerprint=None if forming else self.plan.fingerprint,
            record_events=False, send_persistents=False, persistents=None,
            config=worker_module.caller_config(), loss_scale=None,
            layout=layout)
        result = self.worker.run(job, in_arrays)
        n_chunks = 1 if forming else self.plan.n_chunks
        self.host.wait(n_chunks)
        if forming:
            self.plan = readiness.ChunkPlan.from_ready_order(
                result.ready.order, result.ready.unused, chunk_size=1)
            self.host.chunk_names = worker_module.runtime_chunk_names(
                self.plan)
            self._relayout()
        return result

    def _relayout(self):
        """The master's buffer in the plan's layer order, as the updater
        lays it out once the plan is formed."""
        layout = self.layout.reordered(buffers.layer_order(self.plan))
        if isinstance(self.master, buffers.FlatMaster):
            self.master.relayout(layout)
        else:
            values = {name: view.copy() for name, view in
                      self.layout.views(self.master).items()}
            buffers.place(layout, self.master, values)
        self.layout = layout

    def close(self):
        self.host.close()
        self.transfer.close()


def _counts(log, replica_thread, host_threads):
    """What one iteration's log holds, in the words of the issue."""
    copies = [entry for entry in log if isinstance(entry, cuda_standin.Copy)]
    waits = [entry for entry in log if isinstance(entry, cuda_standin.Wait)]
    return {
        'pageable copies': sum(copy.pageable for copy in copies),
        'waits in the replica thread': sum(
            wait.thread == replica_thread for wait in waits),
        'waits in the host thread': sum(
            wait.thread in host_threads for wait in waits),
        'waits elsewhere': sum(
            wait.thread != replica_thread and wait.thread not in host_threads
            for wait in waits),
    }


def _steady_iterations(replica):
    """Runs the iterations after the plan is taken; yields each one's
    index, result, log and the share it ran on."""
    batches = _batches()
    replica.run(0, batches[0])
    replica.run(1, batches[1])  # takes the plan and its layout
    assert replica.plan.n_chunks > 2
    for iteration in range(2, ITERATIONS):
        replica.copies.take_log()
        result = replica.run(iteration, batches[iteration])
        observation = dict(result.observation)  # as the updater reads it
        yield observation, replica.copies.take_log(), batches[iteration]


def test_a_gpu_replicas_iteration_waits_only_for_the_hand_over():
    replica = _Replica(gpu=True)
    me = threading.get_ident()
    try:
        for observation, log, _ in _steady_iterations(replica):
            assert isinstance(observation['main/loss'],
                              observations.VariableValue)
            assert _counts(log, me, replica.host.thread_ids) == {
                'pageable copies': 0,
                'waits in the replica thread': 0,
                'waits in the host thread': replica.plan.n_chunks,
                'waits elsewhere': 0}, log
    finally:
        replica.close()


def test_the_share_is_one_copy_from_page_locked_memory_on_its_own_stream():
    replica = _Replica(gpu=True)
    transfer = replica.transfer
    try:
        for _, log, share in _steady_iterations(replica):
            inputs = [entry for entry in log
                      if isinstance(entry, cuda_standin.Copy) and
                      entry.kind == 'h2d' and
                      entry.stream is not transfer.h2d_stream]
            assert len(inputs) == 1, inputs
            copy, = inputs
            assert not copy.pageable
            assert copy.nbytes >= sum(array.nbytes for array in share)
            assert copy.stream is not replica.copies.compute
            assert copy.stream is not transfer.d2h_stream
    finally:
        replica.close()


def test_reported_values_ride_ahead_of_the_gradients():
    # Each reported array (the loss and the accuracy) leaves in a copy
    # into page-locked memory on the copy stream, issued before the
    # gradients' copies: once the host has waited for those, reading the
    # values waits for nothing (checked by the first test's counts).
    replica = _Replica(gpu=True)
    try:
        for observation, log, _ in _steady_iterations(replica):
            out = [entry for entry in log
                   if isinstance(entry, cuda_standin.Copy) and
                   entry.kind == 'd2h']
            assert all(copy.stream is replica.transfer.d2h_stream
                       for copy in out)
            assert not any(copy.pageable for copy in out)
            reported = [copy.nbytes for copy in out[:2]]
            assert reported == [4, 4], out  # two float32 scalars
            assert len(out) == 2 + replica.plan.n_chunks, out
    finally:
        replica.close()


def test_reported_values_equal_a_numpy_replicas_in_value_and_type():
    gpu, cpu = _Replica(gpu=True), _Replica(gpu=False)
    try:
        batches = _batches()
        for iteration in range(ITERATIONS):
            actual = dict(gpu.run(iteration, batches[iteration]).observation)
            expected = cpu.run(iteration, batches[iteration]).observation
            assert list(actual) == list(expected)
            for key, value in expected.items():
                assert type(actual[key]) is type(value), key
                if isinstance(value, observations.VariableValue):
                    assert type(actual[key].array) is type(value.array)
                    assert actual[key].array.dtype == value.array.dtype
                    numpy.testing.assert_allclose(
                        actual[key].array, value.array, rtol=1e-6)
                else:
                    numpy.testing.assert_allclose(actual[key], value,
                                                  rtol=1e-6)
        # Both trained on the same weights: the stand-in's copies ordered.
        for (name, p), (_, q) in zip(sorted(gpu.worker.replica.namedparams()),
                                     sorted(cpu.worker.replica.namedparams())):
            numpy.testing.assert_array_equal(p.array, q.array, name)
    finally:
        gpu.close()
        cpu.close()


def test_a_pending_observation_pickles_as_the_settled_dict():
    import pickle
    replica = _Replica(gpu=True)
    try:
        batches = _batches()
        pending = replica.run(0, batches[0]).observation
        settled = pickle.loads(pickle.dumps(pending))
        assert type(settled) is dict
        assert isinstance(settled['main/loss'], observations.VariableValue)
        assert settled['main/loss'].array.dtype == numpy.float32
    finally:
        replica.close()


def test_a_staged_share_keeps_its_containers_and_values():
    copies = cuda_standin.HostDeviceCopies()
    staging = input_staging.InputStaging(copies)
    share = {'x': numpy.arange(12, dtype=numpy.float32).reshape(3, 4),
             'rest': (numpy.array([1, 2, 3], numpy.int32), 5, None,
                      numpy.zeros((0, 2), numpy.float64))}
    staged = staging.stage(share)
    on_device = staged.on_device()
    assert set(on_device) == {'x', 'rest'}
    numpy.testing.assert_array_equal(on_device['x'], share['x'])
    assert type(on_device['rest']) is tuple
    numpy.testing.assert_array_equal(on_device['rest'][0], share['rest'][0])
    assert on_device['rest'][0].dtype == numpy.int32
    assert on_device['rest'][1:3] == (5, None)
    assert on_device['rest'][3].shape == (0, 2)
    # The device arrays are the staging's, not the caller's.
    assert not numpy.shares_memory(on_device['x'], share['x'])
    staged.release()


@pytest.mark.parametrize('depth', [1, 2])
def test_shares_staged_ahead_keep_their_values_and_memory(depth):
    # Each share gets device memory of its own (a model may keep its
    # inputs, as with device.send); page-locked buffers are reused in turn
    # once their copies are done.
    copies = cuda_standin.HostDeviceCopies()
    staging = input_staging.InputStaging(copies, depth=depth)
    shares = [numpy.full(5, i, numpy.float32) for i in range(4)]
    staged = []
    kept = []
    for share in shares:
        staged.append(staging.stage(share))
        if len(staged) > 1:
            kept.append(staged[-2].on_device())
            staged[-2].release()
    kept.append(staged[-1].on_device())
    for share, array in zip(shares, kept):
        numpy.testing.assert_array_equal(array, share)
    for a in range(len(kept)):
        for b in range(a):
            assert not numpy.shares_memory(kept[a], kept[b])


def test_a_share_staged_ahead_leaves_the_replica_no_copy_to_issue():
    # The input path stages a batch read ahead in its background thread:
    # the replica's thread then issues no copy to the device at all (the
    # host thread publishes the weights).
    replica = _Replica(gpu=True)
    me = threading.get_ident()
    try:
        batches = _batches()
        replica.run(0, batches[0])
        replica.run(1, batches[1])
        for iteration in range(2, ITERATIONS):
            staged = []
            stager = threading.Thread(target=lambda: staged.append(
                replica.worker.inputs.stage(batches[iteration])))
            stager.start()
            stager.join()
            replica.copies.take_log()
            observation = dict(replica.run(iteration, staged[0]).observation)
            log = replica.copies.take_log()
            assert [entry for entry in log
                    if isinstance(entry, cuda_standin.Copy) and
                    entry.kind == 'h2d' and entry.thread == me] == [], log
            assert not [entry for entry in log
                        if isinstance(entry, cuda_standin.Wait) and
                        entry.thread == me], log
            assert isinstance(observation['main/accuracy'],
                              observations.VariableValue)
    finally:
        replica.close()


def test_the_input_path_stages_a_batch_read_ahead_in_its_thread():
    from cgdp_chainer.runtime.input import input_path
    copies = cuda_standin.HostDeviceCopies()
    staging = input_staging.InputStaging(copies)
    iterator = chainer.iterators.SerialIterator(
        staged_models.dataset(n=4 * BATCH), BATCH, shuffle=False)
    path = input_path.InputPath(
        [iterator], chainer.dataset.concat_examples, 2, True,
        lambda *words: None)
    path.stage_with([staging.stage, None])
    me = threading.get_ident()
    try:
        assert path.reads_ahead
        for iteration in range(3):
            copies.take_log()
            batch = path.next_batch()
            path.read_ahead()
            inputs = batch.inputs
            log = copies.take_log()
            assert isinstance(inputs[0], input_staging.StagedInputs)
            assert isinstance(inputs[1], tuple)  # a host replica's share
            x, t = inputs[0].on_device()
            expected = chainer.dataset.concat_examples(
                staged_models.dataset(n=4 * BATCH)[
                    iteration * BATCH:(iteration + 1) * BATCH][0::2])
            numpy.testing.assert_array_equal(x, expected[0])
            numpy.testing.assert_array_equal(t, expected[1])
            inputs[0].release()
            copied = [entry for entry in log
                      if isinstance(entry, cuda_standin.Copy)]
            assert not any(entry.pageable for entry in copied), copied
            if iteration > 0:  # read ahead, staged in the background
                assert not any(entry.thread == me for entry in copied), \
                    copied
        assert path.batches_read_ahead == 2
    finally:
        path.close()


@pytest.mark.gpu
def test_cupy_staging_and_read_back_on_a_gpu():
    import cupy
    import cupyx
    device = chainer.get_device('@cupy:0')
    with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True):
        copies = cuda_transfer.CupyCopies(0)
        staging = input_staging.InputStaging(copies)
        share = (numpy.arange(12, dtype=numpy.float32).reshape(3, 4),
                 numpy.array([1, 2, 3], numpy.int32))
        staged = staging.stage(share)
        x, t = staged.on_device()
        assert isinstance(x, cupy.ndarray) and isinstance(t, cupy.ndarray)
        doubled = x * 2  # on the current stream, ordered after the copy
        staged.release()
        numpy.testing.assert_array_equal(cupy.asnumpy(doubled), share[0] * 2)
        numpy.testing.assert_array_equal(cupy.asnumpy(t), share[1])
        model = L.Linear(3, 2)
        model.to_device(device)
        params = collections.OrderedDict(model.namedparams())
        layout = buffers.FlatLayout.of_arrays(
            {name: param.array for name, param in params.items()})
        master = buffers.host_buffer(
            layout.capacity, lambda n: cupyx.empty_pinned(n, numpy.uint8))
        transfer = cuda_transfer.ChunkedCudaTransfer(
            layout, master, None, params, device)
        loss = chainer.Variable(cupy.asarray(1.5, numpy.float32))
        pending = observations.PendingObservation(
            transfer.read_back, transfer.copies.is_device_array)
        pending.take({'main/loss': loss, 'main/n': 3,
                      'main/v': cupy.arange(3, dtype=numpy.float64)})
        settled = dict(pending)
        assert type(settled['main/loss']) is observations.VariableValue
        assert type(settled['main/loss'].array) is numpy.ndarray
        assert settled['main/loss'].array == numpy.float32(1.5)
        assert settled['main/n'] == 3
        assert type(settled['main/v']) is numpy.ndarray
        numpy.testing.assert_array_equal(settled['main/v'], [0., 1., 2.])
        transfer.close()


def _train_reporting(make_updater, iterations=ITERATIONS, log=None):
    """Trains a classifier; returns its parameters and, per update, what
    the reporter saw (and, with ``log``, ``log()`` after each update)."""
    model = _model()
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    updater = make_updater(chainer.iterators.SerialIterator(
        staged_models.dataset(n=BATCH * iterations), BATCH, shuffle=False),
        optimizer)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    reports, logs = [], []
    try:
        for _ in range(iterations):
            observation = {}
            with reporter.scope(observation):
                updater.update()
            reports.append(observation)
            if log is not None:
                logs.append(log())
    finally:
        updater.finalize()
    params = {name: p.array.copy() for name, p in model.namedparams()}
    return params, reports, logs


def test_the_updater_through_the_gpu_path_reports_and_trains_as_standard():
    # Two thread replicas through the GPU path (the stand-in), inputs
    # staged in the input path's thread: StandardUpdater's parameters and
    # reported values, in value and type. Per update after the second,
    # no pageable copy, no wait in the caller's thread, and each share's
    # copy (of a batch read ahead) issued off the caller's thread. (Outside
    # a Trainer, the caller's update() publishes every chunk again: user
    # code may have written the model.)
    made = []

    def copies(device):
        made.append(cuda_standin.HostDeviceCopies(device))
        return made[-1]

    def log():
        return [entry for standin in made for entry in standin.take_log()]

    expected, expected_reports, _ = _train_reporting(
        lambda iterator, optimizer: chainer.training.updaters.StandardUpdater(
            iterator, optimizer, device='@numpy'))
    caller = threading.get_ident()
    actual, reports, logs = _train_reporting(
        lambda iterator, optimizer: cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy', '@numpy'], chunk_size=1,
            workers='thread', device_copies=copies), log=log)
    for name, array in expected.items():
        numpy.testing.assert_allclose(actual[name], array, rtol=1e-5,
                                      atol=1e-6, err_msg=name)
    for got, want in zip(reports, expected_reports):
        assert list(got) == list(want)
        for key, value in want.items():
            assert type(got[key]) is type(value), key
            assert type(got[key].array) is type(value.array), key
            assert got[key].array.dtype == value.array.dtype, key
            numpy.testing.assert_allclose(got[key].array, value.array,
                                          rtol=1e-5, err_msg=key)
    # A share: 3 examples of 6 float32 features, then their int32 labels
    # on the next cache line.
    share_bytes = buffers.FlatLayout([('x', (3, 6), numpy.float32),
                                      ('t', (3,), numpy.int32)]).nbytes
    for entries in logs[2:]:
        copied = [e for e in entries if isinstance(e, cuda_standin.Copy)]
        waits = [e for e in entries if isinstance(e, cuda_standin.Wait)]
        assert not any(copy.pageable for copy in copied), copied
        assert not any(wait.thread == caller for wait in waits), waits
        inputs = [copy for copy in copied if copy.nbytes == share_bytes]
        assert len(inputs) == 2, copied
        assert not any(copy.thread == caller for copy in inputs), inputs
        # The hand-over's: one wait per chunk and replica, in the host's
        # threads (the stand-in's streams run when waited for).
        assert len(waits) == 2 * 4, waits


@pytest.mark.parametrize('options', [
    {'workers': 'process'}, {'workers': 'thread', 'timeline': True},
    {'workers': 'thread', 'device_copies': 'not callable'}])
def test_the_updaters_stand_in_option_is_refused_where_it_cannot_run(
        options):
    options = dict(options)
    options.setdefault('device_copies', cuda_standin.HostDeviceCopies)
    if options.get('timeline'):
        options['timeline'] = cgdp_chainer.Timeline()
    model = _model()
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(),
                                                BATCH)
    with pytest.raises(ValueError, match="workers='thread' and no timeline"):
        cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                 **options)
