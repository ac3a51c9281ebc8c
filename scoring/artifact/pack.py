"""Pack a trained state into an artifact, enforce the cap; unpack an artifact back to tensors.

    pack_state(state, submission_dir, out, codec_name, model_config, cap_bytes) -> pack record
    unpack_artifact(artifact_path, out_safetensors, submission_dir=None)   (a custom codec decodes confined)

The pack record (format "pg-pack", version 1) carries bytes_code, bytes_model, bytes_total,
cap_bytes, within_cap, the codec, the artifact's sha256 and the encode time. Over the cap, the
artifact is still written (so it can be inspected) but ArtifactTooLarge is raised with every number.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from data.io import sha256_file
from harness.api import API_VERSION
from scoring.artifact.cap import CapCheck, code_bytes, counted_files
from scoring.artifact.codecs import CODECS, StateDict, get_codec
from scoring.artifact.format import artifact_codec, build_header, decode_state, read_artifact, write_artifact

PACK_FORMAT = "pg-pack"
PACK_FORMAT_VERSION = 1


def read_state(path: str | os.PathLike[str]) -> tuple[StateDict, dict[str, str]]:
    """Tensors and string metadata of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"state file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no items()
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from e
    return state, meta


def model_config_of(meta: dict[str, str]) -> dict[str, Any] | None:
    return json.loads(meta["model_config"]) if "model_config" in meta else None


def pack_state(
    state: StateDict,
    submission_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    codec_name: str,
    model_config: dict[str, Any],
    cap_bytes: int,
) -> dict[str, Any]:
    """Encode, write the artifact, count bytes, enforce the cap. Returns the pack record."""
    submission_dir = Path(submission_dir)
    codec = get_codec(codec_name, submission_dir)
    files = counted_files(submission_dir)
    n_code = code_bytes(submission_dir, files)
    t0 = time.perf_counter()
    payload = codec.encode({k: v.detach().cpu().contiguous() for k, v in state.items()})
    encode_s = time.perf_counter() - t0
    header = build_header(
        state, codec, payload, model_config=model_config, code_files=files, bytes_code=n_code
    )
    n_model = write_artifact(out, header, payload)
    check = CapCheck(n_code, n_model, cap_bytes)
    record = {
        "format": PACK_FORMAT,
        "format_version": PACK_FORMAT_VERSION,
        "api_version": API_VERSION,
        "codec": {"name": codec.name, "version": codec.version},
        "artifact": str(Path(out)),
        "artifact_sha256": sha256_file(out),
        "code_files": files,
        "encode_time_s": encode_s,
        "num_tensors": len(state),
        "num_params": int(sum(v.numel() for v in state.values())),
        **check.as_dict(),
    }
    return record


def unpack_artifact(
    artifact_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    submission_dir: str | os.PathLike[str] | None = None,
) -> StateDict:
    """Decode an artifact and write the dequantized tensors as safetensors (a standard format).

    A built-in codec decodes here. The submission's own codec.py is submitted code: it decodes only in a
    confined process (scoring/worker/decode.py), and this process reads back plain tensors, checked
    against the header, and writes `out` itself.
    """
    artifact = read_artifact(artifact_path)
    if artifact.codec_name in CODECS:
        state = decode_state(artifact, artifact_codec(artifact, None))
    elif submission_dir is None:
        raise ValueError(
            f"{artifact_path} was packed with the submission's own codec ({artifact.codec_name!r}): "
            "pass --submission, the folder it was packed from"
        )
    else:
        from scoring.worker.decode import decode_confined

        state = decode_confined(artifact_path, submission_dir)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_name(f".{Path(out).name}.tmp")
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(tmp),
        metadata={"model_config": json.dumps(artifact.model_config, sort_keys=True)},
    )
    os.replace(tmp, out)
    return state


def state_equal(a: StateDict, b: StateDict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
