"""One driver for both runners, so a conformance test is written once.

A test asks for the ``runners`` fixture (tests/conftest.py), which is a
:class:`RunnerDriver` of the test's runner kind -- ``sync`` (:class:`Runner`,
handler threads) or ``async`` (:class:`AsyncRunner` on an ``AsyncEngine``,
driven on a private event loop in a thread) -- on the test's database
(``dialect``). Only the public API of the runners is used:

    def test_x(engine, runners):
        worker = runners.runner({"q": handler}, lease=..., poll_interval=...)
        worker.tick()                      # TickResult
        worker.run_until_idle()            # [JobView]
        with worker.serving():             # run_forever in the background,
            ...                            # stop() and joined on exit
        future = worker.tick_in_background()

Handlers are plain functions, written once: ``Runner`` calls them in its
threads, ``AsyncRunner`` in daemon threads of its own.

The ``process`` and ``async-process`` kinds are ``Runner`` and
``AsyncRunner`` with the process executor: their plain handlers run in
child processes, so they must be importable module-level functions
(tests/process_handlers.py has them, and the conformance tests of the
process executor in tests/integration/test_process_executor.py). There
``concurrency=`` becomes ``ProcessExecutor(processes=...)``, and a
one-second ``kill_grace`` is the default.
Where the behaviour is about coroutine handlers (a stop cancels the task),
give :func:`dual` both shapes: the ``async`` kind then runs the coroutine.

Each runner gets an engine of its own on the test's database (a sync one,
or an ``AsyncEngine`` made on the driver's loop), so SQLAlchemy events can
be put on the runner's engine alone (``listen={"before_cursor_execute":
fn}``), and a runner can be built on another URL (``url=``). The test reads
and writes through its own sync ``engine``, whatever the kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sqlalchemy_watchdog import JobView, ProcessExecutor, Runner, RunningJob, TickResult
from sqlalchemy_watchdog.asyncio import AsyncRunner

T = TypeVar("T")

KINDS = ["sync", "async", "process", "async-process"]
#: The kinds whose plain handlers run in child processes.
PROCESS_KINDS = ("process", "async-process")
#: The process kinds' kill grace unless a test gives ``executor=``.
KILL_GRACE = timedelta(seconds=1)


class Dual:
    """A handler with a plain and a coroutine shape: the ``sync`` kind calls
    :attr:`plain`, the ``async`` kind runs :attr:`coroutine` as a task."""

    def __init__(self, plain: Callable[[RunningJob], Any], coroutine: Callable[[RunningJob], Any]) -> None:
        self.plain = plain
        self.coroutine = coroutine

    def __call__(self, job: RunningJob) -> Any:
        return self.plain(job)


def dual(plain: Callable[[RunningJob], Any], coroutine: Callable[[RunningJob], Any]) -> Dual:
    """The handler ``plain`` for Runner, ``coroutine`` for AsyncRunner."""
    return Dual(plain, coroutine)


def async_url(url: URL) -> URL:
    """``url`` with the async driver of its database: aiosqlite, aiomysql (MariaDB), async psycopg."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return url.set(drivername="sqlite+aiosqlite")
    if backend in ("mysql", "mariadb"):
        return url.set(drivername=f"{backend}+aiomysql")
    return url.set(drivername="postgresql+psycopg")


