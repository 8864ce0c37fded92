"""What the commands print: each value rendered as text (a table, one
``name  value`` line per field) or as a JSON-ready dict.

The renderers are pure (a value in, a ``str`` or ``dict`` out); the commands
print what they return. Every human-readable output then passes
:class:`Terminal`, which shows stored control characters as escapes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO
from zoneinfo import ZoneInfo

from ..applies import JobExplanation
from ..codecs import ENCRYPTED_TEXT, is_encrypted
from ..jobs import (
    BulkResult,
    JobView,
    Outcome,
    QueueLimits,
    QueueStats,
    ScheduleView,
    Stats,
    Undecodable,
    WorkerView,
)
from ..jobs.durable import COMPENSATION_MARK, JobStep, StepKind
from ..schedules import Schedule
from ..visible import escape


def job_dict(job: JobView) -> dict[str, Any]:
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
        "payload": _json_value(job.payload),
        "key": job.key,
        "held_by": None if job.held_by is None else job.held_by.value,
        **({"undecodable": {u.field: u.reason for u in job.undecodable}} if job.undecodable else {}),
    }


def _json_value(value: Any) -> Any:
    """A payload or result as ``--json`` prints it: ``[encrypted]`` for an
    :class:`~sqlalchemy_watchdog.EncryptedJSON` value (no key here), None for
    an undecodable one (its reason is under ``undecodable``)."""
    if isinstance(value, Undecodable):
        return None
    return ENCRYPTED_TEXT if is_encrypted(value) else value


def _payload_text(job: JobView) -> str:
    """The payload as one line of JSON, ``[encrypted]``, or what makes it undecodable."""
    if isinstance(job.payload, Undecodable):
        return str(job.payload)
    if is_encrypted(job.payload):
        return ENCRYPTED_TEXT
    return json.dumps(job.payload, ensure_ascii=False, sort_keys=True)


def _result_text(job: JobView) -> str | None:
    """The result as one line of JSON (None: none), ``[encrypted]``, or what makes it undecodable."""
    if job.result is None:
        return None
    if isinstance(job.result, Undecodable):
        return str(job.result)
    if is_encrypted(job.result):
        return ENCRYPTED_TEXT
    return json.dumps(job.result, ensure_ascii=False, sort_keys=True)


def _progress_text(job: JobView) -> str | None:
    """``42.5%``, with the note after a colon; None: none reported."""
    if job.progress is None:
        return None
    text = f"{job.progress * 100:.1f}%"
    return f"{text}: {job.progress_note}" if job.progress_note else text


def json_line(value: Any) -> str:
    """``value`` as one line of JSON, as ``--json`` prints it (keys in order, not ASCII-escaped)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def render_job(job: JobView) -> str:
    """What ``head`` prints: one ``name  value`` line per field, the traceback last."""
    lines: list[str] = []
    fields = job_dict(job)
    fields["payload"] = _payload_text(job)
    detail = fields.pop("failure_detail")
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        lines.append(f"{name:<{width}}  {'-' if value is None else one_line(value)}")
    if detail:  # the handler's traceback, last: it spans lines
        lines.append(f"{'failure_detail':<{width}}")
        for line in detail.rstrip().splitlines():
            lines.append(f"  {one_line(line)}")
    return "\n".join(lines)


