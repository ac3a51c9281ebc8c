"""`pgolf leaderboard [--track T] --out DIR`: the results ledger as a markdown table, a JSON file and a web page.

    pgolf leaderboard --ledger runs/ledger.jsonl --out site/ [--track 10min_16mb]

The ledger is append-only JSON lines: "pg-result" records (one per run, written by the runner) and
"pg-verification" records (written by `pgolf verify`, keyed by the result's digest). A result's
verification is the latest verification record for exactly its digest (harness/records/verify.py); a
"verified" written into a result by hand, without one, counts for nothing. A line is its writer's word:
a string or a list where a number or an object goes is no number (listed apart, never a crash), a
verified result ranks only with bytes within its track's cap and a bpb above zero (the board checks the
numbers it shows, never within_cap alone), and the same result twice is one run.

Only verified results that scored (status ok, within the cap) on a record track rank (a smoke or untimed
track's results are listed, never ranked; an unknown --track is refused). A failed run's row and a run
measured on a contended machine are marked beside the name, and so is every row whose name reads like
another entry's (one skeleton: case, NFKC, zero-width and combining characters aside, I l 1 as one) or mixes Latin
with Cyrillic or Greek letters (`lookalike`: a name, author and GitHub id are free text), and every row two of whose
seeds were one run (`one_run`: one seed twice, one artifact or one score to the last bit, harness/records/reproduce.py
same_runs: a train.py that fixed its own seed); an empty board says "no verified results yet". They are grouped by
(submission name, track, preset, overrides): a row's val_bpb is the mean over its verified seeds, each at the
worse of its own figure and its verification's re-score (`rescored`: a loose --tol-bpb buys nothing) (with
the standard deviation and the seed count), sorted ascending (bpb is the ranking metric, lower is
better). Every other result (unverified, failed verification, errors, over budget) is listed apart,
one row per run. Every row says what ran: preset, track, the `--set` overrides (shortened; in full on
hover; `log.*` left out, tracking changes no result) and when it ran (UTC), so runs of one entry under
different settings can be told apart; each links its training-curve plot (RUN_DIR/train_curve.png,
harness/run/plot.py) when the run drew one, and shows its lineage ("builds on"), linked to the
row it builds on.

Outputs in DIR: leaderboard.md, leaderboard.json ("pg-leaderboard", version 1) and index.html, a
self-contained page (no network, no libraries): a table sortable by clicking any header (a URL
fragment `#sort=KEY` or `#sort=-KEY` sorts on load, which is how the browser test drives it), and
two inline SVG plots: val_bpb against total bytes, and val_bpb against the time each ran with the
record line (ticks in days, or in hours and minutes when the runs fall within a day or two).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import html
import json
import math
import os
import re
import statistics
import time
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from data.io import write_bytes_atomic, write_json_atomic
from harness.records.verify import result_digest
from harness.run.text import NAME_MAX_CHARS, html_text, markdown_cell, visible
from scoring.score.bpb import METRIC_VERSION
from scoring.score.record import unscored_targets_problem
from scoring.statuses import OK, UNVERIFIED, VERIFIED
from scoring.tracks import TRACKS, subset_problem

LEADERBOARD_FORMAT = "pg-leaderboard"
LEADERBOARD_FORMAT_VERSION = 1
DEFAULT_LEDGER = "runs/ledger.jsonl"
COLUMNS = [  # key, header, type
    ("rank", "#", "num"),
    ("name", "Entry", "str"),
    ("preset", "Preset", "str"),
    ("track", "Track", "str"),
    ("overrides", "Overrides", "str"),
    ("val_bpb", "val_bpb", "num"),
    ("val_bpb_std", "± std", "num"),
    ("seeds", "Seeds", "num"),
    ("val_loss", "val_loss", "num"),
    ("bytes_total", "Bytes", "num"),
    ("date", "Date", "str"),
    ("run_time", "Run (UTC)", "str"),
    ("author", "Author", "str"),
    ("builds_on", "Builds on", "str"),
    ("plots", "Plot", "str"),
]
UNRANKED_COLUMNS = [
    ("name", "Entry"),
    ("preset", "Preset"),
    ("track", "Track"),
    ("overrides", "Overrides"),
    ("seed", "Seed"),
    ("status", "Status"),
    ("verification", "Verification"),
    ("val_bpb", "val_bpb"),
    ("bytes_total", "Bytes"),
    ("run_time", "Run (UTC)"),
    ("builds_on", "Builds on"),
    ("why", "Why not ranked"),
    ("plots", "Plot"),
    ("run_dir", "Run"),
]
_NUM_KEYS = ("seed", "val_bpb", "bytes_total")
OVERRIDES_SHORT_CHARS = 60
"""The overrides column shows this many characters (the whole list on hover and in the JSON)."""
CELL_MAX_CHARS = {"overrides": OVERRIDES_SHORT_CHARS, "run_dir": 200, "why": 200, "status": 40, "preset": 40}
"""What a cell shows of a value (NAME_MAX_CHARS for the others); the JSON keeps every value whole."""


# ---- Reading the ledger ----


def read_ledger(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(results in ledger order, latest verification record per result digest)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"results ledger not found: {path}; runs append to RUN_DIR/../ledger.jsonl (pass --ledger)"
        )
    results, verifications = [], {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{n} is not a JSON line ({e}); the ledger is append-only JSON lines"
            ) from e
        if not isinstance(rec, dict):
            raise ValueError(
                f"{path}:{n} is a JSON {type(rec).__name__}, not a record; the ledger is append-only JSON objects"
            )
        if rec.get("format") == "pg-result":
            results.append(rec)
        elif rec.get("format") == "pg-verification" and isinstance(rec.get("result_sha256"), str):
            verifications[rec["result_sha256"]] = rec
    return results, verifications


SCORE_MAX = 1e6
"""The largest val_loss or val_bpb a result may hold to rank or compare (no model scores a million nats a
token; larger numbers overflowed a mean or a variance: a traceback, not a verdict). pgolf compare's too."""
_RUN_CLOCK_SLACK_S = 86_400.0
"""How far past the board's own clock a run's time may lie (clocks of two machines); later is no time."""
_NUMBER_KEYS = ("val_bpb", "val_loss", "bytes_total", "seed", "created_unix_s")


