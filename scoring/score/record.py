"""The score record ("pg-score", version 2): what the scorer writes to --json-out as score.json.

    ScoreRecord    a finished score (status "ok"), built by scoring/score/scorer.py score_artifact
    ScoreFailure   a failed one (status, detail), built by scoring/score/cli.py failure_record
    read_score_record(d) -> ScoreRecord | ScoreFailure   (the pipeline and `pgolf verify` read through it)

`from_json` checks the format, the version, every field's type and that every measured number is
finite; a bad record is a ValueError naming the field. The nested sub-records (probes, the tokenizer
audit, adaptation, the code check, workers, enforcement, confinement, metrics) stay JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

from data.records import Types, field, require_format, require_object
from harness.api import API_VERSION
from scoring.statuses import Status

SCORE_FORMAT = "pg-score"
SCORE_FORMAT_VERSION = 2

_NUM = (int, float)
_INT_OR_NONE = (int, type(None))
_DICT_OR_NONE = (dict, type(None))


@dataclass(frozen=True, kw_only=True, slots=True)
class ScoreRecord:
    format: str = SCORE_FORMAT
    format_version: int = SCORE_FORMAT_VERSION
    api_version: int = API_VERSION
    status: str = Status.OK
    metric_version: int
    metrics: dict[str, Any]
    val_loss: float
    val_bpb: float
    byte_perplexity: float
    val_loss_sum_nats: float
    val_tokens: int
    val_bytes: int
    val_tokens_available: int
    eval_subset_max_tokens: int | None
    eval_subset_docs: int | None = None
    """The documents scored, each to its end, when the subset is cut by documents (EvalConfig.max_docs)."""
    eval_mode: str
    eval_dtype: str
    eval_seq_len: int
    eval_stride: int | None
    eval_batch_seqs: int
    eval_windows: int
    eval_batches: int
    eval_time_s: float
    """Seconds on the eval clock: the main worker's decode, build and warm-up, then scoring (eval_clock)."""
    eval_budget_s: float | None
    probes: dict[str, Any]
    rows_shuffled: bool
    tokenizer_audit: dict[str, Any]
    adaptation: dict[str, Any] | None
    code_check: dict[str, Any]
    workers: list[dict[str, Any]]
    worker_forwards: int
    enforcement: dict[str, Any]
    confinement: dict[str, Any]
    score_wall_s: float
    device: str
    device_name: str
    threads: int
    allocator: str
    submission_files_seen: list[str]
    artifact_sha256: str
    codec: dict[str, Any]
    data_manifest_sha256: str
    tokenizer_sha256: str
    torch: str
    eval_clock: dict[str, Any] | None = None
    denominator: dict[str, Any] | None = None
    """What val_bytes counts: the dataset's canonical byte counts (source "canonical", data/canonical.py) or the
    tokenizer's byte table ("piece_table": a dataset built without counts); None in records from before it."""
    """The scorer's readings behind eval_time_s: build_time_s, scoring_time_s, the probes' allowance."""
    crossing: dict[str, Any] | None = None
    """How the logits crossed from the model worker (version 1: scoring/worker/pinning.py): `scorer` and `worker`
    "pinned" or "pageable" (the worker's as it reported it), `why` each, and the bytes; None before it."""
    scoring_workers: int | None = None
    """Model workers the windows were sharded over. With score-first adaptation they were a group, and the bits
    depend on its size: a re-score uses as many (`pgolf verify`). None in records from before it: one."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: object) -> Self:
        """A score record read back, checked; ValueError names the field that is wrong."""
        what = "score record"
        d = require_format(d, what, SCORE_FORMAT, SCORE_FORMAT_VERSION)
        if d.get("status") != Status.OK:
            raise ValueError(f"{what} field 'status' = {str(d.get('status'))[:80]!r} is not 'ok'")
        values = {
            name: field(
                d,
                name,
                types,
                what,
                finite=True,
                non_negative=name in _NON_NEGATIVE,
                required=name not in _OPTIONAL,
            )
            for name, types in _SCORE_FIELDS.items()
        }
        if not all(isinstance(w, dict) for w in values["workers"]):
            raise ValueError(f"{what} field 'workers' is not a list of objects")
        if not all(isinstance(f, str) for f in values["submission_files_seen"]):
            raise ValueError(f"{what} field 'submission_files_seen' is not a list of names")
        return cls(**values)


_SCORE_FIELDS: dict[str, Types] = {
    "format": str,
    "format_version": int,
    "api_version": int,
    "status": str,
    "metric_version": int,
    "metrics": dict,
    "val_loss": _NUM,
    "val_bpb": _NUM,
    "byte_perplexity": _NUM,
    "val_loss_sum_nats": _NUM,
    "val_tokens": int,
    "val_bytes": int,
    "val_tokens_available": int,
    "eval_subset_max_tokens": _INT_OR_NONE,
    "eval_subset_docs": _INT_OR_NONE,
    "eval_mode": str,
    "eval_dtype": str,
    "eval_seq_len": int,
    "eval_stride": _INT_OR_NONE,
    "eval_batch_seqs": int,
    "eval_windows": int,
    "eval_batches": int,
    "eval_time_s": _NUM,
    "eval_budget_s": (int, float, type(None)),
    "probes": dict,
    "rows_shuffled": bool,
    "tokenizer_audit": dict,
    "adaptation": _DICT_OR_NONE,
    "code_check": dict,
    "workers": list,
    "worker_forwards": int,
    "enforcement": dict,
    "confinement": dict,
    "score_wall_s": _NUM,
    "device": str,
    "device_name": str,
    "threads": int,
    "allocator": str,
    "submission_files_seen": list,
    "artifact_sha256": str,
    "codec": dict,
    "data_manifest_sha256": str,
    "tokenizer_sha256": str,
    "torch": str,
    "eval_clock": _DICT_OR_NONE,
    "denominator": _DICT_OR_NONE,
    "crossing": _DICT_OR_NONE,
    "scoring_workers": _INT_OR_NONE,
}
"""Each field of ScoreRecord with the JSON types it may hold (numbers must be finite)."""
_OPTIONAL = frozenset({"eval_clock", "denominator", "crossing", "scoring_workers", "eval_subset_docs"})
"""Fields a record from before them may lack."""
_NON_NEGATIVE = frozenset(
    {"val_tokens", "val_bytes", "val_tokens_available", "val_loss_sum_nats", "eval_time_s", "score_wall_s"}
)


def unscored_targets_problem(score: dict[str, Any]) -> str | None:
    """Why a score left targets of its tokens out (None: it did not, or the record lacks the figures). Every mode
    scores each target 1..N-1 of the tokens it read (the first eval_subset_max_tokens + 1 of the split) once,
    except standard mode, which drops a partial last window: fewer than eval_seq_len (none under a cut by documents). A record that scored fewer
    (or more: a target twice) chose which predictions count (documents mode once left out every document's end:
    the hardest targets, with no bytes, about 0.002 bpb)."""
    n, subset, scored, seq_len = (
        score.get("val_tokens_available"),
        score.get("eval_subset_max_tokens"),
        score.get("val_tokens"),
        score.get("eval_seq_len"),
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, scored, seq_len)):
        return None
    assert isinstance(n, int) and isinstance(scored, int) and isinstance(seq_len, int)
    if isinstance(subset, int) and not isinstance(subset, bool) and subset > 0:
        n = min(n, subset + 1)
    missing = n - 1 - scored
    # only standard mode drops a tail; the other modes' windows are per document at most, so an entrant's
    # seq_len (free, and costless there) bounds nothing: a tolerance of seq_len let every document's end go
    mode = score.get("eval_mode")
    # a cut by documents scores each to its end in every mode (scoring/score/windows.py whole_documents)
    allowed = max(seq_len, 1) - 1 if mode == "standard" and not score.get("eval_subset_docs") else 0
    if missing < 0:
        return (
            f"scored {scored:,} targets, more than the {n - 1:,} its tokens hold ({mode!r} mode): some twice"
        )
    if missing > allowed:
        return (
            f"scored {scored:,} of the {n - 1:,} targets its tokens hold ({mode!r} mode): {missing:,} left out, "
            f"and only standard mode's last partial window (under {seq_len:,}) may be"
        )
    return None


FAILURE_ORIGINS = ("submission", "scorer", "input")
"""Who a failed score is on: the submission (its worker failed or broke a rule: a verdict on the entry), the
scorer itself (a harness failure), or its input (an artifact, code folder or dataset it refused)."""
DETAIL_MAX_CHARS = 500


def cause_line(text: str, limit: int = DETAIL_MAX_CHARS) -> str:
    """One line naming the cause of a failure whose text may hold a traceback: its first line, and the
    traceback's last line (the exception and its message) when there is one; bounded."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0], lines[-1]
    if first.startswith("Traceback (most recent call last)"):  # a bare traceback: the exception it ends with
        line = last
    elif any(x.startswith("Traceback (most recent call last)") for x in lines):  # a line, then a traceback
        line = f"{first.rstrip(':')}: {last}"
    else:
        line = " ".join(lines)
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass(frozen=True, kw_only=True, slots=True)
class ScoreFailure:
    """A failed score: its verdict (error, illegal, over_eval_budget, out_of_memory), why in one line, and
    who it is on (`origin`, FAILURE_ORIGINS). The traceback goes to the scorer's stderr (the score log)."""

    format: str = SCORE_FORMAT
    format_version: int = SCORE_FORMAT_VERSION
    status: str
    detail: str
    origin: str = "submission"

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: object) -> Self:
        what = "score failure record"
        d = require_format(d, what, SCORE_FORMAT, SCORE_FORMAT_VERSION)
        origin = field(d, "origin", str, what, required=False) or "submission"
        if origin not in FAILURE_ORIGINS:
            raise ValueError(
                f"{what} field 'origin' = {origin[:80]!r} is not one of {', '.join(FAILURE_ORIGINS)}"
            )
        return cls(status=field(d, "status", str, what), detail=field(d, "detail", str, what), origin=origin)


def read_score_record(d: object) -> ScoreRecord | ScoreFailure:
    """score.json read back: a ScoreRecord when its status is "ok", else a ScoreFailure (ValueError if malformed)."""
    if require_object(d, "score record").get("status") == Status.OK:
        return ScoreRecord.from_json(d)
    return ScoreFailure.from_json(d)
