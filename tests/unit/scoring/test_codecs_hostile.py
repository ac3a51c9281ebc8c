"""Hostile payloads for the rowquant codecs and their compressors: truncated, corrupted, forged, bombs.

Every failure is a PayloadError (a ValueError: the CLI prints one line), never another exception, a hang
or an allocation sized by the payload's claims.
"""

from __future__ import annotations

import json
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save as st_save

from scoring.artifact.codecs import CODECS
from scoring.artifact.codecs import compress as compress_mod
from scoring.artifact.codecs.compress import COMPRESSORS, PayloadError
from scoring.artifact.codecs.rowquant import PAYLOAD_FORMAT, PAYLOAD_VERSION, RowQuantCodec


def small_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "tok_emb.weight": torch.randn(64, 64, generator=g) * 0.02,
        "blocks.0.mlp.fc.weight": torch.randn(128, 64, generator=g) * 0.05,
        "blocks.0.attn_scale": torch.ones(64),
        "ids": torch.arange(5),
    }


STATE = small_state()
SAMPLE = ["int6_zlib9", "int6_zstd22", "int6_lzma9", "int6_brotli11_shuffle"]
PAYLOADS = {n: CODECS[n].encode(STATE) for n in SAMPLE}


def _same_layout(out: dict[str, torch.Tensor]) -> bool:
    return list(out) == list(STATE) and all(
        out[k].shape == STATE[k].shape and out[k].dtype == STATE[k].dtype for k in STATE
    )


