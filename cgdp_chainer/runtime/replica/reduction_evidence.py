"""The evidence for the loss's reduction: how it is weighed, and told.

:class:`~cgdp_chainer.runtime.replica.loss_reduction.ReductionFinder`
runs forwards of the master on the whole batch and on its shares; here
their losses are compared within float rounding (:func:`compare_loss`),
a match is shown or not by the shares' spread (:func:`shows_form`, on
finer shares where the devices' are too near: :data:`FINER_SHARES`), a
loss that draws random numbers in every mode is decided within its
sampling noise (:func:`within_noise`), a later batch's loss is held
against a found mean (:func:`matches_mean`, :func:`all_finite`), and a
reduction that cannot be told is refused in words that give the values
measured and the fix (:func:`reduction_refusal`).

What the replicas report, and the comparison both use, are
:mod:`~cgdp_chainer.runtime.replica.observations`'.
"""
import chainer
import numpy

from cgdp_chainer.runtime.replica import observations

# How far a loss that is a sum or a mean over the examples may be from the
# shares' sum or mean, in units of its dtype's machine epsilon times its
# magnitude (see rounding_tolerance): each of the N examples' terms is
# rounded once as the whole batch's forward adds it up and once as its
# share's does (recursive summation's first-order bound, N units of
# epsilon; NumPy's and CuPy's tree sums stay far below it); this margin
# more covers the sums inside each example's term (log2 of any count of
# pixels or tokens below 2**31 in a tree sum) and the model's arithmetic,
# which computes each example in batches of another size (BLAS blocks them
# differently; measured within 3.5 epsilon on conv and linear nets, float32
# and float64).
ROUNDING_MARGIN = 32
# How near the whole batch's loss must be to the shares' mean weighted by
# their examples, as a fraction of how far apart the shares' losses are,
# for the match to show that those are the loss's weights (the shares'
# losses must also be further apart than the rounding tolerance). A loss
# that is a mean over something else (the pixels it does not ignore, as
# softmax_cross_entropy with ignore_label) weighs the shares by their
# counts of those, and its value then lies elsewhere between the shares'
# losses, by about the weights' difference times their spread: within 1%
# of the spread, the weights are the examples' to about 1%. Shares with
# the same loss (an untrained model that gives every example the same
# loss) show no weights at all.
WEIGHTS_SHOWN_WITHIN = 0.01
# Where the devices' shares are too near, the batch is cut into up to this
# many shares (single examples for a smaller batch), which spread wider.
FINER_SHARES = 32


# How near the whole batch's loss must be to the shares' mean (or sum), and
# how near two draws of it to each other, for a loss that draws random
# numbers in every mode (see within_noise): a quarter of the distance
# between the shares' mean and their sum. Within it, the loss is at least
# three times nearer the kind chosen than the other; and since the noise,
# measured by the two draws, is below it too, that nearness is no accident
# of a noise as large as the distance: to pass for the wrong kind, a draw
# would have to stray three quarters of the distance from its expected
# value while the other draw lands within a quarter of it. A mean and a
# sum over N equal shares differ by a factor of N (>= 2), so for a
# positive loss the distance is at least the loss itself, where the
# noise of a loss that trains is a small part of it (the VAE example's
# two draws on a batch of 12 differ by under 2%).
NOISE_MARGIN = 0.25


def rounding_tolerance(arrays, counts):
    """How far a loss that is a sum or a mean over the examples may be
    from the shares' sum or weighted mean by float rounding alone:
    ``(N + ROUNDING_MARGIN) * eps * scale``, with N the batch's examples,
    ``eps`` the machine epsilon of the least precise of the values' dtypes
    and ``chainer.config.dtype`` (the forwards computed in it), and
    ``scale`` the larger of the whole batch's magnitude and the shares'
    (their sum's for the sum, their weighted mean's for the mean); see
    :data:`ROUNDING_MARGIN`.

    Args:
        arrays (list of numpy.ndarray): The whole batch's value, then each
            share's (floats).
        counts (list of int): Each share's examples.

    Returns:
        dict: ``'sum'`` and ``'mean'`` to the tolerance (arrays of the
        values' shape).
    """
    dtypes = [array.dtype for array in arrays if array.dtype.kind == 'f']
    dtypes.append(numpy.dtype(chainer.get_dtype()))
    eps = max(float(numpy.finfo(dtype).eps) for dtype in dtypes)
    total = sum(counts)
    units = (total + ROUNDING_MARGIN) * eps
    whole = numpy.abs(arrays[0].astype(numpy.float64))
    magnitudes = [numpy.abs(array.astype(numpy.float64))
                  for array in arrays[1:]]
    return {'sum': units * numpy.maximum(whole, sum(magnitudes)),
            'mean': units * numpy.maximum(whole, sum(
                count / total * magnitude
                for count, magnitude in zip(counts, magnitudes)))}


