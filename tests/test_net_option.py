"""``--net module:callable``: any model on every experiment command.

A callable named on the command line is imported, called with no
arguments and probed once with one image; the commands train it wrapped in
``models.Classifier``. What cannot work is refused before any work: exit 2,
one ``error:`` line, no traceback, nothing written. The refusals run the
commands' ``main`` in this process (an exception other than the exit fails
the test as a traceback would); the Makefile's targets run as a user runs
them.
"""
import csv
import importlib
import json
import os
import subprocess
import sys
import uuid

import numpy
import pytest

import chainer

from cgdp_chainer.runtime.replica import readiness
import models
from models import examples
from experiments import costmodel_predict
from experiments import profile
from experiments import train
from experiments import validate_model
from experiments import weak_scaling

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# make, taking the venv as it is (-o: its installation counts as done).
MAKE = ['make', '--no-print-directory', '-o', '.venv/.installed']
TINY = 'models.examples:tiny'

USER_MODULE = '''
import chainer

from models import examples

NOT_CALLABLE = 3


def raises():
    raise RuntimeError('weights file missing')


def not_a_link():
    return 'a model'


def ten_classes():
    return examples.Tiny(n_classes=10)


class _NeedsGray(chainer.Chain):
    def forward(self, x):
        raise ValueError('expects 1 channel, got {}'.format(x.shape[1]))


def bad_forward():
    return _NeedsGray()
'''
BROKEN_MODULE = 'import a_package_that_is_not_installed\n'


class UserNets(object):
    """Two modules in a folder on ``sys.path`` (and on PYTHONPATH for
    subprocesses), named uniquely so that no test sees another's."""

    def __init__(self, folder):
        tag = uuid.uuid4().hex[:8]
        self.folder = str(folder)
        self.module = 'user_nets_' + tag
        self.broken = 'broken_nets_' + tag
        os.makedirs(self.folder)
        for name, text in ((self.module, USER_MODULE),
                           (self.broken, BROKEN_MODULE)):
            with open(os.path.join(self.folder, name + '.py'), 'w') as f:
                f.write(text)

    def env(self):
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(
            [self.folder, REPO] + [p for p in [env.get('PYTHONPATH')] if p])
        return env


@pytest.fixture
def user_nets(tmp_path, monkeypatch):
    nets = UserNets(tmp_path / 'nets')
    # Not monkeypatch.syspath_prepend: it calls into pkg_resources, which
    # on today's stacks is cgdp_chainer._compat's stand-in.
    monkeypatch.setattr(sys, 'path', [str(nets.folder)] + sys.path)
    importlib.invalidate_caches()
    # Relative default outputs (results/...) would land here.
    work = tmp_path / 'work'
    work.mkdir()
    monkeypatch.chdir(str(work))
    return nets


# Each refusal: the --net value (from the fixture's module names) and what
# its one error line must say.
REFUSALS = [
    (lambda n: n.broken + ':build',
     ['cannot import module', 'ModuleNotFoundError',
      'a_package_that_is_not_installed']),
    (lambda n: n.module + ':missing', ['has no attribute', "'missing'"]),
    (lambda n: n.module + ':NOT_CALLABLE', ['not callable', 'int']),
    (lambda n: n.module + ':raises',
     ['calling it raised RuntimeError', 'weights file missing']),
    (lambda n: n.module + ':not_a_link',
     ['returned a str', 'not a chainer.Link']),
    (lambda n: n.module + ':bad_forward',
     ['forward on', 'ValueError', 'expects 1 channel']),
    (lambda n: n.module + ':ten_classes',
     ['shape (1, 10)', 'scores of 1000 classes', '--classes 10']),
    (lambda n: 'a:b:c', ['--net', "'a:b:c'", 'module:callable']),
]
REFUSAL_IDS = ['no-import', 'no-attribute', 'not-callable', 'raises',
               'no-link', 'forward-fails', 'wrong-classes', 'malformed']


def _weak_scaling_main(argv):
    # experiment() without main()'s signal handlers, which would stay
    # installed in the test process.
    return weak_scaling.experiment(weak_scaling.build_parser().parse_args(
        argv), argv)


