"""What a handler's answer means: one verdict, and the settle it makes."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from ...errors import InvalidJob, WatchdogError, redacted_detail, safe_text
from ...jobs import (
    Decision,
    JobState,
    JobView,
    Outcome,
    RetryPolicy,
    SettleStatus,
    at_epoch_ms,
    bound_reason,
    duration_ms,
    encode_result,
    history_with,
)
from ...records import SettleRequest
from ..durable import Compensating, CompensationFailed, DurableSteps, SleepRequested, WaitRequested, WaitTimedOut
from ..handlers import RunningJob, StopReason
from ..ports import Settlement
from ..state import Execution, RunnerCore, TickResult, TickStatus, _outcome
from ..steps import Pause, Steps, call

log = logging.getLogger("sqlalchemy_watchdog.runner")


def decision_of_result(result: object, job: RunningJob) -> Decision | None:
    """A handler's return value as a decision.

    None means ``completed``: a handler that returns normally has done its
    work, also after the runner asked it to stop for shutdown. A handler
    that stopped early says so -- by raising (after a shutdown stop the job
    is then handed to recovery: requeued within its budget, else
    ``interrupted``; an async handler's cancelled task is the same) or by
    returning a :class:`Decision`. The one exception is an attempt past its
    timeout, which counts as failed whatever it returns but a Decision.

    Any other value is the job's result: ``completed`` keeping it (as
    ``Decision.completed(result=value)``); :func:`settle_request` encodes
    it, and fails the job if it cannot be kept.
    """
    if isinstance(result, Decision):
        return result
    if job.stop_reason is StopReason.TIMEOUT:
        return Decision.failed(timed_out(job))
    if result is None:
        return Decision.completed()
    if isinstance(result, Outcome):  # a str enum: a decision meant, not a result
        return Decision.failed(f"handler returned {result!r}, not a Decision or a result (use Decision.completed())")
    return Decision.completed(result)


def decision_of_exception(execution: Execution, error: BaseException) -> Decision | None:
    """A handler's exception as a ``failed`` decision with a bounded reason;
    the exception is logged with its traceback, which is kept with the job
    (``JobView.failure_detail``). Neither the reason nor the kept traceback
    holds a database error's bound parameters, SQL text in the reason, or
    driver details (:func:`~sqlalchemy_watchdog.errors.safe_text`).

    Raised after a shutdown stop, the exception is the handler saying it
    stopped early: no decision (None), and the job is handed to recovery."""
    job = execution.job
    if isinstance(error, SleepRequested):
        # job.sleep(): the attempt ends here and the job is snoozed until the
        # sleep's end (no attempt counted); its slot goes to another job.
        log.info("job %s: %s", job.job_id, error, extra=job.log_fields)
        execution.error_requested = error
        remaining_ms = max(1, error.wake_at_ms - time.time_ns() // 1_000_000)
        return Decision.snooze(timedelta(milliseconds=remaining_ms))
    if job.stop_reason is StopReason.SHUTDOWN:
        log.warning(
            "job %s: its handler stopped for shutdown (%s); handing it to recovery",
            job.job_id,
            safe_text(error),
            extra=job.log_fields,
        )
        return None
    if isinstance(error, Compensating):
        # A run that finishes an earlier run's compensation stopped at its
        # first new step: not a failure of its own (no reason, no traceback);
        # the runner runs the undos not recorded yet (compensate).
        log.info("job %s: %s", job.job_id, error, extra=job.log_fields)
        return Decision.failed(COMPENSATION_RESUMED, retry=False)
    execution.error = error
    execution.failure_detail = redacted_detail(error)
    execution.traced("raised", error)
    # The traceback at DEBUG only: the attempt's one WARNING (a retry) or
    # ERROR (the final failure) line is logged once its fate is known
    # (settle_request: :func:`verdict`).
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s: handler raised %s: %s",
            job.job_id,
            type(error).__name__,
            safe_text(error),
            exc_info=(type(error), error, error.__traceback__),
            extra=job.log_fields,
        )
    if job.stop_reason is StopReason.TIMEOUT:
        return Decision.failed(bound_reason(f"{timed_out(job)} ({safe_text(error)})"))
    if isinstance(error, (WaitTimedOut, CompensationFailed)):
        # Final: a timed-out wait times out again on every attempt.
        return Decision.failed(bound_reason(safe_text(error)), retry=False)
    return Decision.failed(bound_reason(safe_text(error)))


# -- compensation (revision w0022) -------------------------------------------

#: The reason of a run that finished a compensation an earlier run began
#: (that run's own reason was never stored: it did not settle).
COMPENSATION_RESUMED = "compensation began in an earlier run"


def _said(error: BaseException) -> str:
    """A compensation's stop, for the reason and the log (no database details)."""
    return str(error) if isinstance(error, CompensationFailed) else safe_text(error)


