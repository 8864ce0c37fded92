"""What applies to a job, said plainly: its effective timeout, retry
policy and recovery budget and where each comes from, "attempt n of m", its
queue's pause, and its outcome's reason in plain words.

A job's policy is the first of: the job's own (stored with it), its queue's
``@handler(queue, retry=, timeout=, max_recoveries=)``, the runner's
``Runner(retry=, timeout=, max_recoveries=)``. Only the job's own is in the
database. A process that reads
the queue -- the CLI, the dashboard, your application -- knows the
``@handler`` registrations it has imported itself, and never a runner's
settings, which live in the runner's process: what it cannot know, it says
it does not know (:attr:`Applied.known` is False), never a guess.

Stored reasons stay as they are (tests, alerts and your own queries match
them); :func:`plain_reason` translates the library's own at display.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from . import store
from .core.handlers import _UNSET, _registry
from .core.rules.settle import REFUSED_SETTLE_REASON
from .jobs import JobView, QueuePause, RetryPolicy
from .jobs.durable import JobSignal, JobStep
from .jobs.uniqueness import UniqueKeyHold

__all__ = ["PolicyLevel", "Applied", "JobExplanation", "explain", "plain_reason"]

T = TypeVar("T")


class PolicyLevel(str, enum.Enum):
    """Where an effective setting comes from."""

    #: The job's own (``Job(retry=..., timeout=...)``), stored with it.
    JOB = "job"
    #: Its queue's ``@handler(queue, retry=..., timeout=...)``, registered in this process.
    HANDLER = "handler"
    #: Not the job's own and not a ``@handler`` of this process: its handler's
    #: where the runner runs, else the runner's (``Runner(retry=..., timeout=...)``).
    #: Not stored, not known to a reader.
    RUNNER = "runner"


@dataclass(frozen=True, slots=True)
class Applied(Generic[T]):
    """One effective setting: its value (None: none applies) and its level.

    ``known`` is False for the runner's level: the value lives in the
    runner's process and ``value`` is then None -- not "none applies".
    """

    value: T | None
    level: PolicyLevel
    known: bool = True


@dataclass(frozen=True, slots=True)
class JobExplanation:
    """What applies to one job (:meth:`Watchdog.explain`)."""

    job: JobView
    timeout: Applied[timedelta]
    retry: Applied[RetryPolicy]
    #: The attempts it may have in all, when known (the runner's: None).
    max_attempts: int | None
    #: Its queue's pause, if the queue is paused.
    pause: QueuePause | None
    #: Its ``failure_reason`` in plain words (the stored text itself when it is a handler's own).
    reason: str | None
    #: Its recovery budget (``max_recoveries``): how many times a vanished execution is requeued.
    recovery: Applied[int] = Applied(None, PolicyLevel.RUNNER, known=False)
    #: The ``unique_key`` s it holds (``unique_for``, ``debounce``, ``throttle``),
    #: with the enqueues each absorbed: why a later enqueue was a duplicate or a replacement.
    unique_keys: tuple[UniqueKeyHold, ...] = ()
    #: Its durable steps (``job.step``, ``job.sleep``), in the order they were recorded.
    steps: tuple[JobStep, ...] = ()
    #: The signals kept for it (``Watchdog.signal``), oldest first.
    signals: tuple[JobSignal, ...] = ()

    def wait_text(self, step: JobStep) -> str:
        """How a wait (a step of kind ``wait``) stands: ``signalled at
        <time>``, ``timed out at <time>`` or ``waiting until <time>`` (UTC)."""
        assert step.wake_at is not None
        signal = next((kept for kept in self.signals if kept.name == step.name), None)
        if signal is not None and signal.sent_at <= step.wake_at:
            return f"signalled at {signal.sent_at:%Y-%m-%d %H:%M:%S}"
        if step.wake_at <= datetime.now(UTC):
            return f"timed out at {step.wake_at:%Y-%m-%d %H:%M:%S}"
        return f"waiting until {step.wake_at:%Y-%m-%d %H:%M:%S}"

    @property
    def attempt_text(self) -> str:
        """``3 of 5``; ``3 (of its handler's or runner's maximum, not known here)``."""
        if self.max_attempts is None:
            return f"{self.job.attempt} (of its handler's or runner's maximum, not known here)"
        return f"{self.job.attempt} of {self.max_attempts}"

    @property
    def recovery_text(self) -> str:
        """Recoveries used and the budget that applies, with where it comes
        from: ``1 of 3 (its handler's, @handler in this process)``."""
        used = self.job.recovery_count
        if not self.recovery.known:
            # A requeue proves a budget of at least the recoveries used, whoever set it.
            floor = f", at least {used}: it was requeued" if used else ""
            return (
                f"{used} (of its handler's or runner's budget, not known here{floor}; "
                "with neither, a vanished execution settles interrupted)"
            )
        level = _LEVEL_TEXT[self.recovery.level]
        if self.recovery.value is None:
            return f"{used} (no recovery budget, {level}: a vanished execution settles interrupted)"
        return f"{used} of {self.recovery.value} ({level})"

    @property
    def timeout_text(self) -> str:
        """The timeout and where it comes from, in words."""
        if not self.timeout.known:
            return _UNKNOWN.format(what="timeout", arg="timeout", default="none")
        value = "none" if self.timeout.value is None else _duration(self.timeout.value)
        return f"{value} ({_LEVEL_TEXT[self.timeout.level]})"

    @property
    def retry_text(self) -> str:
        """The retry policy and where it comes from, in words."""
        if not self.retry.known:
            return _UNKNOWN.format(what="retry policy", arg="retry", default="one attempt, no retries")
        policy = self.retry.value
        if policy is None:
            value = "no retries (one attempt)"
        else:
            value = (
                f"{policy.max_attempts} attempts, backoff {_duration(policy.backoff)} x {policy.factor:g}"
                f" (at most {_duration(policy.max_backoff)}), jitter {policy.jitter:g}"
            )
        return f"{value} ({_LEVEL_TEXT[self.retry.level]})"

    @property
    def pause_text(self) -> str | None:
        """``paused since ...: reason``, or None when the queue is not paused."""
        if self.pause is None:
            return None
        since = self.pause.paused_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"paused since {since}" + (f": {self.pause.reason}" if self.pause.reason else "")


_LEVEL_TEXT = {
    PolicyLevel.JOB: "the job's own",
    PolicyLevel.HANDLER: "its handler's, @handler in this process",
    PolicyLevel.RUNNER: "the runner's",
}
_UNKNOWN = (
    "its handler's or the runner's {what} (@handler(queue, {arg}=...) or Runner({arg}=...) where the runner "
    "runs): not known in this process; with neither, {default}"
)


def _duration(value: timedelta) -> str:
    """``1h``, ``2m``, ``90s``, ``2.5s``: whole milliseconds, as stored, in the
    largest unit that says it exactly."""
    ms = value // timedelta(milliseconds=1)
    if ms % 1000:
        return f"{ms / 1000:.3f}".rstrip("0") + "s"
    seconds = ms // 1000
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def explain(
    job: JobView,
    pause: QueuePause | None = None,
    unique_keys: tuple[UniqueKeyHold, ...] = (),
    steps: tuple[JobStep, ...] = (),
    signals: tuple[JobSignal, ...] = (),
) -> JobExplanation:
    """What applies to ``job`` as this process knows it: its own policy, else
    its queue's ``@handler`` registered here, else the runner's (not known).
    Pure: reads only this process's ``@handler`` registrations."""
    registered = _registry.get(job.queue)
    if job.timeout is not None:
        timeout: Applied[timedelta] = Applied(job.timeout, PolicyLevel.JOB)
    elif registered is not None and registered.timeout is not _UNSET:
        timeout = Applied(registered.timeout, PolicyLevel.HANDLER)
    else:
        timeout = Applied(None, PolicyLevel.RUNNER, known=False)
    if job.retry is not None:
        retry: Applied[RetryPolicy] = Applied(job.retry, PolicyLevel.JOB)
    elif registered is not None and registered.retry is not _UNSET:
        retry = Applied(registered.retry, PolicyLevel.HANDLER)
    else:
        retry = Applied(None, PolicyLevel.RUNNER, known=False)
    # As the runner's budget_for: the job's own, else its handler's, else the runner's.
    if job.max_recoveries is not None:
        recovery: Applied[int] = Applied(job.max_recoveries, PolicyLevel.JOB)
    elif registered is not None and registered.max_recoveries is not _UNSET:
        recovery = Applied(registered.max_recoveries, PolicyLevel.HANDLER)
    else:
        recovery = Applied(None, PolicyLevel.RUNNER, known=False)
    # As the runner counts them: a job past its policy's attempts (a policy
    # lowered since) is on its last.
    max_attempts = None if not retry.known else max(job.attempt, retry.value.max_attempts if retry.value else 1)
    return JobExplanation(
        job,
        timeout,
        retry,
        max_attempts,
        pause,
        plain_reason(job.failure_reason),
        recovery,
        unique_keys,
        steps,
        signals,
    )


def plain_reason(reason: str | None) -> str | None:
    """A ``failure_reason`` in plain words: the library's own reasons
    translated (``Execution disappeared without a recovery policy`` reads
    ``worker died or lost its lease (no recovery budget)``), any other --
    a handler's own words -- as it is."""
    if reason is None:
        return None
    if reason == store.NO_POLICY_REASON:
        return "worker died or lost its lease (no recovery budget: max_recoveries is not set)"
    prefix = "Restart recovery budget exhausted ("
    if reason.startswith(prefix) and reason.endswith(" recoveries)"):
        used = reason[len(prefix) : -len(" recoveries)")]
        return f"worker died or lost its lease, again (its recovery budget of {used} is used up)"
    if reason.startswith(store.SHUTDOWN_REASON + "; "):
        rest = reason[len(store.SHUTDOWN_REASON) + 2 :]
        budget = (
            "no recovery budget"
            if rest == "no recovery policy"
            else rest.replace("recovery budget exhausted (", "its recovery budget of ").replace(
                " recoveries)", " is used up"
            )
        )
        return f"its runner shut down while it ran and the handler outlived the grace period ({budget})"
    if reason == REFUSED_SETTLE_REASON:
        return "the database refused its settlement (a row it could not store; see the runner's log)"
    return reason
