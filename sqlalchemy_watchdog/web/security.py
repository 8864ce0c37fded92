"""The dashboard's guards: who may see and do what, CSRF tokens, origin
checks, security headers and the base path.

``authorize(request, action)`` is asked before every page (:data:`VIEW`)
and every action (:data:`ACTIONS`); each form carries a CSRF token bound to
the visitor (``identify``) and a POST from another origin is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..visible import escape as visible_escape
from ..visible import is_escaped

__all__ = ["ACTIONS", "DESTRUCTIVE_ACTIONS", "VIEW", "Authorize", "Identify", "scope_user"]


#: What ``authorize(request, action)`` is asked about: every action by name.
ACTIONS = (
    "cancel",
    "fail_lane",
    "purge",
    "pause",
    "resume",
    "rerun",
    "bulk_rerun",
    "bulk_cancel",
    "set_limits",
    "clear_limits",
)
#: The actions that destroy or end something, or act on many jobs: each asks
#: for confirmation first (a bulk action's page shows how many jobs match).
DESTRUCTIVE_ACTIONS = frozenset({"cancel", "fail_lane", "purge", "bulk_rerun", "bulk_cancel"})
#: What ``authorize(request, action)`` is asked before any page is shown.
VIEW = "view"

#: ``authorize(request, action) -> bool`` (or an awaitable of it): may this
#: request see the dashboard (``action == "view"``) or run ``action``?
Authorize = Callable[[Request, str], bool | Awaitable[bool]]


_COOKIE = "watchdog_csrf"
_FIELD = "csrf_token"
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


# -- CSRF: a per-session nonce in a cookie, a token bound to it and to the identity ------


class _Csrf:
    """Double-submit tokens bound to the visitor. The cookie holds a random
    nonce and its signature (``nonce.signature``); each form holds
    ``HMAC(secret, nonce, identity)``. A POST must carry a cookie whose
    signature holds and the form token of that nonce *for the identity of
    the request*: a pair minted for one identity (or planted in a browser
    by a sibling site) is refused for another."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, *parts: str) -> str:
        message = "\x00".join(parts).encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def cookie_value(self, nonce: str) -> str:
        return f"{nonce}.{self._mac('cookie', nonce)}"

    def nonce_of(self, cookie: str | None) -> str | None:
        """The nonce of a cookie value whose signature holds, else None."""
        if not cookie or cookie.count(".") != 1:
            return None
        nonce, signature = cookie.split(".")
        if not nonce or not hmac.compare_digest(signature, self._mac("cookie", nonce)):
            return None
        return nonce

    def form_token(self, nonce: str, identity: str) -> str:
        return self._mac("form", nonce, identity)

    def accepts(self, cookie: str | None, submitted: str | None, identity: str) -> bool:
        nonce = self.nonce_of(cookie)
        if nonce is None or submitted is None:
            return False
        return hmac.compare_digest(self.form_token(nonce, identity), submitted)


#: ``identify(request) -> str | None`` (or an awaitable of it): who the request
#: is, for binding the CSRF token; None or "" for nobody in particular.
Identify = Callable[[Request], str | Awaitable[str | None] | None]


def scope_user(request: Request) -> str | None:
    """The default ``identify``: the authenticated user Starlette's
    ``AuthenticationMiddleware`` put in the ASGI scope (its ``identity``,
    else its ``display_name``), or None."""
    user = request.scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    for attribute in ("identity", "display_name"):
        try:
            value = getattr(user, attribute)
        except NotImplementedError:
            continue
        if value:
            return f"{attribute}:{value}"
    return None


def _origin_refusal(request: Request) -> str | None:
    """Why a POST comes from another origin, or None when it does not.

    ``Sec-Fetch-Site`` (sent by every current browser, computed by the
    browser itself, so no proxy changes it) must be ``same-origin``;
    without it, an ``Origin`` header must name this host (the ``Host``
    header, or a proxy's ``X-Forwarded-Host``). A request with neither
    (not from a browser) is left to the token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"it was sent from another site (Sec-Fetch-Site: {site[:20]})"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    parsed = urlsplit(origin)
    if origin == "null" or not parsed.netloc:
        return "it was sent from an opaque origin (Origin: null)"
    own = {_host(request.headers.get("host", ""), parsed.scheme)}
    for forwarded in request.headers.getlist("x-forwarded-host"):
        own.update(_host(host.strip(), parsed.scheme) for host in forwarded.split(","))
    if _host(parsed.netloc, parsed.scheme) not in own:
        return "it was sent from another origin"
    return None


def _host(netloc: str, scheme: str) -> str:
    """``netloc`` lower-cased, without the scheme's default port."""
    netloc = netloc.lower()
    default = {"https": ":443", "http": ":80"}.get(scheme)
    return netloc[: -len(default)] if default and netloc.endswith(default) else netloc


class _Refused(Exception):
    """The request may not do this: a 403 page saying why."""


def _check_base_path(base_path: object) -> str:
    """``base_path`` as a path of this site (``/ops/watchdog``), or ValueError naming it.

    Refused: anything but an absolute path -- ``//evil.example`` and
    ``/\\evil.example`` (which browsers read as another host), a URL with a
    scheme, backslashes, a query or fragment, control, format and other
    invisible characters, whitespace."""
    if not isinstance(base_path, str):
        raise ValueError(f"base_path must be a str (a path starting with '/'), not {type(base_path).__name__}")
    if base_path and not base_path.startswith("/"):
        raise ValueError(f"base_path must be a path starting with '/', got {visible_escape(base_path)!r}")
    if base_path.startswith("//"):
        raise ValueError(
            f"base_path must be a path of this site, not a host (//...): got {visible_escape(base_path)!r}"
        )
    for char in base_path:
        if char in "\\?#" or char.isspace() or is_escaped(char):
            raise ValueError(
                f"base_path must not contain {visible_escape(char) if is_escaped(char) else char!r}: "
                f"got {visible_escape(base_path)!r}"
            )
    return base_path.rstrip("/")


class _SecurityHeaders:
    """Every response of the dashboard -- pages, static files, Starlette's
    own 404 and 405 -- carries the security headers (a header a response
    sets itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _Gate(Protocol):
    """What :class:`_Viewers` asks of the pages: may this request do
    ``action``, and the error page that says it may not."""

    async def _authorized(self, request: Request, action: str) -> bool: ...

    async def _error(self, request: Request, status: int, message: str) -> Response: ...


class _Viewers:
    """An ASGI app (the static files) only for requests ``authorize`` lets view."""

    def __init__(self, pages: _Gate, app: ASGIApp) -> None:
        self.pages = pages
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if scope["type"] == "http" and not await self.pages._authorized(request, VIEW):
            response = await self.pages._error(request, 403, "You may not view this dashboard.")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
