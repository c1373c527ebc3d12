"""Command-line helpers shared by the experiment scripts.

Every script reports bad input the same way: one line ``error: ...`` on
stderr and exit status 2, no usage dump and no traceback. The argument
types here check positive integers, device lists (through
:mod:`cgdp_chainer.devices`, the one place that knows device specifiers),
network names (or ``module:callable``, see :func:`check_net`) and chunk
sizes, and turn a failed check into such a line.
"""
import argparse
import re
import sys
import warnings

# setuptools warns when Chainer (through cgdp_chainer._compat) imports
# pkg_resources; on the command line that warning would bury the one-line
# errors and clutter every run's output.
warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                        category=UserWarning)

from cgdp_chainer import allocator  # NOQA: after the filter
from cgdp_chainer import devices as devices_module  # NOQA: E402
from cgdp_chainer import files  # NOQA: E402

# Every command imports this module first: the processes it compares with
# CGDP's worker processes allocate as those do (cgdp_chainer.allocator), so
# that a comparison measures the training, not the allocator's history.
allocator.keep_freed_memory()

EXIT_USAGE = 2


def fail(message):
    """Prints ``error: message`` as one line on stderr and exits with 2.

    Args:
        message (str): What is wrong and, where possible, what to do.

    Raises:
        SystemExit: Always, with status 2.
    """
    one_line = ' '.join(str(message).split())
    sys.stderr.write('error: {}\n'.format(one_line))
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


class ArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line.

    argparse prints the usage and ``prog: error: ...``; the scripts of this
    project print only ``error: ...`` (see :func:`fail`), so that callers and
    tests can rely on a single, greppable line.
    """

    def error(self, message):
        fail(message)

    def parse_known_args(self, args=None, namespace=None):
        if args is None:
            args = sys.argv[1:]
        return super(ArgumentParser, self).parse_known_args(
            _attach_negative_lists(list(args)), namespace)


# A comma-separated list of integers that starts with a negative one, such
# as the device list '-1,-1'. argparse takes '-1' for a number but '-1,-1'
# for an option, so that '--devices -1,-1' would lack its value.
_NEGATIVE_LIST = re.compile(r'^-\d+(\s*,\s*[+-]?\d+)+$')


def _attach_negative_lists(args):
    """Joins ``--option -1,-1`` into ``--option=-1,-1``."""
    joined = []
    for arg in args:
        if joined and _NEGATIVE_LIST.match(arg) and \
                joined[-1].startswith('-') and '=' not in joined[-1] and \
                not _NEGATIVE_LIST.match(joined[-1]):
            joined[-1] = '{}={}'.format(joined[-1], arg)
        else:
            joined.append(arg)
    return joined


def positive_int(text):
    """argparse type: an integer greater than zero.

    Args:
        text (str): The argument as typed.

    Returns:
        int: The value.

    Raises:
        argparse.ArgumentTypeError: Not an integer, or not positive.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            '{!r} is not an integer'.format(text))
    if value <= 0:
        raise argparse.ArgumentTypeError(
            'must be a positive integer, got {}'.format(value))
    return value


def non_negative_int(text):
    """argparse type: an integer greater than or equal to zero.

    Args:
        text (str): The argument as typed.

    Returns:
        int: The value.

    Raises:
        argparse.ArgumentTypeError: Not an integer, or negative.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            '{!r} is not an integer'.format(text))
    if value < 0:
        raise argparse.ArgumentTypeError(
            'must be a non-negative integer, got {}'.format(value))
    return value


def positive_float(text):
    """argparse type: a finite number greater than zero.

    Args:
        text (str): The argument as typed.

    Returns:
        float: The value.

    Raises:
        argparse.ArgumentTypeError: Not a number, or not positive.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('{!r} is not a number'.format(text))
    if not 0 < value < float('inf'):
        raise argparse.ArgumentTypeError(
            'must be a positive number, got {}'.format(text))
    return value


