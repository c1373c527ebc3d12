"""The loss's reduction and the reported values' kinds, found from the
batches before any update they would make wrong.

A switched script must train what it trained before: ``'mean'`` where the
loss is a mean over the examples, ``'sum'`` where it adds up over them.
:class:`ReductionFinder` tells which from deterministic forwards of the
master on the whole first batch and on its shares (:func:`probe_forwards`,
which leave no trace; their losses weighed by
:mod:`~cgdp_chainer.runtime.replica.reduction_evidence`, within float
rounding), learns on the way how each reported key combines over the
replicas (:class:`~cgdp_chainer.runtime.replica.observations.ReportKinds`),
and makes every MPI rank agree. Where it cannot be told, it refuses, naming
the values measured and the fix.

A sum shown by the shares (the whole batch's loss beyond their range) is
final: a mean of them, however weighted, lies within it. A mean is not: a
loss normalized by a count (SSD's positive boxes) equals the examples'
mean on a batch whose shares hold equal counts. ``'mean'`` found at the
first iteration is therefore compared again before the update of each
later iteration, until
:data:`CONFIRMING_BATCHES` more batches show it; one that does not is
refused before its update (each earlier one matched, so trained as
``StandardUpdater``).
"""
import collections
import random

import chainer
import numpy

from cgdp_chainer import log
from cgdp_chainer import randomness
from cgdp_chainer.runtime.host import accumulator
from cgdp_chainer.runtime.replica import observations
from cgdp_chainer.runtime.replica import reduction_evidence
from cgdp_chainer.runtime.transport import input_staging
from cgdp_chainer.runtime.transport import shared

# The reductions as integers, for agreeing across MPI ranks (0: not found).
REDUCTION_CODES = {'mean': 1, 'sum': 2}

# Later batches that must show 'mean' found at the first iteration before
# the comparisons stop (a batch whose shares cannot show it, e.g. all but
# one share's loss zero, does not count).
CONFIRMING_BATCHES = 2

# A later batch's verdict on 'mean', as integers for the MPI ranks' minimum.
REFUTED, UNTOLD, SHOWN = 0, 1, 2


