"""The naive baseline against the reference's own training script, on CPU, from the same seed and data.

    python scripts/compare_reference.py --reference /path/to/parameter-golf/train_gpt.py --data DIR
        [--out DIR] [--layers 4 --dim 128 --heads 4 --kv-heads 2 --seq-len 128 --batch-tokens 8192
         --steps 30 --seed 1337 --threads 2] [--precision float32|reference] [--reference-adam unfused|fused]
        [--baseline-set SECTION.KEY=VALUE ...] [--baseline-run RUN_DIR] [--json PATH]

DIR is a pgolf dataset (`pgolf data build ... --tokenizer fineweb_1024_bpe.model`): its shards carry
the reference's header and names (fineweb_train_*.bin, fineweb_val_*.bin), so the reference script
reads the folder as it is. The reference script is never copied: it is read from --reference and run
in its own process. Two runs, same shape, seed, data, thread count, 8 micro-batches per step (the
reference's 8 // world_size), constant LR (warmdown off on both sides: the baseline's warmdown runs on
the wall-clock, the reference's on MAX_WALLCLOCK_SECONDS=0 would be step-based), momentum warm-up on:
1. reference: train_gpt.py configured by its environment variables, with these run-time adaptations
   (each source substitution must match exactly once, or the comparison refuses):
   - CPU instead of CUDA: the lines `if not torch.cuda.is_available(): raise ...`,
     `device = torch.device("cuda", local_rank)`, `torch.cuda.set_device(device)` become
     `device = torch.device("cpu")`; torch.cuda.synchronize is a no-op and torch.cuda.max_memory_* return 0;
     an `nvidia-smi` stub that prints one line is first on PATH (the script logs its output);
   - torch.compile returns its argument (eager; the baseline's CPU presets do not compile either);
   - WARMUP_STEPS=0 (the reference's warm-up restores weights, optimizer state and data stream after it);
   - --reference-adam unfused (default): torch.optim.Adam gets fused=False (the script asks fused=True;
     the baseline uses fused Adam only on CUDA). `fused` keeps the script's fused CPU Adam;
   - --precision float32 (default): the model stays float32 (`.to(device).bfloat16()` becomes
     `.to(device)`), and Muon's Newton-Schulz and update buffer run in float32 (`X = G.bfloat16()` becomes
     `X = G.float()`, `updates_flat`'s dtype torch.float32): what the baseline does on CPU. `reference`
     runs the script's own precision: on CPU its torch.autocast(device_type="cuda") does nothing, so the
     bfloat16 embedding makes the whole forward bfloat16;
   - GPT.forward is wrapped to record each training micro-batch's loss (validation calls are not recorded).
2. baseline: `pgolf run BASELINE --preset tiny` with the same shape set by --set (the whole harness:
   sandbox, torchrun, clock, pack), a 3600 s budget so that train.iterations ends it.
Compared: per-step train loss (the float32 sum of the 8 micro-batch losses / 8, as the baseline logs it),
every final tensor (the reference's final_model.pt against the run's state.safetensors: bit-identical, or
the max abs difference), and the int8+zlib artifact: the reference's final_model.int8.ptz against the
reference's own serializer (quantize_state_dict_int8 + torch.save + zlib 9, called from the given
script) applied to the baseline's final state (sha256 both sides), and the harness's int8_zlib payload
(safetensors container, not a pickle, so its bytes differ by design) tensor by tensor against the
reference's quantized tensors, scales and passthrough tensors.
Exit status: 0 when everything is bit-identical, 1 when something differs (printed), 2 on a user error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "baselines" / "naive_baseline"
GRAD_ACCUM_STEPS = 8  # the reference's 8 // world_size on one process
COMPARE_FORMAT = "pg-reference-compare"
COMPARE_FORMAT_VERSION = 1
WORKER_FORMAT = "pg-reference-worker"
WORKER_FORMAT_VERSION = 1
BASELINE_BUDGET_S = 3600.0

CPU_DEVICE = (
    "CUDA device -> CPU",
    '    if not torch.cuda.is_available():\n        raise RuntimeError("CUDA is required")\n'
    '    device = torch.device("cuda", local_rank)\n    torch.cuda.set_device(device)\n',
    '    device = torch.device("cpu")\n',
)
FLOAT32_MODEL = ("model stays float32", ").to(device).bfloat16()", ").to(device)")
FLOAT32_NEWTON_SCHULZ = ("Newton-Schulz in float32", "X = G.bfloat16()", "X = G.float()")
FLOAT32_MUON_UPDATES = (
    "Muon update buffer in float32",
    "updates_flat = torch.zeros(total_params, device=params[0].device, dtype=torch.bfloat16)",
    "updates_flat = torch.zeros(total_params, device=params[0].device, dtype=torch.float32)",
)


class UserError(Exception):
    """A bad input: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Shape:
    vocab_size: int = 1024
    layers: int = 4
    dim: int = 128
    heads: int = 4
    kv_heads: int = 2
    mlp_mult: int = 2
    seq_len: int = 128
    batch_tokens: int = 8192
    steps: int = 30
    muon_warmup_steps: int = 10
    seed: int = 1337

    def check(self) -> None:
        micro = self.batch_tokens // GRAD_ACCUM_STEPS
        if micro * GRAD_ACCUM_STEPS != self.batch_tokens or micro % self.seq_len or micro == 0:
            raise UserError(
                f"--batch-tokens {self.batch_tokens} must split into {GRAD_ACCUM_STEPS} micro-batches of whole "
                f"{self.seq_len}-token sequences (a multiple of {GRAD_ACCUM_STEPS * self.seq_len})"
            )
        if self.dim % self.heads or self.heads % self.kv_heads or (self.dim // self.heads) % 2:
            raise UserError(
                f"--dim {self.dim} must divide by --heads {self.heads} into an even head size, "
                f"and --heads by --kv-heads {self.kv_heads}"
            )
        if self.steps < 1 or self.layers < 1:
            raise UserError("--steps and --layers must be at least 1")


def substitute(source: str, substitutions: Sequence[tuple[str, str, str]]) -> str:
    """Apply (what, old, new) literal substitutions; each `old` must occur exactly once."""
    for what, old, new in substitutions:
        n = source.count(old)
        if n != 1:
            raise UserError(
                f"the reference script has {n} occurrences of the text to adapt ({what}: {old.strip()[:60]!r}), "
                "expected exactly 1: is it the 2026-03-17 naive baseline's train_gpt.py?"
            )
        source = source.replace(old, new)
    return source


def reference_substitutions(precision: str) -> list[tuple[str, str, str]]:
    subs = [CPU_DEVICE]
    if precision == "float32":
        subs += [FLOAT32_MODEL, FLOAT32_NEWTON_SCHULZ, FLOAT32_MUON_UPDATES]
    return subs


def reference_env(shape: Shape, data_dir: Path, tokenizer: Path) -> dict[str, str]:
    """The reference's environment variables for this comparison (its Hyperparameters)."""
    return {
        "DATA_PATH": str(data_dir),
        "TOKENIZER_PATH": str(tokenizer),
        "RUN_ID": "compare_reference",
        "SEED": str(shape.seed),
        "VOCAB_SIZE": str(shape.vocab_size),
        "NUM_LAYERS": str(shape.layers),
        "MODEL_DIM": str(shape.dim),
        "NUM_HEADS": str(shape.heads),
        "NUM_KV_HEADS": str(shape.kv_heads),
        "MLP_MULT": str(shape.mlp_mult),
        "TRAIN_SEQ_LEN": str(shape.seq_len),
        "TRAIN_BATCH_TOKENS": str(shape.batch_tokens),
        "ITERATIONS": str(shape.steps),
        "WARMUP_STEPS": "0",
        "WARMDOWN_ITERS": "0",
        "MAX_WALLCLOCK_SECONDS": "0",
        "MUON_MOMENTUM_WARMUP_STEPS": str(shape.muon_warmup_steps),
        "VAL_LOSS_EVERY": "0",
        "TRAIN_LOG_EVERY": "1",
        "VAL_BATCH_SIZE": str(GRAD_ACCUM_STEPS * shape.seq_len * 16),
    }


def baseline_sets(shape: Shape, threads: int) -> list[str]:
    """The baseline's --set overrides (on the tiny preset) for the same run."""
    sets = {
        "model.vocab_size": shape.vocab_size,
        "model.num_layers": shape.layers,
        "model.model_dim": shape.dim,
        "model.num_heads": shape.heads,
        "model.num_kv_heads": shape.kv_heads,
        "model.mlp_mult": shape.mlp_mult,
        "train.train_batch_tokens": shape.batch_tokens,
        "train.train_seq_len": shape.seq_len,
        "train.grad_accum_steps": GRAD_ACCUM_STEPS,
        "train.iterations": shape.steps,
        "train.warmdown_iters": 0,
        "train.muon_momentum_warmup_steps": shape.muon_warmup_steps,
        "train.compile": False,
        "train.train_log_every": 1,
        "budget.train_s": BASELINE_BUDGET_S,
        "launch.threads": threads,
    }
    return [f"{k}={v!r}" for k, v in sets.items()]


def step_losses(micro_losses: Sequence[float], accum: int) -> list[float]:
    """Per-step train loss as the baseline logs it: float32 sum of the step's micro-batch losses, / accum."""
    import torch

    if len(micro_losses) % accum:
        raise ValueError(
            f"{len(micro_losses)} micro-batch losses is not a whole number of {accum}-micro-batch steps"
        )
    out = []
    for i in range(0, len(micro_losses), accum):
        total = torch.zeros((), dtype=torch.float32)
        for value in micro_losses[i : i + accum]:
            total += torch.tensor(value, dtype=torch.float32)
        out.append(total.item() / accum)
    return out


@dataclass(frozen=True)
class TensorDiff:
    name: str
    shape: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    identical: bool
    max_abs_diff: float


def compare_states(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> tuple[list[TensorDiff], list[str], list[str]]:
    """Per tensor present in both: bit-identical (same dtype, shape and bits) and max |a - b| in float64.
    Returns (diffs, names only in a, names only in b)."""
    import torch

    diffs = []
    for name in a:
        if name not in b:
            continue
        x, y = a[name], b[name]
        same_shape = tuple(x.shape) == tuple(y.shape)
        identical = same_shape and x.dtype == y.dtype and torch.equal(x, y)
        if not same_shape:
            max_diff = math.inf
        elif x.numel() == 0:
            max_diff = 0.0
        elif x.is_floating_point() or y.is_floating_point():
            max_diff = float((x.double() - y.double()).abs().max().item())
        else:
            max_diff = float((x.long() - y.long()).abs().max().item())
        diffs.append(TensorDiff(name, tuple(x.shape), str(x.dtype), str(y.dtype), bool(identical), max_diff))
    return diffs, [n for n in a if n not in b], [n for n in b if n not in a]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_reference_module(path: Path, source: str | None = None) -> ModuleType:
    """The reference script as a module (its main() not run), from `source` (default: the file as it is)."""
    module = ModuleType("reference_train_gpt")
    module.__file__ = str(path)
    code = compile(source if source is not None else path.read_text(encoding="utf-8"), str(path), "exec")
    exec(code, module.__dict__)  # noqa: S102 - the user's own reference script, run as the comparison's subject
    return module


def reference_artifact_bytes(module: ModuleType, state: Mapping[str, Any]) -> bytes:
    """The reference's int8+zlib bytes for `state`: its quantize_state_dict_int8, torch.save, zlib level 9."""
    import torch

    quant_obj, _stats = module.quantize_state_dict_int8(dict(state))
    buf = io.BytesIO()
    torch.save(quant_obj, buf)
    return zlib.compress(buf.getvalue(), level=9)


# ---- the reference's process ----


def reference_worker(spec_path: str) -> int:
    import torch

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if spec.get("format") != WORKER_FORMAT or spec.get("format_version") != WORKER_FORMAT_VERSION:
        raise ValueError(f"{spec_path} is not a {WORKER_FORMAT} v{WORKER_FORMAT_VERSION} spec")
    torch.set_num_threads(spec["threads"])
    path = Path(spec["reference"])
    source = substitute(path.read_text(encoding="utf-8"), reference_substitutions(spec["precision"]))

    torch.compile = lambda model=None, **_kw: model  # eager
    torch.cuda.synchronize = lambda *_a, **_kw: None
    torch.cuda.max_memory_allocated = lambda *_a, **_kw: 0
    torch.cuda.max_memory_reserved = lambda *_a, **_kw: 0
    if spec["adam"] == "unfused":
        base_adam = torch.optim.Adam

        class UnfusedAdam(base_adam):  # type: ignore[misc, valid-type]
            def __init__(self, params: Any, **kw: Any):
                kw["fused"] = False
                super().__init__(params, **kw)

        torch.optim.Adam = UnfusedAdam  # type: ignore[misc, assignment]

    module = load_reference_module(path, source)
    micro_losses: list[float] = []
    forward = module.GPT.forward

    def recording_forward(self: Any, input_ids: Any, target_ids: Any) -> Any:
        loss = forward(self, input_ids, target_ids)
        if self.training and torch.is_grad_enabled():
            micro_losses.append(float(loss.detach().float().item()))
        return loss

    module.GPT.forward = recording_forward
    module.main()
    Path(spec["losses_out"]).write_text(
        json.dumps({"format": "pg-reference-losses", "format_version": 1, "micro_losses": micro_losses}),
        encoding="utf-8",
    )
    return 0


def run_reference(
    reference: Path,
    shape: Shape,
    data_dir: Path,
    tokenizer: Path,
    workdir: Path,
    *,
    precision: str,
    adam: str,
    threads: int,
) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    stub_bin = workdir / "bin"
    stub_bin.mkdir(exist_ok=True)
    stub = stub_bin / "nvidia-smi"
    stub.write_text(
        "#!/bin/sh\necho 'nvidia-smi: stub (scripts/compare_reference.py runs the reference on CPU)'\n"
    )
    stub.chmod(0o755)
    spec = {
        "format": WORKER_FORMAT,
        "format_version": WORKER_FORMAT_VERSION,
        "reference": str(reference),
        "precision": precision,
        "adam": adam,
        "threads": threads,
        "losses_out": str(workdir / "losses.json"),
    }
    (workdir / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(reference_env(shape, data_dir, tokenizer))
    env.update(OMP_NUM_THREADS=str(threads), PATH=f"{stub_bin}{os.pathsep}{env.get('PATH', '')}")
    with open(workdir / "stdout.txt", "w", encoding="utf-8") as log:
        r = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "_reference_worker", str(workdir / "spec.json")],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if r.returncode != 0:
        tail = (workdir / "stdout.txt").read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"the reference run failed (exit {r.returncode}); its output ends:\n{tail}")
    return workdir


def run_baseline(
    baseline: Path, shape: Shape, data_dir: Path, run_dir: Path, *, threads: int, extra_sets: Sequence[str]
) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(baseline),
        "--preset",
        "tiny",
        "--seed",
        str(shape.seed),
    ]
    cmd += ["--data", str(data_dir), "--out", str(run_dir)]
    for s in [*baseline_sets(shape, threads), *extra_sets]:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(run_dir.parent / "baseline_stdout.txt", "w", encoding="utf-8") as log:
        r = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if r.returncode != 0:
        tail = (run_dir.parent / "baseline_stdout.txt").read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"the baseline run failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return run_dir


