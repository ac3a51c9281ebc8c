"""The CPU a rank runs on, and a measured choice between ways to run its training step (ctx.cpu).

No single setting is right for every CPU: bfloat16 autocast is about 4x faster than float32 where the
processor computes bfloat16 natively (AVX-512 BF16, AMX) and about 20x slower where it emulates it
(AVX2 only, a 2016 Xeon); torch.compile helps one shape and not another. So the harness gives the
submission CpuTuner (harness.api.CpuTuning, as `ctx.cpu`):

- `facts`: the CPU's model name, the instruction-set flags that matter, torch's CPU capability
  (which ATEN_CPU_CAPABILITY can force lower), the cores this process may use, L3 size, and whether
  bfloat16 is native: a bfloat16 flag on the CPU AND a torch capability of AVX-512 or above;
- `choose(requested, make_step, ...)`: the one call a submission makes. It takes the eager modes
  worth timing (`modes`: a fixed mode as it is, "auto" float32 and, only where bfloat16 is native,
  bfloat16), and where there is something to measure or compile runs a StepTrial inside
  ctx.clock.warmup (off the clock, undone): each candidate `discard + repeats` times on the warm-up's
  synthetic batches, the repeats timed; under "auto" the faster dtype is then compiled and timed too
  (one compilation, a minute on 2 cores, not one per dtype). The fastest by median step time wins;
- `record(**values)`: what the run chose and why; the rank writes it to train.json (`cpu`), and the
  result carries it.

This module imports only torch, the standard library and harness.api (harness.train's layer rule).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.api import CPU_AUTO, CPU_MODES, BudgetClock, StepFn, cpu_mode_as_given

CPU_FORMAT = "pg-cpu"
CPU_FORMAT_VERSION = 1

MODES = CPU_MODES
AUTO = CPU_AUTO
FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "bf16")
"""The /proc/cpuinfo flags recorded (the ones that decide a dtype's speed); `bf16` is ARM's."""
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
NATIVE_BF16_CAPABILITIES = ("AVX512",)
"""torch.backends.cpu.get_cpu_capability() prefixes under which torch's kernels use bfloat16 instructions."""


@dataclass(frozen=True)
class CpuFacts:
    model: str
    flags: tuple[str, ...]
    """Of FLAGS_OF_INTEREST, those this CPU has."""
    torch_capability: str
    """torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ... (ATEN_CPU_CAPABILITY lowers it)."""
    cores: int
    """CPUs this process may run on (its affinity mask)."""
    threads: int
    """torch intra-op threads."""
    l3_bytes: int | None
    native_bf16: bool

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = list(self.flags)
        return d


def native_bf16(flags: tuple[str, ...] | frozenset[str], capability: str) -> bool:
    """bfloat16 is computed natively: the CPU has a bfloat16 instruction set and torch's kernels may use it."""
    return bool(BF16_FLAGS & set(flags)) and capability.upper().startswith(NATIVE_BF16_CAPABILITIES)


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, the flags of interest it has) from /proc/cpuinfo text (its first processor)."""
    model, flags = "unknown", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, tuple(f for f in FLAGS_OF_INTEREST if f in flags)


def l3_bytes() -> int | None:
    """The largest cache's size from sysfs (index*/level 3), None where not readable."""
    best = None
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (idx / "level").read_text().strip() != "3":
                continue
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
        digits = size.rstrip("KMGkmg")
        if digits.isdigit():
            best = max(best or 0, int(digits) * mult)
    return best


