"""`pgolf compare NEW... --against OLD...`: is the new entry a record? One-sided Welch test over seeds.

The rule (docs/RULES.md, "Significance"; the reference challenge's): a new record must beat the current one by at
least the track's margin (0.005 nats) at the track's p-value (0.01), over seeds. With d the mean
improvement (old - new, lower is better), the hypotheses are

    H0: d <= margin        H1: d > margin

tested with Welch's t (unequal variances): t = (d - margin) / sqrt(s_new²/n_new + s_old²/n_old),
Welch–Satterthwaite degrees of freedom, p = P(T_df >= t). The verdict is "record" when p < p_value.
scipy computes the test (`scipy.stats.ttest_ind(..., equal_var=False, alternative="greater")` on
old vs new + margin, which shifts the mean and not the variance); nothing here hand-writes a
distribution.

Which numbers: the margin is in nats per token, so by default the test runs on val_loss (nats/token),
the reference's own rule. That is only meaningful when both sides score the same tokens (same
tokenizer and validation subset); otherwise pass `--metric val_bpb`: the test then runs on val_bpb
and the margin is converted to bits per byte with the old side's tokens per byte
(margin · tokens/bytes / ln 2), the margin the record's own tokenizer implies. bpb stays the
ranking metric of the leaderboard; this command only says whether an improvement is significant.

Every result given must have run on one track (each track has its own budget, data subset and rules). Each
side's results must be runs of their own: one seed twice, one artifact or one score to the last bit
(reproduce.py same_runs) is one run counted twice, and refused in one line naming the two files.

A result is verified only by a "verified" verification of its digest in the official's ledger
(`--ledger`, as the leaderboard reads it); the "verification" a result.json holds is the word of whoever
wrote the file, and a verdict on any unverified result says UNVERIFIED. Given the ledger, the test reads each
result at the worse of its own figure and its verification's re-score (leaderboard.py at_rescore, as the board
ranks it): a verify run under a loose --tol-bpb accepts an edited figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scipy import stats

from data.io import read_json
from harness.records.leaderboard import SCORE_MAX, at_rescore, digest_or_none, read_ledger, verification_of
from harness.records.reproduce import SAME_RUN_WHY, same_runs
from harness.run.text import visible
from scoring.statuses import VERIFIED, Status
from scoring.tracks import get_track

COMPARE_FORMAT = "pg-compare"
COMPARE_FORMAT_VERSION = 1
METRICS = ("val_loss", "val_bpb")


@dataclass(frozen=True, kw_only=True, slots=True)
class WelchResult:
    metric: str
    n_new: int
    n_old: int
    mean_new: float
    mean_old: float
    std_new: float
    std_old: float
    improvement: float
    """mean_old - mean_new, in the metric's unit (positive: the new entry is better)."""
    margin: float
    t: float
    df: float
    p_value: float
    alpha: float
    record: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def welch_test(
    new: list[float], old: list[float], margin: float, alpha: float, metric: str = "val_loss"
) -> WelchResult:
    """One-sided Welch test of mean(old) - mean(new) > margin; needs two or more values per side."""
    if len(new) < 2 or len(old) < 2:
        raise ValueError(
            f"a Welch test needs at least 2 seeds per side; got {len(new)} new and {len(old)} old. "
            "HINT: run more seeds (pgolf run ... --seed N)"
        )
    if not 0 < alpha < 1 or margin < 0:
        raise ValueError(f"p-value must be in (0, 1) and margin >= 0; got {alpha}, {margin}")
    sn, so = statistics.stdev(new), statistics.stdev(old)
    if sn == 0 and so == 0:
        raise ValueError(
            "every seed gave the same number on both sides: the variance is zero and Welch's t is undefined"
        )
    res = stats.ttest_ind(old, [x + margin for x in new], equal_var=False, alternative="greater")
    df = float(getattr(res, "df", math.nan))
    mo, mn = statistics.fmean(old), statistics.fmean(new)
    return WelchResult(
        metric=metric,
        n_new=len(new),
        n_old=len(old),
        mean_new=mn,
        mean_old=mo,
        std_new=sn,
        std_old=so,
        improvement=mo - mn,
        margin=margin,
        t=float(res.statistic),
        df=df,
        p_value=float(res.pvalue),
        alpha=alpha,
        record=bool(float(res.pvalue) < alpha),
    )


