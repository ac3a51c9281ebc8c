"""The scorer's side of a model worker: start it confined, send it windows, read its logits.

`start_worker(cfg)` plans the worker's sandbox (isolation/sandbox.py: Landlock reads of the staged
code, the artifact and the Python installation only, one private writable temp folder; PID, mount
and network namespaces where the machine allows; no capabilities; the seccomp filter), creates the
socket pair and the two shared buffers (scoring/worker/wire.py) and starts `python -m
scoring.worker` inside it. Its output goes through a pipe the scorer owns (kept, bounded, for the
record), never to a file the worker could truncate.

`WorkerModel` is what the evaluator and the probes call (scoring/score/evaluate.py's Scorable):
`scored_logits(x_BL, ranges)` writes the batch and each row's scored range into the input buffer,
asks for a forward pass, checks the reply's shape and returns its own copy of the logits at those
positions only ([N, V]; `logits(x_BL)` asks for every position). On CUDA the output buffer is page-locked
where it can be (scoring/worker/pinning.py; the worker does the same on its side): the copy is then a DMA
into a device tensor of the scorer's own, waited for before it is read; `crossing_record` says which path
each side took. It is also the score-first adapter: `after_chunk` hands the worker
a chunk's tokens only after the scorer has recorded the chunk's scores. Every wait has a deadline:
past it the worker is killed (EvalDeadline). A worker error reply, a crash, a broken message or a
death by signal becomes a WorkerFailure with a verdict kind.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.io import remove_tree
from data.manifest import dataset_locations
from isolation.processes import die_with_parent, kill_group_reaped
from isolation.sandbox import SandboxPlan, plan_sandbox
from scoring.statuses import Status
from scoring.worker.child import printable_lines
from scoring.worker.confined import (
    PRIVATE_DIRS,
    PROJECT_ROOT,
    WORKER_ISOLATION,
    OutputTail,
    confined_import_path,
    worker_env,
)
from scoring.worker.env import names
from scoring.worker.pinning import CROSSING_VERSION, PAGEABLE, PINNED, registrar_for, side_record, synchronize
from scoring.worker.process import WORKER_SPEC_FORMAT, WORKER_SPEC_VERSION, kernel_oom_kills, oom_killed_since
from scoring.worker.wire import (
    ProtocolError,
    Reply,
    SharedBuffer,
    WorkerGone,
    check_ranges,
    recv,
    send,
    socket_pair,
)

READY_TIMEOUT_S = 300.0


class WorkerFailure(RuntimeError):
    """The worker failed; `kind` is the verdict: error, illegal, out_of_memory."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class EvalDeadline(RuntimeError):
    """The evaluation ran past its budget (+ grace): the worker was killed."""