def device_list(text):
    """argparse type: a comma-separated list of device specifiers.

    Each item is checked by :func:`cgdp_chainer.devices.parse_devices`, so an
    unknown specifier, or a CuPy device where CuPy or the GPU is missing, is
    rejected here with that module's message.

    Args:
        text (str): E.g. ``'@numpy,@numpy'``, ``'-1,-1'``, ``'0,1'`` or
            ``'@cupy:0,@numpy'`` (the forms Chainer's examples take).

    Returns:
        list of str: The canonical specifiers (``'@numpy'``,
        ``'@cupy:N'``), one per replica.

    Raises:
        argparse.ArgumentTypeError: An item is invalid.
    """
    try:
        parsed = devices_module.parse_devices(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))
    return [devices_module.spec_of(device) for device in parsed]


def single_device(text):
    """argparse type: exactly one device specifier.

    Args:
        text (str): E.g. ``'@numpy'`` or ``'@cupy:0'``.

    Returns:
        list of str: A list holding the one specifier (the same shape as
        :func:`device_list` gives, so both can share a destination).

    Raises:
        argparse.ArgumentTypeError: Not exactly one valid specifier.
    """
    specs = device_list(text)
    if len(specs) != 1:
        raise argparse.ArgumentTypeError(
            'takes one device, got {}'.format(
                len(specs)))
    return specs


def net_name(text):
    """argparse type: the name of one of the networks in :mod:`models`.

    Args:
        text (str): The network's name.

    Returns:
        str: The name.

    Raises:
        argparse.ArgumentTypeError: Not a known network.
    """
    import models
    if text not in models.NETWORKS:
        raise argparse.ArgumentTypeError(
            'unknown network {!r}; choose from {}'.format(
                text, ', '.join(sorted(models.NETWORKS))))
    return text


def net_spec(text):
    """argparse type: a network name, or ``module:callable`` (any model).

    Only the form is checked here; :func:`check_net` imports, builds and
    probes a callable once the image size and classes are known.

    Args:
        text (str): One of ``models.NETWORKS``, or ``module:callable``
            (see :mod:`models.custom`).

    Returns:
        str: The value.

    Raises:
        argparse.ArgumentTypeError: Neither.
    """
    import models
    try:
        return models.check_net_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))


def check_net(net, n_classes, image_size):
    """Fails (exit 2) unless ``--net`` can train on such images.

    The four networks: their minimum image size. ``module:callable``: it
    imports, the call returns a ``chainer.Link``, and one image of
    ``image_size`` pixels gives ``n_classes`` scores (a single probe on the
    CPU, see :func:`models.check_network`).

    Args:
        net (str): The ``--net`` value.
        n_classes (int): ``--classes``.
        image_size (int): The run's image side.
    """
    import models
    try:
        models.check_network(net, n_classes, image_size)
    except ValueError as error:
        hint = ''
        if net in models.NETWORKS:  # the image size is all it can be
            hint = '; pass --image-size {} or more'.format(
                models.min_image_size(net))
        fail('{}{}'.format(error, hint))


def input_shape(text):
    """argparse type: a per-example input shape, ``C,H,W`` or ``F``.

    Args:
        text (str): E.g. ``'3,32,32'`` or ``'20'``.

    Returns:
        tuple of int: The shape.

    Raises:
        argparse.ArgumentTypeError: Not one to three positive integers
            (the message says which forms are accepted).
    """
    from cgdp_chainer.costmodel import samples
    try:
        return samples.parse_input_shape(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))


def probe_model(net, shape):
    """Fails (exit 2) unless ``--net`` (``module:callable``) builds and
    computes a loss on inputs of ``shape``; otherwise the model, probed.

    Args:
        net (str): ``module:callable``.
        shape (tuple of int): Per-example input shape.

    Returns:
        cgdp_chainer.costmodel.samples.ProbedModel: The model, ready to be
        profiled (see :func:`cgdp_chainer.costmodel.samples.probe_model`).
    """
    import models
    from cgdp_chainer.costmodel import samples
    try:
        return samples.probe_model(models.custom.build(net, seed=0), shape,
                                   net)
    except ValueError as error:
        fail(str(error))


