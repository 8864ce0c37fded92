"""The commands on jobs: ``show``, ``head``, ``settled``, ``ls``,
``cancel`` (one job or ``--where``), ``rerun`` (one job or ``--where``),
``purge`` and ``prune``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ...jobs import BulkResult, CancelStatus, JobState
from ..exits import CommandFailed, UsageError
from ..output import (
    applies_dict,
    bulk_dict,
    job_dict,
    listed_job_dict,
    one_line,
    render_job,
    render_jobs,
    render_settled,
    render_show,
    show_dict,
)
from ..values import WHERE_KEYS, format_duration
from . import open_watchdog, print_json


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    """Print one job, with when it was enqueued, started and settled, its
    time and failure policy (``run_at``, ``ready_at``, the attempt it is on,
    snoozes, timeout, retry policy), its rerun links and its failure
    history; exit 1 when there is no such job."""
    explained = open_watchdog(args).explain(args.job_id)
    if args.json:
        print_json(None if explained is None else {**show_dict(explained.job), "applies": applies_dict(explained)}, out)
    elif explained is not None:
        print(render_show(explained), file=out)
    if explained is None:
        raise CommandFailed(f"no job {args.job_id!r}")
    return 0


def cmd_head(args: argparse.Namespace, out: TextIO) -> int:
    """Print the queue's running job, else its next queued, else delayed one (idle: a note, exit 0)."""
    job = open_watchdog(args).read_queue_head(args.queue)
    if args.json:
        print_json(None if job is None else job_dict(job), out)
    elif job is None:
        print(f"queue {args.queue!r} is idle", file=out)
    else:
        print(render_job(job), file=out)
    return 0


def cmd_settled(args: argparse.Namespace, out: TextIO) -> int:
    """Print up to ``--limit`` settled jobs after sequence ``--after``."""
    jobs = open_watchdog(args).read_settled(limit=args.limit, after_sequence=args.after)
    if args.json:
        for job in jobs:
            print_json(job_dict(job), out)
        return 0
    if not jobs:
        print(f"no settled jobs after sequence {args.after}", file=out)
        return 0
    print(render_settled(jobs), file=out)
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
        watchdog = open_watchdog(args)

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
    result = open_watchdog(args).cancel(args.job_id, args.cancellation_id, only_if_queued=args.only_if_queued)
    if args.json:
        print_json({"job_id": result.job_id, "status": result.status.value}, out)
    else:
        print(f"{one_line(result.job_id)}: {result.status.value}", file=out)
    if result.status is CancelStatus.MISSING:
        raise CommandFailed(f"no job {args.job_id!r}")
    if result.status is CancelStatus.CONFLICT:
        raise CommandFailed(
            f"cancellation of {args.job_id!r} not recorded: the job has settled"
            + (" or is running" if args.only_if_queued else "")
            + ", already has another cancellation, or the cancellation id is taken by another job"
        )
    return 0


def cmd_purge(args: argparse.Namespace, out: TextIO) -> int:
    """Delete the queue's waiting, queued and delayed jobs and say how many."""
    deleted = open_watchdog(args).purge(args.queue)
    if args.json:
        print_json({"queue": args.queue, "deleted": deleted}, out)
    else:
        print(f"queue {args.queue!r}: {deleted} queued or delayed job(s) deleted", file=out)
    return 0


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    """Print up to ``--limit`` jobs matching the filters after sequence
    ``--after`` (and before ``--before``), oldest first or, with
    ``--newest-first``, newest first."""
    jobs = open_watchdog(args).list_jobs(
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
            print_json(listed_job_dict(job), out)
        return 0
    if not jobs:
        bounds = [f"after sequence {args.after}"] if args.after or args.before is None else []
        bounds += [] if args.before is None else [f"before sequence {args.before}"]
        print(f"no matching jobs {' and '.join(bounds)}", file=out)
        return 0
    print(render_jobs(jobs), file=out)
    if len(jobs) == args.limit:
        follow = "--before" if args.newest_first else "--after"
        print(f"(more may follow: {follow} {jobs[-1].sequence})", file=out)
    return 0


def cmd_prune(args: argparse.Namespace, out: TextIO) -> int:
    """Delete settled jobs that settled more than ``--older-than`` ago; say how many."""
    deleted = open_watchdog(args).prune(
        older_than=args.older_than,
        outcomes=args.outcomes,
        limit=args.limit,
        include_undated=args.include_undated,
    )
    if args.json:
        print_json(
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


def _run_bulk(args: argparse.Namespace, out: TextIO, verb: str, act: Callable[[bool], BulkResult]) -> int:
    """A bulk action: count first (a dry run); with ``--yes``, act and report."""
    counted = act(True)
    if not args.yes:
        if args.json:
            print_json(bulk_dict(counted), out)
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
        print_json(bulk_dict(result), out)
        return 0
    past = {"rerun": "rerun", "cancel": "cancelled"}[verb]
    print(
        f"{len(result.done)} {past}, {len(result.repeated)} already {past} by this id,"
        f" {len(result.skipped)} skipped ({result.batches} batch(es)).",
        file=out,
    )
    for skip in result.skipped:
        print(f"  skipped {one_line(skip.job_id)}: {one_line(skip.why)}", file=out)
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
    watchdog = open_watchdog(args)
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
        print_json({"job_id": result.job_id, "rerun_of": args.job_id, "status": result.status.value}, out)
    else:
        print(f"{one_line(result.job_id)}: {result.status.value}", file=out)
    return 0
