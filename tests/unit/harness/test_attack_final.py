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


@pytest.mark.xfail(
    strict=True,
    reason="a policy call: no check that fresh seeds gave different runs (an honest entry may fix its seed too)",
)
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
