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
    purge QUEUE                               delete the queue's queued and delayed jobs
    ls [--queue Q] [--state S] [--outcome O] [--lane L] [--prefix P] [--limit N] [--after SEQUENCE]
       [--before SEQUENCE] [-r | --newest-first]
                                              jobs in admission order (or newest first), filtered, paged
    stats [--watch [--interval SECONDS]]      per queue: jobs by state, expired leases,
                                              oldest ready age, recent outcomes, pause
    prune --older-than DURATION [--outcome O ...] [--limit N] [--include-undated]
                                              delete jobs settled more than DURATION ago
    pause QUEUE [--reason TEXT]               no runner claims the queue's jobs until resume
    resume QUEUE                              runners claim the queue's jobs again
    rerun JOB_ID --rerun-id ID                enqueue a copy of a settled job
    rerun --where KEY=VALUE ... --rerun-id ID [--yes]
                                              rerun every matching settled job (counts first; --yes acts)
    run MODULE[:ATTR]                         serve the queues until SIGINT / SIGTERM
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

Times (``ls``, ``stats``) are UTC, by the database clock. ``ls`` pages like
``settled``: a full page ends with the ``--after`` value of the next one.
``stats --watch`` redraws the table in place (ANSI home + clear screen)
every ``--interval`` seconds (default 2) until Ctrl-C; with ``--json`` it
prints one document per line instead. A ``prune`` DURATION is whole days,
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
  cannot be imported (``run``, ``schedules``), an error of the
* 2: a usage error (unknown command or option, a bad value, an unusable
  URL); one line on stderr, nothing done.

``python -m sqlalchemy_watchdog.cli`` is the same command.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import ipaddress
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, cast
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine, create_engine, inspect, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .applies import JobExplanation
from .client import Watchdog
from .errors import WatchdogError, redacted
from .execution import DEFAULT_CONCURRENCY
from .jobs import (
    BULK_BATCH_MAX,
    MAX_DELAY,
    BulkResult,
    CancelStatus,
    JobState,
    JobView,
    Outcome,
    PauseStatus,
    QueueStats,
    ScheduleView,
    Stats,
    Undecodable,
    WorkerView,
)
from .model import jobs_table
from .schedules import Schedule, check_schedules
from .store import LIST_LIMIT_MAX
from .visible import escape
from .wakeups import WakeupMode

__all__ = ["DEFAULT_URL", "URL_ENV", "main"]

#: The environment variable naming the database when ``--url`` is not given.
URL_ENV = "WATCHDOG_DATABASE_URL"
#: The database when neither ``--url`` nor :data:`URL_ENV` is given.
DEFAULT_URL = "sqlite:///watchdog.db"

log = logging.getLogger(__name__)

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

#: The message for a database without the table (every command but upgrade).
NO_TABLE = "no watchdog_jobs table: run `sqlalchemy-watchdog upgrade` first"

_MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_VERSIONS_DIR = _MIGRATIONS_DIR / "versions"


class CommandFailed(Exception):
    """The command could not do what it was asked; exit status 1."""


class UsageError(Exception):
    """The command line makes no sense; exit status 2."""


# -- the database ------------------------------------------------------------------


def database_url(value: str | None) -> URL:
    """The URL to use: ``value``, else ``$WATCHDOG_DATABASE_URL``, else the default.

    A bare ``postgresql://`` URL gets the psycopg 3 driver (psycopg2 is not a
    dependency of this package).
    """
    raw = value or os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError, TypeError) as error:
        # The message may quote the URL: mask its password in both.
        reason = _mask_password(str(error).splitlines()[0] if str(error) else type(error).__name__, raw)
        raise UsageError(f"invalid database URL {_mask_password(raw, raw)!r}: {reason}") from None
    if url.port is not None and not 0 < url.port < 65536:
        raise UsageError(f"invalid database URL {_shown(url)!r}: port {url.port} is not 1-65535")
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def _mask_password(text: str, raw: str) -> str:
    """``text`` with the password of URL ``raw`` (``scheme://user:PASSWORD@``) masked."""
    match = re.match(r"[^:/?#]+://[^:/@?#]*:([^@/?#]*)@", raw)
    if match is None or not match.group(1):
        return text
    return text.replace(match.group(1), "***")


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def open_engine(url: URL) -> Engine:
    """A sync engine on ``url``; an unknown dialect or driver is a usage error.

    ``?prepare_threshold=none`` (or a number) in a psycopg URL becomes
    psycopg's ``prepare_threshold`` connection argument: ``none`` is the
    setting for a connection pooler in transaction mode (see the deployment
    guide), which a URL cannot otherwise express.
    """
    connect_args: dict[str, Any] = {}
    threshold = url.query.get("prepare_threshold")
    if threshold is not None and url.get_driver_name() == "psycopg":
        value = threshold if isinstance(threshold, str) else threshold[-1]
        if value.lower() in ("none", "null", ""):
            connect_args["prepare_threshold"] = None
        elif value.isdigit():
            connect_args["prepare_threshold"] = int(value)
        else:
            raise UsageError(f"prepare_threshold in the URL must be 'none' or a whole number, not {value!r}")
        url = url.difference_update_query(["prepare_threshold"])
    try:
        return create_engine(url, connect_args=connect_args)
    except (ArgumentError, ValueError, TypeError) as error:  # includes NoSuchModuleError
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"cannot use {_shown(url)}: {reason}") from None


def _require_table(engine: Engine) -> None:
    """Fail clearly (and without creating an empty SQLite file) when the
    database has no ``watchdog_jobs`` table yet."""
    _require_file(engine.url)
    if not inspect(engine).has_table(jobs_table.name):
        raise CommandFailed(f"{NO_TABLE} (database: {_shown(engine.url)})")


async def _require_table_async(engine: Any) -> None:
    """:func:`_require_table` for an ``AsyncEngine``."""
    _require_file(engine.url)
    async with engine.connect() as conn:
        present = await conn.run_sync(lambda sync: inspect(sync).has_table(jobs_table.name))
    if not present:
        raise CommandFailed(f"{NO_TABLE} (database: {_shown(engine.url)})")


def _require_file(url: URL) -> None:
    """Refuse a SQLite URL whose database file does not exist (connecting would create it)."""
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        on_disk = database not in ("", ":memory:") and not database.startswith("file:")
        if on_disk and not Path(database).exists():
            raise CommandFailed(f"{NO_TABLE} (there is no SQLite database at {database})")


# -- output ----------------------------------------------------------------------------


def _job_dict(job: JobView) -> dict[str, Any]:
    return {
        "sequence": job.sequence,
        "job_id": job.job_id,
        "queue": job.queue,
        "lane": job.lane,
        "priority": job.priority,
        "state": job.state.value,
        "outcome": None if job.outcome is None else job.outcome.value,
        "failure_reason": job.failure_reason,
        "failure_detail": job.failure_detail,
        "recovery_count": job.recovery_count,
        "max_recoveries": job.max_recoveries,
        "cancellation_id": job.cancellation_id,
        "payload": None if isinstance(job.payload, Undecodable) else job.payload,
        **({"undecodable": {u.field: u.reason for u in job.undecodable}} if job.undecodable else {}),
    }


def _payload_text(job: JobView) -> str:
    """The payload as one line of JSON, or what makes it undecodable."""
    if isinstance(job.payload, Undecodable):
        return str(job.payload)
    return json.dumps(job.payload, ensure_ascii=False, sort_keys=True)


def _print_json(value: Any, out: TextIO) -> None:
    print(json.dumps(value, ensure_ascii=False, sort_keys=False), file=out)


def _print_job(job: JobView, out: TextIO) -> None:
    fields = _job_dict(job)
    fields["payload"] = _payload_text(job)
    detail = fields.pop("failure_detail")
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        print(f"{name:<{width}}  {'-' if value is None else _one_line(value)}", file=out)
    if detail:  # the handler's traceback, last: it spans lines
        print(f"{'failure_detail':<{width}}", file=out)
        for line in detail.rstrip().splitlines():
            print(f"  {_one_line(line)}", file=out)


def _iso(value: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 in UTC, to the millisecond (as stored)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="milliseconds")


def _milliseconds(value: timedelta | None) -> int | None:
    return None if value is None else value // timedelta(milliseconds=1)


