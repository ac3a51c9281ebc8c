"""Attacks on the records and the scoring inputs by an entrant who controls only their own folder (its
submission.json, config.toml, code and artifact): each is a choice or a forgery a competitor can make without
touching the official's ledger or machines, and the score or record it must not win."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from data.tokenizer import BOS_ID
from harness.records.chain import Candidate, accept_in_order
from harness.records.reproduce import REPRODUCED
from scoring.score.eval_config import EvalConfig
from scoring.score.windows import plan_windows


def _cand(key: str, date: str, losses: list[float], order: int) -> Candidate:
    return Candidate(key=key, name=key, date=date, order=order, folder=key, track="smoke", verdict=REPRODUCED,
                     why_verdict="", val_loss=losses, val_bpb=[x / 1.386 for x in losses], val_tokens=1000,
                     val_bytes=2000, tokenizer="t" * 64)  # fmt: skip


def test_a_backdated_submission_date_does_not_jump_the_official_order():
    """submission.json's `date` is the entrant's word; the order file (the PRs as they came in) is the
    official's. X came in after B and is 0.002 nats better than B: not a record. Dated before B, it met A's
    frontier instead, was accepted, and then B (the real record) was refused against X."""
    a = _cand("A", "2026-01-01", [5.00, 5.01, 5.02], order=0)
    b = _cand("B", "2026-01-03", [4.90, 4.91, 4.92], order=1)
    x = _cand("X", "2026-01-02", [4.898, 4.908, 4.918], order=2)  # opened last, dated before B
    rows = {r["entry_key"]: r for r in accept_in_order([a, b, x])}
    assert rows["B"]["accepted"] and rows["B"]["frontier_before"] == "A"
    assert rows["X"]["frontier_before"] == "B" and not rows["X"]["accepted"]


def test_documents_mode_scores_the_end_of_every_document():
    """The eval mode is the entrant's choice. `documents` left out every BOS target, the prediction that a
    document ends here, from the current document's own tokens: the hard targets, with no bytes to share
    their cost, that standard and sliding score. A bigram on sample.jsonl's first 500 documents paid 5.66
    nats for each (0.001 bpb of 2.588 at 3,200 tokens a document; the official split's documents are
    2.6 times shorter). Every mode's targets past the first window are now every token after the first."""
    tokens = np.array([1, 5, 6, 7, 1, 8, 9, 1, 1, 10, 11, 12, 13], dtype=np.int64)
    for stride in (None, 2):
        cfg = EvalConfig(mode="documents", seq_len=3, stride=stride)
        plan = plan_windows(tokens, cfg)
        assert plan.target_positions().tolist() == list(range(1, tokens.size))
        for s, n in zip(plan.starts.tolist(), plan.lengths.tolist(), strict=True):
            assert BOS_ID not in tokens[s + 1 : s + n].tolist()  # no input crosses a document's start


def test_a_reproduction_on_another_track_is_not_evidence_for_the_claimed_one(monkeypatch):
    """submission.json says `10min_16mb`, the chain files the entry there; config.toml says `[run] track =
    "smoke"` with `eval.max_tokens = 2048`, which smoke accepts as loosened: every re-trained seed ran on
    smoke and scored its first 2,048 tokens, and the reproduction was `reproduced` for the record track."""
    from harness.records import reproduce as rp
    from harness.run import pipeline

    def result(track: str) -> dict:
        return {"status": "ok", "track": track, "val_bpb": 1.0, "val_loss": 1.0, "val_tokens": 2048,
                "val_bytes": 2048, "steps": 20, "train_time_s": 4.0, "bytes_total": 9_000,
                "phases": {"command": {"loosened": [{"key": "eval.max_tokens"}]}}}  # fmt: skip

    monkeypatch.setattr(pipeline, "run_pipeline", lambda *a, **kw: result("smoke"))
    task = {"entry_dir": "/x/e", "entry_key": "e", "entry_digest": "d" * 64, "seed": 1, "run_dir": "/x/r"}
    runs = [rp.reproduce_seed({**task, "seed": s}) for s in (1, 2)]
    meta = {"name": "e", "author": "a", "github_id": "g", "date": "2026-01-01", "track": "10min_16mb"}
    entry = rp.Entry(root=Path("/x/e"), meta=meta, claims=(), claimed_mean_bpb=1.0, preset=None,
                     digest="d" * 64, code_files={})  # fmt: skip
    rec = rp.verdict_of(entry, runs, rp.Tolerance())
    assert rec["verdict"] == rp.NOT_REPRODUCED
    assert "seed 1 ran on the entry's track" in {d["name"] for d in rec["differences"]}


