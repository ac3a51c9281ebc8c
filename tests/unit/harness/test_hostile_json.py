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


def test_the_scoring_side_and_the_tools_read_nested_json_as_malformed_never_a_crash(tmp_path):
    """The same nesting on the scoring side and in the tools: a model worker's message to the scorer (a crash there
    was `a harness failure`, not the worker's verdict), a rank's metrics line, a monitor line in a sandbox's log,
    the confined generation's result, a verification job's report, a queued entry's submission.json."""
    import socket

    from harness.commands.generate import GenerateFailure, parse_result
    from harness.records.executors import accept_report
    from harness.records.queue import raw_meta
    from harness.run.tracking import parse_metrics_line
    from isolation.monitor import MONITOR_PREFIX, parse_attempts
    from scoring.worker.wire import ProtocolError, recv

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        a.sendall(NESTED)
        with pytest.raises(ProtocolError, match="not JSON"):
            recv(b, timeout_s=5)
    assert parse_metrics_line(NESTED) is None
    assert parse_attempts(MONITOR_PREFIX + NESTED.decode()) == []
    with pytest.raises(GenerateFailure, match="no valid result"):
        parse_result(NESTED, vocab_size=4, max_tokens=4, speculative=False)
    assert accept_report(NESTED.decode(), {}, None)[0].startswith("the job's record is not JSON")  # type: ignore[arg-type]
    (tmp_path / "submission.json").write_bytes(NESTED)
    assert raw_meta(tmp_path) == {}
