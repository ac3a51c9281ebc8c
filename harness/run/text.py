"""Text from a submission (or a rank, or a ledger line) shown as data: never markup, never a terminal command.

A name, an author, a blurb, a rank's error text: each may hold ESC sequences (which rewrite a terminal),
newlines (which forge lines of a card or rows and sections of a markdown page), bidirectional overrides,
markdown or HTML, and any length (a 60,000-character name). Everything shown passes through one of:

    visible(text, limit)    the terminal and plain text: control and format characters as escapes (\\x1b,
                            \\n, \\u202e), bounded with an ellipsis
    markdown_cell(text, limit)  visible(), then HTML-escaped and markdown punctuation backslash-escaped:
                            a table cell that renders as the text it holds
    html_text(text, limit)  visible(), then HTML-escaped (attributes included)

NAME_MAX_CHARS bounds what a card, a board or a plot title shows of a name.
"""

from __future__ import annotations

import html
import unicodedata
from typing import Any

NAME_MAX_CHARS = 80
"""What is shown of a name, an author or a lineage (the whole value stays in the JSON records)."""
TEXT_MAX_CHARS = 400
"""What is shown of a detail line (a status's why)."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b", "\x00": "\\x00", "\\": "\\\\"}
_MARKDOWN = "\\`*[]|~"
"""Backslash-escaped in a markdown cell (with `_` at a word's edge; `<`, `>` and `&` become entities)."""


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    cat = unicodedata.category(ch)
    if cat in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):  # controls, format (bidi overrides), separators
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return ch


def visible(text: Any, limit: int = TEXT_MAX_CHARS) -> str:
    """`text` as one line of plain text: every control or format character as a visible escape, at most
    `limit` characters shown (then "…"). A backslash is doubled, so an escape cannot be forged."""
    s = str(text) if text is not None else ""
    if len(s) > 4 * limit:  # bound the work on a huge value before escaping it
        s = s[: 4 * limit]
    out = "".join(_escape_char(ch) for ch in s)
    return out if len(out) <= limit else out[: max(limit - 1, 0)] + "…"


def markdown_cell(text: Any, limit: int = NAME_MAX_CHARS) -> str:
    """`text` as a markdown table cell that renders as itself: one line, no raw HTML, no markup, no `|`."""
    s = html.escape(visible(text, limit), quote=False)
    out = []
    for i, ch in enumerate(s):
        edge = ch == "_" and not (0 < i < len(s) - 1 and s[i - 1].isalnum() and s[i + 1].isalnum())
        out.append("\\" + ch if ch in _MARKDOWN or edge else ch)
    return "".join(out)


def html_text(text: Any, limit: int = NAME_MAX_CHARS) -> str:
    """`text` as HTML text or an attribute value: visible(), then escaped."""
    return html.escape(visible(text, limit), quote=True)
