"""The user's model (the master) as the truth between iterations.

Between two ``update()`` calls, user code may change the master: values
written in place, arrays replaced (``p.array = ...``), ``load_npz``,
``copyparams``, BatchNormalization statistics. The updater takes those
changes at the start of the next ``update()``:

- :class:`MasterStructure` refuses a change of structure (a parameter added,
  removed, reshaped, of another dtype, uninitialized, or a link replaced),
  naming the parameter, since the replicas and the optimizer's state are
  tied to the parameters the updater started with.
- :class:`PersistentsRecord` remembers what the updater last wrote into the
  master's persistent values, so that values the user changed are sent to
  every replica.
- :class:`TrainerWatch` learns from the Trainer's extension triggers when
  the master may be read (replica 0's BatchNormalization statistics must be
  there first) and whether it may have been written since the last
  ``update()`` (GPU replicas, which hold device copies, must then get the
  master's values again).
"""
import collections
import copy

import chainer
from chainer import links
import numpy

from chainer.training import extensions
from chainer.training import triggers


class MasterStructure(object):
    """The master's parameters as the updater's replicas were built from.

    Args:
        master (chainer.Link): The master, with every parameter initialized.
    """

    def __init__(self, master):
        self._params = collections.OrderedDict(
            (name, (param, param.array.shape, param.array.dtype))
            for name, param in master.namedparams())
        self._known = list(self._params.values())

    def check(self, master):
        """Raises ValueError naming the first parameter whose structure
        changed: one identity check per parameter where nothing changed.

        Args:
            master (chainer.Link): The master now.
        """
        known = self._known
        count = 0
        # params() walks the links as namedparams() does, without making
        # the names, which only an error needs.
        for param in master.params():
            if count == len(known):
                break
            original, shape, dtype = known[count]
            array = param.array
            if param is not original or array is None or \
                    array.shape != shape or array.dtype != dtype:
                break
            count += 1
        else:
            if count == len(known):
                return
        array = None  # see _explain
        self._explain(master)

    def _explain(self, master):
        """Raises the error naming what changed (no local reference to an
        array: a traceback the caller keeps must not keep the shared arena
        mapped)."""
        for name, param in master.namedparams():
            known = self._params.get(name)
            if known is None:
                _refuse(name, 'was added')
            original, shape, dtype = known
            if param is not original:
                _refuse(name, 'is a new Parameter (its link was replaced '
                        'or the parameter reassigned)')
            if param.array is None:
                _refuse(name, 'is now uninitialized')
            if param.shape != shape or param.dtype != dtype:
                _refuse(name, 'changed from {} {} to {} {}'.format(
                    shape, dtype, param.shape, param.dtype))
        names = {name for name, _ in master.namedparams()}
        for name in self._params:
            if name not in names:
                _refuse(name, 'was removed')


def _refuse(name, what):
    raise ValueError(
        'parameter {} {} since the CGDPUpdater started; its replicas and the '
        "optimizer's state belong to the model's original structure. Change "
        "values only (in place, p.array = an array of the same shape and "
        'dtype, load_npz, copyparams), or build a new optimizer and updater '
        'after changing the structure'.format(name, what))


class PersistentsRecord(object):
    """What the updater last wrote into (or read from) the master's
    persistent values, to notice the user's changes.

    Args:
        master (chainer.Link): The master; its persistent values now are
            the first remembered.
    """

    def __init__(self, master):
        # Keys as cgdp_chainer.runtime.workers.worker.save_persistents makes them.
        self._slots = [(path + '/' + name, link, name)
                       for path, link in master.namedlinks()
                       for name in link._persistent]
        self._values = {}
        self.remember({key: link.__dict__[name]
                       for key, link, name in self._slots})

    def remember(self, values):
        """Keeps a copy of ``values`` (by key, as ``save_persistents``
        gives them) as the master's known persistent values."""
        self._values = {key: copy.deepcopy(value)
                        for key, value in values.items()}

    def changed(self):
        """Whether any of the master's persistent values differs from the
        remembered one (bit for bit)."""
        for key, link, name in self._slots:
            if _differ(link.__dict__[name], self._values.get(key)):
                return True
        return False


def _differ(value, known):
    if hasattr(value, 'shape') or hasattr(known, 'shape'):
        return not (hasattr(value, 'shape') and hasattr(known, 'shape')) or \
            value.shape != known.shape or value.dtype != known.dtype or \
            numpy.asarray(value).tobytes() != numpy.asarray(known).tobytes()
    return value != known


