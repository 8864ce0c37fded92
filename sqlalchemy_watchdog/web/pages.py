"""The dashboard's pages and actions: each page's context, rendered by its
template; each action's form, checked, run through the library and told in
its words.
"""

from __future__ import annotations

import hashlib
import inspect
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from jinja2 import Environment
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..asyncio import AsyncWatchdog
from ..errors import InvalidJob, WatchdogError
from ..jobs import (
    LIMIT_MAX,
    BulkResult,
    BulkSkip,
    JobState,
    JobView,
    Outcome,
    QueueLimits,
    Rate,
)
from . import chart
from .filters import _ENCODED
from .security import (
    _COOKIE,
    _FIELD,
    _SECURITY_HEADERS,
    ACTIONS,
    DESTRUCTIVE_ACTIONS,
    VIEW,
    Authorize,
    Identify,
    _Csrf,
    _origin_refusal,
    _Refused,
)

#: The largest action form accepted, in bytes.
_FORM_MAX_BYTES = 64 * 1024
#: The page sizes the job list offers (``list_jobs`` takes up to 1,000).
PAGE_SIZES = (25, 50, 100, 250, 1000)
_DEFAULT_PAGE = 50
#: ``fail_lane`` settles one batch per call; the dashboard calls it at most this often per click.
_LANE_BATCHES_MAX = 100


@dataclass(frozen=True)
class _Settings:
    client: AsyncWatchdog
    read_only: bool
    authorize: Authorize | None
    identify: Identify
    base_path: str | None
    csrf: _Csrf
    refresh_seconds: float
    title: str
    env: Environment


