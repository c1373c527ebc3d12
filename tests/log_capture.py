"""The ``said`` fixture: what the library logged, as text, for tests that
check a message (see :mod:`cgdp_chainer.log`).

Import it into a test module (``from log_capture import said  # NOQA``)
and call ``said()``: one line per message, each with its details (the
DEBUG record that follows it) as ``summary: details``.
"""
import logging

import pytest


def log_text(records):
    """The ``cgdp_chainer`` records as lines, details joined to their line."""
    lines = []
    for record in records:
        if not record.name.startswith('cgdp_chainer'):
            continue
        message = record.getMessage()
        if record.levelno == logging.DEBUG and lines and \
                message.startswith(lines[-1] + ': '):
            lines[-1] = message
        else:
            lines.append(message)
    return ''.join(line + '\n' for line in lines)


@pytest.fixture
def said(caplog):
    """Captures the library's log at DEBUG; returns a function that gives
    it so far as text."""
    caplog.set_level(logging.DEBUG, logger='cgdp_chainer')
    return lambda: log_text(caplog.records)
