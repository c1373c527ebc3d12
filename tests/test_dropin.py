"""CGDPUpdater as a drop-in for Chainer's multi-device updaters: every
device form, the iterator-list form, the defaults that keep a switched
script's result, and the refusals of wrong forms."""
import copy
import multiprocessing
import re

import chainer
from chainer import backend
from chainer.backends import _chainerx
from chainer.backends import intel64
import chainer.links as L
from chainer.training import updaters
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import devices as devices_module
from experiments import train as train_script

from equivalence import Concatenated, assert_same_params
from equivalence import parallel
import staged_models

ITERATIONS = 3
# Worker processes take seconds to start on the CI machine.
WORKERS = ['thread', pytest.param('process', marks=pytest.mark.slow)]


# -- device forms ---------------------------------------------------------

@pytest.mark.parametrize('devices, expected', [
    ('@numpy,@numpy', ['@numpy', '@numpy']),
    ('-1,-1', ['@numpy', '@numpy']),
    (' -1 , @numpy ', ['@numpy', '@numpy']),
    ([-1, -2], ['@numpy', '@numpy']),
    ((numpy.int64(-1), '-1'), ['@numpy', '@numpy']),
    (['@numpy', chainer.get_device('@numpy')], ['@numpy', '@numpy']),
    ({'main': -1, 'second': '@numpy', 'third': '-1'}, ['@numpy'] * 3),
    (('@numpy',), ['@numpy']),
])
def test_numpy_device_forms(devices, expected):
    parsed = devices_module.parse_devices(devices)
    assert [devices_module.spec_of(d) for d in parsed] == expected
    assert all(isinstance(d, backend.CpuDevice) for d in parsed)


def test_dict_puts_main_first_then_the_others_in_their_order():
    # Told apart by their GPU ids, without parsing a GPU that is not here.
    order = devices_module.device_items(
        {'b': '@cupy:2', 'main': '@cupy:0', 'a': '@cupy:1'})
    assert order == ['@cupy:0', '@cupy:2', '@cupy:1']


@pytest.mark.parametrize('spec', [0, '0', '1', '@cupy:0', numpy.int32(3)])
def test_integers_from_zero_are_gpus(spec):
    gpu_id = int(spec.split(':')[-1]) if isinstance(spec, str) else int(spec)
    if gpu_id < devices_module.gpu_count():
        device, = devices_module.parse_devices([spec])
        assert devices_module.spec_of(device) == '@cupy:{}'.format(gpu_id)
    else:
        with pytest.raises(ValueError, match="device '@cupy:{}' (needs CuPy|"
                           'asks for GPU)'.format(gpu_id)):
            devices_module.parse_devices([spec])


def _device_object(cls):
    # An instance of Chainer's class without its constructor, which needs
    # iDeep or ChainerX installed: the refusal looks only at the kind.
    return cls.__new__(cls)


@pytest.mark.parametrize('spec', [
    'native:0', 'native', 'cuda:0', 'cuda', '@intel64',
    _device_object(intel64.Intel64Device),
    _device_object(_chainerx.ChainerxDevice),
])
def test_chainerx_and_ideep_devices_are_refused_naming_what_works(spec):
    with pytest.raises(ValueError) as info:
        devices_module.parse_devices(['@numpy', spec])
    message = str(info.value)
    assert 'ChainerX or iDeep' in message
    assert "'@numpy'" in message and "'@cupy:N'" in message


@pytest.mark.parametrize('devices, message', [
    (None, 'devices must be a list or tuple'),
    (3, 'devices must be a list or tuple'),
    (chainer.get_device('@numpy'), 'devices must be a list or tuple'),
    ({}, "dict without a 'main' key"),
    ({'first': -1, 'second': -1}, "dict without a 'main' key"),
    ([], 'no devices given'),
    ('', 'no devices given'),
    ([True], 'of type bool'),
    ([1.5], 'of type float'),
    (['gpu0'], "unknown device 'gpu0'"),
    (['@cupy'], "unknown device '@cupy'"),
])
def test_wrong_device_forms_are_refused(devices, message):
    with pytest.raises(ValueError, match=message):
        devices_module.parse_devices(devices)


@pytest.mark.parametrize('argv', [['--devices', '-1,-1'],
                                  ['--devices=-1,-1'],
                                  ['--devices', '@numpy, -1']])
def test_train_cli_takes_chainer_integer_devices(argv):
    args = train_script.build_parser().parse_args(['--net', 'alexnet'] + argv)
    assert args.devices == ['@numpy', '@numpy']


@pytest.mark.parametrize('value, message', [
    ('native:0', 'ChainerX or iDeep'),
    ('-1,99', 'needs CuPy|asks for GPU 99'),
])
def test_train_cli_refuses_devices_with_one_error_line(value, message,
                                                       capsys):
    with pytest.raises(SystemExit) as info:
        train_script.build_parser().parse_args(
            ['--net', 'alexnet', '--devices', value])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error:')
    assert re.search(message, err[0])


