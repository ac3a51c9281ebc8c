"""One training rank, started by torchrun: `python -m harness.train.rank SPEC.json` (inside the sandbox).

It sets up the process (threads, seeds, TF32, device, process group: NCCL with one GPU per rank,
gloo on CPU), connects to its node's supervisor over the wire (harness/train/wire.py: the spec names
the socket and the phase's secret), installs the access monitor (isolation/sandbox.py), builds the
TrainContext from the spec the supervisor wrote, starts the clock on every rank at once (the
supervisor timestamps it), then imports the submission's train.py and calls train(ctx). The training
shards are outside the sandbox: ctx.data asks the supervisor for their descriptors on the first batch.

When train(ctx) returns, global rank 0 saves the returned state as safetensors (no pickle) in the
phase's output folder, the only folder it may write, and hands it over (`done` with state: the
supervisor moves it out of reach and stops the clock there); the other ranks say `done`. Then local
rank 0 of each node writes train.json: what the rank saw (steps, tokens, its own clock readings as
`rank_reported_*`), informational only; the figures that count are the supervisor's.

Exceptions from the submission are caught here, at the boundary: the traceback goes to
OUT/train_error_rank{R}.txt and the rank exits non-zero (without a barrier, which would hang on the
other ranks; torchrun then stops them). On success every rank passes a barrier before destroying the
process group: gloo ranks that tear down without one crashed at exit in 3 of 9 runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import sys
import time
import traceback
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from data.loader import OnDemandTokenStream
from data.records import Types, field, require_format
from harness.api import API_VERSION, DistInfo, TrainContext, TrainingComplete, TrainResult
from harness.train.clock import DataGate, HarnessClock
from harness.train.cpu import CpuTuner, read_facts
from harness.train.gptq import apply_gptq, codec_bits, scored_model
from harness.train.gptq_config import GptqConfig
from harness.train.submitted import import_submission_file
from harness.train.wire import WireClient
from isolation.monitor import monitor_from_rules

STATE_FILE = "state.safetensors"
TRAIN_RECORD = "train.json"
METRICS_FILE = "metrics.jsonl"
RANK_INT_MAX = 2**63
"""Every integer of train.json is below it (an int64: steps, tokens, counts)."""
TRAIN_FORMAT = "pg-train"
TRAIN_FORMAT_VERSION = 4
SPEC_FORMAT = "pg-train-spec"
SPEC_FORMAT_VERSION = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class RankReport:
    """train.json ("pg-train"): what a rank says it saw. Written by local rank 0 of each node (main below);
    read by the supervisor (harness/run/train_phase.py read_rank_record) as hostile input: every field is
    optional (None when absent), checked when present, and only recorded, never believed for time."""

    format: str = TRAIN_FORMAT
    format_version: int = TRAIN_FORMAT_VERSION
    api_version: int | None = None
    role: str | None = None
    status: str | None = None
    rank_reported_train_s: float | None = None
    rank_reported_off_clock_s: float | None = None
    rank_reported_warmup: dict[str, Any] | None = dataclasses.field(default=None, metadata={"null": True})
    """The warm-up the rank reports; null (written always) when it did none."""
    rank_setup_s: float | None = None
    rank_save_s: float | None = None
    steps: int | None = None
    stopped_by_clock: bool | None = None
    predicted_stop: dict[str, Any] | None = None
    """The clock stopped before its budget was spent: the elapsed time and the last step's duration."""
    ticks_after_stop: int | None = None
    batches_after_stop: int | None = None
    tokens_seen: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    threads_per_rank: int | None = None
    process: dict[str, Any] | None = None
    train_shards_used: int | None = None
    train_shard_names: list[str] | None = None
    train_tokens_available: int | None = None
    cpu: dict[str, Any] | None = None
    """ctx.cpu's report (harness/train/cpu.py): the CPU's facts and the step mode the run chose."""
    gptq: dict[str, Any] | None = dataclasses.field(default=None, metadata={"null": True})
    """The GPTQ pack step's record (harness/train/gptq.py), where pack.gptq_batches asked for it."""

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (rank_reported_warmup always: null when the rank did no warm-up)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None or f.name == "rank_reported_warmup"
        }

    @classmethod
    def from_json(cls, d: object) -> Self:
        """A rank's train.json, checked: known fields of the right type, finite and non-negative numbers,
        role main or secondary_node; unknown keys are dropped. ValueError names the field."""
        what = "train.json"
        d = require_format(d, what, TRAIN_FORMAT, TRAIN_FORMAT_VERSION)
        values = {
            k: field(d, k, types, what, required=False, finite=True, non_negative=True)
            for k, types in RANK_REPORT_FIELDS.items()
        }
        for k, v in values.items():  # an int no float holds raised OverflowError in what reads the result
            if isinstance(v, int) and not isinstance(v, bool) and v >= RANK_INT_MAX:
                shown = str(v) if len(str(v)) <= 40 else f"{str(v)[:40]}... ({len(str(v))} digits)"
                raise ValueError(f"{what} field {k!r} = {shown} is not below 2**63")
        if values["role"] not in (None, "main", "secondary_node"):
            raise ValueError(
                f"{what} field 'role' = {str(values['role'])[:80]!r} is not main or secondary_node"
            )
        report = cls(**values)
        try:
            json.dumps(report.to_json(), allow_nan=False)
        except ValueError as e:
            raise ValueError(f"{what} holds a non-finite number: {e}") from None
        return report


