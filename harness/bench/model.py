"""`pgolf bench model ARTIFACT --submission DIR`: a packed model's speed here, and what bounds it.

    pgolf bench model ARTIFACT --submission DIR [--seq-len 256] [--batch-seqs 8] [--repeats 5] [--threads N]

Prints, for this machine:
- unpack time (the artifact decoded to tensors: a built-in codec here, a custom one in its confined
  process) and pack time (the same state encoded again with the artifact's codec, into a temp file);
- eval tokens/s: forward passes on random tokens through the model worker (scoring/score/remote.py
  WorkerModel: the submission's model.py runs confined, never in this process), the median of
  `--repeats` batches after one untimed;
- the weights as the model runs them (float32 tensors of the unpacked state): bytes, and bytes read per
  token at this batch (every weight is read once per forward);
- the machine: memory bandwidth (a numpy copy of a 256 MiB array: bytes read + written per second),
  peak FLOP/s (a float32 matmul, and bfloat16 where torch has it natively), the L3 size from sysfs;
- one line: compute-bound (the forward reaches half the matmul peak), bandwidth-bound (weights larger
  than L3 and half the copy bandwidth spent reading them), cache-resident (weights fit in L3), or
  overhead-bound (neither: small kernels, the worker round trip).
Forward FLOPs per token are counted as 2 x the parameters of the 2-D weights (attention's score
terms left out): a floor, said so in the output.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def bandwidth_bytes_per_s(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """A numpy copy: (read + write) bytes per second, the best of `repeats`."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def matmul_flop_per_s(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 10) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(2):
        a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t0)


def boundedness(
    *,
    weight_bytes: int,
    l3_bytes: int | None,
    tokens_per_s: float,
    tokens_per_batch: int,
    flops_per_token: float,
    peak_flop_per_s: float,
    bandwidth: float,
) -> str:
    """One line: what bounds this model's forward here (see the module docstring)."""
    achieved = flops_per_token * tokens_per_s
    read_per_s = weight_bytes / tokens_per_batch * tokens_per_s
    fits = l3_bytes is not None and weight_bytes <= l3_bytes
    l3 = f"{l3_bytes / 2**20:.0f} MiB" if l3_bytes else "unknown"
    facts = (
        f"weights {weight_bytes / 2**20:.1f} MiB vs L3 {l3}; {achieved / 1e9:.1f} GFLOP/s of "
        f"{peak_flop_per_s / 1e9:.1f} peak ({100 * achieved / peak_flop_per_s:.0f}%); weights read at "
        f"{read_per_s / 1e9:.2f} GB/s of {bandwidth / 1e9:.1f} copy bandwidth"
    )
    if achieved >= 0.5 * peak_flop_per_s:
        return f"compute-bound here: {facts}"
    if not fits and read_per_s >= 0.5 * bandwidth:
        return f"bandwidth-bound here: {facts}"
    if fits:
        return (
            f"cache-resident here (the weights fit in L3), neither compute nor bandwidth saturated: {facts}"
        )
    return f"overhead-bound here (neither compute nor bandwidth saturated): {facts}"


def cmd_model(args: argparse.Namespace) -> int:
    from harness.run.staging import stage_model_code
    from harness.train.cpu import l3_bytes, read_facts
    from scoring.artifact.format import read_artifact
    from scoring.artifact.pack import pack_state
    from scoring.score.remote import WorkerConfig, WorkerModel
    from scoring.worker.decode import unpack_artifact

    artifact_path = Path(args.artifact).resolve()
    submission = Path(args.submission).resolve()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    art = read_artifact(artifact_path)
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-model-") as tmp:
        t0 = time.perf_counter()
        state = unpack_artifact(artifact_path, Path(tmp) / "state.safetensors", submission)
        unpack_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        rec = pack_state(
            state,
            submission,
            Path(tmp) / "again.pgolf",
            codec_name=art.codec_name,
            model_config=dict(art.model_config),
            cap_bytes=1 << 62,
        )
        pack_s = time.perf_counter() - t0
        params = sum(v.numel() for v in state.values())
        weight_bytes = sum(v.numel() * 4 for v in state.values())  # run as float32
        matmul_params = sum(v.numel() for v in state.values() if v.ndim == 2)
        vocab = int(art.model_config.get("vocab_size", 1024))
        staged = stage_model_code(submission, Path(tmp) / "code")
        tokens_per_batch = args.batch_seqs * args.seq_len
        worker = WorkerModel(
            WorkerConfig(
                code_dir=staged,
                artifact=artifact_path,
                vocab_size=vocab,
                threads=threads,
                max_tokens_per_batch=tokens_per_batch,
                workdir=Path(tmp),
            )
        )
        times: list[float] = []
        try:
            worker.start()
            worker.wait_ready()
            gen = torch.Generator().manual_seed(0)
            for i in range(args.repeats + 1):
                x = torch.randint(0, vocab, (args.batch_seqs, args.seq_len), generator=gen)
                t0 = time.perf_counter()
                worker.logits(x)
                if i:
                    times.append(time.perf_counter() - t0)
        finally:
            worker.close()
    eval_tps = tokens_per_batch / statistics.median(times)
    facts = read_facts()
    bw = bandwidth_bytes_per_s()
    peak32 = matmul_flop_per_s(torch.float32)
    peak16 = matmul_flop_per_s(torch.bfloat16) if facts.native_bf16 else None
    l3 = l3_bytes()
    flops_per_token = 2.0 * matmul_params
    print(
        f"bench model: {artifact_path.name} ({art.codec_name}, {params:,} parameters) on {facts.model}, {threads} thread(s)"
    )
    print(f"  unpack {unpack_s:.3f} s, pack again {pack_s:.3f} s ({rec['bytes_model']:,} bytes)")
    print(
        f"  eval {eval_tps:,.0f} tokens/s (batch {args.batch_seqs} x {args.seq_len}, median of {len(times)}, "
        f"through the model worker); {weight_bytes / tokens_per_batch:,.0f} weight bytes read per token "
        f"({weight_bytes:,} float32 bytes per forward); forward FLOPs per token >= {flops_per_token:,.0f} (2 x the 2-D weights)"
    )
    print(
        f"  machine: copy bandwidth {bw / 1e9:.1f} GB/s, float32 matmul {peak32 / 1e9:.1f} GFLOP/s"
        + (f", bfloat16 matmul {peak16 / 1e9:.1f} GFLOP/s" if peak16 else ", bfloat16 not native")
        + (f", L3 {l3 / 2**20:.0f} MiB" if l3 else ", L3 unknown")
    )
    print(
        "  "
        + boundedness(
            weight_bytes=weight_bytes,
            l3_bytes=l3,
            tokens_per_s=eval_tps,
            tokens_per_batch=tokens_per_batch,
            flops_per_token=flops_per_token,
            peak_flop_per_s=peak32,
            bandwidth=bw,
        )
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="a packed model's eval speed, pack/unpack time, and what bounds it here")
    p.add_argument("artifact", help="the packed model (.pgolf)")
    p.add_argument("--submission", required=True, help="the submission folder it was packed from (model.py)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--batch-seqs", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed batches (default 5)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.set_defaults(func=cmd_model)
