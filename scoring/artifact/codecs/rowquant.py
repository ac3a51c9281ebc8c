"""Per-row integer quantisation at 5-8 bits, an optional byte shuffle, and one compressor.

A codec's name says all three: `QUANT_COMPRESSOR[_shuffle]`, e.g. `int6_zstd22`, `int6_brotli11_shuffle`,
`int5_lzma9`, `mixed_brotli11_shuffle`. QUANT is int5, int6, int7, int8 or mixed; COMPRESSOR is zlib9,
zstd22, lzma9 or brotli11 (compress.py).

Each tensor gets one *role*, decided in this order:
    small      not a floating-point 2-D tensor, or fewer than SMALL_NUMEL (4,096) elements
    embedding  2-D, name contains "tok_emb", "embed" or "lm_head"
    attention  2-D, name contains "attn" or "attention"
    mlp        2-D, name contains "mlp", "ffn" or "feed_forward"
    other      every other 2-D float tensor
and each role a *scheme*: int5, int6, int7 or int8 (per-row quantisation), fp16, or keep (the tensor's
own bytes, exact). Non-float tensors are always kept exactly; `small` may be fp16 or keep.
    intB codecs:  embedding int8, attention/mlp/other intB, small fp16
    mixed codecs: a table of roles (ROLE_TABLE_DEFAULT unless the codec spec names one):
                  `mixed_zstd22:embedding=int8,attention=int6,mlp=int5,other=int6,small=fp16`
                  (unknown roles or schemes are refused when the spec is parsed: at config time)

Per-row quantisation at B bits of a 2-D float tensor W (rows r; W in float32, the sums in float64):
    qmax = 2**(B-1) - 1                                    (15, 31, 63, 127)
    rms_r = sqrt(mean_j W[r,j]**2),  amax_r = max_j |W[r,j]|  (float64)
    for each k in CLIP_K (2.5, 3, 3.5, 4, 5, 6, 8, 12, then amax itself):
        clip = min(k * rms_r, amax_r)
        s    = float16(clip / qmax), with 0 -> 1 and overflow -> 65504 (float16's largest)
        q    = clamp(round(W[r] / s), -qmax, qmax)          (float32; round half to even)
        err  = sum_j (q*s - W[r,j])**2                     (float64)
    then, for m in qmax-1, qmax-2, qmax-3 (GRID_STEPS), the same with clip = amax * qmax / m, i.e.
        s = float16(amax / m): the grid of a row already quantised whose largest |q| is m
    the row keeps the (q, s) of least err (ties: the earlier candidate). Stored: q as int8, s as float16.
    A row already on a grid q * s (s a float16, |q| <= qmax, max |q| >= qmax - 3: what GPTQ leaves,
    harness/train/gptq.py) is kept exactly (err 0): amax / max|q| is its own s.
    Decode: W'[r,j] = q[r,j] * float32(s_r), cast to the tensor's dtype.
fp16: the tensor as float16, cast back to its dtype on decode (float32/bfloat16 lose low bits).

Container (no pickle): a safetensors blob whose metadata "layout" (JSON) names, per tensor, its scheme,
dtype and shape (and the state's order); tensors `q.NAME` (int8 codes), `s.NAME` (float16 scales), `p.NAME` (fp16/kept bytes).
With `_shuffle`, every stored array of multi-byte elements (scales, fp16 and kept tensors) is stored
byte-shuffled: a uint8 tensor of shape (width, n), row i holding byte i of each element. The blob is
then compressed. Decode checks every name, dtype and shape against the layout and raises PayloadError.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scoring.artifact.codec_names import (
    INT_SCHEMES,
    ROLE_TABLE_DEFAULT,
    parse_role_table,
    split_spec,
)
from scoring.artifact.codecs.compress import COMPRESSORS, Compressor, PayloadError

StateDict = dict[str, torch.Tensor]

PAYLOAD_FORMAT = "pg-rowquant"
PAYLOAD_VERSION = 1
SMALL_NUMEL = 4096
CLIP_K = (2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, math.inf)
GRID_STEPS = 3
"""Candidates s = amax / m for m = qmax-1 ... qmax-GRID_STEPS: a row already on a grid keeps it exactly."""
ROLE_PATTERNS = {
    "embedding": ("tok_emb", "embed", "lm_head"),
    "attention": ("attn", "attention"),
    "mlp": ("mlp", "ffn", "feed_forward"),
}
FP16_MAX = 65504.0


def role_of(name: str, t: torch.Tensor) -> str:
    """The tensor's role (module docstring): small, embedding, attention, mlp or other."""
    if not t.is_floating_point() or t.ndim != 2 or t.numel() < SMALL_NUMEL:
        return "small"
    for role, patterns in ROLE_PATTERNS.items():
        if any(p in name for p in patterns):
            return role
    return "other"


