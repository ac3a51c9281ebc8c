"""Checks shared by the typed records' `from_json` (scoring/artifact/pack.py PackRecord,
scoring/score/record.py ScoreRecord, harness/train/rank.py RankReport, harness/run/result.py
ResultRecord): a record read back is checked field by field, and a bad one is a ValueError naming
the field, never a KeyError or a TypeError further on.
"""

from __future__ import annotations

import math
from typing import Any

Types = type | tuple[type, ...]


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def require_object(d: object, what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"{what} is not a JSON object (got {type(d).__name__})")
    return d


def require_format(d: object, what: str, fmt: str, version: int) -> dict[str, Any]:
    """`d` as a dict whose `format` is `fmt` and `format_version` is `version`."""
    d = require_object(d, what)
    if d.get("format") != fmt:
        raise ValueError(f"{what} field 'format' = {str(d.get('format'))[:80]!r} is not {fmt!r}")
    v = d.get("format_version")
    if isinstance(v, bool) or v != version:
        raise ValueError(f"{what} field 'format_version' = {str(v)[:80]} is not {version}")
    return d


def field(
    d: dict[str, Any],
    key: str,
    types: Types,
    what: str,
    *,
    required: bool = True,
    finite: bool = False,
    non_negative: bool = False,
) -> Any:
    """d[key], checked: one of `types` (a bool is never an int), finite, non-negative if asked.

    A missing key is an error when `required`, else None."""
    if key not in d:
        if required:
            raise ValueError(f"{what} lacks the field {key!r}")
        return None
    v = d[key]
    ts = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, ts) or (isinstance(v, bool) and bool not in ts):
        raise ValueError(f"{what} field {key!r} = {str(v)[:80]} is not {_names(ts)}")
    if finite and isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{what} field {key!r} = {v} is not a finite number")
    if non_negative and isinstance(v, int | float) and not isinstance(v, bool) and v < 0:
        raise ValueError(f"{what} field {key!r} = {v} is negative")
    return v
