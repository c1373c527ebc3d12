"""Inputs of any structure a converter returns (the NLP examples' lists of
arrays of different lengths, nested containers, numbers and None), and an
error anywhere in update() stopping the replicas."""
import collections
import copy
import multiprocessing
import threading

import chainer
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.workers import worker as worker_module

import equivalence
from equivalence import WORKERS, assert_same_params
import nlp_models
import staged_models
from test_process_workers import _alive, _run_script
from test_updater import _interrupt_soon

Pair = collections.namedtuple('Pair', ('source', 'target'))


def _nested():
    """A converter's output nested in every supported way."""
    ragged = [numpy.arange(n, dtype=numpy.int32) for n in (3, 1, 5)]
    shared_array = numpy.ones((2, 3), numpy.float32)
    return {
        'xs': ragged,
        'pairs': (Pair(ragged[0], numpy.zeros(0, numpy.float64)),
                  [shared_array, (shared_array, None)]),
        'ordered': collections.OrderedDict(
            [('b', numpy.float32(2.5)), ('a', 7), ('c', 'text')]),
        'scalar': numpy.array(3.0),
        'objects': numpy.array([None, 'x'], dtype=object),
        'strided': numpy.arange(12.0).reshape(3, 4)[:, ::2],
        'nothing': None,
    }


def _assert_same_structure(expected, actual, path='inputs'):
    """Same container types, same keys in the same order, equal arrays of
    the same dtype, equal other values."""
    assert type(actual) is type(expected), path
    if isinstance(expected, numpy.ndarray):
        assert actual.dtype == expected.dtype, path
        assert actual.shape == expected.shape, path
        numpy.testing.assert_array_equal(actual, expected, err_msg=path)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            _assert_same_structure(expected[key], actual[key],
                                   '{}[{!r}]'.format(path, key))
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, b) in enumerate(zip(expected, actual)):
            _assert_same_structure(a, b, '{}[{}]'.format(path, i))
    else:
        assert actual == expected, path


def test_nested_inputs_come_back_through_shared_memory_exactly():
    inputs = _nested()
    buffer, reader = shared.BatchBuffer(), shared.BatchReader()
    try:
        back = reader.read(buffer.write(inputs))
    finally:
        reader.close()
        buffer.close()
    _assert_same_structure(inputs, back)
    # Copies, not views of the segment; an array given twice is one array.
    assert back['xs'][0] is not inputs['xs'][0]
    assert back['pairs'][0].source is back['xs'][0]
    first, second = back['pairs'][1]
    assert second[0] is first


def test_flatten_keeps_only_plain_arrays_for_shared_memory():
    inputs = _nested()
    structure, arrays = shared.flatten_inputs(inputs)
    # 3 ragged + the empty one + the shared one + 0-d + strided; the
    # object array, the NumPy scalar and the other values stay in the
    # structure.
    assert len(arrays) == 7
    assert all(type(a) is numpy.ndarray and not a.dtype.hasobject
               for a in arrays)
    _assert_same_structure(inputs, shared.unflatten_inputs(structure, arrays))


@pytest.mark.parametrize('inputs', [
    numpy.arange(4.0), (numpy.arange(4.0), numpy.arange(2)),
    {'x': numpy.arange(4.0)}, [numpy.arange(2), numpy.arange(3)], (), {},
    7, None])
def test_simple_forms_round_trip(inputs):
    buffer, reader = shared.BatchBuffer(), shared.BatchReader()
    try:
        _assert_same_structure(inputs, reader.read(buffer.write(inputs)))
    finally:
        reader.close()
        buffer.close()


def test_send_to_a_replica_keeps_the_structure():
    inputs = _nested()
    sent = worker_module.send_inputs(chainer.get_device('@numpy'), inputs)
    _assert_same_structure(inputs, sent)


def test_a_value_that_cannot_be_pickled_is_named():
    buffer = shared.BatchBuffer()
    try:
        with pytest.raises(ValueError, match="workers='thread'") as info:
            buffer.write({'x': numpy.zeros(2), 'lock': threading.Lock()})
    finally:
        buffer.close()
    assert 'lock' in str(info.value)


