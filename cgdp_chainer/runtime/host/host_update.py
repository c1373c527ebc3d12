"""Fused host update rules: reduce, hooks and update in one pass.

Chainer's update rules on the CPU run one NumPy expression after another over
whole arrays (Adam: about a dozen), each reading and writing memory, after the
accumulator has already written the reduced gradient. The rules here do the
same arithmetic per cache-sized block instead: the block's gradient is summed
from the replicas' slots (with the reduction's weights) into a buffer that
stays in the core's cache, the per-parameter hooks (``WeightDecay``,
``Lasso``, ``GradientHardClipping``) are applied to it, and the parameter and
its state are updated, so that every slot, the parameter and each state array
is read once and the parameter and the state are written once. The gradient
itself is written to memory only when asked (when anything may read the
master's ``param.grad`` after the update): the block's final gradient, after
the hooks and the loss scale's division, then goes out as one more write
stream, as Chainer's rules leave it in ``param.grad``. A loss scale divides
the gradient after the hooks, as ``UpdateRule.update`` does.

The arithmetic is Chainer's, operation by operation, in the parameter's
precision (float32), so the results equal Chainer's update rules (the tests
check rtol 1e-6 over several iterations, and both backends agree bit for bit
with Chainer on this machine). The state lives in each update rule's
``state`` dict and ``t`` as with Chainer, so snapshots stay Chainer's.

Two backends compute the same blocks:

- ``'numba'``: compiled loops (``nogil``), where numba imports (it is in
  ``requirements.txt``; it is skipped where no numba release supports the
  installed NumPy);
- ``'numpy'``: the same blocks as NumPy ufunc calls with ``out=`` buffers.

A chunk's parameters are cut into pieces of about equal size, one per host
thread (:class:`BlockPool`); both backends release the GIL while they compute.

The fused rules: ``SGD``, ``MomentumSGD``, ``CorrectedMomentumSGD``,
``NesterovAG``, ``Adam`` (with AdamW, AMSGrad, AdaBound, AMSBound),
``RMSprop``, ``AdaGrad``, ``AdaDelta`` and ``RMSpropGraves``. A subclass
of one of these optimizers, hooks or update rules that changes nothing of
the update (Chainer's deprecated aliases such as
``chainer.optimizer.WeightDecay``, or a subclass that sets defaults in
``__init__``) is fused as its base; one that redefines a method of its
base's keeps Chainer's path (see
:mod:`~cgdp_chainer.runtime.host.fused_classes`).

A rule's own hooks (any per-parameter callable registered with
``param.update_rule.add_hook``, such as ChainerCV's ``GradientScaling``) keep
the update fused: the gradient goes through the optimizer's hooks first, then
the rule's pre-update hooks run in Python on the parameter's whole gradient,
then the fused update (:func:`call_rule_hooks`), in ``UpdateRule.update``'s
order.

What is not fused goes through Chainer's own update rule, unchanged: other
optimizers, parameters whose rule was replaced, a
parameter whose state is not created yet (its first update creates it),
dtypes other than float32, and any optimizer hook other than the three above
(then no parameter of that optimizer is fused: hooks apply to all). A frozen
parameter (:func:`frozen`) is not updated at all.
"""
import concurrent.futures
import copy
import functools
import math
import os
import time
import warnings

import numpy

import chainer  # NOQA: the caller (cgdp_chainer) imported the compat first
from chainer import optimizer_hooks
from chainer import optimizers

from cgdp_chainer import log
from cgdp_chainer.runtime.host import fused_classes
from cgdp_chainer.runtime.host import reduction

BACKENDS = ('auto', 'numba', 'numpy')

# Elements per block: the block's gradient buffer (and, for the NumPy backend,
# its temporaries) stay in L1/L2 while the slots, parameter and state stream
# through once.
NUMPY_BLOCK = 1 << 14
# Slot tuples shorter than this are padded to it (see HostUpdate.update).
SLOT_TUPLE = 4
# Below this many elements a chunk runs on the calling thread: handing pieces
# to other threads would cost more than it saves.
MIN_SPLIT = 1 << 16

# Codes of the fused gradient program (one row of ``hook_args`` each): the
# three hooks, and the division by the loss scale.
_WEIGHT_DECAY, _LASSO, _HARD_CLIP, _UNSCALE = 0, 1, 2, 3


def numba_available():
    """Whether the ``'numba'`` backend can be used here (imports numba)."""
    return _numba_kernels() is not None


def _numba_kernels():
    if not _numba_import:
        try:
            from cgdp_chainer.runtime.host import host_kernels
            _numba_import.append(host_kernels)
        except Exception as error:  # ImportError, or numba refusing NumPy
            _numba_import.append(None)
            log.notice('CGDP host update: numba does not import, so the '
                       'fused rules run as NumPy (slower): pip install numba',
                       '{}: {}'.format(type(error).__name__, error))
    return _numba_import[0]


_numba_import = []


def resolve_backend(backend):
    """The backend that ``backend`` names here.

    Args:
        backend (str): ``'auto'`` (numba where it imports, else NumPy),
            ``'numba'`` or ``'numpy'``.

    Returns:
        str: ``'numba'`` or ``'numpy'``.

    Raises:
        ValueError: ``backend`` is unknown, or ``'numba'`` where numba
            does not import.
    """
    if backend not in BACKENDS:
        raise ValueError('backend must be one of {}, not {!r}'.format(
            ', '.join(BACKENDS), backend))
    if backend == 'auto':
        return 'numba' if numba_available() else 'numpy'
    if backend == 'numba' and not numba_available():
        raise ValueError(
            "backend='numba' needs numba, which does not import here; "
            "use 'auto' or 'numpy'")
    return backend


# -- hooks --------------------------------------------------------------------

def rule_hooks(rule):
    """The hooks registered on one update rule itself (pre and post)."""
    # Chainer has no public accessor for a rule's hooks.
    hookable = rule._hookable
    return (list(hookable._pre_update_hooks.values()) +
            list(hookable._post_update_hooks.values()))


