"""Maintenance: recovery, promotion, schedules, retention, the worker's row, the summary."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .. import telemetry
from ..errors import WatchdogError, redacted
from ..jobs import (
    Job,
    JobView,
    duration_ms,
)
from ..records import (
    PROMOTE_BATCH,
    PROPAGATE_BATCH,
    Claim,
    Recovery,
    RecoveryCause,
    RecoveryStatus,
    ScheduleRecord,
    WorkerRegistration,
)
from .handlers import StopReason
from .settings import SUMMARY_BACKLOG_CAP
from .state import Execution, RunnerCore, TickResult, TickStatus, _outcome, stop
from .steps import UNKNOWN, Probe, Steps, call

log = logging.getLogger("sqlalchemy_watchdog.runner")


def abandon(core: RunnerCore, executions: Sequence[Execution]) -> Steps[TickResult]:
    """End the leases of executions that stopped without deciding (shutdown)
    and recover them at once: requeued within their budget, else settled
    ``interrupted`` with a reason saying the shutdown's grace ran out."""
    budgets = {e.job_id: core.settings.budget_for(e.claim.job) for e in executions}
    recoveries = yield from call(
        core.store.release_and_recover, [e.pair for e in executions], budgets, cause=RecoveryCause.SHUTDOWN
    )
    result = TickResult(TickStatus.REJECTED, None, executions[0].job_id if executions else None)
    claimed = {e.job_id: e.claim.job for e in executions}
    for recovery in recoveries:
        _trace_recovery(claimed[recovery.job_id], recovery, RecoveryCause.SHUTDOWN)
        log.warning(
            "shutdown: job %s was still running after the grace period: %s",
            recovery.job_id,
            recovery.status.value if recovery.job is None else recovery.job.state.value,
        )
        status = TickStatus.REQUEUED if recovery.status is RecoveryStatus.REQUEUED else TickStatus.RECOVERED
        result = TickResult(status, recovery.job, recovery.job_id)
        core.count("requeued" if status is TickStatus.REQUEUED else _outcome(recovery.job))
    return result


def recover(core: RunnerCore) -> Steps[TickResult | None]:
    """Recover the first disappeared claim whose execution is dead.

    Only claims whose lease has ended by the database clock are considered.
    This runner's own lapsed claims are lost (their handlers are told to
    stop); others are probed with ``is_alive`` when one is set: alive
    stays, a probe that raises is *unknown* and stays too. The reconcile is
    conditional on the same token, count and an ended lease, so concurrent
    recoverers never both win. A claim the database refuses to recover is
    isolated for a while, never blocking the others or the loop.
    """
    settings = core.settings
    expired: list[Claim] = yield from call(
        core.store.expired_claims, limit=settings.recovery_batch + len(core.isolated_jobs)
    )
    core.forget_isolated(expired)
    unknown: TickResult | None = None
    for claim in expired:
        if core.isolated(claim):
            continue
        job = claim.job
        own = core.own(job.job_id, claim.token)
        if own is not None:
            yield from stop(own, StopReason.LEASE_LOST)
        elif settings.is_alive is not None:
            alive = yield Probe(job)
            if alive is UNKNOWN:
                unknown = unknown or TickResult(TickStatus.LIVENESS_UNKNOWN, job, job.job_id)
                continue
            if alive:
                continue
        try:
            recovery = yield from call(core.store.reconcile, claim, max_recoveries=settings.budget_for(job))
        except WatchdogError as error:
            if core.store.transient_failure(error):
                raise
            core.isolate(claim, error)
            continue
        if recovery.status is RecoveryStatus.LOST_RACE:
            continue
        _trace_recovery(job, recovery, RecoveryCause.VANISHED)
        core.count("recovered")
        if recovery.unstarted:
            log.warning("recovered job %s: claimed ahead, never started; requeued (no recovery counted)", job.job_id)
            return TickResult(TickStatus.REQUEUED, recovery.job, job.job_id)
        if recovery.compensating:
            log.warning(
                "recovered job %s: requeued for one run that undoes its recorded steps (%s)",
                job.job_id,
                recovery.job.failure_reason if recovery.job else None,
            )
            return TickResult(TickStatus.REQUEUED, recovery.job, job.job_id)
        if recovery.status is RecoveryStatus.REQUEUED:
            log.warning(
                "recovered job %s: requeued (recovery %d of %s)",
                job.job_id,
                job.recovery_count + 1,
                settings.budget_for(job),
            )
            return TickResult(TickStatus.REQUEUED, recovery.job, job.job_id)
        log.warning(
            "recovered job %s: settled %s (%s)",
            job.job_id,
            _outcome(recovery.job),
            recovery.job.failure_reason if recovery.job else None,
        )
        return TickResult(TickStatus.RECOVERED, recovery.job, job.job_id)
    return unknown


