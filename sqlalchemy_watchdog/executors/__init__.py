"""Executors: where a runner's handlers run.

The default, the *thread* executor, runs each handler in a thread of the
runner's process (``AsyncRunner``: coroutine handlers as tasks on its loop,
plain ones in threads). The *process* executor runs plain handlers in child
processes::

    from sqlalchemy_watchdog import ProcessExecutor, Runner

    Runner(engine, executor=ProcessExecutor(processes=4, max_jobs_per_child=1000))
    Runner(engine, executor="process")      # one child per CPU

The parent keeps every database duty -- claim, lease and heartbeat, settle,
recovery, cancellation -- and children only run handlers, located by module
path, and report back over a pipe. A child past its job's timeout (or whose
job was cancelled, whose lane failed, or whose runner shuts down) is told to
stop, then killed after :attr:`ProcessExecutor.kill_grace`; its death is
confirmed before the job is settled, so a retry never overlaps it.
"""

from __future__ import annotations

from ..executor_config import DEFAULT_KILL_GRACE as DEFAULT_KILL_GRACE
from ..executor_config import MAX_FORWARD_LOGGERS as MAX_FORWARD_LOGGERS
from ..executor_config import MAX_KILL_GRACE as MAX_KILL_GRACE
from ..executor_config import MAX_LOGGER_NAME as MAX_LOGGER_NAME
from ..executor_config import MAX_MEMORY as MAX_MEMORY
from ..executor_config import MAX_PREFETCH as MAX_PREFETCH
from ..executor_config import MAX_PROCESSES as MAX_PROCESSES
from ..executor_config import MIN_MEMORY as MIN_MEMORY
from ..executor_config import ExecutorName as ExecutorName
from ..executor_config import HandlerError as HandlerError
from ..executor_config import HandlerProcessDied as HandlerProcessDied
from ..executor_config import HandlerRef as HandlerRef
from ..executor_config import ProcessExecutor as ProcessExecutor
from ..executor_config import check_executor as check_executor
from ..executor_config import default_processes as default_processes
from ..executor_config import locate as locate
from ..executor_config import locate_all as locate_all

__all__ = ["ExecutorName", "HandlerProcessDied", "HandlerRef", "ProcessExecutor", "check_executor", "locate"]