def _artifact_bytes(header: bytes, payload: bytes = b"") -> bytes:
    from scoring.artifact.format import _PREFIX, ARTIFACT_MAGIC, ARTIFACT_VERSION

    return _PREFIX.pack(ARTIFACT_MAGIC, ARTIFACT_VERSION, len(header)) + header + payload


@pytest.mark.parametrize(
    "case",
    [
        "nested",
        "codec_string",
        "code_files_string",
        "tensors_list",
        "shape_string",
        "code_file_up",
        "code_file_abs",
    ],
)
def test_a_hostile_artifact_header_is_refused_in_one_line(tmp_path, case):
    """A submission's codec writes the artifact, which the trusted orchestrator, scorer and `pgolf verify` read.
    A header nested past the JSON parser's depth (RecursionError), a codec named by a string and code files
    given as a string (TypeError) crashed them with a bare traceback: a harness failure, not the entry's."""
    import hashlib
    import json

    from scoring.artifact.format import read_artifact
    from scoring.errors import ArtifactError

    good = {"format": "pg-artifact", "format_version": 1, "codec": {"name": "int8_zlib", "version": 1},
            "model_config": {}, "code_files": {"model.py": "0" * 64}, "bytes_code": 1,
            "tensors": {"w": {"shape": [2, 2], "dtype": "float32"}}, "payload_bytes": 0,
            "payload_sha256": hashlib.sha256(b"").hexdigest()}  # fmt: skip
    header = {
        "nested": b'{"format":"pg-artifact","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "codec_string": json.dumps({**good, "codec": "int8_zlib"}).encode(),
        "code_files_string": json.dumps({**good, "code_files": "model.py"}).encode(),
        "tensors_list": json.dumps({**good, "tensors": ["w"]}).encode(),
        "shape_string": json.dumps({**good, "tensors": {"w": {"shape": "2x2", "dtype": "float32"}}}).encode(),
        # joined onto the submission folder and hashed by a trusted reader: a file of the host's, compared
        "code_file_up": json.dumps(
            {**good, "code_files": {"model.py": "0" * 64, "../../etc/hostname": "0" * 64}}
        ).encode(),
        "code_file_abs": json.dumps(
            {**good, "code_files": {"model.py": "0" * 64, "/etc/hostname": "0" * 64}}
        ).encode(),
    }[case]
    path = tmp_path / "a.pgolf"
    path.write_bytes(_artifact_bytes(header))
    with pytest.raises(ArtifactError) as caught:
        read_artifact(path)
    assert "\n" not in str(caught.value)
    path.write_bytes(_artifact_bytes(json.dumps(good).encode()))
    assert read_artifact(path).codec_name == "int8_zlib"  # the control: a well-typed header reads


