"""Whether an MPI launcher started this process, and starting MPI.

``mpi4py.MPI`` is imported lazily, inside the functions, so that importing
this module does not start MPI in single-process runs.
"""
import os
import sys


def as_mpi_comm(comm):
    """The mpi4py communicator behind ``comm``.

    Args:
        comm: An ``mpi4py.MPI.Comm`` or a ChainerMN communicator (which
            carries its mpi4py communicator as ``mpi_comm``).

    Returns:
        mpi4py.MPI.Comm: The communicator.
    """
    return getattr(comm, 'mpi_comm', comm)


def thread_level_name(level):
    """``'MPI_THREAD_MULTIPLE'`` and so on for an MPI thread level."""
    from mpi4py import MPI
    names = {MPI.THREAD_SINGLE: 'MPI_THREAD_SINGLE',
             MPI.THREAD_FUNNELED: 'MPI_THREAD_FUNNELED',
             MPI.THREAD_SERIALIZED: 'MPI_THREAD_SERIALIZED',
             MPI.THREAD_MULTIPLE: 'MPI_THREAD_MULTIPLE'}
    return names.get(level, str(level))


def check_thread_support(required=None):
    """Raises unless MPI was started with at least ``required`` threading.

    Args:
        required (int): An ``MPI.THREAD_*`` level; ``None`` means
            ``MPI.THREAD_SERIALIZED``, what :class:`ChunkAllreducer` needs.

    Returns:
        int: The level MPI provides (``MPI.Query_thread()``).

    Raises:
        RuntimeError: MPI provides less.
    """
    from mpi4py import MPI
    if required is None:
        required = MPI.THREAD_SERIALIZED
    provided = MPI.Query_thread()
    if provided < required:
        raise RuntimeError(
            'MPI was started with {}, but a communication thread needs at '
            'least {}. Set mpi4py.rc.thread_level = "multiple" (mpi4py\'s '
            'default) before the first "from mpi4py import MPI", or call '
            'cgdp_chainer.mpi.init_mpi() first.'.format(
                thread_level_name(provided), thread_level_name(required)))
    return provided


def init_mpi(thread_level='multiple'):
    """Starts MPI with thread support (if not started yet) and checks it.

    Args:
        thread_level (str): mpi4py's name of the level to ask for:
            ``'multiple'`` (default) or ``'serialized'``.

    Returns:
        module: ``mpi4py.MPI``.

    Raises:
        RuntimeError: MPI was started before with too little thread
            support, or the library cannot give ``MPI_THREAD_SERIALIZED``.
    """
    import mpi4py
    if 'mpi4py.MPI' not in sys.modules:
        mpi4py.rc.thread_level = thread_level
    from mpi4py import MPI
    if not MPI.Is_initialized():
        levels = {'multiple': MPI.THREAD_MULTIPLE,
                  'serialized': MPI.THREAD_SERIALIZED}
        MPI.Init_thread(levels[thread_level])
    check_thread_support()
    return MPI


# Variables that MPI launchers put into every rank's environment: MPICH's and
# Intel MPI's Hydra ``mpiexec`` and Slurm's ``srun --mpi=pmi2`` (PMI_SIZE;
# Hydra also MPI_LOCALNRANKS), Open MPI's ``mpirun`` (OMPI_COMM_WORLD_SIZE)
# and PMIx launchers (PMIX_RANK).
LAUNCH_VARIABLES = ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE', 'MPI_LOCALNRANKS',
                    'PMIX_RANK')


def launched_with_mpi(environ=None):
    """True when an MPI launcher (``mpiexec``, ``mpirun``, ``srun``) started
    this process, with any number of ranks (``mpiexec -n 1`` too).

    Looks at environment variables only (:data:`LAUNCH_VARIABLES`), so a
    plain ``python ...`` run never starts MPI. This is the one test of "am
    I under MPI" that the experiment scripts use.

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.

    Returns:
        bool: Whether a launcher's variable is set.
    """
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in LAUNCH_VARIABLES)


def world(environ=None):
    """``MPI.COMM_WORLD`` under an MPI launch, ``None`` otherwise.

    Under a launch (see :func:`launched_with_mpi`) MPI is started with
    thread support (:func:`init_mpi`); otherwise MPI is not touched.

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.

    Returns:
        mpi4py.MPI.Comm or None: The world communicator.
    """
    if not launched_with_mpi(environ):
        return None
    return init_mpi().COMM_WORLD