GROUP_ENV = {
    "GLOO_SOCKET_IFNAME": "lo",
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
}
"""What a group's workers are given (scoring/worker/group.py). They meet on loopback, on one node; /dev/shm is
each one's own, so no SHM transport; no InfiniBand probing. The probes compare a fresh group's logits with the
scored ones bit for bit, after the fresh group replays the adaptation: its all-reduces must sum in the same
order, so NCCL's algorithm and protocol are fixed (ring, simple) and NVLink SHARP, which reduces in the switch,
is off."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerGroup:
    """This worker's place in a group of workers whose adaptation hook may talk (scoring/worker/group.py)."""

    rank: int
    world_size: int
    port: int
    """The TCP port of the group's rendezvous on 127.0.0.1."""
    net_fd: int | None = None
    """A descriptor of the network namespace the group shares (isolation/shared_net.py SharedNet.fd, passed to
    the worker's sandbox); None: the host's loopback (no network namespaces here, or the sandbox off)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    code_dir: Path
    """The staged scored code (no train.py), checked against the artifact's hashes by the worker."""
    artifact: Path
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 0
    vocab_size: int
    max_tokens_per_batch: int
    """Rows x length of the largest batch: sizes the buffers."""
    adapt: bool = False
    """Load eval.py's hook and accept chunk_begin/adapt messages."""
    sandbox: str = "auto"
    """auto (every layer the machine offers), required (refuse without Landlock), off (recorded)."""
    protected: tuple[Path, ...] = ()
    """Folders no rule may reach (the dataset the validation view was made from)."""
    private: tuple[Path, ...] = ()
    """Folders out of every broad read rule (the folder of the run whose artifact this is: the other runs, the
    ledger); the machine's dataset locations always are."""
    memory_limit_bytes: int = 0
    """CPU: the worker's address-space limit (0: none)."""
    workdir: Path | None = None
    """Parent of the worker's private temp folder (default: the system temp folder)."""
    allow_missing_layers: tuple[str, ...] = ()
    """Isolation layers an official accepts as missing under sandbox 'required' (recorded)."""
    role: str = "main"
    """"main" (scores every window) or "probe" (a fresh worker for one probe batch)."""
    group: WorkerGroup | None = None
    """With score-first adaptation over several workers: this one's rank in their group (scoring/score/pool.py)."""
    legacy: dict[str, Any] | None = None
    """A reference-challenge record instead of staged code: {"script", "gpt_kwargs", "gpt_call",
    "hyperparameters"} (scoring/score/legacy.py; built by scoring/worker/legacy.py)."""


