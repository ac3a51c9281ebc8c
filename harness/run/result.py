"""The result record (format "pg-result", version 1), the results ledger, and the human card.

A result joins the phases' records and adds a provenance receipt: sha256 of the counted code
files, the artifact, the data manifest and the tokenizer; library versions; hardware; git commit.
Its `verification` starts as "unverified"; only `pgolf verify` changes it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self

from data.canonical import TargetBytes, load_canonical_bytes
from data.io import sha256_file, write_json_atomic
from data.manifest import MANIFEST_NAME, Manifest
from data.records import Types, field, require_format
from data.shards import read_split
from data.tokenizer import load_tokenizer
from harness.api import API_VERSION
from harness.config import ResolvedConfig
from harness.run.provenance import git_commit, hardware, library_versions
from harness.run.text import NAME_MAX_CHARS, visible
from scoring.score.evaluate import unigram_bpb
from scoring.statuses import SCORED, UNVERIFIED, VERIFICATION_STATES, Status, require_status
from scoring.tracks import Track

RESULT_FORMAT = "pg-result"
RESULT_FORMAT_VERSION = 1

_NUM_OR_NONE = (int, float, type(None))
_INT_OR_NONE = (int, type(None))
_STR_OR_NONE = (str, type(None))
_DICT_OR_NONE = (dict, type(None))
_MINIMAL_KEYS = frozenset(
    {"format", "format_version", "api_version", "status", "verification", "submission", "track", "preset"}
    | {"created_unix_s", "run_dir", "val_bpb", "val_loss"}
)
"""The keys of a minimal result (minimal_result), besides its detail."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResultRecord:
    """result.json ("pg-result"): built by build_result (a full result: `phases` set) or minimal_result
    (the status, the detail, who and where: the other fields None and left out of the JSON)."""

    format: str = RESULT_FORMAT
    format_version: int = RESULT_FORMAT_VERSION
    api_version: int = API_VERSION
    status: str
    detail: str | None = None
    verification: str = UNVERIFIED
    submission: dict[str, Any]
    track: str
    preset: str | None
    seed: int | None = None
    created_unix_s: float
    run_dir: str
    val_loss: float | None = None
    val_bpb: float | None = None
    val_tokens: int | None = None
    val_bytes: int | None = None
    eval_mode: str | None = None
    eval_dtype: str | None = None
    eval_time_s: float | None = None
    unigram_bpb: float | None = None
    bytes_code: int | None = None
    bytes_model: int | None = None
    bytes_total: int | None = None
    cap_bytes: int | None = None
    within_cap: bool | None = None
    train_time_s: float | None = None
    steps: int | None = None
    tokens_seen: int | None = None
    train_shards_used: int | None = None
    world_size: int | None = None
    phase_times_s: dict[str, Any] | None = None
    phases: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    verification_record: dict[str, Any] | None = None
    machine_load: dict[str, Any] | None = None
    """Other processes' CPU use over training and scoring (harness/run/load.py), and `contended`; a record
    track's CPU run on a contended machine has `record_contended` true."""
    cpu: dict[str, Any] | None = None
    """The CPU as the harness read it (model, flags, torch capability, native bfloat16) and the step mode
    the rank says it chose (harness/train/cpu.py)."""

    def __post_init__(self) -> None:
        require_status(self.status, "result status")  # every status written is one of docs/RULES.md's table
        if self.verification not in VERIFICATION_STATES:
            raise ValueError(
                f"result verification {str(self.verification)[:80]!r} is not one of {', '.join(VERIFICATION_STATES)}"
            )

    def to_json(self) -> dict[str, Any]:
        full = self.phases is not None
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None
            or (f.name not in ("detail", "verification_record") and (full or f.name in _MINIMAL_KEYS))
        }

    @classmethod
    def from_json(cls, d: object) -> Self:
        """A result read back, checked; ValueError names the field that is wrong."""
        what = "result record"
        d = require_format(d, what, RESULT_FORMAT, RESULT_FORMAT_VERSION)
        values = {
            k: field(d, k, types, what, required=k in _RESULT_REQUIRED, finite=True)
            for k, types in _RESULT_FIELDS.items()
        }
        sizes = [values[k] for k in ("bytes_code", "bytes_model", "bytes_total")]
        if all(isinstance(v, int) for v in sizes) and sizes[2] != sizes[0] + sizes[1]:
            raise ValueError(
                f"{what} field 'bytes_total' = {sizes[2]} is not bytes_code + bytes_model = {sizes[0] + sizes[1]}"
            )
        return cls(**values)


