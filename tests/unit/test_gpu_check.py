"""scripts/gpu_check.py's pure parts: the records' figures against their logs, the 1-GPU expectation, the
measured ms/step from metrics rows, the table. No training run (the script itself is a GPU check)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
assert _spec is not None and _spec.loader is not None
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses look their module up
_spec.loader.exec_module(gc)

# Verbatim lines of the records' logs (openai/parameter-golf, records/track_10min_16mb/<record>/<log>).
NAIVE_LOG = """\
world_size:8 grad_accum_steps:1
step:13750/20000 train_loss:1.9910 train_time:598726ms step_avg:43.54ms
step:13780/20000 val_loss:2.0606 val_bpb:1.2172 train_time:600038ms step_avg:43.54ms
stopping_early: wallclock_cap train_time:600038ms step:13780/20000
"""
INT6_LOG = """\
world_size:8 grad_accum_steps:1
step:6500/9000 train_loss:2.0804 train_time:542303ms step_avg:83.43ms
step:7000/9000 train_loss:1.7889 train_time:584853ms step_avg:83.55ms
step:7179/9000 val_loss:1.9214 val_bpb:1.1379 train_time:600128ms step_avg:83.59ms
stopping_early: wallclock_cap train_time:600128ms step:7179/9000
"""
SP8192_LOG = """\
Hyperparameters:
  world_size: 8
1/20000 train_loss: 9.0111 train_time: 0.0m tok/s: 8348323
2000/20000 train_loss: 3.0686 train_time: 3.4m tok/s: 7710490
layer_loop:enabled step:2018 frac:0.350 encoder:[0, 1, 2, 3, 4, 5, 3, 4] decoder:[5, 3, 4, 5, 6, 7, 8, 9, 10]
4500/20000 train_loss: 2.7622 train_time: 9.7m tok/s: 6095957
4550/20000 val_loss: 2.8119 val_bpb: 1.0886
stopping_early: wallclock_cap train_time: 588047ms step: 4550/20000
"""
LOGS = {"naive_baseline": NAIVE_LOG, "int6_era": INT6_LOG, "sp8192_era": SP8192_LOG}


def test_both_log_formats_parse_to_the_records_figures() -> None:
    naive = gc.parse_record_log(NAIVE_LOG)
    assert naive == {
        "world_size": 8,
        "steps": 13780,
        "train_ms": 600038.0,
        "step_avg_ms": 43.54,
        "tok_s": {},
        "loop_step": None,
    }
    assert gc.parse_record_log(INT6_LOG)["step_avg_ms"] == 83.59  # at the stopping step, not 83.43 or 83.55
    sp = gc.parse_record_log(SP8192_LOG)
    assert (sp["world_size"], sp["steps"], sp["train_ms"], sp["step_avg_ms"]) == (8, 4550, 588047.0, None)
    assert sp["tok_s"] == {1: 8348323, 2000: 7710490, 4500: 6095957}
    assert sp["loop_step"] == 2018


@pytest.mark.parametrize(
    "text",
    ["", "world_size:8\nstep:1/2 step_avg:3ms\n", "stopping_early: wallclock_cap train_time:1ms step:1/2\n"],
)
def test_a_log_without_its_stop_or_world_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a record log"):
        gc.parse_record_log(text)


@pytest.mark.parametrize("name", sorted(LOGS))
def test_the_constants_are_the_logs_figures(name: str) -> None:
    rec, parsed = gc.RECORDS[name], gc.parse_record_log(LOGS[name])
    assert rec.line in LOGS[name]
    assert (rec.gpus, rec.steps, rec.train_ms) == (parsed["world_size"], parsed["steps"], parsed["train_ms"])
    assert rec.step_ms == (parsed["step_avg_ms"] or parsed["train_ms"] / parsed["steps"])
    ph = gc.SP8192_PHASES
    if name == "sp8192_era":
        assert ph.line in LOGS[name]
        assert (ph.loop_step, ph.tokens_per_s) == (parsed["loop_step"], parsed["tok_s"][ph.at_step])


REFERENCE = Path(os.environ.get("PGOLF_REFERENCE", str(REPO.parent / "ref"))) / "records" / "track_10min_16mb"


@pytest.mark.parametrize("name", sorted(gc.RECORDS))
def test_the_constants_match_the_real_logs(name: str) -> None:
    """Against the reference checkout's logs (PGOLF_REFERENCE, default ../ref); skipped without it."""
    rec = gc.RECORDS[name]
    path = REFERENCE / rec.record / rec.log
    if not path.is_file():
        pytest.skip(f"no reference log at {path} (set PGOLF_REFERENCE to a parameter-golf checkout)")
    text = path.read_text()
    parsed = gc.parse_record_log(text)
    assert rec.line in text.splitlines()
    assert (rec.gpus, rec.steps, rec.train_ms) == (parsed["world_size"], parsed["steps"], parsed["train_ms"])
    assert rec.step_ms == (parsed["step_avg_ms"] or parsed["train_ms"] / parsed["steps"])
    if name == "sp8192_era":
        assert gc.SP8192_PHASES.line in text.splitlines()
        assert parsed["loop_step"] == gc.SP8192_PHASES.loop_step