def test_a_score_that_left_targets_out_neither_ranks_nor_verifies():
    """Defence in depth for the documents-mode hole: a result (verified before the fix, or from a planner that
    skips) whose score left targets of its tokens out is not ranked, and verify's track checks name it. Only
    standard mode's last partial window (under eval_seq_len targets) may be left out."""
    from harness.records.leaderboard import rules_problem
    from harness.records.verify import track_checks
    from scoring.score.record import unscored_targets_problem

    n, docs, seq_len = 1_000_001, 5_000, 2048

    def result(mode: str, scored: int, subset: int | None = None) -> dict:
        score = {"val_tokens_available": n, "eval_subset_max_tokens": subset, "val_tokens": scored,
                 "eval_seq_len": seq_len, "eval_mode": mode, "metric_version": 1}  # fmt: skip
        return {"track": "10min_16mb", "phases": {"score": score}}

    old_documents = result("documents", n - 1 - docs)
    why = unscored_targets_problem(old_documents["phases"]["score"])
    assert why is not None and "5,000 left out" in why
    assert rules_problem(old_documents) == why
    failed = [c for c in track_checks(old_documents, None, True) if not c.ok]
    assert any("every target" in c.name for c in failed)
    for fine in (
        result("documents", n - 1),
        result("sliding", n - 1),
        result("standard", ((n - 1) // seq_len) * seq_len),  # the partial last window dropped
    ):
        assert unscored_targets_problem(fine["phases"]["score"]) is None
    # on a subset, the targets are those of its first max_tokens + 1 tokens
    assert unscored_targets_problem(result("sliding", 4096, subset=4096)["phases"]["score"]) is None
    assert unscored_targets_problem(result("sliding", 4095 - seq_len, subset=4096)["phases"]["score"])
    # a record without the figures (older, or hostile types) says nothing here: other checks hold those
    assert unscored_targets_problem({"val_tokens": "many"}) is None


def test_fresh_seeds_under_the_official_salt_are_not_the_entrants_to_compute():
    """Training is deterministic: claimed seeds reproduce exactly even when they are the best of a hundred tried.
    Fresh seeds from the digest alone an entrant computes too (the digest is of their own folder, which they can
    reformat until its seeds are good ones); under the official's salt they cannot, and the record says which."""
    import hashlib

    from harness.records import reproduce as rp
    from harness.records.queue import QueueConfig

    meta = {"name": "e", "author": "a", "github_id": "g", "date": "2026-01-01", "track": "smoke"}
    entry = rp.Entry(root=Path("/x/e"), meta=meta, claims=(), claimed_mean_bpb=1.0, preset=None,
                     digest="d" * 64, code_files={})  # fmt: skip
    from_digest = entry.seeds(3)
    # anyone holding the folder computes them
    assert from_digest == [
        int(hashlib.sha256(f"{'d' * 64}\0{i}".encode()).hexdigest()[:16], 16) % 2**31 for i in range(3)
    ]
    salted = entry.seeds(3, "official secret")
    assert salted != from_digest and salted == entry.seeds(3, "official secret")  # stable: a queue resumes
    assert entry.seeds(3, "another secret") != salted
    qcfg = QueueConfig(
        root=Path("/x"), out=Path("/y"), ledger=Path("/y/l"), seeds=3, seed_salt="official secret"
    )
    assert qcfg.seeds_of(entry) == salted
    rec = rp.fresh_seeds_record(entry, 3, "official secret")
    assert rec["salt_sha256"] == hashlib.sha256(b"official secret").hexdigest()
    assert "official secret" not in str(rec)
    assert "pass --seed-salt-file" in rp.fresh_seeds_record(entry, 3, None)["chosen"]


def test_the_seed_salt_comes_from_a_file_never_an_argument(tmp_path):
    """Any process on the machine reads another's arguments (/proc/PID/cmdline), and several nodes' ranks run without
    a PID namespace: the salt is read from a file, and a file that holds none is refused by name."""
    from harness.cli import build_parser
    from harness.records import reproduce as rp

    salt = tmp_path / "salt"
    salt.write_text("  official secret\n")
    salt.chmod(0o600)
    assert rp.read_seed_salt(str(salt)) == "official secret" and rp.read_seed_salt(None) is None
    for bad, why in (("", "holds nothing"), ("x" * 5000, "more than 4 KB")):
        salt.write_text(bad)
        with pytest.raises(ValueError, match=why):
            rp.read_seed_salt(str(salt))
    with pytest.raises(ValueError, match="cannot read it"):
        rp.read_seed_salt(str(tmp_path / "absent"))
    for command in ("reproduce", "queue"):  # no option takes the secret itself
        ns = build_parser().parse_args([command, str(tmp_path), "--seed-salt-file", str(salt)])
        assert ns.seed_salt_file == str(salt) and not any(
            "salt" in k and k != "seed_salt_file" for k in vars(ns)
        )


def test_a_results_folder_of_many_files_costs_a_bounded_walk_and_claims_are_read_once(tmp_path, monkeypatch):
    """The claims under results/ are the entrant's files: a folder of a million names must not cost the official a
    walk of all of them, and each claim is read once, bounded, never through a link (the bytes hashed into the
    entry's digest are the bytes parsed as its claim)."""
    import json
    import os
    import shutil

    from harness.records import reproduce as rp

    root = tmp_path / "e"
    shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "submissions" / "tiny_lm", root,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    claim = {"format": "pg-result", "status": "ok", "val_bpb": 2.5, "seed": 1, "preset": None}
    (root / "results" / "s1").mkdir(parents=True)
    (root / "results" / "s1" / "result.json").write_text(json.dumps(claim))
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({**claim, "val_bpb": 0.1, "seed": 9}))
    (root / "results" / "s2").mkdir()
    os.symlink(secret, root / "results" / "s2" / "result.json")
    entry = rp.load_entry(root)
    assert [(c.source, c.val_bpb) for c in entry.claims] == [("results/s1/result.json", 2.5)]

    monkeypatch.setattr(rp, "CLAIM_MAX_ENTRIES", 50)
    for i in range(60):
        (root / "results" / "s1" / f"log{i}.txt").write_text("x")
    with pytest.raises(ValueError, match="more than 50 files and folders under results/ and runs/"):
        rp.load_entry(root)


def test_a_record_track_takes_only_seeds_fresh_under_the_officials_salt(tmp_path):
    """Claimed seeds reproduce exactly even when they are the best 3 of 100 the entrant tried; seeds from the
    entry's digest alone the entrant computes (and reformats the folder until they are good ones). Either is a
    seed lottery the Welch test reads as independent samples, so a record track's chain takes neither."""
    import json

    from harness.records.chain import build_chain

    def rec(key: str, digest: str, track: str, fresh_seeds: dict | None, losses: list[float]) -> dict:
        runs = [{"seed": i, "status": "ok", "val_loss": x, "val_bpb": x / 1.386, "val_tokens": 1000,
                 "val_bytes": 2000, "tokenizer_sha256": "t" * 64} for i, x in enumerate(losses)]  # fmt: skip
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": digest,
                "entry_dir": f"/e/{key}", "submission": {"name": key, "date": "2026-01-01"}, "track": track,
                "verdict": REPRODUCED, "reproduced": runs, "differences": [], "seeds": [0, 1, 2],
                "fresh_seeds": fresh_seeds}  # fmt: skip

    salted = {"chosen": "from the official's salt and the entry's digest", "salt_sha256": "s" * 64}
    digest_only = {"chosen": "from the entry's digest (an entrant can compute them: pass --seed-salt-file)"}
    losses = [5.0, 5.01, 5.02]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(x) + "\n" for x in (
        rec("claimed", "1", "10min_16mb", {"chosen": "claimed"}, losses),
        rec("digest", "2", "10min_16mb", digest_only, losses),
        rec("old", "3", "10min_16mb", None, losses),  # a record from before fresh_seeds: claimed seeds
        rec("salted", "4", "10min_16mb", salted, losses),
        rec("smoke", "5", "smoke", {"chosen": "claimed"}, losses),
    )))  # fmt: skip
    chain = build_chain(ledger, track=None, rule=None, order={})
    rows = {r["entry_key"]: r for r in chain["rows"]}
    for key, how in (("claimed", "claimed"), ("digest", "from the entry's digest"), ("old", "claimed")):
        assert not rows[key]["accepted"] and rows[key]["seeds_chosen"] == how
        assert rows[key]["reason"].startswith(f"seeds {how}: an entrant can choose those; 10min_16mb takes")
    assert rows["salted"]["accepted"] and rows["salted"]["seeds_chosen"] == "salted"
    assert rows["smoke"]["accepted"]  # a non-record track takes any seeds
    assert chain["format_version"] == 2


