"""Attacks on today's fixes by an entrant who controls only their own folder (config, code, artifact): each test
is a choice the entrant makes and what it must not win."""

from __future__ import annotations

from typing import Any

import pytest

from scoring.score.record import unscored_targets_problem


def _score(mode: str, scored: int, seq_len: int, n: int = 2_097_153) -> dict[str, Any]:
    return {"val_tokens_available": n, "eval_subset_max_tokens": None, "val_tokens": scored,
            "eval_seq_len": seq_len, "eval_mode": mode, "metric_version": 1}  # fmt: skip


def test_a_long_seq_len_does_not_hide_documents_mode_dropped_ends():
    """seq_len is the entrant's, and in documents mode a window never crosses a BOS, so a seq_len past the longest
    document costs nothing. A result scored before the documents fix, with seq_len above its count of documents
    (2,000 on the CPU track's 2M tokens, seq_len 4,096), left out every document's end inside standard mode's
    tolerance of one partial window: ranked and verified."""
    n, docs = 2_097_153, 2_000
    for seq_len in (4_096, 1 << 20):
        why = unscored_targets_problem(_score("documents", n - 1 - docs, seq_len, n))
        assert why is not None and "2,000 left out" in why
        assert unscored_targets_problem(_score("sliding", n - 2, seq_len, n)) is not None
        assert unscored_targets_problem(_score("documents", n - 1, seq_len, n)) is None  # the control