def test_one_gpu_expectation_is_gpus_times_the_records_step() -> None:
    assert gc.RECORDS["naive_baseline"].one_gpu_ms == pytest.approx(348.32, abs=1e-9)
    assert gc.RECORDS["int6_era"].one_gpu_ms == pytest.approx(668.72, abs=1e-9)
    assert gc.RECORDS["sp8192_era"].one_gpu_ms == pytest.approx(8 * 588047 / 4550, abs=1e-9)
    ph, sp = gc.SP8192_PHASES, gc.RECORDS["sp8192_era"]
    assert ph.pre_ms() == pytest.approx(1000 * 786432 / 7710490, abs=1e-12)  # 101.995
    assert ph.loop_ms(sp) == pytest.approx(
        (588047 - 2018 * ph.pre_ms()) / (4550 - 2018), abs=1e-12
    )  # 150.956
    # the two phases add back up to the record's training time
    assert 2018 * ph.pre_ms() + (4550 - 2018) * ph.loop_ms(sp) == pytest.approx(588047.0, abs=1e-6)


def test_steady_step_ms_spans_the_logged_steps() -> None:
    rows = [{"step": s, "elapsed_s": 5.0 + 0.25 * (s - 1)} for s in range(1, 11)]
    ms, n = gc.steady_step_ms(rows, 2)
    assert (round(ms, 9), n) == (250.0, 8)
    assert gc.steady_step_ms(rows, 10) is None  # one row
    assert gc.steady_step_ms([{"step": 3}, {"step": 4}], 2) is None  # no clock readings
    ms, n = gc.steady_step_ms(rows, 2, 4)
    assert (round(ms, 9), n) == (250.0, 2)


def sp_rows() -> list[dict[str, float]]:
    """Steps of 0.8 s, then 1.2 s once the recurrence is on at step index 4 (metrics row 5 is its start)."""
    rows, t = [], 2.0
    for s in range(1, 13):
        rows.append({"step": s, "elapsed_s": t})
        t += 0.8 if s <= 4 else 1.2
    return rows


def test_sp8192_rows_split_at_the_recurrence() -> None:
    whole, pre, loop = gc.record_rows("sp8192_era", "ok", sp_rows(), 4)
    assert (pre.name, pre.steps, round(pre.measured_ms, 9)) == ("  no recurrence", 3, 800.0)
    assert (loop.name, loop.steps, round(loop.measured_ms, 9)) == ("  recurrence", 7, 1200.0)
    assert pre.expected_ms == pytest.approx(8 * gc.SP8192_PHASES.pre_ms())
    ph, sp = gc.SP8192_PHASES, gc.RECORDS["sp8192_era"]
    assert whole.expected_ms == pytest.approx(
        (3 * ph.pre_ms() + 7 * ph.loop_ms(sp)) * 8 / 10
    )  # this run's mix
    assert whole.record_ms == sp.step_ms and whole.steps == 10
    assert whole.ratio == pytest.approx(whole.measured_ms / whole.expected_ms)
    # no recurrence seen (a run too short, or a failed one): the whole run is the pre-loop phase
    _, pre2, loop2 = gc.record_rows("sp8192_era", "failed", sp_rows()[:4], None)
    assert pre2.steps == 2 and loop2.measured_ms is None and loop2.ratio is None


def test_loop_step_of_reads_the_baselines_log_line() -> None:
    log = "step:4 train_loss:9.0\nlayer_loop: on at step 17 (frac 0.351): encoder [0] decoder [1]\n"
    assert gc.loop_step_of(log) == 17
    assert (
        gc.loop_step_of("layer_loop:enabled step:2018") is None
    )  # the record's format is not the baseline's


