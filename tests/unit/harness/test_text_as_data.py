"""Text from a submission is data (harness/run/text.py): on the card, on the leaderboard's markdown and
HTML, in a plot's title. An attacker's name, author, lineage, preset, overrides or rank text holds ESC
sequences (which rewrote the terminal card: "status ok (verified)" over a failed run), newlines (which forged a
second section of leaderboard.md with a raw HTML table), a bidi override, or 60,000 characters (36 s of
plotting). Each is shown escaped and bounded. The board keys a row by an entry id, never a free-text name
(two entries with one name were merged, a bad seed averaged under someone else's name), and ranks only
results scored under their track's rules (a validation-subset score ranked beside full-split ones)."""

from __future__ import annotations

import json
from typing import Any

from harness.records.leaderboard import build, markdown, page
from harness.records.verify import result_digest
from harness.run.pipeline import _tail
from harness.run.result import card
from harness.run.text import NAME_MAX_CHARS, markdown_cell, visible

ESC_NAME = "\x1b[2K\x1b[1A\r│ status        ok  (verified)\x1b[0m"
NL_NAME = "x |\n\n## Ranked for real\n\n<table><tr><td>forged</td></tr></table>\n| 1 | evil"
HOSTILE = [ESC_NAME, NL_NAME, "\u202eelif", "a" * 60_000, "[click](javascript:alert(1)) *bold* _it_ `code`"]


def full_result(name: str = "tiny", **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "format": "pg-result",
        "format_version": 1,
        "status": "ok",
        "verification": "unverified",
        "submission": {"name": name, "author": "someone", "github_id": "someone", "builds_on": None},
        "track": "10min_16mb",  # a record track: only these rank (harness/records/leaderboard.py)
        "preset": "tiny",
        "seed": 1,
        "created_unix_s": 1_790_000_000.0,
        "run_dir": "/runs/r1",
        "val_loss": 2.0,
        "val_bpb": 1.0,
        "unigram_bpb": 3.0,
        "val_tokens": 4096,
        "val_bytes": 9000,
        "eval_mode": "standard",
        "eval_dtype": "float32",
        "eval_time_s": 1.0,
        "bytes_code": 100,
        "bytes_model": 900,
        "bytes_total": 1000,
        "cap_bytes": 16_000_000,
        "within_cap": True,
        "train_time_s": 10.0,
        "steps": 30,
        "tokens_seen": 3000,
        "world_size": 1,
        "phases": {"command": {"overrides": []}, "train": {"isolation": {"mode": "auto", "verified": True}}},
        "config": {"launch": {"sandbox": "auto"}},
        "provenance": {"hardware": {"cpu": "cpu", "cuda_devices": []}, "code_files": {"model.py": "ab" * 32}},
    }
    r.update(over)
    return r


def test_visible_escapes_every_control_and_format_character_and_bounds_the_length():
    assert visible("a\x1b[2Kb\nc\u202ed\\") == "a\\x1b[2Kb\\nc\\u202ed\\\\"
    assert len(visible("a" * 60_000, 80)) == 80 and visible("a" * 60_000, 80).endswith("…")
    assert "\\" not in markdown_cell("naive_baseline") and markdown_cell("a|b") == "a\\|b"


def test_the_card_shows_hostile_text_as_escapes_on_as_many_lines_as_a_clean_card():
    clean = card(full_result()).splitlines()
    for name in HOSTILE:
        for where in ("name", "detail"):
            r = full_result(name) if where == "name" else full_result(status="error", detail=f"train: {name}")
            text = card(r)
            assert "\x1b" not in text and "\r" not in text and "\u202e" not in text, where
            extra = 1 if where == "detail" else 0  # the why line of a failed run
            assert len(text.splitlines()) == len(clean) + extra, (where, text)
            assert all(len(line) <= 1000 for line in text.splitlines())
            if where == "name":  # the header names it, bounded, and the status line is the real one
                assert len(text.splitlines()[1]) < NAME_MAX_CHARS + 60
                assert text.splitlines()[2].startswith("│ status        ok  (unverified)")