@pytest.mark.parametrize("name", SAMPLE)
def test_truncated_payloads_are_refused(name):
    payload = PAYLOADS[name]
    for cut in (0, 1, 5, len(payload) // 3, len(payload) // 2, len(payload) - 1):
        with pytest.raises(PayloadError):
            CODECS[name].decode(payload[:cut])


@pytest.mark.parametrize("name", SAMPLE)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_corrupted_payloads_fail_cleanly_or_keep_the_layout(name, data):
    """A flipped byte: PayloadError, or (a compressor without a checksum) a state whose tensors have the
    same shapes and dtypes in the same order. Not always the same names: brotli keeps no checksum, and one
    flipped literal is copied by every back-reference to it, so "blocks." can become "tables." in the
    container, the layout and the order alike (found by this test). The artifact's payload sha256
    (format.py) refuses such a payload before decode in the scorer's path."""
    payload = bytearray(PAYLOADS[name])
    pos = data.draw(st.integers(0, len(payload) - 1))
    payload[pos] ^= data.draw(st.integers(1, 255))
    try:
        out = CODECS[name].decode(bytes(payload))
    except PayloadError:
        return
    assert [(t.shape, t.dtype) for t in out.values()] == [(t.shape, t.dtype) for t in STATE.values()]
    assert _same_layout(out) or not name.startswith(("int6_zlib9", "int6_lzma9")), "zlib and xz check a CRC"


def test_a_consistently_renamed_brotli_payload_is_refused_by_the_artifact(tmp_path):
    """The case above, in the scorer's path: the artifact header's payload sha256 refuses the bytes."""
    from scoring.artifact.format import ArtifactError, build_header, read_artifact, write_artifact

    codec = CODECS["int6_brotli11_shuffle"]
    payload = PAYLOADS["int6_brotli11_shuffle"]
    header = build_header(STATE, codec, payload, model_config={}, code_files={}, bytes_code=0)
    path = tmp_path / "a.pgolf"
    write_artifact(path, header, payload)
    data = bytearray(path.read_bytes())
    data[len(data) - len(payload) + 195] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        read_artifact(path)


@pytest.mark.parametrize("junk", [b"", b"\x00", b"PGOLFART" * 10, bytes(range(256)) * 4])
@pytest.mark.parametrize("name", SAMPLE)
def test_junk_is_refused(name, junk):
    with pytest.raises(PayloadError):
        CODECS[name].decode(junk)


def test_a_payload_of_another_codec_is_refused():
    with pytest.raises(PayloadError, match="made by codec 'int6_zlib9', not 'int5_zlib9'"):
        CODECS["int5_zlib9"].decode(PAYLOADS["int6_zlib9"])
    with pytest.raises(PayloadError):
        CODECS["int6_zstd22"].decode(PAYLOADS["int6_zlib9"])  # another compressor


def _forge(tensors: dict[str, torch.Tensor], layout: object, codec: str = "int6_zlib9") -> bytes:
    meta = {"layout": json.dumps(layout)}
    return COMPRESSORS[codec.split("_")[1]].compress(st_save(tensors, metadata=meta))


def _layout(entries: dict, **over) -> dict:
    return {"format": PAYLOAD_FORMAT, "version": PAYLOAD_VERSION, "codec": "int6_zlib9", "roles": {},
            "order": list(entries), "tensors": entries} | over  # fmt: skip


Q = {"q.w": torch.zeros(2, 3, dtype=torch.int8), "s.w": torch.ones(2, dtype=torch.float16)}
ENTRY = {"scheme": "int6", "dtype": "float32", "shape": [2, 3], "shuffled": False}


def test_a_well_formed_forgery_decodes():
    out = CODECS["int6_zlib9"].decode(_forge(Q, _layout({"w": ENTRY})))
    assert out["w"].shape == (2, 3) and out["w"].dtype == torch.float32


@pytest.mark.parametrize(
    "tensors, layout, message",
    [
        (
            Q,
            _layout({"w": ENTRY | {"shape": [10**12, 10**12]}}),
            "expected int8",
        ),  # no allocation from claims
        (Q, _layout({"w": ENTRY | {"shape": [2, 3, 1]}}), "quantised tensor 'w' has shape"),
        (Q, _layout({"w": ENTRY | {"shape": [2, -3]}}), "has shape"),
        (Q, _layout({"w": ENTRY | {"shape": "2x3"}}), "has shape"),
        (Q, _layout({"w": ENTRY | {"dtype": "os.system"}}), "unknown dtype"),
        (Q, _layout({"w": ENTRY | {"dtype": "Tensor"}}), "unknown dtype"),
        (Q, _layout({"w": ENTRY | {"scheme": "int4"}}), "unknown scheme"),
        (Q, _layout({"w": ENTRY | {"shuffled": True}}), "shuffled array has shape"),
        (Q, _layout({"w": {"scheme": "int6"}}), "malformed"),
        (Q, _layout({"w": "int6"}), "malformed"),
        (Q, _layout({"w": ENTRY, "v": ENTRY}), "malformed"),  # arrays of v missing
        (Q | {"x.extra": torch.zeros(1)}, _layout({"w": ENTRY}), "arrays no tensor uses"),
        (Q, _layout({"w": ENTRY}, order=["w", "w2"]), "no consistent tensor layout"),
        (Q, _layout({"w": ENTRY}, format="pg-other"), "is not pg-rowquant"),
        (Q, _layout({"w": ENTRY}, version=2), "is not pg-rowquant"),
        (Q, [1, 2], "is not pg-rowquant"),
        (
            {"s.w": torch.ones(2, dtype=torch.float16), "q.w": torch.zeros(2, 3)},
            _layout({"w": ENTRY}),
            "expected int8",
        ),
        (
            {"p.w": torch.zeros(6, dtype=torch.float16)},
            _layout({"w": ENTRY | {"scheme": "fp16"}}),
            "expected float16[2, 3]",
        ),
    ],
)
def test_forged_layouts_are_refused(tensors, layout, message):
    with pytest.raises(PayloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        CODECS["int6_zlib9"].decode(_forge(tensors, layout))


def test_a_container_without_layout_is_refused():
    blob = zlib.compress(st_save({"q.w": torch.zeros(2, dtype=torch.int8)}), 9)
    with pytest.raises(PayloadError, match="no layout"):
        CODECS["int6_zlib9"].decode(blob)


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_decompression_is_bounded(name):
    c = COMPRESSORS[name]
    bomb = c.compress(bytes(3 << 20))  # 3 MiB of zeros: a few KB compressed
    assert len(bomb) < 50_000
    with pytest.raises(PayloadError, match="decompression bomb"):
        c.decompress(bomb, limit=1 << 20)
    assert c.decompress(bomb, limit=3 << 20) == bytes(3 << 20)


def test_the_codecs_use_the_module_bound(monkeypatch):
    monkeypatch.setattr(compress_mod, "MAX_DECODED_BYTES", 10_000)
    with pytest.raises(PayloadError, match="past 10,000 bytes"):
        CODECS["int6_zstd22"].decode(PAYLOADS["int6_zstd22"])


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_trailing_bytes_and_concatenated_streams(name):
    c = COMPRESSORS[name]
    one = c.compress(b"abc" * 100)
    assert c.decompress(one) == b"abc" * 100
    try:
        out = c.decompress(one + one)
    except PayloadError:
        return
    assert out == b"abc" * 100  # a second stream is never read as more output


def test_the_codec_is_a_rowquant_codec():
    assert all(isinstance(CODECS[n], RowQuantCodec) for n in SAMPLE)