def _number(v: Any) -> float | int | None:
    """A record's number as one (int or finite float), else None: a string ("inf", "nan", as
    harness/run/result.py writes non-finite numbers, or any text), a bool, a list are no number."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, int):  # JSON holds any integer; past 2**63 no float or count of the board's is one
        return v if abs(v) < 2**63 else None
    return v if math.isfinite(v) else None


_TEXT_KEYS = ("status", "track", "preset", "run_dir")


def _text(v: Any) -> str | None:
    """A record's text as text: a string as it is, None as None, anything else as its str()."""
    return v if v is None or isinstance(v, str) else str(v)


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _clean(r: dict[str, Any]) -> dict[str, Any]:
    """The result as the board reads it: its objects objects, its numbers numbers (else None). A ledger line
    is the word of whatever wrote it; one with a string where a number goes must not stop the board."""
    out = {**r, **{k: _number(r.get(k)) for k in _NUMBER_KEYS}}
    for key in ("submission", "phases", "provenance"):
        out[key] = _dict(r.get(key))
    out["phases"] = {k: _dict(v) for k, v in out["phases"].items()}
    # the text the board shows and writes back: an object with a NaN in it made the JSON unwritable
    out["submission"] = {k: _text(v) for k, v in out["submission"].items()}
    out.update({k: _text(r.get(k)) for k in _TEXT_KEYS})
    return out


def digest_or_none(r: dict[str, Any]) -> str | None:
    """The result's ledger key, None for a line no verification can name (a bare NaN or Infinity in it)."""
    try:
        return result_digest(r)
    except (TypeError, ValueError):
        return None


def verification_of(digest: str | None, verifications: dict[str, dict[str, Any]]) -> str:
    """The ledger's word on the result whose digest is `digest`: its latest verification's status, else
    unverified (a result's own "verification" field counts for nothing)."""
    ver = verifications.get(digest) if digest else None
    return str(ver.get("status")) if isinstance(ver, dict) else UNVERIFIED


_RESCORE_CHECK = re.compile(r"^re-score (val_bpb|val_loss) \(tolerance ")


def rescored(digest: str | None, verifications: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The val_bpb and val_loss the latest verification of `digest` found in its fresh re-score (its checks named
    "re-score val_bpb (tolerance …)"), each a finite number or left out."""
    ver = verifications.get(digest) if digest else None
    checks = ver.get("checks") if isinstance(ver, dict) else None
    found: dict[str, float] = {}
    for c in checks if isinstance(checks, list) else ():
        m = (
            _RESCORE_CHECK.match(c.get("name", ""))
            if isinstance(c, dict) and isinstance(c.get("name"), str)
            else None
        )
        value = _number(c.get("actual")) if m else None
        if m and value is not None:
            found[m.group(1)] = float(value)
    return found


def at_rescore(
    r: dict[str, Any], verifications: dict[str, dict[str, Any]], digest: str | None = None
) -> dict[str, Any]:
    """`r` with val_bpb and val_loss each the worse of its own and its latest verification's re-score (`rescored`;
    `digest` the result's as its file holds it, else `r`'s): what the board ranks, `pgolf compare` tests and the
    chain counts. A verify run under a loose --tol-bpb accepts a result's edited figure, which then ranked it; the
    re-score bounds it. A figure that is no number (`_number`) is left as it is, for the caller's own refusal."""
    again = rescored(digest if digest is not None else digest_or_none(r), verifications)
    return {
        **r,
        **{
            k: max(r[k], again[k])
            for k in ("val_bpb", "val_loss")
            if k in again and _number(r.get(k)) is not None
        },
    }


def _date(r: dict[str, Any]) -> str:
    d = (r.get("submission") or {}).get("date")
    if isinstance(d, str) and d:
        return d
    t = _run_unix_s(r)
    return dt.datetime.fromtimestamp(t, dt.UTC).date().isoformat() if t is not None else ""


def _overrides(r: dict[str, Any]) -> str:
    """The run's `--set` overrides as given (the pipeline records them: phases.command), without log.*."""
    given = ((r.get("phases") or {}).get("command") or {}).get("overrides") or []
    if not isinstance(given, list):  # a number or an object is no list of overrides
        return ""
    return " ".join(str(o) for o in given if isinstance(o, str) and not o.startswith("log."))