def compensation_due(core: RunnerCore, execution: Execution, decision: Decision | None) -> bool:
    """Whether the handler's undos run now, in its own thread or task: the
    attempt failed for good (the handler raised or decided a failure, or
    outlived its timeout; no retry follows; it was not stopped by a
    cancellation or a shutdown, which are no failures) and a step of it
    named an undo; or an earlier run of the job began compensating (it must
    end failed, compensated)."""
    steps = execution.job._steps()
    if steps is None or decision is None or decision.snoozed:
        return False
    if steps.compensation_began:
        return True
    stopped = execution.job.stop_reason
    if steps.undo_count == 0 or decision.outcome is not Outcome.FAILED or stopped not in (None, StopReason.TIMEOUT):
        return False
    job = execution.claim.job
    return verdict(decision, job, core.settings.policy_for(job), execution.error).fate is Fate.SETTLE


def compensated(
    decision: Decision, undone: Sequence[str], error: BaseException | None, earlier: str | None = None
) -> Decision:
    """The job's final decision after its compensation: failed, not retried,
    the reason saying what was undone (or where compensation stopped).
    ``earlier``: the reason recovery kept when it requeued the job for this
    run (its budget spent), which comes first."""
    reason = decision.reason if decision.outcome is Outcome.FAILED and decision.reason else None
    if earlier is not None:
        reason = earlier
    if reason is None:
        reason = COMPENSATION_RESUMED
    if undone:
        reason += f"; compensated: undid {', '.join(repr(name) for name in undone)}"
    if error is not None:
        reason += f"; compensation stopped: {_said(error)}"
    return Decision.failed(bound_reason(reason), retry=False)


def claim_kept(core: RunnerCore, execution: Execution) -> Steps[bool]:
    """Whether the undos of an execution due to compensate may run under its
    claim: at once yes, unless its handler outlived its timeout -- the
    heartbeat stopped renewing that claim then, and the handler may have run
    on past its lease, the job recovered and run elsewhere meanwhile. Such a
    claim is renewed first (one statement, guarded by the exact token and a
    live lease, as the heartbeat's): if it holds, the heartbeat renews it
    again until the job settles (:attr:`Execution.compensating`); if not, no
    undo runs here -- the settle will be refused too, and the job is
    recovery's. A renewal that fails is raised (the job is left to its lease)."""
    if execution.job.stop_reason is not StopReason.TIMEOUT:
        return True
    asked = core.clock.monotonic()
    held = yield from call(core.store.renew, [execution.pair], lease_ms=core.settings.lease_ms, now=core.clock.now_ms())
    if execution.job_id not in held:
        log.warning(
            "job %s: its handler outlived its timeout and its claim: not compensating here (recovery takes the job)",
            execution.job_id,
            extra=execution.job.log_fields,
        )
        return False
    execution.checked_at = max(execution.checked_at, asked)
    core.renewed(execution, core.lease_bound())
    execution.compensating = True
    return True


def _earlier(execution: Execution) -> str | None:
    """The reason recovery kept for a run that finishes a compensation: a
    job requeued for one keeps its reason (``Restart recovery budget
    exhausted ...``); a requeue by recovery within its budget clears it, and
    a run with an ``undo`` row neither retries nor snoozes."""
    steps = execution.job._steps()
    if steps is None or not steps.compensation_began:
        return None
    return execution.claim.job.failure_reason


def steps_unread(execution: Execution) -> DurableSteps | None:
    """The steps of a run that may have been requeued by recovery to
    compensate (its claimed row keeps a reason: that, or a retry) and whose
    handler ended before its first step read them: the driver reads them
    before :func:`compensation_due`, which then finds the marker. None for
    every other run (no read)."""
    steps = execution.job._steps()
    if steps is None or steps.loaded or execution.claim.job.failure_reason is None:
        return None
    return steps


