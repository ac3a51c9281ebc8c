"""Artifact container and the cap: round trips, corruption refused, exact byte accounting."""

from __future__ import annotations

import pytest
import torch

from harness.run.staging import stage_model_code
from scoring.artifact.cap import (
    ArtifactTooLarge,
    CapCheck,
    FolderRefused,
    code_bytes,
    counted_files,
    scan_folder,
)
from scoring.artifact.codecs import CODECS
from scoring.artifact.format import ArtifactError, read_artifact
from scoring.artifact.pack import pack_state
from scoring.score.scorer import copy_packed_code
from scoring.worker.decode import unpack_artifact


@pytest.fixture
def submission(tmp_path):
    sub = tmp_path / "sub"
    (sub / "logs").mkdir(parents=True)
    (sub / "model.py").write_text("def build_model(config):\n    pass\n")
    (sub / "train.py").write_text("def train(ctx):\n    pass\n")
    (sub / "config.toml").write_text("[model]\n")
    (sub / "README.md").write_text("not counted")
    (sub / "submission.json").write_text("{}")
    (sub / "logs" / "run.txt").write_text("not counted")
    (sub / "train.log").write_text("not counted")
    (sub / ".hidden").write_text("not counted")
    return sub


def state():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(300, 300, generator=g), "b": torch.randn(7, generator=g), "n": torch.tensor([3])}


def test_counted_files(submission):
    files = counted_files(submission)
    assert sorted(files) == ["config.toml", "model.py", "train.py"]
    assert code_bytes(submission) == sum((submission / f).stat().st_size + len(f) for f in files)


def test_bytes_total_is_artifact_size_plus_code(submission, tmp_path):
    out = tmp_path / "a.pgolf"
    rec = pack_state(state(), submission, out, codec_name="int8_zlib", model_config={"d": 1}, cap_bytes=10**9)
    assert rec["bytes_model"] == out.stat().st_size
    assert rec["bytes_code"] == code_bytes(submission)
    assert rec["bytes_total"] == rec["bytes_code"] + rec["bytes_model"]
    art = read_artifact(out)
    assert art.header["code_files"] == counted_files(submission)
    assert art.model_config == {"d": 1}
    assert art.header["codec"] == {"name": "int8_zlib", "version": 1}
    back = unpack_artifact(out, tmp_path / "back.safetensors")
    assert torch.equal(back["n"], torch.tensor([3]))
    assert torch.equal(back["w"], CODECS["int8_zlib"].decode(CODECS["int8_zlib"].encode(state()))["w"])


def test_over_the_cap_names_every_number(submission, tmp_path):
    rec = pack_state(
        state(), submission, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=1000
    )
    assert not rec["within_cap"]
    with pytest.raises(ArtifactTooLarge) as e:
        CapCheck(rec["bytes_code"], rec["bytes_model"], 1000).enforce()
    msg = str(e.value)
    for n in (rec["bytes_total"], rec["bytes_code"], rec["bytes_model"], 1000, rec["bytes_total"] - 1000):
        assert f"{n:,}" in msg


def test_a_file_name_is_counted_because_the_scored_code_can_list_it(submission, tmp_path):
    """The names of the counted files reach the model worker (its staged copy keeps every one, and it may list
    its folder): 9,998 empty files with 255-byte names carried 2,549,498 bytes the count left out (bytes_code
    59). Each counted file costs its bytes and its path's."""
    names = [f"{i:03d}" + "n" * 250 for i in range(40)]
    for name in names:
        (submission / name).write_bytes(b"")
    (submission / "pkg").mkdir()
    (submission / "pkg" / ("d" * 200)).write_bytes(b"x")
    listed = {p.name for p in stage_model_code(submission, tmp_path / "model_code").iterdir()}
    assert set(names) <= listed  # what the scored code can read
    files = counted_files(submission)
    want = sum((submission / rel).stat().st_size + len(rel.encode()) for rel in files)
    assert code_bytes(submission) == want >= sum(map(len, names)) + len("pkg/" + "d" * 200)
    assert scan_folder(submission).bytes_code == want
    rec = pack_state(
        state(), submission, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=10**9
    )
    assert rec["bytes_code"] == want
    with pytest.raises(FolderRefused, match="over the cap"):  # the early check counts names as well
        scan_folder(submission, cap_bytes=want - 1)


