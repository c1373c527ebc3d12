"""The paper's weak-scaling experiment: typical data parallel against CGDP.

``make experiment NET=resnet152`` runs::

    python -m experiments.weak_scaling --net resnet152 [--devices 1,2,4]
        [--batch B] [--image-size S] [--iterations I] [--warmup W]
        [--chunk-size C] [--out ROOT]

For every device count N and every mode it trains the network on synthetic
data with a fixed batch per device (weak scaling: the global batch grows
with N), runs ``--warmup`` iterations, then times ``--iterations`` calls of
``updater.update()`` one by one. The modes (see :data:`MODES`):

- ``typical``: Chainer's ``ParallelUpdater`` (``StandardUpdater`` for one
  device), the baseline of the paper.
- ``nccl``: Chainer's ``MultiprocessParallelUpdater``; only with two or more
  GPUs and NCCL, otherwise skipped with a note.
- ``cgdp``: :class:`cgdp_chainer.CGDPUpdater`.
- ``chainermn``: ChainerMN's data parallel training, one device per rank
  (only under MPI, at N=1): the multi-node baseline.

Every mode starts from the same weights (the same seed) and sees the same
batches. Without GPUs the replicas are ``'@numpy'`` CPU replicas and the
defaults shrink (see :data:`CPU_DEFAULTS`) so the run fits a small machine.

The results go to ``ROOT/<net>/<run-id>/`` (``ROOT`` defaults to
``results``; the schema is in :mod:`experiments.results`): ``runs.csv``
(written row by row), ``summary.csv``, ``timeline.csv`` (one measured CGDP
iteration at the largest N), ``env.json`` and the figures of
:mod:`experiments.plot`. ``--net all`` runs the four networks and adds
``ROOT/all/<run-id>/efficiency_all.png``. ``--net module:callable`` runs
any model (see :mod:`models.custom`; e.g. ``models.examples:resnet50``),
into ``ROOT/<module:callable>/<run-id>/``.

Ctrl-C (SIGINT) or SIGTERM stops the run after writing what finished; the
figures are drawn from that, the summary is printed, and the exit status
is 130 after SIGINT and 143 after SIGTERM (128 + the signal, as a shell
reports it; see :mod:`experiments.stopping`).

Under MPI (``make experiment NET=alexnet RANKS=2``, which runs
``mpiexec -launcher fork -n 2 python -m experiments.weak_scaling ...``) the
R ranks run the multi-rank modes together: ``cgdp`` with N local replicas
per rank and ``mpi_comm=MPI.COMM_WORLD``, and ``chainermn`` at N=1. The
single-process modes (``typical``, ``nccl``) are not run: their rows come
from a plain ``make experiment``. The batch per device stays the same, so
the global batch is R x N x batch. Each rank trains on its own share of the
synthetic data; an iteration's time is the maximum over the ranks (every
rank measures its ``update()``, then an all-reduce takes the maximum), and
rows carry ``n_ranks=R``. Only rank 0 writes files and figures and prints;
an exception on any rank aborts the whole job. After Ctrl-C (to mpiexec,
which passes it on, or to the whole process group) the ranks stop
together after the iteration that runs, rank 0 writes and prints what
finished, and every rank exits normally with status 130
(:mod:`experiments.mpi_world`). Bad input ends every rank with status 2
before any mode runs.

The pieces: :mod:`experiments.modes` (the modes),
:mod:`experiments.run_plan` (settings, defaults, the checks of the
command line),
:mod:`experiments.progress` (the progress bar),
:mod:`experiments.stopping` (signals) and :mod:`experiments.mpi_world`
(the ranks). This module runs them: :func:`experiment`.
"""
import collections
import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import time

from experiments import cli  # NOQA: first, it silences import-time warnings

import numpy