def _run_unix_s(r: dict[str, Any]) -> float | None:
    t = _number(r.get("created_unix_s"))
    # a run ends before the board that lists it (a day's slack for clocks): one "run" in year 9999 (or 1e20)
    # stretched the time axis past what a date can say, and the page stopped (ValueError, OverflowError)
    return float(t) if t is not None and 0 < t <= time.time() + _RUN_CLOCK_SLACK_S else None


def _run_time(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M") if t is not None else ""


def _plot(r: dict[str, Any]) -> dict[str, Any] | None:
    """{"seed", "path"} of the run's training-curve PNG, when it drew one (harness/run/plot.py)."""
    plot = (r.get("phases") or {}).get("plot") or {}
    name = plot.get("file") if isinstance(plot, dict) else None
    run_dir = r.get("run_dir")
    if not isinstance(name, str) or not name or "/" in name or not isinstance(run_dir, str) or not run_dir:
        return None
    if "\0" in name + run_dir:  # no file has a NUL in its path (resolving one raised ValueError: a crash)
        return None
    return {"seed": r.get("seed"), "path": str(Path(run_dir) / name)}


def entry_id(r: dict[str, Any]) -> str:
    """The entry a result belongs to, never its free-text name alone: sha256 of its name, author and GitHub
    id with the counted code it ran (the receipt's code files and their sha256), first 12 hex digits. Two
    entries with one name are two rows; one entry's seeds (the same code) are one."""
    sub = r.get("submission") or {}
    ident = {k: sub.get(k) for k in ("name", "author", "github_id")}
    ident["code_files"] = (r.get("provenance") or {}).get("code_files")
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]


def rules_problem(r: dict[str, Any]) -> str | None:
    """Why a result was not scored under its track's rules (None: it was): the validation subset it scored
    against the track's, a loosened track rule, another metric version. A board ranks one rule set."""
    track = TRACKS.get(str(r.get("track")))
    if track is None:
        return f"track {visible(r.get('track'), 40)!r} is not one this harness knows"
    score = (r.get("phases") or {}).get("score") or {}
    problem = subset_problem(track, score)
    if problem:
        return problem
    loosened = ((r.get("phases") or {}).get("command") or {}).get("loosened") or []
    if loosened:
        keys = ", ".join(str(x.get("key")) for x in loosened if isinstance(x, dict))
        return f"the track's rules were loosened ({visible(keys, 120)})"
    version = score.get("metric_version", METRIC_VERSION)
    if version != METRIC_VERSION:
        return f"scored with metric version {visible(version, 20)}, this board ranks version {METRIC_VERSION}"
    return unscored_targets_problem(score)


def scored_problem(r: dict[str, Any]) -> str | None:
    """Why a verified result is no score to rank or accept (None: it is one): its track's rules (rules_problem)
    or numbers the board checks itself (bytes within the cap, bpb and loss not below zero). What the record
    chain (harness/records/chain.py) asks of a verified result too; a record that is no record is one."""
    r = _clean(r)
    try:
        return rules_problem(r) or _numbers_problem(r)
    except (TypeError, ValueError, AttributeError) as e:
        return f"malformed record ({visible(e, 120)})"


def unranked_track(r: dict[str, Any]) -> str | None:
    """Why a result's track never ranks (None: a record track ranks): smoke runs and untimed tracks are
    listed, never placed above or below a record."""
    track = TRACKS.get(str(r.get("track")))
    if track is not None and not track.record:
        return f"track {track.name} is not a record track: listed, never ranked"
    return None


def _numbers_problem(r: dict[str, Any]) -> str | None:
    """Why a result's numbers are no result on its track (None: they are): bytes outside 0..the track's cap,
    a bpb or loss below zero (no cross-entropy is). A record's within_cap is its writer's word; the board
    checks the numbers it shows."""
    track, n = TRACKS.get(str(r.get("track"))), r.get("bytes_total")
    if track is not None and n is not None and not 0 <= n <= track.cap_bytes:
        return f"bytes_total {n:,} is outside 0..{track.cap_bytes:,}, the track's cap"
    for key in ("val_bpb", "val_loss"):
        if r.get(key) is not None and r[key] < 0:
            return f"{key} {r[key]} is below zero"
        if r.get(key) is not None and r[key] > SCORE_MAX:
            # the mean of two 1e308 is inf: the board's JSON could not be written
            return f"{key} {r[key]:g} is over {SCORE_MAX:g}"
    return None


LOOKALIKE = "lookalike"


_LATIN_CONFUSABLES = str.maketrans({"i": "l", "1": "l", "|": "l", "\u0131": "l", "0": "o"})
"""Latin letters and digits drawn alike in a sans-serif page (case folded: a capital I is an i): each as one."""


def name_skeleton(name: str) -> str:
    """A name as it reads: NFKC (fullwidth and styled letters as plain ones), case folded, without format
    characters, combining marks or spaces, and the Latin look-alikes of one script as one (I, l, 1 and |; 0 and O;
    rn and m; vv and w: "naive_baseIine" with a capital I). Two entries' names with one skeleton look alike on a
    page."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", name).casefold())
    kept = "".join(ch for ch in folded if unicodedata.category(ch) not in ("Mn", "Me", "Cf", "Zs", "Cc"))
    return kept.translate(_LATIN_CONFUSABLES).replace("rn", "m").replace("vv", "w")


_LOOKALIKE_SCRIPTS = frozenset({"LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE"})
"""Scripts whose letters copy one another's shapes (Latin a, Cyrillic а, Greek ο, ...)."""


