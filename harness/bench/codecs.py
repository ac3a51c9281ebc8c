"""`pgolf bench codecs`: bytes, speed and reconstruction error of the built-in codecs on one state dict.

    pgolf bench codecs STATE.safetensors [--codecs int8_zlib,int6_zstd22,...] [--threads N] [--json]

Per codec (each encodes the same state once and decodes its own payload once, in this process):
- bytes: the codec's payload (what the artifact holds besides its JSON header);
- ratio: bytes / int8_zlib's bytes (int8_zlib is always measured, first: the reference's packing);
- encode_s, decode_s: wall time of one encode and one decode;
- rel_rms: sqrt(sum (w' - w)^2 / sum w^2) over every floating-point element of the state, in float64;
- max_abs: the largest |w' - w| over the same elements.
A decoded state whose names, shapes or dtypes differ from the input's is an error, not a row.
`--codecs` takes codec specs separated by commas; a mixed_* spec's role table continues across commas
(`mixed_zstd22:mlp=int5,attention=int7,int6_zstd22` is two codecs).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

BENCH_FORMAT = "pg-bench-codecs"
BENCH_VERSION = 1
BASELINE_CODEC = "int8_zlib"
DEFAULT_CODECS = (
    "int8_zlib",
    "int8_zstd22",
    "int7_zstd22",
    "int6_zlib9",
    "int6_zstd22",
    "int6_zstd22_shuffle",
    "int6_lzma9",
    "int6_brotli11",
    "int6_brotli11_shuffle",
    "int5_zstd22",
    "int5_brotli11_shuffle",
    "mixed_brotli11_shuffle",
)


def split_specs(text: str) -> list[str]:
    """Comma-separated codec specs; an item with "=" and no ":" continues the mixed spec before it."""
    specs: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item and specs and ":" in specs[-1]:
            specs[-1] += f",{item}"
        else:
            specs.append(item)
    return specs


def reconstruction_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """rel_rms and max_abs over every floating-point element of `a` (the original) against `b`."""
    num = den = 0.0
    max_abs = 0.0
    for name, t in a.items():
        if not t.is_floating_point():
            continue
        x, y = t.detach().to(torch.float64), b[name].detach().to(torch.float64)
        d = y - x
        num += float(d.square().sum())
        den += float(x.square().sum())
        if d.numel():
            max_abs = max(max_abs, float(d.abs().max()))
    return {"rel_rms": (num / den) ** 0.5 if den > 0 else 0.0, "max_abs": max_abs}


def _check_same_layout(spec: str, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    if set(a) != set(b):
        raise ValueError(f"codec {spec} decoded other tensors: {sorted(set(a) ^ set(b))[:5]}")
    for k, t in a.items():
        if tuple(b[k].shape) != tuple(t.shape) or b[k].dtype != t.dtype:
            raise ValueError(
                f"codec {spec} decoded {k} as {b[k].dtype}{list(b[k].shape)}, not {t.dtype}{list(t.shape)}"
            )


def run_bench(state: dict[str, torch.Tensor], specs: list[str]) -> dict[str, Any]:
    from scoring.artifact.codecs import get_codec

    codecs = [(s, get_codec(s)) for s in dict.fromkeys([BASELINE_CODEC, *specs])]  # every spec checked first
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    rows: list[dict[str, Any]] = []
    for spec, codec in codecs:
        t0 = time.perf_counter()
        payload = codec.encode(state)
        t1 = time.perf_counter()
        decoded = codec.decode(payload)
        t2 = time.perf_counter()
        if spec != BASELINE_CODEC:  # int8_zlib keeps control tensors in float32, as the reference does
            _check_same_layout(spec, state, decoded)
        rows.append(
            {"codec": spec, "bytes": len(payload), "encode_s": t1 - t0, "decode_s": t2 - t1}
            | reconstruction_error(state, decoded)
        )
    base = rows[0]["bytes"]
    for r in rows:
        r["ratio"] = r["bytes"] / base if base else float("nan")
    return {
        "format": BENCH_FORMAT,
        "format_version": BENCH_VERSION,
        "num_tensors": len(state),
        "num_params": int(sum(v.numel() for v in state.values())),
        "raw_bytes": int(sum(v.numel() * v.element_size() for v in state.values())),
        "codecs": rows,
    }


def format_report(rec: dict[str, Any], source: str) -> list[str]:
    lines = [
        f"bench codecs: {source}: {rec['num_tensors']} tensors, {rec['num_params']:,} params, "
        f"{rec['raw_bytes']:,} bytes as stored",
        f"{'codec':<28} {'bytes':>11} {'vs int8_zlib':>12} {'encode_s':>9} {'decode_s':>9} {'rel_rms':>9} {'max_abs':>9}",
    ]
    for r in rec["codecs"]:
        lines.append(
            f"{r['codec']:<28} {r['bytes']:>11,} {r['ratio']:>12.4f} {r['encode_s']:>9.3f} {r['decode_s']:>9.3f} "
            f"{r['rel_rms']:>9.2e} {r['max_abs']:>9.2e}"
        )
    return lines


def cmd_bench_codecs(args: argparse.Namespace) -> int:
    from scoring.artifact.pack import read_state

    if args.threads:
        torch.set_num_threads(args.threads)
    state, _ = read_state(args.state)
    specs = split_specs(args.codecs) if args.codecs else list(DEFAULT_CODECS)
    if not specs:
        raise ValueError(f"--codecs {args.codecs!r} names no codec")
    rec = run_bench(state, specs)
    if args.json:
        print(json.dumps(rec, sort_keys=True))
    else:
        print("\n".join(format_report(rec, str(Path(args.state)))))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("codecs", help="bytes, speed and reconstruction error of codecs on a state dict")
    p.add_argument("state", help="a .safetensors state dict (e.g. RUN_DIR/state.safetensors)")
    p.add_argument(
        "--codecs",
        help=f"comma-separated codec specs (default: {','.join(DEFAULT_CODECS)}); int8_zlib is always measured",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: torch's default; 1 on a loaded machine)"
    )
    p.add_argument("--json", action="store_true", help="one JSON record instead of the table")
    p.set_defaults(func=cmd_bench_codecs)
