"""One training rank, started by torchrun: `python -m harness.worker SPEC.json`.

It sets up the process (threads, seeds, device, process group), builds the TrainContext from
the spec the supervisor wrote, calls the submission's train(ctx) with the harness's clock, and
rank 0 saves the returned state as safetensors (no pickle) with the model config in its metadata.
Exceptions from the submission are caught here, at the boundary: the traceback goes to
RUN_DIR/train_error_rank{R}.txt and the rank exits non-zero.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from data.loader import DistributedTokenLoader
from data.manifest import load_manifest
from harness.api import DistInfo, TrainContext, TrainingComplete, TrainResult
from harness.budget import HarnessClock
from scoring.loading import import_file

STATE_FILE = "state.safetensors"
TRAIN_RECORD = "train.json"
TRAIN_FORMAT = "pg-train"
TRAIN_FORMAT_VERSION = 1


class RankLogger:
    """harness.api.Logger: rank 0 prints lines and appends metrics to metrics.jsonl."""

    def __init__(self, is_main: bool, run_dir: Path):
        self.is_main = is_main
        self.metrics_path = run_dir / "metrics.jsonl"

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
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
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
    torch.manual_seed(seed)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


def state_of(result: TrainResult | None) -> dict[str, torch.Tensor]:
    if isinstance(result, nn.Module):
        mod = getattr(result, "module", result)  # unwrap DDP
        mod = getattr(mod, "_orig_mod", mod)  # unwrap torch.compile
        state = mod.state_dict()
    elif isinstance(result, Mapping):
        state = dict(result)
    else:
        raise TypeError(f"train(ctx) returned {type(result).__name__}; return the nn.Module or its state dict")
    out = {}
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"state entry {k!r} is {type(v).__name__}, not a tensor")
        out[k] = v.detach().to("cpu").contiguous()
    return out


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    run_dir = Path(spec["run_dir"])
    info = setup_process(spec["device"], spec["threads"], spec["seed"])
    manifest = load_manifest(spec["data_dir"])
    paths = manifest.shard_paths("train")
    if spec["train_shards"]:
        paths = paths[: spec["train_shards"]]
    loader = DistributedTokenLoader(paths, info.rank, info.world_size, info.device, pin_memory=True)
    clock = HarnessClock(spec["budget_s"], info, run_dir)
    log = RankLogger(info.is_main, run_dir)
    scratch = run_dir / "scratch" / f"rank{info.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = TrainContext(
        hparams=spec["hparams"],
        model_config=spec["model_config"],
        data=loader,
        dist=info,
        clock=clock,
        log=log,
        seed=spec["seed"],
        vocab_size=manifest.vocab_size,
        submission_dir=Path(spec["submission_dir"]),
        scratch_dir=scratch,
    )
    status = "ok"
    try:
        module = import_file(Path(spec["submission_dir"]) / "train.py", "pgolf_submission_train")
        train_fn = getattr(module, "train", None)
        if not callable(train_fn):
            raise ValueError(f"{spec['submission_dir']}/train.py must define train(ctx)")
        clock.start()
        try:
            result = train_fn(ctx)
        except TrainingComplete as done:
            result = done.result
        train_time_s = clock.elapsed_s()
        state = state_of(result) if info.is_main else {}
    except Exception:  # noqa: BLE001 - the boundary: any submission failure is recorded, not raised
        (run_dir / f"train_error_rank{info.rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        print(f"rank {info.rank}: train(ctx) failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if info.distributed:
            os._exit(1)  # a barrier would hang on the other ranks; the supervisor tears the group down
        return 1
    if info.is_main:
        t0 = time.perf_counter()
        tmp = run_dir / f".{STATE_FILE}.tmp"
        save_file(state, str(tmp), metadata={"model_config": json.dumps(spec["model_config"], sort_keys=True)})
        os.replace(tmp, run_dir / STATE_FILE)
        record = {
            "format": TRAIN_FORMAT,
            "format_version": TRAIN_FORMAT_VERSION,
            "status": status,
            "train_time_s": train_time_s,
            "steps": clock.steps,
            "tokens_seen": loader.tokens_consumed,
            "train_shards_used": loader.num_shards,
            "world_size": info.world_size,
            "backend": info.backend,
            "device": str(info.device.type),
            "threads_per_rank": torch.get_num_threads(),
            "save_time_s": time.perf_counter() - t0,
        }
        tmp = run_dir / f".{TRAIN_RECORD}.tmp"
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, run_dir / TRAIN_RECORD)
    if info.distributed:
        dist.barrier()  # without it, gloo ranks tearing down at once can crash at exit
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m harness.worker SPEC.json  (started by `pgolf run`, not by hand)")
    sys.exit(main(sys.argv[1]))
