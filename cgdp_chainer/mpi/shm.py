"""MPICH's shared-memory segments, and removing them when MPI cannot.

MPICH (4.2 and later) keeps one POSIX shared-memory segment per job and
node, ``/dev/shm/mpich_shm_<job>_<node>``, from ``MPI_Init`` until
``MPI_Finalize`` unlinks it. A job that ends without finalizing, by
``MPI_Abort`` or by a signal that kills its ranks, leaves the segment (2
MB with two ranks) in ``/dev/shm`` until the machine restarts. The name
only is removed here: processes that still map the segment keep it until
they end, and the memory goes with the last of them.
"""
import os

SHM_FOLDER = '/dev/shm'

# Prefixes of the segments that MPICH names after the job (see
# MPIDI_POSIX_init_shm): the shared slab and its per-VCI part.
MPICH_SEGMENT_PREFIXES = ('mpich_shm_', 'mpich_vci_')


def is_mpich_segment(name):
    """Whether ``name`` (a file name in ``/dev/shm``) is MPICH's segment."""
    return name.startswith(MPICH_SEGMENT_PREFIXES)


def mapped_mpich_segments(pid='self'):
    """Names of the MPICH segments that process ``pid`` maps.

    Args:
        pid (int or str): A process id, or ``'self'``.

    Returns:
        set of str: File names in ``/dev/shm``; empty if the process has
        ended or its maps cannot be read.
    """
    prefix = SHM_FOLDER + '/'
    names = set()
    try:
        with open('/proc/{}/maps'.format(pid)) as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ''
                if path.endswith(' (deleted)') or \
                        not path.startswith(prefix):
                    continue
                name = path[len(prefix):]
                if is_mpich_segment(name):
                    names.add(name)
    except OSError:  # no /proc (not Linux), or the process has ended
        pass
    return names


def unlink_mapped_segments():
    """Unlinks the MPICH segments that this process maps.

    For a rank that is about to end the job without ``MPI_Finalize``
    (``MPI_Abort``): the segments are the job's own (their names hold the
    job's id), and no rank of the job finalizes after an abort.

    Returns:
        list of str: The names removed.
    """
    removed = []
    for name in sorted(mapped_mpich_segments()):
        try:
            os.unlink(os.path.join(SHM_FOLDER, name))
            removed.append(name)
        except OSError:  # another rank removed it first
            pass
    return removed
