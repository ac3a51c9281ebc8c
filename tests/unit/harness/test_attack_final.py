"""Attacks on today's fixes by an entrant who controls only their own folder (config, code, artifact): each test
is a choice the entrant makes and what it must not win."""

from __future__ import annotations

from typing import Any

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
    import pytest

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

    import pytest

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