_RESULT_FIELDS: dict[str, Types] = {
    "format": str,
    "format_version": int,
    "api_version": int,
    "status": str,
    "detail": _STR_OR_NONE,
    "verification": str,
    "submission": dict,
    "track": str,
    "preset": _STR_OR_NONE,
    "seed": _INT_OR_NONE,
    "created_unix_s": (int, float),
    "run_dir": str,
    **dict.fromkeys(("val_loss", "val_bpb", "eval_time_s", "unigram_bpb", "train_time_s"), _NUM_OR_NONE),
    **dict.fromkeys(
        ("val_tokens", "val_bytes", "bytes_code", "bytes_model", "bytes_total", "cap_bytes", "steps"),
        _INT_OR_NONE,
    ),
    **dict.fromkeys(("tokens_seen", "train_shards_used", "world_size"), _INT_OR_NONE),
    "eval_mode": _STR_OR_NONE,
    "eval_dtype": _STR_OR_NONE,
    "within_cap": (bool, type(None)),
    **dict.fromkeys(
        ("phase_times_s", "phases", "config", "provenance", "verification_record", "machine_load", "cpu"),
        _DICT_OR_NONE,
    ),
}
_RESULT_REQUIRED = frozenset({"status", "verification", "submission", "track", "created_unix_s", "run_dir"})


def _unigram(manifest: Manifest, score: dict[str, Any]) -> float | None:
    counts = manifest.raw.get("train_unigram_counts")
    if not counts:
        return None
    table = load_tokenizer(manifest.tokenizer_path).byte_table()
    tokens = read_split(manifest.root, "val")
    canonical = load_canonical_bytes(manifest.root, manifest.raw, tokens, table.vocab_size, manifest.bos_id)
    denominator: TargetBytes = table if canonical is None else canonical  # the score's own bytes
    return unigram_bpb(
        counts, tokens, denominator, score["eval_seq_len"], score.get("eval_subset_max_tokens")
    )


def build_result(
    run_dir: Path,
    cfg: ResolvedConfig,
    meta: dict[str, Any],
    track: Track,
    phases: dict[str, Any],
    manifest: Manifest,
    *,
    status: str,
    pipeline_s: float,
) -> dict[str, Any]:
    train, pack, score = phases.get("train", {}), phases.get("pack", {}), phases.get("score", {})
    scored = status in SCORED and "val_bpb" in score
    return ResultRecord(
        status=status,
        detail=None if status == Status.OK else failing_detail(phases),
        verification=UNVERIFIED,
        submission={
            k: meta.get(k)
            for k in ("name", "author", "github_id", "date", "track", "data_variant", "builds_on")
        },
        track=track.name,
        preset=cfg.preset,
        seed=cfg.tables["run"]["seed"],
        created_unix_s=time.time(),
        run_dir=str(run_dir),
        # ---- the numbers ----
        val_loss=score.get("val_loss") if scored else None,
        val_bpb=score.get("val_bpb") if scored else None,
        val_tokens=score.get("val_tokens"),
        val_bytes=score.get("val_bytes"),
        eval_mode=score.get("eval_mode"),
        eval_dtype=score.get("eval_dtype"),
        eval_time_s=score.get("eval_time_s"),
        unigram_bpb=_unigram(manifest, score) if scored else None,
        bytes_code=pack.get("bytes_code"),
        bytes_model=pack.get("bytes_model"),
        bytes_total=pack.get("bytes_total"),
        cap_bytes=track.cap_bytes,
        within_cap=pack.get("within_cap"),
        train_time_s=train.get("train_time_s"),
        steps=train.get("steps"),
        tokens_seen=train.get("tokens_seen"),
        train_shards_used=train.get("train_shards_used"),
        world_size=train.get("world_size"),
        phase_times_s={
            "data": phases.get("data", {}).get("time_s"),
            "train_wall": train.get("wall_s"),
            "pack_encode": pack.get("encode_time_s"),  # the orchestrator's clock for a submission's codec
            "pack_wall": pack.get("wall_s"),
            "score_wall": score.get("score_wall_s"),
            "pipeline": pipeline_s,
        },
        phases=phases,
        config=cfg.tables,
        machine_load=_machine_load(train, score, track),
        cpu=_cpu(train),
        # ---- provenance receipt ----
        provenance={
            "code_files": pack.get("code_files"),
            "artifact_sha256": pack.get("artifact_sha256"),
            "data_manifest_sha256": sha256_file(manifest.root / MANIFEST_NAME),
            "tokenizer_sha256": sha256_file(manifest.tokenizer_path),
            "data_dir": str(manifest.root),
            "libraries": library_versions(),
            "hardware": hardware(),
            "harness_commit": git_commit(Path(__file__).resolve().parent),
        },
    ).to_json()


