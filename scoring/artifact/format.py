"""The artifact: one versioned file holding a codec's payload and a JSON header. No pickle.

Layout:
    8 bytes   magic b"PGOLFART"
    uint32 LE format_version (1)
    uint32 LE header length H
    H bytes   header, UTF-8 JSON: format "pg-artifact", format_version, codec {name, version},
              model_config (what build_model receives), code_files {path: sha256}, bytes_code,
              tensors {name: {shape, dtype}}, payload_bytes, payload_sha256
    rest      the codec's payload

bytes_model is the whole file's size: the header counts against the cap too.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from data.io import sha256_bytes, sha256_file, write_bytes_atomic
from harness.api import MODEL_FILE
from scoring.artifact.codecs import CODECS, Codec, StateDict, get_codec
from scoring.errors import ArtifactError

"""The file a submission must have: the scorer builds the model from it (scoring/worker/loading.py)."""

ARTIFACT_MAGIC = b"PGOLFART"
ARTIFACT_FORMAT = "pg-artifact"
ARTIFACT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
HEADER_KEYS = frozenset(
    {
        "format",
        "format_version",
        "codec",
        "model_config",
        "code_files",
        "bytes_code",
        "tensors",
        "payload_bytes",
        "payload_sha256",
    }
)


@dataclass(frozen=True)
class Artifact:
    header: dict[str, Any]
    payload: bytes

    @property
    def codec_name(self) -> str:
        return str(self.header["codec"]["name"])

    @property
    def model_config(self) -> dict[str, Any]:
        return dict(self.header.get("model_config") or {})


def build_header(
    state: StateDict,
    codec: Codec,
    payload: bytes,
    *,
    model_config: dict,
    code_files: dict[str, str],
    bytes_code: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "format": ARTIFACT_FORMAT,
        "format_version": ARTIFACT_VERSION,
        "codec": {"name": codec.name, "version": codec.version},
        "model_config": model_config,
        "code_files": code_files,
        "bytes_code": bytes_code,
        "tensors": {
            k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
            for k, v in state.items()
        },
        "payload_bytes": len(payload),
        "payload_sha256": sha256_bytes(payload),
        **(extra or {}),
    }


def encode_artifact(header: dict[str, Any], payload: bytes) -> bytes:
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _PREFIX.pack(ARTIFACT_MAGIC, ARTIFACT_VERSION, len(head)) + head + payload


def write_artifact(path: str | os.PathLike[str], header: dict[str, Any], payload: bytes) -> int:
    """Write atomically; returns the file's size in bytes (bytes_model)."""
    data = encode_artifact(header, payload)
    write_bytes_atomic(path, data)
    return len(data)


def read_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Read and check magic, version, header and payload hash."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"artifact not found: {path}")
    data = path.read_bytes()
    if len(data) < _PREFIX.size:
        raise ArtifactError(f"{path} is {len(data)} bytes: too short to be an artifact")
    magic, version, hlen = _PREFIX.unpack_from(data)
    if magic != ARTIFACT_MAGIC:
        raise ArtifactError(f"{path} is not a pgolf artifact (magic {magic!r}); make one with `pgolf pack`")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(
            f"{path} has artifact format_version {version}; this scorer reads {ARTIFACT_VERSION}"
        )
    if _PREFIX.size + hlen > len(data):
        raise ArtifactError(f"{path}: header length {hlen} runs past the end of the file (truncated?)")
    try:
        header = json.loads(data[_PREFIX.size : _PREFIX.size + hlen])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # nested past the parser's depth
        raise ArtifactError(f"{path}: header is not valid JSON ({e})") from e
    payload = data[_PREFIX.size + hlen :]
    if not isinstance(header, dict) or header.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path}: header is not a {ARTIFACT_FORMAT!r} header")
    missing = sorted(HEADER_KEYS - set(header))
    if missing:
        raise ArtifactError(f"{path}: header lacks {missing} (corrupt, or written by another tool)")
    wrong = header_type_problem(header)
    if wrong:
        raise ArtifactError(f"{path}: header field {wrong} (corrupt, or written by another tool)")
    if len(payload) != header.get("payload_bytes") or sha256_bytes(payload) != header.get("payload_sha256"):
        raise ArtifactError(f"{path}: payload does not match its recorded size/sha256 (corrupt or truncated)")
    return Artifact(header, payload)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