def call_rule_hooks(rule, param, timing, grad):
    """Runs one update rule's own ``'pre'`` or ``'post'`` hooks as
    ``UpdateRule.update`` does (``hook(rule, param)``, in registration
    order), with ``param.grad`` the array ``grad``; a hook that rebinds
    ``param.grad`` has its new values copied into ``grad``, which stays
    ``param.grad``.

    Args:
        rule (chainer.UpdateRule): The parameter's rule.
        param (chainer.Parameter): The master parameter.
        timing (str): ``'pre'`` or ``'post'``.
        grad (numpy.ndarray): The gradient the update uses, of the
            parameter's shape.
    """
    hookable = rule._hookable
    hooks = (hookable._pre_update_hooks if timing == 'pre'
             else hookable._post_update_hooks)
    if not hooks:
        return
    if param.grad is not grad:
        param.grad = grad
    for hook in list(hooks.values()):
        hook(rule, param)
        if param.grad is not grad:
            grad[...] = param.grad
            param.grad = grad


# The hooks with a fused form, and their codes in the program.
_HOOK_CODES = {
    optimizer_hooks.WeightDecay: _WEIGHT_DECAY,
    optimizer_hooks.Lasso: _LASSO,
    optimizer_hooks.GradientHardClipping: _HARD_CLIP,
}


def hook_program(pre, post, loss_scale=None, divide=True):
    """The fused form of the optimizer's per-parameter hooks.

    Chainer's optimizer hooks see the gradient as the backward left it,
    scaled by the loss scale where one is set (``WeightDecay`` scales its
    rate by it, ``Lasso`` and ``GradientHardClipping`` do not), and the
    update rule divides the gradient by the scale after them: the program
    does the same, the division last. A hook is fused as the hook it
    subclasses where it changes nothing of its computation (Chainer's
    deprecated aliases ``chainer.optimizer.WeightDecay`` and the like; see
    :mod:`~cgdp_chainer.runtime.host.fused_classes`).

    Args:
        pre (list): The optimizer's pre-update hooks in order.
        post (list): Its post-update hooks.
        loss_scale (float or None): The optimizer's loss scale.
        divide (bool): Whether the program ends with the loss scale's
            division (False: the hooks only, as Chainer's optimizer hooks
            leave a frozen parameter's gradient, which no update rule
            divides; see :func:`apply_hooks`).

    Returns:
        tuple or None: ``(codes, args)`` arrays (int64 codes, float32 rows of
        two arguments), or None where a hook cannot be fused
        (:func:`hook_refusal` says why).
    """
    if hook_refusal(pre, post) is not None:
        return None
    codes, args = [], []
    for hook in pre:
        code = _HOOK_CODES[fused_classes.fused_as(type(hook), _HOOK_CODES)]
        if code == _WEIGHT_DECAY:
            rate = hook.rate
            if loss_scale is not None:
                rate *= loss_scale
            args.append((rate, 0.0))
        elif code == _LASSO:
            args.append((hook.rate, 0.0))
        else:
            args.append((hook.lower_bound, hook.upper_bound))
        codes.append(code)
    if loss_scale is not None and divide:
        codes.append(_UNSCALE)
        args.append((loss_scale, 0.0))
    return (numpy.array(codes, dtype=numpy.int64),
            numpy.array(args, dtype=numpy.float32).reshape(len(codes), 2))


def hook_refusal(pre, post):
    """Why the optimizer's hooks have no fused form, naming the first hook
    that has none, or None where they have one.

    Args:
        pre (list): The optimizer's pre-update hooks in order.
        post (list): Its post-update hooks.
    """
    if post:
        return 'hook {} runs after the update, which has no fused ' \
            'form'.format(type(post[0]).__name__)
    for hook in pre:
        reason = fused_classes.why_not(type(hook), _HOOK_CODES)
        if reason is not None:
            return 'hook {} has no fused form'.format(reason)
    return None


# -- the NumPy backend --------------------------------------------------------

class _NumpyBlocks(object):
    """Per-call scratch buffers of the NumPy backend (in cache)."""

    def __init__(self):
        self.g = numpy.empty(NUMPY_BLOCK, numpy.float32)
        self.t = numpy.empty(NUMPY_BLOCK, numpy.float32)
        self.u = numpy.empty(NUMPY_BLOCK, numpy.float32)


def _numpy_gradient(buf, n, blk, p, slots, n_slots, weights, weighted, codes,
                    args, gout, write_g):
    g, t = buf.g[:n], buf.t[:n]
    slots = slots[:n_slots]
    if weighted:
        numpy.multiply(slots[0][blk], weights[0], out=g)
        for slot, weight in zip(slots[1:], weights[1:]):
            numpy.multiply(slot[blk], weight, out=t)
            numpy.add(g, t, out=g)
    else:
        if n_slots == 1:
            numpy.copyto(g, slots[0][blk])
        else:
            numpy.add(slots[0][blk], slots[1][blk], out=g)
            for slot in slots[2:]:
                numpy.add(g, slot[blk], out=g)
        if weights[0] != 1:
            numpy.multiply(g, weights[0], out=g)
    for code, (a, b) in zip(codes, args):
        if code == _WEIGHT_DECAY:
            numpy.multiply(p[blk], a, out=t)
            numpy.add(g, t, out=g)
        elif code == _LASSO:
            numpy.sign(p[blk], out=t)
            numpy.multiply(t, a, out=t)
            numpy.add(g, t, out=g)
        elif code == _HARD_CLIP:
            numpy.clip(g, a, b, out=g)
        else:
            numpy.divide(g, a, out=g)
    if write_g:
        gout[blk] = g
    return g