def _json_types(hint: Any, null: bool) -> Types:
    """The JSON types of a field annotated `hint` (T | None): T's (a float also an int), null where `null`."""
    (t,) = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(t) or t
    types: tuple[type, ...] = (int, float) if base is float else (base,)
    if null:
        return (*types, type(None))
    return types if len(types) > 1 else types[0]


RANK_REPORT_FIELDS: dict[str, Types] = {
    f.name: _json_types(typing.get_type_hints(RankReport)[f.name], f.metadata.get("null", False))
    for f in fields(RankReport)
    if f.name not in ("format", "format_version")
}
"""The fields of train.json with their JSON types (numbers finite and non-negative), derived from RankReport's
annotations (`T | None`: absent is None; present it is a T, or null where the field's metadata says so); any
other key is dropped."""


class RankLogger:
    """harness.api.Logger: rank 0 prints lines and appends metrics to metrics.jsonl."""

    def __init__(self, is_main: bool, out_dir: Path):
        self.is_main = is_main
        self.metrics_path = out_dir / METRICS_FILE

    def info(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def metrics(self, step: int, **values: float) -> None:
        if self.is_main:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()}}) + "\n")


def setup_process(device_kind: str, threads: int, seed: int) -> DistInfo:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(threads)
    if device_kind == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}. "
                "HINT: --nproc (launch.nproc_per_node) must be at most the GPUs per node"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    else:
        device = torch.device("cpu")
    backend = "none"
    if world > 1:
        backend = "nccl" if device_kind == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(minutes=10)}
        if device_kind == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every rank alike: the same initial weights everywhere
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


def state_of(result: TrainResult | None) -> dict[str, torch.Tensor]:
    if isinstance(result, nn.Module):
        mod = getattr(result, "module", result)  # unwrap DDP
        mod = getattr(mod, "_orig_mod", mod)  # unwrap torch.compile
        state = mod.state_dict()
    elif isinstance(result, Mapping):
        state = dict(result)
    else:
        raise TypeError(
            f"train(ctx) returned {type(result).__name__}; return the nn.Module or its state dict"
        )
    out = {}
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"state entry {k!r} is {type(v).__name__}, not a tensor")
        out[k] = v.detach().to("cpu").contiguous()
    return out