def _duration_text(value: timedelta) -> str:
    """``30s``, ``0.25s``: whole milliseconds, as stored."""
    ms = value // timedelta(milliseconds=1)
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms / 1000:.3f}".rstrip("0") + "s"


def _one_line(value: object) -> str:
    """``value`` as one line of a terminal: every control, format or
    bidirectional character (line breaks included) shown as its escape
    (``\\n``, ``\\x1b``, ``\\u202e``; see :mod:`sqlalchemy_watchdog.visible`)."""
    return escape(value)


class _Terminal(io.TextIOBase):
    """Where every human-readable output goes (``main`` wraps stdout in it
    unless ``--json``): whatever a command writes -- job ids, queues,
    reasons, tracebacks from the database -- reaches the terminal with every
    control, format or bidirectional character but the line breaks shown as
    its escape, so no stored text can retitle or clear the terminal. Line
    breaks inside a value are escaped where the value is formatted
    (:func:`_one_line`). :meth:`control` writes the command's own sequences."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._out.write(escape(text, keep="\n"))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def control(self, sequence: str) -> None:
        """Write a terminal control sequence of the command's own, as it is."""
        self._out.write(sequence)


def _control(out: TextIO, sequence: str) -> None:
    """Write ``sequence`` (e.g. :data:`CLEAR_SCREEN`) to ``out`` as it is."""
    if isinstance(out, _Terminal):
        out.control(sequence)
    else:
        out.write(sequence)


#: What ``show`` prints for a job without a retry policy or timeout of its own.


def _show_dict(job: JobView) -> dict[str, Any]:
    """What ``show --json`` prints: :func:`_job_dict` and the job's time and
    failure policy (datetimes ISO 8601, durations in milliseconds)."""
    fields = _job_dict(job)
    retry = job.retry
    fields.update(
        run_at=_iso(job.run_at),
        ready_at=_iso(job.ready_at),
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        snoozes=job.snoozes,
        timeout_ms=_milliseconds(job.timeout),
        retry=None
        if retry is None
        else {
            "max_attempts": retry.max_attempts,
            "backoff_ms": _milliseconds(retry.backoff),
            "factor": retry.factor,
            "max_backoff_ms": _milliseconds(retry.max_backoff),
            "jitter": retry.jitter,
        },
        failure_history=[
            {"at": _iso(entry.at), "attempt": entry.attempt, "reason": entry.reason} for entry in job.failure_history
        ],
        enqueued_at=_iso(job.enqueued_at),
        started_at=_iso(job.started_at),
        settled_at=_iso(job.settled_at),
        rerun_of=job.rerun_of,
        reruns=list(job.reruns),
        trace_context=None if job.trace_context is None else dict(job.trace_context),
    )
    return fields


def _applies_dict(explained: JobExplanation) -> dict[str, Any]:
    """What ``show --json`` says applies (``applies``): each setting's value,
    level (``job`` / ``handler`` / ``runner``) and whether it is known here."""
    retry = explained.retry.value
    pause = explained.pause
    return {
        "timeout": {
            "timeout_ms": _milliseconds(explained.timeout.value),
            "from": explained.timeout.level.value,
            "known": explained.timeout.known,
        },
        "retry": {
            "max_attempts": None if retry is None else retry.max_attempts,
            "from": explained.retry.level.value,
            "known": explained.retry.known,
        },
        "max_attempts": explained.max_attempts,
        "queue_pause": None if pause is None else {"reason": pause.reason, "paused_at": _iso(pause.paused_at)},
        "reason": explained.reason,
    }


def _print_show(explained: JobExplanation, out: TextIO) -> None:
    """What ``show`` prints: one ``name  value`` line per field -- the
    timeout and retry policy that apply and where each comes from, the
    reason in plain words -- then the failure history (one line per failed
    attempt) and the traceback."""
    job = explained.job
    lines: list[tuple[str, object]] = [
        ("sequence", job.sequence),
        ("job_id", job.job_id),
        ("queue", job.queue),
        ("lane", job.lane),
        ("priority", job.priority),
        ("state", job.state.value),
        ("enqueued_at", _iso(job.enqueued_at)),
        ("started_at", _iso(job.started_at)),
        ("settled_at", _iso(job.settled_at)),
        ("run_at", _iso(job.run_at)),
        ("ready_at", _iso(job.ready_at)),
        ("attempt", explained.attempt_text),
        ("snoozes", job.snoozes),
        ("timeout", explained.timeout_text),
        ("retry", explained.retry_text),
        ("queue_pause", explained.pause_text),
        ("outcome", None if job.outcome is None else job.outcome.value),
        ("failure_reason", explained.reason),
        ("recovery_count", job.recovery_count),
        ("max_recoveries", job.max_recoveries),
        ("cancellation_id", job.cancellation_id),
        ("rerun_of", job.rerun_of),
        ("reruns", ", ".join(job.reruns) or None),
        ("traceparent", None if job.trace_context is None else job.trace_context.get("traceparent")),
        ("payload", _payload_text(job)),
    ]
    width = max(len(name) for name in [*(name for name, _ in lines), "failure_history", "failure_detail"])
    for name, value in lines:
        print(f"{name:<{width}}  {'-' if value is None else _one_line(value)}", file=out)
    if not job.failure_history:
        print(f"{'failure_history':<{width}}  -", file=out)
    else:  # oldest first, one line per failed attempt
        print(f"{'failure_history':<{width}}", file=out)
        for entry in job.failure_history:
            print(f"  {_iso(entry.at)}  attempt {entry.attempt}  {_one_line(entry.reason)}", file=out)
    if job.failure_detail:  # the handler's traceback, last: it spans lines
        print(f"{'failure_detail':<{width}}", file=out)
        for line in job.failure_detail.rstrip().splitlines():
            print(f"  {_one_line(line)}", file=out)


def _print_table(jobs: Sequence[JobView], out: TextIO) -> None:
    header = ("sequence", "job_id", "queue", "outcome", "failure_reason")
    rows = [
        (
            str(job.sequence),
            _one_line(job.job_id),
            _one_line(job.queue),
            job.outcome.value if job.outcome else "-",
            _one_line(job.failure_reason),
        )
        for job in jobs
    ]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header) - 1)]
    for cells in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        print(f"{line}  {cells[-1]}".rstrip(), file=out)


# -- commands ---------------------------------------------------------------------------


def apply_revisions(conn: Connection, revision: str = "heads") -> None:
    """Apply the package's Alembic revisions up to ``revision`` on ``conn``
    (committed here), without an ``env.py``, recording them in the
    database's ``alembic_version`` table as ``alembic upgrade`` would. What
    ``upgrade`` runs; the pytest plugin's ``watchdog_engine`` too.

    :raises alembic.util.CommandError: e.g. the database holds revisions
        these do not know (an application's own Alembic environment).
    """
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory

    from .model import metadata

    script = ScriptDirectory(str(_MIGRATIONS_DIR), version_locations=[str(_VERSIONS_DIR)])

    def upgrade(rev: Any, context: Any) -> Any:
        return script._upgrade_revs(revision, rev)

    with EnvironmentContext(Config(), script, fn=upgrade, destination_rev=revision, as_sql=False) as env:
        env.configure(connection=conn, target_metadata=metadata)
        with env.begin_transaction():
            env.run_migrations()
    if conn.in_transaction():
        conn.commit()


def cmd_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    """Apply the package's Alembic revisions (branch ``watchdog``) up to ``args.revision``.

    Runs without an ``env.py``: the revisions shipped in
    ``sqlalchemy_watchdog/migrations/versions`` are applied on one connection,
    recorded in the database's ``alembic_version`` table as ``alembic
    upgrade`` would.
    """
    from alembic.runtime.migration import MigrationContext
    from alembic.util import CommandError

    engine = open_engine(args.url)
    try:
        try:
            with engine.connect() as conn:
                apply_revisions(conn, args.revision)
        except CommandError as error:
            raise CommandFailed(
                f"{error} (if this database's migrations are run by your application's own "
                "Alembic environment, run `alembic upgrade heads` there instead)"
            ) from None
        with engine.connect() as conn:
            heads = sorted(MigrationContext.configure(conn).get_current_heads())
        if args.json:
            _print_json({"url": _shown(engine.url), "heads": heads}, out)
        else:
            print(f"{_shown(engine.url)} is at revision {', '.join(heads) or '(none)'}", file=out)
        return 0
    finally:
        engine.dispose()


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    """Print one job, with when it was enqueued, started and settled, its
    time and failure policy (``run_at``, ``ready_at``, the attempt it is on,
    snoozes, timeout, retry policy), its rerun links and its failure
    history; exit 1 when there is no such job."""
    explained = _watchdog(args).explain(args.job_id)
    if args.json:
        _print_json(
            None if explained is None else {**_show_dict(explained.job), "applies": _applies_dict(explained)}, out
        )
    elif explained is not None:
        _print_show(explained, out)
    if explained is None:
        raise CommandFailed(f"no job {args.job_id!r}")
    return 0