def mixed_scripts(name: str) -> bool:
    """Whether a name mixes letters of two look-alike scripts (Latin with Cyrillic or Greek, ...): the homoglyph
    trick ("nаive_baseline" with a Cyrillic а) that no skeleton catches without a table of confusables. Other
    mixes are a language's own (Japanese: kana with CJK ideographs) and are not marked."""
    nfkc = unicodedata.normalize("NFKC", name)
    scripts = {unicodedata.name(ch, "?").split(" ")[0] for ch in nfkc if ch.isalpha()}
    return len(scripts & _LOOKALIKE_SCRIPTS) > 1


def mark_lookalikes(rows: list[dict[str, Any]]) -> None:
    """Mark `lookalike` beside every row whose name reads like another entry's (one skeleton, two entry
    ids) or mixes scripts: an entrant's free-text name, author and GitHub id may copy another's exactly."""
    owners: dict[str, set[str]] = {}
    for row in rows:
        owners.setdefault(name_skeleton(str(row["name"])), set()).add(str(row["entry_id"]))
    for row in rows:
        name = str(row["name"])
        if len(owners[name_skeleton(name)]) > 1 or mixed_scripts(name):
            row["marks"] = sorted({*row.get("marks", []), LOOKALIKE})


def marks(r: dict[str, Any]) -> list[str]:
    """What a row shows beside its name: `failed` (a status other than ok), `contended` (its CPUs were shared
    with other processes, harness/run/load.py: its speed is not the machine's)."""
    out = []
    if r.get("status") != OK:
        out.append("failed")
    load = r.get("machine_load")
    if isinstance(load, dict) and load.get("contended"):
        out.append("contended")
    return out


ONE_RUN = "one_run"


def _one_run(rs: list[dict[str, Any]]) -> bool:
    """Whether two of a row's seeds were one run (reproduce.py same_runs: one seed twice, one artifact, one score
    to the last bit: a train.py that fixed its own seed); the row is marked `one_run`, its seeds one sample."""
    from harness.records.reproduce import same_runs

    view = [
        {"seed": r.get("seed"), "status": r.get("status"), "val_loss": r.get("val_loss"), "val_bpb": r.get("val_bpb"),
         "artifact_sha256": (r.get("provenance") or {}).get("artifact_sha256")}
        for r in rs
    ]  # fmt: skip
    return bool(same_runs(view))


def _why_unranked(r: dict[str, Any], verification: str, rules: str | None) -> str:
    if r.get("status") != OK:
        return f"status {visible(r.get('status'), 40)}"
    if r.get("within_cap") is not True:
        return "over the cap"
    if verification != VERIFIED:
        return f"verification {visible(verification, 40)}"
    return rules or "not scored"


def build(
    results: Iterable[dict[str, Any]], verifications: dict[str, dict[str, Any]], track: str | None
) -> dict[str, Any]:
    """The leaderboard record: ranked rows (verified groups) and unranked rows (every other run)."""
    if track and track not in TRACKS:
        raise ValueError(
            f"--track {visible(track, 40)!r} is not a track; the tracks: {', '.join(TRACKS)} (or leave --track out)"
        )
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    unranked = []
    seen: set[str] = set()
    for raw in results:
        if track and raw.get("track") != track:
            continue
        digest = digest_or_none(raw)
        if digest is not None and digest in seen:
            # the same result twice (a line appended again, a copied run) is one run, never a second seed
            continue
        seen.add(digest or "")
        r = _clean(raw)
        sub = r["submission"]
        verification = verification_of(digest, verifications)
        name = str(sub.get("name") or "?")
        rules = scored_problem(raw) or unranked_track(r)
        if (
            verification == VERIFIED
            and r.get("status") == OK
            and r.get("within_cap") is True
            and r.get("val_bpb") is not None
            and r.get("val_loss") is not None
            and r.get("bytes_total") is not None
            and rules is None
        ):
            key = (entry_id(r), str(r.get("track")), str(r.get("preset")), _overrides(r))
            groups.setdefault(key, []).append(at_rescore(r, verifications, digest))
            continue
        plot = _plot(r)
        unranked.append(
            {
                "entry_id": entry_id(r),
                "why": _why_unranked(r, verification, rules),
                "name": name,
                "preset": r.get("preset"),
                "overrides": _overrides(r),
                "run_unix_s": _run_unix_s(r),
                "run_time": _run_time(_run_unix_s(r)),
                "plots": [plot] if plot else [],
                "seed": r.get("seed"),
                "status": r.get("status"),
                "verification": verification,
                "val_bpb": r.get("val_bpb"),
                "bytes_total": r.get("bytes_total"),
                "date": _date(r),
                "builds_on": sub.get("builds_on") or "",
                "run_dir": r.get("run_dir"),
                "track": r.get("track"),
                "marks": marks(r),
            }
        )
    rows = []
    for (eid, tr, preset, overrides), rs in groups.items():
        bpb = [float(r["val_bpb"]) for r in rs]
        sub = rs[0].get("submission") or {}
        times = [t for t in map(_run_unix_s, rs) if t is not None]
        rows.append(
            {
                "entry_id": eid,
                "name": str(sub.get("name") or "?"),
                "track": tr,
                "preset": preset,
                "overrides": overrides,
                "run_unix_s": min(times) if times else None,
                "run_time": _run_time(min(times) if times else None),
                "plots": [p for p in map(_plot, rs) if p],
                "val_bpb": statistics.fmean(bpb),
                "val_bpb_std": statistics.stdev(bpb) if len(bpb) > 1 else 0.0,
                "seeds": len(rs),
                "val_loss": statistics.fmean(float(r["val_loss"]) for r in rs),
                "bytes_total": max(int(r["bytes_total"]) for r in rs),
                "date": min(_date(r) for r in rs),
                "author": sub.get("author") or "",
                "github_id": sub.get("github_id") or "",
                "builds_on": sub.get("builds_on") or "",
                "runs": [r.get("run_dir") for r in rs],
                "seed_list": [r.get("seed") for r in rs],
                "marks": sorted({m for r in rs for m in marks(r)} | ({ONE_RUN} if _one_run(rs) else set())),
            }
        )
    # ranks within a track: a board without --track holds several rule sets, each ranked on its own
    mark_lookalikes([*rows, *unranked])
    rows.sort(key=lambda row: (row["track"], row["val_bpb"], row["bytes_total"], row["entry_id"]))
    ranks: dict[str, int] = {}
    for row in rows:
        tr = str(row["track"])
        ranks[tr] = row["rank"] = ranks.get(tr, 0) + 1
    return {
        "format": LEADERBOARD_FORMAT,
        "format_version": LEADERBOARD_FORMAT_VERSION,
        "track": track,
        "generated_unix_s": time.time(),
        "ranked": rows,
        "unranked": unranked,
    }