def test_table_golden() -> None:
    naive = gc.record_rows(
        "naive_baseline", "ok", [{"step": s, "elapsed_s": 0.35 * s} for s in range(1, 6)], None
    )
    rows = [*naive, gc.Row("int6_era", "failed"), gc.Row("naive_baseline (bare)", "ok", steps=9)]
    assert gc.table(rows, True).splitlines()[:5] == [
        "baseline               status     record ms/step  1-GPU expected   measured  ratio  steps  record",
        "-------------------------------------------------------------------------------------------------",
        "naive_baseline         ok               43.54 x8           348.3      350.0  1.005      3  13,780 steps in 600.0 s",
        "int6_era               failed                  -               -          -      -      0",
        "naive_baseline (bare)  ok                      -               -          -      -      9",
    ]
    cpu = gc.table(rows, False).splitlines()
    assert cpu[2].split()[6] == "-"  # no ratio on CPU
    assert "NOT comparable" in cpu[-1]


def test_one_line_keeps_the_first_and_last_lines() -> None:
    err = RuntimeError("the harness run ended over_budget: x\n\nstep:1\ntraceback ...\nValueError: boom\n")
    assert gc.one_line(err) == "the harness run ended over_budget: x ... ValueError: boom"
    assert gc.one_line(RuntimeError("")) == "RuntimeError"
    assert len(gc.one_line(RuntimeError("a" * 1000))) == 400


def test_overrides_and_estimate() -> None:
    # int6_era's late QAT stays on: train.py compiles its graph in the warm-up, so the switch costs no recompile
    assert not any("late_qat" in o for o in gc.overrides_for("int6_era", "cuda"))
    sp = gc.overrides_for("sp8192_era", "cpu")
    assert "train.gptq_calibration_batches=0" in sp and "model.vocab_size=8192" in sp
    assert "model.vocab_size=8192" not in gc.overrides_for("sp8192_era", "cuda")
    assert gc.run_overrides(60.0, 262_144, []) == [
        "budget.train_s=60.0",
        "eval.max_tokens=262144",
        "run.track='smoke'",
    ]
    assert gc.run_overrides(60.0, None, ["run.track='10min_16mb'"]) == [
        "budget.train_s=60.0"
    ]  # the official's
    # naive and int6 60 s each and the bare loop 30 s, with the overheads measured on an H200: over 12 minutes
    assert (
        gc.estimate_s(["naive_baseline", "int6_era"], 60.0, "cuda", 30.0)
        == 10 + 60 + 170 + 60 + 330 + 30 + 75
    )
    assert (
        gc.estimate_s(["int6_era"], 30.0, "cuda") == 10 + 30 + 330
    )  # no bare run without the naive baseline


def test_the_qat_switch_step_is_timed() -> None:
    rows = [{"step": i + 1, "elapsed_s": 0.5 * i + (20.0 if i >= 5 else 0.0)} for i in range(10)]
    line = gc.qat_switch("late_qat: on at step 4 (lr scale 0.149)", rows)
    assert line == "late QAT on at step 4: that step took 20,500.0 ms, the median step 500.0 ms"
    assert gc.qat_switch("no switch", rows) is None


def test_the_overrides_load_on_every_baseline() -> None:
    from harness.config import load_config

    for name in gc.RECORDS:
        for device, preset in (("cuda", "one-gpu"), ("cpu", "tiny")):
            cfg = load_config(REPO / "baselines" / name, preset, gc.overrides_for(name, device))
            assert cfg.train["train_log_every"] == 1 and cfg.section("launch").nproc_per_node == 1
            assert cfg.model["vocab_size"] == (8192 if name == "sp8192_era" else 1024)


def test_an_unknown_baseline_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert gc.main(["--baselines", "naive_baseline,nope"]) == 2
    assert "unknown baseline(s) ['nope']" in capsys.readouterr().err


def _lacking_caps():
    from isolation.sandbox import MachineCaps

    return MachineCaps(landlock_abi=5, root=False, unshare=None)


def test_a_host_missing_layers_is_one_line() -> None:
    missing = ("namespaces", "network_namespace", "signal_scoping", "world")
    note = gc.isolation_note(missing)
    assert len(note.splitlines()) == 1 and "signal_scoping (Landlock ABI >= 6" in note and "smoke" in note
    assert gc.track_overrides_blocked(["launch.allow_missing_layers='signal_scoping'"])
    assert gc.track_overrides_blocked(["run.track='10min_16mb'"]) and not gc.track_overrides_blocked(
        ["eval.seq_len=64"]
    )