from cgdp_chainer import blas
from cgdp_chainer import datasets
from cgdp_chainer import devices as devices_module
from cgdp_chainer import mpi as cgdp_mpi
from cgdp_chainer import Timeline
from experiments import modes
from experiments import mpi_world
from experiments import plot
from experiments import prediction
from experiments import results
from experiments import run_plan
from experiments import stopping
from experiments import train
from experiments.modes import MODES
from experiments.modes import RunInputs
from experiments.modes import SINGLE_PROCESS_ONLY
from experiments.modes import default_modes
from experiments.modes import mode_list
from experiments.mpi_world import is_root
from experiments.progress import DEVNULL
from experiments.progress import Progress
from experiments.progress import minutes
from experiments.progress import say
# The run plan's names that other scripts use (experiments.validate_model).
from experiments.run_plan import ALL  # NOQA: F401
from experiments.run_plan import CPU_DEFAULTS  # NOQA: F401
from experiments.run_plan import DEFAULT_OUT
from experiments.run_plan import GPU_DEFAULTS  # NOQA: F401
from experiments.run_plan import Settings  # NOQA: F401
from experiments.run_plan import defaults_for  # NOQA: F401
from experiments.run_plan import device_counts
from experiments.run_plan import device_specs_for
from experiments.run_plan import net_or_all
import models

# The synthetic examples are generated once per run and then cycled, so
# that generating random images never counts as iteration time. Two global
# batches are enough: the content of the data does not change the timing.
BATCHES_IN_MEMORY = 2


# ------------------------------------------------------------ running modes

def synthetic_examples(length, image_size, n_classes, seed):
    """``length`` synthetic ImageNet examples, generated up front.

    Args:
        length (int): Number of examples.
        image_size (int): Side of the images.
        n_classes (int): Number of classes.
        seed (int): Seed of the data.
    """
    dataset = datasets.SyntheticImageNet(length, image_size,
                                         n_classes=n_classes, seed=seed)
    return [dataset[i] for i in range(length)]


def rank_examples(world, per_rank, image_size, n_classes, seed):
    """This rank's share of ``world.size x per_rank`` synthetic examples.

    Every rank describes the same data set and takes its shard
    (:func:`cgdp_chainer.mpi.shard_dataset`); only the shard is generated.

    Args:
        world (experiments.mpi_world.World): The MPI ranks.
        per_rank (int): Examples per rank.
        image_size (int): Side of the images.
        n_classes (int): Number of classes.
        seed (int): Seed of the data.
    """
    dataset = datasets.SyntheticImageNet(per_rank * world.size, image_size,
                                         n_classes=n_classes, seed=seed)
    shard = cgdp_mpi.shard_dataset(dataset, world.comm)
    return [shard[i] for i in range(len(shard))]


def synchronize(gpus):
    """Waits for every GPU of the run, so the timing covers their work.

    Args:
        gpus (list of chainer.backend.GpuDevice): The run's GPUs (empty
            for CPU replicas).
    """
    for gpu in gpus:
        gpu.device.synchronize()


def free_gpu_memory(device_specs):
    """Returns CuPy's pooled memory, so the next run starts from empty.

    Args:
        device_specs (list of str): The run's devices.
    """
    if any(spec.startswith('@cupy') for spec in device_specs):
        cupy = devices_module.cupy_module()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def chunk_search_running(updater):
    """True while CGDP's ``chunk_size='auto'`` search is still trying sizes.

    Iterations of the search run with changing chunk sizes, so they belong
    to the warm-up, not to the measurement.

    Args:
        updater: The run's updater (any kind).
    """
    return not getattr(updater, 'chunk_size_settled', True)


