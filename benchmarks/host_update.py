"""The host's fused reduce and update against a NumPy copy and Chainer's rules.

For each optimizer and number of replica slots, over the parameter shapes of
a network (ResNet-152's 60 M float32 parameters by default, read from the
model definition, never run), in one run:

- ``fused``: one host reduce and update through
  :mod:`cgdp_chainer.runtime.host.host_update` (every backend available here:
  numba and blocked NumPy), all host threads;
- ``chainer``: the unfused path: the accumulator's block reduction into
  ``param.grad``, then Chainer's own update rule, parameter by parameter;
- ``<backend>+g``: the fused update that also writes each block's final
  gradient to ``param.grad`` (one more write stream), as the accumulator
  does when anything may read the gradients after ``update()``; its time
  over the plain fused update's is printed as a ratio per backend (timed
  in turns with the plain one, since the machine may be loaded).

Each prints seconds per iteration (best of ``--repeats`` after one warm-up),
the necessary bytes (each slot read once, the parameter and each state array
read and written once) over that time, and that as a fraction of a NumPy
copy's bandwidth measured in the same run (destination written once before
timing, so that page faults do not count) next to each row, since the
machine may be shared. Targets: >= 0.85 of the copy for
both optimizers with 4 slots; fused Adam >= 4x Chainer's.

``--spellings N`` adds the spellings of real scripts (issue 40): CGDP on a
host-bound model (``--spelling-layers`` of ``Linear(--spelling-units,
--spelling-units)``, 2 ``'@numpy'`` replicas of batch 2), N measured
iterations (median and best) of ``Adam`` with
``chainer.optimizer.WeightDecay`` against ``Adam`` with
``optimizer_hooks.WeightDecay``, and of ``CorrectedMomentumSGD`` against
``MomentumSGD``, each pair in turns; the
ratio's target is <= 1.10 (both fused: the same arrays move).

``--rule-hooks N`` adds a rule hook without a fused form (issue 44):
ChainerCV's ``GradientScaling``, which multiplies ``param.grad`` by a rate
before the update, added as ChainerCV's FCIS and SSD scripts add it (to
every bias) and to every parameter, on the same host-bound model with Adam,
N measured iterations (median and best) of each against the model without
it, in turns; the ratio's target is <= 1.10 (the update stays fused, the
hook runs on the reduced gradient in between).

``--training N`` adds the effect in training: CGDP with Adam on the network
at 64 px, batch 4 per replica, 2 ``'@numpy'`` replicas, N measured
iterations (median, after 2 warm-up ones) with the fused rules and with
Chainer's (``CGDP_HOST_UPDATE=off``), the two updaters' iterations in turns.

Usage::

    python -m benchmarks.host_update [--net resnet152] [--slots 1,2,4]
        [--optimizers momentum_sgd,adam] [--repeats 3] [--threads N]
        [--backends numba,numpy] [--no-chainer] [--no-grads] [--training N]
        [--spellings N] [--rule-hooks N] [--spelling-units 4096]
        [--spelling-layers 4]
        [--no-rules]
"""
import models  # NOQA: first, so cgdp_chainer._compat runs before Chainer

import functools
import os
import statistics
import time

import chainer
import numpy

import cgdp_chainer
from benchmarks import TIMED_REDUCTION
from cgdp_chainer import datasets
from cgdp_chainer.runtime.host import host_update
from experiments import cli

COPY_TARGET = 0.85
ADAM_SPEEDUP_TARGET = 4.0


def int_list(text):
    """argparse type: comma-separated positive integers."""
    values = []
    for part in text.split(','):
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            cli.fail('--slots must be comma-separated positive integers, '
                     'such as 1,2,4; got {!r}'.format(text))
        values.append(value)
    return values


def copy_bandwidth(n_floats, repeats):
    """Bytes per second of ``numpy.copyto`` (read + write), best of
    ``repeats``, the destination faulted in first."""
    src = numpy.ones(n_floats, dtype=numpy.float32)
    dst = numpy.zeros_like(src)
    numpy.copyto(dst, src)
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def network_shapes(net):
    """The parameter shapes of ``net`` (its definition, not run)."""
    return [p.shape for _, p in sorted(models.get_model(net).namedparams())]


