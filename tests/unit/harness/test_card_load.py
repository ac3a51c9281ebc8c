"""The card's CPU and load lines (harness/run/result.py): the step mode, other processes' share of the
cores per phase, and a record-track CPU result on a busy machine marked CONTENDED."""

from __future__ import annotations

from harness.run.result import _cpu_lines, _machine_load
from scoring.tracks import get_track

LOAD = {"format": "pg-load", "format_version": 1, "cores": 2, "loadavg_1m_start": 1.0, "loadavg_1m_end": 1.2}


def test_quiet_run_has_load_lines_and_no_mark() -> None:
    train = {"machine_load": {**LOAD, "others_cores": 0.05, "steal_cores": 0.0, "contended": False}}
    load = _machine_load(train, {}, get_track("smoke"))
    assert load is not None and load["contended"] is False and load["record_contended"] is False
    lines = _cpu_lines({"machine_load": load})
    assert lines == ["│ load train    0.05 of 2 cores busy with other processes, load average 1.0 -> 1.2"]


def test_contended_record_track_cpu_run_is_marked() -> None:
    busy = {**LOAD, "others_cores": 1.4, "steal_cores": 0.0, "contended": True}
    train = {"machine_load": busy, "launch": {"device": "cpu"}}
    load = _machine_load(train, {"machine_load": {**busy, "contended": False}}, get_track("cpu_10min_16mb"))
    assert load is not None and load["contended"] is True and load["record_contended"] is True
    cpu = {"flags": ["avx2", "avx512_bf16"], "torch_capability": "AVX512", "native_bf16": True}
    lines = _cpu_lines(
        {
            "machine_load": load,
            "cpu": {**cpu, "mode_chosen": "bfloat16_compile", "mode_chosen_by": "measured"},
        }
    )
    assert lines[0].startswith(
        "│ cpu           avx2,avx512_bf16; torch AVX512, native bfloat16 True; step mode bfloat16_compile"
    )
    assert lines[-1].startswith("│ CONTENDED")
    smoke = _machine_load(train, {}, get_track("smoke"))
    assert smoke is not None and smoke["contended"] is True and smoke["record_contended"] is False
    assert _machine_load({}, {}, get_track("smoke")) is None


def test_the_card_names_the_remedy_for_over_budget_and_contended_runs() -> None:
    from harness.run.result import _remedy_lines

    busy = {"train": {**LOAD, "others_cores": 1.1, "contended": True}, "contended": True}
    over = _remedy_lines({"status": "over_budget", "machine_load": busy, "phases": {}})
    assert len(over) == 1 and over[0].startswith(
        "│ remedy        a step ran past the budget's stop tolerance"
    )
    assert "smaller train.train_batch_tokens" in over[0] and "launch.threads" not in over[0]
    by_hand = {"train": {"threads": {"chosen_by": "launch.threads", "threads_per_rank": 2}}}
    assert "lower launch.threads" in _remedy_lines({"status": "over_budget", "phases": by_hand})[0]
    contended = _remedy_lines({"status": "ok", "machine_load": busy, "phases": by_hand})
    assert contended == [
        "│ remedy        for speeds that compare, rerun when nothing else runs (see `load` above); "
        "launch.threads was set by hand: unset it to let the load choose"
    ]
    quiet = {"train": {**LOAD, "others_cores": 0.01, "contended": False}, "contended": False}
    assert _remedy_lines({"status": "ok", "machine_load": quiet, "phases": {}}) == []