def load_results(paths: list[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Result records from result.json files or run folders; each must be a scored result."""
    out = []
    for p in paths:
        path = Path(p) / "result.json" if Path(p).is_dir() else Path(p)
        r = read_json(path, what="result")
        if r.get("format") != "pg-result":
            raise ValueError(f"{path} is not a pg-result record")
        if r.get("status") != Status.OK or r.get("val_loss") is None:
            raise ValueError(
                f"{path} has status {r.get('status')!r} and no score; only scored results can be compared"
            )
        for key in ("val_loss", "val_bpb"):
            v = r.get(key)
            if (key == "val_loss" or v is not None) and not _is_score(v):
                raise ValueError(
                    f"{path}: {key} {visible(str(v), 40)} is not a number in 0..{SCORE_MAX:g}; a scored result holds "
                    "its score as a finite number"
                )
        for key in ("provenance", "submission"):
            if not isinstance(r.get(key, {}), dict):
                raise ValueError(
                    f"{path}: {key} is a {type(r[key]).__name__}, not an object; not a pg-result record"
                )
        r["_path"] = str(path)
        out.append(r)
    return out


def _is_score(v: Any) -> bool:
    # compared before isfinite: a 400-digit integer (JSON holds any) overflowed it
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= SCORE_MAX and math.isfinite(v)


def _counts(r: dict[str, Any]) -> tuple[int, int]:
    """(val_tokens, val_bytes) of a result the bpb margin is converted with: both counts above zero."""
    n, b = r.get("val_tokens"), r.get("val_bytes")
    for key, v in (("val_tokens", n), ("val_bytes", b)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 2**63:
            raise ValueError(
                f"{r['_path']}: {key} {visible(str(v), 40)} is not a count above zero; --metric val_bpb converts the "
                "margin with the old side's tokens per byte"
            )
    assert isinstance(n, int) and isinstance(b, int)
    return n, b


def _same(v: Any) -> str:
    """A result's value as a set member: its JSON (a list or an object where a string goes is unhashable: a
    seed of [1] in a hand-written result ended compare in TypeError)."""
    return json.dumps(v, sort_keys=True, default=str)


def _one_run(rs: list[dict[str, Any]]) -> str | None:
    """Two results of one side that are one run (reproduce.py same_runs: one seed, one artifact, or one score to
    the last bit), said in a line; None when each is a run of its own. A repeat was a warning beside the verdict:
    two results passed twice made p 0.073 a NEW RECORD at 0.0019."""
    view = [
        {"seed": _same(r.get("seed")), "status": Status.OK, "val_loss": r.get("val_loss"), "val_bpb": r.get("val_bpb"),
         "artifact_sha256": (r.get("provenance") or {}).get("artifact_sha256")}
        for r in rs
    ]  # fmt: skip
    for i, j, what in same_runs(view):
        return f"{rs[i]['_path']} and {rs[j]['_path']} are one run ({SAME_RUN_WHY[what]})"
    return None


def _verified(r: dict[str, Any], verifications: dict[str, dict[str, Any]]) -> bool:
    """Whether the ledger's verification of exactly this result says verified (never the result's own word)."""
    core = {k: v for k, v in r.items() if k != "_path"}
    return verification_of(digest_or_none(core), verifications) == VERIFIED


def _tested(r: dict[str, Any], metric: str, verifications: dict[str, dict[str, Any]] | None) -> float:
    """The figure the test reads of `r`: its own, or the worse of it and its verification's re-score (leaderboard.py
    at_rescore, as the board ranks it): a verify run under a loose --tol-bpb accepted an edited figure, which the
    test then read as the seed's."""
    core = {k: v for k, v in r.items() if k != "_path"}
    return float((core if verifications is None else at_rescore(core, verifications))[metric])