class _Pages:
    def __init__(self, settings: _Settings) -> None:
        self.s = settings

    # -- rendering ---------------------------------------------------------------

    def _prefix(self, request: Request) -> str:
        if self.s.base_path is not None:
            return self.s.base_path
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def _allowed(self, request: Request) -> dict[str, bool]:
        """Which actions this request may run (all False when read-only)."""
        if self.s.read_only:
            return dict.fromkeys(ACTIONS, False)
        return {action: await self._authorized(request, action) for action in ACTIONS}

    async def _authorized(self, request: Request, action: str) -> bool:
        if self.s.authorize is None:
            return True
        verdict = self.s.authorize(request, action)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    async def _identity(self, request: Request) -> str:
        identity = self.s.identify(request)
        if inspect.isawaitable(identity):
            identity = await identity
        return "" if identity is None else str(identity)

    def _cookie_name(self, request: Request) -> str:
        """Over https, ``__Host-``: a browser takes such a cookie only from
        this very host, over https, for path ``/`` -- a sibling subdomain
        cannot plant one. The mount path tells dashboards on one host apart."""
        if request.url.scheme != "https":
            return _COOKIE
        prefix = self._prefix(request)
        suffix = f"-{hashlib.sha256(prefix.encode()).hexdigest()[:12]}" if prefix else ""
        return f"__Host-{_COOKIE}{suffix}"

    def _nonce(self, request: Request) -> tuple[str, bool]:
        """The session's CSRF nonce, and whether it is new (to be set as a cookie)."""
        nonce = self.s.csrf.nonce_of(request.cookies.get(self._cookie_name(request)))
        if nonce is not None:
            return nonce, False
        return secrets.token_urlsafe(32), True

    async def _render(self, request: Request, template: str, context: Mapping[str, Any], status: int = 200) -> Response:
        prefix = self._prefix(request)
        # A visitor authorize refuses gets no token and no cookie, 403 pages included.
        viewer = await self._authorized(request, VIEW)
        token, new = "", False
        if viewer:
            nonce, new = self._nonce(request)
            token = self.s.csrf.form_token(nonce, await self._identity(request))

        def href(path: str, /, **params: Any) -> str:
            query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
            return f"{prefix}{path}" + (f"?{query}" if query else "")

        page = self.s.env.get_template(template).render(
            {
                "title": self.s.title,
                "read_only": self.s.read_only,
                "allowed": await self._allowed(request) if viewer else dict.fromkeys(ACTIONS, False),
                "destructive": DESTRUCTIVE_ACTIONS,
                "csrf_field": _FIELD,
                "csrf_token": token,
                "href": href,
                "static": lambda name: f"{prefix}/static/{name}",
                "refresh_seconds": self.s.refresh_seconds,
                "new_id": lambda: f"dashboard-{secrets.token_hex(6)}",
                "states": [state.value for state in JobState],
                "outcomes": [outcome.value for outcome in Outcome],
                "settled_within": list(SETTLED_WITHIN),
                **context,
            }
        )
        response = HTMLResponse(page, status_code=status, headers=_SECURITY_HEADERS)
        if new:
            https = request.url.scheme == "https"
            response.set_cookie(
                self._cookie_name(request),
                self.s.csrf.cookie_value(nonce),
                path="/" if https else prefix or "/",
                httponly=True,
                samesite="strict",
                secure=https,
            )
        return response

    async def _guarded(
        self, request: Request, template: str, build: Callable[[], Awaitable[Mapping[str, Any]]]
    ) -> Response:
        """Check ``view``, build the page's context, render; errors as pages."""
        if not await self._authorized(request, VIEW):
            return await self._error(request, 403, "You may not view this dashboard.")
        try:
            context = await build()
        except _NotFound as missing:
            return await self._error(request, 404, str(missing))
        except InvalidJob as error:
            return await self._error(request, 400, str(error))
        except WatchdogError as error:
            return await self._error(request, 503, f"The database could not answer: {error}")
        return await self._render(request, template, context)

    async def http_error(self, request: Request, error: Exception) -> Response:
        """Starlette's own refusals (404, 405) as error pages; a visitor
        ``authorize`` refuses gets 403 instead, as on every page."""
        if not await self._authorized(request, VIEW):
            return await self._error(request, 403, "You may not view this dashboard.")
        status = error.status_code if isinstance(error, HTTPException) else 500
        messages = {404: "There is no such page.", 405: "This page does not take that method."}
        response = await self._error(request, status, messages.get(status, "This request cannot be answered."))
        if isinstance(error, HTTPException) and error.headers:
            response.headers.update(error.headers)  # 405's Allow
        return response

    async def _error(self, request: Request, status: int, message: str) -> Response:
        return await self._render(request, "error.html", {"status": status, "message": message}, status)

    # -- pages -------------------------------------------------------------------------

    async def _overview_context(self) -> dict[str, Any]:
        stats = await self.s.client.stats()
        throughput = await self.s.client.throughput()
        return {
            "stats": stats,
            "chart": chart.render(throughput),
            "paused": [queue for queue in stats.queues if queue.paused],
            "limited": [queue for queue in stats.queues if queue.limits is not None],
            "unserved": [queue for queue in stats.queues if queue.unserved],
        }

    async def overview(self, request: Request) -> Response:
        return await self._guarded(request, "overview.html", self._overview_context)

    async def overview_fragment(self, request: Request) -> Response:
        return await self._guarded(request, "_overview.html", self._overview_context)

    async def jobs(self, request: Request) -> Response:
        query = request.query_params

        async def build() -> dict[str, Any]:
            filters = _filters(query)
            limit = _page_size(query.get("limit"))
            page = await self._page(query, limit, filters)
            return {"filters": filters, "limit": limit, "page_sizes": PAGE_SIZES, **page}

        return await self._guarded(request, "jobs.html", build)

    async def _page(self, query: Any, limit: int, filters: dict[str, Any]) -> dict[str, Any]:
        """One page of a job list, newest first, by keyset both ways:
        ``before`` (older than that sequence: the next page down) or
        ``after`` (newer than it, read in admission order and turned round:
        the page up); neither is the newest page. Returns the jobs and the
        bounds of the older and newer pages (None: there is none)."""
        before = _sequence("before", query.get("before"))
        after = _sequence("after", query.get("after"))
        if before and after:
            raise InvalidJob("before", "give before or after, not both")
        client = self.s.client
        newer: int | None
        older: int | None
        if after:
            jobs = await client.list_jobs(**filters, limit=limit, after_sequence=after, with_payload=False)
            jobs.reverse()
            newer = jobs[0].sequence if len(jobs) == limit else None
            older = jobs[-1].sequence if jobs else after + 1
        else:
            jobs = await client.list_jobs(
                **filters, limit=limit, before_sequence=before or None, newest_first=True, with_payload=False
            )
            newer = (jobs[0].sequence if jobs else before - 1) if before else None
            older = jobs[-1].sequence if len(jobs) == limit else None
        return {"jobs": jobs, "paged": bool(before or after), "newer": newer, "older": older}

    async def job(self, request: Request) -> Response:
        job_id = request.query_params.get("job_id", "")

        async def build() -> dict[str, Any]:
            if not job_id:
                raise InvalidJob("job_id", "is missing")
            explained = await self.s.client.explain(job_id)
            if explained is None:
                raise _NotFound(f"There is no job {job_id!r} (it may have been pruned or purged).")
            return {"job": explained.job, "explained": explained, "timeline": _timeline(explained.job)}

        return await self._guarded(request, "job.html", build)

    async def lane(self, request: Request) -> Response:
        query = request.query_params
        lane = query.get("lane", "")

        async def build() -> dict[str, Any]:
            if not lane:
                raise InvalidJob("lane", "is missing")
            limit = _page_size(query.get("limit"))
            page = await self._page(query, limit, {"lane": lane})
            return {"lane": lane, "limit": limit, **page}

        return await self._guarded(request, "lane.html", build)

    async def workers(self, request: Request) -> Response:
        async def build() -> dict[str, Any]:
            workers = await self.s.client.workers()
            schedules = await self.s.client.schedules()
            return {
                "workers": workers,
                "live": sum(1 for worker in workers if not worker.gone),
                "schedules": schedules,
                "disputed": sorted({view.name for view in schedules if view.disputed}),
            }

        return await self._guarded(request, "workers.html", build)

    # -- actions -------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        action = str(request.path_params["action"]).replace("-", "_")
        if action not in ACTIONS:
            return await self._error(request, 404, f"There is no action {action!r}.")
        try:
            if self.s.read_only:
                raise _Refused("This dashboard is read-only: it runs no action.")
            refusal = _origin_refusal(request)
            if refusal is not None:
                raise _Refused(f"This action was refused: {refusal}. Use the dashboard's own pages.")
            form = await _form(request)
            cookie = request.cookies.get(self._cookie_name(request))
            if not self.s.csrf.accepts(cookie, form.get(_FIELD), await self._identity(request)):
                raise _Refused(
                    "The form's security token is missing or does not match this browser session "
                    "(was the page open for long, or sent from elsewhere?). Reload the page and try again."
                )
            if not await self._authorized(request, action):
                raise _Refused(f"You may not {action.replace('_', ' ')} here.")
            fields = _action_fields(action, form)
        except _Refused as refused:
            return await self._error(request, 403, str(refused))
        except InvalidJob as error:
            return await self._error(request, 400, str(error))
        if action in DESTRUCTIVE_ACTIONS and "yes" not in (form.get("confirm"), form.get(_ENCODED + "confirm")):
            context: dict[str, Any] = {"action": action, "fields": fields}
            if action.startswith("bulk_"):
                try:
                    context["count"] = (await self._bulk(action, fields, dry_run=True)).matched
                except InvalidJob as error:
                    return await self._error(request, 400, str(error))
                except WatchdogError as error:
                    return await self._error(request, 503, f"The database could not answer: {error}")
            return await self._render(request, "confirm.html", context)
        try:
            result = await self._run(action, fields)
        except InvalidJob as error:
            result = _Result(action, fields, "refused", str(error), 409)
        except WatchdogError as error:
            return await self._error(request, 503, f"The database could not answer: {error}")
        return await self._render(request, "result.html", {"result": result}, result.http_status)

    async def _bulk(self, action: str, fields: dict[str, str], *, dry_run: bool) -> BulkResult:
        """A bulk action's run (or, ``dry_run``, its count) on the form's filters."""
        queue, lane = fields.get("queue") or None, fields.get("lane") or None
        if action == "bulk_cancel":
            return await self.s.client.cancel_many(
                cancellation_id=fields["cancellation_id"], queue=queue, lane=lane, dry_run=dry_run
            )
        outcome = fields.get("outcome") or None
        settled_after = None
        within = fields.get("settled_within")
        if within:
            if within not in SETTLED_WITHIN:
                raise InvalidJob("settled_within", f"must be one of {list(SETTLED_WITHIN)}, got {within[:20]!r}")
            settled_after = datetime.now(UTC) - SETTLED_WITHIN[within]
        return await self.s.client.rerun_many(
            rerun_id=fields["rerun_id"],
            queue=queue,
            lane=lane,
            outcome=outcome,
            settled_after=settled_after,
            dry_run=dry_run,
        )

    async def _run(self, action: str, fields: dict[str, str]) -> _Result:
        client = self.s.client
        if action.startswith("bulk_"):
            bulk = await self._bulk(action, fields, dry_run=False)
            verb = "rerun" if action == "bulk_rerun" else "cancelled"
            text = (
                f"{bulk.matched} job(s) matched: {len(bulk.done)} {verb}, {len(bulk.repeated)} already {verb} "
                f"by this id (nothing changed for those), {len(bulk.skipped)} skipped."
            )
            return _Result(action, fields, f"{verb} {len(bulk.done)}", text, skipped=bulk.skipped)
        if action == "cancel":
            cancelled = await client.cancel(fields["job_id"], fields["cancellation_id"])
            return _Result(action, fields, cancelled.status.value, _CANCEL_TEXT[cancelled.status.value])
        if action == "fail_lane":
            settled = 0
            for _ in range(_LANE_BATCHES_MAX):
                failure = await client.fail_lane(fields["lane"], fields["reason"])
                settled += failure.settled
                if not failure.more:
                    break
            more = " More live jobs remain: run it again." if failure.more else ""
            return _Result(action, fields, f"settled {settled}", f"{settled} live job(s) settled failed.{more}")
        if action == "purge":
            deleted = await client.purge(fields["queue"])
            return _Result(action, fields, f"deleted {deleted}", f"{deleted} queued or delayed job(s) deleted.")
        if action == "pause":
            paused = await client.pause(fields["queue"], reason=fields.get("reason") or None)
            return _Result(action, fields, paused.value, _PAUSE_TEXT[paused.value])
        if action == "resume":
            resumed = await client.resume(fields["queue"])
            return _Result(action, fields, resumed.value, _PAUSE_TEXT[resumed.value])
        if action == "set_limits":
            limits = await client.set_limits(fields["queue"], **_limit_values(fields))
            return _Result(action, fields, "set", f"The queue's limits are now: {_limits_text(limits)}.")
        if action == "clear_limits":
            had = await client.clear_limits(fields["queue"])
            if had:
                return _Result(action, fields, "cleared", "The queue's limits are cleared: it claims unlimited again.")
            return _Result(action, fields, "not_limited", "The queue had no limits.")
        rerun = await client.rerun(fields["job_id"], rerun_id=fields["rerun_id"])
        fields = {**fields, "new_job_id": rerun.job_id}
        return _Result(action, fields, rerun.status.value, _RERUN_TEXT[rerun.status.value])