def test_the_workers_copy_holds_the_packed_files_alone(submission, tmp_path):
    """What a model worker reads is what the cap counted: never README.md, submission.json, a folder without a
    counted file, train.py; a file the artifact did not record, or with other bytes, is refused."""
    (submission / "empty-folder").mkdir()
    (submission / "pkg").mkdir()
    (submission / "pkg" / "README.md").write_text("not counted")
    out = tmp_path / "a.pgolf"
    pack_state(state(), submission, out, codec_name="int8_zlib", model_config={}, cap_bytes=10**9)
    header = read_artifact(out).header
    copied = copy_packed_code(header, submission, tmp_path / "copy")
    on_disk = sorted(p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*"))
    assert copied == on_disk == ["config.toml", "model.py"]
    (submission / "extra.py").write_text("X = 1\n")
    with pytest.raises(ArtifactError, match="extra.py is not among the code files packed"):
        copy_packed_code(header, submission, tmp_path / "copy2")
    (submission / "extra.py").unlink()
    (submission / "model.py").write_text("def build_model(config):\n    return 1\n")
    with pytest.raises(ArtifactError, match="model.py differs from the code packed"):
        copy_packed_code(header, submission, tmp_path / "copy3")
    assert not (tmp_path / "copy2").exists() and not (tmp_path / "copy3").exists()


def test_exactly_at_the_cap_is_within():
    assert CapCheck(10, 90, 100).within_cap and not CapCheck(10, 91, 100).within_cap


@pytest.mark.parametrize("where", ["magic", "header", "payload", "truncate"])
def test_corrupt_artifacts_are_refused(submission, tmp_path, where):
    out = tmp_path / "a.pgolf"
    pack_state(state(), submission, out, codec_name="int8_zlib", model_config={}, cap_bytes=10**9)
    b = bytearray(out.read_bytes())
    if where == "magic":
        b[0] ^= 1
    elif where == "header":
        b[20] = ord("}")
    elif where == "payload":
        b[-10] ^= 0x40
    else:
        b = b[:-5]
    out.write_bytes(bytes(b))
    with pytest.raises(ArtifactError):
        read_artifact(out)


CODEC_SRC = """from safetensors.torch import load, save

NAME = "fixture_safetensors"
VERSION = 1


def encode(state):
    return save({k: v.contiguous() for k, v in state.items()})


def decode(payload):
    return load(payload)
"""


def test_a_custom_codec_is_imported_only_if_it_is_the_packed_one(submission, tmp_path):
    from scoring.artifact.format import artifact_codec, decode_state

    (submission / "codec.py").write_text(CODEC_SRC)
    pack_state(
        state(),
        submission,
        tmp_path / "a.pgolf",
        codec_name="submission",
        model_config={},
        cap_bytes=16_000_000,
    )
    art = read_artifact(tmp_path / "a.pgolf")
    assert torch.equal(decode_state(art, artifact_codec(art, submission))["w"], state()["w"])
    (submission / "codec.py").write_text(CODEC_SRC + "\nraise RuntimeError('a changed codec.py ran')\n")
    with pytest.raises(ArtifactError, match=r"codec\.py differs from the code packed into the artifact"):
        artifact_codec(art, submission)


def test_the_pipeline_measures_every_pack_figure_and_names_a_forged_one(tmp_path):
    """A 21 MB artifact ended ok with the pack record's bytes_model 2000: the orchestrator now takes the size
    and sha256 from the file, the code's files and bytes from the staged copy, and the cap verdict from those."""
    import json as _json

    from harness.run.pipeline import measure_pack
    from tests.unit.scoring.test_eval_support import pack_tiny, write_submission

    folder = write_submission(tmp_path / "sub")
    record = pack_tiny(folder, tmp_path / "a.pgolf")
    measured, disagree = measure_pack(record, tmp_path / "a.pgolf", folder, 16_000_000)
    assert disagree == [] and measured["bytes_model"] == (tmp_path / "a.pgolf").stat().st_size
    with open(
        tmp_path / "a.pgolf", "ab"
    ) as f:  # the artifact grows past the cap after the record was written
        f.write(b"\0" * 16_000_000)
    forged = _json.loads(_json.dumps(record))
    measured, disagree = measure_pack(forged, tmp_path / "a.pgolf", folder, 16_000_000)
    assert measured["within_cap"] is False and measured["reported"]["within_cap"] is True
    assert any(f"bytes_model {record['bytes_model']} in the record" in d for d in disagree), disagree
    assert any(d.startswith("artifact_sha256 ") for d in disagree)
    (folder / "extra.py").write_text("X = 1\n")  # code that the record and the header do not name
    _, disagree = measure_pack(record, tmp_path / "a.pgolf", folder, 16_000_000)
    assert any("the artifact header's code files" in d for d in disagree), disagree


@pytest.mark.parametrize(
    "payload",
    [b"\x00\x01garbage", "zlib-of-garbage", "zlib-of-wrong-layout"],
    ids=["not-zlib", "not-st", "layout"],
)
def test_unpack_of_a_payload_that_is_not_a_container_is_one_line(submission, tmp_path, payload):
    """`pgolf unpack` of a payload that is not safetensors gave the safetensors parser's traceback."""
    import zlib

    from safetensors.torch import save

    from data.io import sha256_bytes
    from harness.cli import main
    from scoring.artifact.format import write_artifact

    state = {"w": torch.randn(4, 4)}
    pack_state(
        state, submission, tmp_path / "a.pgolf", codec_name="int8_zlib", model_config={}, cap_bytes=10**8
    )
    a = read_artifact(tmp_path / "a.pgolf")
    if payload == "zlib-of-garbage":
        payload = zlib.compress(b"not a safetensors blob")
    elif payload == "zlib-of-wrong-layout":
        payload = zlib.compress(
            save({"x": torch.zeros(1)}, metadata={"layout": '{"__quant_format__": "int8_clean_per_row_v1"}'})
        )
    header = {**a.header, "payload_bytes": len(payload), "payload_sha256": sha256_bytes(payload)}
    write_artifact(tmp_path / "bad.pgolf", header, payload)
    with pytest.raises(ValueError, match="int8_zlib payload") as caught:
        unpack_artifact(tmp_path / "bad.pgolf", tmp_path / "out.safetensors")
    assert "\n" not in str(caught.value)
    assert main(["unpack", str(tmp_path / "bad.pgolf"), "--out", str(tmp_path / "o.safetensors")]) == 2