def iso(value: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 in UTC, to the millisecond (as stored)."""
    return None if value is None else value.astimezone(UTC).isoformat(timespec="milliseconds")


def milliseconds(value: timedelta | None) -> int | None:
    return None if value is None else value // timedelta(milliseconds=1)


def one_line(value: object) -> str:
    """``value`` as one line of a terminal: every control, format or
    bidirectional character (line breaks included) shown as its escape
    (``\\n``, ``\\x1b``, ``\\u202e``; see :mod:`sqlalchemy_watchdog.visible`)."""
    return escape(value)


def show_dict(job: JobView) -> dict[str, Any]:
    """What ``show --json`` prints: :func:`job_dict` and the job's time and
    failure policy (datetimes ISO 8601, durations in milliseconds)."""
    fields = job_dict(job)
    retry = job.retry
    fields.update(
        run_at=iso(job.run_at),
        ready_at=iso(job.ready_at),
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        snoozes=job.snoozes,
        timeout_ms=milliseconds(job.timeout),
        retry=None
        if retry is None
        else {
            "max_attempts": retry.max_attempts,
            "backoff_ms": milliseconds(retry.backoff),
            "factor": retry.factor,
            "max_backoff_ms": milliseconds(retry.max_backoff),
            "jitter": retry.jitter,
        },
        failure_history=[
            {"at": iso(entry.at), "attempt": entry.attempt, "reason": entry.reason} for entry in job.failure_history
        ],
        enqueued_at=iso(job.enqueued_at),
        started_at=iso(job.started_at),
        settled_at=iso(job.settled_at),
        rerun_of=job.rerun_of,
        reruns=list(job.reruns),
        trace_context=None if job.trace_context is None else dict(job.trace_context),
        result=_json_value(job.result),
        progress=job.progress,
        progress_note=job.progress_note,
        parents=[{"job_id": parent, "outcome": outcome} for parent, outcome in job.parents],
        dependents=list(job.dependents),
        waiting_on=job.waiting_on,
    )
    return fields


def applies_dict(explained: JobExplanation) -> dict[str, Any]:
    """What ``show --json`` says applies (``applies``): each setting's value,
    level (``job`` / ``handler`` / ``runner``) and whether it is known here."""
    retry = explained.retry.value
    pause = explained.pause
    return {
        "timeout": {
            "timeout_ms": milliseconds(explained.timeout.value),
            "from": explained.timeout.level.value,
            "known": explained.timeout.known,
        },
        "retry": {
            "max_attempts": None if retry is None else retry.max_attempts,
            "from": explained.retry.level.value,
            "known": explained.retry.known,
        },
        "max_attempts": explained.max_attempts,
        "recovery": {
            "max_recoveries": explained.recovery.value,
            "from": explained.recovery.level.value,
            "known": explained.recovery.known,
        },
        "queue_pause": None if pause is None else {"reason": pause.reason, "paused_at": iso(pause.paused_at)},
        "reason": explained.reason,
        "unique_keys": [
            {
                "unique_key": hold.unique_key,
                "kind": hold.kind.value,
                "states": hold.states.value,
                "since": iso(hold.since),
                "until": iso(hold.until),
                "duplicates": hold.duplicates,
                "replacements": hold.replacements,
            }
            for hold in explained.unique_keys
        ],
        "steps": [
            {
                "name": step.name,
                "kind": step.kind.value,
                "result": step.result,
                "wake_at": iso(step.wake_at),
                "attempt": step.attempt,
                "recorded_at": iso(step.recorded_at),
                "wait": explained.wait_text(step) if step.kind is StepKind.WAIT else None,
            }
            for step in explained.steps
        ],
        "signals": [
            {"name": signal.name, "payload": signal.payload, "sent_at": iso(signal.sent_at)}
            for signal in explained.signals
        ],
    }


def _step_text(explained: JobExplanation, step: JobStep) -> str:
    """One durable step for ``show``: ``charge (attempt 1, 12:00:01)``, a
    sleep with its end, a wait with how it stands, an undo as such."""
    at = "-" if step.recorded_at is None else f"{step.recorded_at:%Y-%m-%d %H:%M:%S}"
    if step.kind is StepKind.SLEEP and step.wake_at is not None:
        return f"{step.name} (sleep until {step.wake_at:%Y-%m-%d %H:%M:%S}, attempt {step.attempt}, {at})"
    if step.kind is StepKind.WAIT and step.wake_at is not None:
        return f"{step.name} (wait for the signal: {explained.wait_text(step)}; attempt {step.attempt}, {at})"
    if step.kind is StepKind.UNDO and step.name == COMPENSATION_MARK:
        return f"{step.name} (recovery asked for a compensating run, attempt {step.attempt}, {at})"
    if step.kind is StepKind.UNDO:
        return f"{step.name} (undone, attempt {step.attempt}, {at})"
    return f"{step.name} (attempt {step.attempt}, {at})"


def render_show(explained: JobExplanation) -> str:
    """What ``show`` prints: one ``name  value`` line per field -- the
    timeout, retry policy and recovery budget that apply and where each comes from, the
    reason in plain words -- then the failure history (one line per failed
    attempt) and the traceback."""
    lines: list[str] = []
    job = explained.job
    fields: list[tuple[str, object]] = [
        ("sequence", job.sequence),
        ("job_id", job.job_id),
        ("queue", job.queue),
        ("lane", job.lane),
        ("priority", job.priority),
        ("state", job.state.value),
        ("enqueued_at", iso(job.enqueued_at)),
        ("started_at", iso(job.started_at)),
        ("settled_at", iso(job.settled_at)),
        ("run_at", iso(job.run_at)),
        ("ready_at", iso(job.ready_at)),
        ("attempt", explained.attempt_text),
        ("snoozes", job.snoozes),
        ("timeout", explained.timeout_text),
        ("retry", explained.retry_text),
        ("queue_pause", explained.pause_text),
        ("outcome", None if job.outcome is None else job.outcome.value),
        ("failure_reason", explained.reason),
        ("recoveries", explained.recovery_text),
        ("recovery_count", job.recovery_count),
        ("max_recoveries", job.max_recoveries),
        ("cancellation_id", job.cancellation_id),
        ("rerun_of", job.rerun_of),
        ("reruns", ", ".join(job.reruns) or None),
        ("key", job.key),
        ("unique_key", "; ".join(hold.text for hold in explained.unique_keys) or None),
        ("steps", "; ".join(_step_text(explained, step) for step in explained.steps) or None),
        (
            "signals",
            "; ".join(f"{signal.name} (kept at {signal.sent_at:%Y-%m-%d %H:%M:%S})" for signal in explained.signals)
            or None,
        ),
        ("waiting_for_room", None if job.held_by is None else f"its queue's {job.held_by.value} limit is reached"),
        ("waits_for", ", ".join(f"{p} ({o or 'not settled'})" for p, o in job.parents) or None),
        ("dependents", ", ".join(job.dependents) or None),
        ("traceparent", None if job.trace_context is None else job.trace_context.get("traceparent")),
        ("progress", _progress_text(job)),
        ("payload", _payload_text(job)),
        ("result", _result_text(job)),
    ]
    width = max(len(name) for name in [*(name for name, _ in fields), "failure_history", "failure_detail"])
    for name, value in fields:
        lines.append(f"{name:<{width}}  {'-' if value is None else one_line(value)}")
    if not job.failure_history:
        lines.append(f"{'failure_history':<{width}}  -")
    else:  # oldest first, one line per failed attempt
        lines.append(f"{'failure_history':<{width}}")
        for entry in job.failure_history:
            lines.append(f"  {iso(entry.at)}  attempt {entry.attempt}  {one_line(entry.reason)}")
    if job.failure_detail:  # the handler's traceback, last: it spans lines
        lines.append(f"{'failure_detail':<{width}}")
        for line in job.failure_detail.rstrip().splitlines():
            lines.append(f"  {one_line(line)}")
    return "\n".join(lines)


def render_settled(jobs: Sequence[JobView]) -> str:
    """What ``settled`` prints: a table, one row per job."""
    lines: list[str] = []
    header = ("sequence", "job_id", "queue", "outcome", "failure_reason")
    rows = [
        (
            str(job.sequence),
            one_line(job.job_id),
            one_line(job.queue),
            job.outcome.value if job.outcome else "-",
            one_line(job.failure_reason),
        )
        for job in jobs
    ]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header) - 1)]
    for cells in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        lines.append(f"{line}  {cells[-1]}".rstrip())
    return "\n".join(lines)


def slot_texts(schedule: Schedule, slot: datetime) -> tuple[str, str]:
    """A slot as local wall-clock time (offset and zone abbreviation) and as UTC."""
    local = slot.astimezone(ZoneInfo(schedule.timezone))
    return (
        f"{local.isoformat(sep=' ', timespec='minutes')} {local.tzname()}",
        f"{slot:%Y-%m-%d %H:%M} UTC",
    )


def when(value: datetime | None) -> str:
    """A database time for a table: ``2026-01-31T12:00:05Z`` (UTC), ``-`` when unknown."""
    return "-" if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def age(value: timedelta) -> str:
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


def column_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, the header first; the last column is not padded.
    Every cell is one line (:func:`one_line`)."""
    rows = [[one_line(cell) for cell in cells] for cells in rows]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for cells in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        lines.append(f"{line}  {cells[-1]}".rstrip())
    return lines


def listed_job_dict(job: JobView) -> dict[str, Any]:
    """A job as ``ls --json`` prints it: :func:`job_dict` with its attempt,
    times and ``rerun_of``."""
    return {
        **job_dict(job),
        "attempt": job.attempt,
        "enqueued_at": iso(job.enqueued_at),
        "started_at": iso(job.started_at),
        "settled_at": iso(job.settled_at),
        "rerun_of": job.rerun_of,
    }


def render_jobs(jobs: Sequence[JobView]) -> str:
    """What ``ls`` prints: a table, one row per job, with its attempt and times."""
    header = ("sequence", "job_id", "queue", "state", "attempt", "enqueued_at", "started_at", "settled_at")
    rows = [
        (
            str(job.sequence),
            job.job_id,
            job.queue,
            job.state.value if job.outcome is None else f"{job.state.value}/{job.outcome.value}",
            str(job.attempt),
            when(job.enqueued_at),
            when(job.started_at),
            when(job.settled_at),
        )
        for job in jobs
    ]
    return "\n".join(column_lines(header, rows))


def _outcome_counts(counts: Mapping[Outcome, int]) -> dict[str, int]:
    """Every outcome's count (zeros included), in :class:`Outcome` order."""
    return {outcome.value: counts.get(outcome, 0) for outcome in Outcome}


def _queue_stats_dict(queue: QueueStats) -> dict[str, Any]:
    oldest = queue.oldest_ready_age
    return {
        "queue": queue.queue,
        "delayed": queue.delayed,
        "queued": queue.queued,
        "running": queue.running,
        "waiting": queue.waiting,
        "expired_leases": queue.expired_leases,
        "oldest_ready_age_seconds": None if oldest is None else oldest.total_seconds(),
        "settled_last_minute": _outcome_counts(queue.settled_last_minute),
        "settled_last_hour": _outcome_counts(queue.settled_last_hour),
        "paused": queue.paused,
        "workers": queue.workers,
        "unserved": queue.unserved,
        "pause": None
        if queue.pause is None
        else {"reason": queue.pause.reason, "paused_at": iso(queue.pause.paused_at)},
        "limits": None if queue.limits is None else limits_dict(queue.limits, queue),
    }


def limits_dict(limits: QueueLimits, use: QueueStats | None = None) -> dict[str, Any]:
    """A queue's limits (and, given its stats, their use) as ``limits --json`` prints them."""
    rate = limits.rate
    per_key = limits.rate_per_key
    found: dict[str, Any] = {
        "queue": limits.queue,
        "concurrency": limits.concurrency,
        "concurrency_per_key": limits.concurrency_per_key,
        "rate": None if rate is None else {"count": rate.count, "period_ms": rate.period_ms, "text": str(rate)},
        "rate_per_key": None
        if per_key is None
        else {"count": per_key.count, "period_ms": per_key.period_ms, "text": str(per_key)},
        "updated_at": iso(limits.updated_at),
    }
    if use is not None:
        found.update(
            running=use.running,
            rate_used=use.rate_used,
            rate_per_key_used=use.rate_per_key_used,
            held_back=use.held_back,
        )
    return found


def limits_text(limits: QueueLimits, use: QueueStats | None = None) -> str:
    """One line: a queue's limits, with their use when its stats are given."""
    parts: list[str] = []
    if limits.concurrency is not None:
        parts.append(f"concurrency {limits.concurrency}" + ("" if use is None else f" (running {use.running})"))
    if limits.concurrency_per_key is not None:
        parts.append(f"per key {limits.concurrency_per_key}")
    if limits.rate is not None:
        parts.append(f"rate {limits.rate}" + ("" if use is None else f" (used {use.rate_used or 0})"))
    if limits.rate_per_key is not None:
        busiest = "" if use is None else f" (busiest key used {use.rate_per_key_used or 0})"
        parts.append(f"rate per key {limits.rate_per_key}{busiest}")
    if use is not None:
        parts.append(f"held back {use.held_back}")
    return ", ".join(parts)


def render_limits(stats: Stats, queue: str | None = None) -> str:
    """What ``limits`` prints: one line per limited queue (or the one asked), with its use."""
    limited = [q for q in stats.queues if q.limits is not None and (queue is None or q.queue == queue)]
    if not limited:
        return ("no queue has limits" if queue is None else f"queue {one_line(queue)!r} has no limits") + "\n"
    width = max(len(one_line(q.queue)) for q in limited)
    lines = []
    for q in limited:
        assert q.limits is not None
        lines.append(f"{one_line(q.queue):<{width}}  {limits_text(q.limits, q)}")
    return "\n".join(lines) + "\n"


def stats_document(stats: Stats) -> dict[str, Any]:
    """The JSON document ``stats --json`` prints: ``at`` (the database clock)
    and one object per queue with every key always present (outcome counts
    include zeros; ``oldest_ready_age_seconds`` and ``pause`` may be null)."""
    return {"at": iso(stats.at), "queues": [_queue_stats_dict(queue) for queue in stats.queues]}


def _counts_cell(counts: Mapping[Outcome, int]) -> str:
    cell = ",".join(f"{outcome.value}={counts[outcome]}" for outcome in Outcome if counts.get(outcome))
    return cell or "-"


def render_stats(stats: Stats) -> str:
    """``stats`` as a table, one row per queue."""
    lines = [f"queues at {when(stats.at)} (database clock)"]
    if not stats.queues:
        lines.append("no queue has live jobs, jobs settled in the last hour, or a pause")
        return "\n".join(lines) + "\n"
    header = (
        "queue",
        "delayed",
        "queued",
        "running",
        "waiting",
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
            paused = f"since {when(pause.paused_at)}" + (f": {pause.reason}" if pause.reason else "")
        rows.append(
            (
                queue.queue,
                str(queue.delayed),
                str(queue.queued),
                str(queue.running),
                str(queue.waiting),
                str(queue.expired_leases),
                "-" if queue.oldest_ready_age is None else age(queue.oldest_ready_age),
                _counts_cell(queue.settled_last_minute),
                _counts_cell(queue.settled_last_hour),
                _workers_cell(queue),
                paused,
            )
        )
    unserved = [queue.queue for queue in stats.queues if queue.unserved]
    notes = [f"! no live worker serves {one_line(name)!r}, which has ready jobs" for name in unserved]
    notes += [
        f"limits of {one_line(queue.queue)!r}: {limits_text(queue.limits, queue)}"
        for queue in stats.queues
        if queue.limits is not None
    ]
    return "\n".join(lines + column_lines(header, rows) + notes) + "\n"


def _workers_cell(queue: QueueStats) -> str:
    """The live workers serving a queue; ``0!`` when ready jobs wait for none."""
    return f"{queue.workers}!" if queue.unserved else str(queue.workers)


def worker_dict(worker: WorkerView) -> dict[str, Any]:
    return {
        "worker_id": worker.worker_id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "concurrency": worker.concurrency,
        "running": worker.running,
        "claim_ahead": worker.claim_ahead,
        "executors": worker.executors,
        "wakeups": worker.wakeups,
        "version": worker.version,
        "heartbeat_seconds": worker.heartbeat.total_seconds(),
        "started_at": iso(worker.started_at),
        "last_seen": iso(worker.last_seen),
        "silent_seconds": worker.silent_for.total_seconds(),
        "gone_after_seconds": worker.gone_after.total_seconds(),
        "gone": worker.gone,
    }


def _worker_status(worker: WorkerView) -> str:
    return f"GONE (silent {age(worker.silent_for)})" if worker.gone else f"live (seen {age(worker.silent_for)} ago)"


def _worker_queues(worker: WorkerView) -> str:
    """Its queues, each run in child processes marked ``(process)``."""
    return ",".join(f"{queue}(process)" if where == "process" else queue for queue, where in worker.executors.items())


def render_workers(workers: Sequence[WorkerView]) -> str:
    """What ``workers`` prints: a table, one row per registered runner."""
    header = (
        "worker_id",
        "host",
        "pid",
        "queues",
        "concurrency",
        "ahead",
        "running",
        "started_at",
        "status",
        "wakeups",
    )
    rows = [
        (
            worker.worker_id,
            worker.host,
            str(worker.pid),
            _worker_queues(worker),
            str(worker.concurrency),
            str(worker.claim_ahead),
            # A gone worker's last count is stale (its jobs are recovered when their
            # leases end): "-", as on the dashboard's workers page.
            "-" if worker.gone else str(worker.running),
            when(worker.started_at),
            _worker_status(worker),
            f"{worker.wakeups} (v{worker.version})",
        )
        for worker in workers
    ]
    return "\n".join(column_lines(header, rows))


def schedule_view_dict(view: ScheduleView) -> dict[str, Any]:
    return {
        "name": view.name,
        "fingerprint": view.fingerprint,
        "cron": view.cron,
        "timezone": view.timezone,
        "queue": view.queue,
        "next_slot": iso(view.next_slot),
        "last_enqueued": iso(view.last_enqueued),
        "recorded_by": view.recorded_by,
        "last_seen": iso(view.last_seen),
        "current": view.current,
        "disputed": view.disputed,
    }


def render_recorded_schedules(views: Sequence[ScheduleView]) -> str:
    """What ``schedules`` without a module prints: a table, one row per recorded schedule."""
    header = ("name", "cron", "timezone", "queue", "next_slot", "last_enqueued", "recorded_by", "status")
    rows = []
    for view in views:
        if view.disputed:
            status = "DISPUTED: another deploy serves another definition"
        elif view.current:
            status = "served"
        else:
            status = f"not served since {when(view.last_seen)}"
        rows.append(
            (
                view.name,
                view.cron,
                view.timezone,
                view.queue,
                when(view.next_slot),
                when(view.last_enqueued),
                view.recorded_by,
                status,
            )
        )
    return "\n".join(column_lines(header, rows))


def schedule_slots_dict(schedule: Schedule, slots: Sequence[datetime]) -> dict[str, Any]:
    """A schedule of a module and its next slots, as ``schedules MODULE --json`` prints it."""
    return {
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
    }


def render_schedule_slots(rows: Sequence[tuple[Schedule, Sequence[datetime]]]) -> str:
    """What ``schedules MODULE`` prints: each schedule with its next slots, in
    its own time zone and in UTC, one slot per line."""
    header = ("name", "cron", "timezone", "queue", "next (local)", "next (UTC)")
    lines: list[tuple[str, ...]] = [header]
    for schedule, slots in rows:
        texts = [slot_texts(schedule, slot) for slot in slots] or [("-", "-")]
        lines.append((schedule.name, one_line(schedule.cron), schedule.timezone, one_line(schedule.queue), *texts[0]))
        lines.extend(("", "", "", "", *text) for text in texts[1:])
    widths = [max(len(cells[i]) for cells in lines) for i in range(len(header) - 1)]
    printed = []
    for cells in lines:
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths))
        printed.append(f"{line}  {cells[-1]}".rstrip())
    return "\n".join(printed)


