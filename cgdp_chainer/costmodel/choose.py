"""The chunk size the model predicts to be fastest, for
``CGDPUpdater(chunk_size='model')``.

The runtime never imports the cost model: a user who wants the model's
choice passes a :class:`ModelChunkChooser` as ``chunk_size``, and the
updater calls it once, before its first iteration, with what it knows
(its first replica, that replica's device, the first batch's arrays on it,
the device count, the loss function, its host threads, its worker kind and
its optimizer).
"""
from cgdp_chainer.costmodel import hardware as hardware_module
from cgdp_chainer.costmodel import inputs
from cgdp_chainer.costmodel import predictions


def choose_chunk_size(profile, n_devices, hardware=None,
                      batch_per_device=None, workers='process',
                      optimizer='momentum_sgd'):
    """The chunk size the cost model predicts to be fastest.

    Args:
        profile (dict): A profile (see :func:`inputs.check_profile`).
        n_devices (int): Replicas.
        hardware (str, Hardware or None): The machine; ``None`` means the
            machine the profile was measured on.
        batch_per_device (int or None): Default: the profile's batch.
        workers (str): The updater's worker kind, ``'process'`` or
            ``'thread'``.
        optimizer (str or chainer.Optimizer): See
            :func:`inputs.check_optimizer`.

    Returns:
        int: The chunk size.
    """
    return _choice(profile, n_devices, hardware, batch_per_device,
                   workers, optimizer)[0]


def _choice(profile, n_devices, hardware, batch_per_device, workers,
            optimizer):
    inputs.check_n_devices(n_devices)
    inputs.check_workers(workers)
    optimizer = inputs.check_optimizer(optimizer)
    if hardware is None:
        hw = predictions.hardware_from_profile(profile)
    else:
        hw = hardware_module.get_hardware(hardware, profile)
    batch = batch_per_device or int(profile.get('batch') or 1)
    workload = inputs.build_workload(profile, hw, batch, optimizer)
    return predictions.best_chunk_size(workload, hw, n_devices,
                                       workers=workers)


def _model_optimizer(optimizer):
    """The model's name for an optimizer. A name must be one the model
    knows; an optimizer of another class is costed as MomentumSGD (the
    chunk choice depends on the update only through its cost)."""
    if optimizer is None:
        return 'momentum_sgd'
    if isinstance(optimizer, str):
        return inputs.check_optimizer(optimizer)
    try:
        return inputs.check_optimizer(optimizer)
    except ValueError:
        return 'momentum_sgd'


def profile_for_choice(replica, device, in_arrays, loss_func=None,
                       host_threads=1, reps=2, statistic='median',
                       optimizer='momentum_sgd'):
    """Profiles a replica on a batch for the chunk choice.

    :func:`cgdp_chainer.costmodel.profiler.profile_replica` does the
    measuring and leaves the replica's persistent values and NumPy's random
    state as they were.

    Args:
        replica (chainer.Link): Any model on ``device``.
        device (chainer.backend.Device): Its device.
        in_arrays (tuple): ``(x, labels...)`` on ``device``.
        loss_func (callable or None): ``loss_func(*in_arrays)``, as the
            updater's.
        host_threads (int): The updater's host threads.
        reps (int): Timed repetitions.
        statistic (str): ``'median'`` or ``'min'``.
        optimizer (str): The optimizer whose host update is measured.

    Returns:
        dict: The profile, its ``hardware`` naming the machine profiled.
    """
    from cgdp_chainer.costmodel import profiler
    profile = profiler.profile_replica(
        replica, device, in_arrays, loss_func=loss_func,
        host_threads=host_threads, reps=reps, statistic=statistic,
        optimizers=(optimizer,))
    profile['hardware'] = 'this-gpu' if device.xp.__name__ == 'cupy' \
        else 'this-cpu'
    return profile


