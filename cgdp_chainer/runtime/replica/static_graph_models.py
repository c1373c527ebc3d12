"""What CGDP does with ``@static_graph`` models: runs them define-by-run.

``chainer.static_graph`` on a chain's ``__call__`` (or ``forward``), as in
Chainer's ``examples/static_graph_optimizations``, records the chain's
first call as a static schedule and replays later calls as one function
node, its backward as one node too: CGDP's readiness backward
(:mod:`~cgdp_chainer.runtime.replica.readiness`) would see no parameter become
ready until that node's backward had run. With Chainer's configuration
``use_static_graph`` False the decorator only calls the method it wraps,
so the same code runs define-by-run and computes the same values (the
decorator is an optimization). CGDP therefore runs every forward it makes
itself define-by-run (:func:`define_by_run`): the replicas' forwards and
backwards, with both worker kinds, and the first iteration's forwards of
the master (lazy parameters, the reduction's probes, a chunk-size
chooser's profile). The result equals ``StandardUpdater``'s, which runs
the static schedule. The master's own calls outside the updater (an
``Evaluator``) are left to Chainer: a schedule they build on the master
stays the master's, and replica copies leave it out
(:data:`SCHEDULE_TYPES`).
"""
import types

import chainer
from chainer.graph_optimizations import static_graph as chainer_static_graph

# What the decorator attaches to a chain on a call (``schedule_manager``,
# and through it the schedules, which hold weak references to arrays and
# the chain's parameters): a replica, which runs define-by-run, needs none
# of it, and a copy would compute with the master's parameters.
SCHEDULE_TYPES = (chainer_static_graph.ScheduleManager,
                  chainer_static_graph.StaticScheduleFunction)


def define_by_run():
    """A scope in which ``@static_graph`` methods run define-by-run.

    Returns:
        A context manager (``chainer.using_config``).
    """
    return chainer.using_config('use_static_graph', False)


def _wrapper_code():
    """The code object that every ``@static_graph`` wrapper shares (the
    decorator wraps without ``functools.wraps``: there is no attribute to
    look for, but every wrapper is a closure over this one code)."""
    return chainer_static_graph.static_graph(lambda chain: None).__code__


def _is_wrapper(value, wrapper_code):
    value = getattr(value, '__func__', value)  # a bound method
    return isinstance(value, types.FunctionType) and (
        value.__code__ is wrapper_code or (
            value.__module__ == chainer_static_graph.__name__
            and value.__qualname__.endswith('wrap.<locals>.wrapped_func')))


def decorated_methods(master, loss_func=None):
    """Where ``chainer.static_graph`` decorates a method of ``master``'s
    links (or of ``loss_func``, or of a link that it is or is bound to).

    Args:
        master (chainer.Link): The master model.
        loss_func (callable or None): As for ``CGDPUpdater``.

    Returns:
        list of str: E.g. ``"MLP.__call__ (the model's link '/predictor')"``,
        in the links' order; empty for a model without the decorator.
    """
    wrapper_code = _wrapper_code()
    owners = [('the model', master)]
    loss_link = getattr(loss_func, '__self__', loss_func)
    if isinstance(loss_link, chainer.Link) and loss_link is not master:
        owners.append(('loss_func', loss_link))
    found = []
    seen = set()  # a link of the model that loss_func holds: named once
    for owner, root in owners:
        for path, link in root.namedlinks():
            if id(link) in seen:
                continue
            seen.add(id(link))
            where = owner if path == '/' else "{}'s link {!r}".format(owner,
                                                                    path)
            for cls in type(link).__mro__:
                found.extend('{}.{} ({})'.format(cls.__name__, name, where)
                             for name, value in vars(cls).items()
                             if _is_wrapper(value, wrapper_code))
            found.extend('the attribute {!r} of {}'.format(name, where)
                         for name, value in vars(link).items()
                         if _is_wrapper(value, wrapper_code))
    if _is_wrapper(loss_func, wrapper_code):
        found.append('loss_func')
    return found


def describe(methods):
    """The run log's line on what CGDP does with the decorator, and its
    details (see :func:`cgdp_chainer.log.say`).

    Args:
        methods (list of str): From :func:`decorated_methods`, not empty.

    Returns:
        tuple of str: The line and its details.
    """
    return (
        'CGDP @static_graph: {} run{} define-by-run in the replicas'.format(
            ', '.join(methods), 's' if len(methods) == 1 else ''),
        "the replicas (and the first iteration's forwards of the model) run "
        '{} with chainer.config.use_static_graph False, which computes the '
        'same values, so that each chunk of layers leaves as soon as its '
        "gradients are final; the model's own calls outside the updater "
        'keep the static schedule'.format(
            'it' if len(methods) == 1 else 'them'))


def follow_parameters(master):
    """Points the static schedules that the master's own calls built at
    its parameters' current arrays.

    A schedule holds the arrays its parameters had when it last ran and
    takes their current ones only when it runs again. After training the
    master's arrays are private copies again (see
    :meth:`~cgdp_chainer.runtime.transport.buffers.FlatMaster.release`): without
    this, an Evaluator's schedule would keep the shared memory they were
    views of mapped, and Python would complain when freeing it.

    Args:
        master (chainer.Link): The master model.
    """
    for link in master.links():
        manager = vars(link).get('schedule_manager')
        if not isinstance(manager, chainer_static_graph.ScheduleManager):
            continue
        for schedules in manager.schedules.values():
            for schedule in schedules:
                # The forward schedule, then its backward, if built.
                while schedule is not None:
                    for index, (param_index, where) in schedule.param_hooks:
                        if where == 'data':
                            schedule.unique_arrays[index] = \
                                schedule.params_list[param_index].data
                    schedule = schedule.backward_schedule_func
