"""`pgolf chain --ledger FILE`: records accepted in order, and the board of why each entry was or was not.

    pgolf chain --ledger runs/queue/ledger.jsonl [--track T] [--rule challenge|practised] [--out DIR] [--json]

Entries are considered in submission order (the order file `pgolf queue --order` recorded, the pull
requests as they came in; a line names the entry first decided under that folder name, never a later one an
entrant named the same; then submission.json `date`, which alone orders entries the file does not list
and every entry when there is no file; then the folder name) against the frontier at that time: the record
holder when the entry came in. The date is the entrant's own word, the order file the official's.

Each track's policy (`TRACK_POLICIES`) names the rule and the evidence:

- rule `challenge` (the challenge's written rule, the default): a new record must improve the frontier's
  mean by more than the track's margin (scoring/tracks.py margin_nats, 0.005 nats) at the track's p-value
  (0.01), one-sided Welch over seeds (harness/records/compare.py welch_test), at least 2 seeds a side;
- rule `practised` (what the maintainers practised, recorded as an option): the same margin at p < 0.25,
  and at least 3 seeds from one configuration (one preset, no per-seed overrides);
- evidence `reproduced` (default): an entry's numbers are the seeds `pgolf reproduce` re-trained, and only
  a `reproduced` verdict can be accepted; `verified`: the entry's own runs in the ledger that `pgolf
  verify` marked verified (a track whose officials re-score rather than re-train), each scored under
  its track's rules as the leaderboard ranks them (harness/records/leaderboard.py scored_problem), each seed
  at the worse of its own figure and its verification's re-score (leaderboard.py at_rescore);
- seeds `salted` (every record track): only a reproduction whose seeds were fresh under the official's salt
  (`pgolf queue --seeds N --seed-salt-file F`) is accepted. Claimed seeds reproduce exactly even when they are
  the best few of a hundred the entrant tried, and seeds from the entry's digest alone the entrant computes;
  either is a seed lottery the Welch test would read as independent samples. `any` (other tracks): any seeds.
- on every track, a reproduction (or a group of verified results) two of whose seeds were one run
  (reproduce.py same_runs: one seed twice, the same artifact or the same score to the last bit, a train.py that
  fixed its own seed), with a run whose score is no finite number, or whose runs scored other tokens, is
  refused, read from its runs whatever its verdict says: one sample counted as several, or none, or samples of
  two validation sets. A verified result listed twice is one sample.
- a verdict decided under a looser tolerance than the track's (`TrackPolicy.tolerance`, reproduce.py's defaults:
  `--k 3`, `--floor-bpb 0.003`) is refused: the queue decides a verdict again under new flags, and the chain
  reads the latest.

The metric is val_loss (nats/token) when both sides scored the same tokens (tokenizer and validation
count), else val_bpb with the margin converted by the frontier's tokens per byte (as `pgolf compare`
does). The first acceptable entry on a track sets its frontier. A rejected entry never moves it. The
board ("pg-chain" v2) lists every entry with `accepted`, `seeds_chosen` and a one-line `reason`; chain.md is its table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from data.io import write_json_atomic
from harness.records.compare import welch_test
from harness.records.leaderboard import SCORE_MAX
from harness.records.reproduce import REPRO_FORMAT, REPRODUCED, SAME_RUN_WHY, Tolerance, same_runs
from harness.run.text import NAME_MAX_CHARS, TEXT_MAX_CHARS, markdown_cell, visible
from scoring.statuses import Status, Verification
from scoring.tracks import TRACKS

CHAIN_FORMAT = "pg-chain"
CHAIN_FORMAT_VERSION = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class ChainRule:
    name: str
    p_value: float | None
    """None: the track's own (scoring/tracks.py p_value)."""
    min_seeds: int
    one_config: bool


