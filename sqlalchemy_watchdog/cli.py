"""The ``sqlalchemy-watchdog`` command: migrate, inspect, command and run the queue.

::

    sqlalchemy-watchdog [--url URL] [--json] [--log-level LEVEL] COMMAND ...
    sqlalchemy-watchdog --version

    upgrade                                   create / migrate the watchdog_jobs table
    show JOB_ID                               one job
    head QUEUE                                the queue's running job, else its next queued one
    settled [--limit N] [--after SEQUENCE]    settled jobs in admission order, paged
    cancel JOB_ID CANCELLATION_ID [--only-if-queued]
    fail-lane LANE REASON                     settle every live job of the lane ``failed``
    purge QUEUE                               delete the queue's queued jobs
    run MODULE[:ATTR]                         serve the queues until SIGINT / SIGTERM

The global options ``--url``, ``--json`` and ``--log-level`` go before or
after the command. The database is ``--url``, else the environment variable
``WATCHDOG_DATABASE_URL``, else ``sqlite:///watchdog.db`` in the working
directory. A bare ``postgresql://`` URL uses psycopg 3. Only ``upgrade``
creates anything: every other command (``run`` included) refuses a database
without the ``watchdog_jobs`` table, and never creates a SQLite file.

Exit status:

* 0: the command did what it was asked, including finding that there is
  nothing to report or do (``head`` of an idle queue, ``settled`` with no
  settled jobs, ``fail-lane`` of a lane without live jobs, ``purge`` of an
  empty queue), a cancellation ``recorded`` or ``replayed``, ``run`` stopped
  by SIGINT / SIGTERM;
* 1: it could not: the named job does not exist (``show``, ``cancel``), a
  cancellation was not recorded (``conflict``), no ``watchdog_jobs`` table,
  an error of the library, of the database or of the ``run`` target;
* 2: a usage error (unknown command or option, a bad value, an unusable
  URL); one line on stderr, nothing done.

``python -m sqlalchemy_watchdog.cli`` is the same command.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import Engine, create_engine, inspect, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .client import Watchdog
from .errors import WatchdogError, redacted
from .jobs import CancelStatus, JobView
from .model import jobs_table

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
     nothing to fail or purge, a cancellation recorded or replayed
  1  not done: no such job (show, cancel), a cancellation not recorded
     (conflict), no watchdog_jobs table, a library or database error
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
    """A sync engine on ``url``; an unknown dialect or driver is a usage error."""
    try:
        return create_engine(url)
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
        "payload": job.payload,
    }


def _print_json(value: Any, out: TextIO) -> None:
    print(json.dumps(value, ensure_ascii=False, sort_keys=False), file=out)


def _print_job(job: JobView, out: TextIO) -> None:
    fields = _job_dict(job)
    fields["payload"] = json.dumps(job.payload, ensure_ascii=False, sort_keys=True)
    detail = fields.pop("failure_detail")
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        print(f"{name:<{width}}  {'-' if value is None else value}", file=out)
    if detail:  # the handler's traceback, last: it spans lines
        print(f"{'failure_detail':<{width}}", file=out)
        for line in detail.rstrip().splitlines():
            print(f"  {line}", file=out)


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


def _one_line(text: str) -> str:
    """``text`` on one line: line breaks shown as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


#: What ``show`` prints for a job without a retry policy or timeout of its own.
_NOT_ITS_OWN = "- (its handler's or runner's, if any)"


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
    )
    return fields


def _print_show(job: JobView, out: TextIO) -> None:
    """What ``show`` prints: one ``name  value`` line per field, then the
    failure history (one line per failed attempt) and the traceback."""
    retry = job.retry
    lines: list[tuple[str, object]] = [
        ("sequence", job.sequence),
        ("job_id", job.job_id),
        ("queue", job.queue),
        ("lane", job.lane),
        ("priority", job.priority),
        ("state", job.state.value),
        ("run_at", _iso(job.run_at)),
        ("ready_at", _iso(job.ready_at)),
        ("attempt", job.attempt if job.max_attempts is None else f"{job.attempt} of {job.max_attempts}"),
        ("snoozes", job.snoozes),
        ("timeout", _NOT_ITS_OWN if job.timeout is None else _duration_text(job.timeout)),
        (
            "retry",
            _NOT_ITS_OWN
            if retry is None
            else f"max_attempts={retry.max_attempts}, backoff={_duration_text(retry.backoff)},"
            f" factor={retry.factor:g}, max_backoff={_duration_text(retry.max_backoff)}, jitter={retry.jitter:g}",
        ),
        ("outcome", None if job.outcome is None else job.outcome.value),
        ("failure_reason", None if job.failure_reason is None else _one_line(job.failure_reason)),
        ("recovery_count", job.recovery_count),
        ("max_recoveries", job.max_recoveries),
        ("cancellation_id", job.cancellation_id),
        ("payload", json.dumps(job.payload, ensure_ascii=False, sort_keys=True)),
    ]
    width = max(len(name) for name in [*(name for name, _ in lines), "failure_history", "failure_detail"])
    for name, value in lines:
        print(f"{name:<{width}}  {'-' if value is None else value}", file=out)
    if not job.failure_history:
        print(f"{'failure_history':<{width}}  -", file=out)
    else:  # oldest first, one line per failed attempt
        print(f"{'failure_history':<{width}}", file=out)
        for entry in job.failure_history:
            print(f"  {_iso(entry.at)}  attempt {entry.attempt}  {_one_line(entry.reason)}", file=out)
    if job.failure_detail:  # the handler's traceback, last: it spans lines
        print(f"{'failure_detail':<{width}}", file=out)
        for line in job.failure_detail.rstrip().splitlines():
            print(f"  {line}", file=out)


