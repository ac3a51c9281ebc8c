"""ctx.cpu (harness/train/cpu.py), the machine-load record (harness/run/load.py) and `pgolf tune`'s
decisions (harness/commands/tune.py): bfloat16 only where native, the fastest step mode by a (mocked) clock,
settings kept only beyond the noise, a preset appended without touching the rest of the file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from harness.api import ClockReading, CpuAsGiven, DistInfo, TrainContext, WarmupReport
from harness.commands.tune import Row, Setting, helps, measure_rows, plan_settings, preset_text
from harness.run.load import CONTENDED_CORES, LoadReading, _proc_stat, describe, load_between
from harness.train.cpu import (
    CpuFacts,
    CpuTuner,
    StepTrial,
    compile_of,
    modes_for,
    native_bf16,
    parse_cpuinfo,
    read_facts,
)
from scoring.errors import SubmissionError
from tests.conftest import REPO

CPUINFO_BF16 = (
    "processor\t: 0\nmodel name\t: Fake EPYC 9999\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni avx512_bf16 sha_ni\n\n"
    "processor\t: 1\nmodel name\t: Fake EPYC 9999\nflags\t\t: fpu\n"
)
ROW = re.compile(r"^(\S.*?)\s+([\d,]+)\s+(?:[\d.]+%|-)\s+(?:[-+][\d.]+%|-)\s+\d+\s+\S")
CPUINFO_2016 = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2680 v4\nflags\t\t: fpu sse2 avx avx2 fma\n"
)


def facts(flags: tuple[str, ...], cap: str, cores: int = 2) -> CpuFacts:
    return CpuFacts("x", flags, cap, cores, cores, None, native_bf16(flags, cap))


def test_cpuinfo_is_parsed_from_the_first_processor() -> None:
    assert parse_cpuinfo(CPUINFO_BF16) == (
        "Fake EPYC 9999",
        ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"),
    )
    assert parse_cpuinfo(CPUINFO_2016) == ("Intel(R) Xeon(R) CPU E5-2680 v4", ("avx2", "fma"))
    assert parse_cpuinfo("") == ("unknown", ())


@pytest.mark.parametrize(
    ("flags", "cap", "native"),
    [
        (("avx512_bf16",), "AVX512", True),
        (("amx_bf16",), "AVX512", True),
        (("avx512_bf16",), "AVX2", False),  # ATEN_CPU_CAPABILITY=avx2 on a bf16 CPU: torch's kernels lack it
        (("avx512_bf16",), "DEFAULT", False),
        (("avx512f", "avx2"), "AVX512", False),  # AVX-512 without BF16 (a Skylake server)
        ((), "AVX2", False),
    ],
)
def test_native_bf16_needs_the_flag_and_the_capability(
    flags: tuple[str, ...], cap: str, native: bool
) -> None:
    assert native_bf16(flags, cap) is native
    assert ("bfloat16" in modes_for("auto", facts(flags, cap))) is native


def test_modes_auto_fixed_and_refused() -> None:
    assert modes_for("auto", facts(("avx512_bf16",), "AVX512")) == ["float32", "bfloat16"]
    assert modes_for("auto", facts(("avx2",), "AVX2")) == ["float32"]
    assert modes_for("bfloat16_compile", facts((), "DEFAULT")) == ["bfloat16_compile"]  # fixed: as given
    assert compile_of("bfloat16") == "bfloat16_compile" and compile_of("float32_compile") == "float32_compile"
    with pytest.raises(ValueError, match="not one of"):
        modes_for("fp8", facts((), "AVX2"))


def _facts_in_subprocess(capability: str | None) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    code = (
        "import json,sys; from harness.train.cpu import read_facts, modes_for;"
        f"f = read_facts(cpuinfo={CPUINFO_BF16!r});"
        "print(json.dumps({**f.to_json(), 'auto': modes_for('auto', f)}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return json.loads(r.stdout)


def test_an_older_instruction_set_forced_takes_bfloat16_out() -> None:
    """On a CPU whose flags say bfloat16 (here given as text), forcing torch down to AVX2 or to the
    default kernels (a 2016 Xeon's) removes bfloat16 from the modes; torch's own capability decides."""
    for forced in ("avx2", "default"):
        f = _facts_in_subprocess(forced)
        assert f["torch_capability"] == forced.upper() and f["native_bf16"] is False
        assert f["auto"] == ["float32"]
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        f = _facts_in_subprocess(None)  # the same flags at this machine's full capability: bfloat16 is tried
        assert f["native_bf16"] is True and f["auto"] == ["float32", "bfloat16"]


def test_read_facts_reads_this_machine() -> None:
    f = read_facts()
    assert f.cores >= 1 and f.threads == torch.get_num_threads()
    assert f.torch_capability == torch.backends.cpu.get_cpu_capability()
    assert f.native_bf16 == native_bf16(f.flags, f.torch_capability)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_trial_times_each_candidate_then_its_compiled_form_and_picks_the_fastest() -> None:
    clock = FakeClock()
    cost = {"float32": 1.0, "bfloat16": 0.5, "bfloat16_compile": 0.25}
    calls: list[str] = []

    def step_of(name: str):
        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            calls.append(name)
            clock.t += cost[name] * (10 if calls.count(name) == 1 else 1)  # the first call compiles/warms

        return step

    seen: list[str] = []
    trial = StepTrial(
        {"float32": step_of("float32"), "bfloat16": step_of("bfloat16")},
        repeats=2,
        discard=1,
        clock=clock,
        then=lambda best: (seen.append(best), (compile_of(best), step_of(compile_of(best))))[1],
    )
    assert trial.steps == 9
    x = torch.zeros(1, 4, dtype=torch.long)
    for _ in range(trial.steps):
        trial.step(x, x)
    assert seen == ["bfloat16"]  # the follow-up compiled the faster dtype
    assert calls == ["float32"] * 3 + ["bfloat16"] * 3 + ["bfloat16_compile"] * 3
    assert trial.times_s == {"float32": [1.0, 1.0], "bfloat16": [0.5, 0.5], "bfloat16_compile": [0.25, 0.25]}
    assert trial.best() == "bfloat16_compile"
    with pytest.raises(RuntimeError, match="9 steps"):
        trial.step(x, x)


def test_trial_records_its_choice_through_the_tuner_and_refuses_before_running() -> None:
    tuner = CpuTuner(facts(("avx2",), "AVX2"))
    trial = tuner.trial({"float32": lambda x, y: None}, repeats=1)
    with pytest.raises(RuntimeError, match="has not run"):
        trial.best()
    x = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(trial.steps):
        trial.step(x, x)
    assert trial.best() == "float32"
    report = tuner.report()
    assert report["format"] == "pg-cpu" and report["chosen"] == "float32" and report["native_bf16"] is False
    assert list(report["trial_step_s"]) == ["float32"] and len(report["trial_step_s"]["float32"]) == 1
    json.dumps(report)


# ---- ctx.cpu.choose: the one call a submission makes ----

WARG = dict(modules=[], optimizers=(), batch_tokens=8, seq_len=4, vocab_size=16)
BF16 = facts(("avx512_bf16",), "AVX512")
NO_BF16 = facts(("avx2",), "AVX2")


class WarmClock:
    """ctx.clock's warmup: runs the step function `steps` times on (x, y), as the harness's does."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def warmup(self, step, *, steps: int, **kwargs: object) -> WarmupReport:
        self.calls.append({"steps": steps, **kwargs})
        x = torch.zeros(2, 4, dtype=torch.long)
        for _ in range(steps):
            step(x, x)
        return WarmupReport(steps, 0.0, True)


def stepper(cost: dict[str, float], timer: FakeClock, ran: list[str]):
    """make_step for choose(): mode -> a step that costs cost[mode] (ten times that on its first call)."""

    def make_step(mode: str):
        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            ran.append(mode)
            timer.t += cost[mode] * (10 if ran.count(mode) == 1 else 1)

        return step

    return make_step


def tuner(f: CpuFacts, **kwargs: object) -> tuple[CpuTuner, WarmClock, FakeClock, list[str]]:
    clock, timer, lines = WarmClock(), FakeClock(), []
    t = CpuTuner(f, clock=clock, timer=timer, log=lines.append, **kwargs)  # type: ignore[arg-type]
    return t, clock, timer, lines


def test_choose_auto_times_the_native_dtypes_then_compiles_the_faster_and_keeps_the_fastest() -> None:
    t, clock, timer, lines = tuner(BF16)
    ran: list[str] = []
    cost = {"float32": 1.0, "bfloat16": 0.5, "bfloat16_compile": 0.25, "float32_compile": 9.0}
    assert t.choose("auto", stepper(cost, timer, ran), repeats=2, **WARG) == "bfloat16_compile"
    assert ran == ["float32"] * 3 + ["bfloat16"] * 3 + ["bfloat16_compile"] * 3  # float32 never compiled
    assert clock.calls == [{"steps": 9, **WARG}]  # one warm-up, the submission's arguments as given
    r = t.report()
    assert r["chosen"] == "bfloat16_compile" and r["chosen_by"] == "measured at start-up (off the clock)"
    assert r["trial_step_s"] == {
        "float32": [1.0, 1.0],
        "bfloat16": [0.5, 0.5],
        "bfloat16_compile": [0.25, 0.25],
    }
    assert lines[0] == "cpu trial (median step s): float32:1.000 bfloat16:0.500 bfloat16_compile:0.250"
    assert lines[-1].endswith("native_bf16 True; mode bfloat16_compile")


def test_choose_auto_keeps_eager_when_compiling_is_slower_and_skips_emulated_bfloat16() -> None:
    t, clock, timer, _ = tuner(NO_BF16)
    ran: list[str] = []
    assert (
        t.choose("auto", stepper({"float32": 1.0, "float32_compile": 2.0}, timer, ran), repeats=1, **WARG)
        == "float32"
    )
    assert ran == ["float32"] * 2 + ["float32_compile"] * 2 and clock.calls[0]["steps"] == 4


def test_choose_without_compiled_modes_times_eager_dtypes_only() -> None:
    t, clock, timer, _ = tuner(BF16)
    ran: list[str] = []
    mode = t.choose("auto", stepper({"float32": 1.0, "bfloat16": 2.0}, timer, ran), compiled=False, **WARG)
    assert mode == "float32" and ran == ["float32"] * 3 + ["bfloat16"] * 3 and len(clock.calls) == 1
    # a compiled mode asked of a step that does not compile runs eager (its dtype kept), with no warm-up
    t, clock, timer, _ = tuner(BF16)
    assert t.choose("bfloat16_compile", stepper({}, timer, ran), compiled=False, **WARG) == "bfloat16"
    assert clock.calls == [] and t.report()["chosen_by"] == "fixed by the preset (train.cpu_mode)"
    # auto where only float32 is native: one mode, nothing to time
    t, clock, timer, _ = tuner(NO_BF16)
    assert (
        t.choose("auto", stepper({}, timer, ran), compiled=False, **WARG) == "float32" and clock.calls == []
    )
    assert t.report()["chosen_by"] == "the only mode auto offers here"


def test_choose_a_fixed_mode_runs_no_trial_unless_it_must_compile_off_the_clock() -> None:
    t, clock, timer, _ = tuner(BF16)
    ran: list[str] = []
    assert t.choose("float32", stepper({}, timer, ran), **WARG) == "float32"
    assert ran == [] and clock.calls == [] and "trial_step_s" not in t.report()
    t, clock, timer, _ = tuner(NO_BF16)
    assert (
        t.choose("float32_compile", stepper({"float32_compile": 1.0}, timer, ran), repeats=1, **WARG)
        == "float32_compile"
    )
    assert (
        ran == ["float32_compile"] * 2 and clock.calls[0]["steps"] == 2
    )  # compiled in the warm-up, not on the clock


def test_choose_on_several_ranks_or_a_gpu_takes_the_first_mode_without_a_trial() -> None:
    ran: list[str] = []
    t, clock, timer, _ = tuner(BF16, world_size=2)
    assert t.choose("auto", stepper({}, timer, ran), **WARG) == "float32" and clock.calls == [] and ran == []
    assert t.report()["note"] == "several CPU ranks: no trial, the first mode"
    t, clock, timer, _ = tuner(BF16, gpu=True)
    assert t.choose("bfloat16", stepper({}, timer, ran), **WARG) == "bfloat16" and clock.calls == []
    assert t.report()["chosen_by"] == "a GPU run: as given, no trial"


def test_choose_refuses_an_unknown_mode_by_name() -> None:
    t, *_ = tuner(BF16)
    with pytest.raises(ValueError, match=r"cpu mode 'fp8' is not one of \['auto', 'float32'"):
        t.choose("fp8", lambda mode: lambda x, y: None, **WARG)
    with pytest.raises(ValueError, match="'fp8'"):
        CpuAsGiven().choose("fp8", lambda mode: lambda x, y: None)


def test_a_context_built_by_hand_has_a_cpu_that_answers_the_mode_as_given() -> None:
    ctx = hand_built_context({})
    assert isinstance(ctx.cpu, CpuAsGiven) and ctx.cpu.facts == {}
    never = lambda mode: pytest.fail("no step is made: nothing is timed")  # noqa: E731
    assert [ctx.cpu.choose(m, never, **WARG) for m in ("auto", "bfloat16", "float32_compile")] == [
        "float32",
        "bfloat16",
        "float32_compile",
    ]
    assert hand_built_context({}).cpu is not ctx.cpu  # each context its own record


class TickClock:
    """A clock whose stop reading comes at tick `stop_at`; warmup() must not be called."""

    budget_s = float("inf")

    def __init__(self, stop_at: int) -> None:
        self.ticks, self.stop_at = 0, stop_at

    def tick(self) -> ClockReading:
        self.ticks += 1
        return ClockReading(float(self.ticks), float("inf"), self.ticks > self.stop_at)

    def elapsed_s(self) -> float:
        return float(self.ticks)

    def warmup(self, *args: object, **kwargs: object) -> WarmupReport:
        raise AssertionError("a fixed eager mode needs no warm-up")


class RandomTokens:
    tokens_consumed = 0

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.g = vocab_size, torch.Generator().manual_seed(0)

    def next_batch(self, batch_tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.randint(0, self.vocab_size, (batch_tokens // seq_len, seq_len + 1), generator=self.g)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def metrics(self, step: int, **values: float) -> None:
        pass


def hand_built_context(cfg: dict[str, object], folder: Path = REPO, stop_at: int = 2) -> TrainContext:
    model, train = dict(cfg.get("model", {})), dict(cfg.get("train", {}))  # type: ignore[call-overload]
    vocab = int(model.get("vocab_size", 1024))
    return TrainContext(
        hparams=train,
        model_config=model,
        data=RandomTokens(vocab),
        dist=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="none"),
        clock=TickClock(stop_at),
        log=Lines(),
        seed=0,
        vocab_size=vocab,
        submission_dir=folder,
        scratch_dir=folder,
    )


BASELINE_FOLDERS = sorted(p.parent for p in (REPO / "baselines").glob("*/train.py"))


@pytest.mark.parametrize("folder", BASELINE_FOLDERS, ids=lambda p: p.name)
def test_each_baseline_trains_from_a_context_built_by_hand(folder: Path, monkeypatch, tmp_path) -> None:
    """No baseline branches on ctx.cpu being there: each trains two steps from a hand-built context at its
    tiny preset (float32 fixed), with CpuAsGiven's answer and no warm-up, and reports the mode it used."""
    from harness.config import load_config
    from harness.train.rank import import_submission_file

    cfg = load_config(folder, preset="tiny", overrides=["train.cpu_mode=float32"])
    for name in ("model", "codec", "eval"):  # each baseline's own modules of these names
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    train = import_submission_file(folder / "train.py", f"pgolf_test_{folder.name}").train
    ctx = hand_built_context({"model": cfg.model, "train": cfg.train}, tmp_path)
    result = train(ctx)
    assert isinstance(result, torch.nn.Module | dict) and ctx.clock.ticks == 3  # type: ignore[attr-defined]
    assert ctx.cpu.recorded == {"chosen": "float32", "chosen_by": "as given (no trial: nothing measured)"}  # type: ignore[attr-defined]
    for name in ("model", "codec", "eval"):
        sys.modules.pop(name, None)


def test_no_baseline_branches_on_ctx_cpu_or_runs_its_own_trial() -> None:
    """The step-mode choice is ctx.cpu.choose, once per baseline; ctx.cpu is never None (CpuAsGiven)."""
    for folder in BASELINE_FOLDERS:
        src = (folder / "train.py").read_text(encoding="utf-8")
        assert src.count("ctx.cpu.choose(") == 1, folder.name
        for gone in (
            "ctx.cpu is not None",
            "ctx.cpu is None",
            "ctx.cpu.trial(",
            "ctx.cpu.modes(",
            "ctx.cpu.record(",
        ):
            assert gone not in src, f"{folder.name}: {gone}"


# ---- the machine's load ----


def test_load_between_separates_our_cpu_time_from_the_others() -> None:
    a = LoadReading(t_s=100.0, busy_s=1000.0, steal_s=5.0, own_s=10.0, loadavg_1m=1.0)
    quiet = LoadReading(t_s=110.0, busy_s=1019.0, steal_s=5.0, own_s=28.0, loadavg_1m=1.5)
    busy = LoadReading(t_s=110.0, busy_s=1030.0, steal_s=5.0, own_s=28.0, loadavg_1m=3.0)
    q = load_between(a, quiet, cores=2)
    assert (q["own_cores"], q["others_cores"], q["contended"]) == (1.8, 0.1, False)
    b = load_between(a, busy, cores=2)
    assert b["others_cores"] == 1.2 and b["others_cores"] >= CONTENDED_CORES and b["contended"] is True
    assert "1.20 of 2 cores busy with other processes" in describe(b)
    none = load_between(
        LoadReading(0.0, None, None, 0.0, None), LoadReading(1.0, None, None, 0.5, None), cores=2
    )
    assert none["contended"] is None and describe(none).startswith("not measured")


def test_proc_stat_line_is_parsed_and_garbage_is_refused() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    busy, steal = _proc_stat("cpu  100 10 50 9000 5 1 2 30 0 0\ncpu0 1 2 3\n")  # type: ignore[misc]
    assert (busy, steal) == (163 / hz, 30 / hz)
    assert _proc_stat("intr 1 2 3\n") is None and _proc_stat("") is None


# ---- pgolf tune's decisions ----


def test_tune_plans_bfloat16_only_where_native() -> None:
    train = {"cpu_mode": "float32", "grad_accum_steps": 8, "train_batch_tokens": 4096, "train_seq_len": 256}
    old, notes = plan_settings(facts(("avx2",), "AVX2").to_json(), train, threads=2)
    names = [s.name for s in old]
    assert "cpu_mode=float32_compile" in names and not any("bfloat16" in n for n in names)
    assert any("bfloat16: left out" in n for n in notes)
    new, _ = plan_settings(facts(("avx512_bf16",), "AVX512").to_json(), train, threads=2)
    assert {"cpu_mode=bfloat16", "cpu_mode=bfloat16_compile"} <= {s.name for s in new}
    assert {"grad_accum_steps=4", "grad_accum_steps=16", "threads=1"} <= {s.name for s in new}
    odd, _ = plan_settings(facts((), "AVX2").to_json(), {**train, "grad_accum_steps": 16}, threads=2)
    assert "grad_accum_steps=32" not in {s.name for s in odd}  # 4096 / 32 = 128 tokens: not whole sequences


def test_a_setting_is_kept_only_beyond_the_noise() -> None:
    ref = Row(Setting("ref"), [1000.0, 1010.0])
    assert helps(Row(Setting("a"), [1100.0, 1105.0]), ref)
    assert not helps(Row(Setting("b"), [1020.0, 1025.0]), ref)  # 1.5 % < the 3 % floor
    assert not helps(Row(Setting("c"), [900.0, 1300.0]), ref)  # 1100 median, but a 36 % spread
    assert not helps(Row(Setting("d"), [], failed="boom"), ref)
    assert not helps(Row(Setting("e"), [2000.0]), ref)  # twice as fast, once: the noise is unknown
    assert not helps(Row(Setting("f"), [2000.0, 2001.0]), Row(Setting("ref"), [1000.0]))


def test_measure_rows_interleaves_and_stops_at_the_budget() -> None:
    clock = FakeClock()
    order: list[str] = []
    speed = {"ref": 1000.0, "fast": 1500.0, "broken": 0.0}

    def measure(s: Setting) -> float:
        order.append(s.name)
        clock.t += 10
        if s.name == "broken":
            raise RuntimeError("the bare run failed:\nTraceback ...\nValueError: unknown [train] keys")
        return speed[s.name]

    rows = measure_rows(
        [Setting("ref"), Setting("fast"), Setting("broken")], measure, 3, budget_s=35, clock=clock
    )
    # round 2 starts at 30 s (within 35 s) without the failed setting; round 3 would start at 50 s: not run
    assert order == ["ref", "fast", "broken", "ref", "fast"]
    assert rows[2].failed == "ValueError: unknown [train] keys" and rows[1].median == 1500.0


def test_preset_text_appends_a_loadable_preset(tmp_path: Path) -> None:
    base = {"launch.device": "cpu", "train.cpu_mode": "auto", "train.grad_accum_steps": 8}
    kept = [
        Setting("cpu_mode=bfloat16_compile", {"train.cpu_mode": "bfloat16_compile"}),
        Setting("pin=close", env={"OMP_PROC_BIND": "close"}),
    ]
    text = preset_text("cpu-tuned", "cpu", base, kept, "setting  tokens/s\nref  1,000")
    table = tomllib.loads("[presets]\n" + text)["presets"]["cpu-tuned"]
    assert table["train"] == {"cpu_mode": "bfloat16_compile", "grad_accum_steps": 8}
    assert table["launch"] == {"device": "cpu"}
    assert "# measured to help, set outside the preset: pin=close (OMP_PROC_BIND=close)" in text


@pytest.mark.long  # real measurements: tens of seconds
def test_tune_measures_for_real_and_appends_a_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One tiny real run: two settings (the preset, one thread), one short bare process each, the table,
    and a preset appended to a copy of the baseline's config.toml (the rest of the file untouched)."""
    import shutil

    import harness.commands.tune as tune
    from harness.config import load_config

    sub = tmp_path / "sub"
    shutil.copytree(REPO / "baselines" / "naive_baseline", sub)
    before = (sub / "config.toml").read_text()
    monkeypatch.setattr(
        tune, "plan_settings", lambda f, t, n: ([Setting("threads=1", {"launch.threads": 1})], [])
    )
    args = tune.argparse.Namespace(
        submission=str(sub),
        preset="tiny",
        write_preset="tiny-tuned",
        trial_s=10.0,
        repeats=1,
        budget_s=60.0,
        plan_only=False,
        data=None,
        set=[],
    )
    assert tune.cmd_tune(args) == 0
    out = capsys.readouterr().out
    # a row is a measurement, or (two threads on a machine busy with other work can make under three steps)
    # the failure that says so; at least one row is a measurement
    rows = {m[1]: float(m[2].replace(",", "")) for m in map(ROW.match, out.splitlines()) if m}
    failed = [line for line in out.splitlines() if "failed: fewer than 3 logged steps" in line]
    assert rows and min(rows.values()) > 0 and len(rows) + len(failed) == 2, out
    after = (sub / "config.toml").read_text()
    assert after.startswith(before) and "[presets.tiny-tuned]" in after[len(before) :]
    tuned = load_config(sub, "tiny-tuned")
    assert tuned.train["cpu_mode"] == "float32" and tuned.train["train_seq_len"] == 64
    with pytest.raises(FileExistsError, match="already has a preset 'tiny-tuned'"):
        tune.cmd_tune(args)


def test_a_preset_value_with_a_line_break_stays_one_value() -> None:
    """A base preset's string holding a line break (a TOML escape in the config) was written raw: the appended
    block was no TOML (tune's own load after its write failed, and the config was left broken)."""
    base = {"run.note": 'x"\n[presets.cpu-tuned.budget]\ntrain_s = 99999.0\n#', "train.grad_accum_steps": 8}
    text = preset_text("cpu-tuned", "cpu", base, [], "ref  1,000")
    table = tomllib.loads("[presets]\n" + text)["presets"]["cpu-tuned"]
    assert table == {"run": {"note": base["run.note"]}, "train": {"grad_accum_steps": 8}}


def test_tune_refuses_a_config_that_is_a_link(tmp_path: Path) -> None:
    """`pgolf tune ENTRY --write-preset` appended to whatever TOML file the entry's config.toml linked to (another
    entry's config, a file of the official's); `pgolf run` refuses such a folder, and tune now does too, before
    a trial runs."""
    import shutil

    import harness.commands.tune as tune

    other = tmp_path / "other"
    shutil.copytree(REPO / "baselines" / "naive_baseline", other)
    sub = tmp_path / "sub"
    shutil.copytree(REPO / "baselines" / "naive_baseline", sub)
    (sub / "config.toml").unlink()
    (sub / "config.toml").symlink_to(other / "config.toml")
    before = (other / "config.toml").read_bytes()
    args = tune.argparse.Namespace(
        submission=str(sub), preset="tiny", write_preset="tiny-tuned", trial_s=1.0, repeats=1, budget_s=1.0,
        plan_only=True, data=None, set=[],
    )  # fmt: skip
    with pytest.raises(SubmissionError, match="config.toml: cannot open it as the submission's own file"):
        tune.cmd_tune(args)
    assert (other / "config.toml").read_bytes() == before
