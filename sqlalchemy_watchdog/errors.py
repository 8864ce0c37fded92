"""The exceptions raised by sqlalchemy_watchdog."""

from __future__ import annotations

import enum

__all__ = ["ErrorCode", "WatchdogError", "InvalidJob", "EnqueueConflict", "redacted"]


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


def redacted(error: BaseException) -> str:
    """A one-line description of ``error`` safe for logs: a database error's
    SQLSTATE and first message line, never its DETAIL (row values, claim
    tokens, payloads) or the statement's parameters."""
    orig = getattr(error, "orig", None) or error
    sqlstate = getattr(orig, "sqlstate", None)
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    prefix = f"{type(orig).__name__}"
    return f"{prefix} [{sqlstate}]: {first}" if sqlstate else f"{prefix}: {first}"
