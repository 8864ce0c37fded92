"""The core's ports: what it needs from the outside, named by the core.

The core asks for I/O by yielding steps (:mod:`.steps`); a store call names
the operation it wants from :class:`Store`, the port a runner's core holds
(:attr:`RunnerCore.store <sqlalchemy_watchdog.core.state.RunnerCore.store>`).
The drivers fill it with :mod:`sqlalchemy_watchdog.store` -- the module
itself implements this protocol, and mypy checks that it does where the
drivers pass it -- and perform each call on a connection of theirs. The
core never sees that connection (:data:`Connection` is opaque to it) and
imports no database library: the records it exchanges with the store live
in :mod:`sqlalchemy_watchdog.records`, below both.

:class:`Waiting` is the runner's side of the wake-ups' waiting lock
(:class:`sqlalchemy_watchdog.wakeups.Waiting` fills it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from ..errors import WatchdogError
from ..jobs import EnqueueResult, Job, JobView, Outcome, SettleStatus
from ..records import (
    Claim,
    ClaimBatch,
    Promotion,
    Recovery,
    RecoveryCause,
    ScheduleRecord,
    SettleRequest,
    WorkerRegistration,
)

__all__ = ["Connection", "Settlement", "Store", "Waiting"]

#: The connection a driver performs a store call on (a SQLAlchemy
#: ``Connection``); the core only passes the operation and its arguments.
Connection = Any


class Settlement(Protocol):
    """What one settle did, as the core reads it (the store's
    :class:`~sqlalchemy_watchdog.store.Settlement`)."""

    @property
    def status(self) -> SettleStatus: ...

    @property
    def outcome(self) -> Outcome | None: ...

    @property
    def job(self) -> JobView | None: ...


class Store(Protocol):
    """Every store operation the core calls, with its signature.

    Each takes the driver's connection first; the core names it in a step
    (``yield from call(core.store.claim, queues=..., limit=..., lease_ms=...)``)
    and the driver runs it in the transaction its ``@operation`` shape
    declares. :meth:`transient_failure` is the one the core calls directly:
    it classifies a failure the driver threw back at a step.
    """

    def claim(
        self,
        conn: Connection,
        /,
        *,
        queues: Sequence[str] | None,
        limit: int = ...,
        lease_ms: int,
        ahead: bool = ...,
    ) -> ClaimBatch: ...

    def read(self, conn: Connection, job_id: str, /) -> JobView | None: ...

    def renew(
        self, conn: Connection, claims: Sequence[tuple[str, str]], /, *, lease_ms: int, now: int | None = ...
    ) -> set[str]: ...

    def start(
        self, conn: Connection, claims: Sequence[tuple[str, str]], /, *, lease_ms: int, now: int | None = ...
    ) -> set[str]: ...

    def settle_many(self, conn: Connection, requests: Sequence[SettleRequest], /) -> Sequence[Settlement]: ...

    def seconds_until_next_expiry(self, conn: Connection, /) -> float | None: ...

    def expired_claims(self, conn: Connection, /, *, limit: int) -> list[Claim]: ...

    def reconcile(
        self, conn: Connection, expired: Claim, /, *, max_recoveries: int | None = ..., cause: RecoveryCause = ...
    ) -> Recovery: ...

    def release_and_recover(
        self,
        conn: Connection,
        claims: Sequence[tuple[str, str]],
        budgets: Mapping[str, int | None] | None = ...,
        /,
        *,
        cause: RecoveryCause = ...,
    ) -> list[Recovery]: ...

    def promote(self, conn: Connection, /, *, limit: int = ...) -> Promotion: ...

    def propagate(self, conn: Connection, /, *, limit: int = ...) -> int: ...

    def count_ready(self, conn: Connection, queues: Sequence[str], cap: int, /) -> int: ...

    def prune_retention(self, conn: Connection, ages: Mapping[str, timedelta], batch: int, /) -> int | None: ...

    def enqueue_each(self, conn: Connection, jobs: Sequence[Job], /) -> list[EnqueueResult | None]: ...

    def register_worker(self, conn: Connection, registration: WorkerRegistration, running: int = ..., /) -> None: ...

    def deregister_worker(self, conn: Connection, worker_id: str, /) -> None: ...

    def prune_workers(self, conn: Connection, limit: int = ..., /) -> int: ...

    def record_schedules(self, conn: Connection, records: Sequence[ScheduleRecord], recorded_by: str, /) -> None: ...

    def transient_failure(self, error: WatchdogError, /) -> bool: ...


class Waiting(Protocol):
    """The runner's side of the waiting lock: told after each claim whether
    it now waits for work, asked whether it is announced as waiting."""

    def idle(self) -> None: ...

    def busy(self) -> None: ...

    def waits(self) -> bool: ...
