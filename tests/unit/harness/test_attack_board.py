"""The leaderboard against hostile ledger lines (harness/records/leaderboard.py). A line is the word of
whatever wrote it: `write_result` writes a non-finite number as the string "inf", a line may hold a bare
Infinity, a string where a number goes, a list where an object goes, a time past year 9999. Each stopped
the whole board with a traceback (one bad record hid every other); each is now listed apart, never
ranked. A verified result still ranks only on numbers the board checks itself: bytes within the track's
cap (a record's within_cap is its writer's word) and a bpb above zero; the same result twice in the
ledger is one run, never a second seed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.records.leaderboard import build, markdown, page, write_leaderboard
from harness.records.verify import result_digest
from tests.unit.harness.test_text_as_data import full_result


def verification(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "pg-verification",
        "format_version": 1,
        "status": "verified",
        "result_sha256": result_digest(r),
    }


def entry(name: str, **over: Any) -> dict[str, Any]:
    over.setdefault("submission", {"name": name, "author": name, "github_id": name, "builds_on": None})
    return full_result(name, **over)


HOSTILE_LINES = {
    "inf bpb as written": entry("inf", val_bpb="inf", status="error"),
    "text bytes": entry("textbytes", bytes_total="big"),
    "text seed": entry("textseed", seed="x"),
    "list submission": full_result("x", submission=["x"]),
    "list phases": entry("listphases", phases=["x"]),
    "text time": entry("texttime", created_unix_s="x", submission={"name": "texttime"}),
    "time past 9999": entry("future", created_unix_s=1e20),
    "time in 9999": entry("far", created_unix_s=253_402_300_799.0),
    "a 400-digit bpb": entry("digits", val_bpb=10**400),
    "a 400-digit size": entry("bigsize", bytes_total=10**400),
    "a number for the overrides": entry("numover", phases={"command": {"overrides": 5.0}}),
    "a NaN in an object for builds_on": entry(
        "nanlineage", submission={"name": "nanlineage", "builds_on": {"x": float("nan")}}
    ),
    "list score": entry("listscore", phases={"score": ["x"], "command": {"loosened": 5}}),
    "NUL in the plot's name": entry("nulplot", phases={"plot": {"file": "a\x00b"}}),
    "NUL in the run folder": entry("nulrun", run_dir="/runs/r\x00x", phases={"plot": {"file": "p.png"}}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_LINES))
def test_one_hostile_record_is_listed_apart_and_the_board_still_builds(tmp_path: Path, case: str) -> None:
    good = entry("good")
    bad = HOSTILE_LINES[case]
    lines = [json.dumps(good), json.dumps(verification(good)), json.dumps(bad)]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(lines) + "\n")
    board = write_leaderboard(ledger, tmp_path / "site")
    assert [r["name"] for r in board["ranked"]] == ["good"]
    assert len(board["unranked"]) == 1
    assert (tmp_path / "site" / "index.html").read_text().count("<tr") == 4  # 2 headers, 2 rows


def test_a_bare_infinity_in_a_line_is_listed_and_can_never_be_verified(tmp_path: Path) -> None:
    good = entry("good")
    ledger = tmp_path / "ledger.jsonl"
    bare = json.dumps(entry("bare")).replace('"val_bpb": 1.0', '"val_bpb": Infinity')
    ledger.write_text("\n".join([json.dumps(good), json.dumps(verification(good)), bare]) + "\n")
    board = write_leaderboard(ledger, tmp_path / "site")
    assert [(r["name"], r["verification"], r["val_bpb"]) for r in board["unranked"]] == [
        ("bare", "unverified", None)
    ]


def test_a_verification_line_keyed_by_no_digest_is_no_verification(tmp_path: Path) -> None:
    """A pg-verification line whose result_sha256 is a list (unhashable) stopped the board and the chain."""
    good = entry("good")
    bad = {"format": "pg-verification", "format_version": 1, "status": "verified", "result_sha256": ["x"]}
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(json.dumps(x) for x in (good, verification(good), bad)) + "\n")
    board = write_leaderboard(ledger, tmp_path / "site")
    assert [r["name"] for r in board["ranked"]] == ["good"]


@pytest.mark.parametrize("text", ["[1, 2]", '"pg-result"', "7"])
def test_a_ledger_line_that_is_no_object_is_one_line(tmp_path: Path, text: str) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps(entry("good")) + "\n" + text + "\n")
    with pytest.raises(ValueError, match=r"ledger.jsonl:2 is a JSON \w+, not a record"):
        write_leaderboard(ledger, tmp_path / "site")


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"bytes_total": 16_000_001}, "bytes_total 16,000,001 is outside 0..16,000,000, the track's cap"),
        ({"bytes_total": -1}, "bytes_total -1 is outside 0..16,000,000, the track's cap"),
        ({"val_bpb": -0.5}, "val_bpb -0.5 is below zero"),
        ({"within_cap": "yes"}, "over the cap"),
    ],
)
def test_a_verified_result_ranks_only_on_numbers_the_board_checks(over: dict[str, Any], why: str) -> None:
    good, claim = entry("good"), entry("claim", **over)
    board = build([good, claim], {result_digest(r): verification(r) for r in (good, claim)}, None)
    assert [r["name"] for r in board["ranked"]] == ["good"]
    assert [(r["name"], r["why"]) for r in board["unranked"]] == [("claim", why)]


def test_the_same_result_twice_in_the_ledger_is_one_seed() -> None:
    one, other = entry("e", seed=1, val_bpb=1.0), entry("e", seed=2, val_bpb=1.2)
    vs = {result_digest(r): verification(r) for r in (one, other)}
    board = build([one, one, one, other], vs, None)
    (row,) = board["ranked"]
    assert (row["seeds"], row["seed_list"], round(row["val_bpb"], 6)) == (2, [1, 2], 1.1)
    markdown(board), page(board)


def test_a_lineage_never_links_to_an_impostor_that_took_the_name() -> None:
    """An entrant names its entry after an earlier one ("base", another author) and scores better: every
    entry that builds on "base" linked to the impostor's row, the one sorted first."""
    base = entry("base", val_bpb=1.2)
    impostor = entry("base", val_bpb=1.0, submission={"name": "base", "author": "mallory", "github_id": "m"})
    child = entry("child", val_bpb=1.1, submission={"name": "child", "author": "c", "builds_on": "base"})
    board = build(
        [base, impostor, child], {result_digest(r): verification(r) for r in (base, impostor, child)}, None
    )
    assert [r["name"] for r in board["ranked"]] == ["base", "child", "base"]
    html = page(board)
    child_row = html.split(f'id="row-{board["ranked"][1]["entry_id"]}"')[1].split("</tr>")[0]
    assert '<a href="#row-' not in child_row and ">base</td>" in child_row
    alone = page(build([base, child], {result_digest(r): verification(r) for r in (base, child)}, None))
    assert f'<a href="#row-{board["ranked"][2]["entry_id"]}">base</a>' in alone