HEADER_MAX_DEPTH = 32
"""The deepest a header's JSON may nest (a model_config from TOML nests a few levels). The parser's own limit is
the interpreter's stack: a header just under it (992 levels, a codec `version` of nested lists) was read, then the
scorer's record, which holds the codec one level down, could not be written: a harness failure, not the entry's."""


def _depth(value: Any) -> int:
    """How deep `value` nests (a scalar: 0), without recursion, stopping past HEADER_MAX_DEPTH."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest <= HEADER_MAX_DEPTH:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _inside_folder(rel: str) -> bool:
    """Whether `rel` is a relative POSIX path that stays inside the folder it is joined onto."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and "\\" not in rel and "\0" not in rel and ".." not in parts


def header_type_problem(header: dict[str, Any]) -> str | None:
    """What is wrong with a header's shape (None: nothing): its nesting, its fields' types, its code files' paths.
    A submission's codec writes the artifact, and the trusted readers (the orchestrator, the scorer, `pgolf verify`)
    index these fields: a codec named by a string, or code files given as a string, crashed them with a bare
    TypeError."""
    if _depth(header) > HEADER_MAX_DEPTH:
        return f"nesting: the header nests past {HEADER_MAX_DEPTH} levels"
    codec, files, tensors = header["codec"], header["code_files"], header["tensors"]
    if not (isinstance(codec, dict) and isinstance(codec.get("name"), str)):
        return "codec must be {name: str, version}"
    if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
        return "code_files must map paths to sha256 strings"
    outside = next((k for k in files if not _inside_folder(k)), None)
    if outside is not None:
        # a trusted reader joins each path onto the submission folder and hashes what it names: `/etc/...` or
        # `../..` made it hash a file of the host's and say whether it matched a digest the entrant chose
        return f"code_files names {outside[:80]!r}: each must be a relative path inside the submission folder"
    if not isinstance(header["model_config"], dict | None):
        return "model_config must be an object"
    if not (_is_int(header["payload_bytes"]) and isinstance(header["payload_sha256"], str)):
        return "payload_bytes must be an integer and payload_sha256 a string"
    if not isinstance(tensors, dict):
        return "tensors must map names to {shape, dtype}"
    for name, meta in tensors.items():
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not (isinstance(shape, list) and all(_is_int(n) and n >= 0 for n in shape)):
            return f"tensors[{name[:80]!r}] must hold a shape of non-negative integers"
    return None


def check_code_hashes(artifact: Artifact, submission_dir: Path) -> None:
    """Every recorded code file present in `submission_dir` must match its recorded sha256."""
    for rel, digest in artifact.header.get("code_files", {}).items():
        p = submission_dir / rel
        if p.is_file() and sha256_file(p) != digest:
            raise ArtifactError(
                f"{p} differs from the code packed into the artifact (sha256 {digest[:12]}…); "
                "score with the submission folder the artifact was packed from"
            )
    if MODEL_FILE not in artifact.header.get("code_files", {}):
        raise ArtifactError(
            f"the artifact records no {MODEL_FILE}; it was not packed from a submission folder"
        )


def artifact_codec(artifact: Artifact, submission_dir: str | os.PathLike[str] | None) -> Codec:
    """The codec an artifact names: built-in by name, else the submission's own codec.py, imported only
    once the folder's code matches the hashes the artifact recorded."""
    if artifact.codec_name in CODECS:
        return get_codec(artifact.codec_name)
    if submission_dir is not None:
        check_code_hashes(artifact, Path(submission_dir))
    return get_codec("submission", submission_dir)


class Decoder(Protocol):
    """What decode_state needs of a codec: its name and decode (a Codec is one)."""

    name: str

    def decode(self, payload: bytes) -> StateDict: ...


def decode_state(artifact: Artifact, codec: Decoder) -> StateDict:
    """Decode the payload and check the tensors against the header's names and shapes.

    Dtypes are not compared: a codec may hand back a wider dtype (int8_zlib keeps control tensors in
    float32, as the reference does), and load_state_dict casts into the model's parameters.
    """
    if codec.name != artifact.codec_name:
        raise ArtifactError(f"artifact was packed with codec {artifact.codec_name!r}, not {codec.name!r}")
    state = codec.decode(artifact.payload)
    want = artifact.header["tensors"]
    if set(state) != set(want):
        missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
        raise ArtifactError(
            f"codec {codec.name} decoded the wrong tensors: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, meta in want.items():
        t = state[name]
        if list(t.shape) != meta["shape"]:
            raise ArtifactError(
                f"codec {codec.name} decoded {name} with shape {list(t.shape)}, header says {meta['shape']}"
            )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
