"""The confined half of `pgolf check`'s model check: build the model, one forward pass, the initial state.

    python -P -B -m scoring.worker.build_check SPEC_JSON     (started by harness/commands/preflight.py; not by hand)

Submitted code (model.py, and codec.py for `pack.codec = "submission"`) runs only here, confined as the
scorer's model worker is (harness/commands/preflight.py's `confined_build` starts it through
scoring/worker/confined.py; its entry point is every confined child's, scoring/worker/child.py). It
builds the model with `build_model(config)`, runs the forward pass on a tiny seeded int64 batch, checks
the output's shape and finiteness, writes the initial state (safetensors, no pickle) and, for the
submission's codec, the encoded payloads of that state and of `dense_state` of it, then a small report
(`report.json`: parameters, shapes, the output kind, the codec's name and version). The trusted side
reads these back without following links and believes them only as advice: the real boundary is the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scoring.worker.child import run_child

PREFLIGHT_SPEC_FORMAT = "pg-preflight-spec"
PREFLIGHT_SPEC_VERSION = 1
STATE_FILE = "state.safetensors"
PAYLOAD_FILE = "payload.bin"
DENSE_PAYLOAD_FILE = "payload_dense.bin"
REPORT_FILE = "report.json"


def _build_check(spec: dict[str, Any], memory: str) -> None:
    import torch

    from scoring.worker.loading import build_model, output_kind

    out = Path(spec["out"])
    code = Path(spec["code_dir"])
    torch.manual_seed(0)
    model = build_model(code, spec["model_config"])
    kind = output_kind(model)
    rows, length, vocab = int(spec["rows"]), int(spec["length"]), int(spec["vocab_size"])
    x = torch.randint(0, vocab, (rows, length), dtype=torch.int64, generator=torch.Generator().manual_seed(0))
    model.eval()
    with (
        torch.inference_mode(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["dtype"] == "bfloat16"),
    ):
        y = model(x)
    max_vocab = max(2 * vocab, vocab + 1024)  # the scorer's buffer (scoring/score/remote.py)
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"forward returned {type(y).__name__}; it must return a tensor [batch, seq, vocab]")
    if y.ndim != 3 or tuple(y.shape[:2]) != (rows, length) or not vocab <= y.shape[2] <= max_vocab:
        raise ValueError(
            f"forward({rows}x{length} int64) returned shape {list(y.shape)}; expected [{rows}, {length}, V] "
            f"with {vocab} <= V <= {max_vocab} (V: the data's vocabulary, {vocab})"
        )
    if not bool(torch.isfinite(y.float()).all()):
        raise ValueError("forward returned non-finite values (NaN or inf) at initialisation")
    state = {
        k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()
    }  # as a rank saves it
    from safetensors.torch import save_file

    save_file(state, str(out / STATE_FILE))
    report: dict[str, Any] = {
        "params": int(sum(p.numel() for p in model.parameters())),
        "input": [rows, length],
        "shape": list(y.shape),
        "output": kind,
    }
    if spec["codec"] == "submission":
        from scoring.artifact.codecs import load_submission_codec

        codec = load_submission_codec(code)
        for name, st in ((PAYLOAD_FILE, state), (DENSE_PAYLOAD_FILE, dense_state(state))):
            payload = codec.encode(st)
            if not isinstance(payload, bytes | bytearray):
                raise ValueError(f"codec.py encode(state) returned {type(payload).__name__}, not bytes")
            (out / name).write_bytes(payload)
        report.update(codec_name=codec.name, codec_version=codec.version)
    (out / REPORT_FILE).write_text(json.dumps(report), encoding="utf-8")


def dense_state(state: dict[str, Any]) -> dict[str, Any]:
    """Every floating tensor of `state` replaced by seeded N(0, 1) noise of its shape and dtype.

    Trained weights are dense and, under int8_zlib, span the codec's range (its smallest step is 1/127,
    so the small initial weights of a fresh model quantize to a few levels and compress far better
    than trained ones). The naive baseline's bytes_total: initial weights 4,937,165, this 15,904,723,
    the reference's trained artifact 15,863,489. A bound to warn on, not a promise: other weights differ.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    return {
        k: torch.randn(v.shape, generator=gen, dtype=torch.float32).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in state.items()
    }


def main(argv: list[str]) -> int:
    """The confined build (scoring/worker/child.py: the spec, the limits, one error line, the exit status)."""
    return run_child(
        argv,
        spec_format=PREFLIGHT_SPEC_FORMAT,
        spec_version=PREFLIGHT_SPEC_VERSION,
        usage="python -m scoring.worker.build_check SPEC_JSON  (started by pgolf check)",
        body=_build_check,
    )


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