def compare_loss(whole, parts, counts):
    """Whether the whole batch's loss is the sum or the mean of its shares'
    losses, within float rounding (:func:`rounding_tolerance`); integers
    exactly.

    Args:
        whole: The loss on the whole batch.
        parts (list): The loss on each share.
        counts (list of int): Each share's examples.

    Returns:
        observations.Comparison: What was found, with its ``tolerance``.
    """
    return observations.compare(whole, parts, counts,
                                tolerance=rounding_tolerance)


def informative_parts(comparison):
    """The shares whose loss is not exactly zero: a share whose loss is
    zero (a constant without a graph, as SSD's loss on a share without a
    positive box) adds nothing to a sum and weighs nothing in a mean over
    what it lacks, so it tells nothing about the form.

    Args:
        comparison (Comparison): From :func:`compare_loss`.

    Returns:
        list of numpy.ndarray: Those shares' values, as float64.
    """
    parts = [observations.numeric(part).astype(numpy.float64)
             for part in comparison.parts]
    return [part for part in parts if numpy.any(part != 0)]


def matches_mean(comparison):
    """Whether a loss's comparison within rounding found the whole batch's
    loss within its tolerance of the shares' mean weighted by their
    examples, whether or not the shares show it (:func:`shows_form`), or
    (a loss decided within its sampling noise) found ``'mean'``.

    Args:
        comparison (Comparison): A loss's, from :func:`compare_loss`.
    """
    if comparison.kind in ('mean', 'both'):
        return True
    if comparison.kind != 'indistinct':
        return False
    whole = observations.numeric(comparison.whole).astype(numpy.float64)
    return bool(numpy.all(numpy.abs(whole - comparison.mean) <=
                          comparison.tolerance['mean']))


def all_finite(comparison):
    """Whether the whole batch's value and every share's are finite
    numbers (not a float overflow or NaN).

    Args:
        comparison (Comparison): From :func:`compare_loss`.
    """
    values = [observations.numeric(value) for value in
              [comparison.whole] + list(comparison.parts)]
    return all(value is not None and bool(numpy.all(numpy.isfinite(value)))
               for value in values)


def shows_form(comparison):
    """Whether a loss's match within rounding (:func:`compare_loss`)
    shows its form: two shares or more whose losses are not zero
    (:func:`informative_parts`); for the sum, the whole batch's loss
    beyond their range by more than the tolerance (no mean of them,
    however weighted, lies there); for the mean, their losses spread
    (the largest difference between two of them) wider than the
    rounding tolerance, with the whole batch's loss within
    :data:`WEIGHTS_SHOWN_WITHIN` of that spread from their weighted mean,
    so that the match shows the weights to be the shares' examples.

    Args:
        comparison (Comparison): A loss's, that found ``'sum'`` or
            ``'mean'``.
    """
    parts = informative_parts(comparison)
    if len(parts) < 2:
        return False
    parts = numpy.asarray(parts)
    whole = observations.numeric(comparison.whole).astype(numpy.float64)
    if comparison.kind == 'sum':
        # Outside the shares' range: no mean of them, however weighted.
        outside = numpy.maximum(parts.min(axis=0) - whole,
                                whole - parts.max(axis=0))
        return bool(numpy.any(outside > comparison.tolerance['sum']))
    spread = float(numpy.max(parts.max(axis=0) - parts.min(axis=0)))
    off = float(numpy.max(numpy.abs(whole - comparison.mean)))
    tolerance = float(numpy.max(comparison.tolerance['mean']))
    return spread > tolerance and off <= WEIGHTS_SHOWN_WITHIN * spread


def within_noise(comparison, again):
    """Decides a comparison that found neither kind, where the value draws
    random numbers in every mode (a VAE's sampled ``z``, ``F.gaussian``, a
    sampled negative set), without bit-equal forwards.

    ``again`` is the whole batch's value from a second forward with other
    random numbers. Equal to the first: the value is deterministic, and
    neither stays neither. Otherwise the kind is the one the whole batch's
    value is nearest, if it is within :data:`NOISE_MARGIN` of the distance
    between the shares' mean and their sum, and the two draws are as near
    each other (distances: Euclidean norms, over the elements of arrays).

    Args:
        comparison (Comparison): From :func:`compare_loss`.
        again: The whole batch's value from a second forward.

    Returns:
        Comparison: ``comparison`` itself where this does not apply (a
        kind other than ``'neither'``, a deterministic value, ``again`` not
        a finite number of the same shape); else ``comparison`` with
        ``again`` set and ``kind`` ``'sum'``, ``'mean'`` or (the noise is
        too large to tell) ``'neither'``.
    """
    if comparison.kind != 'neither':
        return comparison
    first = observations.numeric(comparison.whole)
    second = observations.numeric(again)
    if second is None or second.shape != first.shape or \
            numpy.array_equal(first, second) or \
            not numpy.all(numpy.isfinite(second)):
        return comparison
    distances = noise_distances(comparison._replace(again=again))
    margin = NOISE_MARGIN * distances['between']
    kind = 'neither'
    if distances['draws'] <= margin:
        for candidate in observations.KINDS:
            if distances[candidate] <= margin:
                kind = candidate
    return comparison._replace(kind=kind, again=again)


