"""Copies a wheel's ``lib/`` data files (MPICH's libmpi and the libraries
it loads) into a folder: ``python .ci/wheel_lib.py WHEEL DEST``.

``pip install --target`` leaves them out: it installs through a scheme whose
Python packages live under ``lib/``, and when it moves the result into the
target it skips every data folder that holds those packages, ``lib/`` with
them. The wheel's ``bin/`` (mpiexec) does reach the target.
"""
import os
import shutil
import sys
import zipfile

DATA_LIB = '.data/data/lib/'


def copy_lib(wheel, dest):
    """Writes the wheel's ``NAME.data/data/lib/...`` files under ``dest``
    (subfolders kept); returns how many."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            head, found, rest = member.filename.partition(DATA_LIB)
            if not found or '/' in head or member.is_dir():
                continue
            path = os.path.join(dest, *rest.split('/'))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with archive.open(member) as source, open(path, 'wb') as target:
                shutil.copyfileobj(source, target)
            count += 1
    return count


if __name__ == '__main__':
    wheel_path, dest_dir = sys.argv[1:]
    copied = copy_lib(wheel_path, dest_dir)
    if not copied:
        sys.exit('{} holds no lib/ data files'.format(wheel_path))
    print('{} files of lib/ from {} into {}'.format(
        copied, os.path.basename(wheel_path), dest_dir))
