"""The runner's step: claim, execute, heartbeat, one loop pass, tick, shutdown."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .. import telemetry
from ..errors import WatchdogError
from ..jobs import (
    Decision,
    JobState,
    JobView,
)
from ..records import SettleRequest
from .handlers import StopReason
from .maintenance import abandon, enqueue_schedules, promote, propagate, prune_workers, recover, summarize
from .rules.settle import settle_request, stop_reason_of
from .settings import LAST_STATEMENTS_S, stop_wait_s
from .state import RENEW_RETRY_FIRST_S, Execution, RunnerCore, TickResult, TickStatus, _reason, stop
from .steps import NEVER_STARTED, STARTED_LATE, Pause, RecordStart, RunHandler, Spawn, Steps, WaitDone, call

log = logging.getLogger("sqlalchemy_watchdog.runner")


def claim_steps(
    core: RunnerCore, limit: int, group: int | None = None
) -> Steps[tuple[list[Execution], tuple[JobView, ...]]]:
    """Claim up to ``limit`` jobs -- of slot group ``group``'s queues, or of
    every queue the runner serves -- : the executions to run, and the jobs
    the claim found cancelled while queued (settled by the claim itself)."""
    asked_at = core.clock.monotonic()
    settings = core.settings
    queues = settings.queues if group is None else settings.slot_groups[group].queues
    # Claiming ahead of the runner's own slots (threads or tasks): every job
    # taken is marked unstarted until its start is recorded (RecordStart).
    ahead = group is not None and _may_wait_for_a_slot(core, group, limit)
    if ahead:
        batch = yield from call(core.store.claim, queues=queues, limit=limit, lease_ms=settings.lease_ms, ahead=True)
    else:
        batch = yield from call(core.store.claim, queues=queues, limit=limit, lease_ms=settings.lease_ms)
    core.run_times.note_round_trip(core.clock.monotonic() - asked_at)
    if group is None:
        core.held_back = batch.held_back
    else:
        core.hold_back(group, batch.held_back)
    instrumentation = telemetry.active()
    core.count("cancelled", len(batch.cancelled))
    for job in batch.cancelled:
        log.debug("job %s cancelled before it ran", job.job_id)
        if instrumentation is not None:
            with telemetry.guarded("settled_unrun"):
                instrumentation.settled_unrun(job)
    executions = [core.admit(claim, asked_at) for claim in batch.claimed]
    if ahead:
        for execution in executions:
            execution.unstarted = execution.claimed_ahead = True
    return executions, batch.cancelled


def _may_wait_for_a_slot(core: RunnerCore, group: int, limit: int) -> bool:
    """Whether a claim of ``limit`` jobs for slot group ``group`` may take
    jobs that wait for one of the runner's own slots (threads or tasks):
    it claims ahead now, or ``limit`` exceeds the slots its running
    executions leave (the limit was reckoned while it claimed ahead, and
    the run times moved since). Those claims mark their jobs unstarted."""
    slots = core.settings.slot_groups[group]
    if slots.executor is not None:
        # A process executor's prefetch: the jobs beyond its idle children
        # wait for one; their starts are recorded as a child takes each.
        if slots.prefetch <= 0:
            return False
    elif slots.ahead_cap <= 0:
        return False
    elif core.claim_ahead(group) > 0:
        return True
    many = len(core.settings.slot_groups) > 1
    running = sum(1 for e in core.active() if e.slot_held and (not many or core.group_of(e.job.queue) == group))
    return limit > slots.concurrency - running


def time_out(core: RunnerCore) -> Steps[None]:
    """Tell every handler that outlived its attempt's timeout to stop
    (:attr:`StopReason.TIMEOUT`); its attempt then counts as failed."""
    for execution in core.overdue():
        yield from stop(execution, StopReason.TIMEOUT)


def execute(core: RunnerCore, execution: Execution) -> Steps[SettleRequest | TickResult]:
    """Run the handler unless the claim was already stopped or lost; end in
    the request that settles it with the exact claim, or in the result of
    handing an abandoned job to recovery.

    A handler that starts within a heartbeat interval of its claim (well
    inside the lease) needs no database check; one that starts later -- the
    process was paused, starved or stopped between claim and start -- first
    renews its exact claim, and does not run if the claim was lost meanwhile
    (another runner may already be running it). Either way the settle is
    guarded by the database: a recorded cancellation turns it into
    ``cancelled``, a lost claim is refused.
    """
    settings = core.settings
    job_id = execution.job_id
    instrumentation = telemetry.active()
    if instrumentation is not None:
        with telemetry.guarded("attempt"):
            execution.trace = instrumentation.attempt(execution)
    try:
        while True:
            if execution.given_back:
                return _given_back(core, execution, NEVER_STARTED)
            if (
                execution.unstarted
                and (execution.child_ready or not execution.killable)
                and not execution.signal.is_set()
                and execution.refused is None
            ):
                # Claimed ahead: its start is recorded before the handler is
                # called (the claim alive, its mark cleared), else recovery
                # would take it for one that never ran. A child process's job
                # waits for a free child first (its driver's answer to the
                # pool then is STARTED_LATE, and child_ready set).
                asked = core.clock.monotonic()
                held = yield from _record_start(core, execution)
                execution.unstarted = False
                if job_id not in held:
                    row = yield from call(core.store.read, job_id)
                    yield from stop(execution, stop_reason_of(row))
                else:
                    execution.checked_at = asked
                    core.renewed(execution, core.lease_bound())
            elif execution.started_late(settings.heartbeat_s) and not execution.signal.is_set():
                asked = core.clock.monotonic()
                held = yield from _renew_before_start(core, execution)
                if job_id not in held:
                    row = yield from call(core.store.read, job_id)
                    yield from stop(execution, stop_reason_of(row))
                else:
                    execution.checked_at = asked
                    core.renewed(execution, core.lease_bound())
            if execution.signal.reason is StopReason.SHUTDOWN:
                decision: Decision | None = None
            elif execution.signal.is_set():
                decision = Decision.failed(f"execution stopped before it started ({_reason(execution)})")
            elif execution.refused is not None:
                decision = execution.refused
            else:
                timeout = execution.job.timeout
                if timeout is not None and not execution.killable:
                    # A child process's handler: its driver starts the clock
                    # once the child is ready (core.start_deadline).
                    execution.deadline = core.clock.monotonic() + timeout.total_seconds()
                started = core.clock.monotonic()
                decision = yield RunHandler(execution)
                if decision is NEVER_STARTED:
                    return _given_back(core, execution, decision)
                if decision is STARTED_LATE:
                    # The driver found the claim's last check over a heartbeat
                    # old when the handler was about to start: check again.
                    execution.slot_held = True
                    continue
                if decision is not None:
                    if execution.killable:
                        core.note_child_run_time(execution)
                    else:
                        core.run_times.note(core.clock.monotonic() - started)
            break
        if decision is None:
            # Stopped by shutdown before it decided: hand it to recovery now.
            abandoned = yield from abandon(core, [execution])
            execution.traced("concluded", abandoned)
            return abandoned
    except WatchdogError as error:
        log.error("job %s: could not run or hand over its claim (%s); recovery will handle it", job_id, error)
        rejected = TickResult(TickStatus.REJECTED, None, job_id)
        execution.traced("concluded", rejected)
        return rejected
    request = settle_request(core, execution, decision)
    execution.traced("decided", decision, request)
    return request


def _renew_before_start(core: RunnerCore, execution: Execution) -> Steps[set[str]]:
    """Renew the claim of a handler about to start late; a transient failure
    is tried again (back-off from :data:`~.state.RENEW_RETRY_FIRST_S`) while
    the claim's lease may be alive -- only after that, or when the driver
    stops, is it raised (the job is then left to recovery)."""
    settings = core.settings
    pause = RENEW_RETRY_FIRST_S
    while True:
        try:
            held = yield from call(
                core.store.renew, [execution.pair], lease_ms=settings.lease_ms, now=core.clock.now_ms()
            )
            return held
        except WatchdogError as error:
            left = execution.lease_ends_by - core.clock.monotonic()
            if not core.store.transient_failure(error) or left <= 0:
                raise
            core.outage.failed("renewing a claim before its handler starts", error)
            if not (yield Pause(min(pause, left))):
                raise
            pause = min(settings.heartbeat_s, pause * 2)


def record_starts(core: RunnerCore, pairs: Sequence[tuple[str, str]]) -> Steps[set[str]]:
    """One statement records the starts of the claims ``pairs`` (jobs
    claimed ahead whose handlers are about to be called: ``store.start``
    clears their ``unstarted`` mark and renews their leases); the job_ids
    whose claim held. What a driver runs for a :class:`RecordStart` -- alone,
    or with every start asked for at that moment (its settler's batch).
    Like a claim's, its round trip is noted for the claim-ahead rule
    (:meth:`~.ahead.RunTimes.note_round_trip`); a failure is raised here,
    unnoted."""
    asked = core.clock.monotonic()
    held = yield from call(core.store.start, pairs, lease_ms=core.settings.lease_ms, now=core.clock.now_ms())
    core.run_times.note_round_trip(core.clock.monotonic() - asked)
    return held


def _record_start(core: RunnerCore, execution: Execution) -> Steps[set[str]]:
    """Record the start of a job claimed ahead (:class:`RecordStart`: the
    driver groups the starts asked for at one moment into one statement); a
    transient failure is tried again as :func:`_renew_before_start` does,
    while the claim's lease may be alive."""
    settings = core.settings
    pause = RENEW_RETRY_FIRST_S
    while True:
        try:
            held: set[str] = yield RecordStart(execution)
            return held
        except WatchdogError as error:
            left = execution.lease_ends_by - core.clock.monotonic()
            if not core.store.transient_failure(error) or left <= 0:
                raise
            core.outage.failed("recording the start of a job claimed ahead", error)
            if not (yield Pause(min(pause, left))):
                raise
            pause = min(settings.heartbeat_s, pause * 2)


def start_in_child(core: RunnerCore, execution: Execution) -> Steps[bool]:
    """A child process is free for ``execution``, a job claimed ahead whose
    start is not recorded yet: record it now (:class:`RecordStart`, shared
    with every start asked for at that moment), in the pool's thread, so the
    child gets the job one round trip after it answered its last one. True:
    recorded, the child may take the job. False -- the claim was not held,
    or the database failed -- : the job is not sent, and ``execute`` records
    it again with its retries (or finds the claim lost and stops it), then
    asks the pool again."""
    execution.child_ready = True
    asked = core.clock.monotonic()
    try:
        held: set[str] = yield RecordStart(execution)
    except WatchdogError:
        return False
    if execution.job_id not in held:
        return False
    execution.unstarted = False
    execution.checked_at = asked
    core.renewed(execution, core.lease_bound())
    return True


def _given_back(core: RunnerCore, execution: Execution, decision: Decision) -> SettleRequest:
    """The request that gives a job claimed ahead back untouched: queued
    again, its attempt and failure fields as the claim found them."""
    claimed = execution.claim.job
    request = SettleRequest(
        execution.job_id, execution.claim.token, decision, core.clock.now_ms(),
        given_back=(claimed.failure_reason, claimed.failure_detail),
    )  # fmt: skip
    log.info("job %s: claimed ahead, never started; given back", execution.job_id, extra=execution.job.log_fields)
    execution.traced("decided", decision, request)
    return request


def renew(core: RunnerCore) -> Steps[float]:
    """The heartbeat: renew every claim this runner holds; tell the handlers
    whose claim was not renewed to stop, and why (judged from the row).
    Returns how long until the next renewal.

    One whose handler has returned is settling: its renewal fails because
    the settle just committed (nothing to stop), or its claim was lost and
    the database refuses the settle (which logs it) -- either way there is
    no handler left to tell.

    A renewal that fails transiently (the database unreachable, the store's
    own retries spent) tells no handler anything: only the database can say
    a claim was lost (a renewal that does not hold it, or recovery finding
    its lease ended by the database clock). It is tried again after a short
    back-off (:data:`~.state.RENEW_RETRY_FIRST_S`, doubling up to the heartbeat
    interval) rather than a whole interval later, so that the first renewal
    that goes through after a blip shorter than the lease keeps every claim
    -- and the settles waiting for the database (:func:`~.rules.settle.settle_batch`)
    their time. Logged once per outage episode (:class:`~.outage.Outage`).
    """
    # A timed-out attempt is not renewed: its handler settles within the
    # lease it still has, or -- if it ignores the stop -- its lease ends and
    # recovery takes the job, as for any execution that stopped answering.
    # One the driver can kill (a child process) is renewed until its kill
    # is confirmed and it settled: recovery never runs it beside the child.
    # One whose handler returned and runs its undos (a timeout on its last
    # attempt compensates) is renewed again until it settled.
    executions = [e for e in core.active() if e.signal.reason is not StopReason.TIMEOUT or e.killable or e.compensating]
    if not executions:
        return core.renewal_went_through()
    asked = core.clock.monotonic()
    try:
        held = yield from call(
            core.store.renew, [e.pair for e in executions], lease_ms=core.settings.lease_ms, now=core.clock.now_ms()
        )
        bound = core.lease_bound()
        for execution in executions:
            if execution.job_id in held:
                # Known live as of the renewal's start: a job claimed ahead that
                # waits for a child need not renew once more before it starts.
                execution.checked_at = max(execution.checked_at, asked)
                core.renewed(execution, bound)
                continue
            if not execution.slot_held or execution.signal.is_set() or execution.done.is_set():
                continue
            row = yield from call(core.store.read, execution.job_id)
            yield from stop(execution, stop_reason_of(row))
    except WatchdogError as error:
        if not core.store.transient_failure(error):
            raise
        core.outage.failed("heartbeat", error, f"{len(executions)} claim(s) to renew, retrying while their leases last")
        return core.renewal_failed()
    return core.renewal_went_through()


def loop_pass(core: RunnerCore) -> Steps[float]:
    """One pass of :meth:`Runner.run_forever`'s loop; returns how long to
    wait for a wake-up before the next (0: go on at once).

    Recover when due -- a recovery the database refuses never keeps the
    loop from claiming -- then claim for the free slots and start what was
    claimed. When every free slot was filled there may be more ready work,
    so the next pass follows at once.
    """
    if core.recovery_is_due():
        until_expiry: float | None = None
        try:
            result = yield from recover(core)
            until_expiry = yield from call(core.store.seconds_until_next_expiry)
        except WatchdogError as error:
            core.defer_failure("recovery", error)
            result = None
        core.schedule_recovery(until_expiry)
        if result is not None and result.status is TickStatus.REQUEUED:
            core.recovery_due = 0.0  # there may be more to recover, and the requeued job is ready
    if core.settings.schedules and core.schedules_are_due():
        yield from enqueue_schedules(core, defer=True)
    if core.promotion_is_due():
        yield from promote(core, defer=True)
    yield from propagate(core, defer=True)
    if core.summary_is_due():
        yield from summarize(core)
    yield from prune_workers(core)
    # Each executor's slot group is claimed for apart (one statement each),
    # up to its own free slots: one queue's backlog never takes another
    # executor's slots.
    wanted = [(group, free) for group, free in core.free_by_group() if free > 0]
    if not wanted:
        core.report_deferred()
        return core.idle_wait()
    backlog = False
    for group, free in wanted:
        executions, cancelled = yield from claim_steps(core, free, group)
        if executions:
            yield Spawn(tuple(executions))
        taken = len(executions) + len(cancelled)
        backlog = backlog or (taken > 0 and taken == free)
    core.report_deferred()
    if backlog:
        if core.waiting is not None:
            core.waiting.busy()  # a backlog: no wake-up needed
        return 0.0
    if core.waiting is not None:
        core.waiting.idle()
    return core.idle_wait()


def tick(core: RunnerCore) -> Steps[TickResult | Execution]:
    """One step of a custom loop: recover a disappeared claim if any; else
    make due delayed jobs ready and claim one job. Returns the recovery's or
    the claim's result, or the execution the driver then runs to the end
    with :func:`execute` (with a heartbeat beside it)."""
    recovery = yield from recover(core)
    if recovery is not None and recovery.status is not TickStatus.LIVENESS_UNKNOWN:
        return recovery
    if core.settings.schedules and core.schedules_are_due():
        yield from enqueue_schedules(core)
    yield from promote(core)
    yield from propagate(core, force=True)
    executions, cancelled = yield from claim_steps(core, 1)
    if cancelled:
        return TickResult(TickStatus.SETTLED, cancelled[0], cancelled[0].job_id)
    if not executions:
        return recovery or TickResult(TickStatus.IDLE)
    return executions[0]


def until_idle(result: TickResult, settled: list[JobView]) -> bool:
    """The rule of ``run_until_idle``: collect what a tick settled; whether
    to stop (nothing was ready, or only executions of unknown liveness)."""
    if result.status in (TickStatus.IDLE, TickStatus.LIVENESS_UNKNOWN):
        return True
    if result.job is not None and result.job.state is JobState.SETTLED:
        settled.append(result.job)
    return False


#: How long shutdown waits, after the stop wait, for executions whose child
#: process is being killed to confirm the kill and hand their job to recovery.
KILL_CONFIRM_WAIT_S = 5.0


def shutdown(core: RunnerCore) -> Steps[None]:
    """Shut down: give running handlers ``grace`` to finish, then ask them to
    stop (an async handler's task is cancelled) and give them a short moment
    to settle; what still runs after that has its lease ended on purpose and
    is recovered at once -- never left running under a live lease, never lost.

    An execution whose handler has returned is settling: there is nothing
    to stop and nothing to hand to recovery (its decision is made). Its
    settle -- retried while the database is unreachable
    (:func:`~.rules.settle.settle_batch`) -- is waited for until the
    shutdown budget (grace and stop wait) is spent, and at least
    :data:`~.settings.LAST_STATEMENTS_S` from then (a settle or a hand-off
    to recovery just begun is one statement), or until its lease has surely
    ended if that is sooner; what is still waiting then is said (WARNING),
    and the driver stops its settler, which gives those settles up (their
    decisions lost, logged ERROR; recovery handles the jobs once their
    leases end)."""
    grace = core.settings.grace_s
    budget_ends = core.clock.monotonic() + core.settings.shutdown_budget_s
    yield WaitDone(tuple(core.active()), grace)
    leftover = [e for e in core.active() if not e.done.is_set() and e.slot_held]
    if leftover:
        yield from _stop_running(core, leftover, grace)
    settling = [e for e in core.active() if not e.done.is_set() and not e.slot_held]
    if not settling:
        return
    until = min(
        max(budget_ends, core.clock.monotonic() + LAST_STATEMENTS_S),
        max(e.lease_ends_by for e in settling),
    )
    wait = until - core.clock.monotonic()
    if wait > 0:
        yield WaitDone(tuple(settling), wait)
    settling = [e for e in settling if not e.done.is_set()]
    if settling:
        log.warning(
            "shutdown: %d settle(s) still waiting for the database after the shutdown budget (%gs): %s",
            len(settling),
            core.settings.shutdown_budget_s,
            ", ".join(e.job_id for e in settling[:10]) + (" and more" if len(settling) > 10 else ""),
        )


def _stop_running(core: RunnerCore, leftover: list[Execution], grace: float) -> Steps[None]:
    """Tell the handlers still running after the grace to stop; hand what
    still runs after the stop wait to recovery."""
    for execution in leftover:
        yield from stop(execution, StopReason.SHUTDOWN)
    yield WaitDone(tuple(leftover), stop_wait_s(grace))
    leftover = [e for e in leftover if not e.done.is_set() and e.slot_held]
    killing = tuple(e for e in leftover if e.killable)
    if killing:
        # Children told to stop are killed within half the stop wait; each such
        # execution hands its job to recovery itself once the kill is confirmed,
        # never before: wait for that rather than end their leases beside them.
        yield WaitDone(killing, KILL_CONFIRM_WAIT_S)
        leftover = [e for e in leftover if not e.done.is_set() and e.slot_held]
    if not leftover:
        return
    try:
        yield from abandon(core, leftover)
    except WatchdogError as error:
        log.error("shutdown: could not hand %d running job(s) to recovery: %s", len(leftover), error)