class ReductionFinder(object):
    """Finds the loss's reduction and the reported keys' kinds from the
    first batch.

    Args:
        master (chainer.Link): The master model (left as it was).
        loss_func (callable or None): The loss function, or None for the
            master itself.
        n_devices (int): The replicas of this process.
        report_kinds (ReportKinds): Learns the reported keys' kinds.
        allreducer: The MPI ranks' :class:`~cgdp_chainer.mpi.ChunkAllreducer`,
            or None.
        random_base (int): The base seed of the replicas' streams (a
            second draw of a loss that samples uses a stream of its own).
        say (callable): ``say(summary, details=None, level=log.INFO)``
            logs a line of the run's log (:func:`cgdp_chainer.log.say`).
    """

    def __init__(self, master, loss_func, n_devices, report_kinds,
                 allreducer, random_base, say):
        self._master = master
        self._loss_func = loss_func
        self._n_devices = n_devices
        self._report_kinds = report_kinds
        self._allreducer = allreducer
        self._random_base = random_base
        self._say = say
        self._given = None
        self._to_confirm = 0

    @property
    def confirming(self):
        """Whether later batches must still confirm the reduction found
        (see :meth:`confirm`)."""
        return self._to_confirm > 0

    def find(self, batch, reduction=None):
        """The first iteration's comparisons, before any update: how each
        reported key combines over the replicas and, unless given, the
        reduction, from deterministic forwards of the master on the whole
        batch and on each device's share (on one device under MPI, on two
        halves of its batch, for the reduction only); see
        :mod:`~cgdp_chainer.runtime.replica.reduction_evidence`.

        Args:
            batch (Batch): The first batch.
            reduction (str or None): The reduction given, if any.

        Returns:
            str: The reduction (``reduction`` where given).

        Raises:
            ValueError: The loss's reduction cannot be told, or MPI ranks
                found different ones; or a reported value cannot be
                combined from the replicas.
        """
        n = self._n_devices
        if n < 2 and self._allreducer is None:
            return reduction or 'mean'  # one device: 'sum' weighs it alike
        if n < 2 and reduction is not None:
            return reduction
        self._given = reduction
        split = self._split(batch)
        comparison, failure = None, None
        if split is not None:
            comparison, failure = self._probe(batch, *split)
        if reduction is not None:
            return reduction
        found = self._agree_on_reduction(comparison, failure)
        if found == 'mean':
            self._to_confirm = CONFIRMING_BATCHES
        return found

    def confirm(self, batch, iteration):
        """Compares a later batch's loss with its shares', before its
        update, while ``'mean'`` found at the first iteration awaits
        confirmation (:attr:`confirming`), as :meth:`find` compared the
        first; every MPI rank takes the worst verdict of all.

        Args:
            batch (Batch): The batch of ``iteration``.
            iteration (int): Its iteration, counted from 1.

        Raises:
            ValueError: The batch (on some rank) does not show the mean.
        """
        split = self._split(batch)
        comparison, failure = None, None
        verdict = UNTOLD
        if split is not None:
            comparison, failure = self._compare_loss(batch, *split)
            verdict = REFUTED if failure is not None else \
                self._verdict(comparison)
        agreed = verdict
        if self._allreducer is not None:
            agreed = self._allreducer.allreduce_int(verdict, op='min')
        if agreed == REFUTED:
            self._to_confirm = 0
            raise ValueError(reduction_evidence.reduction_refusal(
                comparison, other_ranks=verdict != REFUTED,
                failure=None if failure is None else
                accumulator.describe_error(failure),
                iteration=iteration)) from failure
        if agreed == SHOWN:
            self._to_confirm -= 1
            if not self.confirming:
                self._say("CGDP reduction: 'mean' confirmed at iteration "
                          '{}'.format(iteration),
                          reduction_evidence.describe_loss(comparison))

    @staticmethod
    def _verdict(comparison):
        """SHOWN where the batch shows the mean; UNTOLD where its loss
        matches the mean but its shares cannot show it (its update is
        StandardUpdater's all the same), or is not finite (an overflow,
        which dynamic loss scaling skips, tells nothing); else REFUTED (the
        update with the mean would not be StandardUpdater's)."""
        if comparison.kind == 'mean':
            return SHOWN
        if reduction_evidence.matches_mean(comparison) or \
                not reduction_evidence.all_finite(comparison):
            return UNTOLD
        return REFUTED

    def _split(self, batch):
        """The shares to compare: the devices', or two halves of the batch
        on one device or where fewer than two devices hold examples (None:
        a batch of one example)."""
        held = [(part, count) for part, count in
                zip(batch.inputs, batch.counts) if count]
        if self._n_devices >= 2 and len(held) >= 2:
            # A GPU replica's share read ahead is staged for its device.
            return ([input_staging.host_side(part) for part, _ in held],
                    [count for _, count in held])
        return batch.split(2)

    def _probe(self, batch, parts, counts):
        """Runs the comparisons' forwards; learns each reported key's kind
        (with two devices or more) and compares the loss.

        Args:
            batch (Batch): The first batch.
            parts (list): The converted inputs of each share.
            counts (list of int): Each share's examples.

        Returns:
            tuple: ``(comparison, failure)``: the loss's
            :class:`~cgdp_chainer.runtime.replica.observations.Comparison`, or None
            and the exception a forward raised.
        """
        n = self._n_devices
        try:
            forwards = self._forwards(batch, parts)
        except Exception as error:
            # A forward that needs the graph (chainer.grad in it) or train
            # mode: the comparisons tell nothing; training is unaffected.
            if n >= 2:
                self._say('CGDP reported values: combined by type '
                          '(integers add up, others average; report_kinds= '
                          'sets a key)',
                          "the first iteration's forwards of the model with "
                          'chainer.config.train False and no backprop '
                          'raised {}'.format(accumulator.describe_error(error)),
                          log.NOTICE)
            return None, error
        whole, shares = forwards[0], forwards[1:]
        if n >= 2:
            self._report_kinds.learn(whole.observation,
                                     [f.observation for f in shares], counts)
            self._say('CGDP reported values: combined over the {} replicas '
                      'as the whole batch reports them'.format(n),
                      self._report_kinds.describe(whole.observation))
        if self._given is not None:
            return None, None
        return self._judge(batch, whole.loss, [f.loss for f in shares],
                           counts)

    def _compare_loss(self, batch, parts, counts):
        """The loss of a later batch compared, as :meth:`_probe` compares
        the first's (no reported values)."""
        try:
            forwards = self._forwards(batch, parts)
        except Exception as error:
            return None, error
        return self._judge(batch, forwards[0].loss,
                           [f.loss for f in forwards[1:]], counts)

    def _forwards(self, batch, parts):
        """The master's deterministic forwards on the whole batch, then on
        each share."""
        return probe_forwards(
            self._master, self._loss_func,
            [shared.copied_inputs(batch.whole_inputs)] +
            [shared.copied_inputs(part) for part in parts])

    def _judge(self, batch, whole, parts, counts):
        """The loss's comparison within float rounding, on finer shares
        where the shares do not show the form it matches, within the
        sampling noise where it matches neither.

        Returns:
            tuple: As for :meth:`_probe`.
        """
        comparison = reduction_evidence.compare_loss(whole, parts, counts)
        if comparison.kind in observations.KINDS and \
                not reduction_evidence.shows_form(comparison):
            return self._compare_finer(batch, comparison)
        if comparison.kind != 'neither':
            return comparison, None
        return self._decide_within_noise(batch, comparison)

    def _compare_finer(self, batch, comparison):
        """The loss compared on finer shares of the batch, for a match
        that the shares do not show (see
        :func:`~cgdp_chainer.runtime.replica.reduction_evidence.shows_form`):
        their losses too near each other to show the mean's weights, or
        fewer than two of them not zero.

        Args:
            batch (Batch): The batch.
            comparison (Comparison): The comparison on the devices' shares.

        Returns:
            tuple: As for :meth:`_probe`; the kind ``'indistinct'`` where
            the finer shares do not show the form either.
        """
        shares = min(sum(batch.counts), reduction_evidence.FINER_SHARES)
        split = batch.split(shares) if shares > len(comparison.parts) \
            else None
        if split is None:
            return comparison._replace(kind='indistinct'), None
        parts, counts = split
        try:
            forwards = probe_forwards(
                self._master, self._loss_func,
                [shared.copied_inputs(part) for part in parts])
        except Exception as error:
            return None, error
        finer = reduction_evidence.compare_loss(
            comparison.whole, [f.loss for f in forwards], counts)
        if finer.kind in observations.KINDS and \
                not reduction_evidence.shows_form(finer):
            finer = finer._replace(kind='indistinct')
        return finer, None

    def _decide_within_noise(self, batch, comparison):
        """A second draw of the whole batch's loss, for a comparison that
        found neither: it tells a loss that draws random numbers in test
        mode (a VAE's) from one that is neither a sum nor a mean, and
        decides the first within its noise
        (:func:`~cgdp_chainer.runtime.replica.reduction_evidence.within_noise`).

        The forward draws from a stream of its own (repeatable under a
        seeded script); the caller's random states are put back after it.

        Args:
            batch (Batch): The first batch.
            comparison (Comparison): The exact comparison of the loss.

        Returns:
            tuple: As for :meth:`_probe`.
        """
        try:
            again, = probe_forwards(
                self._master, self._loss_func,
                [shared.copied_inputs(batch.whole_inputs)],
                seed=randomness.probe_words(self._random_base))
        except Exception as error:
            return None, error
        return reduction_evidence.within_noise(comparison, again.loss), None

    def _agree_on_reduction(self, comparison, failure=None):
        """The reduction the loss's comparison found, the same on every MPI
        rank.

        Args:
            comparison (Comparison or None): The loss of the whole batch
                against its shares' (None: a batch of one example on one
                device, which cannot be split, or forwards that failed).
            failure (Exception or None): What the forwards raised.

        Raises:
            ValueError: It cannot be told, or the ranks disagree.
        """
        found = comparison.kind if comparison is not None else None
        code = REDUCTION_CODES.get(found, 0)
        low = high = code
        if self._allreducer is not None:
            low = self._allreducer.allreduce_int(code, op='min')
            high = self._allreducer.allreduce_int(code, op='max')
        if low == high and code:
            self._say('CGDP reduction: {!r}, found {}at the first '
                      'iteration'.format(found, 'within sampling noise '
                                         if comparison.again is not None
                                         else ''),
                      '{} (reduction= skips this check{})'.format(
                          reduction_evidence.describe_loss(comparison),
                          '; compared again before the update of each '
                          'later iteration until {} more batches show '
                          'it'.format(CONFIRMING_BATCHES)
                          if found == 'mean' else ''))
            return found
        raise ValueError(reduction_evidence.reduction_refusal(
            comparison, other_ranks=code != 0,
            failure=None if failure is None else accumulator.describe_error(failure))
        ) from failure