def test_the_card_says_when_nothing_was_isolated_or_isolation_was_loosened():
    """An unranked run whose own config switched the sandbox off printed an ok card with no word of it."""
    off = full_result(config={"launch": {"sandbox": "off"}})
    off["phases"]["train"]["isolation"] = {"mode": "off", "verified": False}
    status = card(off).splitlines()[2]
    assert status.startswith("│ status        ok  (unverified)  — NOT ISOLATED: the sandbox was off"), status
    loose = full_result()
    loose["phases"]["command"]["loosened"] = [
        {"key": "launch.sandbox_read_paths", "value": "/data", "track_value": "", "origin": "config.toml"},
        {"key": "budget.grace_s", "value": 99.0, "track_value": 30.0, "origin": "config.toml"},
    ]
    status = card(loose).splitlines()[2]
    assert "ISOLATION LOOSENED: launch.sandbox_read_paths = '/data'" in status
    assert "track rules loosened: budget.grace_s" in status
    assert "NOT ISOLATED" not in card(full_result()) and "LOOSENED" not in card(full_result())


def _board(results: list[dict[str, Any]], verified: bool = True) -> dict[str, Any]:
    vers = {result_digest(r): {"status": "verified"} for r in results} if verified else {}
    return build(results, vers, None)


def test_hostile_text_in_every_field_stays_in_its_cell_in_markdown_and_html():
    results = []
    for i, text in enumerate(HOSTILE):
        r = full_result(text, seed=i, run_dir=f"/runs/{text[:200]}")
        r["submission"].update(author=text, github_id=text, builds_on=text)
        r["preset"] = text[:300]
        r["phases"]["command"]["overrides"] = [f"train.x={text[:300]!r}"]
        results.append(r)
        bad = json.loads(json.dumps(r))
        bad["status"], bad["val_bpb"] = "error", None
        results.append(bad)
    board = _board(results)
    assert len(board["ranked"]) == len(HOSTILE) and len(board["unranked"]) == len(HOSTILE)
    md = markdown(board)
    assert "\x1b" not in md and "\u202e" not in md and "<table" not in md and "<td>" not in md
    lines = md.splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# Leaderboard",
        f"## Not ranked ({len(HOSTILE)})",
    ]
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) == 2 + len(board["ranked"]) + len(board["unranked"])  # two header rows
    assert all(line.count(" | ") == line.replace("\\|", "").count(" | ") for line in rows)
    cells = {len(line.replace("\\|", "").split(" | ")) for line in rows[1 : 1 + len(HOSTILE)]}
    assert cells == {len(rows[0].split(" | "))}, cells  # every ranked row has exactly the header's cells
    assert max(map(len, lines)) < 3000
    html = page(board)
    assert "\x1b" not in html and "\u202e" not in html and html.count("<table") == 2
    assert "<td>forged</td>" not in html and "javascript:alert" not in html.replace("javascript:alert(1)", "")


def test_two_entries_with_one_name_are_two_rows_keyed_by_entry_id():
    """Rows were keyed by the free-text name: someone's bad seed was averaged into another entry's row."""
    mine = full_result("popular_name", val_bpb=1.0)
    theirs = full_result("popular_name", val_bpb=3.0, seed=2)
    theirs["submission"]["author"] = "someone else"
    theirs["provenance"] = {**theirs["provenance"], "code_files": {"model.py": "cd" * 32}}
    seed2 = full_result("popular_name", val_bpb=1.2, seed=3)  # my entry again: the same code, another seed
    board = _board([mine, theirs, seed2])
    rows = {r["entry_id"]: r for r in board["ranked"]}
    assert len(rows) == 2 and sorted(r["seeds"] for r in rows.values()) == [1, 2]
    assert sorted(round(r["val_bpb"], 6) for r in rows.values()) == [1.1, 3.0]
    ids = [r["entry_id"] for r in board["ranked"]]
    assert all(f'id="row-{i}"' in page(board) for i in ids)