def quantize_rows(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float16 per-row scales) of a 2-D float tensor, by the rule in the module docstring.

    The row sums (rms, err) are numpy float64 reductions, which do not depend on torch's thread count:
    the same state gives the same bytes whatever the threads.
    """
    qmax = 2 ** (bits - 1) - 1
    w32 = w.detach().to(torch.float32).contiguous().numpy()
    w64 = w32.astype(np.float64)
    rows, cols = w32.shape
    rms = np.sqrt(np.square(w64).sum(axis=1) / max(cols, 1))
    amax = np.abs(w64).max(axis=1) if cols else np.zeros(rows)
    best_q = np.zeros(w32.shape, dtype=np.int8)
    best_s = np.ones(rows, dtype=np.float16)
    best_err = np.full(rows, np.inf)
    clips = [amax if math.isinf(k) else np.minimum(rms * k, amax) for k in CLIP_K]
    clips += [amax * (qmax / m) for m in range(qmax - 1, qmax - 1 - GRID_STEPS, -1)]
    for clip in clips:
        s16 = np.minimum(clip / qmax, FP16_MAX).astype(np.float16)
        s16[s16 == 0] = 1.0
        s32 = s16.astype(np.float32)[:, None]
        q = np.clip(np.rint(w32 / s32), -qmax, qmax)
        err = np.square(q.astype(np.float64) * s32 - w64).sum(axis=1)
        better = err < best_err
        best_err[better] = err[better]
        best_s[better] = s16[better]
        best_q[better] = q[better].astype(np.int8)
    return torch.from_numpy(best_q), torch.from_numpy(best_s)


def dequantize_rows(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * s.to(torch.float32)[:, None]).to(dtype).contiguous()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise PayloadError(f"payload names an unknown dtype {name!r}")
    return dtype


def _shuffle(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as uint8 (width, numel): row i holds byte i of every element."""
    width = t.element_size()
    return t.contiguous().reshape(-1).view(torch.uint8).view(-1, width).t().contiguous()