def cmd_head(args: argparse.Namespace, out: TextIO) -> int:
    """Print the queue's running job, else its next queued, else delayed one (idle: a note, exit 0)."""
    job = _watchdog(args).read_queue_head(args.queue)
    if args.json:
        _print_json(None if job is None else _job_dict(job), out)
    elif job is None:
        print(f"queue {args.queue!r} is idle", file=out)
    else:
        _print_job(job, out)
    return 0


def cmd_settled(args: argparse.Namespace, out: TextIO) -> int:
    """Print up to ``--limit`` settled jobs after sequence ``--after``."""
    jobs = _watchdog(args).read_settled(limit=args.limit, after_sequence=args.after)
    if args.json:
        for job in jobs:
            _print_json(_job_dict(job), out)
        return 0
    if not jobs:
        print(f"no settled jobs after sequence {args.after}", file=out)
        return 0
    _print_table(jobs, out)
    if len(jobs) == args.limit:
        print(f"(more may follow: --after {jobs[-1].sequence})", file=out)
    return 0


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    """Record a cancellation; exit 1 unless it is ``recorded`` or ``replayed``.
    With ``--where``: every matching live job, counted first."""
    if args.where:
        if args.cancellation_id is not None or args.job_id is None:
            raise UsageError("with --where, give the CANCELLATION_ID alone (no JOB_ID)")
        filters = _bulk_filters(args, CANCEL_WHERE)
        watchdog = _watchdog(args)

        def act(dry_run: bool) -> BulkResult:
            return watchdog.cancel_many(
                cancellation_id=args.job_id,
                only_if_queued=args.only_if_queued,
                batch=args.batch,
                dry_run=dry_run,
                **filters,
            )

        return _run_bulk(args, out, "cancel", act)
    if args.cancellation_id is None:
        raise UsageError("give JOB_ID CANCELLATION_ID, or --where KEY=VALUE ... CANCELLATION_ID")
    result = _watchdog(args).cancel(args.job_id, args.cancellation_id, only_if_queued=args.only_if_queued)
    if args.json:
        _print_json({"job_id": result.job_id, "status": result.status.value}, out)
    else:
        print(f"{_one_line(result.job_id)}: {result.status.value}", file=out)
    if result.status is CancelStatus.MISSING:
        raise CommandFailed(f"no job {args.job_id!r}")
    if result.status is CancelStatus.CONFLICT:
        raise CommandFailed(
            f"cancellation of {args.job_id!r} not recorded: the job has settled"
            + (" or is running" if args.only_if_queued else "")
            + ", already has another cancellation, or the cancellation id is taken by another job"
        )
    return 0


def cmd_fail_lane(args: argparse.Namespace, out: TextIO) -> int:
    """Settle every live job of the lane ``failed``, one batch per call, while ``.more``."""
    watchdog = _watchdog(args)
    total = 0
    while True:
        failure = watchdog.fail_lane(args.lane, args.reason)
        total += failure.settled
        for job in failure.jobs:
            if not args.json:
                print(f"{_one_line(job.job_id)}: failed", file=out)
        if not failure.more:
            # (An empty batch with ``more`` means a concurrent caller took
            # this batch: call again rather than stop with live jobs left.)
            break
    if args.json:
        _print_json({"lane": args.lane, "settled": total}, out)
    else:
        print(f"lane {args.lane!r}: {total} job(s) settled failed", file=out)
    return 0


def cmd_purge(args: argparse.Namespace, out: TextIO) -> int:
    """Delete the queue's queued and delayed jobs and say how many."""
    deleted = _watchdog(args).purge(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "deleted": deleted}, out)
    else:
        print(f"queue {args.queue!r}: {deleted} queued or delayed job(s) deleted", file=out)
    return 0


