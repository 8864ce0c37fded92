"""The commands on queues and lanes: ``stats`` (once or ``--watch``),
``pause``, ``resume``, ``limits`` and ``fail-lane``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from ...jobs import PauseStatus
from ..exits import UsageError
from ..output import (
    CLEAR_SCREEN,
    control,
    json_line,
    limits_dict,
    one_line,
    render_limits,
    render_stats,
    stats_document,
)
from ..values import WATCH_INTERVAL_DEFAULT
from . import open_watchdog, print_json


def cmd_fail_lane(args: argparse.Namespace, out: TextIO) -> int:
    """Settle every live job of the lane ``failed``, one batch per call, while ``.more``."""
    watchdog = open_watchdog(args)
    total = 0
    while True:
        failure = watchdog.fail_lane(args.lane, args.reason)
        total += failure.settled
        for job in failure.jobs:
            if not args.json:
                print(f"{one_line(job.job_id)}: failed", file=out)
        if not failure.more:
            # (An empty batch with ``more`` means a concurrent caller took
            # this batch: call again rather than stop with live jobs left.)
            break
    if args.json:
        print_json({"lane": args.lane, "settled": total}, out)
    else:
        print(f"lane {args.lane!r}: {total} job(s) settled failed", file=out)
    return 0


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    """Print every queue's stats once, or with ``--watch`` every ``--interval``
    seconds until Ctrl-C (exit 0): a table redrawn in place, or with
    ``--json`` one document per line."""
    if args.interval is not None and not args.watch:
        raise UsageError("--interval applies only with --watch")
    watchdog = open_watchdog(args)

    def frame() -> str:
        stats = watchdog.stats()
        if args.json:
            return json_line(stats_document(stats)) + "\n"
        return render_stats(stats)

    if not args.watch:
        out.write(frame())
        return 0
    interval = WATCH_INTERVAL_DEFAULT if args.interval is None else args.interval
    try:
        with ctrl_c_stops():
            while True:
                text = frame()
                if not args.json:
                    control(out, CLEAR_SCREEN)
                    text = f"{text}\n(every {interval:g}s; Ctrl-C to stop)\n"
                out.write(text)
                out.flush()
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0


@contextlib.contextmanager
def ctrl_c_stops() -> Iterator[None]:
    """Within: SIGINT raises :class:`KeyboardInterrupt`, however the process
    was started, and is not blocked -- a command that runs until Ctrl-C owns
    Ctrl-C, as ``run`` does. A process inherits an ignored SIGINT from a
    parent that ignored it (anything started with ``&`` by a shell without
    job control: a script, a CI step, a test run in the background) and a
    blocked one from the thread that started it; Python then never installs
    its own handler, and Ctrl-C or ``kill -INT`` would leave the watch
    redrawing forever. Outside the main thread, nothing changes (only the
    main thread can handle a signal in Python). The previous handler and
    mask are put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    unblock = getattr(signal, "pthread_sigmask", None)  # (not on Windows)
    blocked = unblock(signal.SIG_UNBLOCK, {signal.SIGINT}) if unblock is not None else set()
    try:
        yield
    finally:
        if unblock is not None and signal.SIGINT in blocked:
            unblock(signal.SIG_BLOCK, {signal.SIGINT})
        # (A handler installed outside Python reads as None and cannot be
        # put back: the default action stands in for it.)
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def cmd_pause(args: argparse.Namespace, out: TextIO) -> int:
    """Pause a queue (idempotent): no runner claims its jobs until ``resume``."""
    status = open_watchdog(args).pause(args.queue, reason=args.reason)
    if args.json:
        print_json({"queue": args.queue, "status": status.value}, out)
    else:
        note = " (its reason is unchanged)" if status is PauseStatus.ALREADY_PAUSED and args.reason else ""
        print(f"queue {args.queue!r}: {status.value.replace('_', ' ')}{note}", file=out)
    return 0


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    """Resume a queue (idempotent)."""
    status = open_watchdog(args).resume(args.queue)
    if args.json:
        print_json({"queue": args.queue, "status": status.value}, out)
    else:
        print(f"queue {args.queue!r}: {status.value.replace('_', ' ')}", file=out)
    return 0


def cmd_limits(args: argparse.Namespace, out: TextIO) -> int:
    """Show every limited queue's limits and their use (or QUEUE's), set
    QUEUE's limits (``--concurrency``, ``--per-key``, ``--rate``,
    ``--rate-per-key``; replacing the ones it had) or remove them (``--clear``)."""
    given = (args.concurrency, args.per_key, args.rate, args.rate_per_key)
    changing = any(value is not None for value in given)
    if (changing or args.clear) and args.queue is None:
        raise UsageError("name the QUEUE whose limits to set or clear")
    if changing and args.clear:
        raise UsageError("--clear takes no limit options")
    watchdog = open_watchdog(args)
    if args.clear:
        had = watchdog.clear_limits(args.queue)
        if args.json:
            print_json({"queue": args.queue, "status": "cleared" if had else "not_limited"}, out)
        else:
            print(f"queue {args.queue!r}: {'limits cleared' if had else 'had no limits'}", file=out)
        return 0
    if changing:
        watchdog.set_limits(
            args.queue,
            concurrency=args.concurrency,
            concurrency_per_key=args.per_key,
            rate=args.rate,
            rate_per_key=args.rate_per_key,
        )
    stats = watchdog.stats()
    if args.json:
        for queue in stats.queues:
            if queue.limits is not None and (args.queue is None or queue.queue == args.queue):
                print_json(limits_dict(queue.limits, queue), out)
        return 0
    out.write(render_limits(stats, args.queue))
    return 0