# -- updater construction -------------------------------------------------

def _iterator(batch=4, data=None, seed=None):
    order = None if seed is None else \
        chainer.iterators.ShuffleOrderSampler(numpy.random.RandomState(seed))
    return chainer.iterators.SerialIterator(
        data if data is not None else staged_models.dataset(), batch,
        shuffle=False if seed is None else None, order_sampler=order)


def _updater(iterator=None, devices=('@numpy', '@numpy'), **kwargs):
    model = L.Classifier(staged_models.StagedMLP())
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    kwargs.setdefault('workers', 'thread')
    return cgdp_chainer.CGDPUpdater(
        iterator if iterator is not None else _iterator(), optimizer,
        list(devices) if isinstance(devices, tuple) else devices, **kwargs)


@pytest.mark.parametrize('make, before, after', [
    (lambda: _updater(devices={'main': -1, 'second': -1}), 'sum', 'sum'),
    # Found from the (mean) loss at the first iteration.
    (lambda: _updater([_iterator(), _iterator()]), None, 'mean'),
    (lambda: _updater((_iterator(), _iterator()),
                      devices={'main': -1, 'second': -1}), None, 'mean'),
    (lambda: _updater(devices=[-1, -1]), None, 'mean'),
    (lambda: _updater(devices='-1,-1'), None, 'mean'),
    (lambda: _updater(devices=[-1]), None, 'mean'),
    (lambda: _updater(devices={'main': -1, 'x': -1}, reduction='mean'),
     'mean', 'mean'),
    (lambda: _updater([_iterator(), _iterator()], reduction='sum'), 'sum',
     'sum'),
])
def test_default_reduction_follows_the_call_form(make, before, after):
    updater = make()
    try:
        assert updater.reduction == before
        updater.update()
        assert updater.reduction == after
    finally:
        updater.finalize()


def test_iterator_list_is_named_and_main_is_the_first():
    iterators = [_iterator(), _iterator(), _iterator()]
    updater = _updater(iterators, devices=[-1] * 3)
    try:
        assert updater.get_iterator('main') is iterators[0]
        assert updater.get_iterator('replica2') is iterators[2]
    finally:
        updater.finalize()


@pytest.mark.parametrize('kwargs, message', [
    (dict(devices=-1), 'devices must be a list or tuple'),
    (dict(devices={}), "dict without a 'main' key"),
    (dict(devices={'a': -1}), "dict without a 'main' key"),
    (dict(devices=['native:0', -1]), 'ChainerX or iDeep'),
    (dict(iterator=[_iterator()] * 3), '3 iterators for 2 devices'),
    (dict(iterator=[]), '0 iterators for 2 devices'),
    (dict(iterator=[_iterator(), staged_models.dataset()]),
     'iterator 1 of the list is a TupleDataset'),
    (dict(iterator=staged_models.dataset()), 'iterator must be a chainer'),
    (dict(iterator={'train': _iterator()}), "dict without a 'main' key"),
    (dict(reduction='max'), "unknown reduction 'max'"),
])
def test_wrong_forms_are_refused_before_any_worker_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _updater(workers='process', **kwargs)
    assert multiprocessing.active_children() == []


# -- equivalence ----------------------------------------------------------

def _device_datasets(n_devices):
    # Each device's own data, as split_dataset_n_random gives them.
    return [staged_models.dataset(n=12, seed=10 + i) for i in range(n_devices)]


def _device_iterators(batches, seed=None):
    return [_iterator(batch, data,
                      seed=None if seed is None else seed + index)
            for index, (batch, data) in enumerate(
                zip(batches, _device_datasets(len(batches))))]


def _optimizer(kind, lr_scale=1.0, eps_scale=1.0):
    if kind == 'momentum':
        return chainer.optimizers.MomentumSGD(lr=0.1 * lr_scale, momentum=0.9)
    return chainer.optimizers.Adam(alpha=0.01, eps=1e-8 * eps_scale)


def _params(model):
    return {name: p.array.copy() for name, p in model.namedparams()}


def _train(model, optimizer, make_updater, iterations=ITERATIONS):
    optimizer.setup(model)
    updater = make_updater(optimizer)
    try:
        for _ in range(iterations):
            updater.update()
    finally:
        updater.finalize()
    return _params(model)


def _standard_on_concatenated(model, optimizer, batches):
    return _train(model, optimizer, lambda opt: updaters.StandardUpdater(
        Concatenated(_device_iterators(batches)), opt))


def _cgdp_list(model, optimizer, batches, **kwargs):
    return _train(model, optimizer, lambda opt: cgdp_chainer.CGDPUpdater(
        _device_iterators(batches), opt, [-1] * len(batches), chunk_size=2,
        **kwargs))


def _model():
    return L.Classifier(staged_models.StagedMLP())