def test_a_score_that_counted_targets_twice_is_named():
    """More targets scored than the tokens hold: some were scored twice (the planner's promise, each once, broken)."""
    n = 1_000_001
    assert unscored_targets_problem(_score("sliding", n - 1 + 512, 1024, n)) is not None
    assert unscored_targets_problem(_score("standard", n - 1 + 1, 1024, n)) is not None
    assert unscored_targets_problem(_score("standard", ((n - 1) // 1024) * 1024, 1024, n)) is None


def test_a_config_nested_past_the_parsers_depth_is_a_config_error(tmp_path):
    """config.toml is the entrant's: tomllib recurses per nested array, so 5,000 `[` raised RecursionError out of
    load_config (pgolf run, preflight, the reproduce queue's run), never the ConfigError of a malformed file."""
    from harness.config import ConfigError, load_config

    (tmp_path / "config.toml").write_text("[run]\ntrack = " + "[" * 5_000 + "]" * 5_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(tmp_path)


def test_an_artifact_header_nested_just_under_the_parsers_limit_is_refused(tmp_path):
    """The submission's codec writes the artifact header. Nested past the JSON parser's depth it is refused; nested
    just under it (a codec `version` of ~990 nested lists) it was read, and then no trusted process could write a
    record holding the codec (the scorer's score record, the run's ledger line): RecursionError, a harness failure."""
    import hashlib
    import json

    from scoring.artifact.format import _PREFIX, ARTIFACT_MAGIC, ARTIFACT_VERSION, read_artifact
    from scoring.errors import ArtifactError

    def header(version: str) -> bytes:
        h = {"format": "pg-artifact", "format_version": 1, "codec": {"name": "int8_zlib", "version": "V"},
             "model_config": {"blocks": [{"d": 64}]}, "code_files": {"model.py": "0" * 64}, "bytes_code": 1,
             "tensors": {}, "payload_bytes": 0, "payload_sha256": hashlib.sha256(b"").hexdigest()}  # fmt: skip
        b = json.dumps(h).replace('"V"', version).encode()
        return _PREFIX.pack(ARTIFACT_MAGIC, ARTIFACT_VERSION, len(b)) + b

    path = tmp_path / "a.pgolf"
    path.write_bytes(header("1"))
    assert read_artifact(path).codec_name == "int8_zlib"  # the control
    for n in (40, 900):
        path.write_bytes(header("[" * n + "]" * n))
        with pytest.raises(ArtifactError, match="nests past"):
            read_artifact(path)


def test_fresh_seeds_that_changed_nothing_do_not_reproduce_a_claim():
    """Fresh seeds under the official's salt are out of the entrant's reach, but the seed only reaches the run as
    rank.py's torch.manual_seed(seed) (the data order is fixed): train.py that calls torch.manual_seed(1337), the
    best of a hundred seeds tried at home, makes every fresh seed the same run. The spread is zero, the claim sits
    on the floor, and the fresh seeds tested nothing; the verdict says reproduced."""
    import math
    from pathlib import Path

    from harness.records.reproduce import REPRODUCED, Claim, Entry, Tolerance, fresh_seeds_record, verdict_of

    code = {"model.py": "a" * 64, "train.py": "b" * 64}
    bpb = 4.0 * 1000 / (2000 * math.log(2.0))
    claims = tuple(
        Claim(source=f"r/seed-{s}/result.json", seed=s, preset=None, track="smoke", val_bpb=bpb, val_loss=4.0,
              val_tokens=1000, val_bytes=2000, steps=20, train_time_s=3.0, bytes_total=10_000, code_files=code)
        for s in (1, 2, 3)
    )  # fmt: skip
    meta = {"name": "e", "author": "a", "github_id": "g", "date": "2026-01-01", "track": "smoke"}
    entry = Entry(root=Path("/x/e"), meta=meta, claims=claims, claimed_mean_bpb=None, preset=None,
                  digest="d" * 64, code_files=code)  # fmt: skip
    runs = [
        {"seed": s, "status": "ok", "val_loss": 4.0, "val_bpb": bpb, "val_tokens": 1000, "val_bytes": 2000,
         "steps": 20, "train_time_s": 4.0, "bytes_total": 10_050, "track": "smoke"}
        for s in entry.seeds(3, "official secret")
    ]  # fmt: skip
    rec = verdict_of(entry, runs, Tolerance(), fresh_seeds_record(entry, 3, "official secret"))
    assert rec["verdict"] != REPRODUCED
    a, b, c = entry.seeds(3, "official secret")
    assert [d["name"] for d in rec["differences"]] == [f"seeds {a} and {b} gave different runs",
                                                       f"seeds {a} and {c} gave different runs"]  # fmt: skip
    why = rec["differences"][0]["actual"]
    assert why.startswith(
        "the same val_loss and val_bpb to the last bit: the seed did not reach the run (train.py"
    )
    # the control: the same runs one ulp apart in each score are three runs, and reproduce the claim
    for i, r in enumerate(runs):
        r["val_loss"], r["val_bpb"] = math.nextafter(4.0, 5.0) if i else 4.0, bpb + i * 1e-15
    assert verdict_of(entry, runs, Tolerance(), None)["verdict"] == REPRODUCED


def _seed_runs(losses: dict[int, float], **kw: Any) -> list[dict[str, Any]]:
    import math

    return [
        {"seed": s, "status": "ok", "val_loss": x, "val_bpb": x * 1000 / (2000 * math.log(2.0)), "val_tokens": 1000,
         "val_bytes": 2000, "steps": 20, "train_time_s": 4.0, "bytes_total": 10_050, "track": "smoke",
         "artifact_sha256": kw.get("sha", {}).get(s, f"{s:064x}")}
        for s, x in losses.items()
    ]  # fmt: skip


def test_a_seed_ignored_behind_noise_in_an_unused_weight_is_still_the_same_run():
    """The next step of a seed-ignoring entry: seed-dependent noise in a buffer the forward never reads gives every
    seed an artifact of its own (other sha256) and the same score to the last bit. The score alone names it; an
    artifact shared by two seeds does too, whatever the score says; two runs that differ in both are two runs."""
    from harness.records.reproduce import same_runs

    assert same_runs(_seed_runs({11: 4.0, 12: 4.0, 13: 4.0001})) == [(0, 1, "val_loss and val_bpb")]
    same_sha = _seed_runs({11: 4.0, 12: 4.0001}, sha={11: "a" * 64, 12: "a" * 64})
    assert same_runs(same_sha) == [(0, 1, "artifact")]
    assert same_runs(_seed_runs({11: 4.0, 12: 4.0001})) == []
    # the same seed twice is one run counted twice, named as such
    assert same_runs(_seed_runs({11: 4.0}) * 2) == [(0, 1, "seed")]
    # a failed run has no outcome to share
    failed = _seed_runs({11: 4.0, 12: 4.0})
    failed[1]["status"] = "error"
    assert same_runs(failed) == []


def test_the_chain_refuses_a_reproduction_whose_seeds_gave_one_run(tmp_path):
    """A pg-reproduction decided before the check (or by hand) with fresh salted seeds that changed nothing: the
    chain reads the runs itself, and a seed lottery won at home sets no frontier."""
    import json

    from harness.records.chain import build_chain

    def rec(key: str, date: str, losses: dict[int, float]) -> dict[str, Any]:
        runs = [{**r, "tokenizer_sha256": "t" * 64} for r in _seed_runs(losses)]
        return {"format": "pg-reproduction", "format_version": 1, "entry_key": key, "entry_digest": key * 64,
                "entry_dir": f"/e/{key}", "submission": {"name": key, "date": date}, "track": "smoke",
                "verdict": "reproduced", "reproduced": runs, "differences": [], "seeds": list(losses),
                "fresh_seeds": {"chosen": "salted", "salt_sha256": "5" * 64}}  # fmt: skip

    ledger = tmp_path / "ledger.jsonl"
    honest = rec("a", "2026-01-01", {1: 5.0, 2: 5.01, 3: 5.02})
    lucky = rec("b", "2026-01-02", {4: 4.0, 5: 4.0, 6: 4.0})
    ledger.write_text(json.dumps(honest) + "\n" + json.dumps(lucky) + "\n")
    rows = build_chain(ledger, track=None, rule=None, order={})["rows"]
    assert [r["accepted"] for r in rows] == [True, False]
    assert rows[1]["reason"] == (
        "seeds 4 and 5 gave one run (the same val_loss and val_bpb to the last bit): the seed did not reach the run, "
        "so its seeds are not independent samples"
    )


def test_fresh_seeds_do_not_hand_a_lookup_of_lucky_seeds_one_each():
    """The next step of the seed lottery once one run is refused: train.py seeds torch with LUCKY[ctx.seed % 3],
    its best three seeds of a hundred. Fresh seeds were base, base + 1, base + 2: every residue mod 3 exactly once,
    so every reproduction drew the three lucky runs, three different runs, and same_runs saw nothing. Drawn each on
    its own from the salt, two of three fresh seeds share a residue (one run twice, refused) 7 times in 9."""
    from pathlib import Path

    from harness.records.reproduce import Entry

    code = {"train.py": "b" * 64}
    distinct = 0
    for i in range(900):
        entry = Entry(root=Path("/x/e"), meta={"track": "smoke"}, claims=(), claimed_mean_bpb=1.0, preset=None,
                      digest=f"{i:064x}", code_files=code)  # fmt: skip
        seeds = entry.seeds(3, "official secret")
        assert len(set(seeds)) == 3 and all(0 <= s < 2**31 for s in seeds)
        distinct += len({s % 3 for s in seeds}) == 3
    assert 150 <= distinct <= 250  # 2/9 of 900 is 200
