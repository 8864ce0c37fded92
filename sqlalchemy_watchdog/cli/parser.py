"""The argument parser of ``sqlalchemy-watchdog``: argparse construction
only. Each command's parser names its function (``set_defaults(func=...)``)
in :mod:`.commands`; the option types and bounds are in :mod:`.values`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..core.settings import DEFAULT_CONCURRENCY, MAX_CLAIM_AHEAD
from ..executors import MAX_PREFETCH, MAX_PROCESSES
from ..jobs import BULK_BATCH_MAX, LIMIT_MAX, JobState, Outcome
from ..store import LIST_LIMIT_MAX
from ..wakeups import WakeupMode
from .commands.dashboard import cmd_dashboard
from .commands.jobs import cmd_cancel, cmd_head, cmd_ls, cmd_prune, cmd_purge, cmd_rerun, cmd_settled, cmd_show
from .commands.queues import cmd_fail_lane, cmd_limits, cmd_pause, cmd_resume, cmd_stats
from .commands.serving import cmd_run, cmd_schedules, cmd_workers
from .commands.upgrade import cmd_upgrade
from .exits import EXIT_STATUS_HELP
from .urls import DEFAULT_URL, URL_ENV
from .values import (
    CONCURRENCY_MAX,
    SCHEDULE_COUNT_MAX,
    SEQUENCE_MAX,
    WATCH_INTERVAL_DEFAULT,
    WATCH_INTERVAL_MIN,
    concurrency,
    executor_choice,
    int_between,
    loopback_host,
    non_negative_int,
    parse_duration,
    positive_int,
    rate,
    seconds,
    slot_count,
    watch_interval,
    where,
)


class Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr (exit 2), never a traceback."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqlalchemy-watchdog")
    except PackageNotFoundError:  # running from a source tree
        from .. import __version__

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
        "--limit", type=int_between(1, LIST_LIMIT_MAX), default=100, help=f"1-{LIST_LIMIT_MAX} (default: 100)"
    )
    ls.add_argument(
        "--after",
        type=int_between(0, SEQUENCE_MAX),
        default=0,
        metavar="SEQUENCE",
        help="only jobs with a greater sequence (default: 0)",
    )
    ls.add_argument(
        "--before",
        type=int_between(1, SEQUENCE_MAX),
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
        type=watch_interval,
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
        "--limit", type=int_between(1, SEQUENCE_MAX), help="delete at most this many (default: no limit)"
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

    limits = commands.add_parser(
        "limits",
        help="show, set or clear queues' limits (concurrency, per key, rate), obeyed by every runner",
        description="Without options: every limited queue (or QUEUE) with its limits and their use "
        "(running, rate used in the window, jobs held back). With --concurrency, --per-key, --rate or "
        "--rate-per-key: "
        "QUEUE's limits become these (the ones not given: none); --clear removes them.",
    )
    limits.add_argument("queue", nargs="?", metavar="QUEUE")
    limits.add_argument(
        "--concurrency", type=int_between(1, LIMIT_MAX), metavar="N", help="at most N of its jobs running"
    )
    limits.add_argument(
        "--per-key", type=int_between(1, LIMIT_MAX), metavar="N", help="at most N running jobs of one key"
    )
    limits.add_argument(
        "--rate", type=rate, metavar="N/PERIOD", help="at most N starts in any PERIOD (100/minute, 10/s, 5/30s)"
    )
    limits.add_argument(
        "--rate-per-key",
        type=rate,
        metavar="N/PERIOD",
        help="at most N starts of one key's jobs in any PERIOD (100/minute, 10/s, 5/30s)",
    )
    limits.add_argument("--clear", action="store_true", help="remove the queue's limits")
    limits.set_defaults(func=cmd_limits)

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
        type=where,
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
        "--batch", type=int_between(1, BULK_BATCH_MAX), default=100, help="jobs per transaction (default: 100)"
    )


def _executor_options(run: argparse.ArgumentParser) -> None:
    """``run``'s options of the process executor (docs/howto/executors.md)."""
    run.add_argument(
        "--executor",
        type=executor_choice,
        action="append",
        metavar="[QUEUE=]{thread,process}",
        help="where handlers run: thread (default) or process (child processes: hard timeouts, "
        "crash containment, every core); QUEUE=process (or QUEUE=thread) for one queue's handlers, "
        "the others keeping the default; repeat for several queues",
    )
    run.add_argument(
        "--processes",
        type=int_between(1, MAX_PROCESSES),
        help=f"with a process executor: child processes, 1-{MAX_PROCESSES} (default: one per CPU)",
    )
    run.add_argument(
        "--max-jobs-per-child",
        type=positive_int,
        metavar="N",
        help="with a process executor: replace a child after N jobs (default: never)",
    )
    run.add_argument(
        "--max-memory-per-child",
        type=int_between(16, 1024 * 1024),
        metavar="MIB",
        help="with a process executor: replace a child whose resident memory is over MIB after a job",
    )
    run.add_argument(
        "--kill-grace",
        type=seconds,
        metavar="SECONDS",
        help="with a process executor: how long a child told to stop has before it is killed (default: 5)",
    )
    run.add_argument(
        "--prefetch",
        type=int_between(0, MAX_PREFETCH),
        metavar="N",
        help="with a process executor: jobs claimed ahead of the busy children (default: one per process; "
        "0: claim only for an idle child)",
    )
    run.add_argument(
        "--forward-logger",
        dest="forward_loggers",
        action="append",
        metavar="NAME",
        help="with a process executor: also send this logger's records (and its descendants') from the "
        "children at the runner's levels, not only from WARNING up; repeat for several, '' for every logger",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlalchemy-watchdog``."""
    parser = Parser(
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
    settled.add_argument("--limit", type=positive_int, default=100, help="1-256 (default: 100)")
    settled.add_argument(
        "--after",
        type=non_negative_int,
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

    purge = commands.add_parser("purge", help="delete a queue's waiting, queued and delayed jobs")
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
        type=concurrency,
        help=f"handlers run at once, 1-{CONCURRENCY_MAX} (default: {DEFAULT_CONCURRENCY})",
    )
    run.add_argument(
        "--claim-ahead",
        type=int_between(0, MAX_CLAIM_AHEAD),
        metavar="N",
        help="jobs claimed beyond --concurrency while handlers are short, to wait for a free slot "
        "(default: four times the concurrency; 0: never)",
    )
    run.add_argument("--lease", type=seconds, metavar="SECONDS", help="claim lease (default: 120)")
    run.add_argument("--heartbeat", type=seconds, metavar="SECONDS", help="lease renewal period (default: 10)")
    run.add_argument(
        "--poll-interval",
        type=seconds,
        metavar="SECONDS",
        help="look for work this often when idle (default: 2 with NOTIFY on PostgreSQL, 0.25 otherwise)",
    )
    run.add_argument(
        "--grace",
        type=seconds,
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
    _executor_options(run)
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
        type=slot_count,
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
        type=loopback_host,
        default="127.0.0.1",
        help="a loopback address: 127.0.0.1 (default), ::1 or localhost; nothing else (no authorize here)",
    )
    dashboard.add_argument("--port", type=int_between(1, 65535), default=8000, help="default: 8000")
    dashboard.add_argument("--read-only", action="store_true", help="show no action and refuse every one")
    dashboard.set_defaults(func=cmd_dashboard)
    return parser
