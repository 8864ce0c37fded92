"""Jobs, decisions and the results of queue operations.

Everything here is a small frozen value. :class:`Job` validates its fields
when it is built, so bad input is refused before any SQL runs.

The package is split by what a name is for, each module importing only
those before it:

* :mod:`~sqlalchemy_watchdog.jobs.encoding` -- canonical JSON of payloads
  and results, the :class:`~sqlalchemy_watchdog.PayloadCodec` protocol,
  epoch-millisecond times;
* :mod:`~sqlalchemy_watchdog.jobs.validation` -- the field checks and
  their bounds (``JOB_ID_MAX_LENGTH``, ...);
* :mod:`~sqlalchemy_watchdog.jobs.builders` -- fast construction of frozen
  dataclasses;
* :mod:`~sqlalchemy_watchdog.jobs.types` -- what a job is: ``Job``,
  ``Decision``, ``RetryPolicy``, ``JobView``, ``Rate``, ...;
* :mod:`~sqlalchemy_watchdog.jobs.results` -- what operations return:
  ``EnqueueResult``, ``JobResult``, ``Stats``, ``BulkResult``, ...

Every name is importable from ``sqlalchemy_watchdog.jobs`` as before:
``__all__`` lists the public ones; the helpers the rest of the library
uses (``check_text``, ``epoch_ms``, ``frozen_builder``, ...) are
re-exported as ``name as name``, and are not public API.
"""

from __future__ import annotations

from .builders import frozen_builder as frozen_builder
from .builders import slot_setters as slot_setters
from .durable import STEP_NAME_MAX_LENGTH as STEP_NAME_MAX_LENGTH
from .durable import JobSignal as JobSignal
from .durable import JobStep as JobStep
from .durable import SignalResult as SignalResult
from .durable import SignalStatus as SignalStatus
from .durable import StepKind as StepKind
from .durable import check_step_name as check_step_name
from .encoding import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH, RESULT_MAX_BYTES, encode_payload, encode_result
from .encoding import at_epoch_ms as at_epoch_ms
from .encoding import duration_ms as duration_ms
from .encoding import epoch_ms as epoch_ms
from .encoding import from_epoch_ms as from_epoch_ms
from .encoding import payload_of as payload_of
from .results import (
    BULK_BATCH_MAX,
    THROUGHPUT_MINUTES,
    BulkResult,
    BulkSkip,
    CancelResult,
    CancelStatus,
    EnqueueResult,
    EnqueueStatus,
    JobResult,
    LaneFailure,
    PauseStatus,
    QueuePause,
    QueueStats,
    ReplaceResult,
    ReplaceStatus,
    ResultStatus,
    ScheduleView,
    SettleStatus,
    Stats,
    Throughput,
    WorkerView,
)
from .results import result_of as result_of
from .types import PRUNE_BATCH_MAX as PRUNE_BATCH_MAX
from .types import UNDECODABLE_REASON_LENGTH as UNDECODABLE_REASON_LENGTH
from .types import (
    Decision,
    FailedAttempt,
    HeldBy,
    Job,
    JobState,
    JobView,
    Outcome,
    QueueLimits,
    Rate,
    Retention,
    RetryPolicy,
    Undecodable,
)
from .types import bulk_cancellation_id as bulk_cancellation_id
from .types import history_of as history_of
from .types import history_with as history_with
from .types import job_batch as job_batch
from .types import rerun_job_id as rerun_job_id
from .types import set_after as set_after
from .uniqueness import ThrottleExcess as ThrottleExcess
from .uniqueness import UniqueKeyHold as UniqueKeyHold
from .uniqueness import UniqueKind as UniqueKind
from .uniqueness import UniqueStates as UniqueStates
from .validation import AFTER_POLICIES as AFTER_POLICIES
from .validation import (
    CANCELLATION_ID_MAX_LENGTH,
    FAILURE_HISTORY_LENGTH,
    FAILURE_REASON_MAX_LENGTH,
    JOB_ID_MAX_LENGTH,
    KEY_MAX_LENGTH,
    LANE_MAX_LENGTH,
    LIMIT_MAX,
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    RATE_PERIOD_MAX,
)
from .validation import FAILURE_DETAIL_MAX_LENGTH as FAILURE_DETAIL_MAX_LENGTH
from .validation import FAILURE_HISTORY_REASON_LENGTH as FAILURE_HISTORY_REASON_LENGTH
from .validation import MAX_PARENTS as MAX_PARENTS
from .validation import PAUSE_REASON_MAX_LENGTH as PAUSE_REASON_MAX_LENGTH
from .validation import RATE_PERIOD_MIN as RATE_PERIOD_MIN
from .validation import TRACE_CONTEXT_MAX_LENGTH as TRACE_CONTEXT_MAX_LENGTH
from .validation import bound_reason as bound_reason
from .validation import check_aware as check_aware
from .validation import check_datetime as check_datetime
from .validation import check_duration as check_duration
from .validation import check_int as check_int
from .validation import check_parents as check_parents
from .validation import check_text as check_text

__all__ = [
    "JOB_ID_MAX_LENGTH",
    "QUEUE_MAX_LENGTH",
    "LANE_MAX_LENGTH",
    "CANCELLATION_ID_MAX_LENGTH",
    "FAILURE_REASON_MAX_LENGTH",
    "PAYLOAD_MAX_BYTES",
    "PAYLOAD_MAX_DEPTH",
    "RESULT_MAX_BYTES",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "MAX_ATTEMPTS_LIMIT",
    "FAILURE_HISTORY_LENGTH",
    "MAX_DELAY",
    "JobState",
    "Outcome",
    "RetryPolicy",
    "FailedAttempt",
    "Job",
    "Decision",
    "JobView",
    "Undecodable",
    "EnqueueStatus",
    "EnqueueResult",
    "PauseStatus",
    "QueuePause",
    "QueueStats",
    "WorkerView",
    "ScheduleView",
    "Stats",
    "Throughput",
    "THROUGHPUT_MINUTES",
    "Retention",
    "CancelStatus",
    "CancelResult",
    "ReplaceStatus",
    "ReplaceResult",
    "JobStep",
    "StepKind",
    "JobSignal",
    "SignalResult",
    "SignalStatus",
    "ThrottleExcess",
    "UniqueKeyHold",
    "UniqueKind",
    "UniqueStates",
    "SettleStatus",
    "LaneFailure",
    "BulkSkip",
    "BulkResult",
    "BULK_BATCH_MAX",
    "KEY_MAX_LENGTH",
    "LIMIT_MAX",
    "RATE_PERIOD_MAX",
    "Rate",
    "QueueLimits",
    "HeldBy",
    "encode_payload",
    "encode_result",
    "ResultStatus",
    "JobResult",
]
