"""What a new user meets first: StandardUpdater's ``device=``, the GPU
error without CuPy, run folders of ``module:callable`` nets and the
training command's defaults."""
import os

import chainer
import numpy
import pytest

import cgdp_chainer
from cgdp_chainer import devices as devices_module
from experiments import results
from experiments import train


def _optimizer():
    model = chainer.links.Classifier(chainer.links.Linear(3, 2))
    return chainer.optimizers.SGD().setup(model)


def _iterator():
    x = numpy.zeros((4, 3), numpy.float32)
    t = numpy.zeros(4, numpy.int32)
    return chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 2)


def test_standard_updaters_device_keyword_names_the_devices_list():
    with pytest.raises(TypeError, match=r'devices=\[-1, -1\] runs two '
                       'replicas on -1'):
        cgdp_chainer.CGDPUpdater(_iterator(), _optimizer(), device=-1)
    with pytest.raises(TypeError, match=r"devices=\['@numpy', '@numpy'\]"):
        cgdp_chainer.CGDPUpdater(_iterator(), _optimizer(), ['@numpy'],
                                 device='@numpy')


def test_missing_devices_names_the_keyword():
    with pytest.raises(TypeError, match=r'needs devices=.*devices=\[-1, -1\]'):
        cgdp_chainer.CGDPUpdater(_iterator(), _optimizer())


@pytest.mark.skipif(devices_module.cupy_module() is not None,
                    reason='CuPy is installed here: no error to check')
def test_a_gpu_without_cupy_names_make_gpu_and_the_pip_extra():
    with pytest.raises(ValueError) as raised:
        devices_module.parse_devices(['@cupy:0'])
    message = str(raised.value)
    assert '`make gpu`' in message and '"cgdp-chainer[gpu]"' in message
    assert 'pip install -e' not in message


def test_a_callable_nets_run_folder_has_no_colon():
    assert results.run_dir('results', 'models.examples:tiny', 'r1') == \
        os.path.join('results', 'models.examples-tiny', 'r1')
    assert results.run_dir('results', 'resnet152', 'r1') == \
        os.path.join('results', 'resnet152', 'r1')


def test_the_training_command_defaults_to_cgdp_finding_the_reduction():
    args = train.build_parser().parse_args(['--net', 'alexnet'])
    assert (args.updater, args.reduction) == ('cgdp', None)
    found = train.build_updater('cgdp', _iterator(), _optimizer(),
                                ['@numpy'], reduction=train.FIND_REDUCTION)
    given = train.build_updater('cgdp', _iterator(), _optimizer(),
                                ['@numpy'])
    try:
        # None: CGDPUpdater finds it at the first iteration.
        assert (found.reduction, given.reduction) == (None, 'mean')
    finally:
        found.finalize()
        given.finalize()
