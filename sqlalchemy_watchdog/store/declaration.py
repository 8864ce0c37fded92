"""Every store operation in one place: its name, its signature and its transaction shape.

Part of :mod:`sqlalchemy_watchdog.store` (see its docstring). Internal module:
its names may change in any release.

Each store operation is a function ``fn(conn, ...)`` in its room of the
store (``store/claims.py``, ``store/maintenance.py``, ...), declared with
``@operation(Shape.*)`` where it is written; :data:`~.operation.OPERATIONS`
collects them as the package is imported. This module is the table of
contents a reader -- or the author of a new backend -- reads instead of ten
files:

* :class:`StoreOperations`: every operation of the store's module, with its
  signature (the connection first), grouped by the room that defines it.
  The module :mod:`sqlalchemy_watchdog.store` itself satisfies it: mypy
  --strict checks that ``store`` can be assigned to a variable of this type
  (``tests/unit/test_store_declaration.py``), so an operation whose
  parameters change without this declaration fails the type check.
* :class:`PruningOperations`: the one operation that is a method
  (:meth:`Pruning.run_batch <.maintenance.Pruning.run_batch>`, a batch of a
  checked ``prune`` request).
* :class:`ClientStoreOperations`: the two operations the client declares
  over the store's own (``client/operations.py``: ``cancel_in`` and
  ``fail_lane_in``, the store's ``cancel`` and ``fail_lane`` plus the
  wake-up). The client sits above the store, so only their signatures are
  named here; the test checks the client's module against them.
* :data:`SHAPES`: each operation's :class:`~.operation.Shape`, by the name
  :data:`~.operation.OPERATIONS` lists it under (``Pruning.run_batch`` for
  the method).

The runner's core names the operations it calls in its own port,
:class:`sqlalchemy_watchdog.core.ports.Store` (the core imports no store):
every member of that port is a member of :class:`StoreOperations` with the
same signature, but ``transient_failure`` -- a classification of a failure
the core calls directly, not an operation run on a connection.

``tests/unit/test_store_declaration.py`` keeps this true: the names of
:data:`SHAPES` are :data:`~.operation.OPERATIONS`' names, each declared
signature is the function's (``inspect.signature``: names, kinds, order,
defaults, annotations), each shape is the function's declared one, and the
core's port is a subset. *To add an operation* (docs/design.md, "Store
operations and backends"): declare it here too, with its shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import Connection

from ..jobs import (
    CancelResult,
    Decision,
    EnqueueResult,
    Job,
    JobState,
    JobView,
    LaneFailure,
    Outcome,
    PauseStatus,
    QueueLimits,
    QueuePause,
    Rate,
    ReplaceResult,
    ScheduleView,
    Stats,
    Throughput,
    WorkerView,
)
from ..jobs.durable import JobSignal, JobStep, SignalResult, StepKind
from ..jobs.uniqueness import UniqueKeyHold
from ..records import (
    Claim,
    ClaimBatch,
    ParentResult,
    Promotion,
    Recovery,
    RecoveryCause,
    ScheduleRecord,
    SettleRequest,
    WorkerRegistration,
)
from .base import LANE_FAILURE_BATCH, PROMOTE_BATCH
from .claims import _FROM_JOB, Settlement
from .dependencies import PROPAGATE_BATCH
from .maintenance import WORKER_PRUNE_BATCH, BulkAction, BulkStep
from .operation import Shape

__all__ = ["SHAPES", "ClientStoreOperations", "PruningOperations", "StoreOperations"]


class StoreOperations(Protocol):
    """Every operation of :mod:`sqlalchemy_watchdog.store`, as the module
    defines it (each one's shape: :data:`SHAPES`; what it does: its own
    docstring, in the room named above it).

    Each takes a ``Connection`` already inside the transaction its shape
    asks for (``store.transact_as`` and the gateways open it) and leaves
    committing to its caller. ``reconcile``'s ``max_recoveries`` defaults
    to the job's own budget (a marker, not None: None means no budget).
    """

    # -- store/chart.py

    def throughput(self, conn: Connection) -> Throughput: ...

    # -- store/limits.py

    def read_limits(self, conn: Connection, queues: Sequence[str] | None = None) -> tuple[QueueLimits, ...]: ...
    def set_limits(
        self,
        conn: Connection,
        queue: str,
        *,
        concurrency: int | None = None,
        concurrency_per_key: int | None = None,
        rate: Rate | None = None,
        rate_per_key: Rate | None = None,
    ) -> QueueLimits: ...
    def clear_limits(self, conn: Connection, queue: str) -> bool: ...

    # -- store/claims.py

    def read(self, conn: Connection, job_id: str) -> JobView | None: ...
    def read_claim(self, conn: Connection, job_id: str) -> tuple[JobView, str | None] | None: ...
    def read_queue_head(self, conn: Connection, queue: str) -> JobView | None: ...
    def read_settled(self, conn: Connection, limit: int, after_sequence: int = 0) -> list[JobView]: ...
    def has_pending_work(self, conn: Connection) -> bool: ...
    def count_ready(self, conn: Connection, queues: Sequence[str], cap: int) -> int: ...
    def next_ready_in(self, conn: Connection) -> float | None: ...
    def promote(self, conn: Connection, *, limit: int = PROMOTE_BATCH) -> Promotion: ...
    def claim(
        self, conn: Connection, *, queues: Sequence[str] | None, limit: int = 1, lease_ms: int, ahead: bool = False
    ) -> ClaimBatch: ...
    def settle(
        self, conn: Connection, *, job_id: str, claim_token: str, decision: Decision, now: int | None = None
    ) -> Settlement: ...
    def settle_many(self, conn: Connection, requests: Sequence[SettleRequest]) -> list[Settlement]: ...
    def report_progress(
        self,
        conn: Connection,
        job_id: str,
        claim_token: str,
        fraction: float,
        note: str | None,
        *,
        now: int | None = None,
    ) -> bool: ...
    def renew(
        self, conn: Connection, claims: Sequence[tuple[str, str]], *, lease_ms: int, now: int | None = None
    ) -> set[str]: ...
    def start(
        self, conn: Connection, claims: Sequence[tuple[str, str]], *, lease_ms: int, now: int | None = None
    ) -> set[str]: ...
    def release(self, conn: Connection, claims: Sequence[tuple[str, str]]) -> set[str]: ...
    def cancel(
        self, conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False
    ) -> CancelResult: ...
    def fail_lane(
        self, conn: Connection, lane: str, reason: str, *, batch: int = LANE_FAILURE_BATCH
    ) -> LaneFailure: ...
    def purge(self, conn: Connection, queue: str) -> int: ...
    def expired_claims(self, conn: Connection, *, limit: int) -> list[Claim]: ...
    def reconcile(
        self,
        conn: Connection,
        expired: Claim,
        *,
        max_recoveries: int | None = _FROM_JOB,
        cause: RecoveryCause = RecoveryCause.VANISHED,
    ) -> Recovery: ...
    def release_and_recover(
        self,
        conn: Connection,
        claims: Sequence[tuple[str, str]],
        budgets: Mapping[str, int | None] | None = None,
        *,
        cause: RecoveryCause = RecoveryCause.SHUTDOWN,
    ) -> list[Recovery]: ...
    def seconds_until_next_expiry(self, conn: Connection) -> float | None: ...

    # -- store/dependencies.py

    def propagate(self, conn: Connection, *, limit: int = PROPAGATE_BATCH) -> int: ...
    def relations(
        self, conn: Connection, job_id: str
    ) -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]: ...
    def parent_results(self, conn: Connection, job_id: str) -> tuple[ParentResult, ...]: ...
    def waiting_for(
        self, conn: Connection, queues: Sequence[str], limit: int = 10
    ) -> dict[str, list[tuple[str, str | None, str | None]]]: ...

    # -- store/unique.py

    def replace(
        self, conn: Connection, job_id: str, *, payload: str | None, start: datetime | None, set_start: bool
    ) -> ReplaceResult: ...
    def keys_held_by(self, conn: Connection, job_id: str) -> list[UniqueKeyHold]: ...

    # -- store/job_steps.py

    def record_step(
        self,
        conn: Connection,
        job_id: str,
        claim_token: str,
        name: str,
        *,
        kind: StepKind,
        result_json: str | None,
        delay_ms: int | None,
        attempt: int,
        now: int | None = None,
    ) -> JobStep | None: ...
    def read_steps(self, conn: Connection, job_id: str) -> list[JobStep]: ...

    # -- store/job_signals.py

    def send_signal(self, conn: Connection, job_id: str, name: str, payload_json: str) -> SignalResult: ...
    def read_signal(self, conn: Connection, job_id: str, name: str) -> tuple[JobSignal | None, int]: ...
    def read_signals(self, conn: Connection, job_id: str) -> list[JobSignal]: ...

    # -- store/enqueue.py

    def enqueue(
        self, conn: Connection, jobs: Sequence[Job], *, delay: timedelta | None = None
    ) -> list[EnqueueResult]: ...
    def enqueue_each(self, conn: Connection, jobs: Sequence[Job]) -> list[EnqueueResult | None]: ...

    # -- store/maintenance.py

    def prune_batch(
        self,
        conn: Connection,
        *,
        older_than: timedelta,
        outcomes: Sequence[str] | None = None,
        limit: int = 1000,
        include_undated: bool = False,
    ) -> int: ...
    def prune_retention(self, conn: Connection, ages: Mapping[str, timedelta], batch: int) -> int | None: ...
    def list_jobs(
        self,
        conn: Connection,
        *,
        queue: str | None = None,
        state: JobState | str | None = None,
        outcome: Outcome | str | None = None,
        lane: str | None = None,
        job_id_prefix: str | None = None,
        limit: int = 100,
        after_sequence: int = 0,
        before_sequence: int | None = None,
        newest_first: bool = False,
        with_payload: bool = True,
    ) -> list[JobView]: ...
    def stats(self, conn: Connection) -> Stats: ...
    def register_worker(self, conn: Connection, registration: WorkerRegistration, running: int = 0) -> None: ...
    def deregister_worker(self, conn: Connection, worker_id: str) -> None: ...
    def workers(self, conn: Connection) -> list[WorkerView]: ...
    def live_workers_per_queue(self, conn: Connection) -> dict[str, int]: ...
    def prune_workers(self, conn: Connection, limit: int = WORKER_PRUNE_BATCH) -> int: ...
    def record_schedules(self, conn: Connection, records: Sequence[ScheduleRecord], recorded_by: str) -> None: ...
    def schedules(self, conn: Connection) -> list[ScheduleView]: ...
    def pause(self, conn: Connection, queue: str, reason: str | None = None) -> PauseStatus: ...
    def resume(self, conn: Connection, queue: str) -> PauseStatus: ...
    def read_with_reruns(self, conn: Connection, job_id: str) -> JobView | None: ...
    def read_with_pause(self, conn: Connection, job_id: str) -> tuple[JobView, QueuePause | None] | None: ...
    def rerun(self, conn: Connection, job_id: str, rerun_id: str) -> EnqueueResult: ...
    def newest_sequence(self, conn: Connection) -> int: ...
    def bulk_batch(self, conn: Connection, action: BulkAction, after: int, end: int, size: int) -> BulkStep: ...
    def make_due(self, conn: Connection, queues: Iterable[str] | None = None) -> int: ...
    def waiting_jobs(self, conn: Connection, queues: Sequence[str], limit: int = 10) -> list[tuple[str, str]]: ...


class PruningOperations(Protocol):
    """The operation of a checked ``prune`` request
    (:class:`~.maintenance.Pruning`): one batch, how many jobs it deleted."""

    def run_batch(self, conn: Connection, size: int) -> int: ...


class ClientStoreOperations(Protocol):
    """The operations ``client/operations.py`` declares over the store's:
    the store's ``cancel`` and ``fail_lane`` plus the wake-up that tells
    the runners to stop the jobs, in the caller's transaction."""

    def cancel_in(
        self, conn: Connection, job_id: str, cancellation_id: str, *, only_if_queued: bool = False
    ) -> CancelResult: ...

    def fail_lane_in(self, conn: Connection, lane: str, reason: str) -> LaneFailure: ...