@pytest.mark.parametrize('workers', WORKERS)
def test_parallel_updater_form_equals_parallel_updater(workers):
    base = _model()
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    expected = _train(copy.deepcopy(base), copy.deepcopy(optimizer),
                      lambda opt: parallel(2)(_iterator(6), opt))
    actual = _train(copy.deepcopy(base), optimizer,
                    lambda opt: cgdp_chainer.CGDPUpdater(
                        _iterator(6), opt,
                        {'main': chainer.get_device(-1), 'second': '-1'},
                        chunk_size=2, workers=workers))
    assert_same_params(expected, actual)
    _assert_trained(base, expected)


def _assert_trained(base, expected):
    # Guards against a vacuous comparison.
    initial = _params(base)
    assert any(not numpy.allclose(initial[n], expected[n]) for n in initial)


@pytest.mark.parametrize('batches, kind, workers', [
    ((3, 3), 'momentum', 'thread'),
    ((3, 3), 'adam', 'thread'),
    ((2, 4, 3), 'momentum', 'thread'),  # batches of different sizes
    ((2, 4, 3), 'adam', 'thread'),
    pytest.param((2, 4, 3), 'momentum', 'process', marks=pytest.mark.slow),
])
def test_iterator_list_equals_one_device_on_concatenated_batches(
        batches, kind, workers):
    base = _model()
    expected = _standard_on_concatenated(copy.deepcopy(base),
                                         _optimizer(kind), batches)
    actual = _cgdp_list(copy.deepcopy(base), _optimizer(kind), batches,
                        workers=workers)
    assert_same_params(expected, actual)
    _assert_trained(base, expected)


def test_iterator_list_sum_equals_per_device_sums():
    # 'sum' adds the devices' mean gradients: with equal batches that is N
    # times the concatenated batch's mean, so MomentumSGD with lr x N.
    base = _model()
    expected = _standard_on_concatenated(
        copy.deepcopy(base), _optimizer('momentum', lr_scale=2), (3, 3))
    actual = _cgdp_list(copy.deepcopy(base), _optimizer('momentum'), (3, 3),
                        reduction='sum', workers='thread')
    assert_same_params(expected, actual)


def _multiprocess_parallel_arithmetic(model, optimizer, batches):
    """MultiprocessParallelUpdater's update, on one device: its change of
    the hyperparameters, then per iteration the sum of each device's
    gradients of its own batch and one update."""
    n = len(batches)
    if type(optimizer).__name__ == 'Adam':
        optimizer.eps *= n
    else:
        optimizer.lr /= n
    optimizer.setup(model)
    iterators = _device_iterators(batches)
    for _ in range(ITERATIONS):
        total = None
        for iterator in iterators:
            model.cleargrads()
            x, t = chainer.dataset.concat_examples(iterator.next())
            model(x, t).backward()
            grads = [p.grad.copy() for p in model.params()]
            total = grads if total is None else [
                a + b for a, b in zip(total, grads)]
        for param, grad in zip(model.params(), total):
            param.grad = grad
        optimizer.update()
    return _params(model)


@pytest.mark.parametrize('kind', ['momentum', 'adam'])
def test_iterator_list_equals_multiprocess_parallel_arithmetic(kind):
    base = _model()
    expected = _multiprocess_parallel_arithmetic(
        copy.deepcopy(base), _optimizer(kind), (3, 3))
    # The user's own hyperparameters: the default 'mean' needs no change.
    actual = _cgdp_list(copy.deepcopy(base), _optimizer(kind), (3, 3),
                        workers='thread')
    assert_same_params(expected, actual)
    _assert_trained(base, expected)


@pytest.mark.parametrize('workers', WORKERS)
def test_iterator_list_snapshot_resumes_every_iterator_exactly(
        tmp_path, workers):
    # Shuffled iterators of 12 examples, 4 a batch: the third iteration
    # ends an epoch and reshuffles, after the resume.
    def run(iterations, load=None, save=None):
        model = _model()
        optimizer = _optimizer('adam')
        optimizer.setup(model)
        iterators = _device_iterators((4, 4), seed=7)
        updater = cgdp_chainer.CGDPUpdater(iterators, optimizer, [-1, -1],
                                           chunk_size=2, workers=workers)
        try:
            if load:
                chainer.serializers.load_npz(load, updater)
            for _ in range(iterations):
                updater.update()
            if save:
                chainer.serializers.save_npz(save, updater)
            positions = [it.current_position for it in iterators]
            return _params(model), positions, updater.epoch_detail
        finally:
            updater.finalize()

    snapshot = str(tmp_path / 'snapshot.npz')
    run(2, save=snapshot)
    resumed = run(2, load=snapshot)
    straight = run(4)
    for name in straight[0]:
        numpy.testing.assert_array_equal(resumed[0][name], straight[0][name],
                                         err_msg=name)
    assert resumed[1:] == straight[1:]
    assert straight[2] == pytest.approx(4 * 4 / 12)
    with numpy.load(snapshot) as saved:
        assert 'iterator:replica1/current_position' in saved.files
