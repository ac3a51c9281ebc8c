"""Warm the CPU math library on every thread before a model worker's first forward pass (the probes need it).

    warm_cpu_math() -> record     called once by the model worker (scoring/worker/process.py), after the
                                  thread count is set and before any submitted code runs

Why: on x86, ATen hands the float32/float64 forms of a set of unary ops (tanh, exp, log, erf, ...: VML_OPS) to
MKL's vector math library (VML), always asking for its high-accuracy mode, split over the intra-op threads in
chunks of 2,048 elements. Measured on a loaded 2-core Xeon (AVX-512, AMX) with torch 2.13.0 and its MKL 2024.2:
now and then the FIRST VML call of a fresh process, whichever op it is, gave other bits on one thread's chunk
(mostly the second's, elements 2,048 on); every later call was right. For the tanh fixture model that was rows 256..511 of a
16 x 32 batch: the logits are exactly a linear layer of other activations, and those equal vmsTanh with
mode=VML_EP ("enhanced performance", low accuracy) under MKL_CBWR=AVX2 to 3e-8, 5e-5 away from the right ones.
In fresh processes whose first call is a random VML op (2 threads, under load), 10 of 414 differed there (sin,
cos, atan, asin, log10, erfc; float32 and float64; the op each called first); with this warm-up first, 0 of 413,
and none of its own first calls differed either. MKL_CBWR=AUTO,STRICT and MKL_DYNAMIC=FALSE do not prevent it. A probe worker
answers its first forward pass, and batch 0 is the main worker's first, so an honest deterministic model was
marked `illegal` (max |Δlogit| 4e-5 to 1.5e-4) on about one run in twenty.

The fix: make no scored or probed forward a first call. Each op of VML_OPS runs here, in both dtypes, once on
this thread alone (the process's first VML call then has no second thread) and then split over every intra-op
thread (2 chunks per thread) until two calls in a row give the same bits, and the results are thrown away; a
matrix product (MKL's BLAS, also dispatched on first use) likewise. It changes no number of a later call; it
took 0.6-0.8 s in a worker on the loaded 2-core machine (mostly MKL's code paged in, which the first forward
would pay otherwise), on the eval clock as the build is. The record names the ops whose first threaded call
differed from the next (the defect caught here instead of in a scored batch). A model that raises the thread
count itself starts threads this did not warm (the worker's threads are the scorer's choice, recorded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

VML_OPS = (
    "acos",
    "asin",
    "atan",
    "cos",
    "erf",
    "erfc",
    "erfinv",
    "exp",
    "log",
    "log10",
    "log2",
    "sin",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
)
"""The torch ops whose float32/float64 CPU kernels call MKL VML (torch/include/ATen/cpu/vml.h,
IMPLEMENT_VML_MKL, torch 2.13; tests/unit/scoring/test_cpu_math.py checks the header still says so)."""
VML_GRAIN = 2048
"""Elements per chunk ATen's VML kernels split a tensor into over the intra-op threads (UnaryOpsKernel.cpp)."""
MATMUL_SIDE = 256
"""Side of the warm-up matrix product: large enough that MKL's GEMM runs on every thread."""
WARM_TRIES = 4
"""Threaded calls of an op at most, until two in a row agree (the first may not: the defect)."""


def warm_cpu_math() -> dict[str, Any]:
    """Call every op of VML_OPS (float32 and float64) once on this thread, then over every intra-op thread until two
    calls in a row agree to the bit (at most WARM_TRIES), and a threaded matrix product of each dtype likewise;
    results discarded. Returns what was done (the worker's facts): `first_calls_differed` names the ops whose
    first threaded call gave other bits than the next (the defect this absorbs; empty on most starts)."""
    t0 = time.perf_counter()
    threads = max(torch.get_num_threads(), 1)
    calls = 0
    differed: list[str] = []
    with torch.inference_mode():
        for dtype in (torch.float32, torch.float64):
            # values inside every op's domain (acos, asin, erfinv: |x| < 1; log, sqrt: x > 0): no nan to compare
            one = torch.linspace(0.05, 0.95, 16, dtype=dtype)  # below the grain: this thread only
            many = torch.linspace(0.05, 0.95, 2 * VML_GRAIN * threads, dtype=dtype)  # 2 chunks a thread
            a = torch.linspace(-1.0, 1.0, MATMUL_SIDE * MATMUL_SIDE, dtype=dtype).view(MATMUL_SIDE, -1)
            ops: list[tuple[str, Callable[[], torch.Tensor]]] = []
            for name in VML_OPS:
                op = getattr(torch, name)
                op(one)
                calls += 1
                ops.append((name, partial(op, many)))
            ops.append(("mm", partial(torch.mm, a, a)))
            for name, call in ops:
                prev = call()
                calls += 1
                for _ in range(WARM_TRIES - 1):
                    again = call()
                    calls += 1
                    if torch.equal(prev, again):
                        break
                    differed.append(f"{name}/{str(dtype).removeprefix('torch.')}")
                    prev = again
    return {
        "threads": threads,
        "calls": calls,
        "first_calls_differed": differed,
        "seconds": round(time.perf_counter() - t0, 4),
    }