RULES: dict[str, ChainRule] = {
    "challenge": ChainRule(name="challenge", p_value=None, min_seeds=2, one_config=False),
    "practised": ChainRule(name="practised", p_value=0.25, min_seeds=3, one_config=True),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrackPolicy:
    rule: str = "challenge"
    evidence: str = "reproduced"
    seeds: str = "any"
    """"salted": only seeds fresh under the official's salt are evidence; "any": claimed ones too."""
    tolerance: Tolerance = Tolerance()
    """The loosest reproduction tolerance whose verdict counts (every field at most this)."""


TRACK_POLICIES: dict[str, TrackPolicy] = {
    name: TrackPolicy(seeds="salted" if t.record else "any") for name, t in TRACKS.items()
}
"""Per track; every track holds the challenge's rule on reproduced results until its officials decide, and a
record track takes only salted fresh seeds."""

SEEDS_CLAIMED, SEEDS_DIGEST, SEEDS_SALTED = "claimed", "from the entry's digest", "salted"


def seeds_chosen(fresh_seeds: Any) -> str:
    """How a reproduction record's seeds were chosen (its `fresh_seeds`, reproduce.py fresh_seeds_record)."""
    if not isinstance(fresh_seeds, dict) or fresh_seeds.get("chosen") == "claimed":
        return SEEDS_CLAIMED
    return SEEDS_SALTED if isinstance(fresh_seeds.get("salt_sha256"), str) else SEEDS_DIGEST


@dataclass(kw_only=True)
class Candidate:
    key: str
    name: str
    date: str
    order: int
    folder: str
    track: str
    verdict: str
    why_verdict: str
    val_loss: list[float]
    val_bpb: list[float]
    val_tokens: int | None = None
    val_bytes: int | None = None
    tokenizer: str | None = None
    configs: int = 1
    seeds_chosen: str = SEEDS_CLAIMED
    tolerance: Any = None
    """The tolerance its verdict was decided under (a pg-reproduction's `tolerance`); None: not said."""
    unusable: str | None = None
    """Why its runs are no samples for the test (a score that is no finite number, two seeds that are one run:
    reproduce.py same_runs), whatever its verdict says; None when they are."""
    extra: dict[str, Any] = field(default_factory=dict)

    def sort_key(self) -> tuple[int, str, str, str]:
        # the official's order first: the date is submission.json's, the entrant's own word (a backdated
        # entry met an older frontier, was accepted, and the real record after it was refused against it)
        return (self.order, self.date, self.folder, self.key)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**63 else None


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _unusable(ok: list[dict[str, Any]]) -> str | None:
    """Why a reproduction's ok runs are no samples for the Welch test (Candidate.unusable), or None. Read here,
    not only in the verdict: a record decided before a check, or written by another tool. A score the ledger
    wrote as "nan" set a frontier at a NaN mean, and every later entry was refused against it (p = nan)."""
    for x in ok:
        for key in ("val_loss", "val_bpb"):
            v = x.get(key)
            # compared before isfinite: a 400-digit integer overflowed it
            if not (_is_number(v) and 0 <= v <= SCORE_MAX and math.isfinite(v)):
                return (
                    f"seed {visible(x.get('seed'), 40)}: {key} {visible(repr(v), 40)} is not a finite score"
                )
    tokens = [json.dumps([x.get(k) for k in ("tokenizer_sha256", "val_tokens", "val_bytes")]) for x in ok]
    other = next((j for j, t in enumerate(tokens) if t != tokens[0]), None)
    if other is not None:
        a, b = (visible(ok[k].get("seed"), 40) for k in (0, other))
        return f"seeds {a} and {b} scored other tokens (tokenizer, val_tokens or val_bytes differ)"
    repeats = same_runs(ok)
    if repeats:
        i, j, what = repeats[0]
        a, b = (visible(ok[k].get("seed"), 40) for k in (i, j))
        return (
            f"seeds {a} and {b} gave one run ({SAME_RUN_WHY[what]}): the seed did not reach the run, so its seeds "
            "are not independent samples"
        )
    return None


def candidates_from_reproductions(
    records: Iterable[dict[str, Any]], order: dict[str, int]
) -> list[Candidate]:
    """The latest pg-reproduction record of each entry digest, as a candidate."""
    latest: dict[str, dict[str, Any]] = {}
    holder: dict[str, str] = {}
    """Folder name -> the digest first decided under it: the entry an order line names. An entrant chooses their
    folder's name; one named as an earlier entry in the order file (that entry merged, its folder gone from the
    batch) took its place in the official's order, and with a backdated date came before it."""
    for r in records:
        if r.get("format") == REPRO_FORMAT:
            latest[r["entry_digest"]] = r
            holder.setdefault(Path(str(r.get("entry_dir"))).name, r["entry_digest"])
    out = []
    for r in latest.values():
        sub = r.get("submission") or {}
        folder = Path(str(r.get("entry_dir"))).name
        listed = holder.get(folder) == r["entry_digest"]
        ok = [x for x in r.get("reproduced") or [] if isinstance(x, dict) and x.get("status") == Status.OK]
        # read here, not only in the verdict: a record decided before the check, or by another tool
        unusable = _unusable(ok)
        diffs = r.get("differences") or []
        why = (
            ""
            if not diffs
            else f"{diffs[0]['name']}: claimed {diffs[0]['expected']!r}, found {diffs[0]['actual']!r}"
        )
        out.append(
            Candidate(
                key=str(r["entry_key"]),
                name=visible(sub.get("name"), 80),
                date=str(sub.get("date") or ""),
                order=order.get(folder, len(order)) if listed else len(order),
                folder=folder,
                track=str(r.get("track")),
                verdict=str(r.get("verdict")),
                why_verdict=visible(why, 200),
                val_loss=[] if unusable else [float(x["val_loss"]) for x in ok],
                val_bpb=[] if unusable else [float(x["val_bpb"]) for x in ok],
                val_tokens=next((_count(x.get("val_tokens")) for x in ok), None),
                val_bytes=next((_count(x.get("val_bytes")) for x in ok), None),
                tokenizer=next((x.get("tokenizer_sha256") for x in ok), None),
                seeds_chosen=seeds_chosen(r.get("fresh_seeds")),
                unusable=unusable,
                tolerance=r.get("tolerance"),
                extra={"seeds": r.get("seeds"), "preset": r.get("preset")},
            )
        )
    return out


def candidates_from_verified(ledger: Path, order: dict[str, int]) -> list[Candidate]:
    """Verified ok results in the ledger, grouped like the leaderboard (entry id, track, preset, overrides)."""
    from harness.records.leaderboard import (
        at_rescore,
        digest_or_none,
        entry_id,
        read_ledger,
        scored_problem,
        verification_of,
    )

    results, verifications = read_ledger(ledger)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for r in results:
        digest = digest_or_none(r)
        if digest is not None and digest in seen:
            continue  # the same result twice (a line appended again) is one sample, as on the leaderboard
        seen.add(digest or "")
        if (
            r.get("status") != Status.OK
            or verification_of(digest_or_none(r), verifications) != Verification.VERIFIED
            or r.get("within_cap") is not True
            # scored under its track's rules (no validation subset, no loosened rule), as the leaderboard ranks
            or scored_problem(r) is not None
        ):
            continue
        over = json.dumps(((r.get("phases") or {}).get("command") or {}).get("overrides") or [])
        # each seed no better than its verification's re-score, as the board ranks it (a loose --tol-bpb)
        groups.setdefault((entry_id(r), str(r.get("preset")), over), []).append(at_rescore(r, verifications))
    out = []
    for (eid, preset, _over), rs in groups.items():
        unusable = _unusable(
            [
                {
                    **r,
                    **{
                        k: (r.get("provenance") or {}).get(k) for k in ("artifact_sha256", "tokenizer_sha256")
                    },
                }
                for r in rs
            ]
        )
        sub = rs[0].get("submission") or {}
        folder = Path(str((rs[0].get("provenance") or {}).get("submission_dir") or sub.get("name"))).name
        out.append(
            Candidate(
                key=f"{visible(sub.get('name'), 60)}-{eid}",
                name=visible(sub.get("name"), 80),
                date=str(sub.get("date") or ""),
                order=order.get(folder, len(order)),
                folder=folder,
                track=str(rs[0].get("track")),
                verdict=REPRODUCED,  # verified: the evidence this policy accepts
                why_verdict="",
                val_loss=[] if unusable else [float(r["val_loss"]) for r in rs],
                val_bpb=[] if unusable else [float(r["val_bpb"]) for r in rs],
                unusable=unusable,
                val_tokens=rs[0].get("val_tokens"),
                val_bytes=rs[0].get("val_bytes"),
                tokenizer=(rs[0].get("provenance") or {}).get("tokenizer_sha256"),
                extra={"preset": preset, "seeds": [r.get("seed") for r in rs]},
            )
        )
    return out


def looser_than(tolerance: Any, limit: Tolerance) -> str | None:
    """How a verdict's `tolerance` (as the record holds it) is looser than `limit`, in a line; None when it is
    not (None: the record does not say, a record of another tool)."""
    if tolerance is None:
        return None
    if not isinstance(tolerance, dict):
        return f"tolerance {visible(repr(tolerance), 40)} is not one"
    out = []
    for name, most in asdict(limit).items():
        v = tolerance.get(name)
        if not _is_number(v) or not math.isfinite(v):
            out.append(f"{name} {visible(repr(v), 20)} is no number")
        elif v > most:
            out.append(f"{name} {v:g} > {most:g}")
    return ", ".join(out) or None


def improvement_test(new: Candidate, old: Candidate, margin_nats: float, alpha: float) -> dict[str, Any]:
    """The one-sided Welch test of old - new > margin, on val_loss or (other tokens) val_bpb."""
    same_tokens = new.tokenizer == old.tokenizer and new.val_tokens == old.val_tokens and new.tokenizer
    if same_tokens:
        metric, a, b, margin = "val_loss", new.val_loss, old.val_loss, margin_nats
    else:
        if not old.val_tokens or not old.val_bytes:
            raise ValueError("the frontier records no token and byte counts to convert the margin")
        margin = margin_nats * old.val_tokens / old.val_bytes / math.log(2.0)
        metric, a, b = "val_bpb", new.val_bpb, old.val_bpb
    return welch_test(a, b, margin, alpha, metric).as_dict()


def accept_in_order(cands: list[Candidate], rule_override: str | None = None) -> list[dict[str, Any]]:
    """Every candidate, in submission order per track, with `accepted` and its `reason` (module docstring)."""
    rows: list[dict[str, Any]] = []
    frontier: dict[str, Candidate] = {}
    for c in sorted(cands, key=Candidate.sort_key):
        track = TRACKS.get(c.track)
        policy = TRACK_POLICIES.get(c.track, TrackPolicy())
        rule = RULES[rule_override or policy.rule]
        alpha = rule.p_value if rule.p_value is not None else (track.p_value if track else 0.01)
        margin = track.margin_nats if track else 0.005
        front = frontier.get(c.track)
        row: dict[str, Any] = {
            "entry_key": c.key,
            "name": c.name,
            "date": c.date,
            "folder": c.folder,
            "track": c.track,
            "rule": rule.name,
            "evidence": policy.evidence,
            "seeds_chosen": c.seeds_chosen,
            "verdict": c.verdict,
            "n_seeds": len(c.val_bpb),
            "mean_val_bpb": _mean(c.val_bpb),
            "mean_val_loss": _mean(c.val_loss),
            "frontier_before": front.key if front else None,
            "test": None,
            "accepted": False,
        }
        if c.verdict != REPRODUCED:
            row["reason"] = f"verdict {c.verdict}" + (f" ({c.why_verdict})" if c.why_verdict else "")
        elif track is None:
            row["reason"] = f"track {visible(c.track, 40)!r} is not one this harness knows"
        elif policy.seeds == SEEDS_SALTED and c.seeds_chosen != SEEDS_SALTED:
            row["reason"] = (
                f"seeds {c.seeds_chosen}: an entrant can choose those; {c.track} takes fresh seeds under the "
                "official's salt (pgolf queue --seeds 3 --seed-salt-file F)"
            )
        elif c.unusable is not None:
            row["reason"] = c.unusable
        elif (loose := looser_than(c.tolerance, policy.tolerance)) is not None:
            row["reason"] = (
                f"decided under a looser tolerance than {c.track}'s ({loose}): decide it again under the track's "
                "(pgolf queue without --k and --floor-bpb)"
            )
        elif len(c.val_bpb) < rule.min_seeds:
            row["reason"] = f"{len(c.val_bpb)} seed(s); rule {rule.name} needs at least {rule.min_seeds}"
        elif rule.one_config and c.configs != 1:
            row["reason"] = f"seeds from {c.configs} configurations; rule {rule.name} needs one"
        elif front is None:
            row["accepted"] = True
            row["reason"] = f"the first {policy.evidence} entry on {c.track}: it sets the frontier"
        else:
            try:
                test = improvement_test(c, front, margin, alpha)
            except ValueError as e:
                row["reason"] = f"against {front.key}: {e}"
            else:
                row["test"] = test
                d, p = test["improvement"], test["p_value"]
                if test["record"]:
                    row["accepted"] = True
                    row["reason"] = (
                        f"beats {front.key} by {d:+.6f} {test['metric']} > margin {test['margin']:.6f} "
                        f"at p = {p:.3g} < {alpha:g}"
                    )
                else:
                    row["reason"] = (
                        f"against {front.key}: improvement {d:+.6f} {test['metric']} (margin "
                        f"{test['margin']:.6f}), p = {p:.3g}, not < {alpha:g}"
                    )
        if row["accepted"]:
            frontier[c.track] = c
        rows.append(row)
    return rows


def read_order(path: str | None) -> dict[str, int]:
    """Folder name -> position, from a file of folder names in submission order (one a line)."""
    if not path:
        return {}
    names = [x.strip() for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    order: dict[str, int] = {}
    for i, n in enumerate(names):
        # a line injected by a folder name holding a newline, or a mistake: never guessed
        if Path(n).name in order:
            raise ValueError(
                f"--order {path}: {visible(Path(n).name, 80)!r} is listed twice; list each entry once"
            )
        order[Path(n).name] = i
    return order


def build_chain(
    ledger: Path, *, track: str | None, rule: str | None, order: dict[str, int]
) -> dict[str, Any]:
    if rule is not None and rule not in RULES:
        raise ValueError(f"--rule {rule!r} is not one of {', '.join(RULES)}")
    if not ledger.is_file():
        raise FileNotFoundError(
            f"no ledger at {ledger}; pass the ledger `pgolf queue` or `pgolf reproduce` wrote"
        )
    records = []
    for n, line in enumerate(ledger.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{ledger}:{n} is not a JSON line ({e})") from e
    by_evidence = {"reproduced": candidates_from_reproductions(records, order)}
    if any(p.evidence == "verified" for p in TRACK_POLICIES.values()):
        by_evidence["verified"] = candidates_from_verified(ledger, order)
    cands = [
        c
        for ev, cs in by_evidence.items()
        for c in cs
        if TRACK_POLICIES.get(c.track, TrackPolicy()).evidence == ev and (track is None or c.track == track)
    ]
    rows = accept_in_order(cands, rule)
    return {
        "format": CHAIN_FORMAT,
        "format_version": CHAIN_FORMAT_VERSION,
        "ledger": str(ledger),
        "rule_override": rule,
        "policies": {k: asdict(v) for k, v in TRACK_POLICIES.items()},
        "rules": {k: asdict(v) for k, v in RULES.items()},
        "rows": rows,
        "records": [r["entry_key"] for r in rows if r["accepted"]],
    }


def _f(v: Any, spec: str = ".6f") -> str:
    return "-" if v is None else format(v, spec)


def lines(chain: dict[str, Any]) -> list[str]:
    out = []
    for i, r in enumerate(chain["rows"], start=1):
        mark = "ACCEPTED" if r["accepted"] else "not accepted"
        date, key, track, verdict = (
            visible(r[k], NAME_MAX_CHARS) for k in ("date", "entry_key", "track", "verdict")
        )
        out.append(
            f"{i:3d}. {date} {key:<40} {track:<14} {verdict:<15} "
            f"n={r['n_seeds']} bpb {_f(r['mean_val_bpb'])}  {mark}: {visible(r['reason'])}"
        )
    out.append(
        f"record chain ({len(chain['records'])}): "
        + " -> ".join(visible(k, NAME_MAX_CHARS) for k in chain["records"])
    )
    return out


def markdown(chain: dict[str, Any]) -> str:
    """chain.md: every value from an entry (its folder's name, submission.json's date and track, a refused
    entry's reason) is shown as text, never markup (harness/run/text.py)."""

    def cell(x: Any) -> str:
        return markdown_cell(x, TEXT_MAX_CHARS)

    rows = [
        "| # | date | entry | track | verdict | seeds | mean val_bpb | accepted | why |",
        "|" + "---|" * 9,
    ]
    for i, r in enumerate(chain["rows"], start=1):
        rows.append(
            "| " + " | ".join(cell(x) for x in (i, r["date"], r["entry_key"], r["track"], r["verdict"], r["n_seeds"],
                                                 _f(r["mean_val_bpb"]), "yes" if r["accepted"] else "no",
                                                 r["reason"])) + " |"
        )  # fmt: skip
    return (
        "# Records accepted in order\n\n"
        + "\n".join(rows)
        + "\n\nChain: "
        + " -> ".join(markdown_cell(k) for k in chain["records"])
        + "\n"
    )


def cmd_chain(args: argparse.Namespace) -> int:
    chain = build_chain(Path(args.ledger), track=args.track, rule=args.rule, order=read_order(args.order))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "chain.json", chain)
        (out / "chain.md").write_text(markdown(chain), encoding="utf-8")
    print(json.dumps(chain, sort_keys=True) if args.json else "\n".join(lines(chain)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chain", help="records accepted in submission order, with why for every entry")
    p.add_argument("--ledger", required=True, help="the ledger `pgolf queue` / `pgolf reproduce` wrote")
    p.add_argument("--track", help="only this track")
    p.add_argument(
        "--rule", choices=sorted(RULES), help="override every track's rule (recorded in the output)"
    )
    p.add_argument("--order", help="file of entry folder names in submission order (before any date)")
    p.add_argument("--out", help="write chain.json (pg-chain) and chain.md here")
    p.add_argument("--json", action="store_true", help="print the pg-chain record")
    p.set_defaults(func=cmd_chain)