def test_a_run_folder_named_like_a_url_scheme_links_as_a_path(tmp_path: Path) -> None:
    """A run folder is named after the submission's folder (runs/NAME-PRESET-STAMP), and the entrant names that:
    "javascript:alert(document.cookie)". With the page written into runs/, the plot's link was
    href="javascript:alert(document.cookie)-tiny-.../train_curve.png": script, run on a click."""
    runs = tmp_path / "runs"
    run_dir = runs / "javascript:alert(document.cookie)-tiny-20261204-235959"
    r = entry("x", run_dir=str(run_dir), phases={"plot": {"file": "train_curve.png"}})
    html = page(build([r], {}, None), runs)
    assert 'href="./javascript:alert(document.cookie)-tiny-20261204-235959/train_curve.png"' in html
    assert 'href="javascript:' not in html


@pytest.mark.parametrize(
    ("copy", "both"),
    [
        ("n\\u0430ive_baseline", False),  # a Cyrillic а: it alone mixes scripts
        ("naive_baseline", True),  # the same name, author and GitHub id, exactly
        ("\\uff4eaive_baseline", True),  # a fullwidth n
        ("naive_base\\u200bline", True),  # a zero-width space
        ("Naive_Baseline", True),
        # one script's look-alikes: a capital I, a digit 1 for the l; rn for m (in a sans-serif page)
        ("naive_baseIine", True),
        ("naive_base1ine", True),
        ("NAIVE_BASELINE", True),
    ],
)
def test_an_entry_that_looks_like_another_is_marked_on_the_board(copy: str, both: bool) -> None:
    """An impostor copies the leader's name (and its author and GitHub id: free text, never checked): the page
    showed two rows a reader could not tell apart. Rows of one skeleton are now marked `lookalike` (which
    came first is the chain's question), a name mixing Latin and Cyrillic too, in the JSON, the markdown and
    the page; a name of one language's scripts (kana with ideographs) is not."""
    name = copy.encode().decode("unicode_escape")
    sub = {"name": "naive_baseline", "author": "alice", "github_id": "alice", "builds_on": None}
    real = entry("naive_baseline", submission=sub, val_bpb=1.2)
    fake = entry(
        name, submission={**sub, "name": name}, val_bpb=1.1, provenance={"code_files": {"model.py": "f"}}
    )
    other = entry("日本語のモデル", val_bpb=1.3)
    board = build([real, fake, other], {result_digest(r): verification(r) for r in (real, fake, other)}, None)
    marked = [(r["name"], r["marks"]) for r in board["ranked"]]
    lookalike = ["lookalike"]
    assert marked == [
        (name, lookalike),
        ("naive_baseline", lookalike if both else []),
        ("日本語のモデル", []),
    ]
    assert markdown(board).count("**[lookalike]**") == 1 + both
    assert page(board).count('<span class="mark lookalike">lookalike</span>') == 1 + both


