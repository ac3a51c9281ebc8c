"""`int8_zlib`: the canonical packing, numerically identical to the reference's `int8_clean_per_row_v1`.

Per tensor (docs/RULES.md, "The canonical int8 codec"):
- non-float tensors pass through exactly;
- float tensors of at most 65,536 elements pass through: float32 when the name contains a control
  pattern (attn_scale, mlp_scale, resid_mix, q_gain, skip_weight, ...), else float32/bfloat16 are
  stored as float16 (restored to their dtype on decode) and other float dtypes kept as they are;
- 2-D float tensors: per row, clip = the 0.9999984 quantile of |w| (linear interpolation, as
  torch.quantile), s = max(clip/127, 1/127) in float32, q = round(clamp(w, ±clip)/s) clamped to
  [-127, 127]; the stored scale is s rounded to float16 and decode multiplies by it;
- other float tensors: one float32 scale, clip/127 (or 1 when clip is 0).

The container is not a pickle: a safetensors blob (tensors `q.NAME`, `s.NAME`, `p.NAME`, layout in
its JSON metadata) compressed with zlib level 9.
"""

from __future__ import annotations

import json
import zlib

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

CONTROL_TENSOR_NAME_PATTERNS = (
    "attn_scale",
    "attn_scales",
    "mlp_scale",
    "mlp_scales",
    "resid_mix",
    "resid_mixes",
    "q_gain",
    "skip_weight",
    "skip_weights",
)
KEEP_FLOAT_MAX_NUMEL = 65_536
KEEP_FLOAT_STORE_DTYPE = torch.float16
PER_ROW_SCALE_DTYPE = torch.float16
CLIP_Q = 99.99984 / 100.0
QMAX = 127
ZLIB_LEVEL = 9
QUANT_FORMAT = "int8_clean_per_row_v1"
# torch.quantile refuses inputs above 2**24 elements; rows are processed in chunks below that.
_QUANTILE_MAX_NUMEL = 1 << 24

StateDict = dict[str, torch.Tensor]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"int8_zlib payload names an unknown dtype {name!r}")
    return dtype


