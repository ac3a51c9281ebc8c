"""Several model workers scoring one evaluation, and the group their adaptation hook may talk in.

`WorkerPool` shards the windows over its workers (one per device) and, as a score-first adapter, hands every
chunk to every worker at once. `start_pool` starts one: with score-first adaptation the workers form a group
(`grouped`): each learns its rank, the group's size and a rendezvous port (scoring/worker/group.py makes the
torch.distributed process group from them, gloo on CPU, NCCL on CUDA), and they share one loopback-only network
namespace of their own (isolation/shared_net.py) where the machine gives network namespaces. So a hook can
split each chunk's training over the workers and all-reduce, as the records' distributed test-time training did.

What a group's channel opens, and what closes it: a worker could pass the batch it holds to the others while
they score theirs, a later window's text to the worker scoring an earlier one. The probes hold the line
(scoring/score/probes.py): a probe of a batch scored by a group is run by a fresh group of the same size, every
worker given the batch it held at the same time (KeptBatch.group), the others' text replaced by real tokens
from elsewhere in the variants, so a probe looks like scoring and a model that uses another worker's batch
answers otherwise than it scored.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from typing import Any, TypeVar

import numpy as np
import torch

from isolation.sandbox import probe_machine
from isolation.shared_net import SharedNet
from scoring.score.remote import WorkerConfig, WorkerFailure, WorkerGroup, WorkerModel, start_worker
from scoring.statuses import Status
from scoring.worker.confined import PROJECT_ROOT

T = TypeVar("T")

FAILURE_GRACE_S = 1.0
"""After a worker's failure, how long the pool waits for the others' before it names one (WorkerPool.gather)."""

GROUP_PORT = 29500
"""The rendezvous port in a group's own network namespace (nothing else listens there)."""


