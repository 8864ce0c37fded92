"""sqlalchemy_watchdog: a durable job queue in your application's own database.

Enqueue jobs inside your own SQLAlchemy transaction with :func:`enqueue`,
run them with a :class:`Runner`, and inspect or command the queue from any
process with :class:`Watchdog`. The asyncio twins live in
:mod:`sqlalchemy_watchdog.asyncio`.
"""

from ._version import __version__ as __version__
from .applies import Applied, JobExplanation, PolicyLevel
from .client import Watchdog, enqueue, enqueue_select, replace_job
from .codecs import EncryptedJSON, PayloadCodec, TaggedJSON
from .connections import follow_failover
from .core.handlers import RunningJob, handler
from .core.progress import ProgressStatus
from .core.settings import RunnerOptions
from .errors import (
    EnqueueConflict,
    ErrorCode,
    InvalidJob,
    PreparedStatementsRefused,
    WakeupsUnavailable,
    WatchdogError,
    redacted,
    redacted_detail,
    safe_text,
)
from .executors import HandlerProcessDied, ProcessExecutor
from .jobs import (
    BulkResult,
    BulkSkip,
    CancelResult,
    CancelStatus,
    Decision,
    EnqueueResult,
    EnqueueStatus,
    FailedAttempt,
    HeldBy,
    Job,
    JobResult,
    JobState,
    JobStep,
    JobView,
    LaneFailure,
    Outcome,
    PauseStatus,
    QueueLimits,
    QueuePause,
    QueueStats,
    Rate,
    ReplaceResult,
    ReplaceStatus,
    ResultStatus,
    Retention,
    RetryPolicy,
    ScheduleView,
    Stats,
    StepKind,
    ThrottleExcess,
    Throughput,
    Undecodable,
    UniqueKeyHold,
    UniqueKind,
    UniqueStates,
    WorkerView,
)
from .model import WatchdogJob, metadata
from .records import StopReason, TickResult, TickStatus
from .runner import Runner
from .schedules import Schedule
from .store.dependencies import ParentResult
from .tasks import Task, task
from .wakeups import WakeupMode, WakeupStatus
from .workflows import Workflow, chain, group

__all__ = [
    "Applied",
    "CancelResult",
    "CancelStatus",
    "JobStep",
    "StepKind",
    "ReplaceResult",
    "ReplaceStatus",
    "ThrottleExcess",
    "UniqueKeyHold",
    "UniqueKind",
    "UniqueStates",
    "Decision",
    "EnqueueConflict",
    "EnqueueResult",
    "EnqueueStatus",
    "ErrorCode",
    "FailedAttempt",
    "HandlerProcessDied",
    "HeldBy",
    "InvalidJob",
    "Job",
    "JobExplanation",
    "JobResult",
    "JobState",
    "JobView",
    "LaneFailure",
    "BulkResult",
    "BulkSkip",
    "Outcome",
    "ParentResult",
    "PauseStatus",
    "PayloadCodec",
    "EncryptedJSON",
    "PolicyLevel",
    "PreparedStatementsRefused",
    "ProcessExecutor",
    "QueueLimits",
    "ProgressStatus",
    "QueuePause",
    "QueueStats",
    "Rate",
    "ScheduleView",
    "WorkerView",
    "ResultStatus",
    "Retention",
    "RetryPolicy",
    "Runner",
    "RunnerOptions",
    "RunningJob",
    "Schedule",
    "Stats",
    "StopReason",
    "TaggedJSON",
    "Task",
    "TickResult",
    "TickStatus",
    "WakeupMode",
    "WakeupStatus",
    "WakeupsUnavailable",
    "Throughput",
    "Undecodable",
    "Watchdog",
    "WatchdogError",
    "WatchdogJob",
    "Workflow",
    "chain",
    "enqueue",
    "enqueue_select",
    "replace_job",
    "follow_failover",
    "group",
    "handler",
    "metadata",
    "redacted",
    "redacted_detail",
    "safe_text",
    "task",
]