class WorkerModel:
    """A model that lives in a confined worker process (see the module docstring)."""

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.max_vocab = max(2 * cfg.vocab_size, cfg.vocab_size + 1024)
        # no role in any name the worker can see: a probe worker looks like the main one
        self._tmp = Path(tempfile.mkdtemp(prefix="pgolf-worker-", dir=cfg.workdir))
        for d in PRIVATE_DIRS:
            (self._tmp / d).mkdir(parents=True)
        self.inbuf = SharedBuffer.create("in", cfg.max_tokens_per_batch * 8)
        self.outbuf = SharedBuffer.create("out", cfg.max_tokens_per_batch * self.max_vocab * 4)
        self.sock, child = socket_pair()
        self.plan: SandboxPlan = plan_sandbox(
            mode=cfg.sandbox,
            device=cfg.device,
            project_root=PROJECT_ROOT,
            read_paths=[cfg.code_dir, cfg.artifact],
            write_paths=[self._tmp],
            protected=cfg.protected,
            # another dataset of the same documents holds the validation text too
            private=[*cfg.private, *dataset_locations()],
            import_path=confined_import_path(),
            allow_missing=cfg.allow_missing_layers,
            phase="model worker",
            **WORKER_ISOLATION,
        )
        group = cfg.group
        if group is not None and group.net_fd is not None:
            self.plan = dataclasses.replace(self.plan, join_net=group.net_fd)
        net_fds = () if self.plan.joined_net is None else (self.plan.joined_net,)  # for nsenter, then closed
        spec = {
            "format": WORKER_SPEC_FORMAT,
            "format_version": WORKER_SPEC_VERSION,
            "sock_fd": child.fileno(),
            "in_fd": self.inbuf.fd,
            "in_bytes": self.inbuf.nbytes,
            "out_fd": self.outbuf.fd,
            "out_bytes": self.outbuf.nbytes,
            "code_dir": str(cfg.code_dir),
            "artifact": str(cfg.artifact),
            "device": cfg.device,
            "dtype": cfg.dtype,
            "threads": cfg.threads,
            "adapt": cfg.adapt,
            "memory_limit_bytes": cfg.memory_limit_bytes,
            "legacy": cfg.legacy,
            "group": None
            if group is None
            else {"rank": group.rank, "world_size": group.world_size, "port": group.port},
        }
        # -P: no working folder on sys.path (what the worker writes cannot shadow an import); -B: no bytecode
        cmd = [sys.executable, "-P", "-B", "-m", "scoring.worker", json.dumps(spec)]
        policy = self._tmp.with_name(self._tmp.name + "-policy.json")  # outside the worker's own folder
        self.env = worker_env(self._tmp, cfg.threads)  # an allow-list: nothing else of the official's
        if group is not None:
            self.env.update(GROUP_ENV)
        self._oom_kills = kernel_oom_kills()  # the kernel's count before: a SIGKILL is its only if it rose
        self.proc = subprocess.Popen(
            self.plan.wrap(cmd, policy),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(child.fileno(), self.inbuf.fd, self.outbuf.fd, *net_fds),
            env=self.env,
            cwd=self._tmp / "home",
            start_new_session=True,
            preexec_fn=die_with_parent,  # the scorer killed: its workers die with it
        )
        child.close()
        self.output = OutputTail()
        self._drain = threading.Thread(target=self.output.drain, args=(self.proc.stdout,), daemon=True)
        self._drain.start()
        self.output_kind = ""
        self.facts: dict[str, Any] = {}
        self.deadline: float | None = None
        """time.monotonic() past which a wait kills the worker (EvalDeadline); None: READY_TIMEOUT_S per wait."""
        self.forwards = 0
        self._pending: tuple[int, torch.device] | None = None
        self.bytes_read = 0
        """Bytes of logits read out of the worker's answers (the scored positions' [N, V] float32)."""
        self.bytes_sent = 0
        """Bytes of batches written for the worker (int64 token ids and scored ranges)."""
        self._pin_asked = False
        self._started = False
        self._adapt_s = 0.0
        self.delivered: list[tuple[int, int]] = []
        self.chunk_replay_s: list[float] = []
        """Seconds per adaptation chunk, chunk_begin and adapt, by this process's clock: what a probe worker's
        replay of that chunk repeats (scoring/score/probes.py bounds the replays with it)."""
        self._chunk_t0 = 0.0

    # ---- talking to it ----

    def _timeout(self) -> float:
        if self.deadline is None:
            return READY_TIMEOUT_S
        return max(self.deadline - time.monotonic(), 0.001)

    def _ask(self, msg: dict[str, Any] | None) -> Reply:
        try:
            if msg is not None:
                send(self.sock, {**msg, "in_bytes": self.inbuf.nbytes})
            reply = Reply.parse(recv(self.sock, self._timeout()))
        except TimeoutError:
            self.kill()
            if self.deadline is not None:
                raise EvalDeadline(
                    "the evaluation ran past its budget: the model worker was killed"
                ) from None
            raise WorkerFailure(
                Status.ERROR, f"the model worker did not answer within {READY_TIMEOUT_S:.0f} s"
            ) from None
        except (WorkerGone, ConnectionError, OSError):
            raise self._died() from None
        except ProtocolError as e:
            self.kill()
            raise WorkerFailure(Status.ERROR, f"the model worker broke the protocol: {e}") from None
        if reply.kind == "error":
            self.kill()
            raise WorkerFailure(reply.fields["kind"], reply.fields["message"])
        return reply

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            send(self.sock, {**msg, "in_bytes": self.inbuf.nbytes})
        except (WorkerGone, ConnectionError, OSError):
            raise self._died() from None

    def _died(self) -> WorkerFailure:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        self._drain.join(timeout=2)
        # the worker's own words, shown as text wherever they go (a record, the scorer's stderr, a terminal)
        tail = printable_lines(self.output.text()[-2000:])
        if code is not None and code < 0 and -code == signal.SIGKILL:
            # the kernel's OOM killer ends a process with SIGKILL, but so can the worker itself: out_of_memory
            # only when the kernel's own count of OOM kills rose meanwhile (this side's reading, not the worker's)
            if oom_killed_since(self._oom_kills):
                return WorkerFailure(
                    Status.OUT_OF_MEMORY,
                    f"the model worker was killed by the kernel's OOM killer (SIGKILL):\n{tail}",
                )
            return WorkerFailure(
                Status.ERROR,
                "the model worker died by SIGKILL that neither the scorer nor the kernel's OOM killer sent "
                f"(/proc/vmstat oom_kill did not rise):\n{tail}",
            )
        return WorkerFailure(Status.ERROR, f"the model worker exited with status {code}:\n{tail}")

    def start(self) -> None:
        """Let it import torch and build the model (it waits for this; see scoring/worker/__main__.py)."""
        if not self._started:
            self._started = True
            try:
                send(self.sock, {"op": "start"})
            except OSError:
                raise self._died() from None

    def wait_ready(self) -> None:
        self.start()
        reply = self._ask(None)
        if reply.kind != "ready" or reply.fields.get("output") not in ("logits", "log_probs"):
            self.kill()
            raise WorkerFailure(
                Status.ERROR, f"the model worker's first message was not a valid ready: {reply.fields}"
            )
        self.output_kind = reply.fields["output"]
        self.facts = {k: v for k, v in reply.fields.items() if k not in ("reply", "output")}

    # ---- Scorable: what evaluate() and the probes call ----

    def logits(self, x_BL: torch.Tensor) -> torch.Tensor:
        """[B, L, V] float32 logits at every position (tools and benches; the evaluation asks for the
        scored positions only, `scored_logits`)."""
        B, L = x_BL.shape
        ranges_B2 = np.zeros((B, 2), dtype=np.int64)
        ranges_B2[:, 1] = L
        out_NV = self.scored_logits(x_BL, ranges_B2)
        return out_NV.view(B, L, out_NV.shape[1])

    def scored_logits(self, x_BL: torch.Tensor, ranges_B2: np.ndarray) -> torch.Tensor:
        """[N, V] float32 logits of the worker's model at the positions of each row's range [from, to), row
        by row: the scorer's own copy, read from the shared buffer at once when the worker answers. The worker
        keeps its mapping of that buffer (a thread of its could go on writing after the answer), so nothing is
        computed from the buffer itself: every batch is read once, the same way, whether or not it is a probe
        batch, and what is scored is what the probes compare. Only these positions cross: a sliding window's
        context does not (`bytes_read` counts what did)."""
        self.submit(x_BL, ranges_B2)
        return self.collect()

    def submit(self, x_BL: torch.Tensor, ranges_B2: np.ndarray, device: torch.device | None = None) -> None:
        """Send a batch and its scored ranges for a forward pass without waiting for it (`collect` reads the
        answer, onto `device`, default x_BL's): several workers compute at once (scoring/score/pool.py)."""
        B, L = x_BL.shape
        ranges_B2 = check_ranges(ranges_B2, B, L)
        n = B * L
        need = (n + 2 * B) * 8
        if need > self.inbuf.nbytes:
            self.inbuf.grow(need)
        both = self.inbuf.array(np.int64, n + 2 * B)
        both[:n] = x_BL.reshape(-1).cpu().numpy()
        both[n:] = ranges_B2.reshape(-1)
        self.bytes_sent += need
        self._send({"op": "forward", "rows": B, "length": L})
        self._pending = (int((ranges_B2[:, 1] - ranges_B2[:, 0]).sum()), device or x_BL.device)

    def collect(self) -> torch.Tensor:
        """The answer to the batch `submit` sent: [N, V] float32, the scorer's own copy (see scored_logits)."""
        assert self._pending is not None, "collect() without a submit()"
        N, device = self._pending
        self._pending = None
        reply = self._ask(None)
        _, V = reply.shape(N, self.cfg.vocab_size, self.max_vocab)
        self.forwards += 1
        self.bytes_read += N * V * 4
        if not self._pin_asked:  # once, for the device the scorer computes on (a shard's worker has its own)
            self._pin_asked = True
            self.outbuf.pin(registrar_for(device))
        out = self.outbuf.tensor(torch.float32, N * V).view(N, V)
        if self.outbuf.pinned:
            # DMA from the page-locked buffer into a tensor of the scorer's own, waited for before anything reads
            # it: what is scored is that copy, never memory the worker can still write
            own = torch.empty((N, V), dtype=torch.float32, device=device)
            own.copy_(out, non_blocking=True)
            synchronize(device)
            return own
        return out.clone() if device.type == "cpu" else out.to(device)

    # ---- ChunkAdapter: score-first adaptation in the worker ----

    @property
    def adapt_time_s(self) -> float:
        return self._adapt_s

    def before_chunk(self, model: Any, chunk: int) -> None:
        t0 = time.perf_counter()
        self._ask({"op": "chunk_begin", "chunk": chunk})
        self._chunk_t0 = time.perf_counter() - t0

    def after_chunk(self, model: Any, chunk: int, scored_tokens: np.ndarray, first_position: int) -> None:
        n = int(scored_tokens.size)
        if n * 8 > self.inbuf.nbytes:
            self.inbuf.grow(n * 8)
        self.inbuf.array(np.int64, n)[:] = scored_tokens
        t0 = time.perf_counter()
        self._ask({"op": "adapt", "chunk": chunk, "n": n, "first_position": first_position})
        took = time.perf_counter() - t0
        self._adapt_s += took
        self.chunk_replay_s.append(self._chunk_t0 + took)
        self.delivered.append((first_position, first_position + n))

    def adaptation_record(self, chunk_tokens: int, hook_sha256: str) -> dict[str, Any]:
        return {
            "hook": "eval.py",
            "hook_sha256": hook_sha256,
            "protocol": "score-first",
            "where": "model worker",
            "chunk_tokens": chunk_tokens,
            "chunks": len(self.delivered),
            "tokens_delivered": sum(b - a for a, b in self.delivered),
            "adapt_time_s": self._adapt_s,
        }

    # ---- ending ----

    def close(self) -> None:
        """Ask it to quit; kill it if it does not; free the buffers and its temp folder (once: later calls do nothing)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.proc.poll() is None:
            try:
                send(self.sock, {"op": "quit"})
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.sock.close()
        self.inbuf.close()
        self.outbuf.close()
        remove_tree(self._tmp)  # however deep the worker made it
        self._tmp.with_name(self._tmp.name + "-policy.json").unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_group_reaped(self.proc)  # its CPU time counted in the scorer's (the machine-load record)

    def describe(self) -> dict[str, Any]:
        """For the score record: how the worker was confined (with the names of the variables its environment
        held, never a value), how its logits crossed on this side, and what it said of itself (not believed)."""
        return {
            "role": self.cfg.role,
            "isolation": {**self.plan.describe(), "environment": names(self.env)},
            "crossing": side_record({"logits": self.outbuf}),
            "reported": self.facts,
        }

    def crossing_record(self) -> dict[str, Any]:
        """How the logits crossed from this worker (the score record's `crossing`, version CROSSING_VERSION):
        this side's path for the output buffer, measured here; the worker's, as it reported it in its ready
        (not believed: it changes the speed only, never a scored number); the bytes that crossed."""
        reported = self.facts.get("crossing")
        ok = isinstance(reported, dict) and reported.get("logits") in (PINNED, PAGEABLE)
        worker: dict[str, Any] = (
            reported if isinstance(reported, dict) and ok else {"logits": "unknown", "why": "not reported"}
        )
        return {
            "version": CROSSING_VERSION,
            "scorer": PINNED if self.outbuf.pinned else PAGEABLE,
            "worker": worker["logits"],
            "why": {"scorer": self.outbuf.pin_why, "worker": str(worker.get("why", ""))[:300]},
            "worker_reported": {k: str(v)[:300] for k, v in worker.items()} if ok else None,
            "logits_bytes": self.bytes_read,
            "tokens_bytes": self.bytes_sent,
        }


def start_worker(cfg: WorkerConfig) -> WorkerModel:
    """Start a worker (it decodes and builds in the background); call wait_ready() before using it."""
    return WorkerModel(cfg)