Forward = collections.namedtuple('Forward', ('loss', 'observation'))
Forward.__doc__ = """One deterministic forward of the master.

Attributes:
    loss: The returned loss (a :class:`VariableValue`), or what the loss
        function returned if it was not a ``Variable``.
    observation (dict): Its reported values (see :func:`portable`).
"""


def probe_forwards(link, loss_func, inputs_list, seed=None):
    """Forwards of ``link`` that leave no trace, for the first iteration's
    comparisons.

    Each runs with ``chainer.config.train`` False (dropout off,
    BatchNormalization on its statistics: deterministic) and backprop off,
    in a private reporter, from the same state: after each, every link's
    attributes and persistent values (and the states of random generators
    held as its attributes) are put back; after all, NumPy's global random
    state and Python's ``random`` state too, so that the training that
    follows is the one without these forwards.

    Args:
        link (chainer.Link): The master model.
        loss_func (callable or None): The loss function (default: ``link``).
        inputs_list (list): Converted inputs, one forward each.
        seed (numpy.ndarray or None): If given, NumPy's global random state
            and Python's ``random`` are seeded from it for these forwards
            (a model that draws random numbers then draws others than from
            the caller's state); either way both are put back after.

    Returns:
        list of Forward: One per inputs.
    """
    saved = _LinkState(link)
    numpy_state = numpy.random.get_state()
    python_state = random.getstate()
    if seed is not None:
        numpy.random.seed(seed)
        random.seed(int(seed[0]))
    reporter = chainer.Reporter()
    reporter.add_observer('main', link)
    reporter.add_observers('main', link.namedlinks(skipself=True))
    forwards = []
    try:
        with chainer.using_config('train', False), \
                chainer.no_backprop_mode():
            for in_arrays in inputs_list:
                observation = {}
                with reporter.scope(observation):
                    loss = shared.call_with(loss_func or link, in_arrays)
                # Every forward starts from the same state (a model that
                # counts its calls takes the same branch in each).
                saved.restore()
                forwards.append(Forward(
                    observations.portable(loss)
                    if isinstance(loss, chainer.Variable) else loss,
                    {key: observations.portable(value)
                     for key, value in observation.items()}))
    finally:
        saved.restore()
        numpy.random.set_state(numpy_state)
        random.setstate(python_state)
    return forwards


