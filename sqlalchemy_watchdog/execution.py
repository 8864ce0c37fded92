"""The runner core, by its old name: every name of :mod:`sqlalchemy_watchdog.core`.

The core lives in :mod:`sqlalchemy_watchdog.core` (``handlers``,
``settings``, ``clock``, ``steps``, ``state``, ``rules.settle``,
``maintenance``, ``loop``); this module re-exports its names so imports of
``sqlalchemy_watchdog.execution`` keep working. Its public names are
re-exported from :mod:`sqlalchemy_watchdog`.
"""

from __future__ import annotations

from .core.clock import (
    check_clock as check_clock,
)
from .core.handlers import (
    _FLAGS as _FLAGS,
)
from .core.handlers import (
    _JOB_LOG as _JOB_LOG,
)
from .core.handlers import (
    _UNSET as _UNSET,
)
from .core.handlers import (
    Flag as Flag,
)
from .core.handlers import (
    Handler as Handler,
)
from .core.handlers import (
    JobLogger as JobLogger,
)
from .core.handlers import (
    RunningJob as RunningJob,
)
from .core.handlers import (
    StopReason as StopReason,
)
from .core.handlers import (
    StopSignal as StopSignal,
)
from .core.handlers import (
    _check_budget as _check_budget,
)
from .core.handlers import (
    _Registered as _Registered,
)
from .core.handlers import (
    _registry as _registry,
)
from .core.handlers import (
    check_retry as check_retry,
)
from .core.handlers import (
    check_timeout as check_timeout,
)
from .core.handlers import (
    handler as handler,
)
from .core.handlers import (
    registered_handlers as registered_handlers,
)
from .core.loop import (
    claim_steps as claim_steps,
)
from .core.loop import (
    execute as execute,
)
from .core.loop import (
    loop_pass as loop_pass,
)
from .core.loop import (
    renew as renew,
)
from .core.loop import (
    shutdown as shutdown,
)
from .core.loop import (
    tick as tick,
)
from .core.loop import (
    time_out as time_out,
)
from .core.loop import (
    until_idle as until_idle,
)
from .core.maintenance import (
    EPOCH as EPOCH,
)
from .core.maintenance import (
    WORKER_PRUNE_EVERY_S as WORKER_PRUNE_EVERY_S,
)
from .core.maintenance import (
    abandon as abandon,
)
from .core.maintenance import (
    deregister_worker as deregister_worker,
)
from .core.maintenance import (
    enqueue_schedules as enqueue_schedules,
)
from .core.maintenance import (
    probe_failed as probe_failed,
)
from .core.maintenance import (
    promote as promote,
)
from .core.maintenance import (
    prune as prune,
)
from .core.maintenance import (
    prune_workers as prune_workers,
)
from .core.maintenance import (
    record_schedules as record_schedules,
)
from .core.maintenance import (
    recover as recover,
)
from .core.maintenance import (
    refresh_worker as refresh_worker,
)
from .core.maintenance import (
    register_worker as register_worker,
)
from .core.maintenance import (
    summarize as summarize,
)
from .core.rules.settle import (
    REFUSED_SETTLE_REASON as REFUSED_SETTLE_REASON,
)
from .core.rules.settle import (
    conclude as conclude,
)
from .core.rules.settle import (
    decision_of_cancelled_task as decision_of_cancelled_task,
)
from .core.rules.settle import (
    decision_of_exception as decision_of_exception,
)
from .core.rules.settle import (
    decision_of_result as decision_of_result,
)
from .core.rules.settle import (
    finish as finish,
)
from .core.rules.settle import (
    settle_batch as settle_batch,
)
from .core.rules.settle import (
    settle_request as settle_request,
)
from .core.rules.settle import (
    stop_reason_of as stop_reason_of,
)
from .core.rules.settle import (
    timed_out as timed_out,
)
from .core.settings import (
    DEFAULT_CONCURRENCY as DEFAULT_CONCURRENCY,
)
from .core.settings import (
    DEFAULT_GRACE as DEFAULT_GRACE,
)
from .core.settings import (
    DEFAULT_SUMMARY_EVERY as DEFAULT_SUMMARY_EVERY,
)
from .core.settings import (
    EXIT_MARGIN_S as EXIT_MARGIN_S,
)
from .core.settings import (
    MAX_DURATION as MAX_DURATION,
)
from .core.settings import (
    NOTIFIED_POLL_INTERVAL as NOTIFIED_POLL_INTERVAL,
)
from .core.settings import (
    POLLING_POLL_INTERVAL as POLLING_POLL_INTERVAL,
)
from .core.settings import (
    RUNNER_CONNECTIONS as RUNNER_CONNECTIONS,
)
from .core.settings import (
    STOP_WAIT_MAX_S as STOP_WAIT_MAX_S,
)
from .core.settings import (
    SUMMARY_BACKLOG_CAP as SUMMARY_BACKLOG_CAP,
)
from .core.settings import (
    RunnerSettings as RunnerSettings,
)
from .core.settings import (
    check_summary_every as check_summary_every,
)
from .core.settings import (
    default_poll_interval as default_poll_interval,
)
from .core.settings import (
    pool_shortfall as pool_shortfall,
)
from .core.settings import (
    stop_wait_s as stop_wait_s,
)
from .core.signals import (
    STOP_SIGNALS as STOP_SIGNALS,
)
from .core.signals import (
    restore_signal as restore_signal,
)
from .core.signals import (
    signals_to_install as signals_to_install,
)
from .core.state import (
    Execution as Execution,
)
from .core.state import (
    RunnerCore as RunnerCore,
)
from .core.state import (
    TickResult as TickResult,
)
from .core.state import (
    TickStatus as TickStatus,
)
from .core.state import (
    stop as stop,
)
from .core.steps import (
    STARTED_LATE as STARTED_LATE,
)
from .core.steps import (
    UNKNOWN as UNKNOWN,
)
from .core.steps import (
    Probe as Probe,
)
from .core.steps import (
    RunHandler as RunHandler,
)
from .core.steps import (
    Spawn as Spawn,
)
from .core.steps import (
    Step as Step,
)
from .core.steps import (
    Steps as Steps,
)
from .core.steps import (
    Stop as Stop,
)
from .core.steps import (
    StoreCall as StoreCall,
)
from .core.steps import (
    WaitDone as WaitDone,
)
from .core.steps import (
    drive as drive,
)
from .core.steps import (
    drive_async as drive_async,
)

__all__ = [
    "Handler",
    "JobLogger",
    "RunningJob",
    "StopReason",
    "TickStatus",
    "TickResult",
    "RunnerSettings",
    "handler",
    "registered_handlers",
]
