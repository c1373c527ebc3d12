"""The cost model's prediction of the points a weak-scaling run measured.

After a network's modes have run, :func:`predict_measured` profiles the
network once on the run's first device, at the run's image size and batch
per device (a few seconds), and predicts every measured single-process
point (``typical``, ``nccl``, ``cgdp`` at each N) on the machine that
profile describes (``this-cpu`` or ``this-gpu``), with CGDP's process
workers. The rows go to ``model.csv`` (the schema of ``summary.csv``, see
:func:`experiments.results.summarize`), and the figures draw them dashed
beside the measured points, so a reader sees where measurement and model
part. Profile and measurement come from the same sitting, since this
machine's speed drifts over minutes.
"""
from cgdp_chainer import costmodel
from cgdp_chainer.costmodel import profiler
from experiments import results
from experiments import train

# The modes the cost model predicts; multi-rank rows are not predicted.
PREDICTED_MODES = (results.TYPICAL, 'nccl', results.CGDP)

# Profile repetitions: enough for a median, few enough for seconds.
PROFILE_REPS = 2


def predict_measured(net, summary, device_spec, n_classes=1000, seed=0):
    """Profiles ``net`` and predicts the measured points of ``summary``.

    Args:
        net (str): The network.
        summary (list of dict): ``summary.csv`` rows of the run.
        device_spec (str): The first device of the run (``'@numpy'`` or
            ``'@cupy:0'``), where the profile is taken.
        n_classes (int): Classes of the run's network.
        seed (int): Seed of the profiled model's weights.

    Returns:
        list of dict: ``model.csv`` rows (``median_s`` is the predicted
        time; ``iqr_s`` is 0), empty if no row can be predicted.
    """
    points = [row for row in summary
              if row['n_ranks'] == 1 and row['mode'] in PREDICTED_MODES]
    if not points:
        return []
    batch, image_size = points[0]['batch_per_device'], points[0]['image_size']
    model = train.build_model(net, n_classes=n_classes, seed=seed)
    profile = profiler.profile_model(model, device_spec, batch, image_size,
                                     reps=PROFILE_REPS, n_classes=n_classes)
    hardware = 'this-gpu' if device_spec.startswith('@cupy') else 'this-cpu'
    predicted = []
    for row in points:
        seconds, _ = costmodel.predict_mode(
            profile, hardware, row['mode'], row['n_devices'],
            row['batch_per_device'], workers='process')
        predicted.append(results.run_row(
            row['mode'], row['n_devices'], row['batch_per_device'],
            row['image_size'], 0, seconds))
    return results.summarize(predicted)