# ---- Markdown ----


def _fmt(v: Any, key: str) -> str:
    """A value as a cell's plain text (escaped for markdown or HTML by the caller)."""
    if v is None or v == "" or v == []:
        return "-"
    if key in ("val_bpb", "val_loss"):
        return f"{float(v):.4f}"
    if key == "val_bpb_std":
        return f"{float(v):.4f}"
    if key == "bytes_total":
        return f"{int(v):,}"
    return str(v)


def _md(row: dict[str, Any], key: str) -> str:
    """A markdown cell: the value as text that renders as itself (harness/run/text.py), bounded."""
    v = row.get(key)
    if key == "plots":
        links = [
            f"[seed {markdown_cell(p.get('seed'), 20)}](<{markdown_cell(p.get('path'), 300)}>)"
            for p in v or []
        ]
        return " ".join(links) or "-"
    text = markdown_cell(_fmt(v, key), CELL_MAX_CHARS.get(key, NAME_MAX_CHARS))
    if key == "name" and row.get("marks"):
        text += " " + " ".join(f"**[{m}]**" for m in row["marks"])
    return text


NO_RESULTS = "No verified results yet: a result ranks once `pgolf verify` has re-scored it on a record track."


def markdown(board: dict[str, Any]) -> str:
    track = f" — {markdown_cell(board['track'], 40)}" if board["track"] else ""
    title = f"# Leaderboard{track}\n\nOnly verified results rank (`pgolf verify`)."
    lines = [title, "", "| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in board["ranked"]:
        lines.append("| " + " | ".join(_md(row, k) for k, _, _ in COLUMNS) + " |")
    if not board["ranked"]:
        lines += ["", NO_RESULTS]
    lines += [
        "",
        f"## Not ranked ({len(board['unranked'])})",
        "",
        "| " + " | ".join(h for _, h in UNRANKED_COLUMNS) + " |",
        "|" + "---|" * len(UNRANKED_COLUMNS),
    ]
    for row in board["unranked"]:
        lines.append("| " + " | ".join(_md(row, k) for k, _ in UNRANKED_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


# ---- SVG plots ----


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / n
    if not (math.isfinite(raw) and raw > 0):  # 1e308 (or 1e17 + 0.5 == 1e17): no step to tick by
        return []
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def svg_plot(
    pid: str,
    title: str,
    points: list[dict[str, Any]],
    xkey: str,
    xlabel: str,
    xfmt: Any,
    frontier: bool = False,
    xticks: Callable[[float, float], list[float]] | None = None,
    xpad_min: float = 0.0,
) -> str:
    """A scatter plot of val_bpb against points[xkey] (ranked filled, unranked hollow).

    `xticks(lo, hi)` places the x ticks (default: 1-2-2.5-5 steps); `xpad_min` is the least margin
    either side of the points, in x units (a time axis of runs a minute apart still spans some hours)."""
    W, H, ml, mr, mt, mb = 560, 340, 64, 20, 34, 48
    pts = [p for p in points if p.get("val_bpb") is not None and p.get(xkey) is not None]
    out = [
        f'<svg id="{pid}" class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{W / 2}" y="20" text-anchor="middle" class="ptitle">{html.escape(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no scored results</text></svg>')
        return "".join(out)
    xs, ys = [float(p[xkey]) for p in pts], [float(p["val_bpb"]) for p in pts]
    padx = max(0.08 * ((max(xs) - min(xs)) or 1.0), xpad_min)
    pady = 0.08 * ((max(ys) - min(ys)) or 0.01)
    x0, x1, y0, y1 = min(xs) - padx, max(xs) + padx, min(ys) - pady, max(ys) + pady
    xt = [v for v in (xticks or _ticks)(x0, x1) if x0 <= v <= x1]
    yt = [v for v in _ticks(y0, y1) if y0 <= v <= y1]
    sx = lambda v: ml + (v - x0) / ((x1 - x0) or 1) * (W - ml - mr)
    sy = lambda v: H - mb - (v - y0) / ((y1 - y0) or 1) * (H - mt - mb)
    out.append(f'<rect x="{ml}" y="{mt}" width="{W - ml - mr}" height="{H - mt - mb}" class="frame"/>')
    for v in (v for v in xt if sx(v) < W - mr - 28):  # a label must not run off the right edge
        out.append(
            f'<line x1="{sx(v):.1f}" x2="{sx(v):.1f}" y1="{mt}" y2="{H - mb}" class="grid"/>'
            f'<text x="{sx(v):.1f}" y="{H - mb + 16}" text-anchor="middle" class="tick">{html.escape(xfmt(v))}</text>'
        )
    for v in yt:
        out.append(
            f'<line x1="{ml}" x2="{W - mr}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
            f'<text x="{ml - 6}" y="{sy(v) + 4:.1f}" text-anchor="end" class="tick">{v:.3g}</text>'
        )
    out.append(
        f'<text x="{(W + ml) / 2 + 40}" y="{H - 8}" text-anchor="middle" class="axis">{html.escape(xlabel)}</text>'
        f'<text x="14" y="{(H - mb + mt) / 2}" text-anchor="middle" class="axis" transform="rotate(-90 14 {(H - mb + mt) / 2})">val_bpb (bits/byte)</text>'
    )
    if frontier:
        ranked = sorted((p for p in pts if p.get("ranked")), key=lambda p: float(p[xkey]))
        best = math.inf
        path: list[str] = []
        for p in ranked:
            if float(p["val_bpb"]) < best:
                if path:
                    path.append(f"L{sx(float(p[xkey])):.1f},{sy(best):.1f}")
                best = float(p["val_bpb"])
                path.append(f"{'M' if not path else 'L'}{sx(float(p[xkey])):.1f},{sy(best):.1f}")
        if path:
            path.append(f"L{W - mr},{sy(best):.1f}")
            out.append(f'<path d="{" ".join(path)}" class="frontier"/>')
    for p in pts:
        cls = "pt ranked" if p.get("ranked") else "pt unranked"
        tip = f"{visible(p['name'], NAME_MAX_CHARS)}: {float(p['val_bpb']):.4f} bpb, {xfmt(float(p[xkey]))}"
        out.append(
            f'<circle cx="{sx(float(p[xkey])):.1f}" cy="{sy(float(p["val_bpb"])):.1f}" r="5" class="{cls}"><title>{html.escape(tip)}</title></circle>'
        )
        if p.get("ranked"):
            x = sx(float(p[xkey]))
            right = x > ml + 0.6 * (W - ml - mr)  # near the right edge: label to the left of the point
            out.append(
                f'<text x="{x - 7 if right else x + 7:.1f}" y="{sy(float(p["val_bpb"])) - 6:.1f}" class="label" '
                f'text-anchor="{"end" if right else "start"}">{html_text(p["name"], 40)}</text>'
            )
    out.append(
        f'<circle cx="{ml - 40}" cy="{H - 12}" r="4" class="pt ranked legend"/><text x="{ml - 32}" y="{H - 8}" class="tick">ranked</text>'
        f'<circle cx="{ml + 16}" cy="{H - 12}" r="4" class="pt unranked legend"/><text x="{ml + 24}" y="{H - 8}" class="tick">not ranked</text>'
    )
    out.append("</svg>")
    return "".join(out)


_MINUTE_S, _HOUR_S, _DAY_S = 60.0, 3600.0, 86400.0
_TIME_STEPS_S = (
    [m * _MINUTE_S for m in (1, 2, 5, 10, 15, 30)]
    + [h * _HOUR_S for h in (1, 2, 3, 6, 12)]
    + [d * _DAY_S for d in (1, 2, 7, 14, 30, 61, 91, 182, 365)]
)


def time_axis(lo_s: float, hi_s: float, n: int = 6) -> tuple[list[float], Callable[[float], str], str]:
    """Ticks for an axis of unix times (UTC): (tick values, their label, the axis label).

    Within about two days the ticks are times of day ("14:30"; the axis label names the day, or the
    first and last day); beyond, they are dates on whole days. Never the same label twice."""
    span = max(hi_s - lo_s, 1.0)
    step = next((st for st in _TIME_STEPS_S if span / st <= n), _TIME_STEPS_S[-1])
    first = math.ceil(lo_s / step) * step
    ticks = [first + i * step for i in range(int((hi_s - first) // step) + 1)]
    day = lambda t: dt.datetime.fromtimestamp(t, dt.UTC).date().isoformat()
    if step < _DAY_S:
        days = sorted({day(lo_s), day(hi_s)})
        multi = len({day(t) for t in ticks}) > 1
        fmt = "%m-%d %H:%M" if multi else "%H:%M"
        return (
            ticks,
            lambda t: dt.datetime.fromtimestamp(t, dt.UTC).strftime(fmt),
            f"run time (UTC, {' to '.join(days)})",
        )
    return ticks, day, "run date (UTC)"


# ---- HTML ----

_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#1b1f24}h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border-bottom:1px solid #d0d7de;padding:4px 6px;text-align:left;white-space:nowrap}
td.wrap{white-space:normal;min-width:6em;max-width:16em;overflow-wrap:anywhere}.mark{font-size:11px;padding:0 4px;border-radius:3px;color:#fff}
.mark.failed{background:#cf222e}.mark.contended{background:#9a6700}.mark.lookalike{background:#8250df}.mark.one_run{background:#bc4c00}tr.failed td{color:#6e7781}tr.empty td{color:#57606a;font-style:italic}
th{cursor:pointer;background:#f6f8fa;user-select:none}th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
td.num{text-align:right;font-variant-numeric:tabular-nums}.plots{display:flex;flex-wrap:wrap;gap:16px}
.plot{border:1px solid #d0d7de;background:#fff}.frame{fill:none;stroke:#8c959f}.grid{stroke:#eaeef2}.tick{font-size:10px;fill:#57606a}
.axis{font-size:11px;fill:#24292f}.ptitle{font-size:13px;font-weight:600}.pt.ranked{fill:#0969da}.pt.unranked{fill:#fff;stroke:#8c959f;stroke-width:1.5}
.label{font-size:10px;fill:#0969da}.frontier{fill:none;stroke:#1a7f37;stroke-width:2;stroke-dasharray:5 3}.note{color:#57606a;font-size:13px}"""

_JS = """function sortTable(th){const table=th.closest('table'),body=table.tBodies[0],idx=[...th.parentNode.children].indexOf(th);
const asc=th.getAttribute('aria-sort')!=='ascending',num=th.dataset.type==='num';
const val=r=>{const c=r.children[idx],v=c.dataset.sort;return num?(v===''?Infinity:parseFloat(v)):v.toLowerCase();};
[...body.rows].sort((a,b)=>{const x=val(a),y=val(b);return (x<y?-1:x>y?1:0)*(asc?1:-1);}).forEach(r=>body.appendChild(r));
[...th.parentNode.children].forEach(h=>h.removeAttribute('aria-sort'));th.setAttribute('aria-sort',asc?'ascending':'descending');}
document.querySelectorAll('table.sortable th').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
const m=location.hash.match(/^#sort=(-?)([a-z_]+)$/);if(m){const th=document.querySelector('#ranked th[data-key="'+m[2]+'"]');
if(th){th.click();if(m[1]==='-')th.click();}}"""


def _href(path: str, base: Path | None) -> str:
    """A link to a run's file from the page: relative to the page's folder when it can be, else a file URI."""
    p = Path(path)
    if base is not None:
        try:
            rel = os.path.relpath(p.resolve(), base.resolve())
        except ValueError:
            pass
        else:
            # a first segment with a colon is a URL's scheme: a run folder named after a submission folder
            # "javascript:alert(1)" made the plot's link run script when clicked
            return f"./{rel}" if ":" in rel.split("/", 1)[0] else rel
    return p.resolve().as_uri()


def _cell(row: dict[str, Any], key: str, typ: str, links: dict[str, str], base: Path | None = None) -> str:
    """A table cell: every value escaped (harness/run/text.py html_text) and bounded; `links` maps an
    entry's name to the id of its best ranked row (what a lineage links to; a name that two entries
    hold is in no link)."""
    v = row.get(key)
    if key == "plots":
        anchors = [
            f'<a class="plot-link" href="{html.escape(_href(p["path"], base))}">'
            f"{'seed ' + html_text(p['seed'], 20) if len(v or []) > 1 else 'plot'}</a>"
            for p in v or []
        ]
        return f'<td class="str" data-sort="{len(anchors)}">{" ".join(anchors) or "-"}</td>'
    limit = CELL_MAX_CHARS.get(key, NAME_MAX_CHARS)
    sort = "" if v is None or v == "" else (repr(float(v)) if typ == "num" else visible(v, limit))
    text = html_text(_fmt(v, key), limit)
    if key == "builds_on" and v and str(v) in links:
        text = f'<a href="#{html.escape(links[str(v)])}">{text}</a>'
    if key == "name" and row.get("marks"):
        text += "".join(f' <span class="mark {html.escape(m)}">{html.escape(m)}</span>' for m in row["marks"])
    if (
        key == "run_dir" and v
    ):  # the folder's name; the whole path on hover (a page 1,280 px wide has no room)
        text = html_text(Path(str(v)).name or str(v), limit)
    title = f' title="{html_text(v, 2000)}"' if key in ("overrides", "run_dir") and v else ""
    wrap = " wrap" if key in ("overrides", "run_dir", "why") or (key == "name" and row.get("marks")) else ""
    return f'<td class="{typ}{wrap}" data-sort="{html.escape(sort)}"{title}>{text}</td>'


def _bytes_label(pts: list[dict[str, Any]]) -> Callable[[float], str]:
    """Byte-axis labels with as many MB decimals as the spread of the points needs (never two alike)."""
    sizes = [float(p["bytes_total"]) for p in pts if p.get("bytes_total") is not None]
    spread = (max(sizes) - min(sizes)) if sizes else 0.0
    decimals = min(6, max(2, 1 - math.floor(math.log10(spread / 5 / 1e6)))) if spread > 0 else 2
    return lambda v: f"{v / 1e6:.{decimals}f} MB" if v >= 1e5 else f"{v:,.0f}"


def _row_ids(ranked: list[dict[str, Any]]) -> list[str]:
    """One id per ranked row: row-ENTRY_ID (an entry's rows of other presets or overrides: -2, -3, ...)."""
    seen: dict[str, int] = {}
    ids = []
    for r in ranked:
        seen[r["entry_id"]] = seen.get(r["entry_id"], 0) + 1
        n = seen[r["entry_id"]]
        ids.append(f"row-{r['entry_id']}" + (f"-{n}" if n > 1 else ""))
    return ids


def page(board: dict[str, Any], base: Path | None = None) -> str:
    """The HTML page; `base` is the folder it is written to (links to the runs' plots are relative to it)."""
    ranked, unranked = board["ranked"], board["unranked"]
    ids = _row_ids(ranked)
    links: dict[str, str] = {}
    owners: dict[str, set[str]] = {}
    for r, rid in zip(ranked, ids, strict=True):  # a name's best row (rows are sorted best first)
        links.setdefault(str(r["name"]), rid)
        owners.setdefault(str(r["name"]), set()).add(str(r["entry_id"]))
    # a name two entries hold links to neither: else the better one takes every lineage naming the other
    links = {name: rid for name, rid in links.items() if len(owners[name]) == 1}
    head = "".join(f'<th data-key="{k}" data-type="{t}">{html.escape(h)}</th>' for k, h, t in COLUMNS)
    body = (
        "".join(
            f'<tr id="{html.escape(rid)}" data-name="{html_text(r["name"])}">'
            + "".join(_cell(r, k, t, links, base) for k, _, t in COLUMNS)
            + "</tr>"
            for r, rid in zip(ranked, ids, strict=True)
        )
        or f'<tr class="empty"><td colspan="{len(COLUMNS)}">{html.escape(NO_RESULTS)}</td></tr>'
    )
    uhead = "".join(
        f'<th data-key="{k}" data-type="{"num" if k in _NUM_KEYS else "str"}">{html.escape(h)}</th>'
        for k, h in UNRANKED_COLUMNS
    )
    ubody = "".join(
        f'<tr class="{html.escape(" ".join(r.get("marks") or []))}">'
        + "".join(_cell(r, k, "num" if k in _NUM_KEYS else "str", links, base) for k, _ in UNRANKED_COLUMNS)
        + "</tr>"
        for r in unranked
    )
    pts = [{**r, "ranked": True} for r in ranked] + [{**r, "ranked": False} for r in unranked]
    times = [
        float(p["run_unix_s"])
        for p in pts
        if p.get("run_unix_s") is not None and p.get("val_bpb") is not None
    ]
    lo, hi = min(times, default=0.0), max(times, default=0.0)
    pad_s = max(0.08 * ((hi - lo) or 1.0), 10 * _MINUTE_S)  # svg_plot's margin (xpad_min below)
    t_ticks, t_fmt, t_label = time_axis(lo - pad_s, hi + pad_s)
    plot_bytes = svg_plot(
        "plot-bytes",
        "val_bpb against total bytes",
        pts,
        "bytes_total",
        "bytes_total (code + model)",
        _bytes_label(pts),
    )
    plot_date = svg_plot(
        "plot-date",
        "val_bpb against when it ran (record line dashed)",
        pts,
        "run_unix_s",
        t_label,
        t_fmt,
        frontier=True,
        xticks=lambda lo, hi: t_ticks,
        xpad_min=10 * _MINUTE_S,
    )
    title = f"Parameter golf leaderboard{' — ' + visible(board['track'], 40) if board['track'] else ''}"
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style></head>
<body><h1>{html.escape(title)}</h1><p class="note">Only verified results rank (pgolf verify); val_bpb is the mean over verified seeds, lower is better.
Click a header to sort.</p>
<table id="ranked" class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<div class="plots">{plot_bytes}{plot_date}</div>
<h2>Not ranked: unverified, failed verification, or not scored ({len(unranked)})</h2>
<table id="unranked" class="sortable"><thead><tr>{uhead}</tr></thead><tbody>{ubody}</tbody></table>
<script>{_JS}</script></body></html>
"""


def write_leaderboard(ledger: str | Path, out: str | Path, track: str | None = None) -> dict[str, Any]:
    """Build from the ledger and write leaderboard.md, leaderboard.json and index.html into `out`."""
    results, verifications = read_ledger(ledger)
    board = build(results, verifications, track)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "leaderboard.json", board)
    write_bytes_atomic(out / "leaderboard.md", markdown(board).encode("utf-8"))
    write_bytes_atomic(out / "index.html", page(board, out).encode("utf-8"))
    return board


def cmd_leaderboard(args: argparse.Namespace) -> int:
    board = write_leaderboard(args.ledger, args.out, args.track)
    print(
        f"leaderboard: {len(board['ranked'])} ranked, {len(board['unranked'])} not ranked -> "
        f"{Path(args.out) / 'index.html'}, leaderboard.md, leaderboard.json"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "leaderboard", help="build the leaderboard (markdown, JSON, HTML page) from the results ledger"
    )
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"results ledger (default: {DEFAULT_LEDGER})")
    p.add_argument("--track", help="only results of this track")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_leaderboard)
