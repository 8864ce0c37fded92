"""The one store: runs its statements (each feature's ``<feature>_sql``) on a sync ``Connection``.

Internal module: its names may change in any release; the public API is
what :mod:`sqlalchemy_watchdog` exports.

Every function here takes a ``Connection`` already inside a transaction and
leaves committing to its caller, so the same code serves the sync client,
the runner, and (through ``AsyncConnection.run_sync``) the asyncio API.

A package of rooms, every public name re-exported here (``store.claim`` as
before; a private one is imported from the room that defines it):
``base`` (constants, rows made views), ``operation`` (the declarations),
``declaration`` (every operation's signature and shape in one place),
``views`` (the hot statements precompiled), ``enqueue``, ``claims`` (reads of
one job, the claim life cycle, recovery), ``maintenance`` (retention,
listing, stats, pauses, reruns, workers, schedules, bulk actions, make_due),
``transactions`` (transact_as, locks, retries), ``limits`` (flow control:
the queues' limits and the limited claim) and ``chart``. Beside each room
its statements, built with SQLAlchemy Core: ``enqueue_sql``, ``claims_sql``,
``limits_sql``, ``maintenance_sql``, ``dependencies_sql``, ``chart_sql``, and
what they share in ``sql``.
"""

from __future__ import annotations

from ..backends import UnreadableText as UnreadableText
from ..jobs import SettleStatus as SettleStatus
from .base import ENQUEUE_CHUNK as ENQUEUE_CHUNK
from .base import LANE_FAILURE_BATCH as LANE_FAILURE_BATCH
from .base import NO_POLICY_REASON as NO_POLICY_REASON
from .base import PROMOTE_BATCH as PROMOTE_BATCH
from .base import F as F
from .base import P as P
from .base import T as T
from .base import new_claim_token as new_claim_token
from .base import now_ms as now_ms
from .base import unreadable_columns as unreadable_columns
from .base import view as view
from .chart import throughput as throughput
from .claims import SHUTDOWN_REASON as SHUTDOWN_REASON
from .claims import Claim as Claim
from .claims import ClaimBatch as ClaimBatch
from .claims import Promotion as Promotion
from .claims import Recovery as Recovery
from .claims import RecoveryCause as RecoveryCause
from .claims import RecoveryStatus as RecoveryStatus
from .claims import Settlement as Settlement
from .claims import SettleRequest as SettleRequest
from .claims import cancel as cancel
from .claims import cancel_status_now as cancel_status_now
from .claims import claim as claim
from .claims import count_ready as count_ready
from .claims import expired_claims as expired_claims
from .claims import fail_lane as fail_lane
from .claims import has_pending_work as has_pending_work
from .claims import next_ready_in as next_ready_in
from .claims import notify as notify
from .claims import promote as promote
from .claims import purge as purge
from .claims import read as read
from .claims import read_claim as read_claim
from .claims import read_queue_head as read_queue_head
from .claims import read_settled as read_settled
from .claims import reconcile as reconcile
from .claims import recovery_reason as recovery_reason
from .claims import release as release
from .claims import release_and_recover as release_and_recover
from .claims import renew as renew
from .claims import report_progress as report_progress
from .claims import seconds_until_next_expiry as seconds_until_next_expiry
from .claims import settle as settle
from .claims import settle_many as settle_many
from .claims import settle_row as settle_row
from .claims import start as start
from .dependencies import PROPAGATE_BATCH as PROPAGATE_BATCH
from .dependencies import ParentResult as ParentResult
from .dependencies import parent_results as parent_results
from .dependencies import propagate as propagate
from .dependencies import relations as relations
from .dependencies import waiting_for as waiting_for
from .enqueue import check_delay as check_delay
from .enqueue import enqueue as enqueue
from .enqueue import enqueue_each as enqueue_each
from .enqueue import self_committing as self_committing
from .enqueue import violation as violation
from .job_signals import read_signal as read_signal
from .job_signals import read_signals as read_signals
from .job_signals import send_signal as send_signal
from .job_steps import read_steps as read_steps
from .job_steps import record_step as record_step
from .job_steps import record_step_in as record_step_in
from .limits import LIMITED_TTL as LIMITED_TTL
from .limits import LimitUse as LimitUse
from .limits import check_limit as check_limit
from .limits import claim_queue as claim_queue
from .limits import clear_limits as clear_limits
from .limits import fair_pick as fair_pick
from .limits import forget_limited as forget_limited
from .limits import held_by as held_by
from .limits import limited_queues as limited_queues
from .limits import own_transaction as own_transaction
from .limits import queue_use as queue_use
from .limits import read_limits as read_limits
from .limits import set_limits as set_limits
from .maintenance import LIST_LIMIT_MAX as LIST_LIMIT_MAX
from .maintenance import PRUNE_LOCK_KEY as PRUNE_LOCK_KEY
from .maintenance import RERUN_ID_MAX_LENGTH as RERUN_ID_MAX_LENGTH
from .maintenance import SCHEDULE_CURRENT_MS as SCHEDULE_CURRENT_MS
from .maintenance import SCHEDULE_KEEP_MS as SCHEDULE_KEEP_MS
from .maintenance import SEQUENCE_MAX as SEQUENCE_MAX
from .maintenance import WORKER_GONE_HEARTBEATS as WORKER_GONE_HEARTBEATS
from .maintenance import WORKER_GONE_MARGIN_MS as WORKER_GONE_MARGIN_MS
from .maintenance import WORKER_KEEP_GONE_MS as WORKER_KEEP_GONE_MS
from .maintenance import WORKER_PRUNE_BATCH as WORKER_PRUNE_BATCH
from .maintenance import BulkAction as BulkAction
from .maintenance import BulkKind as BulkKind
from .maintenance import BulkProgress as BulkProgress
from .maintenance import BulkStep as BulkStep
from .maintenance import Pruning as Pruning
from .maintenance import ScheduleRecord as ScheduleRecord
from .maintenance import WorkerRegistration as WorkerRegistration
from .maintenance import bulk_batch as bulk_batch
from .maintenance import check_outcomes as check_outcomes
from .maintenance import deregister_worker as deregister_worker
from .maintenance import list_jobs as list_jobs
from .maintenance import live_workers_per_queue as live_workers_per_queue
from .maintenance import make_due as make_due
from .maintenance import newest_sequence as newest_sequence
from .maintenance import pause as pause
from .maintenance import prefix_upper_bound as prefix_upper_bound
from .maintenance import prune_batch as prune_batch
from .maintenance import prune_retention as prune_retention
from .maintenance import prune_workers as prune_workers
from .maintenance import read_with_pause as read_with_pause
from .maintenance import read_with_reruns as read_with_reruns
from .maintenance import record_schedules as record_schedules
from .maintenance import register_worker as register_worker
from .maintenance import rerun as rerun
from .maintenance import resume as resume
from .maintenance import schedules as schedules
from .maintenance import sorts_by_code_point as sorts_by_code_point
from .maintenance import stats as stats
from .maintenance import waiting_jobs as waiting_jobs
from .maintenance import workers as workers
from .operation import UNDECLARED as UNDECLARED
from .operation import Operation as Operation
from .operation import Shape as Shape
from .operation import declared as declared
from .operation import operation as operation
from .operation import operation_of as operation_of
from .transactions import READ as READ
from .transactions import WRITE as WRITE
from .transactions import Backoff as Backoff
from .transactions import TxMode as TxMode
from .transactions import begin_write as begin_write
from .transactions import is_transient as is_transient
from .transactions import reads_beside_writer as reads_beside_writer
from .transactions import retrying as retrying
from .transactions import transact as transact
from .transactions import transact_as as transact_as
from .transactions import transient_failure as transient_failure
from .transactions import write_transaction as write_transaction
from .unique import keys_held_by as keys_held_by
from .unique import prune_keys as prune_keys
from .unique import replace as replace
from .views import execute_rows as execute_rows