# Extensions that read only observations, the optimizer's hyperparameters
# or the parameters' values, which the master always holds.
_OBSERVERS = (
    extensions.LogReport, extensions.PrintReport, extensions.ProgressBar,
    extensions.PlotReport, extensions.MicroAverage,
    extensions.ExponentialShift, extensions.InverseShift,
    extensions.LinearShift, extensions.MultistepShift,
    extensions.PolynomialShift, extensions.StepShift, extensions.WarmupShift,
    extensions.FailOnNonNumber,
)
# Extensions that neither read the model's persistent values nor write the
# model.
_QUIET = _OBSERVERS + (extensions.ParameterStatistics,)
# Extensions that read the model but leave it unchanged.
_READERS = (extensions.Evaluator, extensions.DumpGraph,
            extensions.VariableStatisticsPlot,
            type(extensions.snapshot()))


def reads_and_writes(extension):
    """``(reads, writes)``: whether ``extension`` may read the model's
    persistent values and whether it may write the model. Only Chainer's
    own extensions, by exact type, are known; any other may do both."""
    kind = type(extension)
    if kind in _QUIET:
        return False, False
    if kind in _READERS:
        return True, False
    return True, True


# Extensions that never read a parameter's gradient: they read
# observations, hyperparameters, the parameters' values or run forwards.
# ParameterStatistics and VariableStatisticsPlot read gradients; so may any
# other extension, or the function given to observe_value.
_GRADIENT_BLIND = _OBSERVERS + (
    extensions.Evaluator, extensions.DumpGraph, type(extensions.snapshot()),
)


def reads_gradients(extension):
    """Whether ``extension`` may read the model's ``param.grad``. Only
    Chainer's own extensions, by exact type, are known not to (and
    ``observe_lr``'s); any other may."""
    if type(extension) in _GRADIENT_BLIND:
        return False
    return not _is_observe_lr(extension)


def _is_observe_lr(extension):
    # observe_lr is observe_value with a function of its own that reads the
    # learning rate; Chainer names neither, so they are known by name.
    if getattr(extension, '__qualname__', None) != \
            'observe_value.<locals>._observe_value':
        return False
    for cell in getattr(extension, '__closure__', None) or ():
        target = cell.cell_contents
        if callable(target) and getattr(target, '__qualname__', '') \
                .startswith('observe_lr.<locals>.'):
            return True
    return False


def stops_after(trigger, iteration, epoch_detail):
    """Whether a Trainer's stop trigger will fire when the loop evaluates it
    next, after the update now running, or None where that cannot be known
    without calling it (any trigger but Chainer's ``IntervalTrigger``).

    Args:
        trigger: The Trainer's ``stop_trigger``.
        iteration (int): The updater's iteration after this update.
        epoch_detail (float): Its epoch detail after this update.
    """
    if type(trigger) is not triggers.IntervalTrigger:
        return None
    # IntervalTrigger.__call__'s arithmetic, without its side effects.
    if trigger.unit == 'epoch':
        previous = trigger._previous_epoch_detail
        if previous < 0:
            return True  # a resumed trigger guessing its past: be safe
        return previous // trigger.period != epoch_detail // trigger.period
    previous = trigger._previous_iteration
    if previous < 0:
        previous = iteration - 1
    return previous // trigger.period != iteration // trigger.period


class TrainerWatch(object):
    """Follows a Trainer's extensions through their triggers.

    Each trigger is wrapped (once) so that, when it fires for an extension
    that may read the model, ``before_read`` is called before the extension
    runs, and an extension that may write the model is remembered. Every
    trigger is evaluated after each ``update()`` of the Trainer's loop, so a
    wrapped trigger being called also tells that the loop, not other user
    code, runs between updates.

    Args:
        before_read (callable): Called before an extension that may read
            the model runs.
    """

    def __init__(self, before_read):
        self._before_read = before_read
        self._trainer = None
        self._in_loop = False
        self._written = False
        self._unattended = False

    def set_unattended(self, unattended):
        """Between ``set_unattended(True)`` and ``set_unattended(False)``
        the caller promises that no code reads or writes the model between
        updates: they then run as in a Trainer's loop whose extensions
        leave the model alone."""
        self._unattended = unattended
        if not unattended:
            self._in_loop = False  # code after the block may change it

    def connect(self, trainer):
        self._trainer = trainer

    def start_update(self):
        """Called at the start of each ``update()``.

        Returns:
            tuple: ``(in_loop, may_be_edited)``: whether the previous
            ``update()`` was followed by the Trainer's loop (then the master
            is read only through extensions, and lazily fetched values are
            safe), and whether user code may have changed the master since
            (always True outside a Trainer's loop).
        """
        in_loop, written = self._in_loop, self._written
        self._in_loop = self._unattended
        self._written = False
        self._wrap_triggers()
        return in_loop, written or not in_loop

    def gradients_wanted(self, in_loop, iteration, epoch_detail):
        """Whether the update now running must leave its gradient in the
        master's ``param.grad``: unless inside :meth:`set_unattended`, or
        inside a Trainer's loop whose extensions are all known not to read
        gradients and whose stop trigger is known not to end the loop after
        this update (code after the loop may read them).

        Args:
            in_loop (bool): What :meth:`start_update` returned first.
            iteration (int): The updater's iteration after this update.
            epoch_detail (float): Its epoch detail after this update.
        """
        if self._unattended:
            return False
        if not in_loop or self._trainer is None:
            return True
        trainer = self._trainer
        # Chainer's Trainer has no public accessor for its entries.
        for entry in trainer._extensions.values():
            if reads_gradients(entry.extension):
                return True
        stops = stops_after(trainer.stop_trigger, iteration, epoch_detail)
        return stops is None or stops

    def _wrap_triggers(self):
        if self._trainer is None:
            return
        # Chainer's Trainer has no public accessor for its entries.
        for entry in self._trainer._extensions.values():
            if not isinstance(entry.trigger, _WatchedTrigger):
                reads, writes = reads_and_writes(entry.extension)
                entry.trigger = _WatchedTrigger(entry.trigger, self, reads,
                                                writes)

    def evaluated(self, fired, reads, writes):
        """Called by a wrapped trigger after it was evaluated."""
        self._in_loop = True
        if fired:
            if reads:
                self._before_read()
            self._written = self._written or writes


