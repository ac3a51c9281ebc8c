"""`pgolf compare`: the one-sided Welch test against the track's margin, checked against the textbook
formulas computed here independently (Welch's t, Welch–Satterthwaite df, scipy.stats.t for the tail)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from harness.records.compare import compare_results, describe, load_results, welch_test
from harness.records.leaderboard import read_ledger
from harness.records.verify import result_digest
from scoring.tracks import get_track
from tests.conftest import REPO


def textbook(new: list[float], old: list[float], margin: float) -> tuple[float, float, float]:
    """(t, df, one-sided p) for H1: mean(old) - mean(new) > margin, from the formulas."""
    n1, n2 = len(new), len(old)
    m1, m2 = sum(new) / n1, sum(old) / n2
    v1 = sum((x - m1) ** 2 for x in new) / (n1 - 1)
    v2 = sum((x - m2) ** 2 for x in old) / (n2 - 1)
    se2 = v1 / n1 + v2 / n2
    t = ((m2 - m1) - margin) / math.sqrt(se2)
    df = se2**2 / ((v1 / n1) ** 2 / (n1 - 1) + (v2 / n2) ** 2 / (n2 - 1))
    return t, df, float(stats.t.sf(t, df))


def write_results(
    folder,
    name,
    values,
    *,
    track="10min_16mb",
    tokenizer="t" * 64,
    val_tokens=1000,
    val_bytes=2400,
    verification="verified",
):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed, v in enumerate(values):
        r = {
            "format": "pg-result",
            "format_version": 1,
            "status": "ok",
            "verification": verification,
            "track": track,
            "seed": 1337 + seed,
            "val_loss": v,
            "val_bpb": v * val_tokens / (math.log(2) * val_bytes),
            "val_tokens": val_tokens,
            "val_bytes": val_bytes,
            "eval_mode": "standard",
            "submission": {"name": name},
            "provenance": {"tokenizer_sha256": tokenizer},
        }
        p = folder / f"{name}_{seed}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    return paths


def ledger_of(tmp_path, *paths):
    """The official's ledger holding a "verified" verification of each result file (what `pgolf verify` appends)."""
    ledger = tmp_path / "ledger.jsonl"
    lines = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        lines.append(
            {
                "format": "pg-verification",
                "format_version": 1,
                "status": "verified",
                "result_sha256": result_digest(r),
            }
        )
    with ledger.open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    return ledger


