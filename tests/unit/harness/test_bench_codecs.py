"""`pgolf bench codecs` on a tiny state, and pack.codec specs checked when the config is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.bench.codecs import reconstruction_error, split_specs
from harness.cli import main as pgolf_main
from harness.config import load_config
from scoring.artifact.codecs import CODECS, get_codec

BASELINE = Path(__file__).resolve().parents[3] / "baselines" / "naive_baseline"


@pytest.fixture
def state_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    state = {
        "tok_emb.weight": torch.randn(128, 64, generator=g) * 0.02,
        "blocks.0.attn.c_q.weight": torch.randn(64, 64, generator=g) * 0.05,
        "blocks.0.mlp.fc.weight": torch.randn(128, 64, generator=g) * 0.05,
        "blocks.0.attn_scale": torch.ones(64),
    }
    path = tmp_path / "s.safetensors"
    save_file(state, str(path))
    return path, load_file(str(path))  # as the bench reads it (a file's tensors come back sorted by name)


def test_json_record_per_codec(state_file, capsys):
    path, state = state_file
    rc = pgolf_main(
        [
            "bench",
            "codecs",
            str(path),
            "--codecs",
            "int6_zstd22,mixed_zlib9:mlp=int5,attention=int7",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    rec = json.loads(out)
    assert rec["format"] == "pg-bench-codecs" and rec["num_params"] == 128 * 64 + 64 * 64 + 128 * 64 + 64
    rows = {r["codec"]: r for r in rec["codecs"]}
    assert list(rows) == ["int8_zlib", "int6_zstd22", "mixed_zlib9:mlp=int5,attention=int7"]
    for spec, r in rows.items():
        codec = get_codec(spec)
        payload = codec.encode(state)
        assert r["bytes"] == len(payload)  # the codecs are deterministic
        assert r["ratio"] == r["bytes"] / rows["int8_zlib"]["bytes"]
        err = reconstruction_error(state, codec.decode(payload))
        assert r["rel_rms"] == err["rel_rms"] and r["max_abs"] == err["max_abs"]
        assert r["encode_s"] > 0 and r["decode_s"] > 0
    assert rows["int8_zlib"]["ratio"] == 1.0
    # int8_zlib keeps these small tensors as float16; int6 quantises them: smaller, and less exact
    assert rows["int6_zstd22"]["bytes"] < rows["int8_zlib"]["bytes"]
    assert rows["int6_zstd22"]["rel_rms"] > rows["int8_zlib"]["rel_rms"] > 0


def test_table_has_one_line_per_codec(state_file, capsys):
    path, _ = state_file
    assert pgolf_main(["bench", "codecs", str(path), "--codecs", "int5_brotli11_shuffle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"bench codecs: {path}: 4 tensors, 20,544 params")
    assert lines[1].split() == [
        "codec",
        "bytes",
        "vs",
        "int8_zlib",
        "encode_s",
        "decode_s",
        "rel_rms",
        "max_abs",
    ]
    assert [ln.split()[0] for ln in lines[2:]] == ["int8_zlib", "int5_brotli11_shuffle"]
    assert lines[2].split()[2] == "1.0000"


def test_reconstruction_error_by_hand():
    a = {"w": torch.tensor([3.0, 4.0]), "ids": torch.tensor([1, 2])}
    b = {"w": torch.tensor([3.0, 4.5]), "ids": torch.tensor([9, 9])}
    assert reconstruction_error(a, b) == {"rel_rms": 0.1, "max_abs": 0.5}  # sqrt(0.25 / 25)


def test_split_specs():
    assert split_specs("int8_zlib, int6_zstd22") == ["int8_zlib", "int6_zstd22"]
    assert split_specs("mixed_zstd22:mlp=int5,attention=int7,int5_lzma9,mixed_zlib9:small=keep") == [
        "mixed_zstd22:mlp=int5,attention=int7",
        "int5_lzma9",
        "mixed_zlib9:small=keep",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--codecs", "int6_zstd23"], "unknown codec 'int6_zstd23'; built-in codecs: int8_zlib, {int5"),
        (["--codecs", "mixed_zlib9:mlp=int3"], "mlp='int3' is not a scheme"),
        (["--codecs", ","], "names no codec"),
    ],
)
def test_user_errors_are_one_line(state_file, capsys, argv, message):
    path, _ = state_file
    assert pgolf_main(["bench", "codecs", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_missing_state_is_one_line(tmp_path, capsys):
    assert pgolf_main(["bench", "codecs", str(tmp_path / "nope.safetensors")]) == 2
    assert "state file not found" in capsys.readouterr().err


# ---- pack.codec: every spec is checked when the config is read, before any process starts ----


@pytest.mark.parametrize(
    "spec", ["int6_zstd22", "int5_lzma9", "int6_brotli11_shuffle", "mixed_zstd22:mlp=int5,small=keep"]
)
def test_config_accepts_codec_specs(spec):
    cfg = load_config(BASELINE, "tiny", [f"pack.codec='{spec}'"])
    assert cfg.section("pack").codec == spec
    assert get_codec(spec).name == spec.partition(":")[0] and spec.partition(":")[0] in CODECS


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "mixed_zstd22:mlp=int5,head=int6",
            "unknown role 'head'; roles: embedding, attention, mlp, other, small",
        ),
        ("mixed_zstd22:mlp=int3", "mlp='int3' is not a scheme"),
        ("int6_zstd22:mlp=int5", "takes no role table"),
        ("int6_zstd", "is not a codec; allowed: int8_zlib, submission, or {int5|int6|int7|int8|mixed}_"),
    ],
)
def test_config_refuses_bad_specs_in_one_line(spec, message):
    with pytest.raises(ValueError) as e:
        load_config(BASELINE, "tiny", [f"pack.codec='{spec}'"])
    text = str(e.value)
    assert (
        "\n" not in text and message in text and text.startswith(f"--set pack.codec='{spec}': pack.codec = ")
    ), text
