"""The exceptions raised by sqlalchemy_watchdog."""

from __future__ import annotations

import enum

__all__ = ["ErrorCode", "WatchdogError", "InvalidJob", "EnqueueConflict"]


class ErrorCode(str, enum.Enum):
    """Why an operation failed; carried by :class:`WatchdogError`."""

    STORE_UNAVAILABLE = "store_unavailable"
    CLAIM_UNAVAILABLE = "claim_unavailable"
    LIVENESS_UNAVAILABLE = "liveness_unavailable"
    EXECUTION_FAILED = "execution_failed"
    WAKE_UNAVAILABLE = "wake_unavailable"
    SETTLEMENT_REJECTED = "settlement_rejected"
    INVALID_INPUT = "invalid_input"
    ENQUEUE_CONFLICT = "enqueue_conflict"


class WatchdogError(Exception):
    """Base class of every error this library raises.

    :attr:`code` says which kind of failure it is (an :class:`ErrorCode`).
    """

    code: ErrorCode

    def __init__(self, code: ErrorCode | str, message: str | None = None) -> None:
        self.code = ErrorCode(code)
        super().__init__(message or self.code.value)


class InvalidJob(WatchdogError, ValueError):
    """Input refused before anything was written.

    :attr:`field` names the offending field (``job_id``, ``payload``, ...).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(ErrorCode.INVALID_INPUT, f"{field}: {message}")


class EnqueueConflict(WatchdogError):
    """A job with this ``job_id`` exists with different contents.

    The caller's transaction has been rolled back (on PostgreSQL the database
    has already aborted it), so none of its other writes can commit without
    the job they were meant to come with.
    """

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(
            ErrorCode.ENQUEUE_CONFLICT,
            f"job_id {job_id!r} is already enqueued with a different queue, lane, "
            "priority, payload or recovery policy; the transaction was rolled back",
        )