def _trace_recovery(job: JobView, recovery: Recovery, cause: RecoveryCause) -> None:
    instrumentation = telemetry.active()
    if instrumentation is not None and recovery.status is not RecoveryStatus.LOST_RACE:
        with telemetry.guarded("recovered"):
            instrumentation.recovered(job, recovery, cause.value)


def probe_failed(job: JobView, error: BaseException) -> Any:
    """A liveness probe that raised: the execution's state is unknown."""
    log.warning("job %s: liveness probe failed (%s); leaving it alone", job.job_id, redacted(error))
    return UNKNOWN


#: The order a summary lists what jobs became in (others follow, sorted).
_SUMMARY_ORDER = ("completed", "failed", "cancelled", "interrupted", "outcome_unknown", "requeued", "rejected")


def summarize(core: RunnerCore) -> Steps[None]:
    """Log the runner's INFO summary: what the jobs that ended since the
    last one became, how many run now, and the backlog of ready jobs in the
    queues it serves (counted up to :data:`SUMMARY_BACKLOG_CAP`; a failed
    count is left out, never stopping the loop)."""
    seconds, counts, running = core.take_summary()
    try:
        backlog = yield from call(core.store.count_ready, core.settings.queues, SUMMARY_BACKLOG_CAP)
        ready = f"{backlog}+" if backlog >= SUMMARY_BACKLOG_CAP else str(backlog)
    except WatchdogError:
        ready = "unknown"
    names = [name for name in _SUMMARY_ORDER if counts.get(name)] + sorted(set(counts) - set(_SUMMARY_ORDER))
    ended = ", ".join(f"{counts[name]} {name}" for name in names) or "none"
    log.info(
        "runner summary: %d job(s) ended in the last %.0fs (%s); %d running; %s ready in %s",
        sum(counts.values()),
        seconds,
        ended,
        running,
        ready,
        ",".join(core.settings.queues),
    )


def prune(core: RunnerCore) -> Steps[None]:
    """Prune settled jobs past the runner's :class:`Retention`: one batch
    per outcome, then a pause; more batches follow soon while there is
    more to delete. One runner at a time (an advisory lock on PostgreSQL;
    SQLite's write lock is exclusive anyway).

    Drivers run it beside the claiming loop (a thread of the sync runner, a
    task of the async one), never in it: a batch's DELETE then delays no
    claim on PostgreSQL, where deleting settled rows locks nothing a claim
    reads; on SQLite it holds the write lock for one batch, as any writer."""
    retention = core.settings.retention
    assert retention is not None
    ages = {outcome.value: age for outcome, age in retention.ages().items()}
    if not ages:
        core.schedule_retention(retention.every.total_seconds())
        return
    try:
        deleted = yield from call(core.store.prune_retention, ages, retention.batch)
    except WatchdogError as error:
        if core.store.transient_failure(error):
            core.outage.failed("pruning", error)
        else:
            log.error("runner: pruning settled jobs failed (%s); trying again later", error)
        core.schedule_retention(retention.every.total_seconds())
        return
    if deleted is None:
        log.debug("another runner is pruning")
    elif deleted:
        log.info("pruned %d settled job(s)", deleted)
    more = deleted is not None and deleted >= retention.batch
    core.schedule_retention(RunnerCore.PRUNE_PAUSE_S if more else retention.every.total_seconds())


