"""The cost model checked against :mod:`benchmarks.gpu`'s measurement.

In the same sitting as the measurement of a network and batch (a profile
and a measurement taken apart differ by the machine's drift), it:

1. profiles the network per layer on the device
   (:func:`cgdp_chainer.costmodel.profiler.profile_model`: layer times,
   host-device copies from page-locked and from pageable memory, the host
   accumulator's costs, the device's update);
2. predicts, with the hardware that profile describes
   (:func:`cgdp_chainer.costmodel.hardware_from_profile`: ``this-gpu`` on
   a GPU, ``this-cpu`` on ``'@numpy'``), StandardUpdater's iteration (the
   model's ``typical`` at N = 1) and CGDP's with each worker kind at the
   chunking the measured run used, against the measured medians, with the
   median absolute error;
3. predicts the weak-scaling efficiency (``t(1) / t(N)`` within each
   scheme) of 2, 4 and 8 such devices on one host: each device with a link
   of the measured page-locked bandwidth to the same host (one socket),
   the host's measured figures unchanged; CGDP at the runtime's default
   chunks with worker processes.
"""
import os
import statistics

from cgdp_chainer import costmodel
from cgdp_chainer.costmodel import profiler
from experiments import results
from experiments import train
from experiments import validate_model

# The profile's repetitions (median): the GPU's layer times vary little.
PROFILE_REPS = 3
SCALING_DEVICES = (2, 4, 8)
MODEL_FILE = 'gpu_model.csv'
SCALING_FILE = 'gpu_scaling.csv'
MODEL_COLUMNS = ('net', 'batch', 'run', 'chunking', 'measured_ms',
                 'predicted_ms', 'error')
SCALING_COLUMNS = ('net', 'batch', 'n_devices', 'eff_typical', 'eff_cgdp',
                   'eff_nccl')
LINK_COLUMNS = ('h2d_bytes_per_s', 'd2h_bytes_per_s',
                'h2d_pageable_bytes_per_s', 'd2h_pageable_bytes_per_s',
                'latency_s', 'memory_bytes_per_s')
# benchmarks.gpu's runs the model predicts: run -> (model's mode,
# CGDP's worker kind).
PREDICTED_RUNS = (('standard', costmodel.TYPICAL, None),
                  ('cgdp-process', costmodel.CGDP, 'process'),
                  ('cgdp-thread', costmodel.CGDP, 'thread'))


def new_report():
    """An empty report: ``rows`` (predicted against measured),
    ``scaling`` and ``links`` (per network and batch)."""
    return {'rows': [], 'scaling': [], 'links': []}


def profile_now(net, spec, batch, image_size, reps):
    """The profile of ``net`` on the device ``spec`` at this batch.

    Args:
        net (str): The network (name or ``module:callable``).
        spec (str): ``'@cupy:N'`` or ``'@numpy'``.
        batch (int): Images per pass.
        image_size (int): Image side.
        reps (int): Timed repetitions (median).
    """
    model = train.build_model(net, seed=0)
    profile = profiler.profile_model(model, spec, batch, image_size,
                                     reps=reps)
    profile['net'] = net
    return profile


def scaled_hardware(hardware, n_devices):
    """The profiled machine with ``n_devices`` such devices on one host
    (one socket, a link each); hypothetical past the devices it has."""
    return hardware.replace(
        physical_devices=max(hardware.physical_devices, n_devices),
        devices_per_socket=max(hardware.devices_per_socket, n_devices))


def predicted_rows(profile, hardware, net, batch, measured_row, chunking):
    """Predicted against measured seconds of each of
    :data:`PREDICTED_RUNS`.

    Args:
        measured_row (dict): :mod:`benchmarks.gpu`'s row (``*_ms``).
        chunking (dict): Run -> the chunk size its CGDPUpdater resolved
            (``None``: the runtime's default chunks).
    """
    n_layers = len(profile['layers'])
    rows = []
    for run, mode, workers in PREDICTED_RUNS:
        size = None
        if mode == costmodel.CGDP:
            size = validate_model.runtime_chunking(chunking.get(run),
                                                   n_layers)
        predicted, _ = costmodel.predict_mode(
            profile, hardware, mode, 1, batch, size, workers or 'process')
        measured = measured_row['{}_ms'.format(run.replace('-', '_'))]
        rows.append({
            'net': net, 'batch': batch, 'run': run,
            'chunking': None if size is None else
            costmodel.describe_chunking(size),
            'measured_ms': measured, 'predicted_ms': 1e3 * predicted,
            'error': 1e3 * predicted / measured - 1.0})
    return rows


