"""What the command's exit statuses mean, and the two exceptions that end a
command with 1 or 2 (``main`` turns them into one line on stderr)."""

from __future__ import annotations

#: The exit-status rule, as ``--help`` prints it.
EXIT_STATUS_HELP = """\
exit status:
  0  done, including "nothing there": head of an idle queue, no settled jobs,
     nothing to fail, purge, list or prune, no schedules, a cancellation
     recorded or replayed, a queue already paused / not paused, a duplicate
     rerun, stats --watch stopped by Ctrl-C
  1  not done: no such job (show, cancel, rerun), a cancellation not recorded
     (conflict), a rerun of a job not settled, no watchdog_jobs table, a
     module that cannot be imported, a library or database error
  2  usage error (one line on stderr; nothing done)"""


class CommandFailed(Exception):
    """The command could not do what it was asked; exit status 1."""


class UsageError(Exception):
    """The command line makes no sense; exit status 2."""