@pytest.mark.parametrize(
    ("where", "mode", "why"),
    [
        ("home", 0o644, r"other users may read it \(mode 0644\).*HINT: chmod 600"),
        ("home", 0o640, r"other users may read it \(mode 0640\)"),
        (
            "python",
            0o600,
            r"lies beneath .*, which every sandboxed phase reads.*HINT: keep it in your home folder",
        ),
        # every phase has /dev/shm read-write; without a world (multi-node) it is the host's and the rank the owner
        ("/dev/shm", 0o600, r"lies beneath /dev/shm, which every sandboxed phase reads"),
    ],
    ids=["mode-644", "mode-640", "in-the-python-installation", "in-dev-shm"],
)
def test_a_salt_a_sandboxed_phase_could_read_is_refused(tmp_path, monkeypatch, where, mode, why):
    """A salt in /opt with mode 644 was read by a training rank in its world (and one in /opt with mode 600 by a
    rank without a world, as the file's owner): with it an entrant computes the fresh seeds of every later
    reproduction. A salt others may read, or one beneath a folder every sandbox reads, is refused by name."""
    from harness.records import reproduce as rp

    prefix = tmp_path / "python"  # stands for the Python installation, which every sandbox reads
    prefix.mkdir()
    monkeypatch.setattr("isolation.landlock.python_prefixes", lambda: [str(prefix)])
    if where == "/dev/shm" and not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    shm = Path(tempfile.mkdtemp(dir="/dev/shm")) if where == "/dev/shm" else None
    salt = (shm or (tmp_path if where == "home" else prefix)) / "salt"
    salt.write_text("official secret\n")
    salt.chmod(mode)
    try:
        with pytest.raises(ValueError, match=why):
            rp.read_seed_salt(str(salt))
    finally:
        if shm is not None:
            shutil.rmtree(shm)