# Each command: its main and the arguments that would make it write
# (everything under the working folder, which must stay empty).
COMMANDS = {
    'train': (train.main, ['--out', 'out']),
    'weak_scaling': (_weak_scaling_main, ['--out', 'out', '--devices', '1']),
    'profile': (profile.main, ['--out', 'out/p.json']),
    'validate_model': (validate_model.main, ['--out', 'out/v.csv']),
    'costmodel_predict': (costmodel_predict.main, ['--out', 'out']),
}


def _tree(folder):
    found = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            found[path] = os.stat(path).st_mtime_ns
    return found


def assert_refused(command, net, capsys, fragments):
    """``command`` with ``--net net`` exits with 2 and one ``error:`` line
    holding every fragment; it prints and writes nothing else."""
    main, args = COMMANDS[command]
    before = _tree(os.getcwd())
    with pytest.raises(SystemExit) as info:
        main(['--net', net] + args)
    captured = capsys.readouterr()
    assert info.value.code == 2, captured.err
    assert 'Traceback' not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith('error: ')
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert captured.out == ''
    assert _tree(os.getcwd()) == before


# The cost model's commands read the number of classes from the model
# (the profile's --classes is the four networks').
READS_CLASSES = {'costmodel_predict', 'profile'}


@pytest.mark.parametrize('command, make_net, fragments', [
    pytest.param(command, make_net, fragments, id='{}-{}'.format(
        refusal, command))
    for command in sorted(COMMANDS)
    for (make_net, fragments), refusal in zip(REFUSALS, REFUSAL_IDS)
    if not (refusal == 'wrong-classes' and command in READS_CLASSES)])
def test_a_callable_that_cannot_train_is_refused_before_any_work(
        user_nets, capsys, command, make_net, fragments):
    assert_refused(command, make_net(user_nets), capsys, fragments)


@pytest.mark.slow
def test_profile_takes_a_model_without_stages_per_layer(user_nets, capsys):
    profile.main(['--net', TINY, '--image-size', '16', '--batch', '2',
                  '--reps', '1', '--out', 'out/p.json'])
    with open('out/p.json') as f:
        layers = json.load(f)['layers']
    tiny = chainer.links.Classifier(examples.tiny())
    assert len(layers) == readiness.count_layers(tiny)
    assert {layer['name'] for layer in layers} == {
        path for path, link in tiny.namedlinks()
        if any(True for _ in link.params(include_uninit=False))
        and not any(True for _ in link.children())}
    assert 'wrote out/p.json' in capsys.readouterr().out


@pytest.mark.slow
def test_costmodel_predict_takes_a_model_without_stages(user_nets, capsys):
    costmodel_predict.main(['--net', TINY, '--out', 'out'])
    with open(os.path.join('out', 'predictions.csv')) as f:
        rows = list(csv.DictReader(f))
    assert rows and {row['net'] for row in rows} == {TINY}
    assert all(float(row['t_cgdp']) > 0 for row in rows)
    assert 'CGDPUpdater chunking' in capsys.readouterr().out


@pytest.mark.slow
def test_validate_model_takes_a_model_without_stages(user_nets, capsys):
    validate_model.main(['--net', TINY, '--devices', '1,2', '--batch', '2',
                         '--image-size', '16', '--iterations', '2',
                         '--warmup', '1', '--reps', '1',
                         '--out', 'out/v.csv'])
    with open('out/v.csv') as f:
        rows = list(csv.DictReader(f))
    assert {row['mode'] for row in rows} >= {'typical', 'cgdp'}
    assert all(float(row['predicted_s']) > 0 for row in rows)


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_an_unknown_name_lists_the_networks_and_the_callable_form(
        user_nets, capsys, command):
    assert_refused(command, 'lenet', capsys,
                   ["'lenet'", 'alexnet', 'resnet152', 'module:callable'])


def test_the_four_keep_their_image_size_check(user_nets, capsys):
    main, args = COMMANDS['train']
    with pytest.raises(SystemExit) as info:
        main(['--net', 'alexnet', '--image-size', '32'] + args)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        'error: alexnet needs images of at least 64x64 pixels, got 32x32; '
        'pass --image-size 64 or more')


# ------------------------------------------------------------ the resolver

