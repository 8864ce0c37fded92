"""A worker process for the fault tests: ``Runner.run_forever`` with handlers
that leave an audit trail, and hooks to die at precise moments.

    python tests/faults/chaos_worker.py --url URL [--queue chaos] [--concurrency N]
        [--lease S] [--heartbeat S] [--poll S] [--grace S] [--clock-offset-ms MS] [--claim-ahead N]
        [--kill-in-settle JOB_ID --kill-phase before|after] [--asyncio [--plain]] [--pooled]

With ``--asyncio`` it runs an ``AsyncRunner`` (``asyncio.run(runner.run_forever())``
on an ``AsyncEngine``) with the coroutine twin of the handler: the same
audit rows (through the runner's AsyncEngine), a stop arrives as the cancellation
of its task (recorded, then re-raised), and ``ignore_stop`` is a blocking
call in a thread, as a plain function that never looks at its stop. With
``--plain`` too, the ``AsyncRunner`` is given the plain handler of the sync
worker instead (it runs it in a thread of its own), its audit rows written
through a sync engine.

A job's payload says what its handler does (``{"action": ...}``):

* ``quick`` (default): write the audit start and end rows, return completed.
* ``sleep``: wait ``seconds`` for ``stop_requested``; a stop is recorded and
  raised (the settle then decides what counts).
* ``block``: like ``sleep`` with ``seconds`` = 600: runs until told to stop.
* ``ignore_stop``: sleep ``seconds`` without looking at ``stop_requested``
  (the stop reason it was given, if any, is recorded all the same).
* ``ignore_cancel`` (``--asyncio``): sleep ``seconds``, swallowing every
  cancellation of its task -- an async handler that ignores its stop.
* ``fail``: return ``Decision.failed("chaos failure")`` (retryable).
* ``steps``: ``steps`` durable steps (``job.transaction_step``), ``gap``
  seconds apart, each inserting its effect row into ``fault_step_effects``
  (the test creates it) in the step's own transaction.
* ``saga``: ``steps`` durable steps (``job.step``), each naming an undo that
  sleeps ``gap`` seconds, then inserts its effect row into
  ``fault_saga_effects`` (the test creates it); then raises: a job with no
  retry left compensates (its undos run, last first). With ``hang`` (seconds):
  one more step first, which sleeps that long (a kill lands in it).
* ``noop``: return at once -- or after ``seconds``, if given --, writing no
  audit row (a warm-up: a runner that ran it knows its handlers are short,
  and claims ahead while they run several of its round trips).

``{"no_end": true}`` leaves the audit end row out: the handler's last
database write is its start row, so it returns (and its job settles)
without touching the database -- during an outage too.

``{"per_attempt": {"1": ACTION, ...}}`` picks the action of an attempt
(``RunningJob.attempt``) instead of ``action``. ``{"only_first": N}``
applies the chosen action to runs with ``recovery_count < N`` only; later
runs (after a recovery) are ``quick``.

Every execution inserts a ``fault_audit`` row when it starts (the moment the
handler was called, the database clock when the row is written, and the
job's lease at that moment; its ``note`` says ``attempt N``) in a
transaction of its own, and stamps its end (``note``: ``attempt N: ACTION``),
so the tests can see every run -- including runs whose process was killed
before its settlement committed.

``--kill-in-settle JOB_ID`` SIGKILLs this process inside the settle of that
job: ``before`` the settle statement runs (the handler has returned and its
side effects are committed), or ``after`` it ran but before its transaction
committed.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import functools
import logging
import os
import signal
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sqlalchemy import Engine, create_engine, insert, literal, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from sqlalchemy_watchdog import Decision, Runner, RunningJob, store
from sqlalchemy_watchdog.asyncio import AsyncRunner, run_store
from sqlalchemy_watchdog.core import ahead as ahead_rules
from sqlalchemy_watchdog.drivers import asyncio as async_driver
from sqlalchemy_watchdog.drivers import sync as sync_driver
from sqlalchemy_watchdog.errors import WatchdogError
from sqlalchemy_watchdog.model import jobs_table
from sqlalchemy_watchdog.store import sql
from tests.faults.helpers import audit

log = logging.getLogger("chaos_worker")


def _audit_write(engine: Engine, stmt: Any, what: str) -> None:
    """Write an audit row in a committed transaction of its own, riding out
    a database restart (the audit trail must not be the thing that fails)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with store.write_transaction(engine) as conn:
                conn.execute(stmt)
            return
        except DBAPIError as error:
            if time.monotonic() > deadline:
                raise
            log.warning("audit %s failed (%s); retrying", what, type(error).__name__)
            time.sleep(0.2)