class _NotFound(Exception):
    pass


@dataclass(frozen=True)
class _Result:
    """What an action did, in the library's words (``status``)."""

    action: str
    fields: dict[str, str]
    status: str
    text: str
    http_status: int = 200
    #: A bulk action's jobs left alone, and why.
    skipped: Sequence[BulkSkip] = ()


_CANCEL_TEXT = {
    "recorded": "The cancellation is recorded: a queued job settles cancelled when next claimed, "
    "a running job's handler is told to stop.",
    "replayed": "This cancellation was recorded already (a repeated request): nothing changed.",
    "conflict": "Not recorded: the job has settled, or already has another cancellation.",
    "missing": "There is no such job.",
}
_PAUSE_TEXT = {
    "paused": "The queue is paused: no runner claims its jobs until it is resumed.",
    "already_paused": "The queue was paused already (its first reason stays).",
    "resumed": "The queue is resumed: runners claim its jobs again.",
    "not_paused": "The queue was not paused.",
}
_RERUN_TEXT = {
    "queued": "A copy of the job is queued as a new job.",
    "duplicate": "This rerun exists already (a repeated request): nothing changed.",
}


def _limit_values(fields: Mapping[str, str]) -> dict[str, Any]:
    """The ``set_limits`` form's numbers (an empty field: no such limit); InvalidJob naming a bad one."""
    values: dict[str, Any] = {}
    for name in ("concurrency", "concurrency_per_key"):
        text = fields.get(name, "").strip()
        if not text:
            values[name] = None
        elif not text.isdecimal() or len(text) > 9:
            raise InvalidJob(name, f"must be a whole number from 1 to {LIMIT_MAX}, got {text[:20]!r}")
        else:
            values[name] = int(text)
    for name in ("rate", "rate_per_key"):
        text = fields.get(name, "").strip()
        try:
            values[name] = Rate.parse(text) if text else None
        except InvalidJob as error:
            raise InvalidJob(name, str(error).removeprefix("rate: ")) from None
    return values