CASES = {
    "clear record": ([2.0400, 2.0410, 2.0395, 2.0405], [2.0600, 2.0590, 2.0612]),
    "better, but not by the margin": ([2.0570, 2.0560, 2.0565], [2.0600, 2.0590, 2.0612]),
    "borderline, noisy": ([2.050, 2.058, 2.044], [2.060, 2.066, 2.058]),
    "worse": ([2.07, 2.071, 2.069], [2.06, 2.059, 2.061]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compare_reproduces_an_independent_welch_test(tmp_path, case):
    new, old = CASES[case]
    tr = get_track("10min_16mb")
    rec = compare_results(
        load_results(write_results(tmp_path, "new", new)), load_results(write_results(tmp_path, "old", old))
    )
    t, df, p = textbook(new, old, tr.margin_nats)
    assert rec["t"] == pytest.approx(t, rel=1e-9)
    assert rec["df"] == pytest.approx(df, rel=1e-9)
    assert rec["p_value"] == pytest.approx(p, rel=1e-7, abs=1e-15)
    assert rec["record"] is (p < tr.p_value)
    assert rec["improvement"] == pytest.approx(sum(old) / len(old) - sum(new) / len(new), rel=1e-12)
    assert (rec["margin"], rec["alpha"]) == (0.005, 0.01)


def test_verdicts_of_the_cases(tmp_path):
    verdicts = {c: welch_test(n, o, 0.005, 0.01).record for c, (n, o) in CASES.items()}
    assert verdicts == {
        "clear record": True,
        "better, but not by the margin": False,
        "borderline, noisy": False,
        "worse": False,
    }


def test_cli_prints_means_difference_t_df_p_and_verdict(tmp_path):
    new, old = CASES["clear record"]
    new_paths, old_paths = write_results(tmp_path, "new", new), write_results(tmp_path, "old", old)
    ledger = ledger_of(tmp_path, *new_paths, *old_paths)
    args = [
        sys.executable,
        "-m",
        "harness.cli",
        "compare",
        *new_paths,
        "--against",
        *old_paths,
        "--ledger",
        str(ledger),
    ]
    r = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    t, df, p = textbook(new, old, 0.005)
    for needle in (
        "new  n=4  mean 2.040250",
        "old  n=3  mean 2.060067",
        "improvement (old - new) +0.019817",
        f"t = {t:.4f}",
        f"df = {df:.2f}",
        f"p = {p:.3g}",
        "verdict: NEW RECORD",
    ):
        assert needle in r.stdout, r.stdout


def test_unverified_results_never_make_a_new_record(tmp_path):
    """An attacker's hand-written result.json files got "NEW RECORD" (p = 1.5e-15) before this."""
    new, old = CASES["clear record"]
    old_paths = write_results(tmp_path, "o", old)
    rec = compare_results(
        load_results(write_results(tmp_path, "n", new, verification="unverified")),
        load_results(old_paths),
        verifications=read_ledger(ledger_of(tmp_path, *old_paths))[1],
    )
    assert rec["record"] is True and len(rec["unverified"]) == len(new)
    text = describe(rec)
    assert "verdict: a record by these numbers, UNVERIFIED" in text and "NEW RECORD" not in text
    assert "4 of 7 results are not verified" in text


def test_a_result_that_says_verified_is_not_verified_without_the_ledgers_word(tmp_path):
    """The same attacker writes "verification": "verified" into its hand-written files: compare printed
    "verdict: NEW RECORD" with no warning (the field was believed). Only the official's ledger verifies."""
    new, old = CASES["clear record"]
    forged, old_paths = write_results(tmp_path, "n", new), write_results(tmp_path, "o", old)
    ledger = ledger_of(tmp_path, *old_paths)
    for verifications in (None, read_ledger(ledger)[1]):
        rec = compare_results(load_results(forged), load_results(old_paths), verifications=verifications)
        assert rec["unverified"][: len(new)] == forged
        assert "verdict: a record by these numbers, UNVERIFIED" in describe(rec)
    ledger_of(tmp_path, *forged)
    rec = compare_results(load_results(forged), load_results(old_paths), verifications=read_ledger(ledger)[1])
    assert rec["unverified"] == [] and "verdict: NEW RECORD" in describe(rec)


def test_bpb_metric_converts_the_margin_with_the_old_tokens_per_byte(tmp_path):
    new, old = CASES["clear record"]
    rec = compare_results(
        load_results(write_results(tmp_path, "n", new)),
        load_results(write_results(tmp_path, "o", old)),
        metric="val_bpb",
    )
    assert rec["margin"] == pytest.approx(0.005 * 1000 / 2400 / math.log(2))
    assert rec["record"] is True  # the same test in other units: val_bpb is val_loss times a constant here
    assert rec["t"] == pytest.approx(textbook(new, old, 0.005)[0], rel=1e-9)


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="at least 2 seeds per side"):
        welch_test([2.0], [2.1, 2.2], 0.005, 0.01)
    with pytest.raises(ValueError, match="variance is zero"):
        welch_test([2.0, 2.0], [2.1, 2.1], 0.005, 0.01)
    a = load_results(write_results(tmp_path, "a", [2.0, 2.01]))
    b = load_results(write_results(tmp_path, "b", [2.1, 2.11], tokenizer="u" * 64))
    with pytest.raises(ValueError, match="--metric val_bpb"):
        compare_results(a, b)
    bad = tmp_path / "err.json"
    bad.write_text(json.dumps({"format": "pg-result", "status": "error", "val_loss": None}))
    with pytest.raises(ValueError, match="only scored results"):
        load_results([bad])


@pytest.mark.parametrize(
    ("over", "metric", "error"),
    [
        ({"val_loss": "-inf"}, "val_loss", "val_loss -inf is not a number in 0..1e+06"),
        ({"val_loss": 1e308}, "val_loss", "val_loss 1e+308 is not a number in 0..1e+06"),
        ({"val_loss": "abc"}, "val_loss", "val_loss abc is not a number in 0..1e+06"),
        ({"val_bpb": True}, "val_loss", "val_bpb True is not a number in 0..1e+06"),
        ({"provenance": ["x"]}, "val_loss", "provenance is a list, not an object"),
        ({"val_bytes": 0}, "val_bpb", "val_bytes 0 is not a count above zero"),
        ({"val_tokens": None}, "val_bpb", "val_tokens None is not a count above zero"),
        ({"val_loss": 10**400}, "val_loss", "val_loss 1000000000"),
        ({"val_bytes": 10**400}, "val_bpb", "val_bytes 1000000000"),
    ],
)
def test_a_hostile_result_is_one_line_naming_the_file_never_a_traceback(tmp_path, over, metric, error):
    """Hand-written result files (the "-inf" is how write_result stores a non-finite number): an overflow in
    the variance, a division by zero bytes, a list for an object each ended compare in a traceback."""
    old = write_results(tmp_path, "o", [2.06, 2.059])
    bad = Path(old[0])
    bad.write_text(json.dumps({**json.loads(bad.read_text()), **over}))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "compare",
            *write_results(tmp_path, "n", [2.0, 2.01]),
            "--against",
            *old,
            "--metric",
            metric,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert (r.returncode, r.stderr) == (2, f"error: {bad}: {error}" + r.stderr.split(error, 1)[1])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("seed", [1]),
        ("val_tokens", [1000]),
        ("eval_mode", {"a": 1}),
        ("provenance", {"tokenizer_sha256": [1]}),
    ],
)
def test_a_list_where_a_string_or_number_goes_is_compared_never_a_type_error(tmp_path, key, value):
    """Hand-written results with a list or an object for a seed, a token count, an eval mode or a tokenizer hash
    ended compare in TypeError: unhashable type (the values are compared as sets)."""
    new = write_results(tmp_path, "n", [2.0, 2.01])
    for p in new:
        Path(p).write_text(json.dumps({**json.loads(Path(p).read_text()), key: value}))
    old = load_results(write_results(tmp_path, "o", [2.06, 2.059]))
    if key == "seed":  # one seed twice: one run counted twice, refused
        with pytest.raises(ValueError, match=r"new side: .* are one run \(one seed counted twice\)"):
            compare_results(load_results(new), old)
    else:
        with pytest.raises(ValueError, match="score different tokens"):
            compare_results(load_results(new), old)