def check_baseline_run(run_dir: Path, shape: Shape, sets: Sequence[str]) -> None:
    """A finished run may stand in for the baseline only if its config.json has every setting of this comparison."""
    from harness.config import parse_override

    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        tables = config["tables"]
    except (OSError, ValueError, KeyError) as e:
        raise UserError(
            f"--baseline-run {run_dir} has no readable config.json ({e}): give a pgolf run folder"
        ) from None
    wanted = dict(parse_override(s) for s in sets)
    wanted["run.seed"] = shape.seed
    wrong = []
    for key, value in wanted.items():
        section, _, name = key.partition(".")
        have = tables.get(section, {}).get(name, "<absent>")
        if have != value:
            wrong.append(f"{key} is {have!r}, this comparison needs {value!r}")
    if wrong:
        raise UserError(f"--baseline-run {run_dir} was run with other settings: " + "; ".join(wrong))
    for name in ("metrics.jsonl", "state.safetensors", "artifact.pgolf"):
        if not (run_dir / name).is_file():
            raise UserError(f"--baseline-run {run_dir} has no {name}: was the run finished?")


# ---- comparing ----


def _baseline_state_order(baseline: Path, shape: Shape) -> list[str]:
    """The baseline model's own state_dict order (safetensors files keep names sorted)."""
    sys.path.insert(0, str(baseline))
    try:
        spec = importlib.util.spec_from_file_location("compare_baseline_model", baseline / "model.py")
        assert spec is not None and spec.loader is not None
        model_mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model_mod)
    finally:
        sys.path.remove(str(baseline))
    config = dict(
        vocab_size=shape.vocab_size,
        num_layers=shape.layers,
        model_dim=shape.dim,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        mlp_mult=shape.mlp_mult,
    )
    return list(model_mod.build_model(config).state_dict())


