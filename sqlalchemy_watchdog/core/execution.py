"""One execution: a claim this runner is executing, as every rule sees it.

Its own module, below :mod:`.state` (the runner's core and its table of
executions), :mod:`.steps` (whose steps carry executions) and :mod:`.ahead`
(where executions claimed ahead wait), so none of those imports another
in a circle.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import telemetry
from ..jobs import Decision
from ..records import Claim
from .handlers import Flag, RunningJob, StopSignal


@dataclass(eq=False)
class Execution:
    """A claim this runner is executing, with its handler's view and stop signal."""

    claim: Claim
    job: RunningJob
    signal: StopSignal
    done: Flag = field(default_factory=Flag)
    #: The driver's handle on the running handler (the async driver's task).
    task: Any = None
    #: When the claim was asked for, on this process's monotonic clock: no
    #: later than the database took it, so a pause anywhere after that point
    #: (even before the claim's answer was read) counts against the start.
    claimed_at: float = field(default_factory=time.monotonic)
    #: When :func:`execute` last knew the claim live before the handler
    #: starts (the moment it sent a renewal that held), monotonic; 0: only
    #: the claim itself.
    checked_at: float = 0.0
    #: The decision made without running the handler (its payload could
    #: not be decoded), if any.
    refused: Decision | None = None
    #: The traceback of its handler's exception, kept with the job (bound
    #: parameters and driver details of database errors left out).
    failure_detail: str | None = None
    #: The exception its handler raised, if any (a retry policy's
    #: ``retry_on`` is matched against it).
    error: BaseException | None = None
    #: The sleep or wait its handler asked for (``job.sleep``, ``job.wait_for``:
    #: a :class:`~sqlalchemy_watchdog.core.durable.SleepRequested`), if any.
    error_requested: BaseException | None = None
    #: What became of it, for the runner's summary: an outcome's value,
    #: ``requeued`` or ``rejected`` (set when it is concluded).
    result: str | None = None
    #: Whether it still occupies one of the runner's ``concurrency`` slots:
    #: from the claim until its handler returns. Its settle then overlaps
    #: with the next claim; the heartbeat keeps renewing it until settled.
    slot_held: bool = True
    #: When its handler must have returned (monotonic), if it has a timeout;
    #: set when the handler starts. The driver stops it then.
    deadline: float | None = None
    #: When its handler began in a child process (monotonic; set with the
    #: deadline, :meth:`~.state.RunnerCore.start_deadline`): its run time,
    #: noted for the executor's prefetch rule, counts from here -- not from
    #: the wait for a free child.
    began_at: float | None = None
    #: In how many seconds a retry or snooze asked for makes the job due
    #: again; the runner promotes then, once the requeue has committed.
    requeue_in: float | None = None
    #: Whether its handler runs in a thread the driver cannot interrupt (a
    #: plain handler under the async driver): a stop only signals it, and
    #: its slot and claim stay held until the thread returns.
    threaded: bool = False
    #: How many cancels a stop asked of the execution's own task while its
    #: coroutine handler ran there (the async driver's; see
    #: ``AsyncRunner._await_inline``), taken back once the handler ended.
    cancels: int = 0
    #: Whether its handler runs where the driver can kill it (a child of
    #: the process executor): a timed-out attempt then keeps its claim
    #: renewed until its child is confirmed dead and the job settled.
    killable: bool = False
    #: Whether it is given back without running: claimed ahead, it waited
    #: for a slot too long, or its runner is stopping (:mod:`.ahead`).
    given_back: bool = False
    #: Whether its claim marked it ``unstarted`` (claimed ahead of the free
    #: slots; revision w0019) and no start was recorded yet: its handler is
    #: called only once the runner recorded the start (:class:`~.steps.RecordStart`).
    unstarted: bool = False
    #: Whether its claim marked it ``unstarted`` (it stays True once the
    #: start is recorded): a child process's job of such a claim is never
    #: sent behind a busy child's running job, where it would start with
    #: nobody to record it (``ProcessPool.call(pipe=False)``).
    claimed_ahead: bool = False
    #: A child process's job claimed ahead: a child is free for it, so its
    #: start is recorded now, then it asks the pool again (the start of such
    #: a job is recorded as a child takes it, not when its claim arrives).
    child_ready: bool = False
    #: The instrumentation's view of this attempt (:mod:`.telemetry`), if any.
    trace: telemetry.AttemptTrace | None = None
    #: The monotonic clock of its runner's core (:class:`~.clock.Clock`).
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False)
    #: When its claim's lease has surely ended, on the monotonic clock: the
    #: database set ``lease_until`` (its clock) to the claim's or the last
    #: held renewal's execution time plus the lease, and that time was no
    #: later than the moment the answer came back here -- so the answer's
    #: time plus the lease (and :data:`LEASE_END_MARGIN_S`) is a bound the
    #: lease never outlives. A settle the database cannot take is retried
    #: until then (:func:`~.rules.settle.settle_batch`); infinite until
    #: :meth:`RunnerCore.admit` sets it.
    lease_ends_by: float = math.inf
    #: Whether its handler's undos run (or ran) before it settles: the
    #: heartbeat renews its claim again after a timeout (which stopped its
    #: renewals) until it is retired.
    compensating: bool = False

    def traced(self, what: str, *args: Any) -> None:
        """Tell the attempt's trace ``what`` happened (a no-op without one;
        an instrumentation failure is logged, never raised)."""
        trace = self.trace
        if trace is not None:
            with telemetry.guarded(what):
                getattr(trace, what)(*args)

    @property
    def rank(self) -> tuple[int, int]:
        """Its place in its claim's order: priority first, then admission."""
        return (-self.job.priority, self.claim.job.sequence)

    def started_late(self, heartbeat_s: float) -> bool:
        """Whether more than a heartbeat interval passed since the claim was
        last known live: its handler must not start before a renewal says
        the claim still holds (the process may have been frozen or starved
        past the lease in between)."""
        return self.monotonic() - max(self.claimed_at, self.checked_at) > heartbeat_s

    def child_may_take(self, heartbeat_s: float) -> bool:
        """The pool asks whether a free child may take this job now: not
        before its start is recorded (claimed ahead: :attr:`child_ready` is
        set, and the driver's answer makes ``execute`` record it and ask
        again), nor when it :meth:`started_late` (renewed first)."""
        if self.unstarted:
            self.child_ready = True
            return False
        return not self.started_late(heartbeat_s)

    def handler_context(self) -> contextvars.Context | None:
        """The context the handler runs in: its trace's (None without a
        trace, or when the instrumentation fails to give one -- logged, and
        the handler runs as it would untraced)."""
        trace = self.trace
        if trace is not None:
            with telemetry.guarded("context"):
                return trace.context()
        return None

    @property
    def job_id(self) -> str:
        return self.claim.job.job_id

    @property
    def pair(self) -> tuple[str, str]:
        return (self.claim.job.job_id, self.claim.token)
