"""CGDP runtime benchmarks, each comparison measured side by side in one run.

    python -m benchmarks.runtime [--net resnet152] [--image-size 64]
        [--batch 4] [--iterations 5] [--warmup 2] [--rounds 2]
        [--parts all | pairs,four,one,forms,startup,host,short,hostwork,
                       ranks,shortranks]

Prints ratios (machines here are shared and noisy, so only ratios from one
run mean anything), each with its target or measured limit:

- ``pairs``: two '@numpy' replicas: CGDP with worker processes and with
  threads, ParallelUpdater, and the limit: two StandardUpdater processes
  with one BLAS thread each, side by side, each on one replica's batch.
  Also the exposed sync per iteration from the timeline.
- ``four``: four replicas: CGDP (processes) over ParallelUpdater.
- ``one``: one replica: CGDP (processes) over StandardUpdater.
- ``forms``: two replicas, CGDP (processes) in each call form: one
  iterator split over a list of devices, over a dict of devices
  (ParallelUpdater's form) and one iterator per device
  (MultiprocessParallelUpdater's form), each device with the same
  examples per iteration; the forms should cost alike.
- ``startup``: process against thread workers: start-up (the first
  ``update()``), the chunk signal round trip, the sub-batch hand-over
  through shared memory, and peak memory of all processes (PSS, which
  counts shared memory once).
- ``host``: the host accumulator alone: reduce 4 slots and apply
  MomentumSGD over the network's parameters, as a fraction of a NumPy
  copy's bandwidth measured in the same run.
- ``short``: the short-iteration regime of GPUs, where per-array host work
  shows: ``models.examples:many_arrays`` (604 parameter arrays, little
  compute; its own net whatever ``--net`` says) at 8 px, CGDP with 1 and 2
  process replicas against StandardUpdater and the 2-process limit, each
  timed three ways: plain ``update()`` calls, inside ``unattended()``, and
  inside a Trainer's loop with LogReport only.
- ``hostwork``: the per-iteration host work that grows with the parameter
  count, each part timed alone on the short regime's net and on ``--net``,
  for 2 process replicas: the structure check and the identity check of
  the master's arrays (both outside a Trainer's loop only), the
  BatchNormalization statistics' hand-over (outside a Trainer's loop), the
  comparison of the persistent values, and the chunk signals (a round trip
  per chunk).
- ``ranks``: one process per device, 2 ranks x 1 '@numpy' device under
  ``mpiexec`` (cgdp_chainer.mpi.find_mpiexec's), each rank with one BLAS
  thread and ``--batch`` examples, the same StandardUpdater script (see
  :mod:`benchmarks.mpi_ranks`) with CGDP's
  ``create_multi_node_optimizer`` (the ranks sharing one host, and with
  ``node_host=False`` a host each) and with ChainerMN's (naive
  communicator), against the limit; an iteration of a job takes its
  slowest rank's time. ``--net`` at ``--image-size`` (the defaults are the
  1-second regime; ``--net`` also takes ``module:callable``).
- ``shortranks``: ``ranks`` on the short regime's net at its image side.
"""
import copy
import collections
import json
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

from benchmarks import host_update as host_update_benchmark
from benchmarks import TIMED_REDUCTION

import models
import chainer
from chainer.training import updaters
import numpy

import cgdp_chainer
from cgdp_chainer.runtime.host import accumulator as accumulator_module
from cgdp_chainer.runtime.host import master as master_module
from cgdp_chainer import blas
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer import datasets
from cgdp_chainer.runtime.replica import readiness
from cgdp_chainer.runtime.transport import shared
from cgdp_chainer.runtime.transport import transfer as transfer_module
from cgdp_chainer.runtime.workers import worker as worker_module

PARTS = ('pairs', 'four', 'one', 'forms', 'startup', 'host', 'short',
         'hostwork', 'ranks', 'shortranks')
# The parts that build their own nets (--net's is built only if used).
OWN_NET_PARTS = {'short', 'hostwork', 'ranks', 'shortranks'}

# The short-iteration regime's net and image side (see ``short``).
SHORT_NET = 'models.examples:many_arrays'
SHORT_IMAGE_SIZE = 8
# How the short regime's updates are driven.
DRIVES = ('plain', 'unattended', 'trainer')