def compare(reference: Path, ref_dir: Path, run_dir: Path, baseline: Path, shape: Shape) -> dict[str, Any]:
    import torch

    from scoring.artifact.codecs.int8_zlib import QUANT_FORMAT
    from scoring.artifact.format import read_artifact
    from scoring.artifact.pack import read_state

    # losses
    ref_micro = json.loads((ref_dir / "losses.json").read_text(encoding="utf-8"))["micro_losses"]
    ref_steps = step_losses(ref_micro, GRAD_ACCUM_STEPS)
    metrics = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if line
    ]
    base_steps = [m["train_loss"] for m in metrics if "train_loss" in m]
    loss_rows = [
        {"step": i + 1, "reference": r, "baseline": b, "identical": r == b, "abs_diff": abs(r - b)}
        for i, (r, b) in enumerate(zip(ref_steps, base_steps, strict=False))
    ]

    # final tensors
    ref_state = torch.load(ref_dir / "final_model.pt", map_location="cpu", weights_only=True)
    base_sorted, _meta = read_state(run_dir / "state.safetensors")
    order = _baseline_state_order(baseline, shape)
    base_state = {k: base_sorted[k] for k in order if k in base_sorted}
    base_state.update({k: v for k, v in base_sorted.items() if k not in base_state})
    diffs, only_ref, only_base = compare_states(ref_state, base_state)

    # artifacts
    module = load_reference_module(reference)
    ref_ptz = (ref_dir / "final_model.int8.ptz").read_bytes()
    base_ptz = reference_artifact_bytes(module, base_state)
    ref_quant = torch.load(io.BytesIO(zlib.decompress(ref_ptz)), map_location="cpu", weights_only=True)
    artifact = read_artifact(run_dir / "artifact.pgolf")
    from safetensors.torch import load as st_load

    blob = zlib.decompress(artifact.payload)
    harness_tensors = st_load(blob)
    header_len = int.from_bytes(blob[:8], "little")
    layout = json.loads(json.loads(blob[8 : 8 + header_len])["__metadata__"]["layout"])
    ref_payload: dict[str, Any] = {}
    for name, q in ref_quant["quantized"].items():
        ref_payload[f"q.{name}"] = q
        ref_payload[f"s.{name}"] = ref_quant["scales"][name]
    for name, t in ref_quant["passthrough"].items():
        ref_payload[f"p.{name}"] = t
    payload_diffs, only_ref_payload, only_harness_payload = compare_states(ref_payload, harness_tensors)
    layout_dtypes_equal = all(
        layout["quantized"].get(n, {}).get("dtype") == d for n, d in ref_quant["dtypes"].items()
    ) and all(
        layout["passthrough"].get(n) == ref_quant.get("passthrough_orig_dtypes", {}).get(n)
        for n in ref_quant["passthrough"]
    )

    identical = (
        len(ref_steps) == len(base_steps) == shape.steps
        and all(r["identical"] for r in loss_rows)
        and not only_ref
        and not only_base
        and all(d.identical for d in diffs)
        and sha256(ref_ptz) == sha256(base_ptz)
        and not only_ref_payload
        and not only_harness_payload
        and all(d.identical for d in payload_diffs)
        and layout_dtypes_equal
        and layout.get("__quant_format__") == QUANT_FORMAT
    )
    return {
        "format": COMPARE_FORMAT,
        "format_version": COMPARE_FORMAT_VERSION,
        "identical": identical,
        "shape": asdict(shape),
        "losses": {
            "reference_steps": len(ref_steps),
            "baseline_steps": len(base_steps),
            "identical_steps": sum(r["identical"] for r in loss_rows),
            "max_abs_diff": max((r["abs_diff"] for r in loss_rows), default=0.0),
            "rows": loss_rows,
        },
        "tensors": {
            "count": len(diffs),
            "identical": sum(d.identical for d in diffs),
            "only_reference": only_ref,
            "only_baseline": only_base,
            "max_abs_diff": max((d.max_abs_diff for d in diffs), default=0.0),
            "rows": [asdict(d) for d in diffs],
        },
        "artifact": {
            "reference_ptz_sha256": sha256(ref_ptz),
            "reference_ptz_bytes": len(ref_ptz),
            "baseline_state_reference_serializer_sha256": sha256(base_ptz),
            "baseline_state_reference_serializer_bytes": len(base_ptz),
            "harness_artifact_sha256": hashlib.sha256((run_dir / "artifact.pgolf").read_bytes()).hexdigest(),
            "harness_payload_tensors": len(payload_diffs),
            "harness_payload_identical": sum(d.identical for d in payload_diffs),
            "harness_payload_only_reference": only_ref_payload,
            "harness_payload_only_harness": only_harness_payload,
            "harness_layout_dtypes_equal": layout_dtypes_equal,
        },
    }


