"""pgolf verify holds a result to its track's rules as scoring/tracks.py states them, never as the result
claims them (harness/records/verify.py track_checks). An attacker relabelled a smoke run on the embedded
corpus as a 10min_16mb result, and claimed a 2,048-token eval subset on a track that has none: both were
verified and ranked first before these checks."""

from __future__ import annotations

from harness.config import TRACK_KEYS
from harness.records.verify import track_checks
from scoring.tracks import TRACKS


def tables_of(track: str) -> dict:
    t = TRACKS[track]
    tables: dict = {}
    for key, of_track in TRACK_KEYS.items():
        section, _, name = key.partition(".")
        tables.setdefault(section, {})[name] = of_track(t)
    tables["budget"]["train_s"] = t.train_budget_s
    return tables


def result(
    track: str, *, tables: dict, subset: int | None = None, docs: int | None = None, device: str = "cpu"
) -> dict:
    return {
        "track": track,
        "cap_bytes": 16_000_000,
        "config": tables,
        "phases": {
            "train": {"launch": {"device": device}},
            "score": {"eval_subset_max_tokens": subset, "eval_subset_docs": docs},
        },
    }


def failed(checks) -> list[str]:
    return [c.name for c in checks if not c.ok]


def test_an_honest_record_track_result_passes_its_track(tiny_dataset):
    checks = track_checks(result("10min_16mb", tables=tables_of("10min_16mb")), None, data_given=True)
    assert checks and failed(checks) == []


def test_a_smoke_run_relabelled_as_a_record_fails_its_track(tiny_dataset):
    forged = result("10min_16mb", tables=tables_of("smoke"))
    names = failed(track_checks(forged, tiny_dataset, data_given=False))
    assert "config budget.grace_s is the track's" in names or "config launch.sandbox is the track's" in names
    assert "dataset named by the verifier (--data), not by the result" in names
    assert "official dataset (fineweb_val_50k)" in names  # 4 validation documents, not the official 50,000


def test_a_claimed_eval_subset_fails_on_a_track_without_one():
    forged = result("10min_16mb", tables=tables_of("10min_16mb"), subset=2048)
    assert failed(track_checks(forged, None, data_given=True)) == ["eval subset is the track's (10min_16mb)"]
    # the CPU track's subset is its first 1,700 documents, however many tokens they are on the scored dataset
    cpu = result("cpu_10min_16mb", tables=tables_of("cpu_10min_16mb"), subset=2_101_377, docs=1_700)
    assert failed(track_checks(cpu, None, data_given=True)) == []
    by_tokens = result("cpu_10min_16mb", tables=tables_of("cpu_10min_16mb"), subset=2_097_152)
    assert failed(track_checks(by_tokens, None, data_given=True)) == [
        "eval subset is the track's (cpu_10min_16mb)"
    ]


def test_a_cpu_track_result_trained_on_a_gpu_fails_its_track():
    """The CPU track names its hardware: a result trained on CUDA (its launch's device) is not the track's, where
    the 10min_16mb track leaves the device to the entrant."""
    tables = tables_of("cpu_10min_16mb")
    on_gpu = result("cpu_10min_16mb", tables=tables, docs=1_700, device="cuda")
    assert failed(track_checks(on_gpu, None, data_given=True)) == ["trained on the track's device (cpu)"]
    gpu = result("10min_16mb", tables=tables_of("10min_16mb"), device="cuda")
    assert failed(track_checks(gpu, None, data_given=True)) == []


def test_an_unknown_track_or_cap_fails():
    assert failed(track_checks({"track": "mine"}, None, data_given=True)) == [
        "track is one this harness knows"
    ]
    bigger = {**result("smoke", tables=tables_of("smoke")), "cap_bytes": 32_000_000}
    assert failed(track_checks(bigger, None, data_given=False)) == ["cap is the track's (smoke)"]


def test_the_tables_a_real_record_track_run_records_pass():
    """result.json's `config` is the resolved tables (harness/run/result.py build_result): exactly what
    load_config gives for the run, so an honest cpu-track result passes every track check."""
    from harness.config import load_config
    from tests.conftest import BASELINE

    tables = load_config(BASELINE, "cpu").tables
    honest = result(
        "cpu_10min_16mb", tables=tables, subset=2_101_377, docs=TRACKS["cpu_10min_16mb"].eval_max_docs
    )
    assert failed(track_checks(honest, None, data_given=True)) == []
