"""The dashboard's template filters: how values are shown on a page.

Every text a page shows from the database goes through one of them, so that
invisible characters (see :mod:`sqlalchemy_watchdog.visible`) are shown as
escapes and no encrypted value or undecodable row breaks a page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from markupsafe import Markup, escape

from ..codecs import ENCRYPTED_TEXT, is_encrypted
from ..jobs import Undecodable
from ..visible import escape as visible_escape
from ..visible import escape_code, pieces

__all__ = ["FILTERS", "age", "hidden_value", "plain", "pretty_json", "visible", "visible_text", "when"]


def _shown(value: object, keep: str) -> Markup:
    """``value`` as HTML-escaped text whose invisible characters (see
    :mod:`sqlalchemy_watchdog.visible`) but those in ``keep`` are shown as
    escapes (``\\x07``, ``\\u202e``) in a marked span."""
    text = "" if value is None else str(value)
    parts: list[Markup] = []
    for run, escaped in pieces(text, keep):
        if escaped:
            parts.append(Markup('<span class="ctl" title="U+{:04X}">{}</span>').format(ord(run), escape_code(run)))
        else:
            parts.append(escape(run))
    return Markup("").join(parts)


def plain(value: object) -> str:
    """Text for a title or an attribute: invisible characters as escapes, no markup."""
    return visible_escape(value)


def visible(value: object) -> Markup:
    """One-line text (an id, a lane): every control character shown as an escape."""
    return _shown(value, "")


def visible_text(value: object) -> Markup:
    """Multi-line text (a payload, a traceback): line breaks and tabs kept."""
    return _shown(value, "\n\t")


def when(value: datetime | None) -> str:
    """A database time as ``2026-01-31 12:00:00.123 UTC``."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d} UTC"


def age(value: timedelta | None) -> str:
    """A duration as ``2h 05m``, ``3m 07s``, ``4.2s`` or ``5 ms``."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    days, whole = divmod(whole, 86400)
    hours, whole = divmod(whole, 3600)
    minutes, secs = divmod(whole, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s"


def pretty_json(value: Any) -> str:
    if isinstance(value, Undecodable):  # a payload written by hand that no JSON reader takes
        return str(value)
    if is_encrypted(value):  # EncryptedJSON's: the dashboard has no key, and shows no token
        return ENCRYPTED_TEXT
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


#: Hidden fields carry their value percent-encoded under this prefix, so that
#: the page holds no control character of an id even inside an attribute.
_ENCODED = "enc."


def hidden_value(value: object) -> str:
    """A hidden field's value as the page carries it (see :data:`_ENCODED`)."""
    return quote(str(value), safe="")


#: The filters the templates use, by name.
FILTERS: dict[str, Callable[..., Any]] = {
    "hidden_value": hidden_value,
    "plain": plain,
    "visible": visible,
    "visible_text": visible_text,
    "when": when,
    "age": age,
    "pretty_json": pretty_json,
}
