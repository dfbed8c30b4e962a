"""``visible``: text from users and messages with the characters that could mislead a reader
shown as printable markers. Escaping stops markup; this stops what escaping lets through:
characters that draw nothing (zero-width spaces and joiners, the soft hyphen, Hangul fillers,
tag characters that smuggle a hidden ASCII message, variation selectors), reorder the line
(bidirectional overrides and isolates), or drive a terminal (C0/C1 controls, ANSI escapes).

The project's template engine applies it to every variable it prints (``dashboard.templating``)
and ``dashboard.html.escape`` to every value the Python-built lists interpolate, so a template
or a row builder does not have to remember it. Tabs and newlines are kept.
"""

from __future__ import annotations

import re

#: Inclusive code point ranges shown as markers. Every format (Cf) character is here (the
#: tests check it against ``unicodedata``), with the controls and the invisible characters
#: of other categories that render as nothing or as blank space.
MARKED_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x0008),  # C0 controls (NUL, BEL, BS …); tab and newline are kept
    (0x000B, 0x001F),  # C0 controls (VT, FF, CR, ESC …)
    (0x007F, 0x009F),  # DEL and the C1 controls
    (0x00AD, 0x00AD),  # soft hyphen
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x0600, 0x0605),  # Arabic number signs (Cf)
    (0x061C, 0x061C),  # Arabic letter mark
    (0x06DD, 0x06DD),  # Arabic end of ayah (Cf)
    (0x070F, 0x070F),  # Syriac abbreviation mark (Cf)
    (0x0890, 0x0891),  # Arabic pound/piastre marks above (Cf)
    (0x08E2, 0x08E2),  # Arabic disputed end of ayah (Cf)
    (0x115F, 0x1160),  # Hangul choseong/jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors, vowel separator
    (0x200B, 0x200F),  # zero-width space, non-joiner, joiner, LRM, RLM
    (0x2028, 0x202E),  # line/paragraph separators, LRE RLE PDF LRO RLO
    (0x2060, 0x206F),  # word joiner, invisible operators, LRI RLI FSI PDI, deprecated formats
    (0x2800, 0x2800),  # braille pattern blank
    (0x3164, 0x3164),  # Hangul filler
    (0xD800, 0xDFFF),  # lone surrogates (unencodable: they would break the response)
    (0xFE00, 0xFE0D),  # variation selectors 1-14 (15 and 16 pick text/emoji style)
    (0xFEFF, 0xFEFF),  # zero-width no-break space (BOM)
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xFFF9, 0xFFFB),  # interlinear annotation controls
    (0x110BD, 0x110BD),  # Kaithi number sign (Cf)
    (0x110CD, 0x110CD),  # Kaithi number sign above (Cf)
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    (0xE0000, 0xE007F),  # tag characters (invisible ASCII copies)
    (0xE0100, 0xE01EF),  # variation selectors 17-256
)

_BMP = [(lo, hi) for lo, hi in MARKED_RANGES if hi <= 0xFFFF]
_ASTRAL = tuple((lo, hi) for lo, hi in MARKED_RANGES if lo > 0xFFFF)
#: Marked characters of the Basic Multilingual Plane, or any astral one (judged in
#: ``_replace``): a class of BMP characters only compiles to a lookup table, where one with
#: astral ranges would test each range for every character (five times slower).
_MARKED = re.compile(
    "[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in _BMP) + "]|[\\U00010000-\\U0010ffff]"
)


def marker(code: int) -> str:
    """The printable stand-in for one marked code point."""
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ ␛ ␍ …
    if code == 0x7F:
        return "␡"
    if code < 0xA0:
        return f"\\x{code:02x}"
    return f"⟨U+{code:04X}⟩"


_ASCII_MARKERS = {code: marker(code) for code in (*range(0x09), *range(0x0B, 0x20), 0x7F)}


def is_marked(code: int) -> bool:
    """Whether ``visible`` replaces the code point ``code``."""
    return any(lo <= code <= hi for lo, hi in MARKED_RANGES)


def _replace(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    if code > 0xFFFF and not any(lo <= code <= hi for lo, hi in _ASTRAL):
        return char  # an emoji, a CJK extension character …: shown as it is
    return marker(code)


def visible(text: str) -> str:
    """``text`` with the marked characters replaced by visible markers."""
    if text.isascii():  # the common case, in C: only C0 controls and DEL can be marked
        return text if text.isprintable() else text.translate(_ASCII_MARKERS)
    if _MARKED.search(text) is None:
        return text
    return _MARKED.sub(_replace, text)