def enqueue_schedules(core: RunnerCore, *, defer: bool = False) -> Steps[None]:
    """Enqueue the schedules' due slots ahead of time, and note when to look again.

    Each slot is a delayed job whose ``job_id`` is derived from the
    schedule's name and the slot's time, so however many runners do this,
    one job exists per slot. The next slot of each schedule is enqueued as
    soon as the previous one is due, so it starts on time; a runner that was
    down enqueues at most the schedule's ``catch_up`` missed slots. A slot
    already enqueued with other contents (an older deploy's payload) is kept
    as it is and logged.
    """
    from ..schedules import plan

    now = core.clock.now()  # the runner's clock (a test's fake one too), not datetime.now
    jobs, next_at = plan(core.settings.schedules, now)
    try:
        results = yield from call(core.store.enqueue_each, jobs)
    except WatchdogError as error:
        if core.store.transient_failure(error):
            core.outage.failed("scheduling", error)  # one line per outage episode
        elif defer:
            core.defer_failure("scheduling", error)
        else:
            log.error("runner: enqueueing scheduled jobs failed (%s); trying again soon", error)
        core.schedule_schedules(None)
        return
    for job, result in zip(jobs, results, strict=True):
        if result is None:
            log.warning("schedule slot %s is already enqueued with other contents; kept as it is", job.job_id)
        elif result.status.value == "queued":
            log.info("enqueued schedule slot %s", job.job_id)
    yield from record_schedules(core, jobs, [result is not None for result in results], now)
    until = None if next_at is None else max(0.0, (next_at - now).total_seconds())
    core.schedule_schedules(until)
    if until is not None:
        core.expect_ready(until)


#: The Unix epoch, for epoch milliseconds of a datetime.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


#: How often a serving runner prunes long-gone workers and forgotten
#: schedules (one bounded batch each time).
WORKER_PRUNE_EVERY_S = 300.0


def register_worker(core: RunnerCore, wakeups: str) -> Steps[None]:
    """Register this serving runner in ``watchdog_workers`` (database clock).
    A failure -- a database not upgraded to the table, say -- is logged as a
    WARNING and the runner serves on, unlisted."""
    import os
    import socket

    from .._version import __version__

    settings = core.settings
    registration = WorkerRegistration(
        worker_id=core.worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=tuple(settings.queues),
        concurrency=settings.concurrency,
        wakeups=wakeups,
        version=__version__,
        heartbeat_ms=max(1, round(settings.heartbeat_s * 1000)),
        claim_ahead=settings.most_ahead,
        process_queues=tuple(queue for queue, where in settings.executors.items() if where == "process"),
    )
    try:
        yield from call(core.store.register_worker, registration, len(core.active()))
    except WatchdogError as error:
        log.warning(
            "runner: could not register as worker %s (%s); it serves on, unlisted until a heartbeat registers it "
            "(is the database upgraded? sqlalchemy-watchdog upgrade)",
            core.worker_id,
            error,
        )
        core.unregistered = registration
        return
    core.registration = registration
    core.worker_prune_due = core.clock.monotonic() + WORKER_PRUNE_EVERY_S * random.random()


def refresh_worker(core: RunnerCore) -> Steps[None]:
    """With each heartbeat: refresh this worker's ``last_seen`` (database
    clock) and its running jobs, by the one statement that registered it."""
    registration = core.registration or core.unregistered
    if registration is None:
        return
    try:
        yield from call(core.store.register_worker, registration, len(core.active()))
    except WatchdogError as error:
        if core.registration is not None and core.store.transient_failure(error):
            core.outage.failed("refreshing the worker row", error)  # one line per outage episode
            return
        # A runner that never registered (a database without the table) says so once, at start.
        level = logging.WARNING if core.registration is not None else logging.DEBUG
        log.log(level, "heartbeat: refreshing worker %s failed (%s)", registration.worker_id, error)
        return
    if core.registration is None:
        log.info("runner: registered as worker %s", registration.worker_id)
        core.registration, core.unregistered = registration, None


def deregister_worker(core: RunnerCore) -> Steps[None]:
    """On a clean shutdown: remove this worker's row (a failure leaves it to
    show as gone, then be pruned)."""
    registration, core.registration, core.unregistered = core.registration, None, None
    if registration is None:
        return
    try:
        yield from call(core.store.deregister_worker, registration.worker_id)
    except WatchdogError as error:
        log.warning("shutdown: removing worker %s failed (%s); it will show as gone", registration.worker_id, error)


