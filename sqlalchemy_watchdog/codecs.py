"""Opt-in payload codecs: richer Python values in, canonical JSON stored.

A payload is stored as strict, canonical JSON, and a plain :class:`~sqlalchemy_watchdog.Job`
refuses anything else. A :class:`PayloadCodec` turns richer values into
JSON-able ones before that validation (``Job(..., codec=...)``), and a
runner given the same codec hands its handler ``codec.decode(payload)``.
What is stored does not change: still canonical JSON, compared as such when
a replay is recognised.

:class:`TaggedJSON` is the ready codec::

    from datetime import datetime, timezone
    from decimal import Decimal
    from uuid import UUID
    from sqlalchemy_watchdog import Job, TaggedJSON

    codec = TaggedJSON()
    job = Job("invoice-7", "billing", codec=codec, payload={
        "due": datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc),
        "amount": Decimal("19.90"),
        "customer": UUID("12345678-1234-5678-1234-567812345678"),
    })
    job.payload   # {'amount': {'$decimal': '19.90'}, 'customer': {'$uuid': '1234...'},
                  #  'due': {'$datetime': '2025-03-01T09:30:00+00:00'}}
    codec.decode(job.payload)["amount"]   # Decimal('19.90')
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .errors import InvalidJob
from .jobs import PAYLOAD_MAX_DEPTH

__all__ = ["PayloadCodec", "TaggedJSON"]


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


_DATETIME = "$datetime"
_DATE = "$date"
_DECIMAL = "$decimal"
_UUID = "$uuid"
#: Wraps an application dict that would otherwise read as a tag.
_DICT = "$dict"
_TAGS = frozenset({_DATETIME, _DATE, _DECIMAL, _UUID, _DICT})


class TaggedJSON:
    """A :class:`PayloadCodec` for ``datetime``, ``date``, ``Decimal``,
    ``UUID``, dataclasses and pydantic models.

    Encoding (at any depth, within :data:`~sqlalchemy_watchdog.jobs.PAYLOAD_MAX_DEPTH`):

    * an aware ``datetime`` → ``{"$datetime": "2025-03-01T09:30:00+00:00"}``
      (ISO 8601 with its UTC offset; a naive one is refused: its instant is
      unknown). It decodes to an equal ``datetime`` whose ``tzinfo`` is that
      fixed offset.
    * a ``date`` → ``{"$date": "2025-03-01"}``
    * a finite ``Decimal`` → ``{"$decimal": "19.90"}`` (exponent kept; NaN
      and infinities are refused)
    * a ``UUID`` → ``{"$uuid": "12345678-..."}``
    * a dataclass instance → the dict of its fields; anything with
      ``model_dump()`` (a pydantic model) → that dict. Both decode to the
      dict, not to the class.
    * a tuple → a list; an application dict whose only key is one of the
      tags above is wrapped as ``{"$dict": {...}}`` so it decodes unchanged.

    Anything else that is not JSON (a set, bytes, an arbitrary object) is
    refused with :class:`~sqlalchemy_watchdog.InvalidJob` naming ``payload``.
    """

    def encode(self, value: Any) -> Any:
        """The JSON-able form of ``value``; see the class docstring."""
        return self._encode(value, 0)

    def decode(self, json_value: Any) -> Any:
        """``json_value`` with every tag turned back into its value."""
        return self._decode(json_value, 0)

    def __repr__(self) -> str:
        return "TaggedJSON()"

    def _encode(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, (str, bool, int, float)):
            return value  # strict-JSON checks (NaN, sizes) stay with the Job
        if depth >= PAYLOAD_MAX_DEPTH:
            raise InvalidJob("payload", f"must nest at most {PAYLOAD_MAX_DEPTH} levels deep")
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise InvalidJob(
                    "payload",
                    f"TaggedJSON refuses the naive datetime {value.isoformat()} (give it a tzinfo, e.g. timezone.utc)",
                )
            return {_DATETIME: value.isoformat()}
        if isinstance(value, datetime.date):
            return {_DATE: value.isoformat()}
        if isinstance(value, decimal.Decimal):
            if not value.is_finite():
                raise InvalidJob("payload", f"TaggedJSON refuses the non-finite Decimal {value}")
            return {_DECIMAL: str(value)}
        if isinstance(value, uuid.UUID):
            return {_UUID: str(value)}
        if isinstance(value, (list, tuple)):
            return [self._encode(item, depth + 1) for item in value]
        if isinstance(value, Mapping):
            encoded = {key: self._encode(item, depth + 1) for key, item in value.items()}
            if len(encoded) == 1 and next(iter(encoded)) in _TAGS:
                return {_DICT: encoded}
            return encoded
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return self._encode(fields, depth)
        dump = getattr(value, "model_dump", None)
        if callable(dump) and not isinstance(value, type):
            return self._encode(dump(), depth)
        raise InvalidJob("payload", f"TaggedJSON cannot encode {type(value).__name__}; it is not a JSON type")

    def _decode(self, value: Any, depth: int) -> Any:
        if isinstance(value, list):
            return [self._decode(item, depth + 1) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == _DICT and isinstance(inner, dict):
                return {key: self._decode(item, depth + 1) for key, item in inner.items()}
            if tag in _TAGS and isinstance(inner, str):
                try:
                    if tag == _DATETIME:
                        return datetime.datetime.fromisoformat(inner)
                    if tag == _DATE:
                        return datetime.date.fromisoformat(inner)
                    if tag == _DECIMAL:
                        return decimal.Decimal(inner)
                    return uuid.UUID(inner)
                except (ValueError, decimal.InvalidOperation) as error:
                    raise ValueError(f"TaggedJSON cannot decode {tag} {inner!r}: {error}") from None
        return {key: self._decode(item, depth + 1) for key, item in value.items()}