def time_mode(net, mode, device_specs, settings, args, timeline, on_step,
              world=None, stops=None):
    """Builds a mode's updater, warms it up and times its iterations.

    Under MPI every rank calls it with the same arguments (it is
    collective): each trains on its share of the data, and the time of an
    iteration is the largest over the ranks.

    Args:
        net (str): The network.
        mode (str): A key of :data:`MODES`.
        device_specs (list of str): One device per replica.
        settings (Settings): Image size, batch and iteration counts.
        args (argparse.Namespace): The command line (classes, seed,
            chunk size).
        timeline (cgdp_chainer.Timeline or None): For the cgdp mode.
        on_step (callable): ``on_step(measured_index, seconds)`` after each
            iteration; ``measured_index`` is None during the warm-up.
        world (World or None): The MPI ranks; None in a single process.
        stops (experiments.mpi_world.StopPoints or None): Where the run
            may stop after a signal: after every iteration. None: no
            signal handling (the caller's own).

    Returns:
        dict: ``chunk_size`` (CGDP's resolved chunk size, else None) and
        ``warmup`` (warm-up iterations actually run).

    Raises:
        experiments.stopping.Interrupted: The run was stopped by a signal.
    """
    if stops is None:
        stops = mpi_world.StopPoints(world, stopping.StopSignals())
    # Dropout draws from the global state; ranks draw different masks.
    numpy.random.seed(args.seed + (0 if world is None else world.rank))
    inputs = _mode_inputs(net, mode, device_specs, settings, args, timeline,
                          world)
    gpus = [device for device in devices_module.parse_devices(device_specs)
            if devices_module.is_gpu(device)]
    with blas.BlasLimit(mpi_world.rank_blas_limit(world, device_specs)):
        with stops.signals.hold():  # a half-built updater cannot finalize
            updater = MODES[mode].build(inputs)
        # Nothing touches the model between these updates: CGDP's GPU
        # replicas need not take the master's values again each time.
        unattended = getattr(updater, 'unattended', contextlib.nullcontext)
        try:
            stops.check()
            with unattended():
                warmup = _warm_up(updater, settings.warmup, gpus, stops,
                                  on_step)
                _measure(updater, settings.iterations, gpus, stops, on_step)
        finally:
            with stops.signals.hold():
                updater.finalize()
                chunk_size = getattr(updater, 'chunk_size', None)
                chunking = getattr(updater, 'chunking_description', None)
                # Drop every reference to the run's arrays before the next
                # run, so that the replicas of two runs never coexist (the
                # inputs hold the optimizer, its model and the examples;
                # the bound unattended method holds the updater).
                del updater, inputs, unattended
                gc.collect()
                free_gpu_memory(device_specs)
    return {'chunk_size': chunk_size, 'chunking': chunking, 'warmup': warmup}


def _mode_inputs(net, mode, device_specs, settings, args, timeline, world):
    """A fresh model, its optimizer and the data a mode's updater trains on.

    Args:
        net (str): The network.
        mode (str): A key of :data:`MODES`.
        device_specs (list of str): One device per replica.
        settings (Settings): Image size and batch per device.
        args (argparse.Namespace): The command line (classes, seed,
            chunk size).
        timeline (cgdp_chainer.Timeline or None): For the cgdp mode.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        experiments.modes.RunInputs: What the mode builds its updater from.
    """
    model = train.build_model(net, n_classes=args.classes, seed=args.seed)
    optimizer = train.build_optimizer(model)
    batch_total = settings.batch * len(device_specs)
    if world is None:
        examples = synthetic_examples(batch_total * BATCHES_IN_MEMORY,
                                      settings.image_size, args.classes,
                                      args.seed)
    else:
        examples = rank_examples(world, batch_total * BATCHES_IN_MEMORY,
                                 settings.image_size, args.classes,
                                 args.seed)
    return RunInputs(optimizer, examples, device_specs, settings.batch,
                     args.chunk_size if mode == 'cgdp' else None,
                     timeline, world)


def _warm_up(updater, iterations, gpus, stops, on_step):
    """Runs the untimed iterations: ``iterations``, or more while CGDP's
    chunk size search goes on.

    Args:
        updater: The mode's updater.
        iterations (int): Warm-up iterations asked for.
        gpus (list of chainer.backend.GpuDevice): The GPUs to wait for.
        stops (experiments.mpi_world.StopPoints): Checked after each one.
        on_step (callable): Called with ``(None, None)`` after each one.

    Returns:
        int: The warm-up iterations run.
    """
    warmup = 0
    while warmup < iterations or chunk_search_running(updater):
        updater.update()
        synchronize(gpus)
        warmup += 1
        stops.iteration()
        on_step(None, None)
    return warmup


def _measure(updater, iterations, gpus, stops, on_step):
    """Runs and times the measured iterations one by one.

    Args:
        updater: The mode's updater.
        iterations (int): Measured iterations.
        gpus (list of chainer.backend.GpuDevice): The GPUs to wait for.
        stops (experiments.mpi_world.StopPoints): Checked after each one;
            under MPI it gives the largest time over the ranks.
        on_step (callable): ``on_step(index, seconds)`` after each one.
    """
    for index in range(iterations):
        start = time.perf_counter()
        updater.update()
        synchronize(gpus)
        seconds = stops.iteration(time.perf_counter() - start)
        on_step(index, seconds)