def bulk_dict(result: BulkResult) -> dict[str, Any]:
    return {
        "matched": result.matched,
        "done": list(result.done),
        "repeated": list(result.repeated),
        "skipped": [{"job_id": skip.job_id, "why": skip.why} for skip in result.skipped],
        "batches": result.batches,
        "dry_run": result.dry_run,
    }


# -- the stream every human-readable output passes ---------------------------------------


#: What ``stats --watch`` writes before each frame: cursor home, clear the screen.
CLEAR_SCREEN = "\x1b[H\x1b[2J"


class Terminal(io.TextIOBase):
    """Where every human-readable output goes (``main`` wraps stdout in it
    unless ``--json``): whatever a command writes -- job ids, queues,
    reasons, tracebacks from the database -- reaches the terminal with every
    control, format or bidirectional character but the line breaks shown as
    its escape, so no stored text can retitle or clear the terminal. Line
    breaks inside a value are escaped where the value is formatted
    (:func:`one_line`). :meth:`control` writes the command's own sequences."""

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


def control(out: TextIO, sequence: str) -> None:
    """Write ``sequence`` (e.g. :data:`CLEAR_SCREEN`) to ``out`` as it is."""
    if isinstance(out, Terminal):
        out.control(sequence)
    else:
        out.write(sequence)