def load_target(spec: str) -> tuple[Any, bool]:
    """Import ``MODULE[:ATTR]``; return the attribute (or the module) and
    whether an attribute was named. The working directory is importable."""
    module_name, _, attr = spec.partition(":")
    if not module_name or (":" in spec and not attr) or ":" in attr:
        raise UsageError(f"expected MODULE or MODULE:ATTR, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise CommandFailed(f"cannot import {module_name!r}: {error}") from None
        raise
    if not attr:
        return module, False
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandFailed(f"module {module_name!r} has no attribute {attr!r}") from None
    return target, True


def build_runner(args: argparse.Namespace, engine: Engine) -> Any:
    """The runner ``run`` serves: see :func:`cmd_run`."""
    from .asyncio import AsyncRunner
    from .runner import Runner

    target, named = load_target(args.target)
    options: dict[str, Any] = {}
    if args.queues:
        options["queues"] = args.queues
    if args.concurrency is not None:
        options["concurrency"] = args.concurrency
    for name in ("lease", "heartbeat", "poll_interval", "grace"):
        seconds = getattr(args, name)
        if seconds is not None:
            options[name] = timedelta(seconds=seconds)
    if args.wakeups is not None:
        options["wakeups"] = args.wakeups
    if args.listen_url is not None:
        listen_url = database_url(args.listen_url)
        if listen_url.get_backend_name() != "postgresql":
            raise UsageError(f"--listen-url must be a PostgreSQL URL, not {_shown(listen_url)}")
        options["listen_engine"] = open_engine(listen_url)
    # The module's schedules, found exactly as `schedules MODULE` finds them.
    module_name = args.target.partition(":")[0]
    schedules = () if args.no_schedules else check_schedules(collect_schedules(sys.modules[module_name]))
    if not named or isinstance(target, Mapping):
        _require_table(engine)  # before the runner: "no table" is the first thing to fix
        # Without an attribute: the handlers registered with @handler.
        if schedules:
            options["schedules"] = schedules
        runner: Any = Runner(engine, target if named else None, **options)
        _say_schedules(runner, module_name)
        return runner
    if isinstance(target, (Runner, AsyncRunner)) or callable(target):
        if options:
            raise UsageError(
                f"{args.target} builds its own runner; the options "
                f"{', '.join('--' + n.replace('_', '-') for n in options)} apply only "
                "to `run MODULE` or `run MODULE:HANDLERS_MAPPING`"
            )
        runner = target if isinstance(target, (Runner, AsyncRunner)) else target(engine)
        if not isinstance(runner, (Runner, AsyncRunner)):
            raise CommandFailed(f"{args.target}(engine) returned {type(runner).__name__}, not a Runner or AsyncRunner")
        # Never skip a schedule silently: the runner must serve every one the
        # module defines (as defined there), or the command refuses.
        unserved = [schedule for schedule in schedules if schedule not in runner.settings.schedules]
        if unserved:
            raise CommandFailed(
                f"{module_name!r} defines the schedule(s) "
                f"{', '.join(repr(_one_line(s.name)) for s in unserved)} that the runner of {args.target} "
                "does not serve (as defined); pass them to it (schedules=[...]), or run with "
                "--no-schedules to serve none of the module's schedules"
            )
        _say_schedules(runner, module_name)
        return runner
    raise CommandFailed(
        f"{args.target} is a {type(target).__name__}; expected a Runner, a factory "
        "engine -> Runner, or a mapping of queue names to handlers"
    )


def _say_schedules(runner: Any, module_name: str) -> None:
    """Log at start which schedules the runner serves (none is said too)."""
    names = [schedule.name for schedule in runner.settings.schedules]
    if names:
        log.info("serving %d schedule(s): %s", len(names), ", ".join(_one_line(name) for name in names))
    else:
        log.info("serving no schedules (%s defines none, or --no-schedules)", _one_line(module_name))


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the queues until SIGINT / SIGTERM.

    ``MODULE`` is imported for its ``@handler`` registrations and a
    ``Runner(engine)`` serves them. ``MODULE:ATTR`` names instead a mapping
    ``{queue: handler}``, a ``Runner`` / ``AsyncRunner``, or a factory
    ``engine -> Runner | AsyncRunner`` (an async runner brings its own
    ``AsyncEngine``). The options ``--queue``, ``--concurrency``, ``--lease``,
    ``--heartbeat``, ``--poll-interval``, ``--grace``, ``--wakeups`` and
    ``--listen-url`` apply when this command builds the runner (behind a
    connection pooler in transaction mode, ``--listen-url`` names a direct
    URL for the listening session). A database without the ``watchdog_jobs``
    table is refused at start (exit 1).

    The command owns its process: SIGINT / SIGTERM stop the runner. It
    prints the runner's shutdown budget at start (grace plus the stop
    wait): the platform's termination period must exceed it plus what the
    last statements take.

    The module's cron schedules (found as ``schedules MODULE`` finds them)
    are served too: a runner this command builds gets them; a runner or a
    factory's runner must serve each of them as defined, else the command
    refuses to start (exit 1). ``--no-schedules`` serves none of them.
    """
    from .asyncio import AsyncRunner

    engine = open_engine(args.url)
    runner: Any = None
    try:
        runner = build_runner(args, engine)
        budget = runner.settings
        print(
            f"shutdown budget: {budget.shutdown_budget_s:g}s (grace {budget.grace_s:g}s + stop wait "
            f"{budget.stop_wait_s:g}s); keep the platform's termination period above it",
            file=out,
            flush=True,
        )
        # The database the runner will use (a target may bring its own
        # engine) must have the table: refuse now rather than retry forever.
        if isinstance(runner, AsyncRunner):

            async def serve() -> None:
                await _require_table_async(runner.engine)
                await runner.run_forever(install_signal_handlers=True)

            asyncio.run(serve())
        else:
            _require_table(getattr(runner, "engine", engine))
            runner.run_forever(install_signal_handlers=True)
        return 0
    finally:
        if runner is not None and args.listen_url is not None:
            runner.listen_engine.dispose()
        engine.dispose()


def collect_schedules(target: Any) -> list[Schedule]:
    """The :class:`Schedule` values of ``target``, in definition order, each once.

    A module gives its module-level schedules, also those inside its
    module-level lists and tuples; a named attribute must be a schedule or a
    list / tuple of them.
    """
    if isinstance(target, Schedule):
        values: list[Any] = [target]
    elif isinstance(target, (list, tuple)):
        values = list(target)
    elif isinstance(target, type(sys)):  # a module
        values = [value for name, value in vars(target).items() if not name.startswith("__")]
    else:
        raise CommandFailed(f"expected a module, a Schedule or a list of them, got a {type(target).__name__}")
    found: list[Schedule] = []
    for value in values:
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, Schedule) and not any(item is seen or item == seen for seen in found):
                found.append(item)
    return found


def _slot_texts(schedule: Schedule, slot: datetime) -> tuple[str, str]:
    """A slot as local wall-clock time (offset and zone abbreviation) and as UTC."""
    local = slot.astimezone(ZoneInfo(schedule.timezone))
    return (
        f"{local.isoformat(sep=' ', timespec='minutes')} {local.tzname()}",
        f"{slot:%Y-%m-%d %H:%M} UTC",
    )


def cmd_schedules(args: argparse.Namespace, out: TextIO) -> int:
    """Print the cron schedules ``MODULE`` defines, each with its next slots.

    ``MODULE`` is imported (the working directory is importable) and every
    module-level :class:`~sqlalchemy_watchdog.Schedule` is listed, also
    those inside module-level lists and tuples; ``MODULE:ATTR`` names one
    schedule or a list of them. Each is shown with its next ``--count``
    slots, in its own time zone and in UTC. No database is used. A module
    without schedules is not an error; one that cannot be imported is
    (exit 1), and so are two schedules with the same name.

    Without ``MODULE``: the schedules the runners record they serve (read
    from the database): each name and definition, its next slot, the latest
    slot enqueued, the worker that recorded it, and whether it is served
    now -- two deploys serving one name with different definitions are both
    shown, marked DISPUTED.
    """
    if args.target is None:
        if args.count is not None:
            raise UsageError("--count needs MODULE (the slots of a module's schedules)")
        return _recorded_schedules(args, out)
    module_name = args.target.partition(":")[0]
    try:
        target, _ = load_target(args.target)
    except (CommandFailed, UsageError):
        raise
    except Exception as error:  # the module's own code failed: one line, no traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CommandFailed(
            f"cannot import {module_name!r}: {type(error).__name__}" + (f": {first}" if first else "")
        ) from None
    schedules = check_schedules(collect_schedules(target))
    now = datetime.now(UTC)
    count = 3 if args.count is None else args.count
    rows = [(schedule, schedule.slots(now, count)) for schedule in schedules]
    if args.json:
        for schedule, slots in rows:
            _print_json(
                {
                    "name": schedule.name,
                    "cron": schedule.cron,
                    "timezone": schedule.timezone,
                    "queue": schedule.queue,
                    "lane": schedule.lane if schedule.lane is not None else schedule.queue,
                    "priority": schedule.priority,
                    "catch_up": schedule.catch_up,
                    "next": [
                        {
                            "local": slot.astimezone(ZoneInfo(schedule.timezone)).isoformat(),
                            "utc": f"{slot:%Y-%m-%dT%H:%M:%SZ}",
                        }
                        for slot in slots
                    ],
                },
                out,
            )
        return 0
    if not rows:
        print(f"no schedules in {args.target!r}", file=out)
        return 0
    header = ("name", "cron", "timezone", "queue", "next (local)", "next (UTC)")
    lines: list[tuple[str, ...]] = [header]
    for schedule, slots in rows:
        texts = [_slot_texts(schedule, slot) for slot in slots] or [("-", "-")]
        lines.append((schedule.name, _one_line(schedule.cron), schedule.timezone, _one_line(schedule.queue), *texts[0]))
        lines.extend(("", "", "", "", *text) for text in texts[1:])
    widths = [max(len(cells[i]) for cells in lines) for i in range(len(header) - 1)]
    for cells in lines:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        print(f"{line}  {cells[-1]}".rstrip(), file=out)
    return 0


# -- operations: ls, stats, prune, pause, resume, rerun ----------------------------------


def _when(value: datetime | None) -> str:
    """A database time for a table: ``2026-01-31T12:00:05Z`` (UTC), ``-`` when unknown."""
    return "-" if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(value: timedelta) -> str:
    """A short age: ``45s``, ``12m05s``, ``3h07m``, ``2d04h``."""
    seconds = int(value.total_seconds())
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def _column_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, the header first; the last column is not padded.
    Every cell is one line (:func:`_one_line`)."""
    rows = [[_one_line(cell) for cell in cells] for cells in rows]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for cells in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        lines.append(f"{line}  {cells[-1]}".rstrip())
    return lines


def _listed_job_dict(job: JobView) -> dict[str, Any]:
    """A job as ``ls --json`` prints it: :func:`_job_dict` with its attempt,
    times and ``rerun_of``."""
    return {
        **_job_dict(job),
        "attempt": job.attempt,
        "enqueued_at": _iso(job.enqueued_at),
        "started_at": _iso(job.started_at),
        "settled_at": _iso(job.settled_at),
        "rerun_of": job.rerun_of,
    }


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    """Print up to ``--limit`` jobs matching the filters after sequence
    ``--after`` (and before ``--before``), oldest first or, with
    ``--newest-first``, newest first."""
    jobs = _watchdog(args).list_jobs(
        queue=args.queue,
        state=args.state,
        outcome=args.outcome,
        lane=args.lane,
        job_id_prefix=args.prefix,
        limit=args.limit,
        after_sequence=args.after,
        before_sequence=args.before,
        newest_first=args.newest_first,
        with_payload=bool(args.json),  # the table does not show payloads: not read
    )
    if args.json:
        for job in jobs:
            _print_json(_listed_job_dict(job), out)
        return 0
    if not jobs:
        bounds = [f"after sequence {args.after}"] if args.after or args.before is None else []
        bounds += [] if args.before is None else [f"before sequence {args.before}"]
        print(f"no matching jobs {' and '.join(bounds)}", file=out)
        return 0
    header = ("sequence", "job_id", "queue", "state", "attempt", "enqueued_at", "started_at", "settled_at")
    rows = [
        (
            str(job.sequence),
            job.job_id,
            job.queue,
            job.state.value if job.outcome is None else f"{job.state.value}/{job.outcome.value}",
            str(job.attempt),
            _when(job.enqueued_at),
            _when(job.started_at),
            _when(job.settled_at),
        )
        for job in jobs
    ]
    print("\n".join(_column_lines(header, rows)), file=out)
    if len(jobs) == args.limit:
        follow = "--before" if args.newest_first else "--after"
        print(f"(more may follow: {follow} {jobs[-1].sequence})", file=out)
    return 0


