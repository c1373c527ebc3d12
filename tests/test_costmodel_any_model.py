"""The cost model on the user's own model: any input shape, the number of
outputs read from the model, the user's loss, progress on stderr, and bad
``--input-shape`` values refused before any work."""
import csv
import importlib
import os
import subprocess
import sys
import uuid

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

from cgdp_chainer import costmodel
from cgdp_chainer.costmodel import samples
from experiments import costmodel_predict
from experiments import profile as profile_command
from experiments import progress
import models
from models import examples
from cli_checks import assert_usage_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIFAR = 'models.examples:cifar_cnn'

USER_MODULE = '''
import chainer
import chainer.functions as F
import chainer.links as L


class MLP(chainer.Chain):
    def __init__(self, n_out=10):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 16)
            self.l2 = L.Linear(16, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


class PenalizedLoss(chainer.Chain):
    """Softmax cross entropy plus an L2 penalty on the hidden layer."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.mlp = MLP(n_out=7)

    def forward(self, x, t):
        loss = F.softmax_cross_entropy(self.mlp(x), t)
        return loss + 1e-4 * F.sum(self.mlp.l1.W * self.mlp.l1.W)


def mlp():
    return MLP()


def classifier():
    return L.Classifier(MLP())


def penalized():
    return PenalizedLoss()
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of user models, importable here and in subprocesses."""
    name = 'user_models_' + uuid.uuid4().hex[:8]
    folder = tmp_path / 'nets'
    folder.mkdir()
    (folder / (name + '.py')).write_text(USER_MODULE)
    monkeypatch.setattr(sys, 'path', [str(folder)] + sys.path)
    importlib.invalidate_caches()
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
        [str(folder), REPO] + [p for p in [os.environ.get('PYTHONPATH')]
                               if p]))
    return name


# ------------------------------------------------------------ input shapes

@pytest.mark.parametrize('text, shape', [
    ('3,32,32', (3, 32, 32)), ('20', (20,)), (' 1, 28 ,28 ', (1, 28, 28)),
    ('50,8', (50, 8))])
def test_input_shapes_of_one_to_three_sides_are_taken(text, shape):
    assert samples.parse_input_shape(text) == shape


@pytest.mark.parametrize('text', ['3,x', '0', '-3,4', '3,0,32', '', '3,,3',
                                  '1,2,3,4', '2.5'])
def test_other_input_shapes_are_refused_naming_the_forms(text):
    with pytest.raises(ValueError, match='C,H,W for images') as info:
        samples.parse_input_shape(text)
    assert repr(text) in str(info.value)


# ------------------------------------------------------------- the probe

def test_a_predictor_is_wrapped_and_its_outputs_read():
    probed = samples.probe_model(examples.cifar_cnn(), (3, 32, 32), CIFAR)
    assert probed.n_outputs == 10 and not probed.user_loss
    assert isinstance(probed.loss_chain, models.Classifier)
    x, t = probed.in_arrays(4)
    assert x.shape == (4, 3, 32, 32) and x.dtype == numpy.float32
    assert t.dtype == numpy.int32 and 0 <= t.min() and t.max() < 10


def test_a_loss_chain_is_profiled_as_it_is(user_module):
    module = importlib.import_module(user_module)
    for link, width in ((module.classifier(), 10), (module.penalized(), 7)):
        probed = samples.probe_model(link, (20,), 'user')
        assert probed.loss_chain is link and probed.user_loss
        assert probed.n_outputs == width


def test_the_users_loss_is_what_is_counted(user_module):
    # Both: linear, relu, linear, softmax cross entropy; the project's
    # classifier adds its accuracy, the user's loss its penalty's product,
    # sum, scale and add.
    module = importlib.import_module(user_module)
    penalized = module.penalized()
    own = costmodel.flops_profile(samples.probe_model(penalized, (20,), 'p'))
    plain = costmodel.flops_profile(samples.probe_model(
        penalized.mlp, (20,), 'm'))
    assert own['user_loss'] and not plain['user_loss']
    assert own['n_outputs'] == plain['n_outputs'] == 7

    def calls(profile):
        return sum(layer['forward_calls'] for layer in profile['layers'])
    assert (calls(own), calls(plain)) == (4 + 4, 4 + 1)
    assert [layer['param_bytes'] for layer in own['layers']] == \
        [layer['param_bytes'] for layer in plain['layers']]


def test_a_predictor_whose_output_is_no_scores_is_refused():
    image_out = chainer.Sequential(L.Convolution2D(3, 4, 3, pad=1))
    with pytest.raises(ValueError, match=r'shape \(2, 4, 8, 8\).*'
                       r'forward\(x, t\) computes the loss'):
        samples.probe_model(image_out, (3, 8, 8), 'seg')


def test_a_loss_chain_must_give_a_scalar_and_take_class_labels():
    class NoReduction(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.fc = L.Linear(4, 3)

        def forward(self, x, t):
            return F.softmax_cross_entropy(self.fc(x), t, reduce='no')

    with pytest.raises(ValueError, match=r'shape \(2,\), not a scalar'):
        samples.probe_model(NoReduction(), (4,), 'noreduce')
    regression = L.Classifier(L.Linear(4, 3),
                              lossfun=F.mean_squared_error)
    with pytest.raises(ValueError, match='class indices.*return the '
                       'predictor'):
        samples.probe_model(regression, (4,), 'mse')


# ----------------------------------------------- profile, prediction, log

def test_a_probed_model_is_predicted_with_a_stage_line_each(capsys):
    log = progress.StageLog()
    probed = samples.probe_model(examples.cifar_cnn(), (3, 32, 32), CIFAR)
    profile = costmodel.flops_profile(probed, progress=log)
    assert profile['net'] == CIFAR and profile['input_shape'] == [3, 32, 32]
    assert [layer['name'] for layer in profile['layers']] == [
        '/predictor/conv1', '/predictor/norm1', '/predictor/conv2',
        '/predictor/fc']
    result = costmodel.predict(profile, 'minsky', 2, 32)
    assert result['t_cgdp'] > 0 and result['t_typical'] > 0
    assert 1 <= result['best_chunk_size'] <= 4
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith('[') for line in lines)
    assert 'forward and backward 1/2' in lines[0]
    assert 'counting FLOPs and bytes of 4 layers' in lines[1]


# -------------------------------------------------------- the command line

@pytest.mark.parametrize('shape, words', [
    ('3,x', ["'3,x'", 'C,H,W']), ('0', ["'0'", 'positive']),
    ('-1,32,32', ["'-1,32,32'"]), ('3,32,32,1', ['one to three'])])
def test_bad_input_shapes_exit_2_before_any_work(tmp_path, capsys, shape,
                                                 words):
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as info:
        costmodel_predict.main(['--net', CIFAR, '--input-shape', shape,
                                '--out', str(out)])
    captured = capsys.readouterr()
    assert info.value.code == 2
    assert captured.err.startswith('error: argument --input-shape: ')
    assert len(captured.err.splitlines()) == 1
    assert all(word in captured.err for word in words), captured.err
    assert captured.out == '' and not out.exists()


@pytest.mark.parametrize('argv, words', [
    (['--net', CIFAR, '--input-shape', '20'],
     ['cifar_cnn', 'forward on inputs of shape 20', 'InvalidType']),
    (['--net', 'models.examples:no_such_model'], ["'no_such_model'"]),
    (['--nets', 'alexnet', '--input-shape', '1,224,224'],
     ['alexnet takes square RGB images, 3,S,S']),
    (['--nets', 'alexnet', '--input-shape', '3,32,32'], ['at least 64']),
])
def test_inputs_the_model_cannot_take_exit_2_before_any_work(
        tmp_path, capsys, argv, words):
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as info:
        costmodel_predict.main(argv + ['--out', str(out)])
    captured = capsys.readouterr()
    assert info.value.code == 2 and captured.out == ''
    assert captured.err.startswith('error: ')
    assert len(captured.err.splitlines()) == 1
    assert all(word in captured.err for word in words), captured.err
    assert not out.exists()


def test_make_model_passes_the_input_shape_on():
    make = ['make', '--no-print-directory', '-n', '-o', '.venv/.installed',
            'model', 'NET=' + CIFAR]
    dry = subprocess.run(make + ['INPUT_SHAPE=3,32,32'], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    command = ' '.join(dry.stdout.replace('\\', ' ').split())
    assert '--net {} --input-shape 3,32,32'.format(CIFAR) in command, \
        dry.stdout
    dry = subprocess.run(make, cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0 and '--input-shape' not in dry.stdout


@pytest.mark.slow
def test_bad_input_shape_through_the_command_line_has_no_traceback():
    completed = subprocess.run(
        [sys.executable, '-m', 'experiments.costmodel_predict', '--net',
         CIFAR, '--input-shape', '3,x'], cwd=REPO, capture_output=True,
        text=True, timeout=120)
    assert_usage_error(completed, '--input-shape', "'3,x'")


@pytest.mark.slow
def test_a_10_class_32_px_model_is_predicted(tmp_path, capsys):
    out = str(tmp_path / 'cm')
    assert costmodel_predict.main(['--net', CIFAR, '--input-shape',
                                   '3,32,32', '--out', out]) == 0
    captured = capsys.readouterr()
    assert CIFAR + ': input 3x32x32, 10 outputs, softmax cross entropy, ' \
        '4 layers' in captured.out
    table = [line.split() for line in captured.out.splitlines()
             if line.startswith(CIFAR + ' ')]
    assert len(table) == 12  # 4 presets x N = 2, 4, 8
    assert all(float(row[5]) > 0 and row[-1].startswith('chunk_size=')
               for row in table)
    stages = captured.err.splitlines()
    assert any('predicting on minsky 1/4' in line for line in stages)
    assert all(line.startswith('[') for line in stages), captured.err
    with open(os.path.join(out, 'predictions.csv')) as f:
        rows = list(csv.DictReader(f))
    assert {row['net'] for row in rows} == {CIFAR}
    assert all(float(row['t_cgdp']) > 0 for row in rows)
    with open(os.path.join(out, 'NOTES.txt')) as f:
        assert 'inputs of 3x32x32' in f.read()


@pytest.mark.slow
def test_make_model_predicts_a_user_loss_chain_on_flat_inputs(
        tmp_path, user_module):
    out = str(tmp_path / 'cm')
    completed = subprocess.run(
        ['make', '--no-print-directory', '-o', '.venv/.installed', 'model',
         'NET={}:penalized'.format(user_module), 'INPUT_SHAPE=20',
         'OUT=' + out], cwd=REPO, capture_output=True, text=True,
        timeout=600)
    assert completed.returncode == 0, completed.stderr
    assert '{}:penalized: input 20, 7 outputs, its own loss, 2 layers'.format(
        user_module) in completed.stdout
    assert 'predicting on gh200 4/4' in completed.stderr
    with open(os.path.join(out, 'predictions.csv')) as f:
        assert all(float(row['t_cgdp']) > 0 for row in csv.DictReader(f))


@pytest.mark.slow
def test_a_measured_profile_of_a_user_loss_chain(tmp_path, user_module,
                                                 capsys):
    out = str(tmp_path / 'p.json')
    profile_command.main(['--net', user_module + ':penalized',
                          '--input-shape', '20', '--batch', '4', '--reps',
                          '1', '--out', out])
    profile = costmodel.load_profile(out)
    assert profile['input_shape'] == [20] and profile['n_outputs'] == 7
    assert profile['user_loss'] and profile['image_size'] is None
    assert [layer['name'] for layer in profile['layers']] == [
        '/mlp/l1', '/mlp/l2']
    assert all(layer['forward_s'] > 0 for layer in profile['layers'])
    assert costmodel.predict(profile, 'this-cpu', 2, 4)['t_cgdp'] > 0
    captured = capsys.readouterr()
    assert 'input 20' in captured.out
    assert '] timing forward and backward 2/2' in captured.err
    assert "] timing the host's reductions and updates" in captured.err


def test_the_profile_refuses_a_bad_input_shape(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        profile_command.main(['--net', CIFAR, '--input-shape', '3,x',
                              '--out', str(tmp_path / 'p.json')])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: argument --input-shape:') and \
        len(err.splitlines()) == 1


def test_the_profile_is_named_after_the_input_shape(user_module):
    square = profile_command.parse_args(['--net', CIFAR, '--input-shape',
                                         '3,32,32'])
    assert square.out.endswith('cifar_cnn_numpy_b4_s32.json')
    flat = profile_command.parse_args(['--net', user_module + ':mlp',
                                       '--input-shape', '20'])
    assert flat.out.endswith(':mlp_numpy_b4_s20.json')
    assert flat.model.n_outputs == 10 and not flat.model.user_loss