def _write_json(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _process_facts() -> dict[str, Any]:
    """What this process can do, from /proc/self/status (evidence that the sandbox took hold)."""
    facts: dict[str, Any] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapBnd", "NoNewPrivs", "Uid"):
                facts[key] = value.strip()
    except OSError:
        pass
    return facts


def _rank_failed(info: DistInfo, out_dir: Path, what: str) -> int:
    """Record the exception being handled (OUT/train_error_rank{R}.txt and stderr) and end this rank."""
    (out_dir / f"train_error_rank{info.rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
    print(f"rank {info.rank}: {what} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    if info.distributed:
        os._exit(1)  # a barrier would hang on the other ranks; torchrun stops them
    return 1


def agree_on_data(info: DistInfo, identity: str | None) -> None:
    """Every rank trains on the same tokens: on several nodes each reads its own dataset, so before the first step
    the ranks compare what their nodes' supervisors staged (the spec's data_identity) and all stop with one
    message naming the ranks whose data differs from rank 0's."""
    if not info.distributed or identity is None:
        return
    seen: list[Any] = [None] * info.world_size
    dist.all_gather_object(seen, (identity, os.uname().nodename))
    problem = data_mismatch(seen)
    if problem:
        raise ValueError(problem)


def data_mismatch(seen: list[tuple[str, str]]) -> str | None:
    """None when every rank's (data identity, host) has rank 0's identity, else the one-line error."""
    first = seen[0][0]
    odd = [(r, host, ident) for r, (ident, host) in enumerate(seen) if ident != first]
    if not odd:
        return None
    names = ", ".join(f"rank {r} on {host} ({ident[:12]})" for r, host, ident in odd[:4])
    more = f" and {len(odd) - 4} more" if len(odd) > 4 else ""
    return (
        f"the nodes' training data differ: {names}{more} against rank 0 on {seen[0][1]} ({first[:12]}). "
        "HINT: give every node the same dataset (the same manifest.json and shards; `pgolf data verify DIR` on "
        "each prints its hashes)"
    )


def _agree(info: DistInfo, values: list[float]) -> list[float]:
    """All-reduce MAX of a few numbers, so every rank records the same."""
    t = torch.tensor(values, dtype=torch.float64)
    if info.distributed:
        dev = t.to(info.device) if info.backend == "nccl" else t
        dist.all_reduce(dev, op=dist.ReduceOp.MAX)
        t = dev.cpu()
    return t.tolist()


def main(spec_path: str) -> int:
    t_enter = time.perf_counter()
    gptq_record: dict[str, Any] | None = None
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if spec.get("format") != SPEC_FORMAT or spec.get("format_version") != SPEC_FORMAT_VERSION:
        raise ValueError(f"{spec_path} is not a {SPEC_FORMAT} v{SPEC_FORMAT_VERSION} spec")
    out_dir = Path(spec["out_dir"])
    info = setup_process(spec["device"], spec["threads"], spec["seed"])
    facts = read_facts()  # reads /proc/cpuinfo and sysfs: before the access monitor, so not an "attempt"
    wire = WireClient.connect(spec["wire"], rank=info.rank, local_rank=info.local_rank)
    if spec.get("monitor_rules") is not None:
        sys.addaudithook(monitor_from_rules(spec["monitor_rules"], info.rank, spec["submission_dir"]))
    stream = OnDemandTokenStream(wire.data, info.rank, info.world_size, info.device, pin_memory=True)
    gptq = spec.get("gptq")
    gptq_cfg = GptqConfig(**{k: v for k, v in gptq.items() if k != "codec"}) if gptq else None
    # the GPTQ step's reserve comes off the submission's budget; the supervisor's own clock is the run's
    budget_s = spec["budget_s"] - (gptq_cfg.reserve_s if gptq_cfg else 0.0)
    clock = HarnessClock(budget_s, info, wire, spec["warmup_max_s"])
    gate = DataGate(stream, clock)
    log = RankLogger(info.is_main, out_dir)
    scratch = out_dir / "scratch" / f"rank{info.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    cpu = CpuTuner(
        facts,
        clock=clock,
        world_size=info.world_size,
        gpu=info.device.type == "cuda",
        log=log.info,
    )
    ctx = TrainContext(
        hparams=spec["hparams"],
        model_config=spec["model_config"],
        data=gate,
        dist=info,
        clock=clock,
        log=log,
        seed=spec["seed"],
        vocab_size=spec["vocab_size"],
        submission_dir=Path(spec["submission_dir"]),
        scratch_dir=scratch,
        cpu=cpu,
    )
    setup_s = time.perf_counter() - t_enter
    try:
        # several nodes: the same tokens everywhere, or none starts
        agree_on_data(info, spec.get("data_identity"))
    except ValueError:
        return _rank_failed(info, out_dir, "the data check")
    try:
        clock.start()  # before the submission's code is imported: its module-level work is on the clock
        module = import_submission_file(Path(spec["submission_dir"]) / "train.py", "pgolf_submission_train")
        train_fn = getattr(module, "train", None)
        if not callable(train_fn):
            raise ValueError(f"{spec['submission_dir']}/train.py must define train(ctx)")
        try:
            result = train_fn(ctx)
        except TrainingComplete as done:
            result = done.result
        clock.sync()
        rank_train_s = clock.elapsed_s()
        state = state_of(result) if info.is_main else {}
        if gptq_cfg is not None and info.is_main:  # on the clock: the handover below stops it
            model = scored_model(Path(spec["submission_dir"]), spec["model_config"], info.device)
            state, gptq_record = apply_gptq(
                state,
                model=model,
                codec_roles=codec_bits(gptq["codec"]),
                next_batch=stream.next_batch,  # the harness's own read, after the submission's last batch
                cfg=gptq_cfg,
                log=log.info,
            )
            gptq_record["submission_budget_s"] = budget_s
            del model
    except Exception:  # noqa: BLE001 - the boundary: any submission failure is recorded, not raised
        return _rank_failed(info, out_dir, "train(ctx)")
    rank_train_s, after_stop, ticks_after = _agree(
        info, [rank_train_s, gate.batches_after_stop, clock.ticks_after_stop]
    )
    save_s = 0.0
    hand_over = info.is_main and spec.get("save_state", True)
    if hand_over:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        tmp = out_dir / f".{STATE_FILE}.tmp"
        save_file(
            state, str(tmp), metadata={"model_config": json.dumps(spec["model_config"], sort_keys=True)}
        )
        os.replace(tmp, out_dir / STATE_FILE)
        save_s = time.perf_counter() - t0
    wire.done(state=hand_over)  # with the state: the supervisor takes it, and its clock stops here
    if info.local_rank == 0:
        warm = clock.warmup_report
        report = RankReport(
            api_version=API_VERSION,
            role="main" if info.is_main else "secondary_node",
            status="ok",
            rank_reported_train_s=rank_train_s,
            rank_reported_off_clock_s=clock.off_clock_s,
            rank_reported_warmup=warm._asdict() if warm else None,
            rank_setup_s=setup_s,
            rank_save_s=save_s,
            steps=clock.steps,
            stopped_by_clock=clock.last.stop,
            predicted_stop=clock.predicted_stop,
            ticks_after_stop=int(ticks_after),
            batches_after_stop=int(after_stop),
            tokens_seen=stream.tokens_consumed,
            world_size=info.world_size,
            backend=info.backend,
            device=str(info.device.type),
            threads_per_rank=torch.get_num_threads(),
            process=_process_facts(),
            cpu=cpu.report(),
            gptq=gptq_record,
        )
        _write_json(out_dir / TRAIN_RECORD, report.to_json())
    if info.distributed:
        dist.barrier()  # without it, gloo ranks tearing down at once can crash at exit
        dist.destroy_process_group()
    wire.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m harness.train.rank SPEC.json  (started by `pgolf run`, not by hand)")
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # past the interpreter's teardown: every record is written and the group destroyed, and gloo's threads torn
    # down at exit aborted a rank that had finished (SIGABRT, "terminate called without an active exception": the
    # run was `error`, seen once in a loaded CI run of two gloo ranks)
    os._exit(code)