# The ``ranks`` parts: ranks of an MPI job (one '@numpy' device each), the
# module each rank runs, the multi-node optimizers it times and the goals
# of CGDP's optimizer against the limit (the 1-second regime, the short).
N_RANKS = 2
RANKS_MODULE = 'benchmarks.mpi_ranks'
RANKS_OPTIMIZERS = ('cgdp', 'cgdp-rank-hosts', 'chainermn')
RANKS_GOALS = {'ranks': 1.02, 'shortranks': 1.05}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _iterator(n_devices, batch, image_size):
    data = datasets.SyntheticImageNet(
        batch * n_devices * 2, image_size, n_classes=1000, seed=0)
    return chainer.iterators.SerialIterator(data, batch * n_devices,
                                            shuffle=False)


def _updater(mode, model, n_devices, batch, image_size, timeline=None):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    iterator = _iterator(n_devices, batch, image_size)
    if mode == 'standard':
        return updaters.StandardUpdater(iterator, optimizer)
    if mode == 'parallel':
        devices = {'main': '@numpy'}
        devices.update({'replica{}'.format(i): '@numpy'
                        for i in range(1, n_devices)})
        return updaters.ParallelUpdater(iterator, optimizer, devices=devices)
    workers = 'thread' if mode == 'cgdp-thread' else 'process'
    devices = ['@numpy'] * n_devices
    if mode == 'cgdp-dict':
        devices = dict(main='@numpy', **{'replica{}'.format(i): '@numpy'
                                         for i in range(1, n_devices)})
    if mode == 'cgdp-iterators':
        # One iterator per device, each with one replica's examples.
        iterator = [chainer.iterators.SerialIterator(
            datasets.SyntheticImageNet(batch * 2, image_size,
                                       n_classes=1000, seed=index),
            batch, shuffle=False) for index in range(n_devices)]
    return cgdp_chainer.CGDPUpdater(iterator, optimizer, devices,
                                    timeline=timeline, workers=workers,
                                    reduction=TIMED_REDUCTION)


def _iteration_times(updater, iterations, warmup):
    times = []
    try:
        for i in range(warmup + iterations):
            start = time.perf_counter()
            updater.update()
            if i >= warmup:
                times.append(time.perf_counter() - start)
    finally:
        updater.finalize()
    return times


def _standard_alone(net, batch, image_size, iterations, warmup, barrier,
                    results):
    """One StandardUpdater with one BLAS thread (runs in its own process,
    whose allocator keeps freed memory as CGDP's workers' does: importing
    this module imports experiments.cli, which sets it)."""
    with blas.BlasLimit(1):
        model = models.Classifier(models.get_model(net, seed=0))
        updater = _updater('standard', model, 1, batch, image_size)
        barrier.wait()
        results.put(_iteration_times(updater, iterations, warmup))


def limit_seconds(args, n_processes=2):
    """Median iteration time of ``n_processes`` StandardUpdater processes
    with one BLAS thread each, side by side: what N replicas with no
    interpreter to share and no sync would take."""
    context = multiprocessing.get_context('spawn')
    barrier = context.Barrier(n_processes)
    results = context.Queue()
    processes = [context.Process(
        target=_standard_alone,
        args=(args.net, args.batch, args.image_size, args.iterations,
              args.warmup, barrier, results)) for _ in range(n_processes)]
    for process in processes:
        process.start()
    times = []
    for _ in processes:
        times += results.get(timeout=1800)
    for process in processes:
        process.join()
    return statistics.median(times)


def compare(base, modes, n_devices, args, with_limit=False):
    """Alternates the modes round by round so that load changes on the
    machine hit all alike; returns median seconds per mode (and
    ``'limit'``) and the CGDP timelines."""
    times = {mode: [] for mode in modes}
    timelines = {}
    limits = []
    for _ in range(args.rounds):
        for mode in modes:
            timeline = cgdp_chainer.Timeline() if mode == 'cgdp' else None
            updater = _updater(mode, copy.deepcopy(base), n_devices,
                               args.batch, args.image_size, timeline)
            times[mode] += _iteration_times(updater, args.iterations,
                                            args.warmup)
            if timeline is not None:
                timelines[mode] = timeline
        if with_limit:
            limits.append(limit_seconds(args, n_devices))
    medians = {m: statistics.median(t) for m, t in times.items()}
    if with_limit:
        medians['limit'] = statistics.median(limits)
    return medians, timelines


