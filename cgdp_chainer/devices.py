"""Parsing and checking device specifiers: the one place that knows them.

The project trains on NumPy and CuPy devices, one replica per naming (a
device named twice runs two replicas). It takes them in every form
Chainer's multi-device updaters take:

* ``'@numpy'`` and ``'@cupy:N'``;
* integers as :func:`chainer.get_device` reads them (negative: NumPy;
  ``N >= 0``: GPU ``N``), also as strings (``'-1'``, ``'0'``), as Chainer's
  examples pass them from the command line;
* :class:`chainer.backend.Device` objects of those two kinds;
* a list or tuple of the above, a comma-separated string, or a dict with a
  ``'main'`` key (``ParallelUpdater``'s form: main first, then the others
  in the dict's order).

ChainerX and iDeep devices are refused: replicas run Chainer's NumPy or
CuPy code paths. Everything that takes devices from a user, the updaters,
``experiments`` and the benchmarks, goes through :func:`parse_devices`.
"""
import numbers
import re

import chainer
from chainer import backend
import numpy

VALID_FORMS = ("'@numpy' or a negative integer such as -1 or '-1' (a CPU "
               "replica, may repeat), '@cupy:N' or an integer N >= 0 (GPU N), "
               'or a chainer.backend.Device of those kinds')

LIST_FORMS = ("a list or tuple of device specifiers, one per replica (such "
              "as ['@numpy', '@numpy'], [-1, -1] or ['@cupy:0', '@cupy:1']), "
              "a dict with a 'main' key (ParallelUpdater's form) or a "
              "comma-separated string such as '-1,-1'")

_CUPY_PATTERN = re.compile(r'^@cupy:(\d+)$')
_INTEGER_PATTERN = re.compile(r'^[+-]?\d+$')
# Specifiers that chainer.get_device reads as ChainerX devices.
_CHAINERX_PATTERN = re.compile(r'^(native|cuda)(:\d+)?$')


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


def device_items(devices):
    """The replicas' specifiers, in order, from any accepted container.

    Args:
        devices (str, list, tuple or dict): A comma-separated string, a
            sequence of specifiers, or a dict with a ``'main'`` key (main
            first, then the others in the dict's order, as
            ``ParallelUpdater`` and ``MultiprocessParallelUpdater`` order
            them).

    Returns:
        list: The specifiers, not yet checked (see :func:`parse_device`).

    Raises:
        ValueError: ``devices`` is of another type, or a dict without
            ``'main'``.
    """
    if isinstance(devices, str):
        return [item.strip() for item in devices.split(',') if item.strip()]
    if isinstance(devices, (list, tuple)):
        return list(devices)
    if isinstance(devices, dict):
        if 'main' not in devices:
            raise ValueError(
                "devices is a dict without a 'main' key (got keys {}); name "
                "the first device 'main', as ParallelUpdater needs, or pass "
                '{}'.format(sorted(map(str, devices)), LIST_FORMS))
        return [devices['main']] + [
            device for name, device in devices.items() if name != 'main']
    raise ValueError('devices must be {}; got {!r}'.format(
        LIST_FORMS, devices))


def parse_device(spec):
    """Checks one specifier and returns the Chainer device for it.

    Args:
        spec (str, int or chainer.backend.Device): ``'@numpy'``,
            ``'@cupy:N'``, an integer (negative: NumPy, else GPU ``N``), an
            integer-like string, or a NumPy or CuPy device object.

    Returns:
        chainer.backend.Device: The device.

    Raises:
        ValueError: The specifier is unknown, a ChainerX or iDeep device,
            or names a GPU that CuPy or this machine does not have.
    """
    return _check_gpu(_canonical_spec(spec))


def spec_of(device):
    """The canonical specifier (``'@numpy'`` or ``'@cupy:N'``) of a device
    that :func:`parse_device` returned."""
    if is_gpu(device):
        return '@cupy:{}'.format(device.device.id)
    return '@numpy'


def _canonical_spec(spec):
    """``'@numpy'`` or ``'@cupy:N'`` for an accepted specifier, unchecked
    against the machine's GPUs."""
    if isinstance(spec, backend.Device):
        if isinstance(spec, backend.CpuDevice):
            return '@numpy'
        if isinstance(spec, backend.GpuDevice):
            return '@cupy:{}'.format(spec.device.id)
        raise _refused(spec)
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        return '@numpy' if spec < 0 else '@cupy:{}'.format(int(spec))
    if not isinstance(spec, str):
        raise ValueError('device {!r} is of type {}; use {}'.format(
            spec, type(spec).__name__, VALID_FORMS))
    text = spec.strip()
    if _INTEGER_PATTERN.match(text):
        return _canonical_spec(int(text))
    if text == '@numpy' or _CUPY_PATTERN.match(text):
        return text
    if text == '@intel64' or _CHAINERX_PATTERN.match(text):
        raise _refused(text)
    raise ValueError('unknown device {!r}; use {}'.format(spec, VALID_FORMS))


def _refused(spec):
    name = repr(spec) if isinstance(spec, str) else 'a {}'.format(
        type(spec).__name__)
    return ValueError(
        'device {} is a ChainerX or iDeep device, which CGDP does not '
        'support (replicas run NumPy or CuPy); use {}'.format(
            name, VALID_FORMS))


def _check_gpu(spec):
    """The device for a canonical specifier, checking that its GPU exists."""
    match = _CUPY_PATTERN.match(spec)
    if match is None:
        return chainer.get_device(spec)
    if cupy_module() is None:
        raise ValueError(
            'device {!r} needs CuPy with a CUDA GPU, and CuPy is not '
            'available here; use \'@numpy\' (or -1), or install CuPy: '
            '`make gpu` in a checkout, else pip install '
            '"cgdp-chainer[gpu]" (CUDA 12; [gpu-cuda13] for CUDA 13)'.format(
                spec))
    count = gpu_count()
    gpu_id = int(match.group(1))
    if gpu_id >= count:
        raise ValueError(
            'device {!r} asks for GPU {}, but this machine has {} GPU(s) '
            '(ids 0 to {})'.format(spec, gpu_id, count, count - 1))
    return chainer.get_device(spec)


def parse_devices(devices):
    """Checks the devices for data parallel training.

    Args:
        devices (str, list, tuple or dict): One specifier per replica, in
            any form :func:`device_items` takes; each item in any form
            :func:`parse_device` takes.

    Returns:
        list of chainer.backend.Device: One device per replica, in order.

    A device may be named more than once, as ``ParallelUpdater`` allows:
    each naming is a replica of its own (its own copy of the model, CUDA
    streams and transfer buffers on a GPU), so one GPU runs several.

    Raises:
        ValueError: The container is of a wrong type or empty, or an item
            is invalid.
    """
    items = device_items(devices)
    if not items:
        raise ValueError('no devices given; devices must be {}, each item '
                         '{}'.format(LIST_FORMS, VALID_FORMS))
    return [parse_device(item) for item in items]


def is_gpu(device):
    """True where ``device`` is a CuPy device."""
    return device.xp is not numpy


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


def cpu_replica_count(devices):
    """How many of the devices are CPU replicas (they share the cores)."""
    return sum(1 for d in devices if not is_gpu(d))