def cgdp_updater(net, fused, n_replicas, batch, image_size):
    """CGDP with Adam on ``net``, with the fused rules or Chainer's."""
    model = models.Classifier(models.get_model(net, seed=0))
    optimizer = chainer.optimizers.Adam(alpha=1e-4)
    optimizer.setup(model)
    data = datasets.SyntheticImageNet(batch * n_replicas * 2, image_size,
                                      n_classes=1000, seed=0)
    iterator = chainer.iterators.SerialIterator(data, batch * n_replicas,
                                                shuffle=False)
    saved = os.environ.get(host_update.BACKEND_VARIABLE)
    # The accumulator reads the switch when the updater builds it.
    os.environ[host_update.BACKEND_VARIABLE] = 'auto' if fused else 'off'
    try:
        return cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * n_replicas, chunk_size=4,
            reduction=TIMED_REDUCTION)
    finally:
        if saved is None:
            del os.environ[host_update.BACKEND_VARIABLE]
        else:
            os.environ[host_update.BACKEND_VARIABLE] = saved


def training_seconds(net, iterations, warmup=2, n_replicas=2, batch=4,
                     image_size=64):
    """Median seconds per CGDP iteration, fused and Chainer's rules, their
    iterations taken in turns so that a shared machine's load hits both."""
    times = seconds_in_turns(
        {fused: functools.partial(cgdp_updater, net, fused, n_replicas,
                                  batch, image_size)
         for fused in (True, False)}, iterations, warmup)
    return (statistics.median(times[True]),
            statistics.median(times[False]))


def seconds_in_turns(makers, iterations, warmup=2):
    """Seconds of each measured iteration of each updater that ``makers``
    (key -> callable) build, their iterations taken in turns so that a
    shared machine's load hits each alike."""
    updaters = {}
    times = {key: [] for key in makers}
    try:
        for key, make in makers.items():
            updaters[key] = make()
        for i in range(warmup + iterations):
            for key, updater in updaters.items():
                start = time.perf_counter()
                updater.update()
                if i >= warmup:
                    times[key].append(time.perf_counter() - start)
    finally:
        for updater in updaters.values():
            updater.finalize()
    return times


# Spellings of real scripts against the canonical spelling that computes
# the same (issue 40): (label, optimizer, hooks) pairs, timed in turns.
SPELLINGS = [
    (('Adam + chainer.optimizer.WeightDecay',
      lambda: chainer.optimizers.Adam(alpha=1e-4),
      lambda: [chainer.optimizer.WeightDecay(1e-4)]),
     ('Adam + optimizer_hooks.WeightDecay',
      lambda: chainer.optimizers.Adam(alpha=1e-4),
      lambda: [chainer.optimizer_hooks.WeightDecay(1e-4)])),
    (('CorrectedMomentumSGD',
      lambda: chainer.optimizers.CorrectedMomentumSGD(lr=0.01),
      lambda: []),
     ('MomentumSGD',
      lambda: chainer.optimizers.MomentumSGD(lr=0.01),
      lambda: [])),
]
SPELLING_TARGET = 1.10


def host_bound_updater(make_optimizer, make_hooks, units, layers,
                       n_replicas=2, batch=2, hooked=None):
    """CGDP over ``n_replicas`` '@numpy' replicas of ``layers``
    ``Linear(units, units)`` on a tiny batch: the host's update is most of
    an iteration. ``hooked(name)``: whether that parameter's rule gets
    :func:`scale_gradient` (None: none does)."""
    rng = numpy.random.RandomState(0)
    model = chainer.links.Classifier(chainer.Sequential(*[
        chainer.links.Linear(units, units, initialW=chainer.initializers
                             .Normal(0.01, rng=rng))
        for _ in range(layers)]))
    optimizer = make_optimizer()
    optimizer.setup(model)
    for hook in make_hooks():
        optimizer.add_hook(hook)
    for name, param in model.namedparams():
        if hooked is not None and hooked(name):
            param.update_rule.add_hook(scale_gradient, name='GradientScaling')
    n = batch * n_replicas
    data = chainer.datasets.TupleDataset(
        rng.uniform(-1, 1, (n, units)).astype(numpy.float32),
        rng.randint(0, units, n).astype(numpy.int32))
    iterator = chainer.iterators.SerialIterator(data, n, shuffle=False)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                    ['@numpy'] * n_replicas, chunk_size=1,
                                    reduction=TIMED_REDUCTION)