def read_facts(cpuinfo: str | None = None, capability: str | None = None) -> CpuFacts:
    """This machine's CPU facts (`cpuinfo`, `capability`: given instead of read, for tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = parse_cpuinfo(cpuinfo)
    cap = capability if capability is not None else torch.backends.cpu.get_cpu_capability()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return CpuFacts(
        model=model,
        flags=flags,
        torch_capability=cap,
        cores=cores,
        threads=torch.get_num_threads(),
        l3_bytes=l3_bytes(),
        native_bf16=native_bf16(flags, cap),
    )


def modes_for(requested: str, facts: CpuFacts) -> list[str]:
    """The eager step modes to time first: a fixed mode alone; "auto": float32, and bfloat16 only where it
    is native (emulated bfloat16 is an order of magnitude slower). Under "auto" the trial then compiles
    the faster dtype and times that too (compile_of): one compilation, not one per dtype."""
    if requested == AUTO:
        return ["float32"] + (["bfloat16"] if facts.native_bf16 else [])
    return [cpu_mode_as_given(requested)]


def mode_dtype(mode: str) -> torch.dtype:
    return torch.bfloat16 if mode.startswith("bfloat16") else torch.float32


def mode_compiles(mode: str) -> bool:
    return mode.endswith("_compile")


def compile_of(mode: str) -> str:
    """The compiled form of an eager mode ("float32" -> "float32_compile")."""
    return mode if mode_compiles(mode) else f"{mode}_compile"


def eager_of(mode: str) -> str:
    """The eager form of a mode ("bfloat16_compile" -> "bfloat16")."""
    return mode.removesuffix("_compile")


class StepTrial:
    """A step function for ctx.clock.warmup that times each candidate; `best()` the fastest.

    Call i runs candidate i // (discard + repeats); each candidate's first `discard` calls (compiling,
    the allocator's first touch) are not timed. `then(best_so_far)`, when given, names one more candidate
    (name, step) once the listed ones ran (e.g. the compiled form of the faster dtype): the trial has
    its steps too. CPU steps are synchronous, so a wall-clock read around each call times it."""

    def __init__(
        self,
        candidates: Mapping[str, Callable[[torch.Tensor, torch.Tensor], object]],
        *,
        repeats: int = 2,
        discard: int = 1,
        on_best: Callable[[str, dict[str, list[float]]], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        then: Callable[[str], tuple[str, Callable[[torch.Tensor, torch.Tensor], object]] | None]
        | None = None,
    ):
        if not candidates or repeats < 1 or discard < 0:
            raise ValueError("a trial needs at least one candidate, repeats >= 1 and discard >= 0")
        self.names = list(candidates)
        self._fns = [candidates[n] for n in self.names]
        self.repeats, self.discard = repeats, discard
        self.per = repeats + discard
        self._then = then
        self._listed = len(self.names)
        self.steps = self.per * (len(self.names) + (then is not None))
        self.times_s: dict[str, list[float]] = {n: [] for n in self.names}
        self._calls = 0
        self._on_best = on_best
        self._clock = clock

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        i, k = divmod(self._calls, self.per)
        self._calls += 1
        if i == self._listed and k == 0 and self._then is not None:
            extra = self._then(self._fastest())
            if extra is not None and extra[0] not in self.times_s:
                self.names.append(extra[0])
                self._fns.append(extra[1])
                self.times_s[extra[0]] = []
        if i >= len(self.names):
            if i == self._listed and self._then is not None:
                return  # nothing more to try: the follow-up's steps do nothing
            raise RuntimeError(f"trial called {self._calls} times; it has {self.steps} steps")
        t0 = self._clock()
        self._fns[i](x, y)
        if k >= self.discard:
            self.times_s[self.names[i]].append(self._clock() - t0)

    def _fastest(self) -> str:
        timed = {n: statistics.median(t) for n, t in self.times_s.items() if t}
        if not timed:
            raise RuntimeError("the trial has not run: pass trial.step and trial.steps to ctx.clock.warmup")
        return min(timed, key=lambda n: (timed[n], self.names.index(n)))

    def best(self) -> str:
        name = self._fastest()
        if self._on_best is not None:
            self._on_best(name, self.times_s)
        return name


class CpuTuner:
    """Implements harness.api.CpuTuning (ctx.cpu) for a rank (harness/train/rank.py builds one per rank).

    `clock` (its warmup runs the trial), `world_size` (several ranks: no trial) and `gpu` (a GPU run: the
    mode as given) are the rank's; `log` gets the lines a run prints about the choice; `timer` times the
    trial's steps (a test gives its own). Without a clock, choose() can only answer as given."""

    def __init__(
        self,
        facts: CpuFacts | None = None,
        *,
        clock: BudgetClock | None = None,
        world_size: int = 1,
        gpu: bool = False,
        log: Callable[[str], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ):
        self._facts = facts if facts is not None else read_facts()
        self.facts: Mapping[str, Any] = self._facts.to_json()
        self.recorded: dict[str, Any] = {}
        self._clock, self._world_size, self._gpu = clock, world_size, gpu
        self._log = log if log is not None else (lambda line: None)
        self._timer = timer

    def modes(self, requested: str) -> list[str]:
        return modes_for(requested, self._facts)

    def choose(
        self,
        requested: str,
        make_step: Callable[[str], StepFn],
        *,
        modules: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        batch_tokens: int,
        seq_len: int,
        vocab_size: int,
        repeats: int = 2,
        compiled: bool = True,
    ) -> str:
        """harness.api.CpuTuning.choose: the mode to train with, measured where there is a choice."""
        if self._gpu or self._clock is None:
            mode = cpu_mode_as_given(requested)
            why = "a GPU run: as given, no trial" if self._gpu else "as given (no clock to run a trial on)"
            self.record(chosen=mode, chosen_by=why)
            return mode
        modes = self.modes(requested)
        if not compiled:  # the submission's step does not compile: each mode's eager form
            modes = list(dict.fromkeys(eager_of(m) for m in modes))
        follow = compiled and requested == AUTO  # then compile the faster dtype and time it too
        if self._world_size > 1 and (len(modes) > 1 or follow):  # ranks timing alone could choose differently
            modes, follow = modes[:1], False
            self.record(note="several CPU ranks: no trial, the first mode")
        if len(modes) == 1 and not follow and not mode_compiles(modes[0]):
            mode = modes[0]
            self.record(
                chosen=mode,
                chosen_by="fixed by the preset (train.cpu_mode)"
                if requested != AUTO
                else "the only mode auto offers here",
            )
        else:

            def compiled_form(best: str) -> tuple[str, StepFn] | None:
                return None if mode_compiles(best) else (compile_of(best), make_step(compile_of(best)))

            trial = self.trial(
                {m: make_step(m) for m in modes}, repeats=repeats, then=compiled_form if follow else None
            )
            warm = self._clock.warmup(
                trial.step,
                steps=trial.steps,
                modules=modules,
                optimizers=optimizers,
                batch_tokens=batch_tokens,
                seq_len=seq_len,
                vocab_size=vocab_size,
            )
            mode = trial.best()
            medians = " ".join(f"{m}:{statistics.median(ts):.3f}" for m, ts in trial.times_s.items() if ts)
            self._log(f"cpu trial (median step s): {medians}")
            self._log(f"warmup_steps:{warm.steps} off_clock:{warm.off_clock_s:.1f}s verified:{warm.verified}")
        f = self._facts
        self._log(f"cpu: {f.model} capability {f.torch_capability} native_bf16 {f.native_bf16}; mode {mode}")
        return mode

    def trial(
        self,
        candidates: Mapping[str, StepFn],
        *,
        repeats: int = 2,
        discard: int = 1,
        then: Callable[[str], tuple[str, StepFn] | None] | None = None,
    ) -> StepTrial:
        """The StepTrial choose() runs, recording its choice and times when best() names the fastest."""

        def on_best(name: str, times: dict[str, list[float]]) -> None:
            self.record(
                chosen=name,
                chosen_by="measured at start-up (off the clock)",
                trial_step_s={n: [round(t, 6) for t in ts] for n, ts in times.items()},
            )

        return StepTrial(
            candidates, repeats=repeats, discard=discard, on_best=on_best, clock=self._timer, then=then
        )

    def record(self, **values: Any) -> None:
        self.recorded.update(values)

    def report(self) -> dict[str, Any]:
        """train.json's `cpu`: the facts and what the run recorded."""
        return {"format": CPU_FORMAT, "format_version": CPU_FORMAT_VERSION, **self.facts, **self.recorded}