def check_image_input(net, shape):
    """Fails (exit 2) unless one of the four networks takes inputs of
    ``shape``: three channels, square, at least its minimum side.

    Args:
        net (str): A name in ``models.NETWORKS``.
        shape (tuple of int): ``--input-shape``.

    Returns:
        int: The image side.
    """
    if len(shape) != 3 or shape[0] != 3 or shape[1] != shape[2]:
        fail('--input-shape {}: {} takes square RGB images, 3,S,S (e.g. '
             '3,224,224)'.format(','.join(str(s) for s in shape), net))
    check_image_size(net, shape[2])
    return shape[2]


def name_list(choices, what, everything=None):
    """argparse type factory: comma-separated names taken from ``choices``.

    Args:
        choices (sequence of str): The valid names, in their order.
        what (str): What the names are, for the message (``'part'``).
        everything (str or None): A word that stands for all of them
            (``'all'``), if any.

    Returns:
        callable: ``parse(text) -> list of str``, the names in the order of
        ``choices``; raises ``argparse.ArgumentTypeError`` naming the
        unknown ones and the valid choices.
    """
    choices = list(choices)

    def parse(text):
        if everything is not None and text.strip() == everything:
            return list(choices)
        names = [name.strip() for name in text.split(',') if name.strip()]
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                'unknown {}(s) {}; use {}a comma-separated list of {}'.format(
                    what, ', '.join(unknown) or '(none)',
                    '' if everything is None else everything + ' or ',
                    ', '.join(choices)))
        return [name for name in choices if name in names]
    return parse


def chunk_size(text):
    """argparse type: a CGDP chunk size, a positive integer or a policy.

    Args:
        text (str): A positive integer, ``'auto'`` or ``'model'``.

    Returns:
        int or str: The integer, or the policy's name.

    Raises:
        argparse.ArgumentTypeError: Neither.
    """
    if text in ('auto', 'model'):
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            "must be a positive integer, 'auto' or 'model', got {!r}".format(
                text))


def check_image_size(net, image_size):
    """Fails (exit 2) if ``image_size`` is too small for network ``net``.

    A ``module:callable`` network passes: :func:`check_net` has probed it.

    Args:
        net (str): Network name, or ``module:callable``.
        image_size (int): Side of the input images.
    """
    import models
    if models.is_custom(net):
        return  # check_net's probe tried that size
    try:
        models.check_image_size(net, image_size)
    except ValueError as error:
        fail(str(error))


def check_chunk_size(chunk_size, net, n_layers):
    """Fails (exit 2) if an integer chunk size exceeds the network's layers.

    A CGDP chunk holds whole layers (links that own parameters, see
    :func:`cgdp_chainer.runtime.replica.readiness.count_layers`), so a size above
    the layer count cannot be planned; policies (``'auto'``, ``'model'``)
    fit any network.

    Args:
        chunk_size (int, str or None): The ``--chunk-size`` value (``None``
            for the default, which fits every network).
        net (str): Network name, for the message.
        n_layers (int): The network's number of layers.
    """
    if isinstance(chunk_size, int) and chunk_size > n_layers:
        fail("--chunk-size {} is more than the {} layers of {} (links with "
             "parameters, what a chunk counts); give 1 to {}, 'auto' or "
             "'model'".format(chunk_size, n_layers, net, n_layers))


def check_output_folder(option, path):
    """Fails (exit 2) unless ``path`` is, or can become, a writable folder.

    Probes without leaving anything behind
    (:func:`cgdp_chainer.files.check_writable_folder`).

    Args:
        option (str): The option or argument that named the folder, for
            the message (``'--out'``).
        path (str): The folder.
    """
    try:
        files.check_writable_folder(path)
    except ValueError as error:
        fail('{}: {}'.format(option, error))


def check_output_file(option, path):
    """Fails (exit 2) unless a file can be written at ``path``.

    Probes the file's folder (created later if missing) without leaving
    anything behind (:func:`cgdp_chainer.files.check_writable_file`).

    Args:
        option (str): The option that named the file (``'--trace'``).
        path (str): The file.
    """
    try:
        files.check_writable_file(path)
    except ValueError as error:
        fail('{}: {}'.format(option, error))