class _WatchedTrigger(object):
    """A Trainer extension's trigger that reports to a :class:`TrainerWatch`
    (everything else, such as ``serialize``, goes to the trigger)."""

    def __init__(self, trigger, watch, reads, writes):
        self._trigger = trigger
        self._watch = watch
        self._reads = reads
        self._writes = writes

    def __call__(self, trainer):
        fired = self._trigger(trainer)
        self._watch.evaluated(fired, self._reads, self._writes)
        return fired

    def __getattr__(self, name):
        if name.startswith('__') or name == '_trigger':
            # copy and pickle look these up before __init__ has run.
            raise AttributeError(name)
        return getattr(self._trigger, name)


class StatisticsKept(chainer.LinkHook):
    """Keeps the master's running statistics as they were through an extra
    forward in training mode (the first iteration's forward on the master,
    which only initializes lazy parameters): the replicas' forwards are
    the ones ``StandardUpdater``'s first forward stands for.

    Two mechanisms, since neither covers every link alone:

    - The persistent values that exist before the forward are copied and
      written back after it (BatchNormalization updates its statistics in
      place, so keeping the arrays themselves would keep nothing).
    - Links whose statistics only come into being in the forward (a lazy
      ``L.BatchNormalization(None)``) have nothing to copy beforehand: their
      forward runs with ``chainer.config.in_recomputing``, Chainer's own
      flag for a forward that must not count, which these links honour.
      It is set for them alone: other links read it differently
      (``BatchRenormalization`` expects statistics saved by an earlier
      forward).

    Use as a context manager around the forward.

    Args:
        master (chainer.Link): The master.
    """

    name = 'cgdp_statistics_kept'

    def __init__(self, master):
        self._master = master
        self._saved = None
        self._flags = []

    def __enter__(self):
        self._saved = [(link, name, _copied_value(link.__dict__[name]))
                       for _, link in self._master.namedlinks()
                       for name in link._persistent]
        return super(StatisticsKept, self).__enter__()

    def __exit__(self, *exc):
        super(StatisticsKept, self).__exit__(*exc)
        for link, name, value in self._saved:
            current = link.__dict__[name]
            if value is None:
                continue  # made by the forward: left as initialized
            if hasattr(current, 'shape') and \
                    getattr(value, 'shape', None) == current.shape:
                current[...] = value  # in place: others may hold it
            else:
                setattr(link, name, value)
        self._saved = None

    def forward_preprocess(self, args):
        if _honours_recomputing(args.link):
            self._flags.append(chainer.config.in_recomputing)
            chainer.config.in_recomputing = True

    def forward_postprocess(self, args):
        if _honours_recomputing(args.link):
            chainer.config.in_recomputing = self._flags.pop()


def _copied_value(value):
    return value.copy() if hasattr(value, 'copy') and \
        hasattr(value, 'shape') else copy.deepcopy(value)


def _honours_recomputing(link):
    """Whether ``link``'s forward leaves its statistics alone under
    ``in_recomputing`` and needs nothing else for it."""
    forward = type(link).forward
    return forward is links.BatchNormalization.forward or \
        forward is links.DecorrelatedBatchNormalization.forward