def _machine_load(train: dict[str, Any], score: dict[str, Any], track: Track) -> dict[str, Any] | None:
    """The phases' load records joined: contended when either phase was (None: neither was measured)."""
    loads = {
        k: v for k, v in (("train", train.get("machine_load")), ("score", score.get("machine_load"))) if v
    }
    if not loads:
        return None
    flags = [v.get("contended") for v in loads.values()]
    contended = True if any(flags) else (None if all(f is None for f in flags) else False)
    cpu_run = (train.get("launch") or {}).get("device", "cpu") == "cpu"
    return {**loads, "contended": contended, "record_contended": bool(contended and track.record and cpu_run)}


def _cpu(train: dict[str, Any]) -> dict[str, Any] | None:
    """The harness's own reading of the CPU, with the mode the rank reports it chose (CPU runs only)."""
    if (train.get("launch") or {}).get("device") != "cpu":
        return None
    from harness.train.cpu import read_facts

    rank = train.get("cpu") or {}
    return {
        **read_facts().to_json(),
        "mode_chosen": rank.get("chosen"),
        "mode_chosen_by": rank.get("chosen_by"),
        "trial_step_s": rank.get("trial_step_s"),
    }


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by its name ("inf", "-inf", "nan"): valid strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def write_result(run_dir: Path, result: ResultRecord | dict[str, Any], ledger: Path) -> None:
    """result.json, and one line appended to the ledger.

    The line goes out in a single write(2) under an exclusive lock, so concurrent runs never interleave
    and a process killed mid-append leaves either the whole line or none of it (a buffered text file
    may split a long line into several writes). Non-finite numbers are written as strings.
    """
    result = finite_json(result.to_json() if isinstance(result, ResultRecord) else result)
    write_json_atomic(run_dir / "result.json", result)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(result, sort_keys=True, allow_nan=False) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:  # a regular file takes it whole; the loop only guards against a short write
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)  # releases the lock


