"""A process that reads a dataset's examples from given global random
states: how a batch whose ``get_example`` draws from NumPy's or Python's
global random state is read ahead exactly.

The parent sends the indices of a batch with the states
``StandardUpdater`` would read it from; the reader sets its own global
states to them, reads the examples in order and sends back the examples
and its states after, which the parent makes its own when it uses the
batch. The process is started once, by ``python -c`` (it does not import
the user's ``__main__``); the dataset travels by value with cloudpickle
where it cannot be imported (a class of the script), and the reader reads
its copy, as ``MultiprocessIterator``'s workers do. It leaves when the
parent closes its pipe, or dies.
"""
import multiprocessing.connection
import os
import pickle
import random
import subprocess
import sys
import traceback

import cloudpickle
import numpy

from cgdp_chainer.runtime.input import global_random

# A reader must import Chainer and unpickle the dataset before its first
# batch; generous for a loaded 2-core machine.
STARTUP_TIMEOUT_SECONDS = 120.0
# How often a wait looks whether the reader died.
POLL_SECONDS = 0.05


class ReaderError(RuntimeError):
    """The reader process died, or could not read the dataset."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in the reader, as text."""


class DatasetReader(object):
    """The parent's side of a reader process.

    Args:
        dataset_bytes (bytes): The dataset, from :func:`pickle_dataset`.
    """

    def __init__(self, dataset_bytes):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        # The dataset's module (pickled by reference) must import as here.
        paths = [path for path in sys.path if path]
        if env.get('PYTHONPATH'):
            paths.append(env['PYTHONPATH'])
        env['PYTHONPATH'] = os.pathsep.join(paths)
        code = ('from cgdp_chainer.runtime.input import reader_process; '
                'reader_process.serve({}, {})'.format(to_child_r,
                                                      from_child_w))
        try:
            self._process = subprocess.Popen(
                [sys.executable, '-c', code], env=env,
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._send = multiprocessing.connection.Connection(to_child_w,
                                                           readable=False)
        self._receive = multiprocessing.connection.Connection(
            from_child_r, writable=False)
        self._send.send_bytes(dataset_bytes)
        self._started = False

    def read(self, indices, states):
        """The examples at ``indices``, read from ``states``.

        Args:
            indices (list of int): In the order ``StandardUpdater`` reads.
            states (RandomStates): The global states to read them from.

        Returns:
            tuple: ``(examples, states after)``.

        Raises:
            Exception: What ``get_example`` raised, with the reader's
                traceback as its cause.
            ReaderError: The reader died.
        """
        self._send.send_bytes(pickle.dumps(
            ([int(index) for index in indices], states.numpy_state,
             states.python_state), pickle.HIGHEST_PROTOCOL))
        reply = self._wait()
        if reply[0] == 'error':
            _, error, text = reply
            raise error from RemoteTraceback(text)
        _, examples, numpy_state, python_state = reply
        return examples, global_random.RandomStates(numpy_state,
                                                    python_state)

    def _wait(self):
        limit = None if self._started else STARTUP_TIMEOUT_SECONDS
        waited = 0.0
        while not self._receive.poll(POLL_SECONDS):
            waited += POLL_SECONDS
            if self._process.poll() is not None:
                raise ReaderError(
                    'the CGDP input reader process died (exit code {}) '
                    'while reading the dataset'.format(
                        self._process.returncode))
            if limit is not None and waited > limit:
                raise ReaderError(
                    'the CGDP input reader process did not start within '
                    '{:.0f} s'.format(limit))
        self._started = True
        try:
            return pickle.loads(self._receive.recv_bytes())
        except EOFError:
            self._process.wait()
            raise ReaderError(
                'the CGDP input reader process died (exit code {}) while '
                'reading the dataset'.format(self._process.returncode))

    def close(self):
        """Ends the reader (it leaves when its pipe closes)."""
        self._send.close()
        self._receive.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def pickle_dataset(dataset):
    """The dataset's bytes for a reader, or None with the reason.

    Returns:
        tuple: ``(bytes or None, reason or None)``.
    """
    try:
        return cloudpickle.dumps(dataset, pickle.HIGHEST_PROTOCOL), None
    except Exception as error:
        return None, 'the dataset cannot be pickled ({}: {})'.format(
            type(error).__name__, error)


def serve(read_fd, write_fd):
    """The reader process's loop (see the module's docs)."""
    receive = multiprocessing.connection.Connection(read_fd, writable=False)
    send = multiprocessing.connection.Connection(write_fd, readable=False)
    try:
        dataset = pickle.loads(receive.recv_bytes())
    except EOFError:
        return
    while True:
        try:
            indices, numpy_state, python_state = pickle.loads(
                receive.recv_bytes())
        except EOFError:
            return
        numpy.random.set_state(numpy_state)
        random.setstate(python_state)
        try:
            examples = [dataset[index] for index in indices]
            reply = ('ok', examples, numpy.random.get_state(),
                     random.getstate())
        except Exception as error:
            reply = ('error', error, traceback.format_exc())
        send.send_bytes(_pickled_reply(reply))


def _pickled_reply(reply):
    """The reply's bytes; where it cannot be pickled, an error that says so
    (with the dataset's own error and traceback, if it was one)."""
    try:
        return pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        what = 'the examples read'
        text = traceback.format_exc()
        if reply[0] == 'error':
            what = 'the error raised ({!r})'.format(reply[1])
            text = reply[2]
        return pickle.dumps(('error', ReaderError(
            '{} by the CGDP input reader cannot be pickled back to the '
            'training process ({}: {})'.format(what, type(error).__name__,
                                               error)), text),
            pickle.HIGHEST_PROTOCOL)
