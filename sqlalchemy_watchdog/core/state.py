"""The state of one runner: its executions, timing and bookkeeping."""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from ..errors import WatchdogError, redacted
from ..jobs import (
    Decision,
    JobView,
    Undecodable,
    bound_reason,
    frozen_builder,
)
from ..records import Claim, WorkerRegistration
from ..records import TickResult as TickResult
from ..records import TickStatus as TickStatus
from .ahead import RunTimes
from .clock import Clock
from .durable import DurableSteps, StepPort
from .execution import Execution as Execution
from .handlers import RunningJob, StopReason, StopSignal
from .outage import Outage
from .ports import Store, Waiting
from .progress import AsyncWrite, ProgressReporter, SyncWrite
from .settings import RunnerSettings
from .steps import Steps, Stop

log = logging.getLogger("sqlalchemy_watchdog.runner")

#: The RunningJob of each claimed job, made without its frozen __init__'s
#: object.__setattr__ per field (jobs.frozen_builder): 2.1 us a job otherwise.
#: Its fields named in the order admit() passes them (checked at import).
_build_running_job = frozen_builder(RunningJob, (
    "job_id", "queue", "lane", "priority", "payload", "recovery_count", "max_recoveries", "_signal", "attempt",
    "max_attempts", "snoozes", "timeout", "trace_context", "key", "_progress",
))  # fmt: skip


#: What the bound of a lease (:attr:`Execution.lease_ends_by`) adds to the
#: lease for the database's and this process's clocks running at slightly
#: different rates; a settle tried in this margin is refused by the database
#: if the lease did end (its statement checks the lease on its own clock).
LEASE_END_MARGIN_S = 1.0

#: The first pause before a renewal that failed transiently is tried again
#: (doubling up to the heartbeat interval; see :func:`~.loop.renew`).
RENEW_RETRY_FIRST_S = 0.5


def _reason(execution: Execution) -> str:
    reason = execution.signal.reason
    return reason.value if reason is not None else "stop requested"


def _outcome(job: JobView | None) -> str:
    return job.outcome.value if job is not None and job.outcome is not None else "?"


