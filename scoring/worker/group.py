"""A model worker's place in its group: the torch.distributed process group a distributed hook all-reduces in.

With score-first adaptation over several workers (scoring/score/pool.py), the scorer gives each worker its
rank, the group's size and a rendezvous port on 127.0.0.1 (the group's own network namespace where the
machine has them: isolation/shared_net.py). After the model and its eval.py hook are built, and before the
worker says it is ready, `join_group` makes the default process group (gloo on CPU, NCCL on CUDA), so the
hook finds `torch.distributed.is_initialized()`, `get_rank()` and `get_world_size()` as a training rank does.
Every worker of the group gets every chunk; the hook decides how to share the work (baselines/int6_era/eval.py
splits each chunk's sequences and all-reduces the gradients). The collectives are torch's own; what the scorer
compares (scoring/score/probes.py) are the logits, bit for bit, from a fresh group of the same size.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 300.0
"""How long a worker waits for the rest of its group (they build at once; the eval clock bounds them anyway)."""


def join_group(group: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Make the default process group of this worker's group; what it made, for the ready reply."""
    rank, world, port = int(group["rank"]), int(group["world_size"]), int(group["port"])
    if not 0 <= rank < world or not 0 < port < 65536:
        raise ValueError(f"bad group spec {group!r}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        if device.index is None:  # the scorer names every worker's GPU; "cuda" alone is the current one
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # NCCL binds the group to this worker's own GPU at once
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S),
        **kwargs,
    )
    return {"rank": rank, "world_size": world, "backend": backend}