def spelling_verdicts(iterations, units, layers):
    """Each spelling's iteration time over its canonical twin's, timed in
    turns on a host-bound model, as verdict lines."""
    verdicts = []
    for spelled, canonical in SPELLINGS:
        times = seconds_in_turns(
            {label: functools.partial(host_bound_updater, make, hooks, units,
                                      layers)
             for label, make, hooks in (spelled, canonical)}, iterations)
        ours, theirs = times[spelled[0]], times[canonical[0]]
        verdicts.append(
            '{} layers of Linear({u}, {u}), 2 @numpy replicas: {} {:.4f} '
            's/iteration (best {:.4f}), {} {:.4f} s (best {:.4f}); ratio '
            '{:.2f} (best: {:.2f}; target <= {:.2f})'.format(
                layers, spelled[0], statistics.median(ours), min(ours),
                canonical[0], statistics.median(theirs), min(theirs),
                statistics.median(ours) / statistics.median(theirs),
                min(ours) / min(theirs), SPELLING_TARGET, u=units))
    return verdicts


def scale_gradient(rule, param):
    """What ChainerCV's ``GradientScaling(3)`` does to a parameter's
    gradient before its update (ChainerCV is not a dependency)."""
    param.grad *= param.grad.dtype.type(3)


# Where the rule hook goes: label -> which parameters (by name) get it.
RULE_HOOK_CASES = (
    ('GradientScaling on every bias', lambda name: name.endswith('/b')),
    ('GradientScaling on every parameter', lambda name: True),
)


def rule_hook_verdicts(iterations, units, layers):
    """Each rule-hook case's iteration time over the unhooked model's,
    all timed in turns on the host-bound model with Adam."""
    adam = functools.partial(chainer.optimizers.Adam, alpha=1e-4)
    cases = dict(RULE_HOOK_CASES)
    cases['no rule hook'] = None
    times = seconds_in_turns(
        {label: functools.partial(host_bound_updater, adam, list, units,
                                  layers, hooked=hooked)
         for label, hooked in cases.items()}, iterations)
    plain = times['no rule hook']
    verdicts = []
    for label, _ in RULE_HOOK_CASES:
        ours = times[label]
        verdicts.append(
            '{} layers of Linear({u}, {u}), Adam, 2 @numpy replicas: {} '
            '{:.4f} s/iteration (best {:.4f}), no rule hook {:.4f} s (best '
            '{:.4f}); ratio {:.2f} (best: {:.2f}; target <= {:.2f})'.format(
                layers, label, statistics.median(ours), min(ours),
                statistics.median(plain), min(plain),
                statistics.median(ours) / statistics.median(plain),
                min(ours) / min(plain), SPELLING_TARGET, u=units))
    return verdicts


def parse_arguments(argv):
    """The command line, checked; exits with 2 on bad input."""
    parser = cli.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--net', default='resnet152', type=cli.net_name)
    parser.add_argument('--slots', default=[1, 2, 4], type=int_list)
    parser.add_argument(
        '--optimizers', default=['momentum_sgd', 'adam'],
        type=cli.name_list(sorted(host_update.OPTIMIZERS), 'optimizer'))
    parser.add_argument('--repeats', default=3, type=cli.positive_int)
    parser.add_argument('--threads', default=None, type=cli.positive_int,
                        help='host threads (default: the CPU count)')
    parser.add_argument(
        '--backends', default=None,
        type=cli.name_list(host_update.BACKENDS[1:], 'backend'),
        help='default: numba (where it imports) and numpy')
    parser.add_argument('--no-chainer', action='store_true',
                        help="skip Chainer's own path")
    parser.add_argument('--no-grads', action='store_true',
                        help='skip the fused update that writes param.grad')
    parser.add_argument('--training', default=0, type=cli.non_negative_int,
                        help='measured CGDP training iterations with Adam '
                        '(0: skip)')
    parser.add_argument('--spellings', default=0, type=cli.non_negative_int,
                        help='measured CGDP iterations of each spelling '
                        'of a script against its canonical twin on a '
                        'host-bound model (0: skip)')
    parser.add_argument('--rule-hooks', default=0,
                        type=cli.non_negative_int,
                        help='measured CGDP iterations of the host-bound '
                        'model with a rule hook without a fused form '
                        '(GradientScaling) against it without (0: skip)')
    parser.add_argument('--spelling-units', default=4096,
                        type=cli.positive_int,
                        help="units of the host-bound model's layers")
    parser.add_argument('--spelling-layers', default=4,
                        type=cli.positive_int,
                        help="layers of the host-bound model")
    parser.add_argument('--no-rules', action='store_true',
                        help='skip the per-optimizer update rows')
    args = parser.parse_args(argv)
    args.backends = args.backends or (
        ['numba', 'numpy'] if host_update.numba_available() else ['numpy'])
    if 'numba' in args.backends and not host_update.numba_available():
        cli.fail('--backends numba: numba does not import here; '
                 'choose numpy')
    return args