class RunnerCore:
    """The state of one runner and every rule it follows.

    Shared by the driver's loop, its heartbeat, its handler threads or
    tasks and its settler; the table of active executions is guarded by a
    lock (uncontended under asyncio).
    """

    #: The longest back-off after failed loop passes, in seconds.
    MAX_BACKOFF_S = 30.0
    #: How long a claim the database refuses to recover is left alone, at most.
    MAX_ISOLATION_S = 600.0

    def __init__(self, settings: RunnerSettings, clock: Clock, store: Store) -> None:
        self.settings = settings
        #: The store the rules' steps name (:class:`~.ports.Store`): the
        #: driver fills it with :mod:`sqlalchemy_watchdog.store`.
        self.store = store
        #: The runner's one clock: every rule reads the time from it.
        self.clock = clock
        #: By claim, (job_id, token): a slot belongs to an execution, not to
        #: a job. A handler that overstays its lease keeps its slot until it
        #: returns, even after its job was recovered and claimed again here.
        self._active: dict[tuple[str, str], Execution] = {}
        self._lock = threading.Lock()
        self.recovery_due = 0.0
        #: How a handler's ``job.progress`` is written: set by the driver
        #: (a thread's call, or a coroutine on the runner's loop).
        self.progress_write: SyncWrite | None = None
        self.progress_write_async: AsyncWrite | None = None
        #: How a handler's ``job.parent_results()`` reads (set by the driver too).
        self.parents_read: Callable[[str], Any] | None = None
        self.parents_read_async: Callable[[str], Coroutine[Any, Any, Any]] | None = None
        #: How its executions' durable steps reach the database (the driver sets it).
        self.step_port: StepPort | None = None
        #: When to tell the dependents of jobs settled while waiting next (monotonic).
        self.propagation_due = 0.0
        #: When to make due delayed jobs ready next (monotonic).
        self.promotion_due = 0.0
        #: The earliest time (monotonic) a requeue of this runner is due
        #: (expect_ready), kept until a promotion starts at or after it. A
        #: promotion that read the table before that requeue committed must
        #: not schedule the next one later than it (schedule_promotion).
        self._expected_ready = math.inf
        #: When to prune settled jobs next (monotonic).
        self.retention_due = 0.0
        #: When to enqueue the schedules' next slots (monotonic).
        self.schedules_due = 0.0
        self.failures = 0
        #: Maintenance steps of the current loop pass that failed, with
        #: their errors: logged with the pass's own failure as one line, or
        #: each on its own when the claim went through.
        self.deferred: list[tuple[str, WatchdogError]] = []
        #: Claims whose recovery the database refused: (job_id, token) ->
        #: (monotonic time until which they are skipped, refusals so far).
        self._isolated: dict[tuple[str, str], tuple[float, int]] = {}
        #: The last claim came back short because a limit held it back: until
        #: a claim is not, a slot whose handler returned stays taken until its
        #: settle commits (before that, the job still counts against the limit
        #: and a claim for the slot could only come back empty). By slot
        #: group (:attr:`RunnerSettings.slot_groups`), each claimed apart.
        self._held_back: dict[int, bool] = {}
        self._group_index: tuple[tuple[Any, ...], dict[str, int]] | None = None
        #: Where NOTIFY wakes the runner: its side of the waiting lock, told
        #: after each claim whether the runner now waits for work.
        self.waiting: Waiting | None = None
        #: This runner's id among the workers (``watchdog_workers``) and the
        #: schedules' records; new for every runner object.
        self.worker_id = uuid.uuid4().hex
        #: Its row as registered while it serves (None: not registered).
        self.registration: WorkerRegistration | None = None
        #: Its row when registering at start failed: each heartbeat tries again.
        self.unregistered: WorkerRegistration | None = None
        #: When to prune long-gone workers next (monotonic).
        self.worker_prune_due = 0.0
        #: Whether recording the schedules failed last time (logged once).
        self.schedule_record_failed = False
        #: The recent handlers' run time: how many jobs to claim ahead.
        self.run_times = RunTimes()
        #: The run times of each process executor's handlers (by slot group),
        #: for its prefetch (:meth:`claim_ahead`); the claims' and start
        #: records' round trip is :attr:`run_times`'.
        self._child_run_times: dict[int, RunTimes] = {}
        #: Whether the database answers: transient failures are logged once
        #: per outage episode, not once per operation.
        self.outage = Outage(self.clock.monotonic, settings.lease_ms / 1000)
        #: The heartbeat's last pause after a renewal that failed (0: none failed).
        self._renew_pause = 0.0

        #: What the jobs that ended since the last summary became, counted.
        self._counts: dict[str, int] = {}
        self._counted = 0
        self._summary_since = self.clock.monotonic()

    # -- the INFO summary

    def count(self, result: str, n: int = 1) -> None:
        """One job (or ``n``) ended as ``result`` (an outcome's value,
        ``requeued``, ``rejected``): counted for the next summary."""
        if n <= 0:
            return
        with self._lock:
            self._counts[result] = self._counts.get(result, 0) + n
            self._counted += n

    def summary_is_due(self) -> bool:
        """Whether the summary is due: its interval passed (with something
        counted or running since the last one -- an idle runner stays
        quiet), or its count of jobs was reached."""
        every = self.settings.summary_every
        if every is None:
            return False
        if isinstance(every, int):
            return self._counted >= every
        if self.clock.monotonic() - self._summary_since < every:
            return False
        if self._counted == 0 and not self._active:
            self._summary_since = self.clock.monotonic()
            return False
        return True

    def take_summary(self) -> tuple[float, dict[str, int], int]:
        """The seconds since the last summary, the counts since then and how
        many jobs run now; starts the next period."""
        now = self.clock.monotonic()
        with self._lock:
            counts, self._counts, self._counted = self._counts, {}, 0
            running = len(self._active)
        seconds, self._summary_since = now - self._summary_since, now
        return seconds, counts, running

    # -- the table of executions

    def active(self) -> list[Execution]:
        """The executions this runner holds a claim for."""
        with self._lock:
            return list(self._active.values())

    def own(self, job_id: str, token: str) -> Execution | None:
        with self._lock:
            return self._active.get((job_id, token))

    #: The fewest settles that may wait for the database before the runner
    #: stops claiming (see :meth:`free_slots`); the bound is the larger of
    #: this and twice the concurrency.
    SETTLE_BACKLOG_MIN = 256

    @property
    def settle_backlog_max(self) -> int:
        """How many finished executions may wait for their settle before the
        runner stops claiming: a database that is slow to settle then holds
        up new claims instead of growing the runner's memory."""
        return max(self.SETTLE_BACKLOG_MIN, 2 * self.settings.concurrency)

    @property
    def held_back(self) -> bool:
        """Whether the last claim of any slot group came back short because
        a limit held it back (setting it sets it for every group)."""
        return any(self._held_back.values())

    @held_back.setter
    def held_back(self, value: bool) -> None:
        self._held_back = dict.fromkeys(range(len(self.settings.slot_groups)), value)

    def hold_back(self, group: int, value: bool) -> None:
        """The last claim of slot group ``group`` was (not) held back by a limit."""
        self._held_back[group] = value

    def settle_gather(self) -> tuple[int, float]:
        """How many finished jobs the settler waits for, and for how long at
        most, before it sends a batch (:attr:`RunnerSettings.settle_gather`);
        ``(1, 0.0)`` -- settle at once -- while the last claim was held back
        by the queues' limits, where a slot stays taken until its settle
        commits and waiting would keep the next claim waiting too -- or
        while no executor claims ahead of its children (their handlers are
        too short: :meth:`claim_ahead`), where an idle child waits for it."""
        if self.held_back:
            return 1, 0.0
        want, gather_s = self.settings.settle_gather
        groups = self.settings.slot_groups
        if gather_s > 0 and not any(self.claim_ahead(i) > 0 for i, g in enumerate(groups) if g.prefetch > 0):
            return 1, 0.0  # its children's handlers are too short to claim ahead of them: nobody waits
        return want, gather_s

    def group_of(self, queue: str) -> int:
        """The index of the slot group serving ``queue`` (0 for a queue it
        does not serve: a custom loop's claim over every queue)."""
        groups = self.settings.groups
        if not groups:
            return 0
        index = self._group_index
        if index is None or index[0] is not groups:
            index = self._group_index = (groups, {q: i for i, g in enumerate(groups) for q in g.queues})
        return index[1].get(queue, 0)

    def free_slots(self) -> int:
        """How many jobs to claim now, over every slot group
        (:meth:`free_by_group`)."""
        return sum(free for _, free in self._free())

    def free_by_group(self) -> list[tuple[int, int]]:
        """:meth:`free_slots` for each slot group: (index, count)."""
        if not self.settings.groups:
            return [(0, self.free_slots())]
        return self._free()

    def _free(self) -> list[tuple[int, int]]:
        """How many jobs to claim now for each slot group (index, count):
        the group's free slots, with the jobs it may claim ahead
        (:meth:`claim_ahead`); none while the settle backlog is full. Each
        group is counted apart -- a queue's claims never take more jobs than
        its executor can run, whatever the other executors' slots.

        Claims ahead go in batches: while a job claimed ahead still waits
        for a slot (a child, or a thread or task), every slot is busy and
        has its next job, so no claim is made until the slots have taken the
        jobs waiting for them or ``claim_ahead`` slots are free -- one claim
        statement for several jobs rather than one for each slot that frees,
        which leaves the CPU of the cores the handlers share with the runner
        and the database to the handlers."""
        groups = self.settings.slot_groups
        running = [0] * len(groups)
        for_children = [0] * len(groups)
        settling = [0] * len(groups)
        many = len(groups) > 1
        with self._lock:
            for e in self._active.values():
                i = self.group_of(e.job.queue) if many else 0
                if e.slot_held:
                    running[i] += 1
                    for_children[i] += e.killable
                else:
                    settling[i] += 1
        if sum(settling) >= self.settle_backlog_max:
            return [(i, 0) for i in range(len(groups))]
        found = []
        for i, group in enumerate(groups):
            concurrency, ahead = group.concurrency, self.claim_ahead(i)
            capacity = concurrency + ahead
            if self._held_back.get(i, False):
                found.append((i, capacity - running[i] - settling[i]))
                continue
            free = capacity - running[i]
            if (for_children[i] if group.prefetch > 0 else running[i]) > concurrency and free < ahead:
                free = 0
            found.append((i, free))
        return found

    def child_run_times(self, group: int) -> RunTimes:
        """The run times of slot group ``group``'s handlers in child processes."""
        times = self._child_run_times.get(group)
        if times is None:
            times = self._child_run_times[group] = RunTimes()
        return times

    def note_child_run_time(self, execution: Execution) -> None:
        """The handler of ``execution`` (a child process's) returned: its
        run time since it began counts for its executor's prefetch."""
        began = execution.began_at
        if began is not None:
            group = self.group_of(execution.job.queue) if len(self.settings.slot_groups) > 1 else 0
            self.child_run_times(group).note(self.clock.monotonic() - began)

    def claim_ahead(self, group: int = 0) -> int:
        """How many jobs slot group ``group`` claims beyond its concurrency:
        the process executor's ``prefetch`` while its handlers run several
        round trips (:meth:`~.ahead.RunTimes.prefetch`); for threads and tasks as many
        as the recent handlers' run time allows (:mod:`.ahead`), none while
        a limit holds claims back (a job claimed ahead would hold its room
        unused)."""
        slots = self.settings.slot_groups[group]
        if slots.prefetch > 0:
            return self.child_run_times(group).prefetch(slots.prefetch, self.run_times.round_trip)
        if self._held_back.get(group, False) or slots.ahead_cap <= 0:
            return 0
        return self.run_times.ahead(slots.concurrency, slots.ahead_cap)

    def admit(self, claim: Claim, asked_at: float) -> Execution:
        """Register the execution of ``claim``, asked for at ``asked_at``
        (the core clock's ``monotonic()`` read before the claim statement
        was sent).

        Registered before its handler starts, so a cancellation or lane
        failure recorded after the claim reaches it through the heartbeat."""
        signal = StopSignal()
        job = claim.job
        payload, refused = self._decoded(job)
        running = _build_running_job(
            job.job_id,
            job.queue,
            job.lane,
            job.priority,
            payload,
            job.recovery_count,
            job.max_recoveries,
            signal,
            job.attempt,
            max(job.attempt, policy.max_attempts if (policy := self.settings.policy_for(job)) else 1),
            job.snoozes,
            self.settings.timeout_for(job),
            job.trace_context,
            job.key,
            ProgressReporter(
                job.job_id,
                claim.token,
                self.progress_write,
                self.progress_write_async,
                monotonic=self.clock.monotonic,
                read=self.parents_read,
                read_async=self.parents_read_async,
                steps=None
                if self.step_port is None
                else DurableSteps(job.job_id, claim.token, job.attempt, self.step_port),
            ),
        )
        execution = Execution(
            claim,
            running,
            signal,
            claimed_at=asked_at,
            refused=refused,
            monotonic=self.clock.monotonic,
            killable=job.queue in self.settings.handler_refs,
            lease_ends_by=self.lease_bound(),
        )
        with self._lock:
            self._active[execution.pair] = execution
        if log.isEnabledFor(logging.DEBUG):  # its fields are built per job: only when logged
            log.debug(
                "claimed job %s (queue %s, attempt %d, recovery %d)",
                job.job_id,
                job.queue,
                job.attempt,
                job.recovery_count,
                extra=running.log_fields,
            )
        return execution

    def lease_bound(self) -> float:
        """When a lease the database granted or renewed before now has surely
        ended (monotonic): now plus the lease plus :data:`LEASE_END_MARGIN_S`.
        Called once the claim's or renewal's answer is in."""
        return self.clock.monotonic() + self.settings.lease_ms / 1000 + LEASE_END_MARGIN_S

    def renewed(self, execution: Execution, bound: float) -> None:
        """A renewal of ``execution``'s claim held; ``bound`` is
        :meth:`lease_bound` read once its answer was in."""
        if bound > execution.lease_ends_by:
            execution.lease_ends_by = bound

    def lease_ends_by(self, job_id: str, token: str) -> float:
        """When the claim ``(job_id, token)`` has surely ended (monotonic):
        its execution's bound, or now for a claim this runner does not hold."""
        execution = self.own(job_id, token)
        return execution.lease_ends_by if execution is not None else self.clock.monotonic()

    def renewal_went_through(self) -> float:
        """The heartbeat's renewal went through (or had nothing to renew):
        the next one is a heartbeat interval away."""
        self._renew_pause = 0.0
        return self.settings.heartbeat_s

    def renewal_failed(self) -> float:
        """The heartbeat's renewal failed transiently: how long until it is
        tried again (from :data:`RENEW_RETRY_FIRST_S`, doubling up to
        the heartbeat interval)."""
        pause = min(self.settings.heartbeat_s, max(RENEW_RETRY_FIRST_S, self._renew_pause * 2))
        self._renew_pause = pause
        return pause

    def _decoded(self, job: JobView) -> tuple[Any, Decision | None]:
        """The payload the handler sees (through the runner's codec), or the
        ``failed`` decision of a payload the codec cannot decode."""
        if isinstance(job.payload, Undecodable):  # a row written by hand: never handed to a handler
            log.error("job %s: its stored payload could not be decoded (%s)", job.job_id, job.payload.reason)
            return None, Decision.failed(
                bound_reason(f"payload could not be decoded: {job.payload.reason}"), retry=False
            )
        codec = self.settings.codec
        if codec is None:
            return job.payload, None
        try:
            return codec.decode(job.payload), None
        except Exception as error:
            log.error("job %s: its payload could not be decoded (%s)", job.job_id, redacted(error))
            # Not retried: another attempt would decode the same payload.
            return None, Decision.failed(bound_reason(f"payload could not be decoded: {redacted(error)}"), retry=False)

    def release_slot(self, execution: Execution) -> bool:
        """The handler returned: free its slot (its settle may still be under
        way). Whether a slot was freed, so the driver wakes its loop."""
        if execution.slot_held:
            execution.slot_held = False
            return True
        return False

    def retire(self, execution: Execution) -> None:
        """The execution is over (its settle, if any, committed): forget it
        and free its slot. A retry or snooze it asked for is due in
        ``requeue_in``: promote no later than that (the requeue has
        committed by now, so a promotion then finds it)."""
        with self._lock:
            if self._active.get(execution.pair) is execution:
                del self._active[execution.pair]
        execution.slot_held = False
        if execution.result is not None:
            self.count(execution.result)
        if execution.requeue_in is not None:
            self.expect_ready(execution.requeue_in)
        execution.traced("end")
        execution.trace = None
        execution.done.set()

    # -- the loop's timing

    def recovery_is_due(self) -> bool:
        return self.clock.monotonic() >= self.recovery_due

    def schedule_recovery(self, until_expiry: float | None) -> None:
        """Look for disappeared claims again when the next lease ends, and
        at least every poll interval."""
        poll = self.settings.poll_interval_s
        self.recovery_due = self.clock.monotonic() + min(poll, poll if until_expiry is None else until_expiry)

    #: The pause between prune batches while there is more to prune.
    PRUNE_PAUSE_S = 0.2

    def retention_is_due(self) -> bool:
        return self.clock.monotonic() >= self.retention_due

    def until_retention(self) -> float:
        """Seconds until the next prune pass is due (0: now)."""
        return max(0.0, self.retention_due - self.clock.monotonic())

    def schedule_retention(self, seconds: float) -> None:
        self.retention_due = self.clock.monotonic() + seconds

    def promotion_is_due(self) -> bool:
        return self.clock.monotonic() >= self.promotion_due

    #: How often a busy runner that NOTIFY wakes looks for due delayed jobs:
    #: enqueues notify only while a runner waits (see ``wakeups``), so a busy
    #: one is not told of a delayed job enqueued meanwhile.
    BUSY_PROMOTION_S = 0.25

    def schedule_promotion(self, next_in: float | None) -> None:
        """Look for due delayed jobs again when the next one is due, and at
        least every poll interval (other processes enqueue delayed jobs too)
        -- every :attr:`BUSY_PROMOTION_S` while busy where NOTIFY wakes it."""
        poll = self.settings.poll_interval_s
        if self.waiting is not None and not self.waiting.waits():
            poll = min(poll, self.BUSY_PROMOTION_S)
        due = self.clock.monotonic() + min(poll, poll if next_in is None else next_in)
        with self._lock:  # against expect_ready on a settling thread
            self.promotion_due = min(due, self._expected_ready)

    def promotion_starting(self) -> None:
        """A promotion reads the delayed jobs now: a requeue expected by now
        committed before (expect_ready runs after its settle), so the read
        sees it, and its expectation is done with."""
        with self._lock:
            if self.clock.monotonic() >= self._expected_ready:
                self._expected_ready = math.inf

    #: The longest wait before the schedules are looked at again (a clock
    #: that jumps is noticed within it).
    MAX_SCHEDULE_WAIT_S = 60.0

    def schedules_are_due(self) -> bool:
        return self.clock.monotonic() >= self.schedules_due

    def schedule_schedules(self, until_next: float | None) -> None:
        """Enqueue the schedules' slots again when the next one is due (at
        most a minute from now; a failure looks again after a poll interval)."""
        wait = self.settings.poll_interval_s if until_next is None else min(until_next, self.MAX_SCHEDULE_WAIT_S)
        self.schedules_due = self.clock.monotonic() + wait

    def expect_ready(self, seconds: float) -> None:
        """A job will be due in ``seconds`` (a retry or a snooze of this
        runner, or a new delayed job): promote no later than that -- also when
        a promotion under way read the table before this job's requeue
        committed and would schedule the next one later."""
        due = self.clock.monotonic() + max(0.0, seconds)
        with self._lock:
            self._expected_ready = min(self._expected_ready, due)
            self.promotion_due = min(self.promotion_due, due)

    def jobs_arrived(self) -> None:
        """New jobs were enqueued (a wake-up): one may be delayed only briefly."""
        self.promotion_due = 0.0

    def idle_wait(self) -> float:
        """How long an idle loop waits for a wake-up before looking again."""
        now = self.clock.monotonic()
        wait = min(self.settings.poll_interval_s, self.recovery_due - now, self.promotion_due - now)
        if self.settings.schedules:
            wait = min(wait, self.schedules_due - now)
        return max(0.0, wait)

    def start_deadline(self, execution: Execution) -> float | None:
        """The handler of a killable execution starts now (its child process
        is ready): its timeout counts from now. The deadline, if any."""
        now = execution.began_at = self.clock.monotonic()
        timeout = execution.job.timeout
        if timeout is not None:
            execution.deadline = now + timeout.total_seconds()
        return execution.deadline

    def next_deadline(self) -> float | None:
        """The earliest deadline (monotonic) of a running handler not yet stopped."""
        deadlines = [
            e.deadline for e in self.active() if e.deadline is not None and e.slot_held and not e.signal.is_set()
        ]
        return min(deadlines, default=None)

    def overdue(self) -> list[Execution]:
        """Executions whose handler outlived its timeout and was not stopped yet."""
        now = self.clock.monotonic()
        return [
            e
            for e in self.active()
            if e.deadline is not None and e.deadline <= now and e.slot_held and not e.signal.is_set()
        ]

    def pass_succeeded(self) -> None:
        self.failures = 0

    def pass_failed(self, error: BaseException, who: str = "runner") -> float:
        """Log a failed loop pass -- one line, naming the maintenance steps
        that failed before it in the same pass -- and return how long to
        back off before the next one. A transient failure (the database
        unreachable) is part of an outage episode: logged once for the
        episode (:class:`~.outage.Outage`), not once per pass."""
        self.failures += 1
        delay = min(self.MAX_BACKOFF_S, 0.25 * 2.0 ** min(self.failures, 7))
        deferred, self.deferred = self.deferred, []
        also = f" ({' and '.join(what for what, _ in deferred)} failed too)" if deferred else ""
        if isinstance(error, WatchdogError) and self.store.transient_failure(error):
            self.outage.failed(f"{who}'s loop (claiming){also}", error, f"next pass in {delay:.1f}s")
        elif isinstance(error, WatchdogError):
            log.error("%s: %s%s; retrying in %.1fs", who, error, also, delay)
        else:
            log.error(
                "%s: unexpected error (%s)%s; retrying in %.1fs", who, redacted(error), also, delay, exc_info=error
            )
        return delay

    def defer_failure(self, what: str, error: WatchdogError) -> None:
        """A maintenance step (recovery, promotion, scheduling) of this pass
        failed; the pass goes on to claim (see :meth:`report_deferred`). A
        transient failure is told to the outage episode at once instead."""
        if self.store.transient_failure(error):
            self.outage.failed(what, error)
        else:
            self.deferred.append((what, error))

    def report_deferred(self) -> None:
        """The pass went through: log each maintenance step that failed in it."""
        deferred, self.deferred = self.deferred, []
        for what, error in deferred:
            log.error("runner: %s failed (%s); claiming goes on", what, error)

    # -- isolating claims the database refuses to recover

    def isolated(self, claim: Claim) -> bool:
        entry = self._isolated.get((claim.job.job_id, claim.token))
        return entry is not None and entry[0] > self.clock.monotonic()

    def isolate(self, claim: Claim, error: WatchdogError) -> None:
        key = (claim.job.job_id, claim.token)
        _, refusals = self._isolated.get(key, (0.0, 0))
        refusals += 1
        pause = min(self.MAX_ISOLATION_S, 5.0 * 2 ** min(refusals - 1, 10))
        self._isolated[key] = (self.clock.monotonic() + pause, refusals)
        log.error(
            "job %s: the database refused its recovery (%s); skipping it for %.0fs (refusal %d)",
            claim.job.job_id,
            error,
            pause,
            refusals,
        )

    def forget_isolated(self, claims: Iterable[Claim]) -> None:
        """Drop isolation entries of claims that are no longer expired."""
        live = {(c.job.job_id, c.token) for c in claims}
        for key in [k for k in self._isolated if k not in live]:
            del self._isolated[key]

    @property
    def isolated_jobs(self) -> tuple[str, ...]:
        """The job_ids whose recovery the database refused and that are skipped for now."""
        now = self.clock.monotonic()
        return tuple(sorted({job_id for (job_id, _), (until, _) in self._isolated.items() if until > now}))


def stop(execution: Execution, reason: StopReason) -> Steps[None]:
    """Tell ``execution``'s handler to stop, and log why."""
    if execution.signal.reason is None:
        level = logging.INFO if reason in (StopReason.CANCELLED, StopReason.LANE_FAILED) else logging.WARNING
        if reason is StopReason.TIMEOUT:
            level = logging.WARNING
        fields = execution.job.log_fields
        log.log(level, "job %s: stopping its handler (%s)", execution.job_id, reason.value, extra=fields)
        execution.traced("stop_requested", reason)
    yield Stop(execution, reason)
