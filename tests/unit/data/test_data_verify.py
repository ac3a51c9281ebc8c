"""`pgolf data verify`: a clean dataset passes; each kind of damage is caught, named, and sets the exit status."""

from __future__ import annotations

import json
import shutil

import pytest

from data.build import build_dataset
from data.cli import main as data_main
from data.manifest import make_split_view
from data.shards import HEADER_BYTES, shard_name, write_shard
from data.verify import verify_dataset
from tests.fixtures.texts import prose_documents


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    docs = prose_documents(30, 2000)
    return build_dataset(
        docs,
        tmp_path_factory.mktemp("verify") / "ds",
        val_docs=3,
        tokenizer="byte260",
        shard_tokens=9_000,
        workers=1,
    )


@pytest.fixture()
def ds(clean, tmp_path):
    return shutil.copytree(clean, tmp_path / "copy")


def _flip(path, offset):
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


def test_clean_dataset_passes_with_a_table(ds, capsys):
    report = verify_dataset(ds)
    assert report.ok, report.table()
    assert data_main(["verify", str(ds)]) == 0
    out = capsys.readouterr().out
    assert "fineweb_val_000000.bin" in out and "all checks hold" in out and "sha256" in out.splitlines()[0]


def test_flipped_token_byte_is_caught_by_sha256(ds, capsys):
    target = ds / shard_name("train", 1)
    _flip(target, HEADER_BYTES + 11)
    report = verify_dataset(ds)
    assert not report.ok
    (bad,) = [f for f in report.files if not f.ok]
    assert bad.name == target.name and bad.results["sha256"] == "FAIL" and bad.results["header"] == "ok"
    assert data_main(["verify", str(ds)]) == 1
    assert f"{target.name}: sha256" in capsys.readouterr().out
    assert verify_dataset(ds, quick=True).ok  # --quick reads headers and sizes only


def test_flipped_header_byte_and_truncation_are_caught(ds):
    _flip(ds / shard_name("val", 0), 0)  # magic
    t = ds / shard_name("train", 0)
    t.write_bytes(t.read_bytes()[:-2])
    problems = "\n".join(verify_dataset(ds, quick=True).problems())
    assert "fineweb_val_000000.bin: bad header" in problems and "magic" in problems
    assert "fineweb_train_000000.bin: size" in problems


def test_missing_extra_and_miscounted_files(ds):
    (ds / shard_name("train", 2)).unlink()
    write_shard(ds / shard_name("train", 99), [1, 5, 6])
    problems = "\n".join(verify_dataset(ds).problems())
    assert "fineweb_train_000002.bin: file is missing" in problems
    assert "fineweb_train_000099.bin: shard file not listed" in problems
    assert "train: shards hold" in problems


def test_tokenizer_hash_and_split_views(ds, tmp_path):
    view = make_split_view(ds, tmp_path / "val_view", "val")
    assert verify_dataset(view).ok
    (ds / "byte260.json").write_text('{"kind": "byte260"}\n', encoding="utf-8")
    assert "byte260.json: sha256" in "\n".join(verify_dataset(ds).problems())


def test_the_training_view_names_no_piece_of_the_validation_text(ds, tmp_path):
    # the training view's manifest is the one file of the dataset a rank may read; it carried pieces.val_only_ids,
    # the ids the validation tokens use and the training tokens never do (up to 64 on a record track): a fact of
    # the validation text, which a model could turn into probability mass for tokens training never showed it
    m = json.loads((ds / "manifest.json").read_text(encoding="utf-8"))
    m["pieces"] = {**m.get("pieces", {}), "val_only": 2, "val_only_ids": [200, 201]}
    (ds / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    train = json.loads((make_split_view(ds, tmp_path / "tv", "train") / "manifest.json").read_text())
    assert "val_only_ids" not in train["pieces"]
    val = json.loads((make_split_view(ds, tmp_path / "vv", "val") / "manifest.json").read_text())
    assert val["pieces"]["val_only_ids"] == [200, 201]


def test_not_a_dataset_is_a_user_error(tmp_path, capsys):
    assert data_main(["verify", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
