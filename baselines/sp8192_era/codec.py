"""The sp8192 era's packing: GPTQ'd int6 matrices and int8 embeddings, fp16 small tensors, byte shuffle, brotli-11.

The record (2026-04-09) quantises on an SDClip grid: per row, scale s = k * std(row) / qmax in
float16, q = round(w / s) clamped to [-qmax, qmax]; k = 12.85 and qmax = 31 (int6) for the block
matrices, k = 20 and qmax = 127 (int8) for the token embedding. GPTQ (train.py, on the clock,
with Hessians from training batches) chooses the q's; it hands over weights that are exactly q * s.
A grid of k = 12.85 standard deviations is wider than any row's largest weight, so the harness's
built-in int6 codecs (whose clip never exceeds the row's max) would re-round them: this codec
keeps them instead.

encode: every floating-point 2-D tensor of more than SMALL_NUMEL elements is stored as int8 codes
and one float16 scale per row. For each row it looks for the grid the weights already lie on: the
largest float16 s = m / t (m the row's smallest nonzero |w|, t = 1 .. qmax) with every w / s an
integer within qmax and q * s == w exactly; such a row comes back bit for bit. A row on no grid
(GPTQ off, or a tensor it did not see) is rounded on its SDClip grid. Other float tensors are
stored as float16 (the record's passthrough), non-float ones as they are.
The container is a safetensors blob (tensors q.NAME, s.NAME, p.NAME, and `layout`: the JSON layout
as uint8), byte-shuffled with stride 2 as the record does (byte 0 of every pair, then byte 1),
then brotli at quality 11.
"""

import json

import brotli
import numpy as np
import torch
from safetensors.torch import load, save

NAME = "sp8192_gptq_brotli11"
VERSION = 1
FORMAT = "pg-sp8192-gptq"
SMALL_NUMEL = 4096
MATRIX = (31, 12.85)  # (qmax, clip sigmas): int6
EMBEDDING = (127, 20.0)  # int8, for the token embedding


def grid_of(name):
    return EMBEDDING if "tok_emb" in name else MATRIX


def quantized(t):
    return t.is_floating_point() and t.ndim == 2 and t.numel() > SMALL_NUMEL


def sdclip_scale(w, qmax, sigmas):
    """The record's SDClip scale per row: float16(sigmas * std(row) / qmax), at least 1e-10."""
    std = w.astype(np.float64).std(axis=1, ddof=1) if w.shape[1] > 1 else np.zeros(w.shape[0])
    return np.maximum(sigmas * std / qmax, 1e-10).astype(np.float16)


def find_grid(w, qmax):
    """(found, s): per row, the largest float16 s with w == q * s exactly, integer |q| <= qmax."""
    a = np.abs(w)
    smallest = np.where(a > 0, a, np.inf).min(axis=1)  # (R,)
    zero_row = ~np.isfinite(smallest)
    found = zero_row.copy()
    s16 = np.where(zero_row, 1.0, 0.0).astype(np.float16)
    for t in range(1, qmax + 1):
        cand = np.where(zero_row, 1.0, smallest / t).astype(np.float16)
        c32 = cand.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.rint(w / c32[:, None])
            ok = ~found & (c32 > 0) & (np.abs(q).max(axis=1) <= qmax) & (q * c32[:, None] == w).all(axis=1)
        s16[ok] = cand[ok]
        found |= ok
    return found, s16


def quantize(name, t):
    qmax, sigmas = grid_of(name)
    w = t.detach().to(torch.float32).contiguous().numpy()
    found, s16 = find_grid(w, qmax)
    s16 = np.where(found, s16, sdclip_scale(w, qmax, sigmas)).astype(np.float16)
    q = np.clip(np.rint(w / s16.astype(np.float32)[:, None]), -qmax, qmax).astype(np.int8)
    return torch.from_numpy(q), torch.from_numpy(s16), int(found.sum())


def shuffle2(b):
    if len(b) < 2:
        return b
    a = np.frombuffer(b, dtype=np.uint8)
    return np.concatenate((a[0::2], a[1::2])).tobytes()


def unshuffle2(b):
    if len(b) < 2:
        return b
    a = np.frombuffer(b, dtype=np.uint8)
    out = np.empty_like(a)
    half = (len(a) + 1) // 2
    out[0::2], out[1::2] = a[:half], a[half:]
    return out.tobytes()


def encode(state):
    tensors, layout = {}, {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        entry = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if quantized(t):
            q, s, exact_rows = quantize(name, t)
            tensors["q." + name], tensors["s." + name] = q, s
            entry.update(kind="grid", qmax=grid_of(name)[0], exact_rows=exact_rows)
        elif t.is_floating_point():
            tensors["p." + name] = t.to(torch.float16)
            entry["kind"] = "fp16"
        else:
            tensors["p." + name] = t
            entry["kind"] = "keep"
        layout[name] = entry
    meta = {"format": FORMAT, "version": VERSION, "order": list(state), "tensors": layout}
    tensors["layout"] = torch.tensor(list(json.dumps(meta, separators=(",", ":")).encode()), dtype=torch.uint8)
    blob = save(tensors)
    return brotli.compress(shuffle2(blob), quality=11)


def decode(payload):
    tensors = load(unshuffle2(brotli.decompress(payload)))
    meta = json.loads(bytes(tensors["layout"].tolist()).decode())
    if (meta.get("format"), meta.get("version")) != (FORMAT, VERSION):
        raise ValueError(f"payload is not {FORMAT} v{VERSION}")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    out = {}
    for name in meta["order"]:
        entry = meta["tensors"][name]
        if entry["kind"] == "grid":
            q, s = tensors["q." + name], tensors["s." + name]
            out[name] = (q.to(torch.float32) * s.to(torch.float32)[:, None]).to(dtypes[entry["dtype"]])
        elif entry["kind"] == "fp16":
            out[name] = tensors["p." + name].to(dtypes[entry["dtype"]])
        else:
            out[name] = tensors["p." + name]
        if list(out[name].shape) != entry["shape"]:
            raise ValueError(f"payload tensor {name} has shape {list(out[name].shape)}, layout says {entry['shape']}")
    return out