def noise_distances(comparison):
    """The distances :func:`within_noise` decides by.

    Args:
        comparison (Comparison): One with ``again`` set.

    Returns:
        dict: ``'sum'`` and ``'mean'``: from the whole batch's value to the
        shares' sum and weighted mean; ``'between'``: from that sum to that
        mean; ``'draws'``: between the two draws on the whole batch.
    """
    def distance(a, b):
        difference = numpy.asarray(a, numpy.float64) - \
            numpy.asarray(b, numpy.float64)
        return float(numpy.sqrt(numpy.sum(difference * difference)))
    first = observations.numeric(comparison.whole)
    return {'sum': distance(first, comparison.sum),
            'mean': distance(first, comparison.mean),
            'between': distance(comparison.sum, comparison.mean),
            'draws': distance(first, observations.numeric(comparison.again))}


def _number_words(value):
    array = observations.numeric(value)
    if array is None:
        return type(value).__name__
    if array.ndim == 0:
        return '{:.7g}'.format(float(array))
    return 'an array of shape {} (total {:.7g})'.format(
        array.shape, float(array.sum()))


def describe_loss(comparison):
    """The first iteration's comparison of the loss in words: the whole
    batch's loss, the shares', their sum and their weighted mean; and, if
    it was decided within the sampling noise, the second draw and the
    distances (see :func:`within_noise`).

    Args:
        comparison (Comparison): The loss's comparison.
    """
    words = ('a forward of the model (chainer.config.train False) on the '
             'whole batch gave the loss {}, on the {} shares {}: their sum '
             'is {}, their mean weighted by their examples {}'.format(
                 _number_words(comparison.whole), len(comparison.parts),
                 ', '.join(_number_words(part) for part in comparison.parts),
                 _number_words(comparison.sum)
                 if comparison.sum is not None else '-',
                 _number_words(comparison.mean)
                 if comparison.mean is not None else '-'))
    if comparison.again is None:
        return words
    distances = noise_distances(comparison)
    return ('{}; a second forward on the whole batch, with other random '
            'numbers, gave {}: the loss draws random numbers in test mode. '
            'It is {:.4g} from the shares\' mean and {:.4g} from their sum '
            '({:.4g} apart), its two draws {:.4g} apart; a reduction is '
            'found where the loss is within {:g} of the sum-mean distance '
            '({:.4g}) of one and the two draws are as near each '
            'other'.format(
                words, _number_words(comparison.again), distances['mean'],
                distances['sum'], distances['between'], distances['draws'],
                NOISE_MARGIN, NOISE_MARGIN * distances['between']))


_REDUCTION_CHOICES = (
    "Give CGDPUpdater(..., reduction='mean') to train as ChainerMN does: "
    "each device's loss as the model computes it on its share (a mean "
    "over what that share holds), weighted by the share's examples; a loss "
    "that is a mean over the examples (softmax_cross_entropy(..., "
    "normalize=False) with ignore_label, a loss divided by the batch's "
    "examples rather than by a count of positives) then gives "
    "StandardUpdater's exact result, and the default finds it. Give "
    "reduction='sum' if the loss adds up over the examples (the devices' "
    "gradients are then summed)")


