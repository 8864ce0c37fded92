"""Text from the database shown to a person: every character that would act
instead of showing itself is shown as an escape.

A job id, a queue, a lane, a failure or pause reason is written by whoever
enqueues or settles the job, and the command line and the dashboard show it
to an operator. A terminal runs the escape sequences it is sent (``ESC ]0;``
retitles the window, ``ESC [2J`` clears it, a line break forges a line), and
a browser obeys bidirectional controls and draws no zero-width character.
:func:`escape` and :func:`pieces` show each such character as ``\\x1b``,
``\\u202e`` or ``\\U000e0001`` instead; the command line (``cli``) and the
dashboard (``web``) both use them, so they escape the same set.

The set is derived from Unicode properties, not listed by hand: every
character whose general category is in :data:`ESCAPED_CATEGORIES` (controls,
format characters such as zero-width and bidirectional marks, line and
paragraph separators, surrogates, and code points this Python's Unicode
database does not assign, which a newer terminal or browser may treat as
format characters) or whose bidirectional class is in
:data:`ESCAPED_BIDI_CLASSES` (the bidi controls, segment and paragraph
separators).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import lru_cache

__all__ = ["ESCAPED_CATEGORIES", "ESCAPED_BIDI_CLASSES", "is_escaped", "escape_code", "escape", "pieces"]

#: General categories never shown as themselves: Cc (C0 and C1 controls),
#: Cf (format: zero-width, bidi marks, embeddings and isolates, U+061C,
#: U+180E ...), Zl and Zp (line and paragraph separators), Cs (surrogates)
#: and Cn (unassigned here, perhaps a format character elsewhere).
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
#: Bidirectional classes never shown as themselves: the explicit embeddings,
#: overrides and isolates and their terminators, paragraph (B) and segment
#: (S) separators.
ESCAPED_BIDI_CLASSES = frozenset({"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI", "B", "S"})

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Every character that may need an escape: anything but printable ASCII.
_CANDIDATE = re.compile("[^ -~]")


@lru_cache(maxsize=4096)
def is_escaped(char: str) -> bool:
    """Whether ``char`` (one character) is shown as an escape."""
    return unicodedata.category(char) in ESCAPED_CATEGORIES or unicodedata.bidirectional(char) in ESCAPED_BIDI_CLASSES


def escape_code(char: str) -> str:
    """``char`` as a Python-style escape: ``\\n``, ``\\r``, ``\\t``, ``\\x07``,
    ``\\u202e``, ``\\U000e0001``."""
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def pieces(text: str, keep: str = "") -> Iterator[tuple[str, bool]]:
    """``text`` cut into runs shown as they are, ``(run, False)``, and the
    characters between them to be shown as escapes, ``(char, True)``, in order. Characters
    in ``keep`` (e.g. ``"\\n\\t"`` for a traceback) are shown as they are."""
    position = 0
    for match in _CANDIDATE.finditer(text):
        char = match.group()
        if char in keep or not is_escaped(char):
            continue
        start = match.start()
        if start > position:
            yield text[position:start], False
        yield char, True
        position = start + 1
    if position < len(text):
        yield text[position:], False


def escape(value: object, keep: str = "") -> str:
    """``value`` (None: empty) as text with every escaped character (see
    :func:`is_escaped`) but those in ``keep`` shown as its escape."""
    text = "" if value is None else str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(escape_code(run) if escaped else run for run, escaped in pieces(text, keep))