def test_an_object_track_on_the_old_side_or_no_bpb_is_one_line_never_a_type_error(tmp_path):
    """Two more a fuzz of hand-written results found: an object for the old side's track (unhashable in a
    set) and --metric val_bpb on a result without val_bpb (float(None)), each a TypeError traceback."""
    new = load_results(write_results(tmp_path, "n", [2.0, 2.01]))
    old_paths = write_results(tmp_path, "o", [2.06, 2.059])
    for p in old_paths:
        Path(p).write_text(json.dumps({**json.loads(Path(p).read_text()), "track": {"a": 1}}))
    with pytest.raises(
        ValueError, match=r"^the results ran on tracks \['10min_16mb', \"\{'a': 1\}\"\]; a record"
    ):
        compare_results(new, load_results(old_paths))
    old_paths = write_results(tmp_path, "o", [2.06, 2.059])
    Path(old_paths[0]).write_text(json.dumps({**json.loads(Path(old_paths[0]).read_text()), "val_bpb": None}))
    with pytest.raises(ValueError, match=f"^{old_paths[0]} has no val_bpb; compare results that hold it"):
        compare_results(new, load_results(old_paths), metric="val_bpb")


def test_one_run_counted_twice_is_refused_not_a_record(tmp_path):
    """Two verified results, each passed twice (or the copy an entrant left in both results/ and runs/): the new
    side's n doubled and its spread shrank, p 0.073 -> 0.0019, and compare said NEW RECORD with a warning beside
    it. Two seeds with one score to the last bit (a train.py that fixed its own seed) are one run as well."""
    old_paths = write_results(tmp_path, "o", [2.06, 2.059, 2.061])
    new_paths = write_results(tmp_path, "n", [2.04, 2.046])
    ledger = read_ledger(ledger_of(tmp_path, *old_paths, *new_paths))[1]
    old = load_results(old_paths)
    assert (
        compare_results(load_results(new_paths), old, verifications=ledger)["record"] is False
    )  # the control
    with pytest.raises(
        ValueError, match=r"new side: .*n_0\.json and .*n_0\.json are one run \(one seed counted"
    ):
        compare_results(load_results(new_paths * 2), old, verifications=ledger)
    same = write_results(tmp_path / "same", "s", [2.04, 2.04])
    with pytest.raises(ValueError, match="the same val_loss and val_bpb to the last bit"):
        compare_results(load_results(same), old)
    with pytest.raises(ValueError, match="old side: .* are one run"):
        compare_results(load_results(new_paths), load_results(old_paths + old_paths[:1]))


