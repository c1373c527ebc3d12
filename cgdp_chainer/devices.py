"""Parsing and checking device specifiers: the one place that knows them.

The project accepts Chainer's device specifiers ``'@numpy'`` (a CPU
replica; it may repeat) and ``'@cupy:N'`` (GPU ``N``; at most once each).
Everything that takes devices from a user, the updaters, ``experiments``
and the benchmarks, goes through :func:`parse_devices`.
"""
import re

import chainer
import numpy

VALID_FORMS = "'@numpy' (a CPU replica, may repeat) or '@cupy:N' (GPU N)"

_CUPY_PATTERN = re.compile(r'^@cupy:(\d+)$')


def cupy_module():
    """Returns the ``cupy`` module, or ``None`` where CuPy cannot be used."""
    try:
        from chainer.backends import cuda
    except Exception:
        return None
    if not cuda.available:
        return None
    return cuda.cupy


def gpu_count():
    """Number of CUDA GPUs that CuPy sees (0 without CuPy or a GPU)."""
    cupy = cupy_module()
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def cudnn_enabled():
    """Whether Chainer runs its convolutions, pooling and BatchNorm on
    cuDNN here: True or False where CuPy works (False: a CuPy without
    cuDNN, such as CuPy 14, or ``CHAINER_CUDNN=0``; Chainer then uses its
    own, slower kernels), None without CuPy (no GPU run: nothing to say).
    """
    if cupy_module() is None:
        return None
    from chainer.backends import cuda
    return bool(cuda.cudnn_enabled) and chainer.config.use_cudnn != 'never'


def cudnn_words(enabled):
    """``'cuDNN on'``, ``'cuDNN off'`` or ``''`` (None: no GPU run), for
    titles, plans and summaries.

    Args:
        enabled (bool or None): As :func:`cudnn_enabled` returns it.
    """
    if enabled is None:
        return ''
    return 'cuDNN on' if enabled else 'cuDNN off'


def split_spec(spec):
    """Splits a comma-separated device list into its items.

    Args:
        spec (str or sequence): ``'@numpy,@numpy'`` or a sequence of
            specifiers.

    Returns:
        list of str: The stripped specifiers.
    """
    if isinstance(spec, str):
        return [item.strip() for item in spec.split(',') if item.strip()]
    return [str(item).strip() for item in spec]


def parse_device(spec):
    """Checks one specifier and returns the Chainer device for it.

    Args:
        spec (str): ``'@numpy'`` or ``'@cupy:N'``.

    Returns:
        chainer.backend.Device: The device.

    Raises:
        ValueError: The specifier is unknown, or names a GPU that CuPy or
            this machine does not have.
    """
    if not isinstance(spec, str):
        raise ValueError(
            'device {!r} is not a string; use {}'.format(spec, VALID_FORMS))
    spec = spec.strip()
    if spec == '@numpy':
        return chainer.get_device('@numpy')
    match = _CUPY_PATTERN.match(spec)
    if match is None:
        raise ValueError(
            'unknown device {!r}; use {}'.format(spec, VALID_FORMS))
    if cupy_module() is None:
        raise ValueError(
            'device {!r} needs CuPy with a CUDA GPU, and CuPy is not '
            'available here; use \'@numpy\' or install the gpu extra '
            '(pip install -e .[gpu])'.format(spec))
    count = gpu_count()
    gpu_id = int(match.group(1))
    if gpu_id >= count:
        raise ValueError(
            'device {!r} asks for GPU {}, but this machine has {} GPU(s) '
            '(ids 0 to {})'.format(spec, gpu_id, count, count - 1))
    return chainer.get_device(spec)


def parse_devices(spec):
    """Checks a list of specifiers for data parallel training.

    Args:
        spec (str or sequence): Comma-separated string or sequence of
            specifiers, one per replica.

    Returns:
        list of chainer.backend.Device: One device per replica, in order.

    Raises:
        ValueError: The list is empty, an item is invalid, or a GPU is
            named twice.
    """
    items = split_spec(spec)
    if not items:
        raise ValueError('no devices given; use {}'.format(VALID_FORMS))
    parsed = [parse_device(item) for item in items]
    seen = set()
    for item, device in zip(items, parsed):
        if is_gpu(device):
            if device.device.id in seen:
                raise ValueError(
                    'GPU {} is named twice in {!r}; each GPU holds one '
                    'replica'.format(device.device.id, ','.join(items)))
            seen.add(device.device.id)
    return parsed


def is_gpu(device):
    """True where ``device`` is a CuPy device."""
    return device.xp is not numpy


def spec_of(device):
    """The project's specifier of a parsed device: ``'@numpy'`` or
    ``'@cupy:N'``."""
    if is_gpu(device):
        return '@cupy:{}'.format(device.device.id)
    return '@numpy'


def numpy_devices(n):
    """``n`` CPU replica specifiers, for machines without GPUs."""
    return ['@numpy'] * n


def describe(device):
    """A human-readable name for a device (the GPU's model where known)."""
    if not is_gpu(device):
        return 'CPU replica (@numpy)'
    cupy = cupy_module()
    try:
        props = cupy.cuda.runtime.getDeviceProperties(device.device.id)
        name = props['name']
        if isinstance(name, bytes):
            name = name.decode()
        return '{} (@cupy:{})'.format(name, device.device.id)
    except Exception:
        return '@cupy:{}'.format(device.device.id)
