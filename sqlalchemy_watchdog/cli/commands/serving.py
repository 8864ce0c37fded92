"""The runners' commands: ``run`` (serve the queues), ``schedules`` (what a
module defines, or what the runners record they serve) and ``workers`` (the
registered runners)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from sqlalchemy import Engine

from ...backends import known_backend
from ...client import Watchdog
from ...errors import InvalidJob
from ...schedules import Schedule, check_schedules
from ..exits import CommandFailed, UsageError
from ..output import (
    one_line,
    render_recorded_schedules,
    render_schedule_slots,
    render_workers,
    schedule_slots_dict,
    schedule_view_dict,
    worker_dict,
)
from ..urls import database_url, open_engine, require_table, require_table_async, shown
from . import open_watchdog, print_json

#: The command's logger, named after the command (as the observability guide says).
log = logging.getLogger("sqlalchemy_watchdog.cli")


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
    from ...asyncio import AsyncRunner
    from ...runner import Runner

    target, named = load_target(args.target)
    options: dict[str, Any] = {}
    if args.queues:
        options["queues"] = args.queues
    if args.concurrency is not None:
        options["concurrency"] = args.concurrency
    default_executor, per_queue = _executor_choices(args)
    if args.claim_ahead is not None:
        if default_executor == "process":
            raise UsageError(
                "with --executor process, --prefetch sets how many jobs are claimed ahead, not --claim-ahead"
            )
        options["claim_ahead"] = args.claim_ahead
    for name in ("lease", "heartbeat", "poll_interval", "grace"):
        seconds = getattr(args, name)
        if seconds is not None:
            options[name] = timedelta(seconds=seconds)
    if args.wakeups is not None:
        options["wakeups"] = args.wakeups
    executor, executors = _executor(args, default_executor, per_queue)
    if executor is not None:
        options["executor"] = executor
    if executors:
        options["executors"] = executors
    if args.listen_url is not None:
        listen_url = database_url(args.listen_url)
        listens_there = known_backend(listen_url.get_backend_name())
        if listens_there is None or not listens_there.notifies:
            raise UsageError(f"--listen-url must be a PostgreSQL URL, not {shown(listen_url)}")
        options["listen_engine"] = open_engine(listen_url)
    # The module's schedules, found exactly as `schedules MODULE` finds them.
    module_name = args.target.partition(":")[0]
    schedules = () if args.no_schedules else check_schedules(collect_schedules(sys.modules[module_name]))
    if not named or isinstance(target, Mapping):
        require_table(engine)  # before the runner: "no table" is the first thing to fix
        # Without an attribute: the handlers registered with @handler.
        if schedules:
            options["schedules"] = schedules
        try:
            runner: Any = Runner(engine, target if named else None, **options)
        except InvalidJob as error:
            if error.field != "executors":
                raise
            # --executor QUEUE=...: a queue the runner does not serve is the command line's mistake.
            raise UsageError(f"--executor: {str(error).removeprefix('executors: ')}") from None
        _say_schedules(runner, module_name)
        return runner
    if isinstance(target, (Runner, AsyncRunner)) or callable(target):
        if options:
            raise UsageError(
                f"{args.target} builds its own runner; the options "
                f"{', '.join(dict.fromkeys(_flag(name) for name in options))} apply only "
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
                f"{', '.join(repr(one_line(s.name)) for s in unserved)} that the runner of {args.target} "
                "does not serve (as defined); pass them to it (schedules=[...]), or run with "
                "--no-schedules to serve none of the module's schedules"
            )
        _say_schedules(runner, module_name)
        return runner
    raise CommandFailed(
        f"{args.target} is a {type(target).__name__}; expected a Runner, a factory "
        "engine -> Runner, or a mapping of queue names to handlers"
    )


def _flag(option: str) -> str:
    """The ``run`` flag that gives the runner option ``option``."""
    return "--executor" if option == "executors" else "--" + option.replace("_", "-")


#: ``run``'s options that configure the process executor.
_PROCESS_OPTIONS = (
    "processes",
    "max_jobs_per_child",
    "max_memory_per_child",
    "kill_grace",
    "prefetch",
    "forward_loggers",
)


def _executor_choices(args: argparse.Namespace) -> tuple[str | None, dict[str, str]]:
    """What the ``--executor`` options name: the runner's default executor
    (None: not given) and each queue's (``QUEUE=process``)."""
    default: str | None = None
    per_queue: dict[str, str] = {}
    for queue, name in args.executor or ():
        if queue is None:
            if default is not None and default != name:
                raise UsageError(f"--executor {default} and --executor {name}: give the runner's default once")
            default = name
        elif per_queue.setdefault(queue, name) != name:
            first = per_queue[queue]
            raise UsageError(f"--executor {queue}={first} and --executor {queue}={name}: give a queue's once")
    return default, per_queue