@pytest.mark.parametrize("hidden", ["\u00ad", "\U000e0041", "\u061c", "\u180e", "\ufff9", "\u2029"])
def test_submission_json_refuses_every_invisible_format_character(hidden: str) -> None:
    """submission.json promised no control or format character, but its list of ranges missed the soft hyphen,
    tag characters and others: "naive_base\\u00adline" passed and showed as another entry's name."""
    from harness.submission import validate_metadata

    meta = {"name": f"naive_base{hidden}line", "author": "a", "github_id": "a", "date": "2026-01-01",
            "track": "smoke", "data_variant": "sp1024", "blurb": "two\nlines\tfine"}  # fmt: skip
    with pytest.raises(
        ValueError, match=re.escape(f"field 'name' holds the control character {hidden!r} at 10;")
    ):
        validate_metadata(meta, "submission.json")
    assert (
        validate_metadata({**meta, "name": "naive_baseline"}, "submission.json")["blurb"]
        == "two\nlines\tfine"
    )


def test_a_board_of_one_huge_bpb_draws_and_verified_huge_bpbs_never_rank(tmp_path: Path) -> None:
    """One result at 1e17 bpb: the plot's y range could not be widened (1e17 + 0.5 == 1e17) and its ticks took
    log10(0) (math domain error). Two verified seeds at 1e308: their mean was inf and leaderboard.json could
    not be written (no NaN or inf in a record)."""
    page(build([entry("big", val_bpb=1e17, status="error")], {}, None))
    a, b = entry("huge", seed=1, val_bpb=1e308), entry("huge", seed=2, val_bpb=1e308)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("\n".join(json.dumps(x) for x in (a, b, verification(a), verification(b))) + "\n")
    board = write_leaderboard(ledger, tmp_path / "site")
    assert board["ranked"] == [] and {r["why"] for r in board["unranked"]} == {"val_bpb 1e+308 is over 1e+06"}


def test_seeds_that_were_one_run_are_marked_on_the_board() -> None:
    """Three verified runs of an entry whose train.py fixed its own seed: three seeds, one artifact and one score to
    the last bit, shown as "3 seeds, std 0" beside an entry whose seeds really varied. The row is marked
    `one_run` (reproduce.py same_runs): its seeds are one sample."""
    sha = {"artifact_sha256": "a" * 64}
    lucky = [entry("lucky", seed=s, val_bpb=1.0, val_loss=2.0, run_dir=f"/runs/l{s}") for s in (1, 2, 3)]
    honest = [entry("honest", seed=s, val_bpb=1.0 + s / 1000, run_dir=f"/runs/h{s}") for s in (1, 2)]
    for r in lucky:
        r["provenance"] = {**r["provenance"], **sha}
    vs = {result_digest(r): verification(r) for r in (*lucky, *honest)}
    rows = {r["name"]: r for r in build([*lucky, *honest], vs, None)["ranked"]}
    assert rows["lucky"]["seeds"] == 3 and "one_run" in rows["lucky"]["marks"]
    assert "one_run" not in rows["honest"]["marks"]
    assert "one_run" in markdown(build(lucky, vs, None))


def test_a_verification_under_a_loose_tolerance_ranks_the_re_score_not_the_claim() -> None:
    """HOLE (before the fix): the board ranked a verified result at its own val_bpb whatever --tol-bpb its
    verification ran under: a result edited from 1.30 to 1.20, verified with --tol-bpb 0.2, out-ranked an honest
    1.25. It now ranks at the worse of its own figure and the re-score the verification recorded."""
    honest, edited = entry("honest", val_bpb=1.25, val_loss=2.0), entry("edited", val_bpb=1.20, val_loss=1.9)
    loose = {
        **verification(edited),
        "tol_bpb": 0.2,
        "checks": [
            {"name": "re-score val_loss (tolerance 0.2)", "ok": True, "expected": 1.9, "actual": 2.1},
            {"name": "re-score val_bpb (tolerance 0.2)", "ok": True, "expected": 1.20, "actual": 1.30},
        ],
    }
    board = build(
        [honest, edited], {result_digest(honest): verification(honest), result_digest(edited): loose}, None
    )
    assert [(r["name"], r["val_bpb"]) for r in board["ranked"]] == [("honest", 1.25), ("edited", 1.30)]
    # a re-score that came out better than the claim changes nothing; a hostile check is read as no number
    kind = {
        **loose,
        "checks": [{"name": "re-score val_bpb (tolerance 0.2)", "actual": 1.0}, {"name": 5}, "x"],
    }
    board = build([edited], {result_digest(edited): kind}, None)
    assert [r["val_bpb"] for r in board["ranked"]] == [1.20]