@pytest.mark.long
def test_the_check_runs_on_a_host_that_lacks_layers(monkeypatch, capsys, tmp_path) -> None:
    """The CPU track's preset (a record track: sandbox 'required') on a machine without namespaces, worlds or
    signal scoping: refused before (SandboxRefused is a ValueError the check did not catch, then sandbox 'off'
    that a record track refuses); now one line says what is missing, and the baseline trains, packs, scores with
    its probes and is verified on the unranked track, with the layers that hold."""
    import isolation.sandbox as sandbox

    monkeypatch.setattr(sandbox, "probe_machine", _lacking_caps)
    small = [
        "train.cpu_mode='float32'",
        "model.num_layers=1",
        "model.model_dim=64",
        "train.train_seq_len=64",
        "train.train_batch_tokens=1024",
        "eval.seq_len=64",
    ]
    argv = [
        "--device",
        "cpu",
        "--preset",
        "cpu",
        "--baselines",
        "naive_baseline",
        "--train-s",
        "4",
        "--bare-s",
        "4",  # its first step comes about 1.2 s in (2.5 s and more on a loaded machine): steps after it to time
    ]
    # --no-verify: verify's re-score is tested in tests/unit/harness/test_verify.py; the check's verify was run
    # by hand (a CPU check verified both baselines) and on the H200 (docs/OFFICIALS.md)
    argv += ["--eval-tokens", "2048", "--no-verify", "--json-out", str(tmp_path / "check.json")]
    rc = gc.main([*argv, "--workdir", str(tmp_path), *(a for s in small for a in ("--set", s))])
    out = capsys.readouterr().out
    assert "isolation: this host lacks namespaces" in out and "world (" in out, out
    assert "FAILED" not in out, out
    assert rc == 0, out
    assert re.search(r"^naive_baseline +ok ", out, re.M), (
        out
    )  # it trained (steps: the machine's load decides)
    # the whole pipeline: scored (2,048 tokens), its probes passed
    assert re.search(r"^naive_baseline +ok +\d\.\d{4} +2048 .* passed ", out, re.M), out
    assert "sandbox: landlock True, namespaces []" in out  # sandboxed with what holds
    assert re.search(r"naive_baseline: crossing: pageable/pageable [\d.]+ GB/s [\d,]+ k tok/s", out), out
    assert (
        "Landlock ABI 5 < 6: training can signal processes outside the sandbox" in out
    )  # and recorded as such
    assert "harness / bare steady ms/step" in out
    got = json.loads((tmp_path / "check.json").read_text())
    assert (
        got["format"] == "pg-gpu-check"
        and got["runs"][0]["probes"] == "passed"
        and got["runs"][0]["verify"] == "-"
    )
    assert json.loads((tmp_path / "naive_baseline-harness" / "result.json").read_text())["track"] == "smoke"


def test_the_group_line_sets_the_group_beside_one_worker(tmp_path) -> None:
    """The group part's line (a node's figure the 8-GPU estimate lacks): the difference from one worker's score,
    the adaptation's ms per chunk both ways, the scorer's path for each worker's buffer; its failure one line."""
    one = {
        "val_bpb": 1.25,
        "adaptation": {"chunks": 4, "adapt_time_s": 8.0},
        "eval_clock": {"scoring_time_s": 40.0},
    }
    group = {
        "val_bpb": 1.25 + 3e-9,
        "scoring_workers": 8,
        "val_tokens": 1_000_000,
        "probes": {"passed": True},
        "adaptation": {"chunks": 4, "adapt_time_s": 1.2, "group": {"network": "a loopback-only namespace"}},
        "eval_clock": {"scoring_time_s": 6.0},
        "crossing": {
            "scorer": "pinned",
            "worker": "pinned",
            "logits_bytes": 12e9,
            "scorer_by_worker": ["pinned"] * 7 + ["pageable"],
        },
    }
    line = gc.group_line(one, group)
    assert line.startswith("8 workers (a group: a loopback-only namespace): val_bpb 1.250000"), line
    assert "difference +3.00e-09" in line and "probes passed" in line
    assert (
        "adaptation ms/chunk 300 (one worker 2,000)" in line and "scoring 6.0 s (one worker 40.0 s)" in line
    )
    assert "pinned/pinned 2.00 GB/s 167 k tok/s" in line and line.endswith(
        "pinned,pinned,pinned,pinned,pinned,pinned,pinned,pageable"
    )
    assert gc.group_workers_default("cpu") == 0
    out: dict[str, str] = {}
    gc.group_part("x", tmp_path, 2, None, 0.0, 1e12, out)  # no run there
    assert out["x"].startswith("FAILED: ") and len(out["x"].splitlines()) == 1
    gc.group_part("y", tmp_path, 2, 30.0, 0.0, 100.0, out)  # 2 x 30 + 120 s past the cut
    assert out["y"].startswith("SKIPPED: its estimate (180 s)")


