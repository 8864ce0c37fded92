"""Opt-in payload codecs: richer Python values in, canonical JSON stored.

A payload is stored as strict, canonical JSON, and a plain :class:`~sqlalchemy_watchdog.Job`
refuses anything else. A :class:`~sqlalchemy_watchdog.PayloadCodec` turns richer values into
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

:class:`EncryptedJSON` (the ``crypto`` extra) stores a payload, and a
result, that the database cannot read: ``{"$encrypted": "<Fernet token>"}``,
decrypted by any of its keys (newest first, for rotation). The dashboard
and the CLI show such a value as ``[encrypted]`` (:func:`is_encrypted`),
without a key. See the how-to "Encrypt payloads and results".
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import decimal
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import InvalidJob
from .jobs.encoding import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH, RESULT_MAX_BYTES, PayloadCodec, encode_payload

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cryptography.fernet import MultiFernet

__all__ = ["ENCRYPTED", "EncryptedJSON", "PayloadCodec", "TaggedJSON", "is_encrypted"]


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


#: The one key of an encrypted value as stored: ``{"$encrypted": "<Fernet token>"}``.
ENCRYPTED = "$encrypted"

#: What the dashboard and the CLI show in place of an encrypted payload or result.
ENCRYPTED_TEXT = "[encrypted]"

_INSTALL_HINT = "pip install 'sqlalchemy-watchdog[crypto]'"
_FERNET_VERSION = b"\x80"
#: Domain separation of the key that derives a token's IV from its plaintext.
_IV_LABEL = b"sqlalchemy_watchdog EncryptedJSON iv"


def is_encrypted(value: Any) -> bool:
    """Whether a stored payload or result is an :class:`EncryptedJSON` value
    (``{"$encrypted": "<token>"}``): what the dashboard and the CLI show as
    ``[encrypted]``. Needs no key, and no ``cryptography``."""
    return type(value) is dict and len(value) == 1 and isinstance(value.get(ENCRYPTED), str)


class EncryptedJSON:
    """A :class:`PayloadCodec` that encrypts: what is stored is
    ``{"$encrypted": "<Fernet token>"}``, the token holding the canonical JSON
    of the value (after ``inner``'s encoding, if given: e.g.
    ``EncryptedJSON(keys, inner=TaggedJSON())``). Payloads and results alike
    (a runner or a task given this codec decrypts the payload and encrypts
    the result; :meth:`Watchdog.result <sqlalchemy_watchdog.Watchdog.result>`
    decrypts with ``codec=``). Needs the ``crypto`` extra
    (``pip install 'sqlalchemy-watchdog[crypto]'``).

    :param keys: Fernet keys (``Fernet.generate_key()``: 32 url-safe
        base64-encoded bytes, as ``str`` or ``bytes``), **newest first**.
        Values are encrypted with the first; any of them decrypts
        (``cryptography.fernet.MultiFernet``). To rotate, put a new key first
        and keep the old ones for as long as a stored value may still need
        them (see :meth:`reencrypt`).
    :param inner: the codec applied before encryption (``None``: plain JSON).
    :raises InvalidJob: (field ``codec``) no key, a ``str`` instead of a
        list, or a key that is not a Fernet key. The message never holds a key.

    **Deterministic.** A token's IV is an HMAC of the plaintext (under a key
    derived from the newest key) and its timestamp is 0, so the same value
    under the same newest key is the same token: an identical replay of an
    enqueue stays a duplicate, as :class:`PayloadCodec` asks. The price:
    whoever reads the table can tell that two values are equal (and, as with
    any encryption, roughly how long they are), not what they are. The
    tokens are standard Fernet tokens (no TTL is used).

    A value it cannot decrypt -- none of the keys opens it (a key missing
    from the list, a wrong key, a token altered in the database) or it is
    not encrypted at all -- raises :class:`ValueError` naming the codec,
    never the plaintext or a key: a runner settles such a job ``failed``
    (not retried), ``payload could not be decoded: ValueError: EncryptedJSON
    ...``.
    """

    def __init__(self, keys: Sequence[str | bytes], *, inner: PayloadCodec | None = None) -> None:
        try:
            from cryptography.fernet import Fernet, MultiFernet
        except ImportError as error:
            raise ImportError(f"EncryptedJSON needs the cryptography package: {_INSTALL_HINT}") from error
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
            raise InvalidJob(
                "codec", f"EncryptedJSON keys must be a list of keys, newest first, not {type(keys).__name__}"
            )
        keys = list(keys)
        if not keys:
            raise InvalidJob("codec", "EncryptedJSON needs at least one key (e.g. Fernet.generate_key())")
        raw: list[bytes] = []
        for number, key in enumerate(keys, 1):
            decoded = _fernet_key(key)
            if decoded is None:
                raise InvalidJob(
                    "codec",
                    f"EncryptedJSON key #{number} ({type(key).__name__}) is not a Fernet key: "
                    "32 url-safe base64-encoded bytes, as Fernet.generate_key() makes",
                )
            raw.append(decoded)
        if inner is not None and not (
            callable(getattr(inner, "encode", None)) and callable(getattr(inner, "decode", None))
        ):
            raise InvalidJob(
                "codec", f"EncryptedJSON inner must be a PayloadCodec (encode and decode), not {type(inner).__name__}"
            )
        self._inner = inner
        self._count = len(raw)
        self._signing_key = raw[0][:16]
        self._encryption_key = raw[0][16:]
        self._iv_key = hmac.new(self._signing_key, _IV_LABEL, hashlib.sha256).digest()
        self._fernet: MultiFernet = MultiFernet([Fernet(base64.urlsafe_b64encode(key)) for key in raw])

    def __repr__(self) -> str:  # never the keys
        return f"EncryptedJSON(<{self._count} key{'s' if self._count != 1 else ''}>, inner={self._inner!r})"

    def encode(self, value: Any) -> Any:
        """``{"$encrypted": token}``: the canonical JSON of ``value`` (after
        ``inner``'s encoding) encrypted with the newest key.

        :raises InvalidJob: (field ``payload``) what is not strict JSON, or
            what ``inner`` refuses -- naming ``inner`` and its error's type
            but not its message, which may quote the value (a refused result
            is a failure reason, stored in the clear): call
            ``inner.encode(value)`` to see it.
        """
        if self._inner is not None:
            try:
                value = self._inner.encode(value)
            except Exception as error:
                raise InvalidJob(
                    "payload",
                    f"EncryptedJSON's inner codec {type(self._inner).__name__} refused the value "
                    f"({type(error).__name__}; message not shown: it may quote the value)",
                ) from None
        text = encode_payload(value, "payload", max(PAYLOAD_MAX_BYTES, RESULT_MAX_BYTES))
        return {ENCRYPTED: self._token(text.encode("utf-8"))}

    def decode(self, json_value: Any) -> Any:
        """The value of a stored ``{"$encrypted": token}``, decrypted by
        whichever key opens it, then decoded by ``inner``.

        :raises ValueError: naming the codec (never the plaintext or a key)
            when no key opens it or it is not an encrypted value.
        """
        text = self._plaintext(json_value)
        try:
            value = json.loads(text)
        except ValueError:  # a token made with our key that holds no JSON: not ours
            raise ValueError("EncryptedJSON decrypted a token that holds no JSON") from None
        if self._inner is None:
            return value
        try:
            return self._inner.decode(value)
        except Exception as error:  # its message may quote the plaintext
            raise ValueError(
                f"EncryptedJSON: its inner codec {type(self._inner).__name__} could not decode the decrypted "
                f"value ({type(error).__name__}; message not shown: it may quote the value)"
            ) from None

    def reencrypt(self, json_value: Any) -> Any:
        """A stored encrypted value encrypted again with the newest key (the
        same value, the same ``{"$encrypted": ...}`` shape): for rotating
        the stored payloads of jobs that have not run yet. The plaintext is
        not decoded by ``inner``.

        :raises ValueError: as :meth:`decode`.
        """
        return {ENCRYPTED: self._token(self._plaintext(json_value))}

    def _plaintext(self, json_value: Any) -> bytes:
        from cryptography.fernet import InvalidToken

        if not is_encrypted(json_value):
            raise ValueError(
                f"EncryptedJSON cannot decode a value that is not encrypted (a JSON {_json_kind(json_value)}, "
                f'not {{"{ENCRYPTED}": token}}): was it stored without this codec?'
            )
        try:
            return self._fernet.decrypt(json_value[ENCRYPTED])
        except (InvalidToken, TypeError, ValueError):
            raise ValueError(
                f"EncryptedJSON cannot decrypt the value: none of its {self._count} "
                f"key{'s' if self._count != 1 else ''} opens the token (its key is not in the list, "
                "or the stored token was altered)"
            ) from None

    def _token(self, data: bytes) -> str:
        """A Fernet token of ``data`` under the newest key, its IV derived
        from ``data`` and its timestamp 0 (see the class docstring)."""
        from cryptography.hazmat.primitives import hashes, padding
        from cryptography.hazmat.primitives import hmac as crypto_hmac
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        iv = hmac.new(self._iv_key, data, hashlib.sha256).digest()[:16]
        padder = padding.PKCS7(algorithms.AES.block_size).padder()
        padded = padder.update(data) + padder.finalize()
        encryptor = Cipher(algorithms.AES(self._encryption_key), modes.CBC(iv)).encryptor()
        ciphertext = encryptor.update(padded) + encryptor.finalize()
        body = _FERNET_VERSION + (0).to_bytes(8, "big") + iv + ciphertext
        signer = crypto_hmac.HMAC(self._signing_key, hashes.SHA256())
        signer.update(body)
        return base64.urlsafe_b64encode(body + signer.finalize()).decode("ascii")


def _fernet_key(key: object) -> bytes | None:
    """The 32 bytes of a Fernet key (url-safe base64), or None: not one."""
    if not isinstance(key, (str, bytes)):
        return None
    try:
        raw = base64.urlsafe_b64decode(key.encode("ascii") if isinstance(key, str) else key)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    return raw if len(raw) == 32 else None


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