def _durable_steps(engine: Engine, job: RunningJob, payload: dict[str, Any], pid: int) -> None:
    """``steps``: ``job.transaction_step`` ``steps`` times, each inserting its
    effect row into ``fault_step_effects`` in the step's own transaction,
    ``gap`` seconds apart (a kill lands between steps, or inside one)."""
    for index in range(int(payload.get("steps", 3))):
        with Session(engine) as session:

            def effect(index: int = index, session: Session = session) -> int:
                session.execute(
                    text("INSERT INTO fault_step_effects (job_id, step, pid) VALUES (:job, :step, :pid)"),
                    {"job": job.job_id, "step": index, "pid": pid},
                )
                return index

            job.transaction_step(session, f"step-{index}", effect)
        time.sleep(float(payload.get("gap", 0.3)))


def _saga(engine: Engine, job: RunningJob, payload: dict[str, Any], pid: int) -> None:
    """``saga``: ``steps`` durable steps with undos, then a failure (compensation)."""
    gap = float(payload.get("gap", 0.3))

    def undo(index: int) -> Any:
        def run(result: int) -> None:
            time.sleep(gap)  # a kill lands here, between undos
            with engine.begin() as conn:
                conn.execute(
                    text("INSERT INTO fault_saga_effects (job_id, step, pid, at_ns) VALUES (:job, :step, :pid, :at)"),
                    {"job": job.job_id, "step": result, "pid": pid, "at": time.time_ns()},
                )

        return run

    steps = int(payload.get("steps", 3))
    for index in range(steps):
        job.step(f"step-{index}", lambda index=index: index, undo=undo(index))
    if payload.get("hang"):
        # Inside one more step, never recorded: the worker is killed here.
        job.step(f"step-{steps}", lambda: time.sleep(float(payload["hang"])), undo=undo(steps))
    raise RuntimeError("the saga failed: compensate")


def make_handler(engine: Engine):  # type: ignore[no-untyped-def]
    pid = os.getpid()

    def handle(job: RunningJob) -> Decision | None:
        called = store.now_ms()
        payload = job.payload if isinstance(job.payload, dict) else {}
        if payload.get("action") == "noop":
            time.sleep(float(payload.get("seconds", 0)))
            return None  # no audit rows: a run as short as a handler gets (or just its sleep)
        action = payload.get("per_attempt", {}).get(str(job.attempt), payload.get("action", "quick"))
        if job.recovery_count >= payload.get("only_first", 1 << 30):
            action = "quick"  # the chaos applies to the first run(s) only
        exec_id = uuid.uuid4().hex
        clock = sql.db_clock_ms()
        lease = select(jobs_table.c.lease_until).where(jobs_table.c.job_id == job.job_id).scalar_subquery()
        _audit_write(
            engine,
            insert(audit).values(
                job_id=job.job_id,
                exec_id=exec_id,
                pid=pid,
                recovery_count=job.recovery_count,
                called_ms=called,
                started_ms=clock,
                lease_seen=lease,
                note=f"attempt {job.attempt}",
            ),
            "start",
        )
        stopped = None
        told = None  # the stop reason an ignore_stop handler was given (not acted on)
        if action == "sleep" or action == "block":
            seconds = float(payload.get("seconds", 600))
            if job.stop_requested.wait(seconds):
                stopped = job.stop_reason.value if job.stop_reason else "unknown"
        elif action == "ignore_stop":
            time.sleep(float(payload.get("seconds", 600)))
            told = job.stop_reason.value if job.stop_reason else None
        elif action == "steps":
            _durable_steps(engine, job, payload, pid)
        elif action == "saga":
            _saga(engine, job, payload, pid)
        if payload.get("no_end") and stopped is None:
            return None
        _audit_write(
            engine,
            update(audit)
            .where(audit.c.exec_id == exec_id)
            .values(
                ended_ms=sql.db_clock_ms(),
                stop_reason=stopped or told,
                note=literal(f"attempt {job.attempt}: {action}"),
            ),
            "end",
        )
        if stopped is not None:
            raise RuntimeError(f"stopped: {stopped}")
        if action == "fail":
            return Decision.failed("chaos failure")
        return None

    return handle


