"""`pgolf tune SUBMISSION [--preset P] [--write-preset NAME]`: the settings that matter here, by measurement.

    pgolf tune SUBMISSION [--preset cpu] [--write-preset NAME] [--trial-s 8] [--repeats 2] [--budget-s 600]
                          [--plan-only] [--data DIR] [--set K=V ...]

For this shape on this machine it measures, one at a time against the preset as it is (the
`reference` row), the settings that can matter on CPU:
- dtype and compilation: train.cpu_mode float32 / float32_compile, and bfloat16 / bfloat16_compile
  only where the CPU computes bfloat16 natively (harness/train/cpu.py: never where torch's capability,
  which ATEN_CPU_CAPABILITY can force lower, is below AVX-512);
- threads (launch.threads: the cores, and one fewer), inter-op threads (1);
- batch split (train.grad_accum_steps: half and twice the preset's, where the batch still divides);
- thread pinning (OMP_PROC_BIND=close, OMP_PLACES=cores); the allocator (jemalloc or tcmalloc by
  LD_PRELOAD, where the machine has one: listed as unavailable otherwise);
then the settings that helped, together. Each measurement is one short bare training process (the
submission's own train(ctx), harness/bench/runner.py `bare`, confined as a model worker is: submitted code,
given the training shards alone and none of the official's environment; start-up and compilation excluded): its
steady tokens/s between the 2nd and the last logged step. Rounds interleave the settings, so a load
that comes and goes touches all of them. The table prints the median, the spread (min-max over the
repeats) and the change against the reference row; a setting is kept only when its median beats the
reference's by more than the noise (NOISE_FLOOR, or the two rows' relative spreads, whichever is
larger). --write-preset appends a new preset to the submission's config.toml: the base preset's keys
with the kept ones over them (only keys a preset can hold: train.cpu_mode, train.grad_accum_steps,
launch.threads; environment-only settings are written as comments). The file is appended to, never
rewritten, and an existing preset name is refused.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import stat
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scoring.errors import SubmissionError

NOISE_FLOOR = 0.03
"""A setting must beat the reference row's median tokens/s by at least this fraction (or the spread)."""
PRESET_KEYS = ("train.cpu_mode", "train.grad_accum_steps", "launch.threads")
CONFIG_MAX_BYTES = 1 << 20
"""The most of a config.toml tune reads (a config is a few KB)."""


