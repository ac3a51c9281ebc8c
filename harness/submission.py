"""The submission folder: structural checks before any compute is spent, and submission.json.

`check_submission(dir)` verifies the required files and hooks exist (by reading the code, not
running it) and validates submission.json against its schema (schema_version 1). Both are read as the
folder's own files, before the folder rules run: a link is refused, never followed, and a file over its cap
(SUBMISSION_JSON_MAX_BYTES; the artifact cap for code) is refused unread.

    name, author, github_id (str), date (YYYY-MM-DD), track (a known track), data_variant (sp<VOCAB>
    or byte260, +case with the case transform: the tokenization the entry trains on), blurb (str);
    optional: builds_on (str), claimed (object of numbers; never trusted).

Every tokenization may run on every track: a record track decides by its documents and the proof the
dataset's build ran (scoring/tracks.py dataset_problem), never by the variant's name.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

from data.io import read_regular
from harness.api import SUBMISSION_JSON
from scoring.artifact.cap import ARTIFACT_CAP_BYTES, CODE_BUNDLE, read_bundle
from scoring.codecheck import source_tokens_problem
from scoring.errors import SubmissionError, did_you_mean
from scoring.tracks import TRACKS

SCHEMA_VERSION = 1
REQUIRED_FIELDS: dict[str, type] = {
    "name": str,
    "author": str,
    "github_id": str,
    "date": str,
    "track": str,
    "data_variant": str,
    "blurb": str,
}
OPTIONAL_FIELDS: dict[str, type] = {"builds_on": str, "claimed": dict, "schema_version": int}
DATA_VARIANT_RE = re.compile(r"(sp[1-9]\d*|byte260)(\+case)?")
TEXT_LIMITS = {"name": 200, "author": 200, "github_id": 100, "builds_on": 200, "blurb": 10_000}
"""The most characters each text field may hold; none may hold a control or format character (a blurb may
hold newlines and tabs). Shown anywhere, text is escaped too (harness/run/text.py): this is the early word."""
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
"""Control, format (bidi overrides, zero-width, the soft hyphen, tag characters), line and paragraph
separators, surrogates: characters a reader does not see as themselves. A regex of ranges missed some
(U+00AD, U+E0041): "naive_base\u00adline" showed as another entry's name."""


def _hidden_char(text: str, allowed: str = "") -> tuple[str, int] | None:
    """The first character of `text` in _HIDDEN_CATEGORIES (not in `allowed`) and where it is, or None."""
    for i, ch in enumerate(text):
        if ch not in allowed and unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            return ch, i
    return None


SUBMISSION_JSON_MAX_BYTES = 1 << 20
"""The most bytes submission.json may hold (its longest field, a 10,000-character blurb, is a small part of it)."""


def _read_plain(p: Path, max_bytes: int) -> bytes:
    """The bytes of the folder's own file `p`, read before the folder rules run: a link is refused, not followed
    out of the folder, and a file larger than `max_bytes` is refused unread (a 1 GiB submission.json cost the
    queue's triage 3.3 GB of memory; a large enough one ended the queue for every entry)."""
    if p.is_symlink():  # the friendly word; read_regular's O_NOFOLLOW is what holds
        raise SubmissionError(
            f"{p} is a symbolic link; a submission folder holds regular files and never follows a link: "
            "replace it with a copy of what it points to"
        )
    try:
        return read_regular(p, max_bytes)
    except (OSError, ValueError) as e:
        raise SubmissionError(
            f"{p}: {e}; a submission folder holds regular files within their caps"
        ) from None


def _defines(source: str, where: str, func: str) -> bool:
    tree = ast.parse(source, filename=where)
    return any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body)


def _source(root: Path, fname: str) -> tuple[str, str] | None:
    """(where, text) of a top-level source: the loose file, else its member of the code bundle."""
    p = root / fname
    if p.is_file() or p.is_symlink():
        try:
            return str(p), _read_plain(p, ARTIFACT_CAP_BYTES).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SubmissionError(
                f"{p} is not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8"
            ) from None
    bundle = root / CODE_BUNDLE
    if bundle.is_file() and not bundle.is_symlink() and bundle.stat().st_size <= ARTIFACT_CAP_BYTES:
        for rel, data in read_bundle(bundle.read_bytes(), bundle):  # FolderRefused (one line) if hostile
            if rel == fname:
                return f"{bundle}:{fname}", data.decode("utf-8", errors="replace")
    return None


