"""The dashboard application: :func:`create_app` wires the pages
(:mod:`.pages`), the guards (:mod:`.security`) and the template filters
(:mod:`.filters`) into a Starlette application.

Every read and every action goes through :class:`~sqlalchemy_watchdog.Watchdog`
(a sync ``Engine``, called in Starlette's thread pool) or
:class:`~sqlalchemy_watchdog.asyncio.AsyncWatchdog` (an ``AsyncEngine``): the
dashboard adds no SQL of its own.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..asyncio import AsyncWatchdog
from ..connections import follow_failover
from ..gateway import SyncGateway
from .filters import FILTERS
from .pages import _Pages, _Settings
from .security import Authorize, Identify, _check_base_path, _Csrf, _SecurityHeaders, _Viewers, scope_user

__all__ = ["create_app"]

T = TypeVar("T")
P = ParamSpec("P")

_HERE = Path(__file__).resolve().parent


# -- the library, sync or async ------------------------------------------------------


class _ThreadedGateway:
    """A :class:`~sqlalchemy_watchdog.gateway.SyncGateway`'s calls in the
    thread pool: the dashboard's operations over a sync ``Engine`` are
    :class:`AsyncWatchdog`'s, each store call run in a worker thread."""

    def __init__(self, engine: Engine) -> None:
        self._gateway = SyncGateway(engine)

    async def run(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_in_threadpool(lambda: self._gateway.run(fn, *args, **kwargs))

    async def read(self, fn: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_in_threadpool(lambda: self._gateway.read(fn, *args, **kwargs))


def _client(engine: Engine | AsyncEngine) -> AsyncWatchdog:
    """The library's operations as coroutines, over a sync or an async engine."""
    if isinstance(engine, AsyncEngine):
        return AsyncWatchdog(engine)
    if isinstance(engine, Engine):
        follow_failover(engine)
        return AsyncWatchdog._over(_ThreadedGateway(engine))
    raise TypeError(f"create_app takes an Engine or an AsyncEngine, not {type(engine).__name__}")


def create_app(
    engine: Engine | AsyncEngine,
    *,
    read_only: bool = False,
    authorize: Authorize | None = None,
    identify: Identify | None = None,
    base_path: str | None = None,
    secret: str | bytes | None = None,
    refresh_seconds: float = 5.0,
    title: str = "sqlalchemy-watchdog",
) -> Starlette:
    """The dashboard as an ASGI application (Starlette).

    Mount it under any path of a Starlette or FastAPI app
    (``app.mount("/watchdog", create_app(engine))``) or serve it alone
    (``sqlalchemy-watchdog dashboard``).

    :param engine: a sync ``Engine`` (its calls run in the thread pool) or an
        ``AsyncEngine``, on a database holding the ``watchdog_jobs`` table.
    :param read_only: hide every action and refuse every POST (403).
    :param authorize: ``authorize(request, action) -> bool``, or a coroutine
        function: asked with ``"view"`` before any page is shown and with the
        action's name (:data:`ACTIONS`) before an action runs and to decide
        which buttons a page shows; False gives 403. None allows everything
        to anyone who reaches the application: put it behind your own
        authentication, or bind it to 127.0.0.1 (what the CLI does).
    :param identify: ``identify(request) -> str | None``, or a coroutine
        function: who the request is (a user id, a session id). Each
        form's CSRF token is bound to it, so a token issued to one identity
        is refused for another. Default: :func:`scope_user` (the user of
        Starlette's ``AuthenticationMiddleware``, if any).
    :param base_path: the path the browser sees the dashboard under, for its
        links (e.g. behind a proxy that strips a prefix); default: the ASGI
        ``root_path``, which ``Mount`` sets.
    :param secret: the key signing the CSRF cookie; default: a random key
        per process (tokens of other processes are then refused: give one
        secret to every process behind a load balancer).
    :param refresh_seconds: how often the overview refreshes itself (0: never).
    :param title: the page title.
    """
    if not isinstance(read_only, bool):
        raise TypeError(f"read_only must be a bool, not {type(read_only).__name__}")
    if authorize is not None and not callable(authorize):
        raise TypeError(f"authorize must be callable, not {type(authorize).__name__}")
    if identify is not None and not callable(identify):
        raise TypeError(f"identify must be callable, not {type(identify).__name__}")
    if base_path is not None:
        base_path = _check_base_path(base_path)
    if isinstance(secret, str):
        secret = secret.encode()
    if secret is not None and (not isinstance(secret, bytes) or len(secret) < 16):
        raise ValueError("secret must be at least 16 bytes (or characters) long")
    if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, (int, float)) or refresh_seconds < 0:
        raise ValueError(f"refresh_seconds must be a number >= 0, got {refresh_seconds!r}")
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(["html"], default_for_string=True, default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    settings = _Settings(
        client=_client(engine),
        read_only=read_only,
        authorize=authorize,
        identify=identify if identify is not None else scope_user,
        base_path=base_path,
        csrf=_Csrf(secret or secrets.token_bytes(32)),
        refresh_seconds=float(refresh_seconds),
        title=title,
        env=env,
    )
    pages = _Pages(settings)
    routes = [
        Route("/", pages.overview, methods=["GET"], name="overview"),
        Route("/overview.fragment", pages.overview_fragment, methods=["GET"], name="overview_fragment"),
        Route("/jobs", pages.jobs, methods=["GET"], name="jobs"),
        Route("/job", pages.job, methods=["GET"], name="job"),
        Route("/lane", pages.lane, methods=["GET"], name="lane"),
        Route("/workers", pages.workers, methods=["GET"], name="workers"),
        Route("/actions/{action}", pages.action, methods=["POST"], name="action"),
        Mount("/static", app=_Viewers(pages, StaticFiles(directory=_HERE / "static")), name="static"),
    ]
    return Starlette(
        routes=routes,
        # Starlette's own answers (an unknown path: 404, a wrong method: 405)
        # are the dashboard's error pages, asked of authorize like any page.
        exception_handlers={HTTPException: pages.http_error},
        middleware=[Middleware(_SecurityHeaders)],
    )