class _Loop:
    """An event loop running in a daemon thread; :meth:`run` a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-event-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 120) -> T:
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` on the loop's thread and wait for it."""

        async def call() -> None:
            fn()

        self.run(call())

    def cancel_tasks(self) -> None:
        """Cancel every task still on the loop (a handler a test abandoned)."""

        async def cancel_leftovers() -> None:
            current = asyncio.current_task()
            leftovers = [t for t in asyncio.all_tasks() if t is not current]
            for task in leftovers:
                task.cancel()
            await asyncio.wait(leftovers, timeout=5) if leftovers else None

        with contextlib.suppress(Exception):
            self.run(cancel_leftovers(), timeout=10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class DrivenRunner:
    """A runner of either kind behind one blocking interface."""

    def __init__(self, driver: RunnerDriver, runner: Runner | AsyncRunner) -> None:
        self.driver = driver
        self.runner = runner

    @property
    def queues(self) -> tuple[str, ...]:
        return self.runner.queues

    def _await(self, make: Callable[[], Any]) -> Any:
        loop = self.driver._loop
        if loop is None:
            return make()

        async def call() -> Any:
            return await make()

        return loop.run(call())

    def tick(self) -> TickResult:
        result: TickResult = self._await(self.runner.tick)
        return result

    def run_until_idle(self, *, max_ticks: int | None = None) -> list[JobView]:
        jobs: list[JobView] = self._await(lambda: self.runner.run_until_idle(max_ticks=max_ticks))
        return jobs

    def tick_in_background(self) -> Future[TickResult]:
        """``tick()`` started now, its result in the returned future."""
        loop = self.driver._loop
        if loop is not None:
            assert isinstance(self.runner, AsyncRunner)
            return loop.submit(self.runner.tick())
        future: Future[TickResult] = Future()

        def tick() -> None:
            try:
                future.set_result(self.runner.tick())  # type: ignore[arg-type]
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=tick, name="test-tick", daemon=True).start()
        return future

    def start(self) -> Future[None]:
        """``run_forever(install_signal_handlers=False)`` in the background."""
        loop = self.driver._loop
        if loop is not None:
            assert isinstance(self.runner, AsyncRunner)
            return loop.submit(self.runner.run_forever(install_signal_handlers=False))
        future: Future[None] = Future()
        runner = self.runner
        assert isinstance(runner, Runner)

        def serve() -> None:
            try:
                runner.run_forever(install_signal_handlers=False)
                future.set_result(None)
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=serve, name="test-runner", daemon=True).start()
        return future

    def stop(self) -> None:
        """Ask ``run_forever`` to shut down (on the loop's thread for AsyncRunner)."""
        loop = self.driver._loop
        if loop is None:
            self.runner.stop()
        else:
            loop.call(self.runner.stop)

    @contextlib.contextmanager
    def serving(self, timeout: float = 30) -> Iterator[Future[None]]:
        """Serve in the background; on exit stop and wait for ``run_forever``
        to return (failing the test if it does not, or if it raised)."""
        future = self.start()
        try:
            yield future
        finally:
            self.stop()
            future.result(timeout)


class RunnerDriver:
    """Builds runners of one kind on one database; closes them all at the end."""

    def __init__(self, kind: str, url: URL) -> None:
        if kind not in KINDS:
            raise ValueError(kind)
        self.kind = kind
        self.url = url
        self._loop: _Loop | None = _Loop() if kind in ("async", "async-process") else None
        self._engines: list[Engine | AsyncEngine] = []

    @property
    def is_async(self) -> bool:
        return self._loop is not None

    def runner(
        self,
        handlers: Mapping[str, Callable[[RunningJob], Any]] | None,
        *,
        url: URL | None = None,
        listen: Mapping[str, Callable[..., Any]] | None = None,
        **settings: Any,
    ) -> DrivenRunner:
        """A runner of this driver's kind with ``handlers`` and ``settings``
        (the keyword arguments of ``Runner``), on an engine of its own on
        ``url`` (default: the test's database) with the SQLAlchemy engine
        events ``listen`` ({event name: function}) registered on it."""
        target = url if url is not None else self.url
        if self.kind in PROCESS_KINDS and "executor" not in settings:
            processes = settings.pop("concurrency", 2)
            settings["executor"] = ProcessExecutor(processes=processes, kill_grace=KILL_GRACE)
        if handlers is not None and self.is_async:
            handlers = {q: (h.coroutine if isinstance(h, Dual) else h) for q, h in handlers.items()}
        if self._loop is None:
            engine = create_engine(target)
            self._engines.append(engine)
            for name, fn in (listen or {}).items():
                event.listen(engine, name, fn)
            return DrivenRunner(self, Runner(engine, handlers, **settings))

        async def build() -> AsyncRunner:
            aengine = create_async_engine(async_url(target))
            self._engines.append(aengine)
            for name, fn in (listen or {}).items():
                event.listen(aengine.sync_engine, name, fn)
            return AsyncRunner(aengine, handlers, **settings)

        return DrivenRunner(self, self._loop.run(build()))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel_tasks()
        for engine in self._engines:
            if isinstance(engine, AsyncEngine):
                assert self._loop is not None
                with contextlib.suppress(Exception):
                    self._loop.run(engine.dispose(), timeout=30)
            else:
                engine.dispose()
        self._engines.clear()
        if self._loop is not None:
            self._loop.close()
