"""The ``sqlalchemy-watchdog`` command: migrate, inspect, command and run the queue.

::

    sqlalchemy-watchdog [--url URL] [--json] [--log-level LEVEL] COMMAND ...
    sqlalchemy-watchdog --version

    upgrade                                   create / migrate the watchdog_jobs table
    show JOB_ID                               one job
    head QUEUE                                the queue's running job, else its next queued (or delayed) one
    settled [--limit N] [--after SEQUENCE]    settled jobs in admission order, paged
    cancel JOB_ID CANCELLATION_ID [--only-if-queued]
    cancel --where KEY=VALUE ... CANCELLATION_ID [--only-if-queued] [--yes]
                                              cancel every matching live job (counts first; --yes acts)
    fail-lane LANE REASON                     settle every live job of the lane ``failed``
    purge QUEUE                               delete the queue's waiting, queued and delayed jobs
    ls [--queue Q] [--state S] [--outcome O] [--lane L] [--prefix P] [--limit N] [--after SEQUENCE]
       [--before SEQUENCE] [-r | --newest-first]
                                              jobs in admission order (or newest first), filtered, paged
    stats [--watch [--interval SECONDS]]      per queue: jobs by state, expired leases,
                                              oldest ready age, recent outcomes, pause
    prune --older-than DURATION [--outcome O ...] [--limit N] [--include-undated]
                                              delete jobs settled more than DURATION ago
    pause QUEUE [--reason TEXT]               no runner claims the queue's jobs until resume
    resume QUEUE                              runners claim the queue's jobs again
    limits [QUEUE] [--concurrency N] [--per-key N] [--rate N/PERIOD] [--rate-per-key N/PERIOD] [--clear]
                                              show queues' limits and their use; set or clear QUEUE's
    rerun JOB_ID --rerun-id ID                enqueue a copy of a settled job
    rerun --where KEY=VALUE ... --rerun-id ID [--yes]
                                              rerun every matching settled job (counts first; --yes acts)
    run MODULE[:ATTR]                         serve the queues until SIGINT / SIGTERM
        [--executor [QUEUE=]{thread,process} ...]
                                              where handlers run: the runner's default, or one queue's
    schedules MODULE[:ATTR] [--count N]       the cron schedules a module defines, and their next slots
    schedules                                 the schedules the runners record they serve
    workers                                   the registered runners, live or gone
    dashboard [--host H] [--port P] [--read-only]
                                              serve the web dashboard (the ``web`` extra) on 127.0.0.1

The global options ``--url``, ``--json`` and ``--log-level`` go before or
after the command. The database is ``--url``, else the environment variable
``WATCHDOG_DATABASE_URL``, else ``sqlite:///watchdog.db`` in the working
directory. A bare ``postgresql://`` URL uses psycopg 3. Only ``upgrade``
creates anything: every other command (``run`` included) refuses a database
without the ``watchdog_jobs`` table, and never creates a SQLite file.
``schedules MODULE`` uses no database at all.

``run --executor process`` runs the handlers in child processes;
``--executor QUEUE=process`` (repeatable, and ``QUEUE=thread``) places one
queue's handlers, the others keeping the default, so one runner serves
thread and process queues side by side, each executor with its own slots
(``--concurrency`` threads, ``--processes`` children). The process options
(``--processes``, ``--max-jobs-per-child``, ``--max-memory-per-child``,
``--kill-grace``, ``--prefetch``) need a process executor named. A
malformed value, a queue the runner does not serve, two defaults or a queue
named twice exit 2.

Times (``ls``, ``stats``) are UTC, by the database clock. ``ls`` pages like
``settled``: a full page ends with the ``--after`` value of the next one.
``stats --watch`` redraws the table in place (ANSI home + clear screen)
every ``--interval`` seconds (default 2) until Ctrl-C (SIGINT, which it
takes even when started with SIGINT ignored, as by ``&`` in a script);
with ``--json`` it prints one document per line instead. A ``prune`` DURATION is whole days,
hours, minutes or seconds, units combined largest first: ``30d``, ``12h``,
``15m``, ``90s``, ``1h30m``.

Exit status:

* 0: the command did what it was asked, including finding that there is
  nothing to report or do (``head`` of an idle queue, ``settled`` with no
  settled jobs, ``fail-lane`` of a lane without live jobs, ``purge`` of an
  empty queue, ``schedules`` of a module without schedules, ``ls``
  matching nothing, ``prune`` with nothing old enough), a cancellation
  ``recorded`` or ``replayed``, ``pause`` / ``resume`` of a queue already
  paused / not paused, a ``rerun`` that is a duplicate, ``run`` stopped by
  SIGINT / SIGTERM, ``stats --watch`` stopped by Ctrl-C;
* 1: it could not: the named job does not exist (``show``, ``cancel``,
  ``rerun``), a cancellation was not recorded (``conflict``), the job to
  ``rerun`` has not settled, no ``watchdog_jobs`` table, a module that
  cannot be imported (``run``, ``schedules``), an error of the library or
  of the database;
* 2: a usage error (unknown command or option, a bad value, an unusable
  URL); one line on stderr, nothing done.

``python -m sqlalchemy_watchdog.cli`` and ``python -m sqlalchemy_watchdog``
are the same command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TextIO, cast

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..errors import WatchdogError, redacted
from ..migrations import apply_revisions as apply_revisions
from . import urls
from .commands.serving import build_runner as build_runner
from .commands.serving import collect_schedules as collect_schedules
from .commands.serving import load_target as load_target
from .exits import CommandFailed, UsageError
from .output import Terminal, one_line
from .output import render_stats as render_stats
from .output import stats_document as stats_document
from .parser import build_parser
from .urls import database_url, open_engine
from .values import format_duration as format_duration
from .values import parse_duration as parse_duration

# The layout (what goes where, and where a new command goes) is in
# docs/design.md, "The command line".

__all__ = ["DEFAULT_URL", "URL_ENV", "build_parser", "main"]

#: The environment variable naming the database when ``--url`` is not given.
URL_ENV = urls.URL_ENV
#: The database when neither ``--url`` nor :data:`URL_ENV` is given.
DEFAULT_URL = urls.DEFAULT_URL

# Names importable from this module since it was one file (the tests use some):
# kept importable from here. The migrations API lives in sqlalchemy_watchdog.migrations.
_one_line = one_line


def _configure_logging(args: argparse.Namespace) -> None:
    level = args.log_level or ("INFO" if args.command in ("run", "dashboard") else "WARNING")
    # A no-op when the host process (or a test runner) configured logging already.
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sqlalchemy-watchdog`` with ``argv`` (default: ``sys.argv[1:]``).

    :returns: the exit status: 0 success, 1 failure, 2 usage error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    _configure_logging(args)
    engine: Engine | None = None
    try:
        if getattr(args, "needs_url", True):  # (schedules uses no database)
            args.url = database_url(args.url)
        if getattr(args, "needs_engine", True):
            engine = open_engine(args.url)
            args.engine = engine
        func: Callable[[argparse.Namespace, TextIO], int] = args.func
        out = sys.stdout if getattr(args, "json", False) else cast(TextIO, Terminal(sys.stdout))
        return func(args, out)
    except UsageError as error:
        print(f"{parser.prog}: error: {one_line(error)} (see --help)", file=sys.stderr)
        return 2
    except CommandFailed as error:
        print(f"{parser.prog}: {one_line(error)}", file=sys.stderr)
        return 1
    except WatchdogError as error:
        print(f"{parser.prog}: error ({error.code.value}): {one_line(error)}", file=sys.stderr)
        return 1
    except SQLAlchemyError as error:
        # Never the row, the SQL or its parameters (claim tokens, payloads).
        print(f"{parser.prog}: database error: {one_line(redacted(error))}", file=sys.stderr)
        return 1
    finally:
        if engine is not None:
            engine.dispose()