def compensate(core: RunnerCore, execution: Execution, decision: Decision | None) -> Decision | None:
    """:func:`compensation_due`, then the undos, in the handler's thread
    (the driver saw to :func:`claim_kept` first)."""
    if not compensation_due(core, execution, decision):
        return decision
    assert decision is not None
    steps = execution.job._steps()
    assert steps is not None
    timed_out = execution.job.stop_reason is StopReason.TIMEOUT
    earlier = _earlier(execution)
    try:
        undone = steps.compensate(fresh=timed_out)
    except Exception as error:  # an undo raised, the claim is gone, or the database failed
        log.error("job %s: compensation stopped: %s", execution.job_id, _said(error), extra=execution.job.log_fields)
        return compensated(decision, [], error, earlier)
    return compensated(decision, undone, None, earlier)


async def compensate_async(core: RunnerCore, execution: Execution, decision: Decision | None) -> Decision | None:
    """:func:`compensate` for a coroutine handler, on the runner's event loop."""
    if not compensation_due(core, execution, decision):
        return decision
    assert decision is not None
    steps = execution.job._steps()
    assert steps is not None
    timed_out = execution.job.stop_reason is StopReason.TIMEOUT
    earlier = _earlier(execution)
    try:
        undone = await steps.compensate_async(fresh=timed_out)
    except Exception as error:  # an undo raised, the claim is gone, or the database failed
        log.error("job %s: compensation stopped: %s", execution.job_id, _said(error), extra=execution.job.log_fields)
        return compensated(decision, [], error, earlier)
    return compensated(decision, undone, None, earlier)


def timed_out(job: RunningJob) -> str:
    """The reason of an attempt that outlived its timeout."""
    timeout = job.timeout
    seconds = 0.0 if timeout is None else timeout.total_seconds()
    return f"timed out after {seconds:g}s"


def decision_of_cancelled_task(execution: Execution) -> Decision | None:
    """The decision of an async handler whose task was cancelled: none for a
    shutdown (recovery takes it), else ``failed`` with the stop's reason."""
    reason = execution.signal.reason or StopReason.SHUTDOWN
    if reason is StopReason.SHUTDOWN:
        return None
    if reason is StopReason.TIMEOUT:
        return Decision.failed(timed_out(execution.job))
    return Decision.failed(f"execution stopped ({reason.value})")


def stop_reason_of(job: JobView | None) -> StopReason:
    """Why a claim could not be renewed, judged from the stored row."""
    if job is not None and job.cancellation_id is not None:
        return StopReason.CANCELLED
    if job is not None and job.state is JobState.SETTLED and job.outcome is Outcome.FAILED:
        return StopReason.LANE_FAILED
    return StopReason.LEASE_LOST