def test_results_of_two_tracks_are_refused_not_a_record_with_a_warning(tmp_path):
    """The new entry's runs on 10min_16mb against "the record" run on `smoke` (a loosened budget and validation
    subset; a count of 1,000 tokens on both sides here), every result verified in the ledger: compare said NEW
    RECORD with a warning line beside it. Results of two tracks are refused; the track's margin and p-value apply
    to its own results (`--track` still chooses them)."""
    new, old = CASES["clear record"]
    new_paths = write_results(tmp_path, "n", new)
    old_paths = write_results(tmp_path, "o", old, track="smoke")
    ledger = read_ledger(ledger_of(tmp_path, *new_paths, *old_paths))[1]
    mixed = new_paths[:2] + write_results(tmp_path / "r", "m", new[2:], track="smoke")
    for n_paths, o_paths in ((new_paths, old_paths), (mixed, write_results(tmp_path / "o2", "o", old))):
        with pytest.raises(ValueError, match=r"the results ran on tracks \['10min_16mb', 'smoke'\]"):
            compare_results(load_results(n_paths), load_results(o_paths), verifications=ledger)
    control = write_results(tmp_path / "c", "o", old)
    assert compare_results(load_results(new_paths), load_results(control))["record"] is True


def test_a_verification_under_a_loose_tolerance_compares_the_re_score_not_the_claim(tmp_path):
    """HOLE (before the fix): the leaderboard ranks a verified seed at the worse of its own figure and its
    verification's re-score (a verify run under a loose --tol-bpb accepts an edited figure), but `pgolf compare`
    tested the figures the result files hold: seeds that re-scored at 2.06, like the record's, edited to 2.04 and
    verified with --tol-bpb 0.03, were a NEW RECORD with no warning (every result verified). The test now runs on
    the worse of each seed's figure and its re-score."""
    old_paths = write_results(tmp_path, "o", [2.06, 2.059, 2.061])
    new_paths = write_results(tmp_path, "n", [2.040, 2.041, 2.0395, 2.0405])
    ledger = ledger_of(tmp_path, *old_paths, *new_paths)
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    for line, p in zip(lines[3:], new_paths, strict=True):  # each new seed re-scored as the old ones score
        r = json.loads(Path(p).read_text())
        again = r["val_loss"] + 0.0205
        line["checks"] = [
            {"name": "re-score val_loss (tolerance 0.03)", "ok": True, "expected": r["val_loss"], "actual": again},
            {"name": "re-score val_bpb (tolerance 0.03)", "ok": True, "expected": r["val_bpb"],
             "actual": again * r["val_tokens"] / (math.log(2) * r["val_bytes"])},
        ]  # fmt: skip
    ledger.write_text("".join(json.dumps(x) + "\n" for x in lines))
    verifications = read_ledger(ledger)[1]
    rec = compare_results(load_results(new_paths), load_results(old_paths), verifications=verifications)
    assert rec["unverified"] == [] and rec["record"] is False, rec
    # control: re-scores that agree with the claims leave the record one
    (tmp_path / "agree").mkdir()
    ledger = ledger_of(tmp_path / "agree", *old_paths, *new_paths)
    rec = compare_results(
        load_results(new_paths), load_results(old_paths), verifications=read_ledger(ledger)[1]
    )
    assert rec["record"] is True