def _outcome_counts(counts: Mapping[Outcome, int]) -> dict[str, int]:
    """Every outcome's count (zeros included), in :class:`Outcome` order."""
    return {outcome.value: counts.get(outcome, 0) for outcome in Outcome}


def _queue_stats_dict(queue: QueueStats) -> dict[str, Any]:
    age = queue.oldest_ready_age
    return {
        "queue": queue.queue,
        "delayed": queue.delayed,
        "queued": queue.queued,
        "running": queue.running,
        "expired_leases": queue.expired_leases,
        "oldest_ready_age_seconds": None if age is None else age.total_seconds(),
        "settled_last_minute": _outcome_counts(queue.settled_last_minute),
        "settled_last_hour": _outcome_counts(queue.settled_last_hour),
        "paused": queue.paused,
        "workers": queue.workers,
        "unserved": queue.unserved,
        "pause": None
        if queue.pause is None
        else {"reason": queue.pause.reason, "paused_at": _iso(queue.pause.paused_at)},
    }


def stats_document(stats: Stats) -> dict[str, Any]:
    """The JSON document ``stats --json`` prints: ``at`` (the database clock)
    and one object per queue with every key always present (outcome counts
    include zeros; ``oldest_ready_age_seconds`` and ``pause`` may be null)."""
    return {"at": _iso(stats.at), "queues": [_queue_stats_dict(queue) for queue in stats.queues]}


def _counts_cell(counts: Mapping[Outcome, int]) -> str:
    cell = ",".join(f"{outcome.value}={counts[outcome]}" for outcome in Outcome if counts.get(outcome))
    return cell or "-"


def render_stats(stats: Stats) -> str:
    """``stats`` as a table, one row per queue."""
    lines = [f"queues at {_when(stats.at)} (database clock)"]
    if not stats.queues:
        lines.append("no queue has live jobs, jobs settled in the last hour, or a pause")
        return "\n".join(lines) + "\n"
    header = (
        "queue",
        "delayed",
        "queued",
        "running",
        "expired_leases",
        "oldest_ready",
        "last_minute",
        "last_hour",
        "workers",
        "paused",
    )
    rows = []
    for queue in stats.queues:
        pause = queue.pause
        if pause is None:
            paused = "-"
        else:
            paused = f"since {_when(pause.paused_at)}" + (f": {pause.reason}" if pause.reason else "")
        rows.append(
            (
                queue.queue,
                str(queue.delayed),
                str(queue.queued),
                str(queue.running),
                str(queue.expired_leases),
                "-" if queue.oldest_ready_age is None else _age(queue.oldest_ready_age),
                _counts_cell(queue.settled_last_minute),
                _counts_cell(queue.settled_last_hour),
                _workers_cell(queue),
                paused,
            )
        )
    unserved = [queue.queue for queue in stats.queues if queue.unserved]
    notes = [f"! no live worker serves {_one_line(name)!r}, which has ready jobs" for name in unserved]
    return "\n".join(lines + _column_lines(header, rows) + notes) + "\n"


def _workers_cell(queue: QueueStats) -> str:
    """The live workers serving a queue; ``0!`` when ready jobs wait for none."""
    return f"{queue.workers}!" if queue.unserved else str(queue.workers)


def _worker_dict(worker: WorkerView) -> dict[str, Any]:
    return {
        "worker_id": worker.worker_id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "concurrency": worker.concurrency,
        "running": worker.running,
        "wakeups": worker.wakeups,
        "version": worker.version,
        "heartbeat_seconds": worker.heartbeat.total_seconds(),
        "started_at": _iso(worker.started_at),
        "last_seen": _iso(worker.last_seen),
        "silent_seconds": worker.silent_for.total_seconds(),
        "gone_after_seconds": worker.gone_after.total_seconds(),
        "gone": worker.gone,
    }


def _worker_status(worker: WorkerView) -> str:
    return f"GONE (silent {_age(worker.silent_for)})" if worker.gone else f"live (seen {_age(worker.silent_for)} ago)"


def cmd_workers(args: argparse.Namespace, out: TextIO) -> int:
    """Print every registered runner: live ones, and gone ones (not seen for
    three of their heartbeats and 30 seconds: killed, frozen or cut off)
    until runners prune them an hour later."""
    workers = _watchdog(args).workers()
    if args.json:
        for worker in workers:
            _print_json(_worker_dict(worker), out)
        return 0
    if not workers:
        print("no workers registered (none serving, or none since the last clean shutdown)", file=out)
        return 0
    header = ("worker_id", "host", "pid", "queues", "concurrency", "running", "started_at", "status", "wakeups")
    rows = [
        (
            worker.worker_id,
            worker.host,
            str(worker.pid),
            ",".join(worker.queues),
            str(worker.concurrency),
            str(worker.running),
            _when(worker.started_at),
            _worker_status(worker),
            f"{worker.wakeups} (v{worker.version})",
        )
        for worker in workers
    ]
    print("\n".join(_column_lines(header, rows)), file=out)
    return 0


def _schedule_view_dict(view: ScheduleView) -> dict[str, Any]:
    return {
        "name": view.name,
        "fingerprint": view.fingerprint,
        "cron": view.cron,
        "timezone": view.timezone,
        "queue": view.queue,
        "next_slot": _iso(view.next_slot),
        "last_enqueued": _iso(view.last_enqueued),
        "recorded_by": view.recorded_by,
        "last_seen": _iso(view.last_seen),
        "current": view.current,
        "disputed": view.disputed,
    }


def _recorded_schedules(args: argparse.Namespace, out: TextIO) -> int:
    """``schedules`` without a module: what the runners recorded they serve."""
    args.url = database_url(args.url)
    engine = open_engine(args.url)
    try:
        _require_table(engine)
        views = Watchdog(engine).schedules()
    finally:
        engine.dispose()
    if args.json:
        for view in views:
            _print_json(_schedule_view_dict(view), out)
        return 0
    if not views:
        print("no schedules recorded: no runner has served one in the last week", file=out)
        return 0
    header = ("name", "cron", "timezone", "queue", "next_slot", "last_enqueued", "recorded_by", "status")
    rows = []
    for view in views:
        if view.disputed:
            status = "DISPUTED: another deploy serves another definition"
        elif view.current:
            status = "served"
        else:
            status = f"not served since {_when(view.last_seen)}"
        rows.append(
            (
                view.name,
                view.cron,
                view.timezone,
                view.queue,
                _when(view.next_slot),
                _when(view.last_enqueued),
                view.recorded_by,
                status,
            )
        )
    print("\n".join(_column_lines(header, rows)), file=out)
    return 0


#: What ``stats --watch`` writes before each frame: cursor home, clear the screen.
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    """Print every queue's stats once, or with ``--watch`` every ``--interval``
    seconds until Ctrl-C (exit 0): a table redrawn in place, or with
    ``--json`` one document per line."""
    if args.interval is not None and not args.watch:
        raise UsageError("--interval applies only with --watch")
    watchdog = _watchdog(args)

    def frame() -> str:
        stats = watchdog.stats()
        if args.json:
            return json.dumps(stats_document(stats), ensure_ascii=False) + "\n"
        return render_stats(stats)

    if not args.watch:
        out.write(frame())
        return 0
    interval = WATCH_INTERVAL_DEFAULT if args.interval is None else args.interval
    try:
        while True:
            text = frame()
            if not args.json:
                _control(out, CLEAR_SCREEN)
                text = f"{text}\n(every {interval:g}s; Ctrl-C to stop)\n"
            out.write(text)
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def cmd_prune(args: argparse.Namespace, out: TextIO) -> int:
    """Delete settled jobs that settled more than ``--older-than`` ago; say how many."""
    deleted = _watchdog(args).prune(
        older_than=args.older_than,
        outcomes=args.outcomes,
        limit=args.limit,
        include_undated=args.include_undated,
    )
    if args.json:
        _print_json(
            {
                "deleted": deleted,
                "older_than_seconds": args.older_than.total_seconds(),
                "outcomes": args.outcomes,
                "include_undated": args.include_undated,
            },
            out,
        )
    else:
        which = "settled" if args.outcomes is None else "/".join(args.outcomes)
        print(f"{deleted} {which} job(s) pruned (settled more than {format_duration(args.older_than)} ago)", file=out)
    return 0


