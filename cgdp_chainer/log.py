"""The library's messages, through Python's ``logging``; never on stdout.

Every message goes to the ``cgdp_chainer`` logger (:data:`LOGGER`) or a
child of it, as one short line (at most about 100 characters); what
explains it more goes in ``details``, logged at DEBUG right after. The
convention:

- :func:`notice`: what a user must know, visible by default: a semantic
  difference from the updater or optimizer CGDP replaces, or a fallback
  that costs speed. Logged at WARNING, which Python prints on stderr even
  where the program configured no logging.
- :func:`info` (or ``LOGGER.info``): the rest (what was found or chosen,
  when it changes nothing a user must act on); shown only where the
  program asks for INFO, e.g. ``logging.basicConfig(level=logging.INFO)``.
- Errors are raised, naming the fix, not logged.

A program silences the library with
``logging.getLogger('cgdp_chainer').setLevel(logging.ERROR)``. To see
more of a script one cannot edit, ``CGDP_CHAINER_LOG=INFO`` (or DEBUG) in
the environment gives the logger a stderr handler at that level.

Under MPI the ranks would say the same lines: the fronts log on rank 0
only (their ``say`` callables take the same arguments as :func:`say`).
"""
import logging
import os

LOGGER = logging.getLogger('cgdp_chainer')
# The environment variable that sets the logger's level, with a handler.
LEVEL_VARIABLE = 'CGDP_CHAINER_LOG'
# The level of what a user must know: visible without any logging set-up.
NOTICE = logging.WARNING
# The level of the rest.
INFO = logging.INFO


def say(summary, details=None, level=INFO, logger=LOGGER):
    """Logs one short line, and its details at DEBUG.

    Args:
        summary (str): The line, at most about 100 characters.
        details (str or None): What explains it, logged at DEBUG.
        level (int): :data:`NOTICE` or :data:`INFO`.
        logger (logging.Logger): ``cgdp_chainer`` or a child of it.
    """
    logger.log(level, summary)
    if details:
        logger.debug('%s: %s', summary, details)


def notice(summary, details=None, logger=LOGGER):
    """Logs what a user must know, visible by default (see module doc)."""
    say(summary, details, NOTICE, logger)


def info(summary, details=None, logger=LOGGER):
    """Logs what was found or chosen, at INFO (see module doc)."""
    say(summary, details, INFO, logger)


def configure_from_environment(environ=os.environ):
    """Gives :data:`LOGGER` a stderr handler at the level that
    :data:`LEVEL_VARIABLE` names (e.g. ``INFO``), where it is set.

    Raises:
        ValueError: The variable names no logging level.
    """
    name = environ.get(LEVEL_VARIABLE, '').strip().upper()
    if not name:
        return
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError('{}={!r} is not a logging level: give DEBUG, INFO, '
                         'WARNING or ERROR'.format(LEVEL_VARIABLE, name))
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter('%(message)s'))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False  # else a configured root prints it twice


configure_from_environment()