def _print_table(jobs: Sequence[JobView], out: TextIO) -> None:
    header = ("sequence", "job_id", "queue", "outcome", "failure_reason")
    rows = [
        (
            str(job.sequence),
            job.job_id,
            job.queue,
            job.outcome.value if job.outcome else "-",
            job.failure_reason or "",
        )
        for job in jobs
    ]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header) - 1)]
    for cells in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        print(f"{line}  {cells[-1]}".rstrip(), file=out)


# -- commands ---------------------------------------------------------------------------


def cmd_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    """Apply the package's Alembic revisions (branch ``watchdog``) up to ``args.revision``.

    Runs without an ``env.py``: the revisions shipped in
    ``sqlalchemy_watchdog/migrations/versions`` are applied on one connection,
    recorded in the database's ``alembic_version`` table as ``alembic
    upgrade`` would.
    """
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from .model import metadata

    engine = open_engine(args.url)
    try:
        script = ScriptDirectory(_MIGRATIONS_DIR, version_locations=[_VERSIONS_DIR])
        target = args.revision

        def upgrade(rev: Any, context: Any) -> Any:
            return script._upgrade_revs(target, rev)

        try:
            with EnvironmentContext(
                Config(), script, fn=upgrade, destination_rev=target, as_sql=False
            ) as env, engine.connect() as conn:
                env.configure(connection=conn, target_metadata=metadata)
                with env.begin_transaction():
                    env.run_migrations()
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
    """Print one job, with its time and failure policy (``run_at``,
    ``ready_at``, the attempt it is on, snoozes, timeout, retry policy) and
    its failure history; exit 1 when there is no such job."""
    job = _watchdog(args).read(args.job_id)
    if args.json:
        _print_json(None if job is None else _show_dict(job), out)
    elif job is not None:
        _print_show(job, out)
    if job is None:
        raise CommandFailed(f"no job {args.job_id!r}")
    return 0