class Fate(str, enum.Enum):
    """What a verdict does with the job."""

    #: Settle it as the decision says (completed, failed, outcome_unknown, ...).
    SETTLE = "settle"
    #: Requeue it for its next attempt after :attr:`Verdict.wait`.
    RETRY = "retry"
    #: Requeue it for the same attempt after :attr:`Verdict.wait`.
    SNOOZE = "snooze"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt's decision means under the job's retry policy: the
    job's fate, how long until it is due again, and the attempt's one log
    line (its level and its words) -- everything :func:`settle_request`
    needs, decided in one place (:func:`verdict`)."""

    fate: Fate
    #: How long until the job is due again (a retry or a snooze).
    wait: timedelta | None = None
    #: The level of the attempt's log line: WARNING for a retry, ERROR for
    #: the failure that settles the job; None: no line (a success, a snooze).
    level: int | None = None
    #: The failure's reason (``failed`` when the decision gave none).
    reason: str = ""
    #: The attempts in all under the policy (None: no policy).
    max_attempts: int | None = None
    #: Whether the decision goes into the job's failure history (a failed attempt).
    recorded: bool = False
    #: Whether a policy was there but the decision said not to retry.
    not_retried: bool = False


def verdict(decision: Decision, job: JobView, policy: RetryPolicy | None, error: BaseException | None) -> Verdict:
    """The one rule of retries and snoozes.

    * a snooze waits ``after`` and uses no attempt;
    * a retryable ``failed`` decision (a raised exception, a timeout,
      ``Decision.failed(reason)``, ``Decision.retry``) with attempts left
      under the policy waits ``after`` (``Decision.retry``) or the policy's
      backoff and moves to the next attempt; without attempts left -- or
      with ``retry=False``, or no policy at all, or an exception (``error``)
      the policy's ``retry_on`` does not list -- it settles ``failed``;
    * every failed attempt goes into the job's bounded failure history;
    * ``completed`` and ``outcome_unknown`` settle (never retried).

    The level is the attempt's as far as the decision tells: WARNING for a
    retry, ERROR for a final failure; :func:`_log_verdict` lowers the
    latter to WARNING when the handler decided it (returned it) rather than
    raised, was killed or timed out -- a business outcome pages nobody.
    """
    if decision.snoozed:
        assert decision.after is not None
        return Verdict(Fate.SNOOZE, wait=decision.after)
    if decision.outcome is not Outcome.FAILED:
        return Verdict(Fate.SETTLE)
    reason = decision.reason or "failed"
    attempts = None if policy is None else policy.max_attempts
    if (
        decision.retryable
        and policy is not None
        and job.attempt < policy.max_attempts
        and (decision.after is not None or policy.retries(error))
    ):
        wait = decision.after if decision.after is not None else policy.delay(job.attempt)
        # One WARNING line, no traceback (DEBUG and failure_detail have it):
        # an attempt that will be retried is no reason to page anyone.
        return Verdict(Fate.RETRY, wait, logging.WARNING, reason, attempts, recorded=True)
    not_retried = not decision.retryable and policy is not None
    return Verdict(Fate.SETTLE, None, logging.ERROR, reason, attempts, recorded=True, not_retried=not_retried)


def settle_request(core: RunnerCore, execution: Execution, decision: Decision) -> SettleRequest:
    """The statement that carries out the decision's :func:`verdict`: settle
    the job, or requeue it on the same row (a retry or a snooze), guarded by
    the exact claim; the attempt's log line is written here."""
    claim = execution.claim
    job = claim.job
    now = core.clock.now_ms()
    result_json = None
    if decision.result is not None:
        try:
            result_json = encode_result(decision.result, core.settings.codec)
        except InvalidJob as error:
            # Not kept: the job fails (never retried: the work is done, only
            # its result cannot be stored), and nothing of the value is written.
            decision = Decision.failed(bound_reason(f"the handler's {error}"), retry=False)
    judged = verdict(decision, job, core.settings.policy_for(job), execution.error)
    if judged.wait is not None:
        execution.requeue_in = judged.wait.total_seconds()
    _log_verdict(execution, judged, now)
    if judged.fate is Fate.SNOOZE:
        waiting = execution.error_requested
        waits_for = waiting.name if isinstance(waiting, WaitRequested) else None
        return SettleRequest(job.job_id, claim.token, decision, now, waits_for=waits_for)
    reporter = execution.job._progress
    progress = None if reporter is None or judged.fate is not Fate.SETTLE else reporter.pending
    if not judged.recorded:
        return SettleRequest(
            job.job_id, claim.token, decision, now, execution.failure_detail, result_json=result_json, progress=progress
        )
    history = history_with(job.failure_history, at_ms=now, attempt=job.attempt, reason=judged.reason)
    requeue_after_ms = duration_ms(judged.wait) if judged.fate is Fate.RETRY and judged.wait is not None else None
    return SettleRequest(
        job.job_id, claim.token, decision, now, execution.failure_detail,
        requeue_after_ms=requeue_after_ms, history=history, progress=progress,
    )  # fmt: skip


def _log_verdict(execution: Execution, judged: Verdict, now: int) -> None:
    """The attempt's one line: a retry's WARNING (when the next attempt is),
    or the final failure's ERROR (with its handler's traceback when it
    raised) -- but a WARNING when the handler decided that failure itself:
    it returned ``Decision.failed(...)`` (or a ``Decision.retry`` with no
    attempt left), so nothing raised, nothing was killed or stopped (no
    timeout), and its payload was read. A declined card is the handler's
    answer, not a fault to page anyone for; the reason is in the line. A
    run that finished an earlier run's compensation decided nothing: that
    run failed and its runner vanished mid-saga (an ERROR)."""
    if judged.level is None:
        return
    job = execution.job
    steps = job._steps()
    decided = (
        execution.error is None
        and execution.failure_detail is None  # a killed or dead child leaves its cause here
        and execution.refused is None
        and execution.signal.reason is None
        and not (steps is not None and steps.compensation_began)
    )
    if judged.fate is Fate.RETRY:
        assert judged.wait is not None
        log.log(
            judged.level,
            "job %s: attempt %d of %d failed (%s); next attempt at %s (in %.3fs)",
            job.job_id,
            job.attempt,
            judged.max_attempts,
            judged.reason,
            _log_time(now + duration_ms(judged.wait)),
            judged.wait.total_seconds(),
            extra=job.log_fields,
        )
        return
    error = execution.error
    log.log(
        min(judged.level, logging.WARNING) if decided else judged.level,
        "job %s: attempt %d%s failed (%s)%s; the job failed%s",
        job.job_id,
        job.attempt,
        "" if judged.max_attempts is None else f" of {judged.max_attempts}",
        judged.reason,
        "; not retried" if judged.not_retried else "",
        ", as its handler decided" if decided else "",
        exc_info=None if error is None else (type(error), error, error.__traceback__),
        extra=job.log_fields,
    )