def prune_workers(core: RunnerCore) -> Steps[None]:
    """Maintenance of a serving runner, every :data:`WORKER_PRUNE_EVERY_S`:
    delete one bounded batch of long-gone workers and forgotten schedules
    (never a job)."""
    if core.registration is None or core.clock.monotonic() < core.worker_prune_due:
        return
    core.worker_prune_due = core.clock.monotonic() + WORKER_PRUNE_EVERY_S
    try:
        deleted = yield from call(core.store.prune_workers)
    except WatchdogError as error:
        core.defer_failure("pruning gone workers", error)
        return
    if deleted:
        log.debug("pruned %d gone worker(s) and forgotten schedule(s)", deleted)


def record_schedules(core: RunnerCore, jobs: Sequence[Job], enqueued: Sequence[bool], now: datetime) -> Steps[None]:
    """Record the schedules this runner serves (``watchdog_schedules``): each
    one's definition, next slot and latest slot enqueued, by this worker. A
    failure is logged (a WARNING the first time) and never stops scheduling."""
    from ..schedules import JOB_ID_PREFIX, fingerprint

    records = []
    for schedule in core.settings.schedules:
        prefix = f"{JOB_ID_PREFIX}{schedule.name}:"
        slots = [
            (job.run_at, done)
            for job, done in zip(jobs, enqueued, strict=True)
            if job.run_at is not None and job.job_id.startswith(prefix)
        ]
        past = [slot for slot, done in slots if done and slot <= now]
        upcoming = [slot for slot, _ in slots if slot > now]
        records.append(
            ScheduleRecord(
                name=schedule.name,
                fingerprint=fingerprint(schedule),
                cron=schedule.cron,
                timezone=schedule.timezone,
                queue=schedule.queue,
                next_slot_ms=duration_ms(min(upcoming) - EPOCH) if upcoming else None,
                last_enqueued_ms=duration_ms(max(past) - EPOCH) if past else None,
            )
        )
    try:
        yield from call(core.store.record_schedules, records, core.worker_id)
    except WatchdogError as error:
        level = logging.DEBUG if core.schedule_record_failed else logging.WARNING
        core.schedule_record_failed = True
        log.log(level, "runner: recording the schedules it serves failed (%s); scheduling goes on", error)
        return
    core.schedule_record_failed = False


#: How often a runner tells the dependents of jobs settled while waiting.
PROPAGATE_INTERVAL_S = 1.0


def propagate(core: RunnerCore, *, defer: bool = False, force: bool = False) -> Steps[None]:
    """Tell the dependents of jobs settled while waiting (revision w0012:
    a cancellation cascading through ``after``), one hop per call and a few
    calls per pass, at most every :data:`PROPAGATE_INTERVAL_S`. A failure is
    logged and tried again at the next pass."""
    now = core.clock.monotonic()
    if now < core.propagation_due and not force:
        return
    core.propagation_due = now + PROPAGATE_INTERVAL_S
    for _ in range(8):
        try:
            told = yield from call(core.store.propagate, limit=PROPAGATE_BATCH)
        except WatchdogError as error:
            if core.store.transient_failure(error):
                core.outage.failed("propagation", error)  # one line per outage episode
            elif defer:
                core.defer_failure("propagation", error)
            else:
                log.error("runner: telling waiting jobs of their parents failed (%s)", error)
            return
        if not told:
            return
        log.debug("told the dependents of %d job(s) settled while waiting", told)
        core.propagation_due = now  # a cascade may go on: look again next pass


def promote(core: RunnerCore, *, defer: bool = False) -> Steps[None]:
    """Make the delayed jobs whose time has come ``queued``, and note when
    the next one is due. A failure is logged (with ``defer``, together with
    the pass's: :meth:`RunnerCore.defer_failure`) and tried again later: it
    never keeps the runner from claiming what is ready."""
    core.promotion_starting()
    try:
        promotion = yield from call(core.store.promote, limit=PROMOTE_BATCH)
    except WatchdogError as error:
        if core.store.transient_failure(error):
            core.outage.failed("promotion", error)  # one line per outage episode
        elif defer:
            core.defer_failure("promotion", error)
        else:
            log.error("runner: promoting delayed jobs failed (%s); claiming goes on", error)
        core.schedule_promotion(None)
        return
    if promotion.promoted:
        log.debug("%d delayed job(s) are ready", promotion.promoted)
    core.schedule_promotion(0.0 if promotion.promoted >= PROMOTE_BATCH else promotion.next_in)
