import pytest

from cgdp_chainer import devices


def pytest_collection_modifyitems(config, items):
    if devices.gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason='needs CuPy and a CUDA GPU; none here')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)
