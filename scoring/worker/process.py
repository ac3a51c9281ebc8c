"""The model worker: the only process where submitted scored code (model.py, eval.py, codec.py) runs.

    python -m scoring.worker SPEC_JSON     (started by the scorer, scoring/score/remote.py; not by hand)

It is confined before it starts (the scorer wraps it in `isolation.sandbox enter`: Landlock allows
reading its staged code, the artifact and the Python installation, writing a private temp folder,
nothing else; its own PID, mount and network namespaces where the machine allows; no capabilities,
no_new_privs; the seccomp filter of isolation/seccomp.py; on CPU an address-space limit). It has
never held validation data, and it gets only what the scorer sends: windows in plan order, and, for
score-first adaptation, the tokens of a chunk after the scorer has recorded that chunk's scores.

It decodes the artifact with its codec, checks the staged code against the artifact's hashes,
builds the model (strict load), then answers messages (scoring/worker/wire.py): a `forward` writes
the model's logits at the batch's scored positions into the shared output buffer (on CUDA page-locked
where it could be registered, scoring/worker/pinning.py: a DMA copy, waited for before the reply), `chunk_begin`/`adapt` run the eval.py hook
score-first (scoring/worker/adapt.py's ScoreFirstAdapter, in this process), `quit` ends it. Any
failure is answered with an error reply naming its kind (error, illegal, out_of_memory) before the
process exits; the scorer believes none of what it says beyond the bytes it reads itself. It starts and
ends as every confined child does (scoring/worker/child.py: the spec, the limits, one error line on
stderr, the exit status).
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scoring.statuses import Status
from scoring.worker.child import report_failure, run_child, tune_cpu_allocator
from scoring.worker.cpu_math import warm_cpu_math
from scoring.worker.pinning import registrar_for, side_record, synchronize
from scoring.worker.wire import WIRE_VERSION, SharedBuffer, check_ranges, recv, select_scored, send

WORKER_SPEC_FORMAT = "pg-worker-spec"
WORKER_SPEC_VERSION = 1
OOM_MARKERS = ("can't allocate memory", "out of memory", "CUDA out of memory", "Cannot allocate memory")


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat `oom_kill`, Linux >= 4.13;
    None: unreadable). Read by the trusted side before and after a phase: a process of the phase that died
    by SIGKILL was the OOM killer's only if this count rose (a process can SIGKILL itself; that is no
    out_of_memory). The count is the machine's, so another process's OOM kill meanwhile also counts."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def oom_killed_since(before: int | None) -> bool | None:
    """Whether the kernel's OOM killer killed anything since the reading `before` (None: cannot tell)."""
    now = kernel_oom_kills()
    return None if before is None or now is None else now > before


def error_kind(exc: BaseException) -> Status:
    """Out of memory, illegal (a broken scoring rule) or error."""
    from scoring.codecheck import CodeCheckFailure
    from scoring.worker.adapt import AdaptationViolation

    if isinstance(exc, MemoryError) or any(m in str(exc) for m in OOM_MARKERS):
        return Status.OUT_OF_MEMORY
    if isinstance(exc, AdaptationViolation | CodeCheckFailure):
        return Status.ILLEGAL
    return Status.ERROR