class _StampingStop(object):
    """A Trainer's stop trigger that stamps the time of each check: the
    loop checks it before every update, so consecutive stamps bound one
    iteration with its extensions (a trigger is no extension, so the
    updater does not count it among those that may read the model)."""

    def __init__(self, iterations):
        self.iterations = iterations
        self.stamps = []

    def __call__(self, trainer):
        self.stamps.append(time.perf_counter())
        return trainer.updater.iteration >= self.iterations


def driven_times(updater, iterations, warmup, drive):
    """Seconds of each measured update of ``updater``, driven by plain
    ``update()`` calls, inside ``unattended()`` (CGDP only) or by a
    Trainer whose only extension is LogReport.

    Args:
        updater: The updater; finalized at the end.
        iterations (int): Measured updates.
        warmup (int): Updates before them, not measured.
        drive (str): One of :data:`DRIVES`.
    """
    if drive == 'plain':
        return _iteration_times(updater, iterations, warmup)
    if drive == 'unattended':
        with updater.unattended():
            return _iteration_times(updater, iterations, warmup)
    stop = _StampingStop(warmup + iterations)
    with tempfile.TemporaryDirectory() as out:
        trainer = chainer.training.Trainer(updater, stop, out=out)
        trainer.extend(chainer.training.extensions.LogReport(
            trigger=(10 ** 9, 'iteration')))
        trainer.run()
    stamps = stop.stamps[warmup:]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def short_regime(args):
    """Median seconds per iteration of the short-iteration regime: per
    drive, StandardUpdater and CGDP with 1 and 2 process replicas, and the
    2-process limit; alternated round by round."""
    short = copy.copy(args)
    short.net, short.image_size = SHORT_NET, SHORT_IMAGE_SIZE
    base = models.Classifier(models.get_model(SHORT_NET, seed=0))
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for drive in DRIVES:
            if drive != 'unattended':
                updater = _updater('standard', copy.deepcopy(base), 1,
                                   args.batch, SHORT_IMAGE_SIZE)
                times['standard', drive] += driven_times(
                    updater, args.iterations, args.warmup, drive)
            for n_devices in (1, 2):
                updater = _updater('cgdp', copy.deepcopy(base), n_devices,
                                   args.batch, SHORT_IMAGE_SIZE)
                times['cgdp{}'.format(n_devices), drive] += driven_times(
                    updater, args.iterations, args.warmup, drive)
        times['limit', 'plain'].append(limit_seconds(short, 2))
    return {key: statistics.median(values) for key, values in times.items()}


def print_short_regime(medians):
    """Prints the short regime's ratios, with the issue's goals."""
    limit = medians['limit', 'plain']
    print('[short] {} at {} px: limit (2 StandardUpdater processes side by '
          'side) {:.4f} s'.format(SHORT_NET, SHORT_IMAGE_SIZE, limit))
    for drive in DRIVES:
        standard = medians.get(('standard', drive),
                               medians['standard', 'plain'])
        one, two = medians['cgdp1', drive], medians['cgdp2', drive]
        print('[short] {}: StandardUpdater {:.4f} s, CGDP 1 replica {:.4f} '
              's, 2 replicas {:.4f} s; 1 replica / Standard = {:.3f} (goal '
              '<= 1.00), 2 replicas / limit = {:.3f} (goal <= 1.05)'.format(
                  drive, standard, one, two, one / standard, two / limit),
              flush=True)


def mpiexec_command(n_ranks, module, *args):
    """``mpiexec -launcher fork -n N python -m module args`` with the
    project's mpiexec (:func:`cgdp_chainer.mpi.find_mpiexec`)."""
    mpiexec = cgdp_mpi.find_mpiexec()
    if mpiexec is None:
        raise RuntimeError(
            '{}: the ranks parts need the MPI stack (pip install -e '
            '.[mpi])'.format(cgdp_mpi.no_mpiexec_words()))
    return [mpiexec, '-launcher', 'fork', '-n', str(n_ranks),
            sys.executable, '-m', module] + [str(arg) for arg in args]