def _gradient_blocks(p, slots, n_slots, weights, weighted, codes, args, gout,
                     write_g, begin, end):
    """The NumPy kernels' loop: yields ``(buf, n, blk, g)`` per block of
    ``[begin, end)``, ``g`` the block's gradient (see
    :func:`_numpy_gradient`) in ``buf``'s scratch."""
    buf = _NumpyBlocks()
    for start in range(begin, end, NUMPY_BLOCK):
        n = min(NUMPY_BLOCK, end - start)
        blk = slice(start, start + n)
        yield buf, n, blk, _numpy_gradient(
            buf, n, blk, p, slots, n_slots, weights, weighted, codes, args,
            gout, write_g)


def _numpy_sgd(p, slots, n_slots, weights, weighted, codes, args, gout,
               write_g, begin, end, lr):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        numpy.multiply(g, lr, out=g)
        numpy.subtract(p[blk], g, out=p[blk])


def _numpy_momentum(p, slots, n_slots, weights, weighted, codes, args, gout,
                    write_g, begin, end, v, lr, momentum):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        vb, t = buf.u[:n], buf.t[:n]
        numpy.multiply(v[blk], momentum, out=vb)
        numpy.multiply(g, lr, out=t)
        numpy.subtract(vb, t, out=v[blk])
        numpy.add(p[blk], v[blk], out=p[blk])


def _numpy_nesterov(p, slots, n_slots, weights, weighted, codes, args, gout,
                    write_g, begin, end, v, lr, momentum, k_v, k_g):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        vb, t = buf.u[:n], buf.t[:n]
        numpy.multiply(v[blk], momentum, out=vb)
        numpy.multiply(g, lr, out=t)
        numpy.subtract(vb, t, out=vb)
        v[blk] = vb
        numpy.multiply(vb, k_v, out=vb)
        pb = p[blk]
        numpy.add(pb, vb, out=vb)
        numpy.multiply(g, k_g, out=t)
        numpy.subtract(vb, t, out=pb)


def _numpy_adam(p, slots, n_slots, weights, weighted, codes, args, gout,
                write_g, begin, end,
                m, v, vhat, c1, c2, alpha_t, eps, amsgrad, adabound, lower,
                upper, decay, a, b):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        t, u = buf.t[:n], buf.u[:n]
        mb, vb = m[blk], v[blk]
        numpy.subtract(g, mb, out=t)
        numpy.multiply(t, c1, out=t)
        numpy.add(mb, t, out=mb)
        numpy.multiply(g, g, out=t)
        numpy.subtract(t, vb, out=t)
        numpy.multiply(t, c2, out=t)
        numpy.add(vb, t, out=vb)
        if amsgrad:
            hb = vhat[blk]
            numpy.maximum(hb, vb, out=hb)
            numpy.sqrt(hb, out=t)
        else:
            numpy.sqrt(vb, out=t)
        numpy.add(t, eps, out=t)
        numpy.divide(alpha_t, t, out=t)
        if adabound:
            numpy.clip(t, lower, upper, out=t)
        numpy.multiply(t, mb, out=t)
        numpy.multiply(t, b, out=t)
        pb = p[blk]
        if decay:
            numpy.multiply(pb, a, out=u)
            numpy.add(u, t, out=pb)
        else:
            numpy.add(pb, t, out=pb)


def _numpy_corrected_momentum(p, slots, n_slots, weights, weighted, codes,
                              args, gout, write_g, begin, end, v, lr,
                              momentum):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        vb, t = v[blk], buf.t[:n]
        numpy.multiply(vb, momentum, out=vb)
        numpy.subtract(vb, g, out=vb)
        numpy.multiply(vb, lr, out=t)
        numpy.add(p[blk], t, out=p[blk])


def _numpy_rmsprop(p, slots, n_slots, weights, weighted, codes, args, gout,
                   write_g, begin, end, ms, lr, alpha, one_minus_alpha, eps,
                   eps_inside_sqrt):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        mb, t, u = ms[blk], buf.t[:n], buf.u[:n]
        numpy.multiply(mb, alpha, out=mb)
        numpy.multiply(g, one_minus_alpha, out=t)
        numpy.multiply(t, g, out=t)
        numpy.add(mb, t, out=mb)
        if eps_inside_sqrt:
            numpy.add(mb, eps, out=u)
            numpy.sqrt(u, out=u)
        else:
            numpy.sqrt(mb, out=u)
            numpy.add(u, eps, out=u)
        numpy.multiply(g, lr, out=t)
        numpy.divide(t, u, out=t)
        numpy.subtract(p[blk], t, out=p[blk])


def _numpy_adagrad(p, slots, n_slots, weights, weighted, codes, args, gout,
                   write_g, begin, end, h, lr, eps):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        hb, t, u = h[blk], buf.t[:n], buf.u[:n]
        numpy.multiply(g, g, out=t)
        numpy.add(hb, t, out=hb)
        numpy.sqrt(hb, out=u)
        numpy.add(u, eps, out=u)
        numpy.multiply(g, lr, out=t)
        numpy.divide(t, u, out=t)
        numpy.subtract(p[blk], t, out=p[blk])


def _numpy_adadelta(p, slots, n_slots, weights, weighted, codes, args, gout,
                    write_g, begin, end, msg, msdx, rho, one_minus_rho, eps):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        gb, xb, t, u = msg[blk], msdx[blk], buf.t[:n], buf.u[:n]
        numpy.multiply(gb, rho, out=gb)
        numpy.multiply(g, one_minus_rho, out=t)
        numpy.multiply(t, g, out=t)
        numpy.add(gb, t, out=gb)
        numpy.add(xb, eps, out=t)
        numpy.add(gb, eps, out=u)
        numpy.divide(t, u, out=t)
        numpy.sqrt(t, out=t)
        numpy.multiply(t, g, out=t)  # dx
        numpy.multiply(xb, rho, out=xb)
        numpy.multiply(t, one_minus_rho, out=u)
        numpy.multiply(u, t, out=u)
        numpy.add(xb, u, out=xb)
        numpy.subtract(p[blk], t, out=p[blk])


