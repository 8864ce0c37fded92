"""JSON encoding of payloads and results, and epoch-millisecond times.

A payload (and a handler's result) is stored as strict, canonical JSON:
:func:`encode_payload` checks a value and returns that text,
:func:`payload_of` reads it back. A :class:`PayloadCodec` turns richer
values into JSON-able ones before that check. Times are stored as
milliseconds since the Unix epoch (:func:`epoch_ms`, :func:`at_epoch_ms`),
durations as whole milliseconds (:func:`duration_ms`).

This module is the bottom of :mod:`sqlalchemy_watchdog.jobs`: it imports
nothing of the package but its errors, so :mod:`sqlalchemy_watchdog.codecs`
builds on it without an import circle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidJob

__all__ = [
    "PAYLOAD_MAX_BYTES",
    "PAYLOAD_MAX_DEPTH",
    "RESULT_MAX_BYTES",
    "PayloadCodec",
    "at_epoch_ms",
    "duration_ms",
    "encode_payload",
    "encode_result",
    "epoch_ms",
    "from_epoch_ms",
    "payload_of",
]


#: The largest payload accepted, measured as its canonical UTF-8 JSON text.
PAYLOAD_MAX_BYTES = 1024 * 1024
#: The deepest nesting of arrays and objects accepted in a payload.
PAYLOAD_MAX_DEPTH = 64
#: The largest result a handler may return, in bytes of its canonical JSON
#: (the same bound as a payload's).
RESULT_MAX_BYTES = PAYLOAD_MAX_BYTES

#: Times are stored as milliseconds since this instant.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@runtime_checkable
class PayloadCodec(Protocol):
    """Converts payloads between application values and JSON values.

    ``encode(value)`` returns a strict-JSON value (dicts with str keys,
    lists, str, int, finite float, bool, None) or raises
    :class:`~sqlalchemy_watchdog.InvalidJob` (field ``payload``) for what it
    refuses; ``decode(json_value)`` returns the application value. A codec
    should be deterministic, so that equal values encode equally and an
    identical replay stays a duplicate.
    """

    def encode(self, value: Any) -> Any:
        """The JSON-able form of ``value``."""
        ...

    def decode(self, json_value: Any) -> Any:
        """The application value of a stored ``json_value``."""
        ...


def duration_ms(value: timedelta) -> int:
    """A checked duration in whole milliseconds."""
    return value // timedelta(milliseconds=1)


def epoch_ms(value: datetime) -> int:
    """A checked aware datetime in milliseconds since the Unix epoch."""
    return (value - _EPOCH) // timedelta(milliseconds=1)


def from_epoch_ms(value: int | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (None stays None)."""
    return None if value is None else at_epoch_ms(value)


