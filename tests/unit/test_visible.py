"""The one rule both the command line and the dashboard show stored text by
(``sqlalchemy_watchdog.visible``): every control, format, separator or bidi
control character is shown as an escape, derived from Unicode properties."""

from __future__ import annotations

import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from sqlalchemy_watchdog.cli import _one_line
from sqlalchemy_watchdog.visible import ESCAPED_BIDI_CLASSES, ESCAPED_CATEGORIES, escape, escape_code, is_escaped
from sqlalchemy_watchdog.web.filters import plain, visible, visible_text

#: The categories the issue names: controls, format characters, line and paragraph separators.
NAMED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp"}
BIDI_CONTROLS = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}


def acting_characters() -> list[str]:
    """Every code point of a named category or a bidi control class."""
    return [
        char
        for char in map(chr, range(sys.maxunicode + 1))
        if unicodedata.category(char) in NAMED_CATEGORIES or unicodedata.bidirectional(char) in BIDI_CONTROLS
    ]


def test_every_control_format_separator_and_bidi_control_is_shown_as_an_escape_everywhere() -> None:
    chars = acting_characters()
    # The two the adversarial run found shown raw, and the classic ones, are among them.
    assert {"\u061c", "\u180e", "\u202e", "\u2066", "\u200b", "\ufeff", "\x1b", "\x9b", "\u2028"} <= set(chars)
    assert len(chars) > 200
    for char in chars:
        text = f"a{char}b"
        code = escape_code(char)
        assert is_escaped(char), hex(ord(char))
        assert escape(text) == f"a{code}b", hex(ord(char))
        assert _one_line(text) == f"a{code}b", hex(ord(char))
        assert char not in plain(text) and code in plain(text), hex(ord(char))
        assert char not in visible(text) and f'title="U+{ord(char):04X}">{code}</span>' in visible(text)
        if char not in "\n\t":
            assert char not in visible_text(text), hex(ord(char))


def test_the_escaped_set_is_exactly_the_unicode_properties() -> None:
    for char in map(chr, range(sys.maxunicode + 1)):
        expected = (
            unicodedata.category(char) in ESCAPED_CATEGORIES or unicodedata.bidirectional(char) in ESCAPED_BIDI_CLASSES
        )
        assert is_escaped(char) is expected, hex(ord(char))


@given(st.text())
def test_escaped_text_holds_no_escaped_character_and_is_otherwise_unchanged(text: str) -> None:
    shown = escape(text)
    assert not any(is_escaped(char) for char in shown)
    assert shown == "".join(escape_code(char) if is_escaped(char) else char for char in text)
    # Multi-line text keeps its line breaks and tabs, nothing else.
    kept = escape(text, keep="\n\t")
    assert not any(is_escaped(char) and char not in "\n\t" for char in kept)


def test_escapes_name_the_code_point_unambiguously() -> None:
    assert [escape_code(c) for c in "\n\r\t\x07\x9b\u061c\U000e0001"] == [
        "\\n",
        "\\r",
        "\\t",
        "\\x07",
        "\\x9b",
        "\\u061c",
        "\\U000e0001",
    ]