def _numpy_rmsprop_graves(p, slots, n_slots, weights, weighted, codes, args,
                          gout, write_g, begin, end, ms, mg, delta, lr, alpha,
                          one_minus_alpha, momentum, eps):
    for buf, n, blk, g in _gradient_blocks(
            p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end):
        nb, gb, db, t, u = ms[blk], mg[blk], delta[blk], buf.t[:n], buf.u[:n]
        numpy.multiply(nb, alpha, out=nb)
        numpy.multiply(g, one_minus_alpha, out=t)
        numpy.multiply(t, g, out=t)
        numpy.add(nb, t, out=nb)
        numpy.multiply(gb, alpha, out=gb)
        numpy.multiply(g, one_minus_alpha, out=t)
        numpy.add(gb, t, out=gb)
        numpy.multiply(db, momentum, out=db)
        numpy.multiply(gb, gb, out=u)
        numpy.subtract(nb, u, out=u)
        numpy.add(u, eps, out=u)
        numpy.sqrt(u, out=u)
        numpy.multiply(g, lr, out=t)
        numpy.divide(t, u, out=t)
        numpy.subtract(db, t, out=db)
        numpy.add(p[blk], db, out=p[blk])


def apply_hooks(p, grad, program):
    """Applies a hook program to ``grad`` in place, with no update: what
    the optimizer's hooks do to a frozen parameter's gradient (Chainer calls
    them for every parameter).

    Args:
        p (numpy.ndarray): The parameters' flat float32 values.
        grad (numpy.ndarray): Their flat float32 gradient, changed.
        program (tuple): From :func:`hook_program` (``divide=False``).
    """
    if program[0].size == 0:
        return
    gradient_pass(p, (grad,), [1.0], False, program, grad)


def gradient_pass(p, slots, weights, weighted, program, gout, begin=0,
                  end=None):
    """``gout`` = the hook program applied to the slots' (weighted) sum, in
    one blocked pass: the gradient a fused update would use, stored for
    the rule's own hooks (see :func:`call_rule_hooks`). ``gout`` may be
    one of the slots (each block is read before it is written).

    Args:
        p (numpy.ndarray): The parameters' flat float32 values.
        slots (sequence of numpy.ndarray): Flat float32 gradients to sum.
        weights (list of float): As for :meth:`HostUpdate.update`.
        weighted (bool): As for :meth:`HostUpdate.update`.
        program (tuple): From :func:`hook_program`.
        gout (numpy.ndarray): Where the gradient goes.
        begin, end (int or None): The range of elements (default: all).
    """
    codes, args = program
    for _ in _gradient_blocks(p, tuple(slots), len(slots),
                              numpy.asarray(weights, numpy.float32),
                              bool(weighted), codes, args, gout, True, begin,
                              gout.size if end is None else end):
        pass


_NUMPY_KERNELS = {'sgd': _numpy_sgd, 'momentum_sgd': _numpy_momentum,
                  'corrected_momentum_sgd': _numpy_corrected_momentum,
                  'nesterov': _numpy_nesterov, 'adam': _numpy_adam,
                  'rmsprop': _numpy_rmsprop, 'adagrad': _numpy_adagrad,
                  'adadelta': _numpy_adadelta,
                  'rmsprop_graves': _numpy_rmsprop_graves}


def kernels(backend):
    """The fused kernels of ``backend`` (``'numba'`` or ``'numpy'``);
    numba compiles each on its first call (and caches it on disk)."""
    if backend == 'numpy':
        return _NUMPY_KERNELS
    return _numba_kernels().KERNELS


# -- one class per rule -------------------------------------------------------

def _f32(x):
    return numpy.float32(x)


def _fusable_array(array, size):
    return (type(array) is numpy.ndarray and array.dtype == numpy.float32 and
            array.flags.c_contiguous and array.size == size)


class FusedRule(object):
    """The fused form of one Chainer update rule class.

    Subclasses name the rule class they replace, its state arrays and kernel,
    and turn a rule's hyperparameters into the kernel's scalars in the same
    float32 roundings as Chainer's NumPy expressions.
    """

    rule_type = None
    state_keys = ()
    kernel_name = None

    def fuses(self, param):
        """Whether ``param``'s update can run fused now, in one pass with
        its gradient (its rule has no hooks of its own).

        Args:
            param (chainer.Parameter): A master parameter.

        Returns:
            bool: False where Chainer's own rule must run (see the module)
            or the rule's own hooks must run between the gradient and the
            update (:meth:`fuses_update`).
        """
        return self.fuses_update(param) and not rule_hooks(param.update_rule)

    def fuses_update(self, param):
        """Whether ``param``'s update itself can run fused now, its rule's
        own hooks (any per-parameter callable, such as ChainerCV's
        ``GradientScaling``) run before and after it as Chainer runs them
        (:func:`call_rule_hooks`).

        Args:
            param (chainer.Parameter): A master parameter.

        Returns:
            bool: False where Chainer's own rule must run (see the module).
        """
        rule = param.update_rule
        if frozen(param) or not self.takes(type(rule)):
            return False
        array = param.array
        if not _fusable_array(array, array.size if array is not None else 0):
            return False
        state = rule.state
        if state is None:
            return False
        for key in self.state_keys_of(rule):
            if key not in state or not _fusable_array(state[key], array.size):
                return False
        return self.rule_ok(rule)

    def takes(self, rule_class):
        """Whether rules of ``rule_class`` compute what :attr:`rule_type`'s
        do (it or a subclass that changes nothing of its update)."""
        return fused_classes.fused_as(rule_class, (self.rule_type,)) is \
            not None

    def state_keys_of(self, rule):
        return self.state_keys

    def rule_ok(self, rule):
        return True

    def scalars(self, rule):
        """Advances ``rule.t`` as ``UpdateRule.update`` does and returns the
        kernel's state arrays and scalars, in its argument order."""
        raise NotImplementedError

    def kernel_state_keys(self, rule):
        """The state keys whose arrays the kernel takes, in its order."""
        return self.state_keys_of(rule)

    def run_key(self, rule):
        """What the kernel's scalars depend on: rules with equal keys update
        as one run of a flat buffer with one set of scalars."""
        return (rule.t, sorted(rule.hyperparam.get_dict().items()))

    def advance_run(self, rules):
        """Advances every rule of a run (equal :meth:`run_key`) as
        ``UpdateRule.update`` does; returns the kernel's scalars, the same
        for all of them."""
        _, scalars = self.scalars(rules[0])
        for rule in rules[1:]:
            rule.t += 1
        return scalars


