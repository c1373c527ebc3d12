"""Writing results files so that a crash never leaves a truncated one.

Every results file of the project (CSV, JSON, trace, figure, profile) is
written through :func:`atomic_write` or :func:`atomic_path`: the content
goes to a temporary file in the same folder, which is renamed over the
target only once it is complete. A crash, Ctrl-C or a full disk while
writing leaves the previous file (or none) and never a file cut short;
the rename is atomic because both names are on the same file system.

:func:`check_writable_folder` and :func:`check_writable_file` probe an
output path before any work starts, so that a run does not end, hours in,
with nowhere to put its results. They create nothing.

Low level on purpose: this module imports nothing of Chainer or NumPy, so
the runtime can use it as well as the experiment scripts.
"""
import contextlib
import os
import tempfile

# The hidden prefix keeps a temporary file out of globs such as
# ``snapshot_iter_*`` and out of sight in a listing while it is written.
_TEMPORARY_PREFIX = '.'
_TEMPORARY_MARK = '.tmp'


def _file_mode():
    """Permission bits a plain ``open()`` would give a new file."""
    # mkstemp creates files readable by the owner only; a results file
    # should get the usual bits, 0o666 less the umask. Linux reports the
    # umask in /proc; elsewhere reading it means setting it and back.
    try:
        with open('/proc/self/status') as status:
            for line in status:
                if line.startswith('Umask:'):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


def _temporary_name(path):
    """A new, empty temporary file next to ``path``; returns its name.

    The name keeps ``path``'s extension, so writers that choose the format
    from the name (``matplotlib``'s ``savefig``) write the same format.
    """
    folder, name = os.path.split(os.path.abspath(path))
    extension = os.path.splitext(name)[1]
    handle, temporary = tempfile.mkstemp(
        prefix='{}{}.'.format(_TEMPORARY_PREFIX, name),
        suffix=_TEMPORARY_MARK + extension, dir=folder)
    os.close(handle)
    os.chmod(temporary, _FILE_MODE)
    return temporary


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _flush_to_disk(path):
    # Without this, a power cut shortly after the rename could leave the new
    # name pointing at blocks that were never written.
    with open(path, 'rb+') as written:
        os.fsync(written.fileno())


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary file name that replaces ``path`` on success.

    For writers that want a file name rather than a file object
    (``figure.savefig(name)``, ``numpy.savez(name, ...)``). When the block
    ends normally the temporary file is renamed to ``path``; when it
    raises, the temporary file is removed and ``path`` is left as it was.

    Args:
        path (str): The file to write. Its folder must exist.

    Yields:
        str: The temporary file's name, in ``path``'s folder, with
        ``path``'s extension. It exists (empty) when the block starts.

    Raises:
        OSError: The folder does not exist or cannot be written; or the
            rename failed (``path`` is then unchanged).
    """
    temporary = _temporary_name(path)
    try:
        yield temporary
        _flush_to_disk(temporary)
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise


@contextlib.contextmanager
def atomic_write(path, mode='w', **open_kwargs):
    """Opens a temporary file that replaces ``path`` once it is closed.

    Use as ``with atomic_write(path) as f: f.write(...)``. Readers see
    either the previous content of ``path`` or the complete new one, never
    a part: the content is written to a temporary file in the same folder,
    flushed to disk and renamed over ``path`` when the block ends normally.
    If the block raises, the temporary file is removed and ``path`` keeps
    its previous content (or stays absent).

    Args:
        path (str): The file to write. Its folder must exist.
        mode (str): ``'w'`` (text) or ``'wb'`` (binary); a write mode that
            creates the file anew.
        **open_kwargs: Further arguments of :func:`open` (``newline=''``,
            ``encoding=...``).

    Yields:
        file: The open temporary file.

    Raises:
        ValueError: ``mode`` is not ``'w'`` or ``'wb'``.
        OSError: As :func:`atomic_path`.
    """
    if mode not in ('w', 'wb'):
        raise ValueError("mode must be 'w' or 'wb', got {!r}".format(mode))
    with atomic_path(path) as temporary:
        with open(temporary, mode, **open_kwargs) as stream:
            yield stream


def _nearest_existing(path):
    """``path`` or its nearest ancestor that exists."""
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _probe_folder(folder):
    """Creates and removes a file in ``folder``; the OSError if it fails."""
    try:
        handle, probe = tempfile.mkstemp(prefix=_TEMPORARY_PREFIX + 'probe.',
                                         dir=folder)
    except OSError as error:
        return error
    os.close(handle)
    _remove_quietly(probe)
    return None


def check_writable_folder(path):
    """Raises ``ValueError`` unless ``path`` is, or can become, a folder
    that takes new files.

    A folder that exists is probed by creating and removing a file in it;
    for one that does not, its nearest existing ancestor must be a folder
    that takes new files (the missing folders are then created later, by
    whoever writes). Nothing is left behind.

    Args:
        path (str): The output folder.

    Raises:
        ValueError: ``path`` (or an ancestor) is a file, or the folder or
            its nearest existing ancestor cannot be written; the message
            says which and why.
    """
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        if existing == os.path.abspath(path):
            raise ValueError('{} is a file, not a folder'.format(path))
        raise ValueError('cannot create folder {}: {} is a file, not a '
                         'folder'.format(path, existing))
    error = _probe_folder(existing)
    if error is not None:
        if existing == os.path.abspath(path):
            raise ValueError('cannot write into folder {}: {}'.format(
                path, error.strerror or error))
        raise ValueError('cannot create folder {}: cannot write into {}: '
                         '{}'.format(path, existing,
                                     error.strerror or error))


def check_writable_file(path):
    """Raises ``ValueError`` unless a file can be written at ``path``.

    Probes the file's folder with :func:`check_writable_folder`; ``path``
    itself must not be a folder. Nothing is created.

    Args:
        path (str): The output file.

    Raises:
        ValueError: ``path`` is a folder, or its folder cannot be written
            or created.
    """
    if os.path.isdir(path):
        raise ValueError('{} is a folder, not a file'.format(path))
    folder = os.path.dirname(os.path.abspath(path))
    check_writable_folder(folder)