def ranks_job_seconds(optimizer, args, n_ranks=N_RANKS):
    """Runs one MPI job of :mod:`benchmarks.mpi_ranks`.

    Args:
        optimizer (str): One of :data:`RANKS_OPTIMIZERS`.
        args (argparse.Namespace): ``net``, ``image_size``, ``batch`` (per
            rank), ``iterations`` and ``warmup``.
        n_ranks (int): Ranks of the job.

    Returns:
        list of float: Seconds of each measured iteration (its slowest
        rank's).

    Raises:
        RuntimeError: The job failed or printed no result.
    """
    command = mpiexec_command(
        n_ranks, RANKS_MODULE, '--optimizer', optimizer, '--net', args.net,
        '--image-size', args.image_size, '--batch', args.batch,
        '--iterations', args.iterations, '--warmup', args.warmup)
    environment = dict(os.environ, PYTHONWARNINGS='ignore')
    job = subprocess.run(command, cwd=REPO_ROOT, env=environment,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=3600)
    results = [json.loads(line) for line in job.stdout.splitlines()
               if line.startswith('{"optimizer"')]
    if job.returncode != 0 or len(results) != 1:
        raise RuntimeError('{} ended with status {} and {} result lines; '
                           'its output:\n{}'.format(
                               ' '.join(command), job.returncode,
                               len(results), job.stdout[-4000:]))
    return results[0]['seconds']


def ranks_regime(args, net, image_size):
    """Median seconds per iteration of ``N_RANKS`` ranks with each
    multi-node optimizer and of the limit, on ``net`` at ``image_size``;
    alternated round by round, each job a fresh ``mpiexec``.

    Returns:
        dict: ``'cgdp'``, ``'chainermn'`` and ``'limit'`` to seconds.
    """
    regime = copy.copy(args)
    regime.net, regime.image_size = net, image_size
    times = {optimizer: [] for optimizer in RANKS_OPTIMIZERS}
    limits = []
    for _ in range(args.rounds):
        for optimizer in RANKS_OPTIMIZERS:
            times[optimizer] += ranks_job_seconds(optimizer, regime)
        limits.append(limit_seconds(regime, N_RANKS))
    medians = {optimizer: statistics.median(seconds)
               for optimizer, seconds in times.items()}
    medians['limit'] = statistics.median(limits)
    return medians


def print_ranks(part, args):
    """Runs and prints the ``ranks`` or ``shortranks`` part: seconds per
    iteration and the ratios, with the issue's goals."""
    net, image_size = (args.net, args.image_size) if part == 'ranks' \
        else (SHORT_NET, SHORT_IMAGE_SIZE)
    medians = ranks_regime(args, net, image_size)
    cgdp, chainermn, limit = (medians['cgdp'], medians['chainermn'],
                              medians['limit'])
    rows = [
        ('CGDP create_multi_node_optimizer', '{:.4f} s'.format(cgdp)),
        ('CGDP, a host per rank (node_host=False)',
         '{:.4f} s'.format(medians['cgdp-rank-hosts'])),
        ('ChainerMN create_multi_node_optimizer (naive)',
         '{:.4f} s'.format(chainermn)),
        ('limit ({} StandardUpdater processes)'.format(N_RANKS),
         '{:.4f} s'.format(limit)),
        ('CGDP / limit', '{:.3f} (goal <= {:.2f})'.format(
            cgdp / limit, RANKS_GOALS[part])),
        ('CGDP / ChainerMN', '{:.3f} (goal < 1.00)'.format(cgdp / chainermn)),
        ('CGDP / CGDP with a host per rank', '{:.3f}'.format(
            cgdp / medians['cgdp-rank-hosts'])),
        ('ChainerMN / limit', '{:.3f}'.format(chainermn / limit))]
    print('[{}] {} at {} px, {} ranks x 1 \'@numpy\' device, batch {} per '
          'rank, 1 BLAS thread each; median seconds per iteration:'.format(
              part, net, image_size, N_RANKS, args.batch))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print('[{}]   {}  {}'.format(part, label.ljust(width), value))
    sys.stdout.flush()


def _best_seconds(func, repeats=20):
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def _statistics_hand_over(master, record):
    """What an update outside a Trainer's loop does with replica 0's
    statistics: saved there, through the pipe, loaded and remembered."""
    values = pickle.loads(pickle.dumps(worker_module.save_persistents(
        master), protocol=pickle.HIGHEST_PROTOCOL))
    worker_module.load_persistents(master, values,
                                   chainer.get_device('@numpy'))
    record.remember(values)