def _facts(memory: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "pid": os.getpid(),
        "memory_limit": memory,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("CapEff", "NoNewPrivs", "Seccomp"):
                facts[key] = value.strip()
    except OSError:
        pass
    return facts


class Worker:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.sock = socket.socket(fileno=int(spec["sock_fd"]))
        self.inbuf = SharedBuffer(int(spec["in_fd"]), int(spec["in_bytes"]))
        self.outbuf = SharedBuffer(int(spec["out_fd"]), int(spec["out_bytes"]))
        self.device = torch.device(spec["device"])
        # on CUDA both buffers page-locked (scoring/worker/pinning.py), before any submitted code runs; a buffer
        # that cannot be registered stays pageable (its reason goes in the ready reply's `crossing`)
        registrar = registrar_for(self.device)
        self.outbuf.pin(registrar)
        self.inbuf.pin(registrar)
        self.dtype = spec["dtype"]
        self.model: torch.nn.Module | None = None
        self.adapter: Any = None
        self.group: dict[str, Any] | None = None
        """The process group this worker joined (rank, world size, backend); None: alone."""

    def build(self) -> str:
        """Decode the artifact, build and load the model, load the eval.py hook; returns the output kind."""
        from scoring.artifact.format import artifact_codec, decode_state, read_artifact
        from scoring.worker.adapt import ScoreFirstAdapter, load_hook
        from scoring.worker.loading import load_model, output_kind

        if self.spec.get("legacy"):  # a reference-challenge record's script (scoring/worker/legacy.py)
            from scoring.worker.legacy import build_legacy

            self.model, _ = build_legacy(self.spec["legacy"], Path(self.spec["artifact"]), self.device)
            return output_kind(self.model)
        code = Path(self.spec["code_dir"])
        artifact = read_artifact(self.spec["artifact"])
        state = decode_state(artifact, artifact_codec(artifact, code))  # checks the code hashes first
        self.model = load_model(artifact, state, code, self.device)
        hook = load_hook(code) if self.spec.get("adapt") else None
        if hook is not None:
            # the hook runs under the scoring forward's autocast: its forward and backward see the same numerics
            self.adapter = ScoreFirstAdapter(hook[0], hook[1], autocast_bf16=self.dtype == "bfloat16")
            if self.spec.get("group"):  # several workers adapt together: their process group (group.py)
                from scoring.worker.group import join_group

                self.group = join_group(self.spec["group"], self.device)
        return output_kind(self.model)

    def forward(self, rows: int, length: int) -> list[int]:
        """The model's logits at the scored positions (the rows' ranges after the tokens in the input buffer),
        written row major [N, V] into the output buffer: only what the scorer scores crosses."""
        assert self.model is not None
        n = rows * length
        both = self.inbuf.array(np.int64, n + 2 * rows)
        ranges_B2 = check_ranges(both[n:].copy(), rows, length)
        x_BL = torch.from_numpy(both[:n]).view(rows, length).to(self.device, copy=True)
        grad = torch.no_grad if self.adapter is not None else torch.inference_mode
        with grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
            out = self.model(x_BL)
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"model forward returned {type(out).__name__}; it must return logits [batch, seq, vocab]"
            )
        if out.ndim != 3 or tuple(out.shape[:2]) != (rows, length):
            raise ValueError(
                f"model returned logits of shape {tuple(out.shape)}; expected ({rows}, {length}, V)"
            )
        V = int(out.shape[2])
        with torch.no_grad():
            out_NV = select_scored(out, ranges_B2)
        N = int(out_NV.shape[0])
        if N * V * 4 > self.outbuf.nbytes:
            raise ValueError(
                f"model returned V = {V} logits per position: more than the scorer's buffer holds"
            )
        dst_NV = self.outbuf.tensor(torch.float32, N * V).view(N, V)
        if self.outbuf.pinned:  # DMA into the page-locked buffer, complete before the reply says it is there
            dst_NV.copy_(out_NV, non_blocking=True)
            synchronize(self.device)
        else:
            dst_NV.copy_(out_NV)
        return [N, V]

    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        op = msg.get("op")
        self.inbuf.remap(int(msg.get("in_bytes", self.inbuf.nbytes)))
        if op == "forward":
            return {"reply": "ok", "shape": self.forward(int(msg["rows"]), int(msg["length"]))}
        if op == "chunk_begin":
            assert self.model is not None and self.adapter is not None
            self.adapter.before_chunk(self.model, int(msg["chunk"]))
            return {"reply": "ok"}
        if op == "adapt":
            assert self.model is not None and self.adapter is not None
            n = int(msg["n"])
            tokens = self.inbuf.array("int64", n).copy()  # a fresh array: exactly the scored tokens
            self.adapter.after_chunk(self.model, int(msg["chunk"]), tokens, int(msg["first_position"]))
            return {"reply": "ok", "adapt_time_s": self.adapter.adapt_time_s}
        if op == "quit":
            return None
        raise ValueError(f"unknown message {op!r}")

    def serve(self) -> int:
        try:
            output = self.build()
        except BaseException as e:  # noqa: BLE001 - the boundary: every failure becomes a reply
            return self._fail(e)
        send(
            self.sock,
            {
                "reply": "ready",
                "wire_version": WIRE_VERSION,
                "output": output,
                **_facts(self.memory),
                "cpu_math_warmed": self.cpu_math,
                "group": self.group,
                "crossing": side_record({"logits": self.outbuf, "tokens": self.inbuf}),
            },
        )
        while True:
            msg = recv(self.sock)
            try:
                reply = self.handle(msg)
            except BaseException as e:  # noqa: BLE001
                return self._fail(e)
            if reply is None:  # told to quit: nothing is left to say or keep, so no interpreter teardown
                sys.stdout.flush()  # (torch's takes about 0.6 s, on every worker the scorer closes)
                sys.stderr.flush()
                os._exit(0)
            send(self.sock, reply)

    memory = "none"
    cpu_math: dict[str, Any] | None = None
    """What warm_cpu_math did before the build (scoring/worker/cpu_math.py); None: not run."""

    def _fail(self, e: BaseException) -> int:
        """Answer with an error reply naming its kind, then end as every confined child does (child.py)."""
        message = "".join(traceback.format_exception(e))[-4000:]
        try:
            send(self.sock, {"reply": "error", "kind": error_kind(e), "message": message})
        except OSError:
            pass
        return report_failure(e, self.spec)


def _serve(spec: dict[str, Any], memory: str) -> int:
    if spec["device"] == "cpu":
        tune_cpu_allocator()
    # the same bits for the same input in every worker, main and probe, adaptation included (the probes compare
    # them bit for bit); with CUBLAS_WORKSPACE_CONFIG from the scorer (scoring/worker/env.py)
    torch.use_deterministic_algorithms(True)
    # and no forward pass is the math library's first call on a thread (its first can take another code path:
    # scoring/worker/cpu_math.py); after run_child set the thread count, before any submitted code runs
    warmed = warm_cpu_math()
    worker = Worker(spec)
    worker.memory = memory
    worker.cpu_math = warmed
    return worker.serve()


def main(argv: list[str]) -> int:
    return run_child(
        argv,
        spec_format=WORKER_SPEC_FORMAT,
        spec_version=WORKER_SPEC_VERSION,
        usage="python -m scoring.worker SPEC_JSON  (started by the scorer)",
        body=_serve,
    )