def test_a_callable_is_seeded_and_leaves_the_global_random_state():
    state = numpy.random.get_state()
    first = models.get_model(TINY, seed=3)
    again = models.get_model(TINY, seed=3)
    other = models.get_model(TINY, seed=4)
    assert isinstance(first, examples.Tiny)
    for (name, a), (_, b), (_, c) in zip(sorted(first.namedparams()),
                                         sorted(again.namedparams()),
                                         sorted(other.namedparams())):
        numpy.testing.assert_array_equal(a.array, b.array, err_msg=name)
    assert not numpy.array_equal(first.conv1.W.array, other.conv1.W.array)
    models.check_network(TINY, 1000, 16)  # the probe draws nothing either
    after = numpy.random.get_state()
    assert all(numpy.array_equal(a, b) for a, b in zip(state, after))


@pytest.mark.slow
def test_resnet50_example_builds_without_weights_and_gives_scores():
    link = models.check_network('models.examples:resnet50', 1000, 32)
    assert isinstance(link, examples.ResNet50Scores)
    # Chainer's ResNet-50 under it, untrained: 1000 scores from fc6.
    assert link.net.fc6.W.shape == (1000, 2048)


def test_a_callable_may_return_tuples_of_scores():
    # GoogLeNet-style (main, aux) outputs pass when each is (1, classes).
    link = examples.Tiny(n_classes=7)
    original = link.forward
    link.forward = lambda x: (original(x), original(x))
    models.custom.probe('test:pair', link, 7, 16)
    link.forward = lambda x: (original(x), original(x)[:, :3])
    with pytest.raises(ValueError, match=r'shape \(1, 3\)'):
        models.custom.probe('test:pair', link, 7, 16)


# ---------------------------------------------------------------- end to end

@pytest.mark.slow
def test_train_runs_a_callable_with_cgdp(tmp_path, capsys):
    out = str(tmp_path / 'out')
    train.main(['--net', TINY, '--updater', 'cgdp', '--devices',
                '@numpy,@numpy', '--image-size', '16', '--batchsize', '4',
                '--iterations', '2', '--out', out])
    assert 'trained {} to iteration 2'.format(TINY) in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ['log', 'snapshot_iter_2']
    initial = models.get_model(TINY, seed=0)  # --seed 0, the default
    with numpy.load(os.path.join(out, 'snapshot_iter_2')) as snapshot:
        trained = snapshot['updater/model:main/predictor/fc/W']
    assert trained.shape == initial.fc.W.shape
    assert not numpy.allclose(trained, initial.fc.W.array)


@pytest.mark.slow
def test_make_experiment_runs_a_callable(tmp_path):
    out = str(tmp_path / 'results')
    completed = subprocess.run(
        MAKE + ['experiment', 'NET=' + TINY, 'DEVICES=1,2', 'ITERATIONS=2',
                'WARMUP=1', 'BATCH=2', 'IMAGE_SIZE=16', 'OUT=' + out],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr
    from experiments import results
    net_folder = os.path.join(out, results.net_folder(TINY))
    assert ':' not in os.path.basename(net_folder)
    runs, = os.listdir(net_folder)
    folder = os.path.join(net_folder, runs)
    summary = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    assert sorted((r['mode'], r['n_devices']) for r in summary) == [
        ('cgdp', 1), ('cgdp', 2), ('typical', 1), ('typical', 2)]
    assert all(r['image_size'] == 16 and r['median_s'] > 0 for r in summary)
    env = results.read_json(os.path.join(folder, results.ENV_FILE))
    assert env['net'] == TINY and env['finished'] is True


# ----------------------------------------------------------------- Makefile

@pytest.mark.parametrize('target', ['validate-model', 'model',
                                    'experiment', 'train'])
def test_makefile_passes_a_callable_on(target):
    # The commands themselves take it end to end (tests above); here: NET
    # reaches each of them.
    dry = subprocess.run(MAKE + ['-n', target, 'NET=' + TINY], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert '--net {}'.format(TINY) in dry.stdout


def test_make_model_without_net_predicts_all_four():
    dry = subprocess.run(MAKE + ['-n', 'model'], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert 'experiments.costmodel_predict' in dry.stdout
    assert '--net' not in dry.stdout
    dry = subprocess.run(MAKE + ['-n', 'model', 'NET=alexnet'], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert '--net alexnet' in dry.stdout