@dataclass(frozen=True)
class Setting:
    name: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Config keys (section.key) set on top of the preset."""
    env: Mapping[str, str] = field(default_factory=dict)
    interop_threads: int = 0

    def merged(self, other: Setting) -> Setting:
        return Setting(
            f"{self.name}+{other.name}",
            {**self.overrides, **other.overrides},
            {**self.env, **other.env},
            other.interop_threads or self.interop_threads,
        )


def find_allocator() -> tuple[str, str] | None:
    """(name, library path) of jemalloc or tcmalloc on this machine, None when neither is installed."""
    for name in ("jemalloc", "tcmalloc"):
        lib = ctypes.util.find_library(name)
        if lib:
            for d in (
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
                "/usr/local/lib",
                "/usr/lib/aarch64-linux-gnu",
            ):
                if (Path(d) / lib).exists():
                    return name, str(Path(d) / lib)
    return None


def plan_settings(
    facts: Mapping[str, Any], train: Mapping[str, Any], threads: int
) -> tuple[list[Setting], list[str]]:
    """The settings to measure one at a time for this CPU and preset, and notes on those left out."""
    notes: list[str] = []
    out: list[Setting] = []
    current = train.get("cpu_mode")
    modes = ["float32", "float32_compile"]
    if facts.get("native_bf16"):
        modes += ["bfloat16", "bfloat16_compile"]
    else:
        notes.append(
            f"bfloat16: left out, not native here (flags {','.join(facts.get('flags') or []) or '-'}, "
            f"torch capability {facts.get('torch_capability')})"
        )
    if current is None:
        notes.append("dtype/compile: the submission has no train.cpu_mode key; not measured")
    else:
        out += [Setting(f"cpu_mode={m}", {"train.cpu_mode": m}) for m in modes if m != current]
    cores = int(facts.get("cores") or 1)
    for n in sorted({cores, cores - 1} - {threads, 0}):
        out.append(Setting(f"threads={n}", {"launch.threads": n}))
    out.append(Setting("interop_threads=1", interop_threads=1))
    accum = train.get("grad_accum_steps")
    batch, seq = train.get("train_batch_tokens"), train.get("train_seq_len")
    if isinstance(accum, int) and accum > 0 and isinstance(batch, int) and isinstance(seq, int):
        for a in (accum // 2, accum * 2):
            if a >= 1 and a != accum and batch % a == 0 and (batch // a) % seq == 0:
                out.append(Setting(f"grad_accum_steps={a}", {"train.grad_accum_steps": a}))
    else:
        notes.append("batch split: no train.grad_accum_steps > 0 in the preset; not measured")
    out.append(Setting("pin=close", env={"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}))
    alloc = find_allocator()
    if alloc:
        out.append(Setting(f"allocator={alloc[0]}", env={"LD_PRELOAD": alloc[1]}))
    else:
        notes.append("allocator: neither jemalloc nor tcmalloc is installed here; glibc malloc only")
    return out, notes


@dataclass
class Row:
    setting: Setting
    tokens_per_s: list[float] = field(default_factory=list)
    failed: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.tokens_per_s) if self.tokens_per_s else None

    @property
    def spread(self) -> float:
        """Relative spread: (max - min) / median over the repeats (0 with one repeat)."""
        m = self.median
        return (max(self.tokens_per_s) - min(self.tokens_per_s)) / m if m else 0.0


def helps(row: Row, ref: Row, floor: float = NOISE_FLOOR) -> bool:
    """Beats the reference by more than the noise: NOISE_FLOOR, or either row's relative spread. With one
    measurement of either row the noise is unknown, so nothing is kept on it."""
    if row.median is None or ref.median is None or min(len(row.tokens_per_s), len(ref.tokens_per_s)) < 2:
        return False
    return row.median > ref.median * (1 + max(floor, row.spread, ref.spread))


def verdict(row: Row, ref: Row, floor: float = NOISE_FLOOR) -> str:
    if row is ref:
        return "reference"
    if helps(row, ref, floor):
        return "helps"
    if min(len(row.tokens_per_s), len(ref.tokens_per_s)) < 2:
        return "one measurement, noise unknown: not kept (a larger --budget-s)"
    return "no gain beyond noise"


Measure = Callable[[Setting], float]


def measure_rows(
    settings: Sequence[Setting],
    measure: Measure,
    repeats: int,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[Row]:
    """Interleaved rounds (every setting once per round) until `repeats` rounds or the budget is spent
    (the first round always runs whole). A failing setting is recorded and not run again."""
    rows = [Row(s) for s in settings]
    t0 = clock()
    for r in range(repeats):
        if r and clock() - t0 > budget_s:
            break
        for row in rows:
            if row.failed:
                continue
            try:
                row.tokens_per_s.append(measure(row.setting))
            except (RuntimeError, ValueError) as e:
                row.failed = str(e).strip().splitlines()[-1][:160] if str(e).strip() else type(e).__name__
    return rows


def table(rows: Sequence[Row], ref: Row) -> str:
    lines = [f"{'setting':34s} {'tokens/s':>10s} {'spread':>8s} {'vs ref':>8s}  n  verdict"]
    for row in rows:
        if row.failed or row.median is None:
            lines.append(f"{row.setting.name:34s} {'-':>10s} {'-':>8s} {'-':>8s}  0  failed: {row.failed}")
            continue
        change = f"{100 * (row.median / ref.median - 1):+7.1f}%" if ref.median else f"{'-':>8s}"
        why = "no reference to compare with" if ref.median is None else verdict(row, ref)
        spread = f"{100 * row.spread:7.1f}%" if len(row.tokens_per_s) > 1 else f"{'-':>8s}"
        lines.append(
            f"{row.setting.name:34s} {row.median:10,.0f} {spread} {change}  {len(row.tokens_per_s)}  {why}"
        )
    return "\n".join(lines)


def preset_text(
    name: str, base: str, base_table: Mapping[str, Any], kept: Sequence[Setting], rows_text: str
) -> str:
    """A new [presets.NAME] table: the base preset's keys, the kept settings' keys over them."""
    values: dict[str, Any] = dict(base_table)
    env_notes: list[str] = []
    for s in kept:
        values.update({k: v for k, v in s.overrides.items() if k in PRESET_KEYS})
        if s.env or s.interop_threads:
            env_notes.append(
                f"# measured to help, set outside the preset: {s.name}"
                + (f" ({' '.join(f'{k}={v}' for k, v in s.env.items())})" if s.env else "")
            )
    lines = [
        "",
        f"[presets.{name}]",
        f"# written by `pgolf tune --preset {base} --write-preset {name}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:",
        f"# the preset {base} with the settings that beat it beyond the noise on this machine",
        *(f"#   {line}" for line in rows_text.splitlines()),
        *env_notes,
    ]
    for k, v in values.items():
        lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):  # a basic string: quote, backslash and every control character escaped
        return '"' + "".join(_toml_char(c) for c in v) + '"'
    raise ValueError(f"cannot write {v!r} into a preset")


def _toml_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c


def _config_fd(path: Path, flags: int) -> int:
    """The submission's config.toml opened without following a link or waiting on a FIFO, a regular file; else
    a SubmissionError (`pgolf run` refuses such a folder: tune must not read or append to the file it names)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise SubmissionError(
            f"{path}: cannot open it as the submission's own file ({e.strerror}); a link, FIFO or device is "
            "refused: make config.toml a regular file of the folder"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SubmissionError(f"{path} is not a regular file; make config.toml a regular file of the folder")
    return fd


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def cmd_tune(args: argparse.Namespace) -> int:
    from data.embedded import ensure_embedded_dataset
    from harness.bench.runner import run_bare, steady_tokens_per_s
    from harness.config import load_config
    from harness.run.load import load_between, read_load
    from harness.train.cpu import read_facts

    submission = Path(args.submission).resolve()
    config_path = submission / "config.toml"
    fd = _config_fd(config_path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(CONFIG_MAX_BYTES + 1)
    if len(data) > CONFIG_MAX_BYTES:
        raise SubmissionError(f"{config_path} is over {CONFIG_MAX_BYTES:,} bytes; not a submission's config")
    raw = tomllib.loads(data.decode("utf-8"))
    presets = raw.get("presets") or {}
    if args.write_preset and args.write_preset in presets:
        raise FileExistsError(
            f"{config_path} already has a preset {args.write_preset!r}; pass a new --write-preset name"
        )
    cfg = load_config(submission, args.preset, args.set)
    launch = cfg.section("launch")
    if launch.resolved_device() != "cpu" or launch.nproc_per_node != 1:
        raise ValueError(
            f"pgolf tune measures one CPU rank: preset {args.preset!r} is not a one-rank CPU preset"
        )
    data_root = Path(args.data).resolve() if args.data else ensure_embedded_dataset()
    threads = launch.threads_per_rank()
    facts = read_facts().to_json()
    base_train = dict(cfg.train)
    if base_train.get("cpu_mode") == "auto":  # rows at fixed modes: no start-up trial in each measurement
        base_train["cpu_mode"] = "float32"
    if "train_log_every" in base_train:
        base_train["train_log_every"] = 1  # every step's clock reading, for the steady rate
    settings, notes = plan_settings(facts, base_train, threads)
    if cfg.train.get("cpu_mode") == "auto":
        notes.insert(0, "the preset's cpu_mode auto is measured mode by mode; the reference row at float32")
    reference = Setting("reference (the preset as it is)")
    print(
        f"tune: {submission.name} preset {args.preset} on {facts['model']} ({facts['cores']} cores; flags "
        f"{','.join(facts['flags']) or '-'}; torch capability {facts['torch_capability']}; native bfloat16 "
        f"{facts['native_bf16']}); {len(settings) + 1} settings x {args.repeats} repeat(s) of {args.trial_s:g} s, "
        f"budget {args.budget_s:g} s; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    for n in notes:
        print(f"  note: {n}")
    if args.plan_only:
        for st in settings:
            extra = [f"{k}={v}" for k, v in {**st.overrides, **st.env}.items()]
            if st.interop_threads:
                extra.append(f"torch.set_num_interop_threads({st.interop_threads})")
            print(f"  would measure: {st.name:30s} {' '.join(extra)}")
        return 0
    tokens_per_step = int(base_train.get("train_batch_tokens") or 0)
    if not tokens_per_step:
        raise ValueError("pgolf tune needs train.train_batch_tokens in the preset (tokens per step)")

    with tempfile.TemporaryDirectory(prefix="pgolf-tune-") as tmp:
        count = [0]

        def measure(s: Setting) -> float:
            count[0] += 1
            hp = dict(base_train)
            th = threads
            for key, value in s.overrides.items():
                section, _, name = key.partition(".")
                if section == "train":
                    hp[name] = value
                elif key == "launch.threads":
                    th = int(value)
            wd = Path(tmp) / f"t{count[0]}"
            rec = run_bare(
                submission=submission,
                data_root=data_root,
                cfg=cfg,
                budget_s=args.trial_s,
                threads=th,
                device="cpu",
                workdir=wd,
                env=dict(s.env),  # over the sandbox's allow-listed environment: the trial runs confined
                interop_threads=s.interop_threads,
                hparams=hp,
                from_first_tick=True,  # trial_s seconds of training: start-up and compilation left out
            )
            steps_hp = int(hp.get("train_batch_tokens") or tokens_per_step)
            steady = steady_tokens_per_s(Path(rec["metrics"]), steps_hp)
            if steady is None:
                raise RuntimeError(
                    f"fewer than 3 logged steps in {args.trial_s:g} s: pass a longer --trial-s"
                )
            print(f"    {s.name:34s} {steady:10,.0f} tokens/s", flush=True)
            return steady

        load0 = read_load()
        rows = measure_rows([reference, *settings], measure, args.repeats, args.budget_s)
        ref = rows[0]
        kept = [r.setting for r in rows[1:] if helps(r, ref)]
        # settings of one kind exclude each other: keep the best of each key
        best_by_key: dict[str, Row] = {}
        for r in rows[1:]:
            if r.setting in kept:
                key = ",".join(sorted(r.setting.overrides) or sorted(r.setting.env) or ["interop"])
                if key not in best_by_key or (r.median or 0) > (best_by_key[key].median or 0):
                    best_by_key[key] = r
        kept = [r.setting for r in best_by_key.values()]
        if len(kept) > 1:
            combo = kept[0]
            for s in kept[1:]:
                combo = combo.merged(s)
            combo_rows = measure_rows([combo], measure, args.repeats, args.budget_s)
            rows += combo_rows
            best_single = max((r for r in rows[1:-1] if r.setting in kept), key=lambda r: r.median or 0)
            if not helps(combo_rows[0], best_single, floor=0.0):
                kept = [best_single.setting]
                print(f"  the combination did not beat {best_single.setting.name} alone: keeping that one")
        load = load_between(load0, read_load())
    text = table(rows, ref)
    print(text)
    print(
        f"machine load while tuning: {load.get('others_cores')} of {load['cores']} cores busy with other processes"
        f" (load average {load['loadavg_1m_start']} -> {load['loadavg_1m_end']})"
        + ("; CONTENDED: the figures are noisier than on a quiet machine" if load.get("contended") else "")
    )
    print(
        "kept: "
        + (
            ", ".join(s.name for s in kept)
            if kept
            else "nothing (the preset is as fast as any setting tried)"
        )
    )
    if args.write_preset:
        base_table = _flat(presets.get(args.preset) or {})
        block = preset_text(args.write_preset, args.preset, base_table, kept, text)
        with os.fdopen(_config_fd(config_path, os.O_WRONLY | os.O_APPEND), "wb") as out:
            out.write(block.encode("utf-8"))
        load_config(submission, args.write_preset, [])  # the new preset must load
        print(f"wrote preset {args.write_preset!r} to {config_path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="measure the CPU settings that matter for a preset; write the ones that help"
    )
    p.add_argument("submission", help="submission folder")
    p.add_argument("--preset", default="cpu", help="the preset to tune (default cpu)")
    p.add_argument(
        "--write-preset", metavar="NAME", help="append a preset NAME with the kept settings to config.toml"
    )
    p.add_argument(
        "--trial-s", type=float, default=8.0, help="training seconds of each measurement (default 8)"
    )
    p.add_argument("--repeats", type=int, default=2, help="measurements per setting, interleaved (default 2)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="stop starting new rounds after this many seconds (default 600: two rounds of the CPU "
        "settings on a 2-core machine; a setting measured once is never kept)",
    )
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="print the CPU's facts and the settings it would measure; measure nothing",
    )
    p.add_argument("--data", help="dataset folder (default: the embedded corpus)")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one config key"
    )
    p.set_defaults(func=cmd_tune)