def compare_results(
    new: list[dict[str, Any]],
    old: list[dict[str, Any]],
    *,
    metric: str = "val_loss",
    track: str | None = None,
    verifications: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The comparison record: the Welch result plus what was compared and any warnings. A result is verified
    only by a "verified" record for its digest in `verifications` (the official's ledger, `--ledger`): the
    "verification" a result.json holds is the word of whoever wrote the file."""
    if metric not in METRICS:
        raise ValueError(f"--metric must be one of {METRICS}, got {metric!r}")
    ran_on = sorted({_same(r.get("track")) for r in new + old})
    if len(ran_on) > 1:
        # each track has its own budget, data subset and rules: runs of two are no samples of one distribution
        names = ", ".join(repr(visible(json.loads(t), 40)) for t in ran_on)
        raise ValueError(
            f"the results ran on tracks [{names}]; a record is tested between results of one track. HINT: "
            "compare results of the track the record holds"
        )
    track_name = track or new[0].get("track")
    tr = get_track(str(track_name))
    warnings = []
    tok = {_same(r.get("provenance", {}).get("tokenizer_sha256")) for r in new + old}
    subset = {_same([r.get("val_tokens"), r.get("eval_mode")]) for r in new + old}
    if metric == "val_loss" and (len(tok) > 1 or len(subset) > 1):
        raise ValueError(
            "the results score different tokens (tokenizer or validation subset differ), so nats per token do not compare; "
            "HINT: pass --metric val_bpb"
        )
    for side, rs in (("new", new), ("old", old)):
        one_run = _one_run(rs)
        if one_run is not None:
            raise ValueError(
                f"{side} side: {one_run}; the Welch test would read them as independent samples. HINT: pass "
                "each seed's result once, of runs that used their seed"
            )
        if any(r.get("track") != tr.name for r in rs):
            warnings.append(
                f"{side} side's results ran on {visible(rs[0].get('track'), 40)!r}, testing under {tr.name}"
            )
    if not tr.record:
        warnings.append(f"track {tr.name} does not hold records; the verdict is informational")
    margin = tr.margin_nats
    if metric == "val_bpb":
        counts = [_counts(r) for r in old]
        tokens_per_byte = sum(n for n, _ in counts) / sum(b for _, b in counts)
        margin = tr.margin_nats * tokens_per_byte / math.log(2.0)
    unscored = next((r["_path"] for r in new + old if r.get(metric) is None), None)
    if unscored is not None:
        raise ValueError(
            f"{unscored} has no {metric}; compare results that hold it (or pass the other --metric)"
        )
    w = welch_test(
        [_tested(r, metric, verifications) for r in new],
        [_tested(r, metric, verifications) for r in old],
        margin,
        tr.p_value,
        metric,
    )
    unverified = [r["_path"] for r in new + old if not _verified(r, verifications or {})]
    if unverified:
        warnings.append(
            f"{len(unverified)} of {len(new) + len(old)} results are not verified: the verdict is the numbers' "
            "only until `pgolf verify` re-scores them (a result.json is the word of whoever wrote it, its "
            'own "verification" too; a verification counts from the official\'s ledger, --ledger)'
        )
    return {
        "format": COMPARE_FORMAT,
        "format_version": COMPARE_FORMAT_VERSION,
        "track": tr.name,
        "unverified": unverified,
        "margin_nats": tr.margin_nats,
        "new": [r["_path"] for r in new],
        "old": [r["_path"] for r in old],
        "warnings": warnings,
        **w.as_dict(),
    }


def describe(rec: dict[str, Any]) -> str:
    unit = "nats/token" if rec["metric"] == "val_loss" else "bits/byte"
    verdict = "not a record"
    if rec["record"]:
        verdict = "NEW RECORD" if not rec.get("unverified") else "a record by these numbers, UNVERIFIED"
    lines = [
        f"{rec['metric']} ({unit}), track {rec['track']}: one-sided Welch test of improvement > margin",
        f"  new  n={rec['n_new']}  mean {rec['mean_new']:.6f}  std {rec['std_new']:.6f}",
        f"  old  n={rec['n_old']}  mean {rec['mean_old']:.6f}  std {rec['std_old']:.6f}",
        f"  improvement (old - new) {rec['improvement']:+.6f}  margin {rec['margin']:.6f}",
        f"  t = {rec['t']:.4f}  df = {rec['df']:.2f}  p = {rec['p_value']:.3g}  (needs p < {rec['alpha']})",
        f"  verdict: {verdict}",
    ]
    lines += [f"  warning: {w}" for w in rec["warnings"]]
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    verifications = read_ledger(args.ledger)[1] if args.ledger else None
    rec = compare_results(
        load_results(args.new),
        load_results(args.against),
        metric=args.metric,
        track=args.track,
        verifications=verifications,
    )
    print(json.dumps(rec, sort_keys=True) if args.json else describe(rec))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="one-sided Welch test: does NEW beat OLD by the track's margin at its p-value?"
    )
    p.add_argument(
        "new", nargs="+", help="the new entry's results (result.json files or run folders), one per seed"
    )
    p.add_argument("--against", nargs="+", required=True, help="the current record's results, one per seed")
    p.add_argument(
        "--metric", default="val_loss", choices=METRICS, help="val_loss (nats/token, default) or val_bpb"
    )
    p.add_argument("--track", help="track whose margin and p-value apply (default: the new results' track)")
    p.add_argument(
        "--ledger",
        help="the official's results ledger: a result counts as verified only by its verification there",
    )
    p.add_argument("--json", action="store_true", help="print the comparison record as one JSON object")
    p.set_defaults(func=cmd_compare)
