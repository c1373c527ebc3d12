"""CGDP runtime benchmarks, each comparison measured side by side in one run.

    python -m benchmarks.runtime [--net resnet152] [--image-size 64]
        [--batch 4] [--iterations 6] [--warmup 2] [--parts all]

Prints, as ratios (machines here are shared and noisy, so only ratios from
one run mean anything):

1. Two '@numpy' replicas: CGDP iteration time over ParallelUpdater's.
2. One device: CGDP over StandardUpdater (the machinery's own cost).
3. The host accumulator alone: reduce 4 device slots and apply MomentumSGD
   over the network's parameters; effective bandwidth (logical bytes read
   and written per second) over a plain NumPy copy's, measured in the run.
4. Exposed sync per iteration (from the timeline) against the time the
   last chunk's sync (reduce + update + publish of chunk 0) takes alone.
"""
import argparse
import copy
import statistics
import time

import models  # NOQA: imports the compat module before Chainer
import chainer
from chainer.training import updaters
import numpy

import cgdp_chainer
from cgdp_chainer import accumulator as accumulator_module
from cgdp_chainer import datasets
from cgdp_chainer.runtime import transfer as transfer_module


def _updater(mode, model, n_devices, batch, image_size, timeline=None):
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    data = datasets.SyntheticImageNet(
        batch * n_devices * 1000, image_size, n_classes=1000, seed=0)
    iterator = chainer.iterators.SerialIterator(data, batch * n_devices,
                                                shuffle=False)
    if mode == 'standard':
        return updaters.StandardUpdater(iterator, optimizer)
    if mode == 'parallel':
        devices = {'main': '@numpy'}
        devices.update({'replica{}'.format(i): '@numpy'
                        for i in range(1, n_devices)})
        return updaters.ParallelUpdater(iterator, optimizer, devices=devices)
    return cgdp_chainer.CGDPUpdater(iterator, optimizer,
                                    ['@numpy'] * n_devices, chunk_size=1,
                                    timeline=timeline)


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


def compare(base, modes, n_devices, args):
    """Alternates the modes round by round so that load changes on the
    machine hit both alike; returns median seconds per mode."""
    times = {mode: [] for mode in modes}
    timelines = {}
    for _ in range(args.rounds):
        for mode in modes:
            timeline = cgdp_chainer.Timeline() if mode == 'cgdp' else None
            updater = _updater(mode, copy.deepcopy(base), n_devices,
                               args.batch, args.image_size, timeline)
            times[mode] += _iteration_times(updater, args.iterations,
                                            args.warmup)
            if timeline is not None:
                timelines[mode] = timeline
    return {m: statistics.median(t) for m, t in times.items()}, timelines


def copy_bandwidth(n_floats, repeats=5):
    src = numpy.random.rand(n_floats).astype(numpy.float32)
    dst = numpy.empty_like(src)
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def accumulator_bandwidth(model, n_slots=4, repeats=3):
    """Times the real HostAccumulator over ``n_slots`` CPU replicas' worth
    of gradients, all chunks at once, MomentumSGD."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    master_params = dict(model.namedparams())
    rng = numpy.random.RandomState(0)
    transfers = []
    for _ in range(n_slots):
        replica_params = {
            name: chainer.Parameter(p.array.copy()) for name, p in
            master_params.items()}
        for p in replica_params.values():
            p.grad = rng.standard_normal(p.shape).astype(p.dtype)
        transfer = transfer_module.HostResidentTransfer(master_params,
                                                        replica_params)
        transfer.send_grads(list(master_params))
        transfers.append(transfer)
    stages = model.stages
    chunks = cgdp_chainer.chunking.plan_chunks(len(stages), 1)
    names = cgdp_chainer.chunking.assign_parameters(model, stages, chunks)
    failures = accumulator_module.FailureBox()
    acc = accumulator_module.HostAccumulator(
        optimizer, transfers, names, 'mean', failures)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--net', default='resnet152', choices=models.NETWORKS)
    parser.add_argument('--image-size', type=int, default=64)
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--iterations', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--parts', default='1,2,3,4')
    args = parser.parse_args(argv)
    parts = set(args.parts.split(','))
    base = models.Classifier(models.get_model(args.net, seed=0))
    print('{} at {} px, batch {} per device, {} measured iterations x {} '
          'rounds (median)'.format(args.net, args.image_size, args.batch,
                                   args.iterations, args.rounds))
    if '1' in parts:
        medians, timelines = compare(base, ['parallel', 'cgdp'], 2, args)
        print('[1] 2 replicas: ParallelUpdater {:.3f} s, CGDP {:.3f} s, '
              'CGDP/Parallel = {:.3f} (target <= 0.9)'.format(
                  medians['parallel'], medians['cgdp'],
                  medians['cgdp'] / medians['parallel']))
        if '4' in parts:
            summaries = timelines['cgdp'].iteration_summaries[args.warmup:]
            exposed = statistics.median(s['exposed_sync'] for s in summaries)
            last = [e for e in timelines['cgdp'].events
                    if e.device == 'host' and e.chunk == 0 and
                    e.iteration >= args.warmup and
                    e.kind in ('reduce', 'update', 'h2d')]
            per_iteration = {}
            for e in last:
                per_iteration[e.iteration] = per_iteration.get(
                    e.iteration, 0.0) + (e.end - e.start)
            alone = statistics.median(per_iteration.values())
            print('[4] exposed sync per iteration {:.4f} s; last chunk\'s '
                  'sync alone {:.4f} s; ratio {:.2f}'.format(
                      exposed, alone, exposed / alone if alone else
                      float('nan')))
    if '2' in parts:
        medians, _ = compare(base, ['standard', 'cgdp'], 1, args)
        print('[2] 1 device: StandardUpdater {:.3f} s, CGDP {:.3f} s, '
              'CGDP/Standard = {:.3f} (target <= 1.05)'.format(
                  medians['standard'], medians['cgdp'],
                  medians['cgdp'] / medians['standard']))
    if '3' in parts:
        model = models.get_model(args.net, seed=0)
        bandwidth, seconds, n_floats = accumulator_bandwidth(model)
        copy_bw = copy_bandwidth(n_floats)
        print('[3] host accumulator, 4 slots + MomentumSGD over {:.1f} M '
              'parameters: {:.3f} s, {:.2f} GB/s effective; NumPy copy '
              '{:.2f} GB/s; ratio {:.2f} (target >= 0.6)'.format(
                  n_floats / 1e6, seconds, bandwidth / 1e9, copy_bw / 1e9,
                  bandwidth / copy_bw))


if __name__ == '__main__':
    main()