def cmd_pause(args: argparse.Namespace, out: TextIO) -> int:
    """Pause a queue (idempotent): no runner claims its jobs until ``resume``."""
    status = _watchdog(args).pause(args.queue, reason=args.reason)
    if args.json:
        _print_json({"queue": args.queue, "status": status.value}, out)
    else:
        note = " (its reason is unchanged)" if status is PauseStatus.ALREADY_PAUSED and args.reason else ""
        print(f"queue {args.queue!r}: {status.value.replace('_', ' ')}{note}", file=out)
    return 0


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    """Resume a queue (idempotent)."""
    status = _watchdog(args).resume(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "status": status.value}, out)
    else:
        print(f"queue {args.queue!r}: {status.value.replace('_', ' ')}", file=out)
    return 0


#: The keys of ``--where`` (``rerun`` / ``cancel`` in bulk), as the library's arguments.
WHERE_KEYS = {
    "queue": "queue",
    "lane": "lane",
    "outcome": "outcome",
    "settled-after": "settled_after",
    "settled-before": "settled_before",
    "enqueued-after": "enqueued_after",
    "enqueued-before": "enqueued_before",
}


def _where(text: str) -> tuple[str, Any]:
    """One ``--where KEY=VALUE``: ``queue``, ``lane``, ``outcome`` (several
    comma-separated), or a time bound -- an ISO 8601 time with its zone
    (``2026-05-01T12:00:00Z``) or a DURATION meaning that long ago."""
    key, sep, value = text.partition("=")
    if not sep or key not in WHERE_KEYS:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with KEY one of {', '.join(WHERE_KEYS)}, got {text[:60]!r}"
        )
    if key == "outcome":
        known = {outcome.value for outcome in Outcome}
        outcomes = value.split(",")
        unknown = [name for name in outcomes if name not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"outcome {unknown[0][:40]!r} is not one of {', '.join(sorted(known))}")
        return WHERE_KEYS[key], outcomes
    if key.endswith(("-after", "-before")):
        return WHERE_KEYS[key], _time_bound(value)
    if not value:
        raise argparse.ArgumentTypeError(f"{key} is empty")
    return WHERE_KEYS[key], value


def _time_bound(text: str) -> datetime:
    """An ISO 8601 time with its zone, or a DURATION ago (this machine's clock)."""
    if _DURATION.fullmatch(text) and text:
        return datetime.now(UTC) - parse_duration(text)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time with its zone (2026-05-01T12:00:00Z) or a duration ago (2h), got {text[:40]!r}"
        )
    return value


def _bulk_dict(result: BulkResult) -> dict[str, Any]:
    return {
        "matched": result.matched,
        "done": list(result.done),
        "repeated": list(result.repeated),
        "skipped": [{"job_id": skip.job_id, "why": skip.why} for skip in result.skipped],
        "batches": result.batches,
        "dry_run": result.dry_run,
    }


def _run_bulk(args: argparse.Namespace, out: TextIO, verb: str, act: Callable[[bool], BulkResult]) -> int:
    """A bulk action: count first (a dry run); with ``--yes``, act and report."""
    counted = act(True)
    if not args.yes:
        if args.json:
            _print_json(_bulk_dict(counted), out)
        else:
            print(
                f"{counted.matched} job(s) match; nothing changed. Run again with --yes to {verb} them.",
                file=out,
            )
        return 0
    if not args.json:
        print(f"{counted.matched} job(s) match.", file=out)
    result = act(False)
    if args.json:
        _print_json(_bulk_dict(result), out)
        return 0
    past = {"rerun": "rerun", "cancel": "cancelled"}[verb]
    print(
        f"{len(result.done)} {past}, {len(result.repeated)} already {past} by this id,"
        f" {len(result.skipped)} skipped ({result.batches} batch(es)).",
        file=out,
    )
    for skip in result.skipped:
        print(f"  skipped {_one_line(skip.job_id)}: {_one_line(skip.why)}", file=out)
    return 0


#: What ``cancel --where`` may select by: live jobs have no outcome nor settled time.
CANCEL_WHERE = ("queue", "lane", "enqueued_after", "enqueued_before")


def _bulk_filters(args: argparse.Namespace, allowed: Sequence[str] = tuple(WHERE_KEYS.values())) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    for key, value in args.where:
        if key not in allowed:
            names = ", ".join(name.replace("_", "-") for name in allowed)
            raise UsageError(f"--where {key.replace('_', '-')}: {args.command} selects live jobs by {names} only")
        if key in filters and key != "outcome":
            raise UsageError(f"--where {key} given twice")
        filters[key] = [*filters.get(key, []), *value] if key == "outcome" else value
    return filters


def cmd_rerun(args: argparse.Namespace, out: TextIO) -> int:
    """Enqueue a copy of a settled job; exit 1 when it is missing or not
    settled. With ``--where``: every matching settled job, counted first."""
    watchdog = _watchdog(args)
    if args.where:
        if args.job_id is not None:
            raise UsageError("give JOB_ID or --where, not both")
        filters = _bulk_filters(args)

        def act(dry_run: bool) -> BulkResult:
            return watchdog.rerun_many(rerun_id=args.rerun_id, batch=args.batch, dry_run=dry_run, **filters)

        return _run_bulk(args, out, "rerun", act)
    if args.job_id is None:
        raise UsageError("give the JOB_ID to rerun, or --where KEY=VALUE to select jobs")
    original = watchdog.read(args.job_id)
    if original is None:
        raise CommandFailed(f"no job {args.job_id!r}")
    if original.state is not JobState.SETTLED:
        raise CommandFailed(f"job {args.job_id!r} is {original.state.value}: only a settled job can be rerun")
    result = watchdog.rerun(args.job_id, rerun_id=args.rerun_id)
    if args.json:
        _print_json({"job_id": result.job_id, "rerun_of": args.job_id, "status": result.status.value}, out)
    else:
        print(f"{_one_line(result.job_id)}: {result.status.value}", file=out)
    return 0


#: The hosts ``dashboard`` may bind to: it has no ``authorize``, so only this machine may reach it.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: What ``dashboard`` says about that, at start.
DASHBOARD_LOOPBACK_NOTE = (
    "no authorize function here: the dashboard binds to 127.0.0.1 only (loopback), so only this "
    "machine can reach it; anyone on it may run its actions"
)


def _loopback_host(text: str) -> str:
    """``--host`` of ``dashboard``: a loopback address, nothing else."""
    try:
        loopback = text == "localhost" or ipaddress.ip_address(text).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a loopback address: without an authorize function the dashboard "
            "binds to 127.0.0.1 only. To serve it to others, mount "
            "sqlalchemy_watchdog.web.create_app(engine, authorize=...) in your own application"
        )
    return text