def write_timeline(folder, timeline, warmup):
    """Writes the events of one measured CGDP iteration to timeline.csv.

    The iteration shown is the measured one of median duration, so the
    chart is typical rather than the fastest or an outlier.

    Args:
        folder (str): The run folder.
        timeline (cgdp_chainer.Timeline): The recorded run.
        warmup (int): Warm-up iterations (not eligible).

    Returns:
        dict or None: The iteration's summary, None if none was measured.
    """
    measured = [s for s in timeline.iteration_summaries
                if s['iteration'] >= warmup]
    if not measured:
        return None
    measured.sort(key=lambda s: s['duration'])
    chosen = measured[len(measured) // 2]
    results.write_csv(os.path.join(folder, results.TIMELINE_FILE),
                      results.TIMELINE_COLUMNS,
                      results.timeline_rows(timeline.events,
                                            chosen['iteration'],
                                            chosen['start']))
    timeline.export_chrome_trace(os.path.join(folder, results.TRACE_FILE))
    return chosen


class _NoWriter(object):
    """Stands in for runs.csv on the ranks that write nothing."""

    path = None

    def append(self, row):
        pass

    def close(self):
        pass


def run_network(net_plan, plan, args, run_id, command, progress, stops,
                world=None):
    """Runs every mode at every device count for one network.

    Rows go to ``runs.csv`` as they are measured; ``summary.csv``,
    ``env.json`` and the figures are written at the end, also when the run
    is stopped (then from what finished). Under MPI every rank runs the
    modes together and only rank 0 writes.

    Args:
        net_plan (experiments.run_plan.NetPlan): The network and settings.
        plan (experiments.run_plan.Plan): The whole run.
        args (argparse.Namespace): The parsed command line.
        run_id (str): The run's folder name.
        command (list of str): The command line, for env.json.
        progress (Progress): The progress bar to advance.
        stops (experiments.mpi_world.StopPoints): Where the run may stop:
            before every mode and after every iteration.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        str or None: The run folder (None on ranks other than 0).

    Raises:
        experiments.stopping.Interrupted: The run was stopped by a signal
            (after its files were written).
    """
    root = is_root(world)
    folder = results.run_dir(args.out, net_plan.net, run_id) if root else None
    env = _initial_env(net_plan, plan, args, run_id, command,
                       world) if root else {}
    if root:
        with stops.signals.hold():
            writer = _open_run_folder(folder, env)
    else:
        writer = _NoWriter()
    started = time.monotonic()
    try:
        _run_modes(net_plan, plan, args, folder, env, writer, progress, stops,
                   world)
        if root and world is None and args.model:
            env['model'] = write_prediction(
                folder, net_plan.net, writer.path,
                device_specs_for(plan.kind, 1)[0], args, progress)
        env['finished'] = True
    except KeyboardInterrupt:
        env['interrupted'] = True
        raise
    finally:
        if root:
            with stops.signals.hold():
                _close_run_folder(folder, env, writer, started)
    return folder


def _initial_env(net_plan, plan, args, run_id, command, world):
    """env.json as it stands before any mode runs.

    Args:
        net_plan (experiments.run_plan.NetPlan): The network and settings.
        plan (experiments.run_plan.Plan): The whole run.
        args (argparse.Namespace): The parsed command line.
        run_id (str): The run's folder name.
        command (list of str): The command line.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        dict: The environment, with the run's settings and empty records
        of what the modes will do.
    """
    settings, kind, counts = net_plan.settings, plan.kind, plan.counts
    return results.collect_env(
        command, net=net_plan.net, run_id=run_id,
        image_size=settings.image_size, image_size_reason=net_plan.reason,
        batch_per_device=settings.batch, iterations=settings.iterations,
        warmup=settings.warmup, chunk_size_requested=args.chunk_size,
        n_classes=args.classes, seed=args.seed, device_counts=counts,
        n_ranks=1 if world is None else world.size,
        mpi=mpi_world.mpi_settings(world, SINGLE_PROCESS_ONLY),
        device_kind=run_plan.device_kind_name(kind),
        device_names=[devices_module.describe(d) for d in
                      devices_module.parse_devices(
                          device_specs_for(kind, max(counts), world))],
        modes=plan.modes, skipped=[], cgdp_chunk_size={}, warmup_run={},
        timeline=None, finished=False, interrupted=False)


def _open_run_folder(folder, env):
    """Creates the run folder with its env.json; opens runs.csv.

    Args:
        folder (str): The run folder (must not exist yet).
        env (dict): env.json's first content.

    Returns:
        experiments.results.CsvAppender: The writer of runs.csv.
    """
    os.makedirs(folder)
    results.write_json(os.path.join(folder, results.ENV_FILE), env)
    return results.CsvAppender(os.path.join(folder, results.RUNS_FILE),
                               results.RUNS_COLUMNS)


def _run_modes(net_plan, plan, args, folder, env, writer, progress, stops,
               world):
    """Times every mode at every device count, skipping those that cannot
    run (recorded in ``env['skipped']``).

    Args:
        net_plan (experiments.run_plan.NetPlan): The network and settings.
        plan (experiments.run_plan.Plan): The whole run.
        args (argparse.Namespace): The parsed command line.
        folder (str or None): The run folder (None on ranks other than 0).
        env (dict): env.json's content, completed here on rank 0.
        writer: Where each measured iteration's row goes.
        progress (Progress): The progress bar to advance.
        stops (experiments.mpi_world.StopPoints): Checked before every
            mode and after every iteration.
        world (World or None): The MPI ranks; None in a single process.
    """
    net, settings, kind = net_plan.net, net_plan.settings, plan.kind
    root = is_root(world)
    n_ranks = 1 if world is None else world.size
    largest = max(plan.counts)
    for count in plan.counts:
        specs = device_specs_for(kind, count, world)
        weight = run_plan.iteration_cost(net, settings, count, kind)
        for mode in plan.modes:
            reason = MODES[mode].skip_reason(specs, world)
            if reason:  # announced with the plan (see skipped_runs)
                if root:
                    env['skipped'].append({'mode': mode, 'n_devices': count,
                                           'reason': reason})
                continue
            stops.check()
            label = '{} {} N={}{}'.format(
                net, mode, count,
                '' if world is None else ' R={}'.format(n_ranks))
            # Rank 0's timeline stands for every rank's.
            timeline = (Timeline() if mode == 'cgdp' and count == largest
                        and root else None)
            on_step = _step_recorder(writer, progress, mode, count, settings,
                                     n_ranks, label, weight)
            progress.start_clock()
            info = time_mode(net, mode, specs, settings, args, timeline,
                             on_step, world, stops)
            if root:
                _record_mode(folder, env, mode, count, n_ranks, info,
                             timeline, stops)


def _step_recorder(writer, progress, mode, count, settings, n_ranks, label,
                   weight):
    """The ``on_step`` of :func:`time_mode` for one mode and device count:
    it writes each measured iteration's row and advances the progress bar.

    Args:
        writer: Where each measured iteration's row goes.
        progress (Progress): The progress bar.
        mode (str): The mode.
        count (int): Its device count.
        settings (Settings): Batch, image size and iterations.
        n_ranks (int): The MPI ranks (1 in a single process).
        label (str): The run's name on the progress bar.
        weight (float): One iteration's share of the bar.
    """
    def on_step(index, seconds):
        if index is not None:
            writer.append(results.run_row(
                mode, count, settings.batch, settings.image_size, index,
                seconds, n_ranks=n_ranks))
            step = 'it {}/{}'.format(index + 1, settings.iterations)
        else:
            step = 'warm-up'
        progress.advance(weight, '{} {}'.format(label, step))

    return on_step


def _record_mode(folder, env, mode, count, n_ranks, info, timeline, stops):
    """Records what a mode's run did in ``env``; writes its timeline.

    Args:
        folder (str): The run folder.
        env (dict): env.json's content.
        mode (str): The mode.
        count (int): Its device count.
        n_ranks (int): The MPI ranks (1 in a single process).
        info (dict): What :func:`time_mode` returned.
        timeline (cgdp_chainer.Timeline or None): Its recorded events.
        stops (experiments.mpi_world.StopPoints): Its signals are held
            while the timeline is written.
    """
    env['warmup_run']['{} N={}'.format(mode, count)] = info['warmup']
    if mode == 'cgdp':
        env['cgdp_chunk_size'][str(count)] = info['chunk_size']
    if timeline is None:
        return
    with stops.signals.hold():
        chosen = write_timeline(folder, timeline, info['warmup'])
    if chosen is not None:
        env['timeline'] = {
            'mode': mode, 'n_devices': count, 'n_ranks': n_ranks,
            'iteration': chosen['iteration'],
            'duration_s': chosen['duration'],
            'chunk_size': info['chunk_size'],
            'chunking': info['chunking']}


def _close_run_folder(folder, env, writer, started):
    """Closes runs.csv, then writes summary.csv, the final env.json and
    the figures from what was measured.

    Args:
        folder (str): The run folder.
        env (dict): env.json's content.
        writer (experiments.results.CsvAppender): The writer of runs.csv.
        started (float): ``time.monotonic()`` when the modes started.
    """
    writer.close()
    runs = results.read_csv(writer.path)
    results.write_csv(os.path.join(folder, results.SUMMARY_FILE),
                      results.SUMMARY_COLUMNS, results.summarize(runs))
    env['wall_seconds'] = time.monotonic() - started
    env['load_average_at_end'] = results.load_average()
    results.write_json(os.path.join(folder, results.ENV_FILE), env)
    plot.draw_run(folder)


def write_prediction(folder, net, runs_path, device_spec, args, progress):
    """Writes ``model.csv``: the cost model's prediction of the points just
    measured, from a short profile taken now (see
    :mod:`experiments.prediction`).

    A prediction that fails leaves the measurements as they are: it is
    reported in a note and in env.json, not raised.

    Returns:
        dict: What env.json records about it.
    """
    say(progress, 'cost model: profiling {} on {} to predict the measured '
                  'points (dashed in the figures)'.format(net, device_spec))
    try:
        rows = prediction.predict_measured(
            net, results.summarize(results.read_csv(runs_path)),
            device_spec, n_classes=args.classes, seed=args.seed)
    except Exception as error:  # the measurements stand without it
        say(progress, 'note: no cost-model prediction: {}: {}'.format(
            type(error).__name__, error))
        return {'error': '{}: {}'.format(type(error).__name__, error)}
    results.write_csv(os.path.join(folder, results.MODEL_FILE),
                      results.SUMMARY_COLUMNS, rows)
    return {'file': results.MODEL_FILE, 'profiled_on': device_spec,
            'workers': 'process'}


NO_ROWS = 'no measured iteration finished'


def print_summary(folder, progress):
    """Prints summary.csv as a small table.

    With MPI ranks in the rows, ``R`` is the ranks and ``N`` the devices
    per rank; otherwise ``N`` is the devices.

    Args:
        folder (str): The run folder.
        progress (Progress or None): A bar to clear first.
    """
    rows = results.read_csv(os.path.join(folder, results.SUMMARY_FILE))
    if not rows:
        say(progress, NO_ROWS)
        return
    ranks = any(row['n_ranks'] > 1 for row in rows)
    if ranks:
        form = '{:<9} {:>3} {:>3} {:>10} {:>9} {:>11} {:>10} {:>8}'
        header = ('mode', 'R', 'N', 'median_s', 'iqr_s', 'images/s',
                  'efficiency', 'speedup')
    else:
        form = '{:<8} {:>3} {:>10} {:>9} {:>11} {:>10} {:>8}'
        header = ('mode', 'N', 'median_s', 'iqr_s', 'images/s',
                  'efficiency', 'speedup')
    say(progress, form.format(*header))

    def number(value, text):
        return '' if value is None else text.format(value)

    for row in rows:
        replicas = ((row['n_ranks'], row['n_devices']) if ranks
                    else (results.workers(row),))
        say(progress, form.format(
            row['mode'], *replicas,
            number(row['median_s'], '{:.3f}'), number(row['iqr_s'], '{:.3f}'),
            number(row['throughput'], '{:.1f}'),
            number(row['efficiency'], '{:.2f}'),
            number(row['speedup_vs_typical'], '{:.2f}x')))
    for note in results.summary_notes(rows):
        say(progress, note)


def print_report(folders, all_dir, started):
    """Prints each run folder's summary, then the wall time.

    Args:
        folders (list of str): The networks' run folders.
        all_dir (str or None): The ``--net all`` folder.
        started (float): ``time.monotonic()`` at the start.
    """
    for folder in folders:
        if os.path.exists(os.path.join(folder, results.SUMMARY_FILE)):
            say(None, '\n{}'.format(folder))
            print_summary(folder, None)
    if all_dir is not None:
        say(None, 'all networks: {}'.format(all_dir))
    say(None, 'wall time {} (load average now {})'.format(
        minutes(time.monotonic() - started),
        ', '.join('{:.1f}'.format(v) for v in results.load_average() or [])))


def use_forkserver_for_nccl(plan, world):
    """MultiprocessParallelUpdater forks its workers; a process whose CUDA
    context exists (the earlier modes made one) must start them with
    forkserver instead.

    Args:
        plan (experiments.run_plan.Plan): The run.
        world (World or None): The MPI ranks; None in a single process.
    """
    if plan.kind == 'gpu' and 'nccl' in plan.modes and \
            max(plan.counts) >= 2 and world is None and \
            modes.nccl_available():
        multiprocessing.set_start_method('forkserver', force=True)


def start_run(args, argv, plan, world):
    """Names the run (the same id on every rank) and, for several
    networks, writes the index that ties their folders together.

    Args:
        args (argparse.Namespace): The parsed command line.
        argv (list of str): The arguments, for env.json.
        plan (experiments.run_plan.Plan): The run.
        world (World or None): The MPI ranks; None in a single process.

    Returns:
        tuple: ``(run_id, command, all_dir)``; ``all_dir`` is None for one
        network and on ranks other than 0.
    """
    nets = [net_plan.net for net_plan in plan.nets]
    several = len(nets) > 1
    run_id = None
    if is_root(world):
        run_id = results.free_run_id(args.out, nets + ([ALL] if several
                                                       else []))
    if world is not None:
        run_id = world.comm.bcast(run_id, root=0)
    command = [os.path.basename(sys.executable), '-m',
               'experiments.weak_scaling'] + list(argv)
    if world is not None:
        command = ['mpiexec', '-n', str(world.size)] + command
    all_dir = None
    if several and is_root(world):
        all_dir = results.run_dir(args.out, ALL, run_id)
        os.makedirs(all_dir)
        results.write_json(os.path.join(all_dir, results.INDEX_FILE), {
            'run_id': run_id, 'command': ' '.join(command),
            'nets': collections.OrderedDict(
                (net, os.path.relpath(results.run_dir(args.out, net, run_id),
                                      all_dir)) for net in nets)})
    return run_id, command, all_dir


def experiment(args, argv, world=None, signals=None):
    """Plans, runs and reports the experiment (every rank under MPI).

    Args:
        args (argparse.Namespace): The parsed command line.
        argv (list of str): The arguments, for env.json.
        world (World or None): The MPI ranks; None in a single process.
        signals (experiments.stopping.StopSignals or None): The installed
            signal handler; None: signals are not handled here.

    Returns:
        int: Exit status: 0, or 130 / 143 after SIGINT / SIGTERM.
    """
    root = is_root(world)
    signals = signals or stopping.StopSignals()
    stops = mpi_world.StopPoints(world, signals)
    plan = mpi_world.same_verdict(world, run_plan.make_plan, args, world,
                                  root)
    for line in run_plan.describe(plan, world):
        print(line)
    use_forkserver_for_nccl(plan, world)
    run_id, command, all_dir = start_run(args, argv, plan, world)
    progress = Progress(run_plan.total_weight(plan, world),
                        stream=None if root else DEVNULL)

    started = time.monotonic()
    folders = []
    stopped_by = None
    try:
        # A single process stops at once; ranks stop at their StopPoints.
        with (signals.interrupting() if world is None
              else contextlib.nullcontext()):
            for net_plan in plan.nets:
                stops.check()
                if root:
                    folders.append(results.run_dir(args.out, net_plan.net,
                                                   run_id))
                run_network(net_plan, plan, args, run_id, command, progress,
                            stops, world)
                if root:
                    say(progress, 'wrote {}'.format(folders[-1]))
    except KeyboardInterrupt as error:
        stopped_by = getattr(error, 'signum', signal.SIGINT)

    with signals.hold():
        progress.clear()
        if all_dir is not None:
            plot.draw_all(all_dir)
        if root:
            print_report(folders, all_dir, started)
        # Every rank passes here, so the ranks agree on how the run ended.
        signum = max(stopped_by or 0, stops.final() or 0)
        if not signum:
            return 0
        if root:
            say(None, 'interrupted: kept the iterations that finished '
                      '(stopped by {}); redraw with python -m '
                      'experiments.plot FOLDER'.format(
                          stopping.Interrupted(signum)))
        return stopping.exit_status(signum)


def build_parser():
    """The command line of the experiment."""
    parser = cli.ArgumentParser(
        prog='python -m experiments.weak_scaling',
        description='Weak-scaling experiment: typical data parallel, NCCL '
                    'and CGDP training, timed per iteration, with figures.',
        epilog='Ctrl-C (SIGINT) or SIGTERM stops the run, keeps what '
               'finished and exits with 130 or 143.')
    parser.add_argument('--net', required=True, type=net_or_all,
                        help='one of {}, {}, or module:callable: a function '
                             'that returns a chainer.Link giving class '
                             'scores (e.g. models.examples:resnet50)'.format(
                                 ', '.join(models.NETWORKS), ALL))
    parser.add_argument('--devices', type=device_counts, default=None,
                        help='device counts N (per rank under MPI), e.g. '
                             '1,2,4 (default: 1,2,4, limited to the GPUs '
                             'present)')
    parser.add_argument('--device-kind', choices=('auto', 'gpu', 'cpu'),
                        default='auto',
                        help="replicas on GPUs or '@numpy' CPU replicas "
                             '(auto: GPUs where CuPy sees any)')
    parser.add_argument('--batch', type=cli.positive_int, default=None,
                        help='examples per device and iteration')
    parser.add_argument('--image-size', type=cli.positive_int, default=None)
    parser.add_argument('--iterations', type=cli.positive_int, default=None,
                        help='measured iterations per mode and N')
    parser.add_argument('--warmup', type=cli.non_negative_int, default=None,
                        help='untimed iterations before the measured ones')
    parser.add_argument('--chunk-size', type=cli.chunk_size, default=None,
                        help="CGDP chunk size: layers per chunk, up to the "
                             "network's layers, 'auto' or 'model' (default: "
                             "CGDPUpdater's)")
    parser.add_argument('--modes', type=mode_list, default=None,
                        help='comma-separated subset of {} (default: {} in '
                             'one process, {} under MPI)'.format(
                                 ', '.join(MODES),
                                 ','.join(default_modes(None)),
                                 ','.join(name for name, mode in
                                          MODES.items()
                                          if 'mpi' in mode.launches)))
    parser.add_argument('--classes', type=cli.positive_int, default=1000,
                        help='classes of the synthetic data set')
    parser.add_argument('--seed', type=cli.non_negative_int, default=0,
                        help='seed of the weights and data (all modes)')
    parser.add_argument('--no-model', dest='model', action='store_false',
                        help="skip the cost model's prediction of the "
                             'measured points (a short profile after the '
                             'runs, drawn dashed in the figures)')
    parser.add_argument('--out', default=DEFAULT_OUT,
                        help='results root; a run goes to '
                             'OUT/<net>/<run-id>/')
    return parser


def _mpi_rank(argv, signals, world):
    """The experiment on one MPI rank; see :func:`main`."""
    if world.rank != 0:
        sys.stdout = DEVNULL
    cgdp_mpi.install_abort_hooks(world.comm)
    try:
        args = mpi_world.same_verdict(world, build_parser().parse_args, argv)
        status = experiment(args, argv, world, signals)
    except SystemExit as error:
        if not mpi_world.is_usage_exit(error):
            # Only this rank exits (its error line is printed): end every
            # rank, or the others would wait for it forever.
            sys.stderr.flush()
            world.comm.Abort(error.code if isinstance(error.code, int)
                             else 1)
        status = error.code
    mpi_world.end_job(world)
    return status


def main(argv=None):
    """Runs the experiment; see the module's docstring.

    Under an MPI launch (``make experiment RANKS=R``) every rank runs it:
    rank 0 alone prints, other ranks' standard output is dropped, and an
    exception on any rank aborts the whole job.

    Args:
        argv (list of str or None): Arguments (default: ``sys.argv[1:]``).

    Returns:
        int: Exit status: 0; 2 for bad input; 130 / 143 after SIGINT /
        SIGTERM.
    """
    argv = sys.argv[1:] if argv is None else argv
    # Installed before MPI starts and kept until the process exits: from
    # here on a signal never ends a process half-way, not even during
    # MPI's finalization at exit (see experiments.mpi_world).
    signals = stopping.StopSignals().install()
    world = mpi_world.mpi_world()  # None (and MPI untouched) without mpiexec
    if world is None:
        return experiment(build_parser().parse_args(argv), argv, None,
                          signals)
    return _mpi_rank(argv, signals, world)


if __name__ == '__main__':
    sys.exit(main())