def measure_optimizer(name, args, shapes, threads):
    """Prints one optimizer's rows (every slot count and path, each beside a
    copy measured next to it) and returns its verdict lines."""
    backends = args.backends
    n = sum(int(numpy.prod(s)) for s in shapes)
    verdicts = []
    bench = {}
    try:
        bench[backends[0]] = host_update.FusedBench(
            name, max(args.slots), shapes, n_threads=threads,
            backend=backends[0])
        # One set of arrays serves every backend: only the update differs.
        for backend in backends[1:]:
            bench[backend] = bench[backends[0]].with_backend(backend)
        for n_slots in args.slots:
            times, copies = time_paths(bench, args, n, n_slots)
            needed = host_update.necessary_bytes(name, n, n_slots)
            for path, seconds in times.items():
                rate = needed / seconds
                print('{:<13} {:>5} {:<8} {:>9.4f} {:>8.2f} {:>9.2f} '
                      '{:>10.2f}'.format(
                          name, n_slots, path, seconds, rate / 1e9,
                          rate / copies[path], copies[path] / 1e9))
            for backend in backends:
                if backend + '+g' in times:
                    verdicts.append(
                        '{} {} slots {}: writing param.grad costs {:.2f}x '
                        'the fused update'.format(
                            name, n_slots, backend,
                            times[backend + '+g'] / times[backend]))
            best = min(backends, key=times.get)
            if n_slots == 4:
                verdicts.append(
                    '{} 4 slots: {} {:.2f} of copy (target >= {})'.format(
                        name, best, needed / times[best] / copies[best],
                        COPY_TARGET))
            if name == 'adam' and 'chainer' in times:
                verdicts.append(
                    'adam {} slots: fused ({}) {:.1f}x Chainer (target '
                    '>= {}x)'.format(n_slots, best,
                                     times['chainer'] / times[best],
                                     ADAM_SPEEDUP_TARGET))
    finally:
        for b in bench.values():
            b.close()
    return verdicts


def time_paths(bench, args, n, n_slots):
    """Best seconds of each path at ``n_slots``, and the copy bandwidth
    measured just before it: ``(times, copies)`` by path."""
    times, copies = {}, {}
    for backend in args.backends:
        copies[backend] = copy_bandwidth(n, args.repeats)
        b = bench[backend]
        if args.no_grads:
            times[backend] = b.best_seconds(args.repeats, n_slots=n_slots)
            continue
        # In turns, so that a load that comes and goes hits both alike.
        plain, written = [], []
        for _ in range(args.repeats):
            plain.append(b.best_seconds(1, n_slots=n_slots))
            written.append(b.best_seconds(
                1, step=b.fused_step_writing_grads, n_slots=n_slots))
        times[backend], times[backend + '+g'] = min(plain), min(written)
        copies[backend + '+g'] = copies[backend]
    if not args.no_chainer:
        b0 = bench[args.backends[0]]
        copies['chainer'] = copy_bandwidth(n, args.repeats)
        times['chainer'] = b0.best_seconds(
            args.repeats, step=b0.chainer_step, n_slots=n_slots)
    return times, copies


def main(argv=None):
    args = parse_arguments(argv)
    shapes = network_shapes(args.net)
    n = sum(int(numpy.prod(s)) for s in shapes)
    threads = args.threads or os.cpu_count()
    print('{}: {:.1f} M float32 parameters in {} arrays; {} host threads; '
          'best of {}'.format(args.net, n / 1e6, len(shapes), threads,
                              args.repeats))
    # The machine may be shared: each row's copy is measured next to it.
    print('{:<13} {:>5} {:<8} {:>9} {:>8} {:>9} {:>10}'.format(
        'optimizer', 'slots', 'path', 's/iter', 'GB/s', 'of copy',
        'copy GB/s'))
    verdicts = []
    for name in [] if args.no_rules else args.optimizers:
        verdicts += measure_optimizer(name, args, shapes, threads)
    if args.spellings:
        verdicts += spelling_verdicts(args.spellings, args.spelling_units,
                                      args.spelling_layers)
    if args.rule_hooks:
        verdicts += rule_hook_verdicts(args.rule_hooks, args.spelling_units,
                                       args.spelling_layers)
    if args.training:
        fused, plain = training_seconds(args.net, args.training)
        verdicts.append(
            'training {}, Adam, 64 px, 2 @numpy replicas, batch 4 each: '
            'fused {:.3f} s/iteration, Chainer\'s rules {:.3f} s; '
            'ratio {:.2f}'.format(args.net, fused, plain, fused / plain))
    for line in verdicts:
        print(line)


if __name__ == '__main__':
    main()