__all__ = [
    "keys_held_by",
    "read_steps",
    "read_signal",
    "read_signals",
    "send_signal",
    "record_step",
    "record_step_in",
    "prune_keys",
    "replace",
    "Claim",
    "ClaimBatch",
    "Recovery",
    "RecoveryCause",
    "RecoveryStatus",
    "SettleRequest",
    "Settlement",
    "now_ms",
    "view",
    "enqueue",
    "read",
    "read_queue_head",
    "read_settled",
    "has_pending_work",
    "Promotion",
    "promote",
    "claim",
    "settle",
    "renew",
    "start",
    "release",
    "cancel",
    "fail_lane",
    "purge",
    "expired_claims",
    "reconcile",
    "seconds_until_next_expiry",
    "make_due",
    "begin_write",
    "Shape",
    "Operation",
    "operation",
    "TxMode",
    "READ",
    "WRITE",
    "transact",
    "transact_as",
    "write_transaction",
    "retrying",
    "WorkerRegistration",
    "register_worker",
    "deregister_worker",
    "workers",
    "prune_workers",
    "ScheduleRecord",
    "record_schedules",
    "schedules",
    # The rest of the operations the runner's core calls (its port,
    # sqlalchemy_watchdog.core.ports.Store, which this module implements).
    "settle_many",
    "release_and_recover",
    "propagate",
    "count_ready",
    "prune_retention",
    "enqueue_each",
    "transient_failure",
    # Every other operation of the store (store/declaration.py: StoreOperations,
    # which mypy checks this module against -- through these names: a name left
    # out of __all__ is not part of the module for that check).
    "throughput",
    "read_limits",
    "set_limits",
    "clear_limits",
    "read_claim",
    "next_ready_in",
    "report_progress",
    "relations",
    "parent_results",
    "waiting_for",
    "prune_batch",
    "list_jobs",
    "stats",
    "live_workers_per_queue",
    "pause",
    "resume",
    "read_with_reruns",
    "read_with_pause",
    "rerun",
    "newest_sequence",
    "bulk_batch",
    "waiting_jobs",
]
