"""Codecs: a state dict of tensors <-> the compressed bytes counted against the cap.

One small interface. A codec is any object with:
    name: str                      recorded in the artifact header
    version: int                   bumped on any change of numerics or layout
    encode(state) -> bytes         state: dict[str, torch.Tensor] (CPU)
    decode(payload) -> state       must give back exactly the tensors the model loads

Built-in codecs are registered in `CODECS`: `int8_zlib` (the reference's packing, int8_zlib.py) and the
family `QUANT_COMPRESSOR[_shuffle]` (rowquant.py: per-row int5-int8 or a mixed role table, an optional
byte shuffle, zlib9/zstd22/lzma9/brotli11). A codec *spec* is a name, or for mixed_* a name with a role
table (`mixed_zstd22:mlp=int5`); `get_codec` and `check_codec_spec` read specs.

A submission may bring its own in `codec.py`
(module-level NAME, VERSION, encode, decode); `load_submission_codec` loads it by path.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Protocol

import torch

from harness.api import CODEC_ATTRS, CODEC_FILE
from scoring.artifact.codec_names import CODEC_GRAMMAR, check_codec_spec, rowquant_names
from scoring.artifact.codecs.int8_zlib import Int8Zlib
from scoring.artifact.codecs.rowquant import parse_codec

StateDict = dict[str, torch.Tensor]


class Codec(Protocol):
    name: str
    version: int

    def encode(self, state: StateDict) -> bytes: ...

    def decode(self, payload: bytes) -> StateDict: ...


CODECS: dict[str, Codec] = {"int8_zlib": Int8Zlib(), **{n: parse_codec(n) for n in rowquant_names()}}
SUBMISSION_CODEC_FILE = CODEC_FILE


def load_submission_codec(submission_dir: str | os.PathLike[str]) -> Codec:
    """The codec defined by `SUBMISSION_DIR/codec.py` (NAME, VERSION, encode, decode)."""
    path = Path(submission_dir) / SUBMISSION_CODEC_FILE
    spec = importlib.util.spec_from_file_location(f"pgolf_submission_codec_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"{path} not found: a custom codec lives in the submission's codec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [n for n in CODEC_ATTRS if not hasattr(module, n)]
    if missing:
        raise ValueError(
            f"{path} must define {', '.join(missing)} (see submissions/README.md, 'Custom codecs')"
        )

    class _SubmissionCodec:
        name = str(module.NAME)
        version = int(module.VERSION)
        encode = staticmethod(module.encode)
        decode = staticmethod(module.decode)

    return _SubmissionCodec()


def get_codec(name: str, submission_dir: str | os.PathLike[str] | None = None) -> Codec:
    """A built-in codec by name, or the submission's own when `name` is "submission"."""
    if name == "submission":
        if submission_dir is None:
            raise ValueError("codec 'submission' needs the submission folder")
        return load_submission_codec(submission_dir)
    if name in CODECS:
        return CODECS[name]
    if ":" in name:  # a mixed codec with its role table
        return parse_codec(name)
    raise ValueError(f"unknown codec {name!r}; built-in codecs: int8_zlib, {CODEC_GRAMMAR}, or 'submission'")


__all__ = [
    "CODECS",
    "CODEC_GRAMMAR",
    "Codec",
    "StateDict",
    "check_codec_spec",
    "get_codec",
    "load_submission_codec",
]