def node_ranks(comm):
    """This rank's place among the ranks on its own machine. Collective.

    Ranks that share a machine share its cores (and GPUs): the experiment
    scripts divide them by this.

    Args:
        comm: ``mpi4py.MPI.Comm`` or a ChainerMN communicator.

    Returns:
        tuple of int: ``(local_rank, local_size)``.
    """
    from mpi4py import MPI
    comm = as_mpi_comm(comm)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


# (rank variable, size variable) that launchers set: MPICH's and Intel MPI's
# Hydra and Slurm's PMI (PMI_*), Open MPI (OMPI_COMM_WORLD_*), Slurm itself.
RANK_AND_SIZE_VARIABLES = (('PMI_RANK', 'PMI_SIZE'),
                           ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
                           ('SLURM_PROCID', 'SLURM_NTASKS'))


def launcher_size(environ=None):
    """The number of ranks that the launcher's variables say it started
    (None where none says), whatever MPI itself reports: a process whose
    MPI library is not the launcher's starts as a rank of its own.

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.
    """
    environ = os.environ if environ is None else environ
    for _, size_name in RANK_AND_SIZE_VARIABLES:
        size = environ.get(size_name)
        if size and size.isdigit():
            return int(size)
    return None


def launch_rank_and_size(environ=None):
    """This process's rank and the number of ranks of its MPI launch.

    Read from MPI if it is running already, else from the launcher's
    environment; only where neither tells (a PMIx launch) is MPI started
    (:func:`world`).

    Args:
        environ (dict or None): The environment; ``os.environ`` if ``None``.

    Returns:
        tuple of int or None: ``(rank, size)``; ``None`` when no launcher
        started this process.
    """
    environ = os.environ if environ is None else environ
    if not launched_with_mpi(environ):
        return None
    if 'mpi4py.MPI' in sys.modules:
        MPI = sys.modules['mpi4py.MPI']
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    for rank_name, size_name in RANK_AND_SIZE_VARIABLES:
        rank, size = environ.get(rank_name), environ.get(size_name)
        if rank and size and rank.isdigit() and size.isdigit():
            return int(rank), int(size)
    comm = world(environ)
    return comm.Get_rank(), comm.Get_size()


# Names the mpiexec to launch this project's MPI jobs with, where none is
# next to the interpreter: .ci/gpu_check.sh sets it to the MPICH that it
# installs from a carried wheel on a machine without one.
MPIEXEC_VARIABLE = 'CGDP_MPIEXEC'


def find_mpiexec(environ=None, python=None):
    """The mpiexec that launches this project's MPI jobs, or None.

    :data:`MPIEXEC_VARIABLE` wins where it is set (and not empty): it
    names the launcher of the MPI that mpi4py loads. Otherwise the
    mpiexec next to the interpreter (the venv's ``mpich`` wheel). An
    mpiexec elsewhere on ``PATH`` is never taken: its MPI may not be the
    one mpi4py loads, and ranks of another MPI each start as a world of
    their own.

    Args:
        environ (dict or None): The environment; ``os.environ`` if None.
        python (str or None): The interpreter; ``sys.executable`` if None.

    Returns:
        str or None: The mpiexec's path; None where there is none.

    Raises:
        FileNotFoundError: The variable names no executable file.
    """
    environ = os.environ if environ is None else environ
    named = environ.get(MPIEXEC_VARIABLE)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise FileNotFoundError(
                '{}={} is not an executable file: point it at the mpiexec '
                "of the MPI that mpi4py loads (.ci/gpu_check.sh sets it "
                "to the MPICH that it installs), or unset it to use the "
                'mpiexec next to the interpreter'.format(
                    MPIEXEC_VARIABLE, named))
        return named
    beside = os.path.join(
        os.path.dirname(sys.executable if python is None else python),
        'mpiexec')
    return beside if os.path.exists(beside) else None


def no_mpiexec_words(python=None):
    """Where :func:`find_mpiexec` looked, for a message that it found none.

    Args:
        python (str or None): The interpreter; ``sys.executable`` if None.
    """
    return 'no mpiexec next to {} and {} unset'.format(
        sys.executable if python is None else python, MPIEXEC_VARIABLE)