class FusedSGD(FusedRule):
    rule_type = optimizers.sgd.SGDRule
    kernel_name = 'sgd'

    def scalars(self, rule):
        rule.t += 1
        return (), (_f32(rule.hyperparam.lr),)


class FusedMomentumSGD(FusedRule):
    rule_type = optimizers.momentum_sgd.MomentumSGDRule
    state_keys = ('v',)
    kernel_name = 'momentum_sgd'

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        return (rule.state['v'],), (_f32(hp.lr), _f32(hp.momentum))


class FusedNesterovAG(FusedRule):
    rule_type = optimizers.nesterov_ag.NesterovAGRule
    state_keys = ('v',)
    kernel_name = 'nesterov'

    def scalars(self, rule):
        rule.t += 1
        lr, momentum = rule.hyperparam.lr, rule.hyperparam.momentum
        # Chainer: ``param += momentum * momentum * v`` and
        # ``param -= (1 + momentum) * lr * grad``: the factors are Python
        # floats, rounded to float32 once.
        return (rule.state['v'],), (
            _f32(lr), _f32(momentum), _f32(momentum * momentum),
            _f32((1 + momentum) * lr))


class FusedAdam(FusedRule):
    """Adam with ``amsgrad``, ``adabound``, ``eta`` and
    ``weight_decay_rate`` (also AdamW, AMSGrad, AdaBound, AMSBound)."""

    rule_type = optimizers.adam.AdamRule
    kernel_name = 'adam'

    def state_keys_of(self, rule):
        return ('m', 'v', 'vhat') if rule.hyperparam.amsgrad else ('m', 'v')

    def kernel_state_keys(self, rule):
        # Without AMSGrad the kernel gets ``v`` in ``vhat``'s place.
        return ('m', 'v', 'vhat') if rule.hyperparam.amsgrad else \
            ('m', 'v', 'v')

    def run_key(self, rule):
        # AdaBound's bounds also follow the alpha its rule started with.
        return super(FusedAdam, self).run_key(rule) + (
            getattr(rule, 'initial_alpha', None),)

    def rule_ok(self, rule):
        return _eps_ok(rule.hyperparam.eps)

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        state = rule.state
        amsgrad, adabound = bool(hp.amsgrad), bool(hp.adabound)
        lower, upper = rule.bounds if adabound else (0.0, 0.0)
        a = 1.0 - hp.eta * hp.weight_decay_rate
        return (state['m'], state['v'],
                state['vhat'] if amsgrad else state['v']), (
            _f32(1.0 - hp.beta1), _f32(1.0 - hp.beta2), _f32(rule.alpha_t),
            _f32(hp.eps), amsgrad, adabound, _f32(lower), _f32(upper),
            a != 1, _f32(a), _f32(-hp.eta))


class FusedCorrectedMomentumSGD(FusedRule):
    """Chainer's ``v = momentum * v - grad``, ``param += lr * v``."""

    rule_type = optimizers.corrected_momentum_sgd.CorrectedMomentumSGDRule
    state_keys = ('v',)
    kernel_name = 'corrected_momentum_sgd'

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        return (rule.state['v'],), (_f32(hp.lr), _f32(hp.momentum))


def _eps_ok(eps):
    # Chainer raises for an eps that underflows float32: let it.
    return not (eps != 0 and _f32(eps) == 0)


class FusedRMSprop(FusedRule):
    """RMSprop, with ``eps`` outside the square root or inside it."""

    rule_type = optimizers.rmsprop.RMSpropRule
    state_keys = ('ms',)
    kernel_name = 'rmsprop'

    def rule_ok(self, rule):
        return _eps_ok(rule.hyperparam.eps)

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        # Chainer: ``ms *= alpha``, ``ms += (1 - alpha) * grad * grad``
        # (``1 - alpha`` a Python float, rounded once).
        return (rule.state['ms'],), (
            _f32(hp.lr), _f32(hp.alpha), _f32(1 - hp.alpha), _f32(hp.eps),
            bool(hp.eps_inside_sqrt))


class FusedAdaGrad(FusedRule):
    rule_type = optimizers.ada_grad.AdaGradRule
    state_keys = ('h',)
    kernel_name = 'adagrad'

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        return (rule.state['h'],), (_f32(hp.lr), _f32(hp.eps))


class FusedAdaDelta(FusedRule):
    rule_type = optimizers.ada_delta.AdaDeltaRule
    state_keys = ('msg', 'msdx')
    kernel_name = 'adadelta'

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        return (rule.state['msg'], rule.state['msdx']), (
            _f32(hp.rho), _f32(1 - hp.rho), _f32(hp.eps))


class FusedRMSpropGraves(FusedRule):
    rule_type = optimizers.rmsprop_graves.RMSpropGravesRule
    # Chainer's keys: the mean square, the mean and the step.
    state_keys = ('n', 'g', 'delta')
    kernel_name = 'rmsprop_graves'

    def scalars(self, rule):
        rule.t += 1
        hp = rule.hyperparam
        state = rule.state
        return (state['n'], state['g'], state['delta']), (
            _f32(hp.lr), _f32(hp.alpha), _f32(1 - hp.alpha),
            _f32(hp.momentum), _f32(hp.eps))