def test_a_reproduction_hides_the_other_entries_reproductions_from_its_phases(tmp_path, monkeypatch):
    """`pgolf reproduce` keeps each entry's runs in runs/reproduce/KEY, and its phases hid only that folder (the
    run's parent, the ledger's): from a working folder under /opt, which every sandbox reads, a training rank of
    one entry read another entry's artifact (its trained weights) and ledger there. The folder that holds the
    entries' reproductions is now out of every phase's broad read rules too, down to the train phase."""
    from harness.cli import build_parser
    from harness.records import reproduce as rp
    from harness.run import pipeline
    from tests.unit.scoring.test_eval_support import write_submission

    entry = write_submission(tmp_path / "entries" / "tiny")
    out = tmp_path / "work" / "runs" / "reproduce" / "tiny"
    seen: list[list[str]] = []

    def fake_run(*a, **kw):
        seen.append(kw["private"])
        return {"status": "error", "detail": "not run here", "phases": {}}

    monkeypatch.setattr(pipeline, "run_pipeline", fake_run)
    args = build_parser().parse_args(["reproduce", str(entry), "--seeds", "1", "--out", str(out)])
    rp.cmd_reproduce(args)
    assert seen == [[str(out.parent)]]

    reached: list[list[Path]] = []

    def fake_train(**kw):
        reached.append(kw["private"])
        raise RuntimeError("the train phase is not run here")

    monkeypatch.undo()
    monkeypatch.setattr(pipeline, "run_train_phase", fake_train)
    smoke = ["run.track=smoke", "model.vocab_size=1024"]  # the embedded corpus, off the record tracks
    pipeline.run_pipeline(entry, seed=1, out_dir=out / "seed-1", private=seen[0], overrides=smoke)
    assert len(reached) == 1 and out.parent in reached[0]