def _log_time(epoch_ms: int) -> str:
    """An epoch-millisecond instant as a log line shows it (UTC, milliseconds)."""
    return f"{at_epoch_ms(epoch_ms):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def conclude(execution: Execution, settlement: Settlement | None) -> TickResult:
    """What a settle attempt means for the execution (logged, and told to its
    trace); ``settlement`` None when the database refused it (recovery then
    covers the job)."""
    execution.result = _result_of(settlement)
    result = _concluded(execution, settlement)
    execution.traced("concluded", result)
    return result


def _result_of(settlement: Settlement | None) -> str:
    """What a settle did, as the runner's summary counts it."""
    if settlement is None:
        return "rejected"
    if settlement.status is SettleStatus.REQUEUED:
        return "requeued"
    if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
        outcome = settlement.outcome
        return outcome.value if outcome is not None else "settled"
    return "rejected"


def finish(execution: Execution, settlement: Settlement | None) -> None:
    """:func:`conclude` a settle whose result nobody reads (a handed-off
    settle under ``run_forever``): a plain settle that is neither logged nor
    traced is left at that, so the settled job's view is never built."""
    if (
        execution.trace is None
        and settlement is not None
        and settlement.status is SettleStatus.SETTLED
        and not log.isEnabledFor(logging.DEBUG)
    ):
        execution.result = _result_of(settlement)
        return
    conclude(execution, settlement)


def finish_handed_off(core: RunnerCore, execution: Execution, settlement: Settlement | None) -> None:
    """A handed-off execution's settle is in (``settlement`` None: refused,
    or never sent because the settler stopped): :func:`finish` it and retire
    it from ``core``, whatever the finishing raised -- its slot never stays
    taken. The driver then wakes its loop (a slot is free)."""
    try:
        finish(execution, settlement)
    finally:
        core.retire(execution)


def _concluded(execution: Execution, settlement: Settlement | None) -> TickResult:
    job_id = execution.job_id
    if settlement is None:
        return TickResult(TickStatus.REJECTED, None, job_id)
    settled = settlement.job
    if settlement.status is SettleStatus.REQUEUED:
        assert settled is not None
        log.info(
            "job %s: back to %s (attempt %d, %d snooze(s))%s",
            job_id,
            settled.state.value,
            settled.attempt,
            settled.snoozes,
            f" until {settled.ready_at:%Y-%m-%d %H:%M:%S.%f}"[:-3] if settled.ready_at is not None else "",
            extra=execution.job.log_fields,
        )
        return TickResult(TickStatus.REQUEUED, settled, job_id)
    if settlement.status in (SettleStatus.SETTLED, SettleStatus.REPLAYED):
        if log.isEnabledFor(logging.DEBUG):  # the common case: no record built unless logged
            log.debug(
                "settled job %s: %s%s",
                job_id,
                _outcome(settled),
                f" ({settled.failure_reason})" if settled is not None and settled.failure_reason else "",
                extra=execution.job.log_fields,
            )
        return TickResult(TickStatus.SETTLED, settled, job_id)
    if settled is not None and settled.state is JobState.SETTLED:
        log.info("job %s was settled elsewhere (%s); this claim's decision is dropped", job_id, _outcome(settled))
        return TickResult(TickStatus.SETTLED, settled, job_id)
    log.warning("job %s: settlement rejected (%s): the claim was lost", job_id, settlement.status.value)
    return TickResult(TickStatus.REJECTED, settled, job_id)


#: The reason a job is settled ``failed`` with when the database refused to
#: store its own decision (short, to fit constraints the library did not make).
REFUSED_SETTLE_REASON = "settle refused by the database"


#: The first and the longest pause between tries of settles the database
#: could not take (each try is a store call with retries of its own first).
SETTLE_RETRY_FIRST_S = 0.25
SETTLE_RETRY_MAX_S = 2.0