def minimal_result(
    run_dir: Path, cfg: ResolvedConfig, meta: dict[str, Any], track: Track, *, status: str, detail: str
) -> dict[str, Any]:
    """A result when the full one cannot be built: the status, the detail, who and where."""
    return ResultRecord(
        status=status,
        detail=detail,
        submission={k: meta.get(k) for k in ("name", "author", "github_id", "date", "track")},
        track=track.name,
        preset=cfg.preset,
        created_unix_s=time.time(),
        run_dir=str(run_dir),
    ).to_json()


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def card(result: dict[str, Any]) -> str:
    """The human card. Every line passes through text.visible: a name, a detail or any other text from a
    submission or a rank shows its control characters as escapes, so it can neither rewrite the terminal
    nor forge a line; a name shows at most NAME_MAX_CHARS characters."""
    r = result
    name = visible(r["submission"].get("name") or "?", NAME_MAX_CHARS)
    preset = visible(r["preset"], 40)
    lines = [
        f"┌─ pgolf result: {name} ({r['track']}, preset {preset}, seed {r['seed']})",
        f"│ status        {r['status']}  ({r['verification']}){_isolation_status(r)}",
        *_why_lines(r),
        f"│ val_bpb       {_fmt(r['val_bpb'], '.4f')} bits/byte   val_loss {_fmt(r['val_loss'], '.4f')} nats/token",
        f"│ unigram_bpb   {_fmt(r['unigram_bpb'], '.4f')} bits/byte (context: a unigram model of the training tokens)",
        f"│ scored        {_fmt(r['val_tokens'], ',')} tokens / {_fmt(r['val_bytes'], ',')} bytes, "
        f"{r['eval_mode'] or '-'} mode, {r['eval_dtype'] or '-'}, {_fmt(r['eval_time_s'], '.1f')} s",
        f"│ bytes_total   {_fmt(r['bytes_total'], ',')} = code {_fmt(r['bytes_code'], ',')} + model {_fmt(r['bytes_model'], ',')}"
        f"  (cap {r['cap_bytes']:,}, within_cap {r['within_cap']})",
        f"│ training      {_fmt(r['train_time_s'], '.1f')} s (the supervisor's clock); the rank reports "
        f"{_fmt(r['steps'], ',')} steps, {_fmt(r['tokens_seen'], ',')} tokens,"
        f" {r['world_size'] or '-'} rank(s)",
        f"│ hardware      {r['provenance']['hardware']['cpu']}"
        + (
            f", {r['provenance']['hardware']['cuda_devices']}"
            if r["provenance"]["hardware"]["cuda_devices"]
            else ""
        ),
        *_isolation_lines(r),
        *_cpu_lines(r),
        *_remedy_lines(r),
        *_plot_lines(r),
        f"└─ {r['run_dir']}/result.json",
    ]
    return "\n" + "\n".join(visible(line, CARD_LINE_MAX_CHARS) for line in lines)


CARD_LINE_MAX_CHARS = 1000
_ISOLATION_KEYS = ("launch.sandbox", "launch.network", "launch.sandbox_read_paths")


def _isolation_status(r: dict[str, Any]) -> str:
    """What the status line says when the run was not fully isolated: the sandbox off (by the run's config or
    an unsandboxed machine), a track rule that loosens isolation, or an official's missing-layer override."""
    phases = r.get("phases") or {}
    train = (phases.get("train") or {}).get("isolation") or {}
    workers = [w.get("isolation") or {} for w in (phases.get("score") or {}).get("workers") or []]
    sandbox = ((r.get("config") or {}).get("launch") or {}).get("sandbox")
    loosened = [x for x in (phases.get("command") or {}).get("loosened") or [] if isinstance(x, dict)]
    notes = []
    if train.get("mode") == "off" or any(w.get("mode") == "off" for w in workers) or sandbox == "off":
        notes.append(
            f"NOT ISOLATED: the sandbox was off (launch.sandbox {sandbox!r}): training and scored code could "
            "read any file, the validation data included"
        )
    elif train and not train.get("verified", True):
        notes.append("ISOLATION NOT VERIFIED: the sandbox's own probe did not hold on this machine")
    loose = [x for x in loosened if x.get("key") in _ISOLATION_KEYS and x.get("key") != "launch.sandbox"]
    if loose:
        notes.append("ISOLATION LOOSENED: " + ", ".join(f"{x['key']} = {x.get('value')!r}" for x in loose))
    other = [str(x.get("key")) for x in loosened if x.get("key") not in _ISOLATION_KEYS]
    if other:
        notes.append("track rules loosened: " + ", ".join(other))
    missing = sorted({m for p in (train, *workers) for m in p.get("missing_layers") or []})
    if missing and not notes:
        notes.append(f"without isolation layer(s) {', '.join(missing)}")
    return "".join(f"  — {n}" for n in notes)


def failing_detail(phases: dict[str, Any]) -> str | None:
    """The first failing phase's detail, as "PHASE: detail" (None: no phase failed with one)."""
    for name, phase in phases.items():
        if isinstance(phase, dict) and phase.get("status") not in (None, Status.OK) and phase.get("detail"):
            return f"{name}: {phase['detail']}"
    return None


