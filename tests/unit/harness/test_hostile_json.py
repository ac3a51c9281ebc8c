"""JSON written by submitted code and read by the trusted side: nesting deep enough to raise RecursionError.

json.loads raises RecursionError (a RuntimeError, not a ValueError) for 60,000 brackets. Every reader of a
record a submission's process writes turns it into the one error it names: a rank's wire message (refused),
its train.json (the run's error, not the harness's), a pack record read with data.io.read_json.
"""

from __future__ import annotations

import pytest

from data.io import read_json
from harness.run.train_phase import read_rank_record
from harness.train.wire import decode

NESTED = b"[" * 60_000


def test_a_nested_wire_message_is_not_a_wire_message():
    with pytest.raises(ValueError, match="nested too deeply"):
        decode(NESTED)


def test_a_nested_train_json_is_the_runs_error_not_the_harness_s(tmp_path):
    (tmp_path / "train.json").write_bytes(b'{"steps": ' + NESTED)
    with pytest.raises(ValueError, match="train.json is not valid JSON"):
        read_rank_record(tmp_path / "train.json")


def test_a_nested_record_read_with_read_json_is_a_value_error(tmp_path):
    (tmp_path / "pack.json").write_bytes(NESTED)
    with pytest.raises(ValueError, match="pack.json .* is not valid JSON"):
        read_json(tmp_path / "pack.json", what="pack.json")
