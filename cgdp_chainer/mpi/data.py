"""Data sharding: each rank's part of the dataset, ChainerMN's way."""
import numpy

from cgdp_chainer.mpi.launch import as_mpi_comm


def shard_range(n_examples, rank, size):
    """``(begin, end)`` of rank ``rank``'s shard, ChainerMN's way.

    Every shard has ``ceil(n_examples / size)`` examples (equal lengths keep
    the ranks' iterators in step); when ``size`` does not divide
    ``n_examples`` neighbouring shards overlap by a few examples.

    Args:
        n_examples (int): Length of the dataset.
        rank (int): The rank.
        size (int): Number of ranks.

    Returns:
        tuple of int: Begin (inclusive) and end (exclusive).
    """
    shard_length = (n_examples + size - 1) // size
    begin = n_examples * rank // size
    return begin, begin + shard_length


def shard_dataset(dataset, comm, shuffle=False, seed=0):
    """This rank's part of ``dataset``, like ``chainermn.scatter_dataset``.

    Every rank passes the same dataset (each loads it itself; nothing is
    sent). With a per-rank batch of ``B / size`` examples, iteration ``i``
    on the ranks together covers a global batch of ``B`` examples: the
    union of the ranks' batches.

    Args:
        dataset: A dataset (list, array, ``TupleDataset``, ...).
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.
        shuffle (bool): Permute the examples (the same permutation on every
            rank) before splitting.
        seed (int): Seed of the permutation; ``None``: rank 0 draws one.

    Returns:
        chainer.datasets.SubDataset: The shard.

    Raises:
        ValueError: The ranks' datasets have different lengths.
    """
    import chainer
    comm = as_mpi_comm(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    lengths = comm.allgather(len(dataset))
    if len(set(lengths)) != 1:
        raise ValueError('the ranks pass datasets of different lengths {}; '
                         'every rank must pass the same dataset'.format(
                             lengths))
    order = None
    if shuffle:
        if seed is None:
            seed = comm.bcast(
                int(numpy.random.randint(2 ** 31)) if rank == 0 else None,
                root=0)
        order = numpy.random.RandomState(seed).permutation(len(dataset))
    begin, end = shard_range(len(dataset), rank, size)
    return chainer.datasets.SubDataset(dataset, begin, end, order)