def row_clip(t32: torch.Tensor) -> torch.Tensor:
    """Per-row CLIP_Q quantile of |t32| (2-D float32), chunked to stay within torch.quantile's limit."""
    rows, cols = t32.shape
    if t32.numel() == 0:
        return torch.zeros((rows,), dtype=torch.float32)
    step = max(1, _QUANTILE_MAX_NUMEL // max(cols, 1))
    parts = [torch.quantile(t32[i : i + step].abs(), CLIP_Q, dim=1) for i in range(0, rows, step)]
    return torch.cat(parts)


def quantize_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 q, scale): per-row float16 scales for 2-D tensors, one float32 scale otherwise."""
    t32 = t.float()
    if t32.ndim == 2:
        clips = row_clip(t32)
        clipped = torch.maximum(torch.minimum(t32, clips[:, None]), -clips[:, None])
        row_scale = (clips / float(QMAX)).clamp_min(1.0 / QMAX)
        q = torch.clamp(torch.round(clipped / row_scale[:, None]), -QMAX, QMAX).to(torch.int8)
        return q.contiguous(), row_scale.to(PER_ROW_SCALE_DTYPE).contiguous()
    flat = t32.abs().flatten()
    if flat.numel() == 0:
        clip = 0.0
    elif flat.numel() <= _QUANTILE_MAX_NUMEL:
        clip = float(torch.quantile(flat, CLIP_Q).item())
    else:  # same linear interpolation as torch.quantile, on a sorted copy
        srt = flat.sort().values
        pos = CLIP_Q * (srt.numel() - 1)
        lo = int(pos)
        hi = min(lo + 1, srt.numel() - 1)
        clip = float(torch.lerp(srt[lo], srt[hi], torch.tensor(pos - lo, dtype=torch.float32)).item())
    scale = torch.tensor(clip / float(QMAX) if clip > 0 else 1.0, dtype=torch.float32)
    q = torch.clamp(torch.round(torch.clamp(t32, -clip, clip) / scale), -QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale


def dequantize_tensor(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if scale.ndim > 0:
        s = scale.to(torch.float32).view(q.shape[0], *([1] * (q.ndim - 1)))
        return (q.float() * s).to(dtype).contiguous()
    return (q.float() * float(scale.item())).to(dtype).contiguous()


def is_control(name: str) -> bool:
    return any(p in name for p in CONTROL_TENSOR_NAME_PATTERNS)


class Int8Zlib:
    name = "int8_zlib"
    version = 1

    def quantize(self, state: StateDict) -> tuple[StateDict, dict]:
        """The container's tensors and layout, before serialisation (exposed for tests and audits)."""
        tensors: StateDict = {}
        layout: dict = {"__quant_format__": QUANT_FORMAT, "quantized": {}, "passthrough": {}}
        for name, tensor in state.items():
            t = tensor.detach().to("cpu").contiguous()
            if not t.is_floating_point():
                tensors[f"p.{name}"] = t
                layout["passthrough"][name] = None
            elif t.numel() <= KEEP_FLOAT_MAX_NUMEL:
                orig = None
                if is_control(name):  # kept in float32, and (as the reference does) not cast back
                    kept = t.float().contiguous()
                elif t.dtype in (torch.float32, torch.bfloat16):
                    kept = t.to(KEEP_FLOAT_STORE_DTYPE).contiguous()
                    orig = _dtype_name(t.dtype)
                else:
                    kept = t
                tensors[f"p.{name}"] = kept
                layout["passthrough"][name] = orig
            else:
                q, s = quantize_tensor(t)
                tensors[f"q.{name}"] = q
                tensors[f"s.{name}"] = s
                layout["quantized"][name] = {"dtype": _dtype_name(t.dtype), "per_row": s.ndim > 0}
        return tensors, layout

    def encode(self, state: StateDict) -> bytes:
        tensors, layout = self.quantize(state)
        blob = st_save(tensors, metadata={"layout": json.dumps(layout, sort_keys=True)})
        return zlib.compress(blob, level=ZLIB_LEVEL)

    def decode(self, payload: bytes) -> StateDict:
        try:
            blob = zlib.decompress(payload)
        except zlib.error as e:
            raise ValueError(f"int8_zlib payload does not decompress ({e}): corrupt artifact") from e
        try:
            tensors = st_load(blob)
            layout = json.loads(_metadata(blob)["layout"])
        except Exception as e:  # the safetensors parser's own error types, JSON, a missing key
            raise ValueError(
                f"int8_zlib payload holds no safetensors container ({type(e).__name__}: {str(e)[:200]}): corrupt artifact"
            ) from e
        if not isinstance(layout, dict) or layout.get("__quant_format__") != QUANT_FORMAT:
            got = layout.get("__quant_format__") if isinstance(layout, dict) else type(layout).__name__
            raise ValueError(f"int8_zlib payload has format {str(got)[:80]!r}, expected {QUANT_FORMAT}")
        out: StateDict = {}
        try:
            for name, meta in layout["quantized"].items():
                out[name] = dequantize_tensor(
                    tensors[f"q.{name}"], tensors[f"s.{name}"], _dtype(meta["dtype"])
                )
            for name, orig in layout["passthrough"].items():
                t = tensors[f"p.{name}"]
                out[name] = t.to(_dtype(orig)).contiguous() if orig else t
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"int8_zlib payload's layout does not match its tensors ({type(e).__name__}: {e})"
            ) from e
        return out


def _metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors blob (its JSON header), without loading tensors twice."""
    n = int.from_bytes(blob[:8], "little")
    if n <= 0 or n > len(blob) - 8:
        raise ValueError("int8_zlib payload has a malformed safetensors header")
    return json.loads(blob[8 : 8 + n]).get("__metadata__", {})
