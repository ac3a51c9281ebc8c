"""The environment of every process that runs submitted code: an allow-list, never the official's copy.

`sandbox_env(base, ...)` builds it for the model worker and the one-shot confined children
(scoring/worker/confined.py), the training ranks under torchrun, the sealed pack of a custom codec and
the sandbox probe (harness/run/train_phase.py). Of `base` (the official's environment) it keeps only
the names of PASSED_THROUGH, when set; it then sets the harness's own (SET_BY_HARNESS: the import
path, the private home, temp folder and caches, the thread count, the phase token). Everything else
is dropped: tokens and keys (WANDB_*, HF_*, AWS_*, SSH_*, GITHUB_TOKEN, ...), proxies, data locations
(PG_DATA_DIR), a scheduler's job facts. torchrun adds RANK, WORLD_SIZE, MASTER_ADDR and the rest
itself, inside. A record may name the variables a process got (`names(env)`), never copy a value.

PASSED_THROUGH, and why each:
    PATH                 the tools the processes start by name: the C compiler torch.compile and
                         Triton call, torchrun's agent; never a secret
    LANG, LC_ALL, LC_CTYPE  the text encoding of standard streams and file names
    TZ                   the time zone of timestamps in logs
    LD_LIBRARY_PATH      where the machine keeps the CUDA driver library (libcuda.so) when it is
                         outside the loader's default paths (GPU containers: /usr/local/nvidia/lib64)
    CUDA_VISIBLE_DEVICES the GPUs this run was given (by the official or the scheduler)
    CUDA_DEVICE_ORDER    what CUDA_VISIBLE_DEVICES' numbers mean (PCI_BUS_ID: as nvidia-smi numbers them)
    NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME  the network interface between nodes of a multi-node run
                         (a phase with its own network namespace gets "lo" from the harness instead)
    NCCL_IB_DISABLE      nodes without a working InfiniBand fabric: NCCL must not try it (it hangs)
    NCCL_P2P_DISABLE     machines whose GPUs cannot do peer-to-peer transfers (NCCL would fail or hang)
    NCCL_DEBUG           NCCL's log level, for an official diagnosing a multi-node hang
    OMP_NUM_THREADS, MKL_NUM_THREADS  the official's thread count, when the harness sets none
                         (threads 0: "as the machine is set up"); the harness's value wins
    ATEN_CPU_CAPABILITY, MKL_CBWR, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA  the machine's CPU
                         kernels pinned by the official (a reproduction on another CPU kind, the golden
                         run: tests/golden/regen.py PINNED_NUMERICS_ENV); never a secret

SET_BY_HARNESS also holds MKL_DYNAMIC=FALSE: MKL otherwise uses fewer threads than asked when the
machine is busy, and a different thread count sums a matrix product in another order, so a probe
worker started under load answered 3e-5 away from the main worker on the same batch (a false
`illegal` of an honest entry).

A model worker (main and probe alike) also gets CUBLAS_WORKSPACE_CONFIG=:4096:8 (WORKER_CUBLAS_WORKSPACE)
and runs with torch.use_deterministic_algorithms(True) (scoring/worker/process.py): on CUDA, cuBLAS
otherwise picks its reduction split by workspace and stream, and the backward of an adaptation hook uses
atomics, so a probe worker replaying the same chunks would answer other bits than the main one did.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from isolation.sandbox import TOKEN_ENV

PASSED_THROUGH = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NCCL_P2P_DISABLE",
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "ATEN_CPU_CAPABILITY",
        "MKL_CBWR",
        "MKL_ENABLE_INSTRUCTIONS",
        "ONEDNN_MAX_CPU_ISA",
    }
)
"""Copied from the official's environment when set (the module docstring says why each)."""

SET_BY_HARNESS = frozenset(
    {
        "PYTHONPATH",  # the project's root first (plus the official's own entries, for training)
        "PYTHONDONTWRITEBYTECODE",  # submitted code leaves no .pyc behind
        "PYTHONUSERBASE",  # training: the user site of the official's Python, with HOME moved
        "HOME",  # a private folder of the process
        "TMPDIR",  # a private temp folder
        "XDG_CACHE_HOME",  # every cache in the process's own folder
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "CUDA_CACHE_PATH",
        "OMP_NUM_THREADS",  # the threads the phase was given
        "MKL_DYNAMIC",  # FALSE: the thread count asked is the count used (module docstring)
        "CUBLAS_WORKSPACE_CONFIG",  # model workers: a fixed cuBLAS workspace, deterministic matmuls (module docstring)
        TOKEN_ENV,  # the phase token: how the supervisor finds a phase's leftover processes
        "GLOO_SOCKET_IFNAME",  # "lo" in a network namespace of its own
        "NCCL_SOCKET_IFNAME",
    }
)
"""What the harness itself sets (values of its own making, never the official's)."""

WORKER_MKL_CBWR = "AUTO,STRICT"
"""MKL_CBWR of every model worker whose official set none: MKL's best code path for this CPU, with results that
do not depend on the memory alignment of the operands. Without it a fresh process may lay a matrix out at
another alignment and sum in another order; the causality probe, which asks fresh workers for bit-identical
logits, then failed 3 of 54 honest tiny re-runs on a loaded 2-core machine (max |Δlogit| 4e-5 to 1.5e-4).
It did not end them: the cause, measured later, was MKL's vector math taking a low-accuracy code path on a
fresh process's first call on a thread; every model worker now warms it first (scoring/worker/cpu_math.py)."""

WORKER_CUBLAS_WORKSPACE = ":4096:8"
"""CUBLAS_WORKSPACE_CONFIG of every model worker: what torch.use_deterministic_algorithms needs of cuBLAS >= 10.2."""

ALLOWED = PASSED_THROUGH | SET_BY_HARNESS
"""Every name a sandboxed process's environment may hold (before torchrun adds its own)."""


def sandbox_env(
    base: Mapping[str, str],
    *,
    pythonpath: Iterable[str],
    home: Path,
    tmp: Path,
    cache: Path,
    compile_cache: Path | None = None,
    threads: int = 0,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a sandboxed process: PASSED_THROUGH of `base`, then the harness's own.

    `cache` is XDG_CACHE_HOME; the compile caches (inductor, triton, nv) go under `compile_cache`
    (default `cache`). `threads` > 0 sets OMP_NUM_THREADS. `extra` may set only names of SET_BY_HARNESS
    (ValueError otherwise: a name that is not on the list is a decision to make here, not at a caller).
    """
    env = {k: v for k, v in base.items() if k in PASSED_THROUGH}
    compiled = compile_cache if compile_cache is not None else cache
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in pythonpath if p),
        PYTHONDONTWRITEBYTECODE="1",
        HOME=str(home),
        TMPDIR=str(tmp),
        XDG_CACHE_HOME=str(cache),
        TORCHINDUCTOR_CACHE_DIR=str(compiled / "inductor"),
        TRITON_CACHE_DIR=str(compiled / "triton"),
        CUDA_CACHE_PATH=str(compiled / "nv"),
        MKL_DYNAMIC="FALSE",
    )
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    for name, value in (extra or {}).items():
        if name not in SET_BY_HARNESS:
            raise ValueError(
                f"{name} is not a variable the harness sets (scoring/worker/env.py SET_BY_HARNESS)"
            )
        env[name] = value
    return env


def names(env: Mapping[str, str]) -> list[str]:
    """The variables an environment holds, for a record: names only, never a value."""
    return sorted(env)