class WorkerPool:
    """Several model workers (one per device) scoring one evaluation: evaluate() sends batch i of each group to
    worker i, each computes at once, and the answers are scored in batch order, so the sums are the same to the
    bit as with one worker (every worker computes deterministically: scoring/worker/process.py). As a
    score-first adapter it hands every chunk to every worker, all at once, so their weights stay the same."""

    def __init__(
        self, workers: list[WorkerModel], net: SharedNet | None = None, port_hold: socket.socket | None = None
    ):
        if not workers:
            raise ValueError("a worker pool needs at least one worker")
        self.workers = workers
        self._threads: ThreadPoolExecutor | None = None
        self.net = net
        """A group's shared network namespace (held until the pool is closed); None: none of its own."""
        self.port_hold = port_hold
        """A group without a namespace of its own: a socket bound to its rendezvous port on the host's loopback,
        held from the pool's making (a probe group's, minutes before it is used) until it starts, so that no other
        socket (the main group's, made meanwhile) takes the port: a probe group that cannot meet would fail its
        probe, and the entry would be called illegal."""
        self._adapt_s = 0.0
        self.chunk_replay_s: list[float] = []
        """As WorkerModel.chunk_replay_s, for the pool's workers together (they adapt at once)."""
        self._chunk_t0 = 0.0

    @property
    def output_kind(self) -> str:
        """What every worker said it returns, once all are ready (a pool whose workers differ is refused)."""
        kinds = {w.output_kind for w in self.workers}
        if len(kinds) != 1:
            raise WorkerFailure(
                Status.ERROR, f"the pool's workers answered different output kinds: {sorted(kinds)}"
            )
        return self.workers[0].output_kind

    # ---- as one worker: started, waited for, closed together (a probe's fresh group) ----

    @property
    def deadline(self) -> float | None:
        return self.workers[0].deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        for w in self.workers:
            w.deadline = value

    def start(self) -> None:
        """Tell every worker to build (a group's rendezvous port let go first: rank 0 binds it)."""
        if self.port_hold is not None:
            self.port_hold.close()
            self.port_hold = None
        for w in self.workers:
            w.start()

    def wait_ready(self) -> None:
        """Every worker started before any is waited for (a group's workers meet while they build), all waited for
        at once: the first to fail is the answer, not the timeout of another still waiting for it to join."""
        self.start()
        self._all([w.wait_ready for w in self.workers])
        _ = self.output_kind

    def _all(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        return self.gather(self.submit_each(calls))

    def submit_each(self, calls: Sequence[Callable[[], T]]) -> list[Future[T]]:
        """Each call started in a thread of its own (one per worker); `gather` waits for them."""
        return [self._pool().submit(c) for c in calls]

    def gather(self, futures: Sequence[Future[T]]) -> list[T]:
        """The calls' results, all ended before this returns. The first to fail is the answer: every worker is
        killed (a group's others would wait for the failed one in a collective until their timeout, minutes, and a
        verdict would name the wrong worker), the rest are waited for (no thread still copies out of a buffer that
        closing frees), and that failure is raised."""
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            # one worker's failure breaks the others' collectives at once: a moment for every failure already on its
            # way, then a specific one (out_of_memory, ...) is the verdict before a generic error, which a broken
            # collective gives (under load, rank 0's came with rank 1's own, and worker order named rank 0's)
            wait(futures, timeout=FAILURE_GRACE_S)
            failed = min(
                (f for f in futures if f.done() and f.exception() is not None),
                key=lambda f: getattr(f.exception(), "kind", Status.ERROR) == Status.ERROR,
            )
            self.kill()
            wait(futures)
            raise failed.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def kill(self) -> None:
        for w in self.workers:
            w.kill()

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(len(self.workers), thread_name_prefix="pgolf-pool")
        return self._threads

    def close(self) -> None:
        if self.port_hold is not None:
            self.port_hold.close()
        for w in self.workers:  # first: a thread still waiting on a worker then returns at once
            w.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        if self.net is not None:
            self.net.close()

    def describe(self) -> dict[str, Any]:
        return self.workers[0].describe()

    def crossing_record(self) -> dict[str, Any]:
        """The score's `crossing`: the first worker's record (remote.py WorkerModel.crossing_record), with every
        worker's bytes summed and this side's path for each worker's buffer (`scorer_by_worker`: on a node, each
        worker's GPU registers its own)."""
        records = [w.crossing_record() for w in self.workers]
        return {
            **records[0],
            "logits_bytes": sum(r["logits_bytes"] for r in records),
            "tokens_bytes": sum(r["tokens_bytes"] for r in records),
            "scorer_by_worker": [r["scorer"] for r in records],
        }

    # ---- Scorable ----

    def logits(self, x_BL: torch.Tensor) -> torch.Tensor:
        return self.workers[0].logits(x_BL)

    def scored_logits(self, x_BL: torch.Tensor, ranges_B2: np.ndarray) -> torch.Tensor:
        return self.workers[0].scored_logits(x_BL, ranges_B2)

    def loss_devices(self, device: torch.device) -> list[torch.device]:
        """Where the scorer computes the loss on each worker's answers: on CUDA the worker's own GPU (each answer
        crosses over that GPU's own link, the loss runs beside it), else `device`."""
        if device.type != "cuda":
            return [device] * len(self.workers)
        return [torch.device(w.cfg.device) for w in self.workers]

    def scored_group(
        self, xs: Sequence[np.ndarray], ranges: Sequence[np.ndarray], device: torch.device | None = None
    ) -> list[torch.Tensor]:
        """Batch k to worker k, all computing at once, as evaluate() sends a group (a probe repeats one); the
        answers taken by one thread per worker (the copies out of the shared buffers run side by side), each
        on loss_devices(device)[k] (default: this process's memory)."""
        if len(xs) != len(ranges) or len(xs) > len(self.workers):
            raise ValueError(f"{len(xs)} batches and {len(ranges)} ranges for {len(self.workers)} workers")
        devices = self.loss_devices(device) if device is not None else [torch.device("cpu")] * len(xs)
        for w, x, r, d in zip(self.workers, xs, ranges, devices, strict=False):
            w.submit(torch.from_numpy(np.ascontiguousarray(x)), r, device=d)
        if len(xs) == 1:
            return [self.workers[0].collect()]
        return self._all([w.collect for w in self.workers[: len(xs)]])

    @property
    def adapt_time_s(self) -> float:
        return self._adapt_s

    def before_chunk(self, model: Any, chunk: int) -> None:
        t0 = time.perf_counter()
        for w in self.workers:
            w._send({"op": "chunk_begin", "chunk": chunk})
        self._replies()
        self._chunk_t0 = time.perf_counter() - t0

    def _replies(self) -> None:
        self._all([functools.partial(w._ask, None) for w in self.workers])

    def after_chunk(self, model: Any, chunk: int, scored_tokens: np.ndarray, first_position: int) -> None:
        n = int(scored_tokens.size)
        t0 = time.perf_counter()
        for w in self.workers:
            if n * 8 > w.inbuf.nbytes:
                w.inbuf.grow(n * 8)
            w.inbuf.array(np.int64, n)[:] = scored_tokens
            w._send({"op": "adapt", "chunk": chunk, "n": n, "first_position": first_position})
        self._replies()  # a hook that fails in one worker fails the chunk at once, named by that worker
        for w in self.workers:
            w.delivered.append((first_position, first_position + n))
        took = time.perf_counter() - t0
        self._adapt_s += took
        self.chunk_replay_s.append(self._chunk_t0 + took)


def _held_port() -> socket.socket:
    """A socket bound to a port free on the host's loopback (a group without a namespace of its own meets there),
    held until the group starts (WorkerPool.port_hold)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


def shared_net_here(sandbox: str) -> bool:
    """Whether a worker's sandbox gets a network namespace on this machine (then its group needs a shared one)."""
    if sandbox == "off":
        return False
    caps = probe_machine()
    return caps.namespaces and caps.net_namespace


def worker_threads(threads: int, devices: Sequence[str]) -> int:
    """Each worker's intra-op CPU threads in a pool over `devices`. On CUDA the node's cores are split between its
    workers (eight workers each asking for every core would run eight times as many threads as cores in any CPU
    op of theirs: a hook's optimizer step, a host copy), and a GPU's bits do not depend on them. On CPU every
    worker keeps the scorer's count: a CPU kernel's bits may depend on its thread count, and a batch's probe (one
    fresh worker, or a fresh group of the same size) must compute it as the pool did; CPU workers scoring side by
    side share the cores anyway, which is why a CPU machine scores with one."""
    if threads <= 0 or len(devices) < 2 or not all(d.startswith("cuda") for d in devices):
        return threads
    return max(1, threads // len(devices))


def start_pool(
    cfg: WorkerConfig, devices: Sequence[str], *, grouped: bool, stack: ExitStack, net: bool | None = None
) -> WorkerPool:
    """Workers for `devices` (the first is cfg's own place: rank 0), started later by the caller (`start` or
    `wait_ready`); `grouped`: they form a group (module docstring). `net`: whether the sandbox makes network
    namespaces here (default: asked of the machine). Everything started is closed by `stack`."""
    grouped = grouped and len(devices) > 1  # a group of one is no group
    shared: SharedNet | None = None
    port, hold = GROUP_PORT, None
    if grouped and (net if net is not None else shared_net_here(cfg.sandbox)):
        shared = SharedNet(PROJECT_ROOT)
        stack.callback(shared.close)
    elif grouped:
        hold = _held_port()
        stack.callback(hold.close)
        port = int(hold.getsockname()[1])
    net_fd = None if shared is None else shared.fd
    cfg = dataclasses.replace(cfg, threads=worker_threads(cfg.threads, devices))
    workers = []
    for rank, device in enumerate(devices):
        group = WorkerGroup(rank=rank, world_size=len(devices), port=port, net_fd=net_fd) if grouped else None
        w = start_worker(dataclasses.replace(cfg, device=device, group=group))
        stack.callback(w.close)
        workers.append(w)
    return WorkerPool(workers, shared, hold)