def _why_lines(r: dict[str, Any], limit: int = 220) -> list[str]:
    """A run that did not end ok says why on its card: the result's detail, else the failing phase's."""
    if r["status"] == Status.OK:
        return []
    detail = r.get("detail") or failing_detail(r.get("phases") or {})
    if not detail:
        return []
    return [f"│ why           {visible(' '.join(str(detail).split()), limit)}"]


def _isolation_lines(r: dict[str, Any]) -> list[str]:
    """A card line when an official let the run go without an isolation layer (config.json records it)."""
    launch = (r.get("config") or {}).get("launch") or {}  # the result's config: the resolved tables
    allowed = launch.get("allow_missing_layers") or ""
    if not allowed:
        return []
    return [
        f"│ isolation     official override: ran without {allowed.replace(',', ', ')} (--allow-missing-layer)"
    ]


def _plot_lines(r: dict[str, Any]) -> list[str]:
    """The card's line for the training curve (harness/run/plot.py): its file, or why there is none."""
    plot = (r.get("phases") or {}).get("plot")
    if not isinstance(plot, dict):
        return []
    if plot.get("file"):
        return [f"│ plot          {r['run_dir']}/{plot['file']}  (training loss against time and step)"]
    return [f"│ plot          not drawn: {plot.get('error') or '?'} (the run's status is unchanged)"]


def _cpu_lines(r: dict[str, Any]) -> list[str]:
    """The CPU's flags and step mode (CPU runs), and the machine's load (every run that measured it)."""
    from harness.run.load import describe, describe_threads

    lines = []
    cpu = r.get("cpu")
    if cpu:
        lines.append(
            f"│ cpu           {','.join(cpu.get('flags') or []) or '-'}; torch {cpu.get('torch_capability')}, "
            f"native bfloat16 {cpu.get('native_bf16')}; step mode {cpu.get('mode_chosen') or '-'}"
            f" ({cpu.get('mode_chosen_by') or '-'})"
        )
    threads = ((r.get("phases") or {}).get("train") or {}).get("threads")
    if isinstance(threads, dict):
        lines.append(f"│ threads       {describe_threads(threads)}")
    scoring = ((r.get("phases") or {}).get("score") or {}).get("threads_choice")
    if isinstance(scoring, dict):
        lines.append(
            f"│ score threads {scoring.get('threads_per_rank')}, chosen from the load ({scoring.get('why')})"
        )
    load = r.get("machine_load")
    if load:
        for phase in ("train", "score"):
            if load.get(phase):
                lines.append(f"│ load {phase:8s} {describe(load[phase])}")
        if load.get("record_contended"):
            lines.append(
                "│ CONTENDED     a record-track CPU result measured on a busy machine: not comparable"
            )
        elif load.get("contended"):
            lines.append(
                "│ contended     other processes shared the CPUs: speeds here are below the machine's"
            )
    return lines


def _remedy_lines(r: dict[str, Any]) -> list[str]:
    """What to do about a run that ended over budget or ran on a busy machine (one line; none otherwise)."""
    load = r.get("machine_load") or {}
    threads = ((r.get("phases") or {}).get("train") or {}).get("threads") or {}
    by_hand = threads.get("chosen_by") == "launch.threads"
    if r["status"] == Status.OVER_BUDGET:
        return [
            "│ remedy        a step ran past the budget's stop tolerance: on a busy machine stop the other work"
            + (" or lower launch.threads" if by_hand else "")
            + "; else make a step shorter (smaller train.train_batch_tokens) or give budget.train_s more"
        ]
    if load.get("contended"):
        return [
            "│ remedy        for speeds that compare, rerun when nothing else runs (see `load` above)"
            + ("; launch.threads was set by hand: unset it to let the load choose" if by_hand else "")
        ]
    return []


def print_card(result: dict[str, Any]) -> None:
    if "phases" not in result:  # a minimal result (harness/run/result.py minimal_result)
        print(
            f"\n── pgolf result: {visible(result['status'], 40)}: {visible(result.get('detail', ''))}\n"
            f"└─ {visible(result['run_dir'], CARD_LINE_MAX_CHARS)}/result.json",
            flush=True,
        )
        return
    print(card(result), flush=True)
