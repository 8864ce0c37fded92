"""What the two runner drivers share, written once.

:class:`~sqlalchemy_watchdog.Runner` (``drivers/sync.py``) and
:class:`~sqlalchemy_watchdog.asyncio.AsyncRunner` (``drivers/asyncio.py``)
perform the same core's steps with threads or tasks; around the core they
also did the same things with twin blocks of lines: build their settings
and core from the declared options (:func:`set_up`), poll when the
listening session is refused (:func:`poll_settings`, :func:`polling_status`), refuse a second
loop (:func:`already_serving`), say that they started (:func:`log_started`)
and how long a shutdown may take (:func:`exit_wait_s`), and describe
themselves (:func:`describe`). Those are functions over plain values, not
a base class: the drivers' public members stay their own, each documented
where it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import store
from ..connections import follow_failover
from ..core.clock import Clock
from ..core.handlers import RunningJob
from ..core.settings import (
    EXIT_MARGIN_S,
    RunnerOptions,
    RunnerSettings,
    check_options,
    default_poll_interval,
    pool_shortfall,
)
from ..core.state import RunnerCore
from ..errors import InvalidJob
from ..jobs import JobStep, StepKind
from ..wakeups import WakeupMode, WakeupStatus, check_wakeups, decide, listens_on

__all__ = [
    "Setup",
    "already_serving",
    "describe",
    "exit_wait_s",
    "log_started",
    "poll_settings",
    "polling_status",
    "set_up",
]

E = TypeVar("E", Engine, AsyncEngine)


@dataclass(frozen=True)
class Setup(Generic[E]):
    """What a driver's constructor derives from its arguments."""

    engine: E
    listen_engine: E
    wakeups: WakeupMode
    #: Whether the poll interval is the default's (shortened when the runner cannot listen).
    default_poll: bool
    settings: RunnerSettings
    core: RunnerCore
    #: The wake-ups in force before the runner starts: not started, not listening.
    wakeup_status: WakeupStatus


def set_up(
    kind: str,
    engine: object,
    handlers: Mapping[str, Callable[[RunningJob], Any]] | None,
    listen_engine: object | None,
    options: RunnerOptions,
    *,
    engine_type: type[E],
    other: str,
    stays: Callable[[Any], bool] | None = None,
) -> Setup[E]:
    """Check a driver's arguments and build its settings and core.

    ``kind``: the driver's class name (in errors); ``engine_type``: the
    engine it takes; ``other``: what to use instead for another engine
    (``"sqlalchemy_watchdog.Runner for a sync Engine"``); ``stays``: which
    handlers run in the driver rather than in a process executor's child
    (see :meth:`RunnerSettings.build`)."""
    check_options(kind, options)
    kind_of_engine = engine_type.__name__
    if not isinstance(engine, engine_type):
        raise TypeError(f"{kind} takes an {kind_of_engine}, not {type(engine).__name__} (use {other})")
    if listen_engine is not None and not isinstance(listen_engine, engine_type):
        raise InvalidJob("listen_engine", f"must be an {kind_of_engine}, not {type(listen_engine).__name__}")
    listening: E = listen_engine if listen_engine is not None else engine
    wakeups = check_wakeups(options.get("wakeups", WakeupMode.AUTO))
    follow_failover(engine)
    follow_failover(listening)
    settings = RunnerSettings.build(
        handlers, options, default_poll_interval=default_poll_interval(listens_on(listening, wakeups)), stays=stays
    )
    return Setup(
        engine=engine,
        listen_engine=listening,
        wakeups=wakeups,
        default_poll=options.get("poll_interval") is None,
        settings=settings,
        core=RunnerCore(settings, Clock.of(options), store),
        wakeup_status=WakeupStatus(wakeups, False, "not started", settings.poll_interval_s),
    )


def poll_settings(settings: RunnerSettings, *, default_poll: bool) -> RunnerSettings:
    """The settings of a runner that will not listen: a default poll
    interval becomes the fast one."""
    if not default_poll:
        return settings
    fast = default_poll_interval(False).total_seconds()
    return replace(settings, poll_interval_s=fast)