@pytest.mark.long  # about a minute on 2 cores: a tiny int6_era run, then its artifact re-scored by a group of two
def test_the_group_part_rescores_an_adapting_run_with_a_group(capsys, tmp_path) -> None:
    argv = ["--device", "cpu", "--baselines", "int6_era", "--train-s", "4", "--eval-tokens", "2048"]
    rc = gc.main([*argv, "--no-verify", "--group-workers", "2", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    m = re.search(
        r"int6_era: group: 2 workers \(a group: .*\): .* difference ([-+][\d.e-]+)\); probes passed", out
    )
    assert m and abs(float(m.group(1))) < 1e-6, out


def test_sp8192_trains_its_train_s_beside_the_reserves_its_train_py_keeps(monkeypatch, tmp_path) -> None:
    """sp8192_era's train.py stops encode_reserve_s (70 s) before its budget (and gptq_reserve_s more with GPTQ on):
    at the check's default 60 s its training time was negative, it trained no step, and its encode (about a minute
    of brotli-11, on the clock) ended past train_s + the stop tolerance (65 s): over_budget, on every GPU. The
    check's budget for it is --train-s plus what its train.py keeps off training, so it trains --train-s."""
    from harness.config import load_config

    seen: dict[str, object] = {}

    def fake_run(st, bname, label, cfg, base, wd, need_s):
        seen["cfg"], seen["need_s"] = cfg, need_s
        return gc.Outcome(label, "ok"), wd

    monkeypatch.setattr(gc, "harness_run", fake_run)
    args = gc.argparse.Namespace(
        train_s=60.0, bare_s=30.0, device="cuda", set=[], max_total_s=1e9, no_verify=True
    )
    st = gc.CheckState(args, gc.time.time(), "one-gpu", 262_144, 0, None, tmp_path, {8192: tmp_path})
    gc.run_part(st, "sp8192_era", "harness")
    cfg = seen["cfg"]
    t = cfg.train
    reserve = float(t["encode_reserve_s"]) + (
        float(t["gptq_reserve_s"]) if int(t["gptq_calibration_batches"]) > 0 else 0.0
    )
    assert float(t["encode_reserve_s"]) == 70.0  # the preset's, unchanged: the encode is the record's codec
    assert cfg.section("budget").train_s - reserve == pytest.approx(60.0), cfg.section("budget").train_s
    assert seen["need_s"] >= 60.0 + reserve
    # the naive baseline keeps nothing back: its budget stays --train-s
    plain = load_config(
        REPO / "baselines" / "naive_baseline", "one-gpu", gc.overrides_for("naive_baseline", "cuda")
    )
    assert gc.reserved_s(plain.train) == 0.0
    assert gc.estimate_s(["sp8192_era"], 60.0, "cuda", reserves={"sp8192_era": 70.0}) == 10 + 60 + 70 + 360


def _fake_python(bin_dir: Path, pip_rc: int) -> None:
    """A `python3` on PATH for scripts/gpu_session.sh: `-m pip` exits with `pip_rc`, `-c` prints a version line,
    and scripts/gpu_check.py records that it ran (its arguments in ran.txt beside it) and exits 0."""
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        f'case "$1 $2" in\n  "-m pip") exit {pip_rc} ;;\n  -c*) echo "python 3.12 torch 2.11.0+cu130"; exit 0 ;;\nesac\n'
        f'echo "$@" > {bin_dir}/ran.txt\necho "gpu_check ran"\nexit 0\n'
    )
    fake.chmod(0o755)


@pytest.mark.parametrize("pip_rc", [0, 1])
def test_the_session_script_runs_the_check_whatever_its_setup_did(tmp_path: Path, pip_rc: int) -> None:
    """`gpu_session.sh run` on the lent machine: the wheels' or the editable install's failure (an image whose pip
    refuses, no setuptools to build with offline) is a line of setup.log, and the check still runs (it imports the
    project from PYTHONPATH, not from the install); it used to end the script before the check, under set -e and
    pipefail, so a lent GPU's minutes gave nothing."""
    _fake_python(tmp_path / "bin", pip_rc)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_session.sh"), "run", str(out), "--train-s", "5"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert (tmp_path / "bin" / "ran.txt").is_file(), r.stdout + r.stderr
    assert "--train-s 5" in (tmp_path / "bin" / "ran.txt").read_text()
    assert r.returncode == 0 and "gpu_check exit 0" in r.stdout, r.stdout + r.stderr
    assert (out / "setup.log").is_file() and (out / "gpu_check.log").read_text().strip() == "gpu_check ran"