def _execute(conn: Any, stmt: Any) -> None:
    conn.execute(stmt)


async def _audit_write_async(aengine: AsyncEngine, stmt: Any, what: str) -> None:
    """:func:`_audit_write` on the worker's AsyncEngine (its one pool)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await run_store(aengine, _execute, stmt)
            return
        except (DBAPIError, WatchdogError) as error:
            if time.monotonic() > deadline:
                raise
            log.warning("audit %s failed (%s); retrying", what, type(error).__name__)
            await asyncio.sleep(0.2)


async def _in_daemon_thread(fn: Any, *args: Any) -> Any:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        result = fn(*args)

        def settle() -> None:
            if not future.done():
                future.set_result(result)

        loop.call_soon_threadsafe(settle)

    threading.Thread(target=run, daemon=True).start()
    return await future


def make_async_handler(aengine: AsyncEngine):  # type: ignore[no-untyped-def]
    """The coroutine twin of :func:`make_handler`'s handler, writing its
    audit rows through the runner's own AsyncEngine."""
    pid = os.getpid()

    async def handle(job: RunningJob) -> Decision | None:
        called = store.now_ms()
        payload = job.payload if isinstance(job.payload, dict) else {}
        if payload.get("action") == "noop":
            await asyncio.sleep(float(payload.get("seconds", 0)))
            return None  # no audit rows: a run as short as a handler gets (or just its sleep)
        action = payload.get("per_attempt", {}).get(str(job.attempt), payload.get("action", "quick"))
        if job.recovery_count >= payload.get("only_first", 1 << 30):
            action = "quick"
        exec_id = uuid.uuid4().hex
        lease = select(jobs_table.c.lease_until).where(jobs_table.c.job_id == job.job_id).scalar_subquery()
        start = insert(audit).values(
            job_id=job.job_id,
            exec_id=exec_id,
            pid=pid,
            recovery_count=job.recovery_count,
            called_ms=called,
            started_ms=sql.db_clock_ms(),
            lease_seen=lease,
            note=f"attempt {job.attempt}",
        )
        await _audit_write_async(aengine, start, "start")

        def end(stopped: str | None) -> Any:
            return (
                update(audit)
                .where(audit.c.exec_id == exec_id)
                .values(
                    ended_ms=sql.db_clock_ms(),
                    stop_reason=stopped,
                    note=literal(f"attempt {job.attempt}: {action}"),
                )
            )

        if action == "sleep" or action == "block":
            try:
                await asyncio.sleep(float(payload.get("seconds", 600)))
            except asyncio.CancelledError:
                stopped = job.stop_reason.value if job.stop_reason else "unknown"
                await _audit_write_async(aengine, end(stopped), "end")
                raise
            if payload.get("no_end"):
                return None
        elif action == "ignore_stop":
            # A blocking call the task's cancellation cannot reach, in a daemon
            # thread: asyncio.to_thread's would hold the process at exit.
            await _in_daemon_thread(time.sleep, float(payload.get("seconds", 600)))
        elif action == "ignore_cancel":
            told = None
            deadline = time.monotonic() + float(payload.get("seconds", 600))
            while (left := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.sleep(left)
                except asyncio.CancelledError:  # ignoring its stop is the point
                    told = job.stop_reason.value if job.stop_reason else "unknown"
            await _audit_write_async(aengine, end(told), "end")
            return None
        await _audit_write_async(aengine, end(None), "end")
        if action == "fail":
            return Decision.failed("chaos failure")
        return None

    return handle


def async_url(url: str) -> str:
    """``url`` with the async driver of its database: aiosqlite, aiomysql
    (MariaDB and MySQL), async psycopg."""
    backend, rest = url.split(":", 1)
    name = backend.split("+", 1)[0]
    if name == "sqlite":
        return "sqlite+aiosqlite:" + rest
    if name in ("mysql", "mariadb"):
        return f"{name}+aiomysql:" + rest
    return "postgresql+psycopg:" + rest


def install_settle_kill(job_ids: set[str], phase: str) -> None:
    """SIGKILL this process inside the settle of one of ``job_ids``.

    The runner settles through ``store.settle`` or, batched, through
    ``store.settle_many``; both are wrapped (module attributes, looked up at
    call time by the runner).
    """

    def die(job_id: str, where: str) -> None:
        log.warning("chaos: SIGKILL %s of %s", where, job_id)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # pragma: no cover - never reached

    def wrap(real: Any, victims_of: Any) -> Any:
        @functools.wraps(real)  # keeps the store operation's declaration
        def wrapper(conn: Any, *args: Any, **kwargs: Any) -> Any:
            victims = victims_of(*args, **kwargs) & job_ids
            if not victims:
                return real(conn, *args, **kwargs)
            victim = min(victims)
            if phase == "before":
                die(victim, "before the settle statement")
            real(conn, *args, **kwargs)
            die(victim, "after the settle statement, before its commit")

        return wrapper

    if hasattr(store, "settle_many"):
        store.settle_many = wrap(store.settle_many, lambda requests, *a, **k: {r.job_id for r in requests})
    store.settle = wrap(store.settle, lambda *a, **k: {k["job_id"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--queue", action="append")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--claim-ahead", type=int, default=None, help="the runner's claim_ahead (default: its own)")
    parser.add_argument(
        "--claim-ahead-of-any-handler",
        action="store_true",
        help="claim ahead up to the cap whatever the handlers' run time (AHEAD_MIN_ROUND_TRIPS 0, AHEAD_HORIZON_S"
        " an hour), and keep jobs claimed ahead waiting for a slot for a minute before giving them back",
    )
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--clock-offset-ms", type=int, default=0)
    parser.add_argument("--kill-in-settle", action="append", default=[])
    parser.add_argument("--kill-phase", choices=("before", "after"), default="before")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--asyncio", action="store_true", help="run an AsyncRunner instead")
    parser.add_argument("--plain", action="store_true", help="with --asyncio: give it the plain handler")
    parser.add_argument("--pooled", action="store_true", help="behind PgBouncer: psycopg's prepare_threshold=None")
    args = parser.parse_args(argv)
    # SIGUSR1 prints every thread's stack to the log: how a test reports a worker that hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s {args.name}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    # Behind a pooler in transaction mode: no prepared statements (the deployment guide's setting).
    pooled: dict[str, Any] = {"prepare_threshold": None} if args.pooled else {}
    engine = create_engine(args.url, connect_args=pooled)
    if args.kill_in_settle:
        install_settle_kill(set(args.kill_in_settle), args.kill_phase)
    queues = args.queue or ["chaos"]
    offset = args.clock_offset_ms
    settings: dict[str, Any] = dict(
        concurrency=args.concurrency,
        lease=timedelta(seconds=args.lease),
        heartbeat=timedelta(seconds=args.heartbeat),
        poll_interval=timedelta(seconds=args.poll),
        grace=timedelta(seconds=args.grace),
        clock=(lambda: store.now_ms() + offset) if offset else store.now_ms,
    )
    if args.claim_ahead is not None:
        settings["claim_ahead"] = args.claim_ahead
    if args.claim_ahead_of_any_handler:
        # A test that needs jobs claimed ahead and waiting: on a loaded machine a
        # no-op's measured run time could shrink the horizon's share below the cap,
        # and jobs waiting behind blocked slots were given back after a second,
        # before the test saw them all claimed.
        ahead_rules.AHEAD_MIN_ROUND_TRIPS = 0.0
        ahead_rules.AHEAD_HORIZON_S = 3600.0
        ahead_rules.AHEAD_WAIT_MAX_S = 60.0
        sync_driver.AHEAD_WAIT_MAX_S = 60.0  # type: ignore[attr-defined]  # the name the driver imported
        async_driver.AHEAD_WAIT_MAX_S = 60.0  # type: ignore[attr-defined]
    if args.asyncio:
        if not args.plain:
            engine.dispose()  # the async worker uses its AsyncEngine alone

        async def serve() -> None:
            aengine = create_async_engine(async_url(args.url), connect_args=pooled)
            try:
                handle = make_handler(engine) if args.plain else make_async_handler(aengine)
                runner = AsyncRunner(aengine, {queue: handle for queue in queues}, **settings)
                print("chaos-worker ready", file=sys.stderr, flush=True)
                await runner.run_forever()
            finally:
                await aengine.dispose()

        asyncio.run(serve())
    else:
        runner = Runner(engine, {queue: make_handler(engine) for queue in queues}, **settings)
        print("chaos-worker ready", file=sys.stderr, flush=True)
        runner.run_forever()
    print("chaos-worker exited", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