# The optimizer classes with a fused rule. Their subclasses that change
# nothing of the update (AdamW, AMSGrad, AdaBound and AMSBound, which only
# set Adam's options, and a user's subclass) are fused as them.
FUSED_RULES = {
    optimizers.SGD: FusedSGD,
    optimizers.MomentumSGD: FusedMomentumSGD,
    optimizers.CorrectedMomentumSGD: FusedCorrectedMomentumSGD,
    optimizers.NesterovAG: FusedNesterovAG,
    optimizers.Adam: FusedAdam,
    optimizers.RMSprop: FusedRMSprop,
    optimizers.AdaGrad: FusedAdaGrad,
    optimizers.AdaDelta: FusedAdaDelta,
    optimizers.RMSpropGraves: FusedRMSpropGraves,
}


def fused_rule_for(optimizer):
    """The fused rule for ``optimizer``'s class, or None (Chainer's path;
    :func:`optimizer_refusal` says why).

    Args:
        optimizer (chainer.Optimizer): Any optimizer.
    """
    base = fused_classes.fused_as(type(optimizer), FUSED_RULES)
    return None if base is None else FUSED_RULES[base]()


def optimizer_refusal(optimizer):
    """Why ``optimizer`` has no fused rule, naming its class, or None.

    Args:
        optimizer (chainer.Optimizer): Any optimizer.
    """
    reason = fused_classes.why_not(type(optimizer), FUSED_RULES)
    if reason is None:
        return None
    return '{} has no fused host rule'.format(reason)


def frozen(param):
    """Whether ``param`` is not updated at all (no update rule, or one that
    is disabled, as ``Link.disable_update`` leaves it): Chainer's
    ``param.update()`` leaves it and its rule untouched, and so does the
    fused update."""
    rule = param.update_rule
    return rule is None or not rule.enabled


# -- threads ------------------------------------------------------------------