def _unshuffle(b: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    width = torch.empty((), dtype=dtype).element_size()
    if b.dtype != torch.uint8 or b.ndim != 2 or b.shape[0] != width or b.shape[1] != math.prod(shape):
        raise PayloadError(
            f"shuffled array has shape {list(b.shape)}, expected [{width}, {math.prod(shape)}]"
        )
    return b.t().contiguous().view(-1).view(dtype).reshape(shape).clone()


class RowQuantCodec:
    """One `QUANT_COMPRESSOR[_shuffle]` codec (module docstring). `roles`: the role table (ROLES -> scheme);
    None: the quant's default (intB: B everywhere but embedding int8 and small fp16; mixed: ROLE_TABLE_DEFAULT).
    Version 2: the grid candidates (GRID_STEPS) added to the encoder; decode unchanged."""

    version = 2

    def __init__(
        self, quant: str, compressor: Compressor, shuffle: bool = False, roles: dict[str, str] | None = None
    ) -> None:
        self.quant, self.compressor, self.shuffle = quant, compressor, shuffle
        self.roles = dict(roles) if roles is not None else None
        self.name = f"{quant}_{compressor.name}" + ("_shuffle" if shuffle else "")

    def role_table(self) -> dict[str, str]:
        if self.roles is not None:
            return dict(self.roles)
        if self.quant == "mixed":
            return dict(ROLE_TABLE_DEFAULT)
        return {
            "embedding": "int8",
            "attention": self.quant,
            "mlp": self.quant,
            "other": self.quant,
            "small": "fp16",
        }

    def _store(self, tensors: StateDict, key: str, t: torch.Tensor) -> None:
        tensors[key] = _shuffle(t) if self.shuffle and t.element_size() > 1 else t.contiguous()

    def container(self, state: StateDict) -> tuple[StateDict, dict[str, Any]]:
        """The blob's tensors and layout before serialisation (exposed for tests and audits)."""
        table = self.role_table()
        tensors: StateDict = {}
        layout: dict[str, Any] = {}
        for name, tensor in state.items():
            t = tensor.detach().to("cpu").contiguous()
            role = role_of(name, t)
            scheme = table[role] if t.is_floating_point() else "keep"
            entry: dict[str, Any] = {"scheme": scheme, "dtype": _dtype_name(t.dtype), "shape": list(t.shape)}
            if scheme in INT_SCHEMES:
                q, s = quantize_rows(t, INT_SCHEMES[scheme])
                tensors[f"q.{name}"] = q
                self._store(tensors, f"s.{name}", s)
            elif scheme == "fp16":
                self._store(tensors, f"p.{name}", t.to(torch.float16))
            else:
                self._store(tensors, f"p.{name}", t)
            entry["shuffled"] = self.shuffle
            layout[name] = entry
        meta = {"format": PAYLOAD_FORMAT, "version": PAYLOAD_VERSION, "codec": self.name, "roles": table}
        return tensors, {**meta, "order": list(state), "tensors": layout}

    def encode(self, state: StateDict) -> bytes:
        tensors, layout = self.container(state)
        blob = st_save(
            tensors, metadata={"layout": json.dumps(layout, sort_keys=True, separators=(",", ":"))}
        )
        return self.compressor.compress(blob)

    def decode(self, payload: bytes) -> StateDict:
        blob = self.compressor.decompress(payload)
        try:
            tensors = st_load(blob)
            layout = json.loads(_metadata(blob)["layout"])
        except PayloadError:
            raise
        except Exception as e:  # the safetensors parser's own error types, JSON, a missing key
            raise PayloadError(
                f"{self.name} payload holds no valid container ({type(e).__name__}: {e})"
            ) from e
        if not isinstance(layout, dict) or (layout.get("format"), layout.get("version")) != (
            PAYLOAD_FORMAT,
            PAYLOAD_VERSION,
        ):
            raise PayloadError(f"{self.name} payload is not {PAYLOAD_FORMAT} v{PAYLOAD_VERSION}")
        if layout.get("codec") != self.name:
            raise PayloadError(f"payload was made by codec {layout.get('codec')!r}, not {self.name!r}")
        entries, order = layout.get("tensors"), layout.get("order")
        if not isinstance(entries, dict) or not isinstance(order, list) or sorted(order) != sorted(entries):
            raise PayloadError(f"{self.name} payload has no consistent tensor layout")
        out: StateDict = {}
        used: set[str] = set()
        for name in order:  # the state's own order (the layout's JSON keys are sorted)
            entry = entries[name]
            try:
                out[name] = self._decode_one(name, entry, tensors, used)
            except (KeyError, TypeError, RuntimeError) as e:
                raise PayloadError(
                    f"{self.name} payload: tensor {name!r} is malformed ({type(e).__name__}: {e})"
                ) from e
        extra = sorted(set(tensors) - used)
        if extra:
            raise PayloadError(f"{self.name} payload holds arrays no tensor uses: {extra[:5]}")
        return out

    def _decode_one(
        self, name: str, entry: dict[str, Any], tensors: StateDict, used: set[str]
    ) -> torch.Tensor:
        scheme, dtype, shape = entry["scheme"], _dtype(entry["dtype"]), entry["shape"]
        if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise PayloadError(f"{self.name} payload: tensor {name!r} has shape {shape!r}")
        shuffled = entry["shuffled"] is True

        def stored(key: str, want: torch.dtype, want_shape: list[int]) -> torch.Tensor:
            used.add(key)
            t = tensors[key]
            if shuffled and torch.empty((), dtype=want).element_size() > 1:
                return _unshuffle(t, want, want_shape)
            if t.dtype != want or list(t.shape) != want_shape:
                raise PayloadError(
                    f"{self.name} payload: {key} is {_dtype_name(t.dtype)}{list(t.shape)}, "
                    f"expected {_dtype_name(want)}{want_shape}"
                )
            return t

        if scheme in INT_SCHEMES:
            if len(shape) != 2:
                raise PayloadError(f"{self.name} payload: quantised tensor {name!r} has shape {shape}")
            q = stored(f"q.{name}", torch.int8, shape)
            s = stored(f"s.{name}", torch.float16, shape[:1])
            return dequantize_rows(q, s, dtype)
        if scheme == "fp16":
            return stored(f"p.{name}", torch.float16, shape).to(dtype).contiguous()
        if scheme == "keep":
            return stored(f"p.{name}", dtype, shape)
        raise PayloadError(f"{self.name} payload: tensor {name!r} has unknown scheme {scheme!r}")


def _metadata(blob: bytes) -> dict[str, str]:
    n = int.from_bytes(blob[:8], "little")
    if len(blob) < 8 or n <= 0 or n > len(blob) - 8:
        raise PayloadError("payload has a malformed safetensors header")
    meta = json.loads(blob[8 : 8 + n]).get("__metadata__") or {}
    if "layout" not in meta:
        raise PayloadError("payload's container has no layout")
    return meta


def parse_codec(spec: str) -> RowQuantCodec:
    """`QUANT_COMPRESSOR[_shuffle][:ROLE=SCHEME,...]` (the role table only for mixed); ValueError otherwise."""
    quant, compressor, shuffle, table = split_spec(spec)
    roles = None if table is None else parse_role_table(table, f"codec {spec!r}")
    return RowQuantCodec(quant, COMPRESSORS[compressor], shuffle, roles)
