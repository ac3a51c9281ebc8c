"""Attacks on the officials' tools around the core (`pgolf queue`'s triage, `pgolf chain`'s page and lines)
by an entrant who controls only their own folder: its name, its submission.json, its files. Each test is the
entry a competitor can send and what it must not do to the official's terminal, page or machine."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records.chain import build_chain, lines, markdown
from harness.records.queue import State, triage
from harness.records.verify import read_result

REPO = Path(__file__).resolve().parents[3]
TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"


def _refused_entry(root: Path, name: str, **meta: object) -> Path:
    """A copy of tiny_lm under `root/name` whose submission.json fails its schema (no author), with `meta`."""
    entry = root / name
    shutil.copytree(TINY_LM, entry, ignore=shutil.ignore_patterns("__pycache__"))
    m = json.loads((entry / "submission.json").read_text(encoding="utf-8"))
    m.pop("author")
    m.update(meta)
    (entry / "submission.json").write_text(json.dumps(m), encoding="utf-8")
    return entry


def test_a_refused_entrys_name_date_and_track_are_text_on_the_chain(tmp_path):
    # A refused entry's submission.json never passed its schema: its date and track reach the chain as the
    # entrant wrote them, and its folder name makes its key. None may rewrite the official's terminal
    # (ESC, CR) or turn into markup on chain.md (HTML, an image fetched from the entrant's server, a row).
    entry = _refused_entry(
        tmp_path / "entries",
        "evil\x1b[31mRED",
        date="<img src=x onerror=alert(1)>\x1b[2J\r| forged | row |",
        track="![](http://evil.example/t.png)\x1b]0;pwn\x07",
    )
    ledger = tmp_path / "ledger.jsonl"
    _, rec = triage(entry, None, "auto", State(), ledger)
    assert not rec["ok"] and rec["entry_key"].isprintable() and "\x1b" not in rec["entry_key"]
    chain = build_chain(ledger, track=None, rule=None, order={})
    text = "\n".join(lines(chain))
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    md = markdown(chain)
    assert "\x1b" not in md and "\r" not in md
    assert "<img" not in md and "![](" not in md
    row = md.splitlines()[-3]
    assert row.startswith("| 1 |") and row.count(" | ") == 8  # one row, nine cells: nothing forged


def test_a_huge_sparse_submission_json_is_refused_unread(tmp_path):
    # 1 GiB of holes after the JSON costs the entrant nothing on disk; read whole, it cost triage 3.3 GB of
    # memory (a larger one would end `pgolf queue` for every entry). Refused by its size, before any read.
    entry = tmp_path / "entries" / "big"
    shutil.copytree(TINY_LM, entry, ignore=shutil.ignore_patterns("__pycache__"))
    with (entry / "submission.json").open("r+b") as f:
        f.truncate(1 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _, rec = triage(entry, None, "auto", State(), tmp_path / "ledger.jsonl")
    assert not rec["ok"] and "more than the 1,048,576 allowed" in rec["failed"][0][1]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing read whole


@pytest.mark.parametrize("name", ["submission.json", "model.py"])
def test_a_linked_metadata_or_source_is_not_read_out_of_the_folder(tmp_path, name):
    # A link out of the folder was read before the folder rules refused it: another entry's or the official's
    # JSON became this entry's name, date and track on the ledger and the chain.
    outside = tmp_path / "official.json"
    meta = json.loads((TINY_LM / "submission.json").read_text(encoding="utf-8"))
    outside.write_text(json.dumps({**meta, "name": "SECRET-OUTSIDE"}), encoding="utf-8")
    entry = tmp_path / "entries" / "linked"
    shutil.copytree(TINY_LM, entry, ignore=shutil.ignore_patterns("__pycache__"))
    (entry / name).unlink()
    (entry / name).symlink_to(outside if name == "submission.json" else TINY_LM / name)
    ledger = tmp_path / "ledger.jsonl"
    _, rec = triage(entry, None, "auto", State(), ledger)
    assert not rec["ok"] and f"{name} is a symbolic link" in rec["failed"][0][1]
    assert "SECRET-OUTSIDE" not in ledger.read_text(encoding="utf-8")


@pytest.mark.parametrize("text", ["[1]", "3", '"pg-result"', "null"])
def test_verify_of_a_claimed_result_that_is_no_json_object_is_one_line(tmp_path, text):
    # An entrant's claimed results/seed-1/result.json is what an official passes to `pgolf verify`.
    (tmp_path / "result.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="is not a pg-result record .*not an object"):
        read_result(tmp_path)


def test_a_batch_verify_with_one_array_result_is_lines_never_a_traceback(tmp_path):
    # `pgolf verify A B`: one entrant's result.json holding a JSON array stopped the batch with a traceback.
    bad = tmp_path / "bad\x1b[2J"
    bad.mkdir()
    (bad / "result.json").write_text("[1]", encoding="utf-8")
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify", str(bad), str(tmp_path / "missing"),
         "--ledger", str(tmp_path / "ledger.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in p.stderr and p.returncode != 0
    assert "not a JSON object" in p.stdout and "\x1b" not in p.stdout
