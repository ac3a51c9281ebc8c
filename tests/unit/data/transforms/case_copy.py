"""A submitted copy of data/proof.py's CaseTransform, as a transform.py (the contract: docs/RULES.md)."""

import re
import unicodedata

NAME = "case"
UPPER = "\ue000"
ESCAPE = "\ue001"
SHIFT = 0x100
MARKERS = (UPPER, ESCAPE)
_DECODE = re.compile("[\ue000\ue001].?", re.S)
_TABLE: dict[int, str] = {}


def _one(cp: int) -> str:
    ch = chr(cp)
    out = ch
    if ch in MARKERS:
        out = ESCAPE + chr(cp + SHIFT)
    else:
        lo = ch.lower()
        if (
            len(lo) == 1
            and lo != ch
            and lo.upper() == ch
            and len(lo.encode("utf-8")) == len(ch.encode("utf-8"))
            and unicodedata.normalize("NFKC", ch) == ch
            and unicodedata.normalize("NFKC", lo) == lo
        ):
            out = UPPER + lo
    return out


class _Table(dict):
    def __missing__(self, cp: int) -> str:
        self[cp] = out = _one(cp)
        return out


_T = _Table()


def encode_text(text: str) -> str:
    return text.translate(_T)


def _undo(m: re.Match) -> str:
    s = m.group(0)
    if len(s) == 2 and s[0] == UPPER and len(s[1].upper()) == 1:
        return s[1].upper()
    if len(s) == 2 and s[0] == ESCAPE and chr(ord(s[1]) - SHIFT) in MARKERS:
        return chr(ord(s[1]) - SHIFT)
    return s


def decode_text(text: str) -> str:
    return _DECODE.sub(_undo, text)