def _executor(
    args: argparse.Namespace, default: str | None, per_queue: Mapping[str, str]
) -> tuple[Any, dict[str, Any]]:
    """The ``executor`` and ``executors`` options the ``--executor`` options
    and their companions ask for (None and ``{}``: not given). The process
    companions (``--processes``, ...) configure every process executor
    named, the default's and the queues' alike: those queues share its
    children."""
    from ...executors import ProcessExecutor

    given = [name for name in _PROCESS_OPTIONS if getattr(args, name, None) is not None]
    if default != "process" and "process" not in per_queue.values():
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UsageError(f"{flags} apply only with --executor process (or --executor QUEUE=process)")
        return default, dict(per_queue)
    if default == "process" and args.concurrency is not None and "thread" not in per_queue.values():
        raise UsageError("with --executor process, --processes sets how many handlers run at once, not --concurrency")
    fields: dict[str, Any] = {
        "processes": args.processes,
        "max_jobs_per_child": args.max_jobs_per_child,
        "max_memory_per_child": None if args.max_memory_per_child is None else args.max_memory_per_child * 2**20,
        "prefetch": args.prefetch,
    }
    if args.kill_grace is not None:
        fields["kill_grace"] = timedelta(seconds=args.kill_grace)
    if args.forward_loggers is not None:
        fields["forward_loggers"] = tuple(args.forward_loggers)
    process = ProcessExecutor(**fields)
    executors = {queue: (process if name == "process" else name) for queue, name in per_queue.items()}
    return (process if default == "process" else default), executors


def _say_schedules(runner: Any, module_name: str) -> None:
    """Log at start which schedules the runner serves (none is said too)."""
    names = [schedule.name for schedule in runner.settings.schedules]
    if names:
        log.info("serving %d schedule(s): %s", len(names), ", ".join(one_line(name) for name in names))
    else:
        log.info("serving no schedules (%s defines none, or --no-schedules)", one_line(module_name))


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the queues until SIGINT / SIGTERM.

    ``MODULE`` is imported for its ``@handler`` registrations and a
    ``Runner(engine)`` serves them. ``MODULE:ATTR`` names instead a mapping
    ``{queue: handler}``, a ``Runner`` / ``AsyncRunner``, or a factory
    ``engine -> Runner | AsyncRunner`` (an async runner brings its own
    ``AsyncEngine``). The options ``--queue``, ``--concurrency``, ``--claim-ahead``, ``--lease``,
    ``--heartbeat``, ``--poll-interval``, ``--grace``, ``--wakeups``,
    ``--listen-url`` and the executor's (``--executor process --processes N``,
    or ``--executor QUEUE=process`` for one queue's handlers beside the others' threads,
    ``--max-jobs-per-child``, ``--max-memory-per-child``, ``--kill-grace``)
    apply when this command builds the runner (behind a
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
    from ...asyncio import AsyncRunner

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
                await require_table_async(runner.engine)
                await runner.run_forever(install_signal_handlers=True)

            asyncio.run(serve())
        else:
            require_table(getattr(runner, "engine", engine))
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
            print_json(schedule_slots_dict(schedule, slots), out)
        return 0
    if not rows:
        print(f"no schedules in {args.target!r}", file=out)
        return 0
    print(render_schedule_slots(rows), file=out)
    return 0


def cmd_workers(args: argparse.Namespace, out: TextIO) -> int:
    """Print every registered runner: live ones, and gone ones (not seen for
    three of their heartbeats and 30 seconds: killed, frozen or cut off)
    until runners prune them an hour later."""
    workers = open_watchdog(args).workers()
    if args.json:
        for worker in workers:
            print_json(worker_dict(worker), out)
        return 0
    if not workers:
        print("no workers registered (none serving, or none since the last clean shutdown)", file=out)
        return 0
    print(render_workers(workers), file=out)
    return 0


def _recorded_schedules(args: argparse.Namespace, out: TextIO) -> int:
    """``schedules`` without a module: what the runners recorded they serve."""
    args.url = database_url(args.url)
    engine = open_engine(args.url)
    try:
        require_table(engine)
        views = Watchdog(engine).schedules()
    finally:
        engine.dispose()
    if args.json:
        for view in views:
            print_json(schedule_view_dict(view), out)
        return 0
    if not views:
        print("no schedules recorded: no runner has served one in the last week", file=out)
        return 0
    print(render_recorded_schedules(views), file=out)
    return 0
