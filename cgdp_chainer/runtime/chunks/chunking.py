"""The chunk options (``chunk_size``, ``chunk_bytes``) and the plan they give.

Shared by both front ends of the runtime, :class:`~cgdp_chainer.CGDPUpdater`
and the multi-node optimizer
(:func:`~cgdp_chainer.create_multi_node_optimizer`): they take the same
options, check them the same way and cut the same ready order into the
same chunks.
"""
import hashlib
import numbers

import numpy

from cgdp_chainer.runtime.replica import readiness

# The default chunk: consecutive layers (in backward order) holding at least
# this many bytes of parameters, as PyTorch DDP fills its buckets. Smaller
# chunks shrink the exposed last sync; each chunk costs a message per
# replica and a host task (see benchmarks/any_model.py for the trade-off).
DEFAULT_CHUNK_BYTES = 1024 * 1024

# Spec kinds that form a plan by themselves; 'policy' (a named policy such
# as 'auto' or 'model') and 'chooser' (a callable) are settled by the
# front end, which then gives a 'size'.
PLAN_KINDS = ('bytes', 'size', 'boundaries')


def parse_chunking(chunk_size, chunk_bytes, n_layers, policies):
    """Checks the chunk options before any work.

    Args:
        chunk_size: As ``CGDPUpdater``'s: layers per chunk (int), the layer
            indices where chunks start (a list), a policy's name, a
            chooser (callable) or None.
        chunk_bytes (int or None): Bytes per chunk instead.
        n_layers (int): Layers of the model (links owning parameters).
        policies (sequence of str): The policy names ``chunk_size`` may
            give.

    Returns:
        tuple: ``(kind, value)``: ``('bytes', n)``, ``('size', k)`` (``k``
        as given, which may exceed nothing: it is checked against
        ``n_layers``), ``('boundaries', starts)``, ``('policy', name)`` or
        ``('chooser', callable)``.

    Raises:
        ValueError: Naming the wrong option and the valid choices.
    """
    if chunk_bytes is not None:
        if chunk_size is not None:
            raise ValueError(
                'give chunk_size (layers per chunk) or chunk_bytes '
                '(bytes per chunk), not both; got chunk_size={!r}, '
                'chunk_bytes={!r}'.format(chunk_size, chunk_bytes))
        if isinstance(chunk_bytes, bool) or not isinstance(
                chunk_bytes, numbers.Integral) or chunk_bytes < 1:
            raise ValueError('chunk_bytes must be a positive integer '
                             '(bytes per chunk); got {!r}'.format(
                                 chunk_bytes))
        return ('bytes', int(chunk_bytes))
    if chunk_size is None:
        return ('bytes', DEFAULT_CHUNK_BYTES)
    if isinstance(chunk_size, str):
        if chunk_size not in policies:
            raise ValueError(
                'unknown chunk_size {!r}; use an int from 1 to {} (layers '
                'per chunk), a list of chunk boundaries, a chooser, None '
                'or one of {}'.format(chunk_size, n_layers,
                                      ', '.join(policies)))
        return ('policy', chunk_size)
    if callable(chunk_size):
        return ('chooser', chunk_size)
    if isinstance(chunk_size, (list, tuple)):
        return ('boundaries', _boundaries(chunk_size, n_layers))
    if isinstance(chunk_size, bool) or not isinstance(
            chunk_size, numbers.Integral):
        raise ValueError(
            'chunk_size must be an int from 1 to {} (layers per chunk), '
            'a list of chunk boundaries, {}a chooser or None; got '
            '{!r}'.format(n_layers, ''.join(
                repr(name) + ', ' for name in policies), chunk_size))
    if not 1 <= chunk_size <= n_layers:
        raise ValueError(
            'chunk_size={} is out of range: the model has {} layers '
            '(links that own parameters), so use 1 to {}'.format(
                chunk_size, n_layers, n_layers))
    return ('size', int(chunk_size))


def _boundaries(chunk_size, n_layers):
    starts = list(chunk_size)
    if starts[:1] == [0]:
        starts = starts[1:]  # chunk 0 always starts at layer 0
    if any(isinstance(b, bool) or not isinstance(b, numbers.Integral)
           for b in starts) or any(
               b <= a for a, b in zip([0] + starts, starts)) or (
                   starts and starts[-1] >= n_layers):
        raise ValueError(
            'chunk boundaries {!r} must be strictly increasing layer '
            'indices in backward order, from 0 (the output-side layer) to '
            '{} (the model has {} layers)'.format(
                list(chunk_size), n_layers - 1, n_layers))
    return [int(b) for b in starts]