def scaling_rows(profile, hardware, net, batch, chunking):
    """Predicted weak-scaling efficiencies at :data:`SCALING_DEVICES`."""
    size = validate_model.runtime_chunking(chunking.get('cgdp-process'),
                                           len(profile['layers']))
    hardware = scaled_hardware(hardware, max(SCALING_DEVICES))
    single = costmodel.predict(profile, hardware, 1, batch, chunk_size=size)
    rows = []
    for n in SCALING_DEVICES:
        point = costmodel.predict(profile, hardware, n, batch,
                                  chunk_size=size, single=single)
        rows.append({'net': net, 'batch': batch, 'n_devices': n,
                     'eff_typical': point['eff_typical'],
                     'eff_cgdp': point['eff_cgdp'],
                     'eff_nccl': point['eff_nccl']})
    return rows


def check(report, net, batch, image_size, spec, measured_row, chunking,
          reps=PROFILE_REPS):
    """Profiles one network and batch now and adds the predictions to
    ``report`` (see :func:`new_report`)."""
    profile = profile_now(net, spec, batch, image_size, reps)
    hardware = costmodel.hardware_from_profile(profile)
    report['rows'] += predicted_rows(profile, hardware, net, batch,
                                     measured_row, chunking)
    report['scaling'] += scaling_rows(profile, hardware, net, batch,
                                      chunking)
    link = {'net': net, 'batch': batch}
    link.update({key: profile['copy'].get(key) for key in LINK_COLUMNS})
    report['links'].append(link)
    report['hardware'] = hardware.name
    print(progress_line(report), flush=True)


def progress_line(report):
    """The last network and batch's predictions in one line (what a run
    cut short by a time limit still shows)."""
    rows = report['rows'][-len(PREDICTED_RUNS):]
    link = report['links'][-1]
    scaling = report['scaling'][-len(SCALING_DEVICES):]
    return ('[model] {} batch {}: predicted {}; host->device {:.1f} GB/s '
            'page-locked, {:.1f} pageable; CGDP efficiency at N={}: '
            '{}'.format(
                link['net'], link['batch'], ', '.join(
                    '{} {:.1f} ms ({:+.0%})'.format(
                        row['run'], row['predicted_ms'], row['error'])
                    for row in rows),
                link['h2d_bytes_per_s'] / 1e9,
                link['h2d_pageable_bytes_per_s'] / 1e9,
                '/'.join(str(n) for n in SCALING_DEVICES),
                '/'.join('{:.2f}'.format(row['eff_cgdp'])
                         for row in scaling)))


def median_error(report):
    """The median absolute error of the predictions (``None`` if none)."""
    errors = [abs(row['error']) for row in report['rows']]
    return statistics.median(errors) if errors else None


def print_report(report):
    """Prints predicted against measured, the link and the scaling."""
    print()
    print('cost model ({} preset from this sitting\'s profiles) against '
          'the measurement, N = 1:'.format(report.get('hardware')))
    print('{:<10} {:>5} {:<13} {:>19} {:>10} {:>10} {:>8}'.format(
        'network', 'batch', 'run', 'chunking', 'measured', 'predicted',
        'error'))
    for row in report['rows']:
        print('{:<10} {:>5} {:<13} {:>19} {:>8.1f}ms {:>8.1f}ms {:>+7.1%}'
              .format(row['net'], row['batch'], row['run'],
                      row['chunking'] or '-', row['measured_ms'],
                      row['predicted_ms'], row['error']))
    error = median_error(report)
    if error is not None:
        print('median absolute error: {:.1%} (target <= {:.0%})'.format(
            error, validate_model.TARGET_MEDIAN_ERROR))
    for link in report['links']:
        print('link ({} batch {}): host->device {:.2f} GB/s page-locked, '
              '{:.2f} GB/s pageable; device->host {:.2f} / {:.2f} GB/s; '
              'host memcpy {:.2f} GB/s'.format(
                  link['net'], link['batch'],
                  link['h2d_bytes_per_s'] / 1e9,
                  link['h2d_pageable_bytes_per_s'] / 1e9,
                  link['d2h_bytes_per_s'] / 1e9,
                  link['d2h_pageable_bytes_per_s'] / 1e9,
                  link['memory_bytes_per_s'] / 2e9))
    print('predicted weak-scaling efficiency of N such devices on one '
          'host (t(1) / t(N)):')
    for row in report['scaling']:
        print('  {} batch {} N={}: typical {:.2f}, CGDP {:.2f}{}'.format(
            row['net'], row['batch'], row['n_devices'], row['eff_typical'],
            row['eff_cgdp'], '' if row['eff_nccl'] is None else
            ', NCCL {:.2f}'.format(row['eff_nccl'])), flush=True)


def write_tables(out, report):
    """Writes the predictions and the scaling as CSV under ``out`` (no
    file without a report)."""
    if report is None:
        return
    results.write_csv(os.path.join(out, MODEL_FILE), MODEL_COLUMNS,
                      report['rows'])
    results.write_csv(os.path.join(out, SCALING_FILE), SCALING_COLUMNS,
                      report['scaling'])