def validate_metadata(meta: Any, where: str) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise SubmissionError(f"{where}: expected a JSON object")
    version = meta.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SubmissionError(f"{where}: schema_version {version}; this harness reads {SCHEMA_VERSION}")
    for key, typ in REQUIRED_FIELDS.items():
        if not isinstance(meta.get(key), typ):
            raise SubmissionError(
                f"{where}: field {key!r} is required and must be a {typ.__name__} (got {meta.get(key)!r})"
            )
    for key, typ in OPTIONAL_FIELDS.items():
        if key in meta and not isinstance(meta[key], typ):
            raise SubmissionError(f"{where}: field {key!r} must be a {typ.__name__}")
    unknown = set(meta) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS)
    if unknown:
        raise SubmissionError(
            f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(REQUIRED_FIELDS) + sorted(OPTIONAL_FIELDS)}"
        )
    for key, limit in TEXT_LIMITS.items():
        text = meta.get(key)
        if not isinstance(text, str):
            continue
        if len(text) > limit:
            raise SubmissionError(f"{where}: field {key!r} is {len(text):,} characters; at most {limit:,}")
        bad = _hidden_char(text, "\n\t" if key == "blurb" else "")
        if bad:
            raise SubmissionError(
                f"{where}: field {key!r} holds the control character {bad[0]!r} at {bad[1]}; "
                "text fields are plain text"
            )
    try:
        dt.date.fromisoformat(meta["date"])
    except ValueError as e:
        raise SubmissionError(f"{where}: date {meta['date']!r} must be YYYY-MM-DD") from e
    if meta["track"] not in TRACKS:
        raise SubmissionError(
            f"{where}: unknown track {meta['track']!r}{did_you_mean(str(meta['track']), TRACKS)}; known: {', '.join(TRACKS)}"
        )
    if not DATA_VARIANT_RE.fullmatch(meta["data_variant"]):
        raise SubmissionError(
            f"{where}: data_variant {meta['data_variant']!r} is not a dataset variant; allowed: sp<VOCAB> (e.g. sp1024) or byte260, with +case for the case transform (sp8192+case)"
        )
    for k, v in meta.get("claimed", {}).items():
        if not isinstance(v, int | float):
            raise SubmissionError(f"{where}: claimed.{k} must be a number")
    return meta


def check_submission(submission_dir: str | Path) -> dict[str, Any]:
    """Check the folder's structure and return its validated submission.json."""
    root = Path(submission_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"submission folder not found: {root}")
    for fname, func in (("model.py", "build_model"), ("train.py", "train")):
        found = _source(root, fname)
        if found is None:
            raise FileNotFoundError(
                f"{root / fname} is missing: a submission needs model.py (build_model) and train.py (train), "
                f"in the folder or in its {CODE_BUNDLE}"
            )
        where, text = found
        too_big = source_tokens_problem(text)
        if too_big is not None:
            raise SubmissionError(f"{where}: {too_big}")
        try:
            ok = _defines(text, where, func)
        except SyntaxError as e:
            raise SubmissionError(f"{where} does not parse: {e}") from e
        except (RecursionError, MemoryError):  # the parser's own limits (`1+1+...` 3,000 terms deep)
            raise SubmissionError(
                f"{where}: does not parse (nested too deeply for Python's parser)"
            ) from None
        if not ok:
            raise SubmissionError(f"{where} must define a top-level function {func}(...)")
    path = root / SUBMISSION_JSON
    if not (path.is_file() or path.is_symlink()):
        raise FileNotFoundError(f"submission metadata not found: {path}; `pgolf new` writes one to fill in")
    try:
        meta = json.loads(_read_plain(path, SUBMISSION_JSON_MAX_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise SubmissionError(
            f"{path} is not valid JSON in UTF-8 ({e}); fix it, or start again from `pgolf new`"
        ) from None
    return validate_metadata(meta, str(path))