#: Each operation's transaction shape, by the name
#: :data:`~.operation.OPERATIONS` lists it under: ``READ`` reads only,
#: ``WRITE`` writes with statements each atomic on its own (autocommit where
#: the backend is self-committing), ``TRANSACTION`` needs BEGIN/COMMIT
#: everywhere (see :class:`~.operation.Shape`).
SHAPES: Mapping[str, Shape] = {
    # store/chart.py
    "throughput": Shape.READ,
    # store/limits.py
    "read_limits": Shape.READ,
    "set_limits": Shape.WRITE,
    "clear_limits": Shape.TRANSACTION,
    # store/claims.py
    "read": Shape.READ,
    "read_claim": Shape.READ,
    "read_queue_head": Shape.READ,
    "read_settled": Shape.READ,
    "has_pending_work": Shape.READ,
    "count_ready": Shape.READ,
    "next_ready_in": Shape.READ,
    "promote": Shape.WRITE,
    "claim": Shape.WRITE,
    "settle": Shape.WRITE,
    "settle_many": Shape.WRITE,
    "report_progress": Shape.WRITE,
    "renew": Shape.WRITE,
    "start": Shape.WRITE,
    "release": Shape.WRITE,
    "cancel": Shape.WRITE,
    "fail_lane": Shape.WRITE,
    "purge": Shape.WRITE,
    "expired_claims": Shape.READ,
    "reconcile": Shape.WRITE,
    "release_and_recover": Shape.WRITE,
    "seconds_until_next_expiry": Shape.READ,
    # store/dependencies.py
    "propagate": Shape.WRITE,
    "relations": Shape.READ,
    "parent_results": Shape.READ,
    "waiting_for": Shape.READ,
    # store/unique.py
    "replace": Shape.WRITE,
    "keys_held_by": Shape.READ,
    # store/job_steps.py
    "record_step": Shape.WRITE,
    "read_steps": Shape.READ,
    # store/job_signals.py
    "send_signal": Shape.WRITE,
    "read_signal": Shape.READ,
    "read_signals": Shape.READ,
    # store/enqueue.py
    "enqueue": Shape.WRITE,
    "enqueue_each": Shape.WRITE,
    # store/maintenance.py
    "Pruning.run_batch": Shape.WRITE,
    "prune_batch": Shape.WRITE,
    "prune_retention": Shape.TRANSACTION,
    "list_jobs": Shape.READ,
    "stats": Shape.READ,
    "register_worker": Shape.WRITE,
    "deregister_worker": Shape.WRITE,
    "workers": Shape.READ,
    "live_workers_per_queue": Shape.READ,
    "prune_workers": Shape.WRITE,
    "record_schedules": Shape.WRITE,
    "schedules": Shape.READ,
    "pause": Shape.WRITE,
    "resume": Shape.WRITE,
    "read_with_reruns": Shape.READ,
    "read_with_pause": Shape.READ,
    "rerun": Shape.WRITE,
    "newest_sequence": Shape.READ,
    "bulk_batch": Shape.TRANSACTION,
    "make_due": Shape.WRITE,
    "waiting_jobs": Shape.READ,
    # client/operations.py
    "cancel_in": Shape.WRITE,
    "fail_lane_in": Shape.WRITE,
}