class BlockPool(object):
    """Runs the pieces of one chunk on the host's cores.

    The calling thread computes one share itself; the others go to this
    pool's threads. Errors in any piece are raised in the caller.

    Args:
        n_threads (int): Pieces per chunk (1: everything on the caller).
    """

    def __init__(self, n_threads):
        if not isinstance(n_threads, int) or n_threads < 1:
            raise ValueError('n_threads must be a positive integer, not '
                             '{!r}'.format(n_threads))
        self.n_threads = n_threads
        self._executor = None
        if n_threads > 1:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                n_threads - 1, thread_name_prefix='cgdp-host-block')

    def run(self, jobs, block):
        """Runs every ``(call, size)`` job, ``call(begin, end)`` over a
        range of its elements, in about ``n_threads`` equal shares.

        Args:
            jobs (list of tuple): ``(call, size)`` per parameter.
            block (int): Shares are cut at multiples of this.
        """
        total = sum(size for _, size in jobs)
        if self._executor is None or total < MIN_SPLIT:
            for call, size in jobs:
                call(0, size)
            return
        share = -(-total // self.n_threads)
        share = -(-share // block) * block
        groups, group, room = [], [], share
        for call, size in jobs:
            begin = 0
            while begin < size:
                end = min(size, begin + room)
                group.append((call, begin, end))
                room -= end - begin
                begin = end
                if room == 0:
                    groups.append(group)
                    group, room = [], share
        if group:
            groups.append(group)
        futures = [self._executor.submit(_run_group, g) for g in groups[1:]]
        try:
            _run_group(groups[0])
        finally:
            # Every piece ends before the chunk is published, even on error.
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error

    def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=True)


def _run_group(group):
    for call, begin, end in group:
        call(begin, end)


# -- what the accumulator uses ------------------------------------------------

class HostUpdate(object):
    """The fused reduce and update of one optimizer on the host.

    Args:
        optimizer (chainer.GradientMethod): Set up on the master model.
        fused_rule (FusedRule): From :func:`fused_rule_for`.
        n_threads (int or None): Host threads per chunk; default: the CPU
            count.
        backend (str): ``'auto'``, ``'numba'`` or ``'numpy'``.
    """

    def __init__(self, optimizer, fused_rule, n_threads=None, backend='auto'):
        self.optimizer = optimizer
        self.fused_rule = fused_rule
        self.backend = resolve_backend(backend)
        self._use(self.backend)
        if self.backend == 'numba':
            try:
                self._warm_up()
            except Exception as error:
                if backend != 'auto':
                    raise
                warnings.warn(
                    'the numba host update kernel failed to compile ({}: '
                    '{}); using the NumPy one, which gives the same '
                    'numbers'.format(type(error).__name__, error))
                self.backend = 'numpy'
                self._use(self.backend)
        if n_threads is None:
            n_threads = max(1, os.cpu_count() or 1)
        self._pool = BlockPool(n_threads)

    def _use(self, backend):
        self._kernel = kernels(backend)[self.fused_rule.kernel_name]
        self._block = (_numba_kernels().NUMBA_BLOCK
                       if backend == 'numba' else NUMPY_BLOCK)

    def _warm_up(self):
        # Compiles (or loads from numba's cache) the kernel now, on one
        # element of a throwaway rule, rather than in the first iteration.
        param = chainer.Parameter(numpy.zeros(1, numpy.float32))
        param.grad = numpy.zeros(1, numpy.float32)
        rule = self.optimizer.create_update_rule()
        rule.update(param)  # Chainer's first update creates the state.
        state, scalars = self.fused_rule.scalars(rule)
        codes, args = hook_program([], [])
        slots = (param.grad,) * SLOT_TUPLE
        self._kernel(param.array, slots, 1,
                     numpy.ones(1, numpy.float32), False, codes, args,
                     param.grad, True, 0, 1, *(state + scalars))

    def hooks(self, pre, post, loss_scale=None, divide=True):
        """The fused hook program for these optimizer hooks (and the loss
        scale), or None (see :func:`hook_program`)."""
        return hook_program(pre, post, loss_scale, divide)

    def gradient(self, p, slots, weights, weighted, program, gout):
        """:func:`gradient_pass`, cut into pieces for the host threads."""
        job = functools.partial(gradient_pass, p, slots, weights, weighted,
                                program, gout)
        self._pool.run([(job, gout.size)], NUMPY_BLOCK)

    def update(self, params, slots, weights, weighted, program, grads=None):
        """Sums, hooks and updates each parameter in one pass.

        Args:
            params (list of chainer.Parameter): Parameters whose rule the
                fused rule takes (:meth:`FusedRule.fuses`).
            slots (list of list of numpy.ndarray): Per parameter, the
                gradients to sum (one per replica, or the reduced one).
            weights (list of float): Per slot, its weight if ``weighted``;
                else ``weights[0]`` scales the plain sum.
            weighted (bool): ``sum(w * slot)`` (unequal shares) rather than
                ``w * sum(slot)``.
            program (tuple): From :meth:`hooks`.
            grads (list of numpy.ndarray or None): Per parameter, where to
                store the gradient the update used (after the hooks and the
                loss scale's division; float32, C-contiguous, the
                parameter's size), as Chainer's rules leave it in
                ``param.grad``; None stores nothing.
        """
        write = grads is not None
        outs = grads if write else [None] * len(params)
        runs = []
        for param, inputs, out in zip(params, slots, outs):
            state, scalars = self.fused_rule.scalars(param.update_rule)
            runs.append((param.array.reshape(-1),
                         [g.reshape(-1) for g in inputs],
                         out.reshape(-1) if write else None,
                         [a.reshape(-1) for a in state], scalars))
        self.update_runs(runs, weights, weighted, program, write)

    def update_runs(self, runs, weights, weighted, program, write):
        """Sums, hooks and updates runs of flat buffers, one kernel call per
        run (cut into pieces for the host threads).

        Args:
            runs (list of tuple): ``(p, slots, gout, state, scalars)`` per
                run: the parameters' flat float32 slice, the flat slices to
                sum (one per replica, or the reduced one), where to store
                the gradient used (with ``write``), the state's flat slices
                in the kernel's order and the kernel's scalars (from
                :meth:`FusedRule.advance_run`).
            weights (list of float): As for :meth:`update`.
            weighted (bool): As for :meth:`update`.
            program (tuple): From :meth:`hooks`.
            write (bool): Whether to store each run's gradient in ``gout``.
        """
        codes, args = program
        weights = numpy.asarray(weights, dtype=numpy.float32)
        weighted = bool(weighted)
        jobs = []
        for p, slots, gout, state, scalars in runs:
            n_slots = len(slots)
            if n_slots < SLOT_TUPLE:
                # numba compiles a kernel per tuple length: padding to one
                # length (the kernel reads only n_slots) compiles it once.
                slots = tuple(slots) + (slots[0],) * (SLOT_TUPLE - n_slots)
            # Without a destination the kernel gets the parameter, unwritten
            # there, so that numba compiles one signature.
            jobs.append((_Job(self._kernel, p, tuple(slots), n_slots,
                              weights, weighted, codes, args,
                              gout if write else p, write, tuple(state),
                              scalars), p.size))
        self._pool.run(jobs, self._block)

    def close(self):
        """Stops the block threads."""
        self._pool.close()


class _Job(object):
    """One parameter's kernel call over a range of its elements."""

    def __init__(self, kernel, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write, state, scalars):
        self.kernel = kernel
        self.head = (p, slots, n_slots, weights, weighted, codes, args, gout,
                     write)
        self.tail = state + scalars

    def __call__(self, begin, end):
        self.kernel(*self.head, begin, end, *self.tail)


BACKEND_VARIABLE = 'CGDP_HOST_UPDATE'


def make_host_update(optimizer, n_threads=None, backend=None):
    """The fused host update for ``optimizer``, or None where its class has
    no fused rule or fusing is switched off (the accumulator then runs
    Chainer's rules).

    Args:
        optimizer (chainer.GradientMethod): Set up on the master model.
        n_threads (int or None): Host threads per chunk.
        backend (str or None): ``'auto'``, ``'numba'``, ``'numpy'``, or
            ``'off'`` (Chainer's rules); None reads the environment variable
            ``CGDP_HOST_UPDATE`` (default ``'auto'``).

    Raises:
        ValueError: An unknown backend (from the argument or the variable).
    """
    if backend is None:
        backend = os.environ.get(BACKEND_VARIABLE, 'auto')
        if backend not in BACKENDS + ('off',):
            raise ValueError('{} must be one of {}, not {!r}'.format(
                BACKEND_VARIABLE, ', '.join(BACKENDS + ('off',)), backend))
    if backend == 'off':
        return None
    fused_rule = fused_rule_for(optimizer)
    if fused_rule is None:
        resolve_backend(backend)  # still report a bad name
        return None
    return HostUpdate(optimizer, fused_rule, n_threads=n_threads,
                      backend=backend)


# -- the cost model's measurement ---------------------------------------------

OPTIMIZERS = {
    'sgd': lambda: optimizers.SGD(lr=0.01),
    'momentum_sgd': lambda: optimizers.MomentumSGD(lr=0.01, momentum=0.9),
    'corrected_momentum_sgd': lambda: optimizers.CorrectedMomentumSGD(
        lr=0.01, momentum=0.9),
    'nesterov_ag': lambda: optimizers.NesterovAG(lr=0.01, momentum=0.9),
    'adam': lambda: optimizers.Adam(alpha=0.001),
    'rmsprop': lambda: optimizers.RMSprop(lr=0.01),
    'adagrad': lambda: optimizers.AdaGrad(lr=0.01),
    'adadelta': lambda: optimizers.AdaDelta(),
    'rmsprop_graves': lambda: optimizers.RMSpropGraves(lr=0.01),
}
# State arrays per parameter of each, for the bytes an update moves.
_STATE_ARRAYS = {'sgd': 0, 'momentum_sgd': 1, 'corrected_momentum_sgd': 1,
                 'nesterov_ag': 1, 'adam': 2, 'rmsprop': 1, 'adagrad': 1,
                 'adadelta': 2, 'rmsprop_graves': 3}


def make_optimizer(name):
    """A fresh optimizer by its short name (see :data:`OPTIMIZERS`).

    Raises:
        ValueError: ``name`` is unknown.
    """
    if name not in OPTIMIZERS:
        raise ValueError('optimizer must be one of {}, not {!r}'.format(
            ', '.join(sorted(OPTIMIZERS)), name))
    return OPTIMIZERS[name]()


def necessary_bytes(optimizer_name, n_elements, n_slots, itemsize=4):
    """Bytes one fused update must move: each slot read once, the parameter
    and each state array read and written once.

    Args:
        optimizer_name (str): A key of :data:`OPTIMIZERS`.
        n_elements (int): Parameter elements.
        n_slots (int): Gradient slots summed.
        itemsize (int): Bytes per element.
    """
    if optimizer_name not in _STATE_ARRAYS:
        raise ValueError('optimizer must be one of {}, not {!r}'.format(
            ', '.join(sorted(_STATE_ARRAYS)), optimizer_name))
    return itemsize * n_elements * (
        n_slots + 2 * (1 + _STATE_ARRAYS[optimizer_name]))


def measure_seconds_per_element(optimizer_name, n_slots, n_elements=1 << 22,
                                repeats=3, n_threads=None, backend='auto',
                                shapes=None):
    """Host seconds per parameter element of one fused reduce and update.

    For the cost model: a chunk of ``n`` parameter elements costs about
    ``n * measure_seconds_per_element(...)`` seconds on this host. The
    parameters are ``shapes`` (default: one array of ``n_elements``), with
    ``n_slots`` gradient slots summed with 'mean' weights; the best of
    ``repeats`` timed updates after one that warms up (and compiles).

    Args:
        optimizer_name (str): A key of :data:`OPTIMIZERS`.
        n_slots (int): Replica slots summed per update (>= 1).
        n_elements (int): Elements when ``shapes`` is None.
        repeats (int): Timed updates (>= 1).
        n_threads (int or None): Host threads (default: the CPU count).
        backend (str): ``'auto'``, ``'numba'`` or ``'numpy'``.
        shapes (list of tuple or None): Parameter shapes to measure.

    Returns:
        float: Seconds per element.
    """
    updater = FusedBench(optimizer_name, n_slots, shapes or [(n_elements,)],
                         n_threads=n_threads, backend=backend)
    try:
        return updater.best_seconds(repeats) / updater.n_elements
    finally:
        updater.close()


class FusedBench(object):
    """A master model of given shapes with random gradient slots, updated
    fused or through Chainer's rules: what the benchmark and the cost model
    time.

    Args:
        optimizer_name (str): A key of :data:`OPTIMIZERS`.
        n_slots (int): Replica slots made (>= 1); a step may use fewer.
        shapes (list of tuple): Parameter shapes.
        n_threads (int or None): Host threads of the fused update.
        backend (str): ``'auto'``, ``'numba'`` or ``'numpy'``.
        seed (int): Seeds the random values.
    """

    def __init__(self, optimizer_name, n_slots, shapes, n_threads=None,
                 backend='auto', seed=0):
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError('n_slots must be a positive integer, not '
                             '{!r}'.format(n_slots))
        self.optimizer_name = optimizer_name
        self.optimizer = make_optimizer(optimizer_name)
        rng = numpy.random.default_rng(seed)
        link = chainer.Link()
        with link.init_scope():
            for i, shape in enumerate(shapes):
                setattr(link, 'p{}'.format(i), chainer.Parameter(
                    rng.random(shape, dtype=numpy.float32) - 0.5))
        self.optimizer.setup(link)
        self.params = [p for _, p in sorted(link.namedparams())]
        self.n_elements = sum(p.size for p in self.params)
        self.n_slots = n_slots
        self.slots = [[rng.random(p.shape, dtype=numpy.float32) - 0.5
                       for _ in range(n_slots)] for p in self.params]
        for p in self.params:
            p.grad = numpy.zeros_like(p.array)
            # Chainer's first update creates the state, as in training.
            p.update_rule.update(p)
        self.host_update = make_host_update(self.optimizer,
                                            n_threads=n_threads,
                                            backend=backend)
        self._program = hook_program([], [])
        self._n_threads = n_threads

    def with_backend(self, backend):
        """The same arrays and optimizer, updated by ``backend``."""
        other = copy.copy(self)
        other.host_update = make_host_update(
            self.optimizer, n_threads=self._n_threads, backend=backend)
        return other

    def fused_step(self, n_slots=None, write_grads=False):
        """One fused reduce ('mean') and update of every parameter.

        Args:
            n_slots (int or None): Slots summed (default: all).
            write_grads (bool): Also store each gradient in ``param.grad``,
                as the accumulator does when anything may read it.
        """
        n = n_slots or self.n_slots
        self.optimizer.t += 1
        self.host_update.update(
            self.params, [s[:n] for s in self.slots], [1.0 / n] * n, False,
            self._program,
            grads=[p.grad for p in self.params] if write_grads else None)

    def fused_step_writing_grads(self, n_slots=None):
        """:meth:`fused_step` that also writes ``param.grad``."""
        self.fused_step(n_slots, write_grads=True)

    def chainer_step(self, n_slots=None):
        """The same through the accumulator's block reduction into
        ``param.grad`` and Chainer's update rules (the unfused path)."""
        n = n_slots or self.n_slots
        self.optimizer.t += 1
        for p, slots in zip(self.params, self.slots):
            reduction.reduce_sum(p.grad, slots[:n], 1.0 / n)
            p.update()

    def best_seconds(self, repeats, step=None, n_slots=None):
        """Best wall time of ``repeats`` steps after one warm-up step."""
        step = step or self.fused_step
        step(n_slots)
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            step(n_slots)
            best = min(best, time.perf_counter() - start)
        return best

    def close(self):
        """Stops the fused update's threads."""
        self.host_update.close()