def plan_from(spec, report, named_params, n_layers):
    """The plan a spec gives for one backward's ready order.

    Args:
        spec (tuple): ``(kind, value)`` with ``kind`` in
            :data:`PLAN_KINDS`.
        report (BackwardReport): The ready order and the unused names.
        named_params (iterable): ``(name, param)`` of the model (for the
            bytes of each parameter).
        n_layers (int): Layers of the model.

    Returns:
        ChunkPlan: The chunks.
    """
    kind, value = spec
    if kind == 'size':
        return readiness.ChunkPlan.from_ready_order(
            report.order, report.unused, chunk_size=min(value, n_layers))
    if kind == 'boundaries':
        return readiness.ChunkPlan.from_ready_order(
            report.order, report.unused, boundaries=value or None,
            chunk_size=None if value else n_layers)
    return readiness.ChunkPlan.from_ready_order(
        report.order, report.unused, chunk_bytes=value,
        nbytes=readiness.parameter_nbytes(named_params))


def reaches_parameters(report):
    """Whether a first backward's ready order says anything: its loss
    reached a parameter (a loss that is a constant without a graph, as
    SSD's on a share without a positive box, reaches none, and every
    parameter is unused).

    Args:
        report (BackwardReport): The backward's.
    """
    return len(report.unused) < len(report.order)


def ready_order_of_the_ranks(report, names, allreducer):
    """The ready order to form the plan from: this rank's, or, where no
    replica of this rank reached a parameter (see
    :func:`reaches_parameters`), the lowest rank's that did; every rank
    takes part.

    Args:
        report (BackwardReport): This rank's (of a replica that reached a
            parameter, if any did).
        names (list of str): The master's parameter names, in order.
        allreducer (ChunkAllreducer or None): Over the ranks.

    Returns:
        BackwardReport: The order.
    """
    reached = reaches_parameters(report)
    if allreducer is None or allreducer.allreduce_int(
            int(reached), op='min') == 1:
        return report
    source = allreducer.allreduce_int(
        allreducer.rank if reached else allreducer.size, op='min')
    if source == allreducer.size:
        return report  # no rank's loss reached a parameter
    index = {name: i for i, name in enumerate(names)}
    mine = allreducer.rank == source
    order = numpy.array([index[name] for name in report.order]
                        if mine else numpy.zeros(len(names)), numpy.int64)
    unused = numpy.zeros(len(names), numpy.int64)
    if mine:
        unused[[index[name] for name in report.unused]] = 1
    order, unused = allreducer.allreduce([order, unused], op='sum')
    return readiness.BackwardReport(
        tuple(names[i] for i in order),
        tuple(name for name, flag in zip(names, unused) if flag))


def check_same_on_every_rank(plan, allreducer):
    """Raises on every rank where the ranks formed different plans.

    Args:
        plan (ChunkPlan): This rank's plan.
        allreducer (ChunkAllreducer or None): Over the ranks (None: one
            process, nothing to compare).

    Raises:
        RuntimeError: The plans differ.
    """
    if allreducer is None:
        return
    digest = int(hashlib.sha256(
        plan.fingerprint.encode('utf-8')).hexdigest()[:12], 16)
    low = allreducer.allreduce_int(digest, op='min')
    high = allreducer.allreduce_int(digest, op='max')
    if low != high:
        raise RuntimeError(
            'the chunk plans differ between MPI ranks (this rank formed '
            '{}); every rank must see the same first-iteration graph'.format(
                plan.fingerprint))


def size_words(n_bytes):
    """``n_bytes`` in words: ``'1 MiB'``, ``'512 KiB'``, ``'12 B'``."""
    for unit, size in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if n_bytes >= size:
            return '{:g} {}'.format(n_bytes / size, unit)
    return '{} B'.format(n_bytes)


def describe(spec, n_chunks):
    """The chunking in words, e.g. ``'129 chunks of >= 1 MiB'``.

    Args:
        spec (tuple): ``(kind, value)`` with ``kind`` in :data:`PLAN_KINDS`.
        n_chunks (int or None): Chunks of the plan (None: not formed yet).
    """
    kind, value = spec
    chunks = '? chunks' if n_chunks is None else '{} chunk{}'.format(
        n_chunks, '' if n_chunks == 1 else 's')
    if kind == 'bytes':
        return '{} of >= {}'.format(chunks, size_words(value))
    if kind == 'size':
        return '{} of {} layer{}'.format(
            chunks, value, '' if value == 1 else 's')
    return '{} starting at layers {}'.format(chunks, [0] + list(value))