def report_lines(result: Mapping[str, Any], head: int = 3, tail: int = 3) -> list[str]:
    losses, tensors, art = result["losses"], result["tensors"], result["artifact"]
    rows = losses["rows"]
    shown = rows if len(rows) <= head + tail else rows[:head] + [None] + rows[-tail:]
    lines = [
        f"per-step train loss: {losses['identical_steps']}/{len(rows)} steps bit-identical "
        f"(reference {losses['reference_steps']} steps, baseline {losses['baseline_steps']}), "
        f"max |diff| {losses['max_abs_diff']:.3g}",
        "  step  reference              baseline               same",
    ]
    for r in shown:
        lines.append(
            "  ..."
            if r is None
            else f"  {r['step']:>4}  {r['reference']!r:<21}  {r['baseline']!r:<21}  {'yes' if r['identical'] else 'NO'}"
        )
    lines.append(
        f"final tensors: {tensors['identical']}/{tensors['count']} bit-identical, max |diff| {tensors['max_abs_diff']:.3g}"
        + (f"; only in reference {tensors['only_reference']}" if tensors["only_reference"] else "")
        + (f"; only in baseline {tensors['only_baseline']}" if tensors["only_baseline"] else "")
    )
    for d in tensors["rows"]:
        if not d["identical"]:
            lines.append(
                f"  {d['name']} {d['dtype_a']} vs {d['dtype_b']}: max |diff| {d['max_abs_diff']:.3g}"
            )
    lines += [
        f"artifact, reference's final_model.int8.ptz:                sha256 {art['reference_ptz_sha256']} ({art['reference_ptz_bytes']} bytes)",
        f"artifact, reference's serializer on the baseline's state: sha256 {art['baseline_state_reference_serializer_sha256']} ({art['baseline_state_reference_serializer_bytes']} bytes)"
        + (
            "  identical"
            if art["reference_ptz_sha256"] == art["baseline_state_reference_serializer_sha256"]
            else "  DIFFERENT"
        ),
        f"artifact, harness int8_zlib payload vs reference's quantized tensors: {art['harness_payload_identical']}/{art['harness_payload_tensors']} "
        f"bit-identical, layout dtypes {'equal' if art['harness_layout_dtypes_equal'] else 'DIFFERENT'} "
        f"(artifact.pgolf sha256 {art['harness_artifact_sha256']}: a safetensors container, not the reference's pickle)",
        "IDENTICAL" if result["identical"] else "DIFFERENCES FOUND (see above)",
    ]
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--reference",
        required=True,
        type=Path,
        help="the reference's train_gpt.py (root or records/.../2026-03-17_NaiveBaseline)",
    )
    p.add_argument(
        "--data", required=True, type=Path, help="a pgolf dataset folder with a SentencePiece tokenizer"
    )
    p.add_argument("--out", type=Path, help="work folder (default: a new temporary folder, kept)")
    p.add_argument(
        "--baseline",
        type=Path,
        default=BASELINE,
        help="the baseline folder (default baselines/naive_baseline)",
    )
    d = Shape()
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument(
        "--batch-tokens", type=int, default=d.batch_tokens, help="tokens per step (8 micro-batches)"
    )
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--muon-warmup-steps", type=int, default=d.muon_warmup_steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default 1)")
    p.add_argument("--precision", choices=("float32", "reference"), default="float32")
    p.add_argument("--reference-adam", choices=("unfused", "fused"), default="unfused")
    p.add_argument(
        "--baseline-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="extra --set for the baseline run",
    )
    p.add_argument(
        "--baseline-run",
        type=Path,
        help="compare against this finished baseline run (a previous comparison's OUT/baseline/run) instead of running it",
    )
    p.add_argument("--json", type=Path, help="write the whole comparison here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reference = args.reference.resolve()
    if not reference.is_file():
        raise UserError(
            f"--reference {args.reference} is not a file: give the path of the reference's train_gpt.py"
        )
    sys.path.insert(0, str(REPO))
    from data.manifest import load_manifest

    try:
        manifest = load_manifest(args.data)
    except (OSError, ValueError) as e:
        raise UserError(
            f"--data {args.data} is not a pgolf dataset ({e}): build one with `pgolf data build`"
        ) from None
    tokenizer = manifest.tokenizer_path
    if tokenizer.suffix != ".model":
        raise UserError(
            f"--data {args.data} has tokenizer {tokenizer.name}; the reference needs a SentencePiece .model"
        )
    shape = Shape(
        vocab_size=manifest.vocab_size,
        layers=args.layers,
        dim=args.dim,
        heads=args.heads,
        kv_heads=args.kv_heads,
        seq_len=args.seq_len,
        batch_tokens=args.batch_tokens,
        steps=args.steps,
        muon_warmup_steps=args.muon_warmup_steps,
        seed=args.seed,
    )
    shape.check()
    work = (args.out or Path(tempfile.mkdtemp(prefix="compare_reference_"))).resolve()
    if (work / "baseline" / "run").exists() or (work / "reference").exists():
        raise UserError(f"--out {work} already holds a comparison: give a new folder")
    (work / "baseline").mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data).resolve()
    print(f"work folder {work}", flush=True)
    print(f"reference: {reference} (precision {args.precision}, Adam {args.reference_adam})", flush=True)
    ref_dir = run_reference(
        reference,
        shape,
        data_dir,
        tokenizer.resolve(),
        work / "reference",
        precision=args.precision,
        adam=args.reference_adam,
        threads=args.threads,
    )
    if args.baseline_run:
        run_dir = args.baseline_run.resolve()
        check_baseline_run(run_dir, shape, [*baseline_sets(shape, args.threads), *args.baseline_set])
        print(f"baseline: the finished run {run_dir} (its config matches)", flush=True)
    else:
        print(f"baseline: {args.baseline} (pgolf run, preset tiny + the same shape)", flush=True)
        run_dir = run_baseline(
            args.baseline.resolve(),
            shape,
            data_dir,
            work / "baseline" / "run",
            threads=args.threads,
            extra_sets=args.baseline_set,
        )
    result = compare(reference, ref_dir, run_dir, args.baseline.resolve(), shape)
    result["settings"] = {
        "reference": str(reference),
        "reference_sha256": sha256(reference.read_bytes()),
        "precision": args.precision,
        "reference_adam": args.reference_adam,
        "threads": args.threads,
        "substitutions": [what for what, _old, _new in reference_substitutions(args.precision)],
        "baseline_sets": [*baseline_sets(shape, args.threads), *args.baseline_set],
    }
    for line in report_lines(result):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_reference_worker":
        sys.exit(reference_worker(sys.argv[2]))
    try:
        sys.exit(main())
    except UserError as e:
        print(f"compare_reference: {e}", file=sys.stderr)
        sys.exit(2)