def cmd_dashboard(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the web dashboard with uvicorn until SIGINT / SIGTERM.

    The command has no ``authorize`` function (it cannot know who is who),
    so it binds to a loopback address only (default 127.0.0.1) and says so:
    whoever can reach the port may view and, unless ``--read-only``, run the
    actions. To serve the dashboard to others, mount
    ``sqlalchemy_watchdog.web.create_app(engine, authorize=...)`` in your own
    ASGI application behind its authentication. Needs the ``web`` extra
    (``pip install 'sqlalchemy-watchdog[web]'``).
    """
    try:
        import uvicorn

        from .web import create_app
    except ImportError as error:
        raise CommandFailed(
            f"the dashboard needs the web extra (missing: {error.name}): pip install 'sqlalchemy-watchdog[web]'"
        ) from None
    engine: Engine = args.engine
    _require_table(engine)
    app = create_app(engine, read_only=args.read_only)
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    mode = " (read-only: no actions)" if args.read_only else ""
    print(f"serving the dashboard of {_shown(engine.url)} at http://{shown_host}:{args.port}/{mode}", file=out)
    print(DASHBOARD_LOOPBACK_NOTE, file=out)
    out.flush()
    level = (args.log_level or "INFO").lower()
    # uvicorn shuts down on SIGINT / SIGTERM, then raises the signal again
    # for the handler it found: a quiet one here, so that a stop exits 0.
    quiet = {sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=level, server_header=False)
    finally:
        for sig, previous in quiet.items():
            signal.signal(sig, previous)
    return 0


def _watchdog(args: argparse.Namespace) -> Watchdog:
    engine: Engine = args.engine
    _require_table(engine)
    return Watchdog(engine)


# -- the parser --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr (exit 2), never a traceback."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


#: The most threads a runner started here may run at once.
CONCURRENCY_MAX = 1024


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _concurrency(text: str) -> int:
    value = _positive_int(text)
    if value > CONCURRENCY_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {CONCURRENCY_MAX}, got {text[:40]}")
    return value


#: The most slots ``schedules --count`` prints per schedule.
SCHEDULE_COUNT_MAX = 1000


def _slot_count(text: str) -> int:
    value = _positive_int(text)
    if value > SCHEDULE_COUNT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {SCHEDULE_COUNT_MAX}, got {text[:40]}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


#: The longest duration option accepted, in seconds: what a thread can wait.
SECONDS_MAX = threading.TIMEOUT_MAX


def _seconds(text: str) -> float:
    """A duration option: seconds from 0 to :data:`SECONDS_MAX` (argparse
    names the option in the error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text[:40]!r}") from None
    if not 0 <= value <= SECONDS_MAX:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to {SECONDS_MAX:.0f}, got {text[:40]!r}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqlalchemy-watchdog")
    except PackageNotFoundError:  # running from a source tree
        from . import __version__

        return __version__


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """``--url``, ``--json``, ``--log-level``: on the main parser with their
    defaults, and on every command with ``SUPPRESS`` (so a command only
    overrides what was given after it)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--url", default=default(None), help=f"SQLAlchemy database URL (default: ${URL_ENV} or {DEFAULT_URL})"
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON (one object per line)")
    parser.add_argument(
        "--log-level",
        default=default(None),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: INFO for run and dashboard, WARNING otherwise)",
    )


#: A DURATION option: whole days, hours, minutes and seconds, largest unit first.
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_DURATION_UNITS = (86400, 3600, 60, 1)


def parse_duration(text: str) -> timedelta:
    """A DURATION: ``30d``, ``12h``, ``15m``, ``90s``, or units combined
    largest first (``1d12h``, ``1h30m``); from ``0s`` to 3650 days.

    Nothing else is accepted (no sign, no fraction, no space, no other
    unit): argparse names the option in the error.
    """
    match = _DURATION.fullmatch(text) if 0 < len(text) <= 40 else None
    if match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"expected a duration such as 30d, 12h, 15m, 90s or 1h30m, got {text[:40]!r}")
    seconds = sum(int(part) * unit for part, unit in zip(match.groups(), _DURATION_UNITS) if part)
    if seconds > MAX_DELAY.total_seconds():
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DELAY.days}d, got {text[:40]!r}")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """A whole-second duration as :func:`parse_duration` reads it (``1h30m``, ``0s``)."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, name in zip(_DURATION_UNITS, "dhms"):
        count, seconds = divmod(seconds, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts) or "0s"


def _int_between(low: int, high: int) -> Callable[[str], int]:
    """An integer option from ``low`` to ``high`` (argparse names the option in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


#: The shortest and the default ``stats --watch --interval``, in seconds.
WATCH_INTERVAL_MIN = 0.1
WATCH_INTERVAL_DEFAULT = 2.0


def _watch_interval(text: str) -> float:
    value = _seconds(text)
    if value < WATCH_INTERVAL_MIN:
        raise argparse.ArgumentTypeError(f"must be at least {WATCH_INTERVAL_MIN} seconds, got {text[:40]!r}")
    return value


#: The largest ``sequence`` (a 64-bit signed integer).
SEQUENCE_MAX = 2**63 - 1


def _add_operations_commands(commands: Any) -> None:
    """The operator commands: ``ls``, ``stats``, ``prune``, ``pause``, ``resume``, ``rerun``."""
    ls = commands.add_parser(
        "ls",
        help="list jobs in admission order (or newest first), filtered and paged",
        description="Jobs in admission (sequence) order, or newest first with -r, with their attempt "
        "and times (UTC, database clock). A full page ends with the --after (newest first: --before) "
        "value of the next one.",
    )
    ls.add_argument("--queue", help="only this queue's jobs")
    ls.add_argument("--state", choices=[state.value for state in JobState], help="only jobs in this state")
    ls.add_argument(
        "--outcome", choices=[outcome.value for outcome in Outcome], help="only settled jobs with this outcome"
    )
    ls.add_argument("--lane", help="only this lane's jobs")
    ls.add_argument("--prefix", metavar="JOB_ID_PREFIX", help="job_ids starting with this literal text")
    ls.add_argument(
        "--limit", type=_int_between(1, LIST_LIMIT_MAX), default=100, help=f"1-{LIST_LIMIT_MAX} (default: 100)"
    )
    ls.add_argument(
        "--after",
        type=_int_between(0, SEQUENCE_MAX),
        default=0,
        metavar="SEQUENCE",
        help="only jobs with a greater sequence (default: 0)",
    )
    ls.add_argument(
        "--before",
        type=_int_between(1, SEQUENCE_MAX),
        default=None,
        metavar="SEQUENCE",
        help="only jobs with a smaller sequence (default: no bound)",
    )
    ls.add_argument("-r", "--newest-first", action="store_true", help="the newest jobs first (page on with --before)")
    ls.set_defaults(func=cmd_ls)

    stats = commands.add_parser(
        "stats",
        help="per queue: jobs by state, expired leases, oldest ready age, recent outcomes, pause",
        description="Every queue with live jobs, jobs settled in the last hour, or a pause. "
        "--json prints one JSON document (with --watch: one per line).",
    )
    stats.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    stats.add_argument(
        "--interval",
        type=_watch_interval,
        metavar="SECONDS",
        help=f"with --watch: seconds between redraws, at least {WATCH_INTERVAL_MIN} "
        f"(default: {WATCH_INTERVAL_DEFAULT:g})",
    )
    stats.set_defaults(func=cmd_stats)

    prune = commands.add_parser(
        "prune",
        help="delete settled jobs that settled more than DURATION ago",
        description="Delete settled jobs that settled more than DURATION ago (database clock), oldest "
        "first, in short batches. Queued, delayed and running jobs are never deleted. A pruned "
        "job_id can be enqueued again as a new job.",
    )
    prune.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        metavar="DURATION",
        help="30d, 12h, 15m, 90s, or combined largest unit first (1h30m)",
    )
    prune.add_argument(
        "--outcome",
        dest="outcomes",
        action="extend",
        nargs="+",
        metavar="OUTCOME",
        choices=[outcome.value for outcome in Outcome],
        help="only these outcomes (repeatable; default: every outcome)",
    )
    prune.add_argument(
        "--limit", type=_int_between(1, SEQUENCE_MAX), help="delete at most this many (default: no limit)"
    )
    prune.add_argument(
        "--include-undated",
        action="store_true",
        help="also jobs settled before revision w0004 (no settled time recorded)",
    )
    prune.set_defaults(func=cmd_prune)

    pause = commands.add_parser(
        "pause",
        help="stop runners claiming a queue's jobs (idempotent)",
        description="From the moment this commits no runner claims the queue's jobs; running jobs "
        "finish and enqueueing still works. Pausing a paused queue keeps its reason.",
    )
    pause.add_argument("queue")
    pause.add_argument("--reason", help="why (shown by stats)")
    pause.set_defaults(func=cmd_pause)

    resume = commands.add_parser("resume", help="let runners claim a paused queue's jobs again (idempotent)")
    resume.add_argument("queue")
    resume.set_defaults(func=cmd_resume)

    rerun = commands.add_parser(
        "rerun",
        help="enqueue a copy of a settled job",
        description="Enqueue a copy of settled job JOB_ID as the new job JOB_ID~rerun~ID (a hash when "
        "that is too long). The same command again is a duplicate, not a second copy.",
    )
    rerun.add_argument("job_id", nargs="?", help="the settled job to rerun (or select jobs with --where)")
    rerun.add_argument("--rerun-id", required=True, metavar="ID", help="names this rerun (1-128 characters)")
    _bulk_options(rerun, "rerun")
    rerun.set_defaults(func=cmd_rerun)


def _bulk_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--where``, ``--yes`` and ``--batch`` of a bulk ``rerun`` / ``cancel``."""
    keys = "queue, lane, outcome" if verb == "rerun" else "queue, lane"
    times = "settled-after/-before, enqueued-after/-before" if verb == "rerun" else "enqueued-after/-before"
    parser.add_argument(
        "--where",
        type=_where,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"select jobs instead of naming one ({keys}, {times}: an ISO 8601 time with its zone or a "
        "duration ago such as 2h); repeat to combine",
    )
    parser.add_argument(
        "--yes", action="store_true", help=f"{verb} the selected jobs (without it: count them, change nothing)"
    )
    parser.add_argument(
        "--batch", type=_int_between(1, BULK_BATCH_MAX), default=100, help="jobs per transaction (default: 100)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlalchemy-watchdog``."""
    parser = _Parser(
        prog="sqlalchemy-watchdog",
        description="Migrate, inspect, command and run a sqlalchemy_watchdog job queue.",
        epilog=(
            f"The database: --url, else ${URL_ENV}, else {DEFAULT_URL}.\n"
            "--url, --json and --log-level go before or after the command.\n"
            "Only upgrade creates anything (a table, a SQLite file).\n"
            "Times are UTC, by the database clock. DURATION (prune): 30d, 12h, 15m, 90s, 1h30m.\n\n" + EXIT_STATUS_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, suppress=False)
    parser.add_argument("--version", action="version", version=f"sqlalchemy-watchdog {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_parser: Callable[..., argparse.ArgumentParser] = commands.add_parser

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser_: argparse.ArgumentParser = add_parser(name, parents=[common], **kwargs)
        return parser_

    commands.add_parser = command  # type: ignore[method-assign,assignment]

    upgrade = commands.add_parser("upgrade", help="create or migrate the watchdog_jobs table")
    upgrade.add_argument("revision", nargs="?", default="heads", help="target revision (default: heads)")
    upgrade.set_defaults(func=cmd_upgrade, needs_engine=False)

    show = commands.add_parser("show", help="print one job")
    show.add_argument("job_id")
    show.set_defaults(func=cmd_show)

    head = commands.add_parser("head", help="the queue's running job, else its next queued (or delayed) one")
    head.add_argument("queue")
    head.set_defaults(func=cmd_head)

    settled = commands.add_parser("settled", help="settled jobs in admission order")
    settled.add_argument("--limit", type=_positive_int, default=100, help="1-256 (default: 100)")
    settled.add_argument(
        "--after",
        type=_non_negative_int,
        default=0,
        metavar="SEQUENCE",
        help="only jobs with a greater sequence (default: 0)",
    )
    settled.set_defaults(func=cmd_settled)

    cancel = commands.add_parser("cancel", help="record a cancellation (idempotent per CANCELLATION_ID)")
    cancel.add_argument("job_id", help="the job (with --where: the CANCELLATION_ID alone)")
    cancel.add_argument("cancellation_id", nargs="?")
    cancel.add_argument(
        "--only-if-queued", action="store_true", help="refuse (conflict) when the job is already running"
    )
    _bulk_options(cancel, "cancel")
    cancel.set_defaults(func=cmd_cancel)

    fail_lane = commands.add_parser("fail-lane", help="settle every live job of a lane failed")
    fail_lane.add_argument("lane")
    fail_lane.add_argument("reason")
    fail_lane.set_defaults(func=cmd_fail_lane)

    purge = commands.add_parser("purge", help="delete a queue's queued and delayed jobs")
    purge.add_argument("queue")
    purge.set_defaults(func=cmd_purge)

    _add_operations_commands(commands)

    run = commands.add_parser(
        "run",
        help="serve the queues until SIGINT/SIGTERM",
        description=cmd_run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("target", metavar="MODULE[:ATTR]")
    run.add_argument(
        "--queue",
        dest="queues",
        action="append",
        metavar="QUEUE",
        help="serve only this queue (repeatable; default: every queue with a handler)",
    )
    run.add_argument(
        "--concurrency",
        type=_concurrency,
        help=f"handlers run at once, 1-{CONCURRENCY_MAX} (default: {DEFAULT_CONCURRENCY})",
    )
    run.add_argument("--lease", type=_seconds, metavar="SECONDS", help="claim lease (default: 120)")
    run.add_argument("--heartbeat", type=_seconds, metavar="SECONDS", help="lease renewal period (default: 10)")
    run.add_argument(
        "--poll-interval",
        type=_seconds,
        metavar="SECONDS",
        help="look for work this often when idle (default: 2 with NOTIFY on PostgreSQL, 0.25 otherwise)",
    )
    run.add_argument(
        "--grace",
        type=_seconds,
        metavar="SECONDS",
        help="on shutdown, time running handlers get to finish (default: 20)",
    )
    run.add_argument(
        "--wakeups",
        choices=[mode.value for mode in WakeupMode],
        help="auto (default): LISTEN/NOTIFY where the session is proven direct, else poll and warn; "
        "listen: refuse to start without it; poll: never LISTEN",
    )
    run.add_argument(
        "--listen-url",
        metavar="URL",
        help="a direct PostgreSQL URL for the listening session (when --url goes through a pooler)",
    )
    run.add_argument(
        "--no-schedules",
        action="store_true",
        help="serve none of the module's cron schedules (by default they are served, "
        "and a runner that does not serve them is refused)",
    )
    run.set_defaults(func=cmd_run, needs_engine=False)

    workers = commands.add_parser(
        "workers",
        help="the registered runners: host, pid, queues, jobs running, live or gone",
        description=cmd_workers.__doc__,
    )
    workers.set_defaults(func=cmd_workers)

    schedules = commands.add_parser(
        "schedules",
        help="the cron schedules a module defines and their next slots (no database); "
        "without MODULE, those the runners serve",
        description=cmd_schedules.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schedules.add_argument("target", metavar="MODULE[:ATTR]", nargs="?")
    schedules.add_argument(
        "--count",
        type=_slot_count,
        metavar="N",
        help=f"next slots shown per schedule of MODULE, 1-{SCHEDULE_COUNT_MAX} (default: 3)",
    )
    schedules.set_defaults(func=cmd_schedules, needs_engine=False, needs_url=False)

    dashboard = commands.add_parser(
        "dashboard",
        help="serve the web dashboard on 127.0.0.1 (needs the web extra)",
        description=cmd_dashboard.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dashboard.add_argument(
        "--host",
        type=_loopback_host,
        default="127.0.0.1",
        help="a loopback address: 127.0.0.1 (default), ::1 or localhost; nothing else (no authorize here)",
    )
    dashboard.add_argument("--port", type=_int_between(1, 65535), default=8000, help="default: 8000")
    dashboard.add_argument("--read-only", action="store_true", help="show no action and refuse every one")
    dashboard.set_defaults(func=cmd_dashboard)
    return parser


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
        out = sys.stdout if getattr(args, "json", False) else cast(TextIO, _Terminal(sys.stdout))
        return func(args, out)
    except UsageError as error:
        print(f"{parser.prog}: error: {_one_line(error)} (see --help)", file=sys.stderr)
        return 2
    except CommandFailed as error:
        print(f"{parser.prog}: {_one_line(error)}", file=sys.stderr)
        return 1
    except WatchdogError as error:
        print(f"{parser.prog}: error ({error.code.value}): {_one_line(error)}", file=sys.stderr)
        return 1
    except SQLAlchemyError as error:
        # Never the row, the SQL or its parameters (claim tokens, payloads).
        print(f"{parser.prog}: database error: {_one_line(redacted(error))}", file=sys.stderr)
        return 1
    finally:
        if engine is not None:
            engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