def choose_chunk_size_for_replica(replica, device, in_arrays, n_devices,
                                  loss_func=None, host_threads=1,
                                  workers='process', optimizer=None):
    """Profiles one replica on a batch and picks the chunk size.

    Args:
        replica (chainer.Link): Any model on ``device``.
        device (chainer.backend.Device): Its device.
        in_arrays (tuple): ``(x, labels...)`` on ``device`` (one device's
            share of a batch).
        n_devices (int): Replicas the updater runs.
        loss_func (callable or None): ``loss_func(*in_arrays)``, as the
            updater's.
        host_threads (int): The updater's host accumulator threads.
        workers (str): The updater's worker kind, ``'process'`` or
            ``'thread'``.
        optimizer (chainer.Optimizer, str or None): The updater's optimizer
            (its update's host cost); ``None`` or another optimizer is
            costed as MomentumSGD.

    Returns:
        int: The chunk size.
    """
    return ModelChunkChooser()(replica, device, in_arrays, n_devices,
                               loss_func=loss_func,
                               host_threads=host_threads, workers=workers,
                               optimizer=optimizer)


class ModelChunkChooser(object):
    """``CGDPUpdater(chunk_size=ModelChunkChooser())``: the model's choice.

    The updater calls it once with its first replica and batch; it
    profiles the replica there (a few passes), predicts each candidate
    chunk size's iteration on the machine the profile describes and
    returns the fastest. What it decided stays on the object.

    Args:
        hardware (str, Hardware or None): The machine to predict for;
            ``None``: the one profiled (``this-cpu`` or ``this-gpu``).
        reps (int): Profile repetitions (median).
        statistic (str): ``'median'`` or ``'min'`` of the repetitions.

    The model predicts per layer (a link that directly owns parameters,
    as the runtime's chunks count them), so the choice is the runtime's
    ``chunk_size``: layers per chunk, for any model.

    Attributes:
        profile (dict or None): The last profile taken.
        choice (int or None): The last chunk size chosen (layers).
        predicted (dict): Chunk size -> predicted seconds per iteration of
            the last choice.
    """

    def __init__(self, hardware=None, reps=2, statistic='median'):
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise ValueError('reps must be an integer >= 1, got {!r}'.format(
                reps))
        if statistic not in ('median', 'min'):
            raise ValueError("statistic must be 'median' or 'min', got "
                             "{!r}".format(statistic))
        if hardware is not None and not isinstance(
                hardware, hardware_module.Hardware) and \
                hardware not in hardware_module.PRESET_NAMES:
            raise ValueError('hardware must be None (the machine profiled), '
                             'a Hardware or one of {}, got {!r}'.format(
                                 ', '.join(hardware_module.PRESET_NAMES),
                                 hardware))
        self.hardware = hardware
        self.reps = reps
        self.statistic = statistic
        self.profile = None
        self.choice = None
        self.predicted = {}

    def __call__(self, replica, device, in_arrays, n_devices, loss_func=None,
                 host_threads=1, workers='process', optimizer=None):
        """Profiles ``replica`` and returns the chunk size (see
        :func:`choose_chunk_size_for_replica` for the arguments)."""
        inputs.check_n_devices(n_devices)
        inputs.check_workers(workers)
        if isinstance(host_threads, bool) or not isinstance(
                host_threads, int) or host_threads < 1:
            raise ValueError('host_threads must be an integer >= 1, got '
                             '{!r}'.format(host_threads))
        if not isinstance(in_arrays, tuple):
            in_arrays = (in_arrays,)
        profile = profile_for_choice(replica, device, in_arrays, loss_func,
                                     host_threads, self.reps, self.statistic,
                                     _model_optimizer(optimizer))
        return self.choose_from_profile(profile, n_devices, workers,
                                        optimizer)

    def choose_from_profile(self, profile, n_devices, workers='process',
                            optimizer=None):
        """The choice for a profile already taken (records it like a
        call)."""
        size, times = _choice(profile, n_devices, self.hardware, None,
                              workers, _model_optimizer(optimizer))
        self.profile = profile
        self.choice = size
        self.predicted = times
        return size

    def __repr__(self):
        return 'ModelChunkChooser(hardware={!r}, reps={}, statistic={!r})'\
            .format(self.hardware, self.reps, self.statistic)