def at_epoch_ms(value: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return _EPOCH + timedelta(0, 0, 0, value)  # positional: keywords cost a third more


def _check_json(value: Any, name: str = "payload") -> None:
    """Refuse anything that is not strict JSON, without recursion.

    Strings are not looked into here: a lone surrogate in any of them (keys
    included) makes the encoded text fail UTF-8 encoding in
    :func:`encode_payload`, which checks the whole text once.
    """
    if type(value) is dict and _flat(value):
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidJob(name, f"must be strict JSON; {item!r} is not a JSON number")
            continue
        if depth >= PAYLOAD_MAX_DEPTH:
            raise InvalidJob(name, f"must nest at most {PAYLOAD_MAX_DEPTH} levels deep")
        if isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidJob(
                        name,
                        f"object keys must be str, not {type(key).__name__} ({key!r})",
                    )
                stack.append((child, depth + 1))
        else:
            raise InvalidJob(name, f"must be strict JSON; {type(item).__name__} is not a JSON type")


#: Exact types a flat payload's values may have without a closer look.
_SCALARS = frozenset({str, int, bool, type(None)})


def _flat(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is a plain dict of ``str`` keys and finite scalars,
    the common payload: strict JSON as it stands (the fast path of
    :func:`_check_json`; False sends anything else to the full check)."""
    for key, item in value.items():
        if type(key) is not str:
            return False
        kind = type(item)
        if kind in _SCALARS or (kind is float and math.isfinite(item)):
            continue
        return False
    return True


#: Canonical payload JSON: sorted keys, fixed separators, strict numbers.
_PAYLOAD_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _one_shot_encoder() -> Callable[[Any], str]:
    """``_PAYLOAD_ENCODER.encode``, the same text, without its per-call set-up.

    ``JSONEncoder.encode`` builds CPython's C encoder object on every call,
    about half the cost of encoding a small payload. This builds it once,
    with the very arguments ``encode`` passes, but no circular-reference
    markers: :func:`_check_json` has already refused anything nested deeper
    than :data:`PAYLOAD_MAX_DEPTH`, which a cycle would be. Where the C
    encoder is missing (another Python), ``encode`` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return _PAYLOAD_ENCODER.encode
    e = _PAYLOAD_ENCODER
    iterate = make(
        None,
        e.default,
        json.encoder.encode_basestring,
        e.indent,
        e.key_separator,
        e.item_separator,
        e.sort_keys,
        e.skipkeys,
        e.allow_nan,
    )

    def encode(payload: Any) -> str:
        return "".join(iterate(payload, 0))

    return encode


_encode_checked_json = _one_shot_encoder()


def encode_payload(payload: Any, name: str = "payload", max_bytes: int = PAYLOAD_MAX_BYTES) -> str:
    """Validate ``payload`` and return its canonical JSON text.

    Keys are sorted and separators fixed, so equal payloads always encode to
    the same text and an identical replay is recognised as a duplicate.
    ``name`` is the field an error names (``result`` for a handler's result).
    """
    if payload is None:  # the default: no need for the encoder
        return "null"
    _check_json(payload, name)
    try:
        text = _encode_checked_json(payload)
    except (TypeError, ValueError) as error:  # e.g. a read-only mapping, a 5,000-digit int
        raise InvalidJob(name, f"cannot be encoded as JSON: {error}") from None
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJob(name, "strings must be valid Unicode (no lone surrogates)") from None
    if size > max_bytes:
        raise InvalidJob(name, f"must be at most {max_bytes} bytes of JSON, got {size}")
    return text


def encode_result(value: Any, codec: PayloadCodec | None = None) -> str | None:
    """A handler's result as stored: ``codec.encode(value)`` (when a codec is
    given), then canonical JSON of at most :data:`RESULT_MAX_BYTES`; None for
    no result (``None``).

    :raises InvalidJob: (field ``result``) a value the codec refuses, that is
        not strict JSON, or that is too large.
    """
    if value is None:
        return None
    if codec is not None:
        try:
            value = codec.encode(value)
        except InvalidJob as error:
            raise InvalidJob("result", str(error).split(": ", 1)[-1]) from None
        except Exception as error:  # a codec refusing a value, in its own words
            raise InvalidJob(
                "result", f"{type(codec).__name__}.encode failed: {type(error).__name__}: {error}"
            ) from None
    return encode_payload(value, "result", RESULT_MAX_BYTES)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


#: Strict JSON: ``NaN`` and ``Infinity`` are refused (Python's default takes them).
_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json)


def payload_of(text: str) -> Any:
    """A stored payload's value; raises for text the library would never
    have stored: not strict JSON, or nested deeper than :data:`PAYLOAD_MAX_DEPTH`
    (a ``RecursionError`` from the decoder included)."""
    value = _STRICT_JSON.decode(text)
    # Only text with that many brackets can nest that deep: a flat payload
    # is not walked again.
    if len(text) > PAYLOAD_MAX_DEPTH and text.count("[") + text.count("{") > PAYLOAD_MAX_DEPTH:
        _check_json(value)
    return value