def _train(model, converter, data, make_updater, iterations=3, batch=6,
           use_cudnn='auto'):
    """Trains with dropout off (``train=False`` in the caller reaches every
    replica) and returns the parameters."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)
    updater = make_updater(iterator, optimizer, converter)
    try:
        with chainer.using_config('train', False), \
                chainer.using_config('use_cudnn', use_cudnn):
            for _ in range(iterations):
                updater.update()
    finally:
        updater.finalize()
    return {name: p.array.copy() for name, p in model.namedparams()}


def _standard(iterator, optimizer, converter):
    return updaters.StandardUpdater(iterator, optimizer, converter=converter)


def _cgdp(workers, devices=('@numpy', '@numpy')):
    def make(iterator, optimizer, converter):
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, list(devices), converter=converter,
            reduction='mean', chunk_size=1, workers=workers)
    return make


@pytest.mark.parametrize('workers', WORKERS)
def test_seq2seq_shaped_model_with_a_dict_of_ragged_lists(workers):
    data = nlp_models.sentence_pairs()
    model = nlp_models.TinySeq2seq()  # NStepLSTM draws its initial weights
    initial = {name: p.array.copy() for name, p in model.namedparams()}
    expected = _train(copy.deepcopy(model), nlp_models.convert_pairs,
                      data, _standard)
    actual = _train(model, nlp_models.convert_pairs, data, _cgdp(workers))
    assert all(not numpy.allclose(initial[k], expected[k]) for k in initial)
    assert_same_params(expected, actual, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize('workers', WORKERS)
def test_seq2seq_shaped_model_on_gpus(workers):
    gpus = equivalence.two_gpu_replicas()
    data = nlp_models.sentence_pairs()
    model = nlp_models.TinySeq2seq()
    expected = _train(copy.deepcopy(model), nlp_models.convert_pairs,
                      data, _standard)
    # cuDNN has no backward for an RNN run with train=False: its replicas
    # use Chainer's own NStepLSTM kernels (the setting reaches them too).
    actual = _train(model, nlp_models.convert_pairs, data,
                    _cgdp(workers, gpus), use_cudnn='never')
    actual = {name: chainer.backends.cuda.to_cpu(a)
              for name, a in actual.items()}
    assert_same_params(expected, actual, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('workers', WORKERS)
def test_text_classifier_shaped_model_with_a_tuple_of_a_ragged_list(
        workers):
    data = nlp_models.labelled_texts()
    model = nlp_models.TinyTextClassifier()
    expected = _train(copy.deepcopy(model), nlp_models.convert_texts, data,
                      _standard)
    actual = _train(model, nlp_models.convert_texts, data, _cgdp(workers))
    assert_same_params(expected, actual, rtol=1e-5)


@pytest.mark.parametrize('workers', WORKERS)
def test_a_converter_error_stops_the_workers_and_closes_the_updater(
        workers):
    failing = []

    @chainer.dataset.converter()
    def convert(batch, device):
        if failing:  # from the second update on
            raise ValueError('injected converter failure')
        return nlp_models.convert_pairs(batch, device)

    optimizer = chainer.optimizers.SGD()
    optimizer.setup(nlp_models.TinySeq2seq())
    iterator = chainer.iterators.SerialIterator(
        nlp_models.sentence_pairs(), 4)
    before = threading.active_count()
    # The reduction given: a mean found would convert the second batch
    # whole at its iteration, to compare its loss with its shares'.
    updater = cgdp_chainer.CGDPUpdater(
        iterator, optimizer, ['@numpy'] * 2, converter=convert,
        workers=workers, reduction='mean')
    try:
        updater.update()
        failing.append(True)
        # The second batch was read and converted while the first
        # iteration computed (cgdp_chainer.runtime.input.input_path), or, where
        # a reader process reads ahead (NumPy 2, see USAGE), is converted at
        # its iteration; the third ends the epoch, so it is converted at its
        # iteration.
        completed = 1
        with pytest.raises(ValueError, match='injected converter failure'):
            updater.update()
            completed += 1
            updater.update()
        # Stopped already, without finalize().
        assert multiprocessing.active_children() == []
        assert threading.active_count() == before
        with pytest.raises(RuntimeError, match='stopped after an error '
                           r'\(ValueError: injected converter failure\)'):
            updater.update()
    finally:
        updater.finalize()
    assert updater.iteration == completed  # the failed update counts not


@pytest.mark.slow
@pytest.mark.parametrize('workers', WORKERS)
def test_ctrl_c_while_waiting_stops_the_workers_without_finalize(workers):
    before = threading.active_count()
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(chainer.links.Classifier(
        staged_models.SlowLaterMLP(seconds=3.0)))
    iterator = chainer.iterators.SerialIterator(staged_models.dataset(), 4)
    updater = cgdp_chainer.CGDPUpdater(iterator, optimizer, ['@numpy'] * 2,
                                       workers=workers)
    try:
        updater.update()  # quick; the next one lasts seconds
        timer = _interrupt_soon(0.5)
        try:
            with pytest.raises(KeyboardInterrupt):
                updater.update()
        finally:
            timer.cancel()
        assert multiprocessing.active_children() == []
        assert threading.active_count() == before
        with pytest.raises(RuntimeError, match=r'\(KeyboardInterrupt'):
            updater.update()
    finally:
        updater.finalize()


# A script that trains one iteration, writes its workers' pids, makes the
# second update() fail (``{fault}``), catches the error and ends without
# finalize(). It must end by itself, with its workers gone and no shared
# memory left for the resource tracker to report.
_FAILING_SCRIPT = '''
    import multiprocessing, sys, threading
    sys.path[:0] = [{root!r}, {tests!r}]
    import chainer, cgdp_chainer
    import chainer.links as L
    import staged_models

    FAULT = [None]


    class MayFail(L.Classifier):
        def forward(self, x, t, fail):
            if fail:
                raise RuntimeError('injected replica failure')
            return super(MayFail, self).forward(x, t)


    @chainer.dataset.converter()
    def convert(batch, device):
        x, t = chainer.dataset.concat_examples(batch, device)
        if FAULT[0] == 'converter':
            raise ValueError('injected converter failure')
        if FAULT[0] == 'unpicklable':
            return x, t, threading.Lock()
        return x, t, FAULT[0] == 'worker'


    if __name__ == '__main__':
        model = MayFail(staged_models.StagedMLP())
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        iterator = chainer.iterators.SerialIterator(
            staged_models.dataset(), 4)
        # reduction given: the fault must hit the iteration itself, not
        # the forwards that confirm a found 'mean' on the next batches.
        updater = cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy', '@numpy'], converter=convert,
            reduction='mean')
        updater.update()
        with open('pids', 'w') as f:
            f.write(' '.join(str(p.pid) for p in
                             multiprocessing.active_children()))
        FAULT[0] = {fault!r}
        try:
            # The second batch was converted while the first iteration
            # computed (cgdp_chainer.runtime.input.input_path): the fault
            # shows in the third.
            updater.update()
            updater.update()
        except Exception as error:
            print('caught', type(error).__name__, flush=True)
        print('children left', len(multiprocessing.active_children()),
              flush=True)
        try:
            updater.update()
        except RuntimeError as error:
            print('then', error, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize('fault,error,reason', [
    ('converter', 'ValueError', 'injected converter failure'),
    ('unpicklable', 'ValueError', "cannot pickle '_thread.lock'"),
    ('worker', 'ReplicaError', 'RuntimeError: injected replica failure')])
def test_a_script_that_catches_an_update_error_exits_cleanly(
        tmp_path, fault, error, reason):
    # subprocess.run's timeout is a hang guard, not a timing assertion.
    result = _run_script(tmp_path, _FAILING_SCRIPT.replace(
        '{fault!r}', repr(fault)), timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'caught {}'.format(error) in result.stdout
    assert 'children left 0' in result.stdout
    then = [line for line in result.stdout.splitlines()
            if line.startswith('then ')]
    assert len(then) == 1 and 'stopped after an error' in then[0]
    assert reason in then[0]
    assert 'leaked' not in result.stderr, result.stderr
    workers = [int(p) for p in (tmp_path / 'pids').read_text().split()]
    assert len(workers) == 2
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.slow
def test_a_script_that_never_finalizes_exits_cleanly(tmp_path):
    result = _run_script(tmp_path, _FAILING_SCRIPT.replace(
        '{fault!r}', repr('none')), timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'caught' not in result.stdout
    assert 'children left 2' in result.stdout
    assert 'leaked' not in result.stderr, result.stderr
    workers = [int(p) for p in (tmp_path / 'pids').read_text().split()]
    assert not any(_alive(pid) for pid in workers)