def host_work(net, args, n_replicas=2):
    """Seconds per iteration of each part of the host work that grows
    with the parameter count (see ``hostwork``), for ``n_replicas``
    process replicas, and the plain StandardUpdater's iteration for
    scale."""
    image_size = SHORT_IMAGE_SIZE if net == SHORT_NET else args.image_size
    base = models.Classifier(models.get_model(net, seed=0))
    master = copy.deepcopy(base)
    params = collections.OrderedDict(master.namedparams())
    structure = master_module.MasterStructure(master)
    layout = buffers.FlatLayout.of_arrays(
        {name: p.array for name, p in params.items()})
    shared_master = buffers.FlatMaster(params, layout,
                                       buffers.host_buffer(layout.capacity))
    record = master_module.PersistentsRecord(master)
    names = list(params)
    parts = collections.OrderedDict()
    # Both run only where code other than the updater may have run since
    # the last update (outside a Trainer's loop, or after an extension
    # that may write the model); a loop of known extensions skips them.
    parts['structure check (outside a loop)'] = _best_seconds(
        lambda: structure.check(master))
    parts['identity checks (outside a loop)'] = _best_seconds(
        lambda: shared_master.sync(names))
    parts['statistics hand-over (outside a loop)'] = _best_seconds(
        lambda: _statistics_hand_over(master, record))
    parts['persistents comparison (outside a loop)'] = _best_seconds(
        record.changed)
    shared_master.release()
    updater = _updater('cgdp', copy.deepcopy(base), n_replicas, args.batch,
                       image_size)
    try:
        for _ in range(2):
            updater.update()
        round_trip = updater.signal_round_trip_seconds(repeats=50)
        # A round trip per chunk bounds the one-way signals from above;
        # they overlap the backward.
        parts['chunk signals (bound)'] = \
            round_trip * updater.chunk_plan.n_chunks
        n_chunks = updater.chunk_plan.n_chunks
    finally:
        updater.finalize()
    standard = statistics.median(driven_times(
        _updater('standard', copy.deepcopy(base), 1, args.batch,
                 image_size), args.iterations, args.warmup, 'plain'))
    return parts, len(names), n_chunks, standard


def print_host_work(net, args):
    """Prints :func:`host_work`'s parts for ``net``."""
    parts, n_arrays, n_chunks, standard = host_work(net, args)
    print('[hostwork] {}: {} parameter arrays, {} chunks; StandardUpdater '
          '{:.4f} s per iteration'.format(net, n_arrays, n_chunks,
                                          standard))
    for part, seconds in parts.items():
        print('[hostwork]   {}: {:.3f} ms per iteration ({:.1f}% of '
              'StandardUpdater\'s iteration)'.format(
                  part, seconds * 1e3, 100 * seconds / standard), flush=True)


def exposed_sync(timeline, warmup):
    """Median exposed sync per measured iteration, and the median time the
    last chunk's sync (reduce + update + publish of chunk 0) takes."""
    summaries = timeline.iteration_summaries[warmup:]
    exposed = statistics.median(s['exposed_sync'] for s in summaries)
    per_iteration = {}
    for e in timeline.events:
        if e.device == 'host' and e.chunk == 0 and e.iteration >= warmup \
                and e.kind in ('reduce', 'update', 'h2d'):
            per_iteration[e.iteration] = per_iteration.get(
                e.iteration, 0.0) + (e.end - e.start)
    return exposed, statistics.median(per_iteration.values())


def _pss_bytes(pids):
    """Proportional set size of the processes: shared pages counted once."""
    total = 0
    for pid in pids:
        try:
            with open('/proc/{}/smaps_rollup'.format(pid)) as f:
                for line in f:
                    if line.startswith('Pss:'):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


class PeakMemory(object):
    """Samples the PSS of this process and its children in a thread."""

    def __init__(self, interval=0.1):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            pids = [os.getpid()] + [p.pid for p in
                                    multiprocessing.active_children()]
            self.peak = max(self.peak, _pss_bytes(pids))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def startup_and_signals(base, args):
    """Per worker kind: first update, a later update, the signal round
    trip and peak memory; and the batch hand-over through shared memory."""
    rows = {}
    for mode in ('cgdp', 'cgdp-thread'):
        with PeakMemory() as memory:
            updater = _updater(mode, copy.deepcopy(base), 2, args.batch,
                               args.image_size)
            start = time.perf_counter()
            updater.update()
            first = time.perf_counter() - start
            later = []
            for _ in range(max(2, args.iterations)):
                start = time.perf_counter()
                updater.update()
                later.append(time.perf_counter() - start)
            round_trip = updater.signal_round_trip_seconds(repeats=200)
            updater.finalize()
        rows[mode] = (first, statistics.median(later), round_trip,
                      memory.peak)
    iterator = _iterator(2, args.batch, args.image_size)
    batch = iterator.next()
    host = chainer.get_device('@numpy')
    inputs = [chainer.dataset.concat_examples(batch[i::2], host)
              for i in range(2)]
    buffers = [shared.BatchBuffer() for _ in inputs]
    readers = [shared.BatchReader() for _ in inputs]
    hand_over = []
    try:
        for _ in range(20):
            start = time.perf_counter()
            for buffer, reader, in_arrays in zip(buffers, readers, inputs):
                reader.read(buffer.write(in_arrays))
            hand_over.append(time.perf_counter() - start)
    finally:
        for reader, buffer in zip(readers, buffers):
            reader.close()
            buffer.close()
    return rows, statistics.median(hand_over), sum(
        sum(a.nbytes for a in x) for x in inputs)