def settle_batch(
    core: RunnerCore, requests: Sequence[SettleRequest], *, fallback: bool = True
) -> Steps[list[Settlement | None]]:
    """Settle ``requests`` in one statement; isolate a row the database refuses.

    Every row keeps its own guard (exact token, live lease); only the
    statement and the commit are shared. When the database refuses the
    batch for a reason that is not transient (a constraint the library did
    not create, say), each request is settled alone, so one poison row
    cannot take the others with it; a row refused alone is settled
    ``failed`` with :data:`REFUSED_SETTLE_REASON`, and if even that is
    refused it is left to its lease (logged; recovery then isolates it).

    A transient failure (the database unreachable, the store's own retries
    spent) loses nothing yet: the settles are kept and tried again, with
    back-off, for as long as their claims' leases may be alive
    (:attr:`Execution.lease_ends_by <sqlalchemy_watchdog.core.state.Execution.lease_ends_by>`,
    which each held renewal moves on) -- logged once per outage episode
    (:class:`~sqlalchemy_watchdog.core.outage.Outage`). Retrying can never
    settle a job twice: the statement refuses a settle whose lease ended
    by the database clock, or whose job was recovered meanwhile. Only a
    settle whose lease has surely ended is given up -- its decision is
    lost, logged ERROR once, and recovery handles the job -- and every one
    still waiting when the driver stops the settler (:class:`Pause`
    answered False).
    """
    results: list[Settlement | None] = [None] * len(requests)
    waiting = list(range(len(requests)))
    pause = SETTLE_RETRY_FIRST_S
    while True:
        batch = [requests[i] for i in waiting]
        try:
            settled = yield from call(core.store.settle_many, batch)
        except WatchdogError as error:
            if not core.store.transient_failure(error):
                refused = yield from _settle_refused(core, batch, error, fallback)
                for i, settlement in zip(waiting, refused, strict=True):
                    results[i] = settlement
                return results
            now = core.clock.monotonic()
            bounds = {i: core.lease_ends_by(requests[i].job_id, requests[i].claim_token) for i in waiting}
            lost = [i for i in waiting if bounds[i] <= now]
            if lost:
                log.error(
                    "settle of %d job(s) given up: the database stayed unreachable until their leases ended (%s);"
                    " their decisions are lost and recovery will handle them: %s",
                    len(lost),
                    error,
                    _some_ids(requests, lost),
                )
                waiting = [i for i in waiting if bounds[i] > now]
            if not waiting:
                return results
            core.outage.failed("settle", error, f"{len(waiting)} settle(s) waiting, retrying while their leases last")
            wait = min(pause, max(0.01, min(bounds[i] for i in waiting) - now))
            pause = min(SETTLE_RETRY_MAX_S, pause * 2)
            if not (yield Pause(wait)):
                log.error(
                    "settle of %d job(s) given up: the runner stopped while the database was unreachable;"
                    " their decisions are lost and recovery will handle them once their leases end: %s",
                    len(waiting),
                    _some_ids(requests, waiting),
                )
                return results
            continue
        for i, settlement in zip(waiting, settled, strict=True):
            results[i] = settlement
        return results


def _some_ids(requests: Sequence[SettleRequest], indexes: Sequence[int], most: int = 10) -> str:
    """The job_ids of ``requests[indexes]`` for a log line (the first ``most``)."""
    ids = [requests[i].job_id for i in indexes[:most]]
    return ", ".join(ids) + (f" and {len(indexes) - most} more" if len(indexes) > most else "")


def _settle_refused(
    core: RunnerCore, requests: Sequence[SettleRequest], error: WatchdogError, fallback: bool
) -> Steps[list[Settlement | None]]:
    """The database refused the batch ``requests`` (not transiently): settle
    each alone; one refused alone is settled ``failed`` instead (``fallback``),
    else left to its lease."""
    if len(requests) > 1:
        log.warning("a batch of %d settles was refused (%s); settling each alone", len(requests), error)
        results: list[Settlement | None] = []
        for request in requests:
            results.extend((yield from settle_batch(core, [request], fallback=fallback)))
        return results
    (request,) = requests
    if not fallback:
        log.error("job %s: the database refused its settlement (%s); left to its lease", request.job_id, error)
        return [None]
    log.error("job %s: the database refused its settlement (%s); settling it failed instead", request.job_id, error)
    failed = SettleRequest(request.job_id, request.claim_token, Decision.failed(REFUSED_SETTLE_REASON), request.now)
    return list((yield from settle_batch(core, [failed], fallback=False)))