def _limits_text(limits: QueueLimits) -> str:
    parts = []
    if limits.concurrency is not None:
        parts.append(f"at most {limits.concurrency} running")
    if limits.concurrency_per_key is not None:
        parts.append(f"at most {limits.concurrency_per_key} running per key")
    if limits.rate is not None:
        parts.append(f"at most {limits.rate.count} started per {limits.rate.per}")
    if limits.rate_per_key is not None:
        parts.append(f"at most {limits.rate_per_key.count} started per key per {limits.rate_per_key.per}")
    return ", ".join(parts)


#: The fields of each action's form: (name, required).
_ACTION_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {
    "cancel": (("job_id", True), ("cancellation_id", True)),
    "fail_lane": (("lane", True), ("reason", True)),
    "purge": (("queue", True),),
    "pause": (("queue", True), ("reason", False)),
    "resume": (("queue", True),),
    "rerun": (("job_id", True), ("rerun_id", True)),
    "bulk_rerun": (
        ("queue", False),
        ("lane", False),
        ("outcome", False),
        ("settled_within", False),
        ("rerun_id", True),
    ),
    "bulk_cancel": (("queue", False), ("lane", False), ("cancellation_id", True)),
    "set_limits": (
        ("queue", True),
        ("concurrency", False),
        ("concurrency_per_key", False),
        ("rate", False),
        ("rate_per_key", False),
    ),
    "clear_limits": (("queue", True),),
}
#: The choices of a bulk rerun's "settled within the last ..." field.
SETTLED_WITHIN = {
    "1h": timedelta(hours=1),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


def _action_fields(action: str, form: Mapping[str, str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for name, required in _ACTION_FIELDS[action]:
        encoded = form.get(_ENCODED + name)
        try:
            value = unquote(encoded, errors="strict") if encoded is not None else form.get(name, "")
        except UnicodeDecodeError:
            raise InvalidJob(name, "is not percent-encoded UTF-8") from None
        if required and not value:
            raise InvalidJob(name, "is missing")
        fields[name] = value
    return fields


async def _form(request: Request) -> dict[str, str]:
    """The URL-encoded form of a POST (first value of each field)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise _Refused("Actions take a form (application/x-www-form-urlencoded).")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_MAX_BYTES:
            raise InvalidJob("form", f"must be at most {_FORM_MAX_BYTES} bytes")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=32)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidJob("form", f"cannot be read: {error}") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        form.setdefault(name, value)
    return form


def _filters(query: Mapping[str, str]) -> dict[str, str]:
    """The job list's filters given in the query (empty ones left out)."""
    names = {"queue": "queue", "state": "state", "outcome": "outcome", "lane": "lane", "prefix": "job_id_prefix"}
    return {target: query[name] for name, target in names.items() if query.get(name)}


def _page_size(text: str | None) -> int:
    if not text:
        return _DEFAULT_PAGE
    try:
        value = int(text)
    except ValueError:
        raise InvalidJob("limit", f"must be one of {list(PAGE_SIZES)}, got {text[:20]!r}") from None
    if value not in PAGE_SIZES:
        raise InvalidJob("limit", f"must be one of {list(PAGE_SIZES)}, got {value}")
    return value


def _sequence(field: str, text: str | None) -> int:
    """A page bound of the query (``before`` / ``after``); 0 when absent."""
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise InvalidJob(field, f"must be a sequence number, got {text[:20]!r}") from None
    if not 1 <= value < 2**63:
        raise InvalidJob(field, f"must be from 1 to {2**63 - 1}, got {value}")
    return value


@dataclass(frozen=True)
class _Event:
    at: datetime
    what: str
    detail: str | None = None
    #: False: ``at`` only places it (its own time is not stored).
    timed: bool = True


def _earlier_claims(job: JobView) -> str | None:
    """The claims before the last one, as far as the row tells them: each
    ended a failed attempt (the latest 10 with their times), a recovery (an
    execution that vanished; requeued, its time not stored) or a snooze."""
    failed = job.attempt - 1
    if not (failed or job.recovery_count or job.snoozes):
        return None
    parts = []
    if failed:
        shown = sum(1 for entry in job.failure_history if entry.attempt < job.attempt)
        kept = "" if shown >= failed else f"; {failed - shown} before the {shown} listed here are not kept"
        parts.append(f"{failed} failed attempt{'s' if failed != 1 else ''}{kept}")
    if job.recovery_count:
        parts.append(
            f"{job.recovery_count} recover{'ies' if job.recovery_count != 1 else 'y'} "
            "(its execution vanished and it was requeued; when is not stored)"
        )
    if job.snoozes:
        parts.append(f"{job.snoozes} snooze{'s' if job.snoozes != 1 else ''}")
    claims = failed + job.recovery_count + job.snoozes
    return f"{claims} earlier claim{'s' if claims != 1 else ''}: " + ", ".join(parts)


def _timeline(job: JobView) -> Sequence[_Event]:
    """The job's recorded times, oldest first; the claims before the last
    one (failed attempts, recoveries, snoozes) just before its start."""
    earlier = _earlier_claims(job)
    events = [
        _Event(job.enqueued_at, "enqueued") if job.enqueued_at else None,
        _Event(job.run_at, "requested start (run_at)") if job.run_at else None,
        _Event(job.ready_at, "ready") if job.ready_at and job.ready_at != job.run_at else None,
        # Sorted by time, and stable: said just before the last claim's start, which it preceded.
        _Event(job.started_at, "earlier claims", earlier, timed=False) if job.started_at and earlier else None,
        _Event(job.started_at, f"attempt {job.attempt} started") if job.started_at else None,
        *(_Event(f.at, f"attempt {f.attempt} failed", f.reason) for f in job.failure_history),
        _Event(job.settled_at, f"settled {job.outcome.value if job.outcome else ''}", job.failure_reason)
        if job.settled_at
        else None,
    ]
    return sorted((event for event in events if event is not None), key=lambda event: event.at)
