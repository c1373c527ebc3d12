"""The library's messages go through the ``cgdp_chainer`` logger: nothing of
CGDP's on stdout in a Trainer with PrintReport, notices visible by
default on stderr, everything silenced by the logger's level."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Trains 2 iterations with LogReport and PrintReport, once per phase, with
# stdout and stderr captured per phase; prints them as JSON. The iterator
# has its own __next__, which CGDP does not read ahead: a notice.
TRAIN = '''
    import io, json, logging, sys
    import cgdp_chainer  # first: the py312 leg runs the checkout, no .pth
    import chainer, numpy
    from chainer import training
    from chainer.training import extensions

    class OwnNext(chainer.iterators.SerialIterator):
        def __next__(self):
            return super().__next__()
        next = __next__

    def train():
        numpy.random.seed(0)
        x = numpy.random.rand(16, 3).astype(numpy.float32)
        t = numpy.random.randint(0, 2, 16).astype(numpy.int32)
        model = chainer.links.Classifier(chainer.links.Linear(3, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        updater = cgdp_chainer.CGDPUpdater(
            OwnNext(chainer.datasets.TupleDataset(x, t), 8), optimizer,
            ['@numpy', '@numpy'], workers='thread')
        trainer = training.Trainer(updater, (2, 'iteration'), out=sys.argv[1])
        trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
        trainer.extend(extensions.PrintReport(
            ['epoch', 'iteration', 'main/loss'], out=sys.stdout))
        trainer.run()

    def phase():
        out, err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = out, err
        try:
            train()
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        return out.getvalue(), err.getvalue()

    phases = {'default': phase()}
    logging.getLogger('cgdp_chainer').setLevel(logging.ERROR)
    phases['silenced'] = phase()
    logging.getLogger('cgdp_chainer').setLevel(logging.NOTSET)

    class PhaseStderr(logging.StreamHandler):  # the phase's sys.stderr
        def emit(self, record):
            self.stream = sys.stderr
            super().emit(record)
    logging.basicConfig(level=logging.INFO, handlers=[PhaseStderr()])
    phases['info'] = phase()
    print(json.dumps(phases))
'''

# PrintReport's lines: its header, and rows of numbers (after the
# terminal's erase-below code, which PrintReport writes before each row).
HEADER = re.compile(r'^epoch\s+iteration\s+main/loss\s*$')
ROW = re.compile(r'^(\x1b\[J)?\d+\s+\d+\s+[-+.\deE]+\s*$')


@pytest.fixture(scope='module')
def phases(tmp_path_factory):
    out = tmp_path_factory.mktemp('output')
    env = dict(os.environ, PYTHONPATH=ROOT)
    completed = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(TRAIN), str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.splitlines()[-1])


@pytest.mark.parametrize('name', ['default', 'silenced', 'info'])
def test_stdout_holds_only_print_reports_table(phases, name):
    lines = phases[name][0].splitlines()
    assert HEADER.match(lines[0]), lines
    rows = lines[1:]
    assert len(rows) == 2 and all(ROW.match(row) for row in rows), lines


def test_notices_are_on_stderr_by_default_as_short_lines(phases):
    said = [line for line in phases['default'][1].splitlines()
            if line.startswith('CGDP')]
    assert said == ['CGDP input: not read ahead (OwnNext overrides '
                    'SerialIterator.__next__)']


def test_the_rest_is_at_info_in_short_lines(phases):
    said = [line for line in phases['info'][1].splitlines()
            if 'CGDP' in line]
    assert any("CGDP reduction: 'mean'" in line for line in said), said
    assert len(said) >= 3 and all(len(line) <= 120 for line in said), said


def test_the_logger_level_silences_the_library(phases):
    assert 'CGDP' not in phases['silenced'][1]


def test_the_environment_shows_the_info_lines_of_a_script():
    env = dict(os.environ, PYTHONPATH=ROOT, CGDP_CHAINER_LOG='info')
    completed = subprocess.run(
        [sys.executable, '-c', 'from cgdp_chainer import log; '
         "log.info('found', 'why'); log.LOGGER.debug('hidden')"],
        capture_output=True, text=True, timeout=300, env=env)
    assert completed.returncode == 0, completed.stderr
    assert (completed.stdout, completed.stderr) == ('', 'found\n')


def test_a_level_that_is_none_is_refused():
    from cgdp_chainer import log
    with pytest.raises(ValueError, match='CGDP_CHAINER_LOG=.LOUD. is not a '
                       'logging level: give DEBUG, INFO'):
        log.configure_from_environment({'CGDP_CHAINER_LOG': 'loud'})


def test_a_missing_numba_is_a_notice_naming_the_fix():
    # numba hidden, as where it is not installed or refuses this NumPy.
    code = textwrap.dedent('''
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == 'numba':
                    raise ImportError('hidden: ' + name)
        sys.meta_path.insert(0, Hide())
        import cgdp_chainer
        from cgdp_chainer.runtime.host import host_update
        print(host_update.resolve_backend('auto'))
    ''')
    completed = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True,
        timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == 'numpy\n'
    assert completed.stderr.splitlines() == [
        'CGDP host update: numba does not import, so the fused rules run as '
        'NumPy (slower): pip install numba']