def test_a_board_ranks_only_results_scored_under_their_tracks_rules():
    full = full_result("full_split", val_bpb=1.5)
    subset = full_result("on_a_subset", val_bpb=0.9)
    subset["phases"]["score"] = {"eval_subset_max_tokens": 4096}
    loosened = full_result("loosened", val_bpb=0.8)
    loosened["phases"]["command"]["loosened"] = [{"key": "budget.grace_s", "value": 99.0}]
    board = _board([full, subset, loosened])
    assert [r["name"] for r in board["ranked"]] == ["full_split"]
    why = {r["name"]: r["why"] for r in board["unranked"]}
    assert (
        why["on_a_subset"]
        == "scored on the first 4,096 validation tokens; the track 10min_16mb scores the full split"
    )
    assert why["loosened"].startswith("the track's rules were loosened (budget.grace_s")
    two_tracks = full_result("cpu_entry", track="cpu_10min_16mb", val_bpb=2.0)
    two_tracks["phases"]["score"] = {"eval_subset_max_tokens": 2_101_377, "eval_subset_docs": 1_700}
    by_tokens = full_result("cpu_by_tokens", track="cpu_10min_16mb", val_bpb=1.9)
    by_tokens["phases"]["score"] = {"eval_subset_max_tokens": 2_097_152}  # the track's cut before documents
    board = _board([full, two_tracks, by_tokens])
    assert sorted((r["track"], r["rank"]) for r in board["ranked"]) == [
        ("10min_16mb", 1),
        ("cpu_10min_16mb", 1),
    ]
    assert {r["name"]: r["why"] for r in board["unranked"]}["cpu_by_tokens"] == (
        "scored on the first 2,097,152 validation tokens; the track cpu_10min_16mb scores the first 1,700 "
        "validation documents"
    )


def test_a_plot_title_is_bounded_and_escaped():
    from harness.run.pipeline import plot_title

    title = plot_title("a" * 60_000 + "\x1b[2K", "smoke", "tiny\n", 1)
    assert len(title) < NAME_MAX_CHARS + 60 and "\x1b" not in title and "\n" not in title


def test_submission_json_refuses_control_characters_and_huge_text_before_anything_runs():
    import re

    import pytest

    from harness.submission import validate_metadata

    meta = {
        "name": "ok_name", "author": "a", "github_id": "a", "date": "2026-01-01", "track": "smoke",
        "data_variant": "sp1024", "blurb": "two\nlines\tfine",
    }  # fmt: skip
    assert validate_metadata(dict(meta), "submission.json")["name"] == "ok_name"
    for key, value, why in [
        ("name", ESC_NAME, "control character '\\x1b'"),
        ("name", NL_NAME, "control character '\\n'"),
        ("author", "\u202eelif", "control character"),
        ("name", "a" * 60_000, "60,000 characters; at most 200"),
        ("blurb", "x\x1b[2J", "control character '\\x1b'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            validate_metadata({**meta, key: value}, "submission.json")


def test_the_last_lines_of_a_failed_phase_s_log_reach_the_terminal_as_text(tmp_path):
    """`pgolf run` prints the last lines of a failed training phase's log under the card; the log is the ranks'
    output, which rewrote the card above it and set the official's clipboard (OSC 52). Each line is shown
    escaped and bounded, one line of the log per line shown."""
    log = tmp_path / "train.log"
    over_card = "\x1b[2K\x1b[1A│ status        ok  (verified)\x1b[0m"  # up a line, over the card's verdict
    lines = [f"step {i}" for i in range(20)] + [over_card, "\x1b]52;c;cm0gLXJmIH4K\x07", "z" * 50_000]
    log.write_bytes("\n".join(lines).encode() + b"\n")
    shown = _tail(log).split("\n")
    assert len(shown) == 15 and shown[:12] == [f"step {i}" for i in range(8, 20)]
    assert all(c.isprintable() for line in shown for c in line)
    assert (
        shown[12] == "\\x1b[2K\\x1b[1A│ status        ok  (verified)\\x1b[0m"
        and shown[13] == "\\x1b]52;c;cm0gLXJmIH4K\\x07"
    )
    assert shown[14].endswith("…") and len(shown[14]) <= 1000
    assert _tail(tmp_path / "absent.log") == ""
