"""The start-up check that every rank trains the same model with the same
optimizer, and the broadcast of rank 0's weights."""
import numpy

from cgdp_chainer.mpi.launch import as_mpi_comm


def describe_setup(model, optimizer):
    """What has to match between the ranks, in a picklable form.

    Args:
        model (chainer.Link): The model.
        optimizer (chainer.Optimizer): Its optimizer (a ChainerMN
            multi-node optimizer is looked through).

    Returns:
        dict: ``parameters``: list of ``(name, shape, dtype)`` sorted by
        name (shape ``None`` while uninitialized); ``optimizer``: class
        name; ``hyperparameters``: dict of name to ``repr`` of the value;
        ``hooks``: list of hook names.
    """
    parameters = []
    for name, param in sorted(model.namedparams()):
        if param.array is None:
            parameters.append((name, None, None))
        else:
            parameters.append((name, tuple(param.shape),
                               str(param.array.dtype)))
    actual = getattr(optimizer, 'actual_optimizer', optimizer)
    # repr keeps the comparison exact and the message readable.
    hyperparameters = {
        key: repr(value)
        for key, value in sorted(actual.hyperparam.get_dict().items())}
    hooks = []
    for attribute in ('_pre_update_hooks', '_post_update_hooks'):
        # None until the optimizer is set up or a hook is added.
        hooks.extend(getattr(actual, attribute, None) or {})
    return {'parameters': parameters,
            'optimizer': type(actual).__name__,
            'hyperparameters': hyperparameters,
            'hooks': hooks}


def _shape_text(shape):
    return 'uninitialized' if shape is None else str(shape)


def first_difference(reference, other, reference_rank, other_rank):
    """The first way ``other`` differs from ``reference``, in words.

    Args:
        reference (dict): :func:`describe_setup` of ``reference_rank``.
        other (dict): :func:`describe_setup` of ``other_rank``.
        reference_rank (int): Rank that ``reference`` comes from.
        other_rank (int): Rank that ``other`` comes from.

    Returns:
        str or None: A sentence naming the difference; ``None`` if equal.
    """
    ref, oth = 'rank {}'.format(reference_rank), 'rank {}'.format(other_rank)
    ref_params = {name: (shape, dtype)
                  for name, shape, dtype in reference['parameters']}
    oth_params = {name: (shape, dtype)
                  for name, shape, dtype in other['parameters']}
    for name in sorted(set(ref_params) | set(oth_params)):
        if name not in oth_params:
            return '{} has no parameter {}, {} has it (shape {})'.format(
                oth, name, ref, _shape_text(ref_params[name][0]))
        if name not in ref_params:
            return '{} has parameter {} (shape {}), {} does not'.format(
                oth, name, _shape_text(oth_params[name][0]), ref)
        (ref_shape, ref_dtype), (oth_shape, oth_dtype) = (
            ref_params[name], oth_params[name])
        if ref_shape != oth_shape:
            return '{} has parameter {} of shape {}, {} has {}'.format(
                oth, name, _shape_text(oth_shape), ref,
                _shape_text(ref_shape))
        if ref_dtype != oth_dtype:
            return '{} has parameter {} of dtype {}, {} has {}'.format(
                oth, name, oth_dtype, ref, ref_dtype)
    if reference['optimizer'] != other['optimizer']:
        return '{} uses optimizer {}, {} uses {}'.format(
            oth, other['optimizer'], ref, reference['optimizer'])
    ref_hyper, oth_hyper = (reference['hyperparameters'],
                            other['hyperparameters'])
    for key in sorted(set(ref_hyper) | set(oth_hyper)):
        if key not in oth_hyper:
            return ('{} has no optimizer hyperparameter {}, {} has {}={}'
                    .format(oth, key, ref, key, ref_hyper[key]))
        if key not in ref_hyper:
            return ('{} has optimizer hyperparameter {}={}, {} does not'
                    .format(oth, key, oth_hyper[key], ref))
        if ref_hyper[key] != oth_hyper[key]:
            return ('{} has optimizer hyperparameter {}={}, {} has {}={}'
                    .format(oth, key, oth_hyper[key], ref, key,
                            ref_hyper[key]))
    if reference['hooks'] != other['hooks']:
        return '{} has optimizer hooks {}, {} has {}'.format(
            oth, other['hooks'], ref, reference['hooks'])
    return None


def check_consistency(comm, model, optimizer):
    """Checks that every rank trains the same model with the same optimizer.

    Compares parameter names, shapes and dtypes, the optimizer's class,
    hyperparameters and hooks. Collective: call it on every rank, from the
    main thread, before training (before a :class:`ChunkAllreducer` runs,
    unless MPI gives ``MPI_THREAD_MULTIPLE``).

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        model (chainer.Link): This rank's model.
        optimizer (chainer.Optimizer): This rank's optimizer.

    Raises:
        ValueError: On EVERY rank when any rank differs from rank 0; the
            message names the first difference of the lowest such rank,
            e.g. ``rank 1 has parameter /predictor/fc8/W of shape
            (10, 4096), rank 0 has (1000, 4096)``.
    """
    comm = as_mpi_comm(comm)
    descriptions = comm.allgather(describe_setup(model, optimizer))
    # Every rank compares all descriptions the same way, so every rank
    # reaches the same verdict and raises the same message.
    for rank in range(1, len(descriptions)):
        difference = first_difference(descriptions[0], descriptions[rank],
                                      0, rank)
        if difference is not None:
            raise ValueError(
                'the ranks differ in model or optimizer: {} (every rank '
                'must build the same model and optimizer)'.format(difference))


def broadcast_parameters(comm, model, root=0):
    """Copies rank ``root``'s parameter values to every rank, in place.

    Collective. Ranks that built their models with different random
    initializations start from the same weights afterwards.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        model (chainer.Link): The model, with host (numpy) parameters, all
            initialized.

    Raises:
        TypeError: A parameter is not a numpy array (move the model to
            the host first).
    """
    comm = as_mpi_comm(comm)
    for name, param in sorted(model.namedparams()):
        if not isinstance(param.array, numpy.ndarray):
            raise TypeError('parameter {} is {}, not a host numpy array'
                            .format(name, type(param.array).__name__))
        array = param.array
        if array.flags.c_contiguous:
            comm.Bcast(array, root=root)
        else:
            buffer = numpy.ascontiguousarray(array)
            comm.Bcast(buffer, root=root)
            array[...] = buffer