def accumulator_bandwidth(model, n_slots=4, repeats=3):
    """Times the real HostAccumulator over ``n_slots`` CPU replicas' worth
    of gradients, all chunks at once, MomentumSGD."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    master_params = dict(model.namedparams())
    layout = buffers.FlatLayout.of_arrays(
        {name: p.array for name, p in master_params.items()})
    master = buffers.FlatMaster(master_params, layout,
                                buffers.host_buffer(layout.capacity))
    rng = numpy.random.RandomState(0)
    transfers = []
    for _ in range(n_slots):
        replica_params = {
            name: chainer.Parameter(p.array.copy()) for name, p in
            master_params.items()}
        for p in replica_params.values():
            p.grad = rng.standard_normal(p.shape).astype(p.dtype)
        transfer = transfer_module.HostResidentTransfer(master,
                                                        replica_params)
        transfer.send_grads(list(master_params))
        transfers.append(transfer)
    # One chunk per layer (a link that directly owns parameters), as the
    # runtime's chunk_size=1.
    layers = collections.OrderedDict()
    for name in master_params:
        layers.setdefault(readiness.owner_of(name), []).append(name)
    names = list(layers.values())
    failures = accumulator_module.FailureBox()
    acc = accumulator_module.HostAccumulator(
        optimizer, transfers, names, 'mean', failures, master)
    best = float('inf')
    try:
        for iteration in range(repeats + 1):
            start = time.perf_counter()
            acc.start_iteration(iteration, [1.0 / n_slots] * n_slots)
            for chunk in reversed(range(len(names))):
                for device in range(n_slots):
                    acc.deliver(device, chunk, None)
            acc.wait()
            if failures.failed:
                raise failures.error
            if iteration > 0:  # the first one allocates optimizer state
                best = min(best, time.perf_counter() - start)
    finally:
        acc.close()
    n_floats = sum(p.size for p in master_params.values())
    # Logical traffic per element: read n slots, write the sum; MomentumSGD
    # reads grad, velocity and weight and writes velocity and weight.
    bytes_moved = 4 * n_floats * ((n_slots + 1) + 5)
    return bytes_moved / best, best, n_floats


def print_pairs(base, args):
    """Prints the ``pairs`` comparison: two replicas, every runtime and the
    limit, and the exposed sync."""
    medians, timelines = compare(
        base, ['parallel', 'cgdp', 'cgdp-thread'], 2, args,
        with_limit=True)
    parallel = medians['parallel']
    print('[pairs] 2 replicas: ParallelUpdater {:.3f} s, CGDP processes '
          '{:.3f} s, CGDP threads {:.3f} s, limit (2 StandardUpdater '
          'processes, 1 BLAS thread each, side by side) {:.3f} s'.format(
              parallel, medians['cgdp'], medians['cgdp-thread'],
              medians['limit']))
    print('[pairs] CGDP processes / Parallel = {:.3f} (target <= 0.70); '
          'threads / Parallel = {:.3f}; limit / Parallel = {:.3f}; '
          'CGDP processes / limit = {:.3f} (target <= 1.15)'.format(
              medians['cgdp'] / parallel,
              medians['cgdp-thread'] / parallel,
              medians['limit'] / parallel,
              medians['cgdp'] / medians['limit']), flush=True)
    exposed, alone = exposed_sync(timelines['cgdp'], args.warmup)
    print('[pairs] exposed sync per iteration {:.4f} s; the last '
          "chunk's sync alone {:.4f} s".format(exposed, alone),
          flush=True)


def build_parser():
    parser = cli.ArgumentParser(prog='python -m benchmarks.runtime',
                                description=__doc__.splitlines()[0])
    parser.add_argument('--net', default='resnet152', type=cli.net_spec)
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--batch', type=cli.positive_int, default=4)
    parser.add_argument('--iterations', type=cli.positive_int, default=5)
    parser.add_argument('--warmup', type=cli.non_negative_int, default=2)
    parser.add_argument('--rounds', type=cli.positive_int, default=2)
    parser.add_argument('--parts', type=cli.name_list(PARTS, 'part', 'all'),
                        default=list(PARTS),
                        help='all, or a comma-separated subset of ' +
                             ','.join(PARTS))
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    cli.check_image_size(args.net, args.image_size)
    parts = args.parts
    base = None if set(parts) <= OWN_NET_PARTS else \
        models.Classifier(models.get_model(args.net, seed=0))
    print('{} at {} px, batch {} per replica, {} measured iterations x {} '
          'rounds (median), {} cores'.format(
              args.net, args.image_size, args.batch, args.iterations,
              args.rounds, blas.cpu_cores()), flush=True)
    if 'pairs' in parts:
        print_pairs(base, args)
    if 'four' in parts:
        medians, _ = compare(base, ['parallel', 'cgdp'], 4, args)
        print('[four] 4 replicas: ParallelUpdater {:.3f} s, CGDP {:.3f} s, '
              'CGDP/Parallel = {:.3f}'.format(
                  medians['parallel'], medians['cgdp'],
                  medians['cgdp'] / medians['parallel']), flush=True)
    if 'one' in parts:
        medians, _ = compare(base, ['standard', 'cgdp'], 1, args)
        print('[one] 1 replica: StandardUpdater {:.3f} s, CGDP {:.3f} s, '
              'CGDP/Standard = {:.3f} (target <= 1.05)'.format(
                  medians['standard'], medians['cgdp'],
                  medians['cgdp'] / medians['standard']), flush=True)
    if 'forms' in parts:
        medians, _ = compare(
            base, ['cgdp', 'cgdp-dict', 'cgdp-iterators'], 2, args)
        print('[forms] 2 replicas, CGDP processes: one iterator over a list '
              'of devices {:.3f} s, over a dict of devices {:.3f} s, one '
              'iterator per device {:.3f} s; dict / list = {:.3f}, '
              'iterators / list = {:.3f}'.format(
                  medians['cgdp'], medians['cgdp-dict'],
                  medians['cgdp-iterators'],
                  medians['cgdp-dict'] / medians['cgdp'],
                  medians['cgdp-iterators'] / medians['cgdp']), flush=True)
    if 'startup' in parts:
        rows, hand_over, batch_bytes = startup_and_signals(base, args)
        for mode, label in (('cgdp', 'processes'), ('cgdp-thread',
                                                    'threads')):
            first, later, round_trip, peak = rows[mode]
            print('[startup] {}: first update {:.2f} s, later {:.3f} s; '
                  'signal round trip {}; peak memory (PSS, all processes) '
                  '{:.0f} MB'.format(
                      label, first, later,
                      '-' if round_trip is None else
                      '{:.0f} us'.format(round_trip * 1e6), peak / 1e6))
        print('[startup] sub-batch hand-over through shared memory: {:.2f} '
              'ms per iteration for 2 replicas ({:.1f} MB)'.format(
                  hand_over * 1e3, batch_bytes / 1e6), flush=True)
    if 'short' in parts:
        print_short_regime(short_regime(args))
    if 'hostwork' in parts:
        for net in (SHORT_NET, args.net):
            print_host_work(net, args)
    for part in ('ranks', 'shortranks'):
        if part in parts:
            print_ranks(part, args)
    if 'host' in parts:
        model = models.get_model(args.net, seed=0)
        bandwidth, seconds, n_floats = accumulator_bandwidth(model)
        copy_bw = host_update_benchmark.copy_bandwidth(n_floats, repeats=5)
        print('[host] host accumulator, 4 slots + MomentumSGD over {:.1f} M '
              'parameters: {:.3f} s, {:.2f} GB/s effective; NumPy copy '
              '{:.2f} GB/s; ratio {:.2f}'.format(
                  n_floats / 1e6, seconds, bandwidth / 1e9, copy_bw / 1e9,
                  bandwidth / copy_bw), flush=True)


if __name__ == '__main__':
    main()