def polling_status(reason: str, *, wakeups: WakeupMode, listen_engine: Any, settings: RunnerSettings) -> WakeupStatus:
    """The wake-ups in force of a runner that polls for ``reason`` (with
    :func:`poll_settings` already its settings); raises where
    ``wakeups="listen"`` demanded listening (see
    :func:`~sqlalchemy_watchdog.wakeups.decide`)."""
    return decide(wakeups, reason, dialect_name=listen_engine.dialect.name, poll_interval_s=settings.poll_interval_s)


def already_serving(entry: str, kind: str) -> RuntimeError:
    """The refusal of a second loop on one runner (``entry``: what was
    called): a second loop would share its stop event, so leaving either
    would stop both and the outer block's jobs would wait unserved."""
    return RuntimeError(
        f"{entry}: this runner is already serving (in run_forever() or a running() block); "
        "one runner runs one loop -- leave the running block or stop() it first, "
        f"or make a second {kind}"
    )


def log_started(log: logging.Logger, who: str, settings: RunnerSettings, status: WakeupStatus, pool: Any) -> None:
    """The line a runner logs once it serves (``who``: "runner", "async
    runner"), and a warning when its engine's ``pool`` is too small for it."""
    log.info(
        "%s started: queues=%s concurrency=%d%s wakeups=%s shutdown_budget=%gs (grace %gs + stop wait %gs)",
        who,
        ",".join(settings.queues),
        settings.concurrency,
        settings.slots_note,
        status,
        settings.shutdown_budget_s,
        settings.grace_s,
        settings.stop_wait_s,
    )
    shortfall = pool_shortfall(pool, settings)
    if shortfall is not None:
        log.warning("%s: %s", who, shortfall)


def exit_wait_s(settings: RunnerSettings) -> float:
    """How long leaving a ``running()`` block waits for the runner's
    shutdown: its budget and a few seconds for the last statements."""
    return settings.shutdown_budget_s + EXIT_MARGIN_S


def describe(kind: str, settings: RunnerSettings, status: WakeupStatus) -> str:
    """A runner's ``repr``."""
    return f"<{kind} queues={','.join(settings.queues)} concurrency={settings.concurrency} wakeups={status}>"


def _connection_of(session: Any) -> Any:
    """The ``Connection`` of a ``Session`` (its transaction begun), or the connection itself."""
    connection = getattr(session, "connection", None)
    return connection() if callable(connection) else session


def record_step_in(
    session: Any,
    job_id: str,
    claim_token: str,
    name: str,
    kind: StepKind,
    result_json: str | None,
    delay_ms: int | None,
    attempt: int,
) -> JobStep | None:
    """A durable step recorded on the handler's own ``Session`` or
    ``Connection``, in its transaction (``job.transaction_step``)."""
    return store.record_step_in(
        _connection_of(session),
        job_id,
        claim_token,
        name,
        kind=kind,
        result_json=result_json,
        delay_ms=delay_ms,
        attempt=attempt,
    )


async def record_step_in_async(session: Any, *args: Any) -> JobStep | None:
    """:func:`record_step_in` on an ``AsyncSession`` or ``AsyncConnection`` (``transaction_step_async``)."""
    recorded: JobStep | None = await session.run_sync(record_step_in, *args)
    return recorded


def step_writer(run: Callable[..., Any]) -> Callable[..., Any]:
    """``write(job_id, token, name, kind, result_json, delay_ms, attempt)``
    through a driver's ``run`` of a declared store operation."""

    def write(
        job_id: str, token: str, name: str, kind: StepKind, result_json: str | None, delay_ms: int | None, attempt: int
    ) -> Any:
        return run(
            store.record_step,
            job_id,
            token,
            name,
            kind=kind,
            result_json=result_json,
            delay_ms=delay_ms,
            attempt=attempt,
        )

    return write