def cmd_head(args: argparse.Namespace, out: TextIO) -> int:
    """Print the queue's running job, else its next queued one (idle: a note, exit 0)."""
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
    """Record a cancellation; exit 1 unless it is ``recorded`` or ``replayed``."""
    result = _watchdog(args).cancel(args.job_id, args.cancellation_id, only_if_queued=args.only_if_queued)
    if args.json:
        _print_json({"job_id": result.job_id, "status": result.status.value}, out)
    else:
        print(f"{result.job_id}: {result.status.value}", file=out)
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
                print(f"{job.job_id}: failed", file=out)
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
    """Delete the queue's queued jobs and say how many."""
    deleted = _watchdog(args).purge(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "deleted": deleted}, out)
    else:
        print(f"queue {args.queue!r}: {deleted} queued job(s) deleted", file=out)
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
    if not named or isinstance(target, Mapping):
        _require_table(engine)  # before the runner: "no table" is the first thing to fix
        # Without an attribute: the handlers registered with @handler.
        return Runner(engine, target if named else None, **options)
    if isinstance(target, (Runner, AsyncRunner)) or callable(target):
        if options:
            raise UsageError(
                f"{args.target} builds its own runner; the options "
                f"{', '.join('--' + n.replace('_', '-') for n in options)} apply only "
                "to `run MODULE` or `run MODULE:HANDLERS_MAPPING`"
            )
        runner = target if isinstance(target, (Runner, AsyncRunner)) else target(engine)
        if not isinstance(runner, (Runner, AsyncRunner)):
            raise CommandFailed(
                f"{args.target}(engine) returned {type(runner).__name__}, not a Runner or AsyncRunner"
            )
        return runner
    raise CommandFailed(
        f"{args.target} is a {type(target).__name__}; expected a Runner, a factory "
        "engine -> Runner, or a mapping of queue names to handlers"
    )


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the queues until SIGINT / SIGTERM.

    ``MODULE`` is imported for its ``@handler`` registrations and a
    ``Runner(engine)`` serves them. ``MODULE:ATTR`` names instead a mapping
    ``{queue: handler}``, a ``Runner`` / ``AsyncRunner``, or a factory
    ``engine -> Runner | AsyncRunner`` (an async runner brings its own
    ``AsyncEngine``). The options ``--queue``, ``--concurrency``, ``--lease``,
    ``--heartbeat``, ``--poll-interval`` and ``--grace`` apply when this
    command builds the runner. A database without the ``watchdog_jobs``
    table is refused at start (exit 1).
    """
    from .asyncio import AsyncRunner

    engine = open_engine(args.url)
    try:
        runner = build_runner(args, engine)
        # The database the runner will use (a target may bring its own
        # engine) must have the table: refuse now rather than retry forever.
        if isinstance(runner, AsyncRunner):

            async def serve() -> None:
                await _require_table_async(runner.engine)
                await runner.run_forever()

            asyncio.run(serve())
        else:
            _require_table(getattr(runner, "engine", engine))
            runner.run_forever()
        return 0
    finally:
        engine.dispose()


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
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {SECONDS_MAX:.0f}, got {text[:40]!r}"
        )
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
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON (one object per line)"
    )
    parser.add_argument(
        "--log-level",
        default=default(None),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: INFO for run, WARNING otherwise)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlalchemy-watchdog``."""
    parser = _Parser(
        prog="sqlalchemy-watchdog",
        description="Migrate, inspect, command and run a sqlalchemy_watchdog job queue.",
        epilog=(
            f"The database: --url, else ${URL_ENV}, else {DEFAULT_URL}.\n"
            "--url, --json and --log-level go before or after the command.\n"
            "Only upgrade creates anything (a table, a SQLite file).\n\n" + EXIT_STATUS_HELP
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
    upgrade.add_argument(
        "revision", nargs="?", default="heads", help="target revision (default: heads)"
    )
    upgrade.set_defaults(func=cmd_upgrade, needs_engine=False)

    show = commands.add_parser("show", help="print one job")
    show.add_argument("job_id")
    show.set_defaults(func=cmd_show)

    head = commands.add_parser("head", help="the queue's running job, else its next queued one")
    head.add_argument("queue")
    head.set_defaults(func=cmd_head)

    settled = commands.add_parser("settled", help="settled jobs in admission order")
    settled.add_argument("--limit", type=_positive_int, default=100, help="1-256 (default: 100)")
    settled.add_argument(
        "--after", type=_non_negative_int, default=0, metavar="SEQUENCE",
        help="only jobs with a greater sequence (default: 0)",
    )
    settled.set_defaults(func=cmd_settled)

    cancel = commands.add_parser("cancel", help="record a cancellation (idempotent per CANCELLATION_ID)")
    cancel.add_argument("job_id")
    cancel.add_argument("cancellation_id")
    cancel.add_argument(
        "--only-if-queued", action="store_true", help="refuse (conflict) when the job is already running"
    )
    cancel.set_defaults(func=cmd_cancel)

    fail_lane = commands.add_parser("fail-lane", help="settle every live job of a lane failed")
    fail_lane.add_argument("lane")
    fail_lane.add_argument("reason")
    fail_lane.set_defaults(func=cmd_fail_lane)

    purge = commands.add_parser("purge", help="delete a queue's queued jobs")
    purge.add_argument("queue")
    purge.set_defaults(func=cmd_purge)

    run = commands.add_parser(
        "run",
        help="serve the queues until SIGINT/SIGTERM",
        description=cmd_run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("target", metavar="MODULE[:ATTR]")
    run.add_argument(
        "--queue", dest="queues", action="append", metavar="QUEUE",
        help="serve only this queue (repeatable; default: every queue with a handler)",
    )
    run.add_argument(
        "--concurrency", type=_concurrency, help=f"handlers run at once, 1-{CONCURRENCY_MAX} (default: 1)"
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
        "--grace", type=_seconds, metavar="SECONDS",
        help="on shutdown, time running handlers get to finish (default: 30)",
    )
    run.set_defaults(func=cmd_run, needs_engine=False)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    level = args.log_level or ("INFO" if args.command == "run" else "WARNING")
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
        args.url = database_url(args.url)
        if getattr(args, "needs_engine", True):
            engine = open_engine(args.url)
            args.engine = engine
        func: Callable[[argparse.Namespace, TextIO], int] = args.func
        return func(args, sys.stdout)
    except UsageError as error:
        print(f"{parser.prog}: error: {error} (see --help)", file=sys.stderr)
        return 2
    except CommandFailed as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 1
    except WatchdogError as error:
        print(f"{parser.prog}: error ({error.code.value}): {error}", file=sys.stderr)
        return 1
    except SQLAlchemyError as error:
        # Never the row, the SQL or its parameters (claim tokens, payloads).
        print(f"{parser.prog}: database error: {redacted(error)}", file=sys.stderr)
        return 1
    finally:
        if engine is not None:
            engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