def reduction_refusal(comparison, other_ranks=False, failure=None,
                      iteration=None):
    """Why the reduction could not be found, and what to do, in words.

    Args:
        comparison (Comparison or None): This rank's comparison of the loss
            (None: its batch of one example could not be split, or the
            forwards failed).
        other_ranks (bool): Whether this rank found one but another MPI
            rank found another, or none.
        failure (str or None): What the forwards raised, in words.
        iteration (int or None): For the check of a later batch, its
            iteration (counted from 1), whose update was not run.
    """
    if failure is not None:
        why = ('the forwards of the model that compare the whole batch\'s '
               'loss with its shares\' (chainer.config.train False, no '
               'backprop) raised {}'.format(failure))
    elif other_ranks and iteration is not None:
        why = ("another MPI rank's batch does not show it (see its error); "
               'this rank\'s {}'.format(
                   'batch holds one example, which cannot be split'
                   if comparison is None else 'comparison: ' +
                   describe_loss(comparison)))
    elif other_ranks:
        why = ("this MPI rank found {!r} ({}), but another rank found "
               "another reduction or none (see its error)".format(
                   comparison.kind, describe_loss(comparison)))
    elif iteration is not None:
        why = ('{}: the whole batch\'s loss is not their mean within {} '
               '(a loss normalized by a count of positive boxes, pixels or '
               'tokens that differs between the shares, say)'.format(
                   describe_loss(comparison), 'the sampling noise'
                   if comparison.again is not None else
                   'float rounding ({})'.format(
                       _tolerance_words(comparison))))
    else:
        why = _why_untold(comparison)
    if iteration is not None:
        return ("CGDP found reduction='mean' at the first iteration, but "
                "the batch of iteration {} does not confirm it, so its "
                "update was not run (the earlier ones matched "
                "StandardUpdater's): {}. {}.".format(
                    iteration, why, _REDUCTION_CHOICES))
    return ("CGDP cannot tell how the devices' gradients must be combined: "
            '{}. {}.'.format(why, _REDUCTION_CHOICES))


def _why_untold(comparison):
    """Why a comparison of the loss found no reduction, in words."""
    if comparison is None:
        why = ('the batch holds one example on one device, which cannot be '
               'split into shares to compare their losses with the whole '
               "batch's")
    elif comparison.kind == 'both':
        why = ('{}: both match (e.g. zero losses), so whether the loss adds '
               'up over the examples or averages them cannot be told'.format(
                   describe_loss(comparison)))
    elif comparison.kind == 'indistinct' and \
            len(informative_parts(comparison)) < 2:
        why = ('{}: the whole batch\'s loss matches, but fewer than two '
               'shares have a loss that is not zero, even on {} shares; a '
               'share whose loss is zero (or a constant without a graph, '
               'as SSD\'s multibox loss on a share without a positive box) '
               'tells nothing of the form: a loss normalized by a count of '
               'what the other shares hold would match too'.format(
                   describe_loss(comparison), len(comparison.parts)))
    elif comparison.kind == 'indistinct':
        why = ('{}: the whole batch\'s loss matches the mean within float '
               'rounding ({:.3g}), but not within {:g} of the shares\' '
               'spread, or the spread is within that rounding: too small '
               'to show that it weighs them by their examples rather than '
               'by something else (a mean over '
               'the pixels or tokens that are not ignored, as '
               'softmax_cross_entropy with ignore_label: then neither '
               "reduction gives StandardUpdater's result exactly), even "
               'on {} finer shares'.format(
                   describe_loss(comparison),
                   float(numpy.max(comparison.tolerance['mean'])),
                   WEIGHTS_SHOWN_WITHIN, len(comparison.parts)))
    elif comparison.kind == 'neither' and comparison.again is not None:
        why = ('{}. Neither matches within the sampling noise: it is too '
               'large against the distance between the shares\' sum and '
               'mean to tell them apart'.format(describe_loss(comparison)))
    elif comparison.kind == 'neither':
        why = ('{}: neither matches, and a second forward on the whole '
               'batch gave the same loss (float rounding allows {}). The '
               'loss is neither a sum nor a mean over the examples (a mean '
               'over the tokens of sequences of different lengths, over '
               'the pixels a loss does not ignore, or normalized by a '
               'count of positive boxes, say: then neither reduction gives '
               "StandardUpdater's result exactly), or its forward draws "
               'random numbers from a generator of its own, which drew the '
               'same again'.format(describe_loss(comparison),
                                   _tolerance_words(comparison)))
    elif comparison.kind == 'shapes':
        why = ('the loss is an array whose shape follows the batch ({} on '
               'the whole batch, {} on the shares)'.format(
                   _number_words(comparison.whole),
                   ', '.join(_number_words(p) for p in comparison.parts)))
    else:
        why = ('with chainer.config.train False the loss function returned '
               '{} (on the whole batch), not a Variable of numbers'.format(
                   type(comparison.whole).__name__))
    return why


def _tolerance_words(comparison):
    if comparison.tolerance is None:
        return 'exactly'
    return ('{:.3g} of the sum, {:.3g} of the mean: (examples + {}) times '
            'the machine epsilon times the loss\'s magnitude'.format(
                float(numpy.max(comparison.tolerance['sum'])),
                float(numpy.max(comparison.tolerance['mean'])),
                ROUNDING_MARGIN))
