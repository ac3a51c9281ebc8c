"""Pack a trained state into an artifact, enforce the cap.

    pack_state(state, submission_dir, out, codec_name, model_config, cap_bytes) -> pack record

(The way back, `pgolf unpack`, is scoring/worker/decode.py unpack_artifact: a custom codec decodes there,
confined.)

The pack record (format "pg-pack", version 1) carries bytes_code, bytes_model, bytes_total,
cap_bytes, within_cap, the codec, the artifact's sha256 and the encode time. Over the cap, the
artifact is still written (so it can be inspected) but ArtifactTooLarge is raised with every number.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self

import torch
from safetensors import safe_open

from data.io import sha256_file
from data.records import field, require_format
from harness.api import API_VERSION
from scoring.artifact.cap import CapCheck, code_bytes, counted_files
from scoring.artifact.codecs import StateDict, get_codec
from scoring.artifact.format import build_header, write_artifact

PACK_FORMAT = "pg-pack"
PACK_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class PackRecord:
    """The pack record ("pg-pack"): built by pack_state, written as pack.json, read by the pipeline."""

    format: str = PACK_FORMAT
    format_version: int = PACK_FORMAT_VERSION
    api_version: int = API_VERSION
    codec: dict[str, Any]
    artifact: str
    artifact_sha256: str
    code_files: dict[str, str]
    encode_time_s: float
    num_tensors: int
    num_params: int
    bytes_code: int
    bytes_model: int
    bytes_total: int
    cap_bytes: int
    within_cap: bool

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: object) -> Self:
        """A pack record read back, checked; ValueError names the field that is wrong."""
        what = "pack record"
        d = require_format(d, what, PACK_FORMAT, PACK_FORMAT_VERSION)
        codec = field(d, "codec", dict, what)
        if not isinstance(codec.get("name"), str):
            raise ValueError(f"{what} field 'codec' has no name")
        files = field(d, "code_files", dict, what)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError(f"{what} field 'code_files' is not a map of paths to sha256")
        n = {
            k: field(d, k, int, what, non_negative=True)
            for k in ("num_tensors", "num_params", "bytes_code", "bytes_model", "bytes_total", "cap_bytes")
        }
        if n["bytes_total"] != n["bytes_code"] + n["bytes_model"]:
            raise ValueError(
                f"{what} field 'bytes_total' = {n['bytes_total']} is not bytes_code + bytes_model "
                f"= {n['bytes_code'] + n['bytes_model']}"
            )
        return cls(
            format=d["format"],
            format_version=d["format_version"],
            api_version=field(d, "api_version", int, what),
            codec=codec,
            artifact=field(d, "artifact", str, what),
            artifact_sha256=field(d, "artifact_sha256", str, what),
            code_files=files,
            encode_time_s=field(d, "encode_time_s", (int, float), what, finite=True, non_negative=True),
            within_cap=field(d, "within_cap", bool, what),
            **n,
        )


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
    """Encode, write the artifact, count bytes, enforce the cap. Returns the pack record (PackRecord.to_json())."""
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
    record = PackRecord(
        codec={"name": codec.name, "version": codec.version},
        artifact=str(Path(out)),
        artifact_sha256=sha256_file(out),
        code_files=files,
        encode_time_s=encode_s,
        num_tensors=len(state),
        num_params=int(sum(v.numel() for v in state.values())),
        bytes_code=check.bytes_code,
        bytes_model=check.bytes_model,
        bytes_total=check.bytes_total,
        cap_bytes=check.cap_bytes,
        within_cap=check.within_cap,
    )
    return record.to_json()


def state_equal(a: StateDict, b: StateDict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