class _LinkState(object):
    """Every link's attributes (what a forward may rebind: an RNN's state,
    a Classifier's ``y`` and ``loss``), its persistent arrays' values and
    the states of the NumPy random generators it holds (which a forward
    advances in place; the replicas are copied from the master after the
    probes and must draw what they would have drawn without them)."""

    def __init__(self, link):
        self._links = []
        for _, sublink in link.namedlinks():
            arrays = {name: numpy.array(value, copy=True)
                      for name, value in sublink.__dict__.items()
                      if name in sublink._persistent and
                      isinstance(value, numpy.ndarray)}
            generators = [(value, _generator_state(value)) for value in
                          sublink.__dict__.values()
                          if _generator_state(value) is not None]
            self._links.append((sublink, dict(sublink.__dict__), arrays,
                                generators))

    def restore(self):
        for sublink, attributes, arrays, generators in self._links:
            sublink.__dict__.clear()
            sublink.__dict__.update(attributes)
            for name, value in arrays.items():
                sublink.__dict__[name][...] = value
            for generator, state in generators:
                _set_generator_state(generator, state)


def _generator_state(value):
    """The state of a NumPy random generator, or None for anything else."""
    if isinstance(value, numpy.random.RandomState):
        return value.get_state()
    if isinstance(value, numpy.random.Generator):
        return value.bit_generator.state
    return None


def _set_generator_state(generator, state):
    if isinstance(generator, numpy.random.RandomState):
        generator.set_state(state)
    else:
        generator.bit_generator.state = state
