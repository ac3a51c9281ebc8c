"""`pgolf data download` against a loopback server shaped like the dataset hub (tests/fixtures/hub_server.py).

The repo it serves is laid out as the reference export is (`datasets/manifest.json`,
`datasets/datasets/fineweb10B_<variant>/fineweb_{val,train}_NNNNNN.bin`, `datasets/tokenizers/...`),
made from datasets built here: byte260 always (hermetic), sp1024 with the official tokenizer when
../shared/data is present. Downloads go through huggingface_hub's real `hf_hub_download`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data.build import build_dataset
from data.cli import main as data_main
from data.download import STAGING_NAME, DownloadError, download_variant, parse_hub_manifest
from data.io import read_json
from data.loader import DistributedTokenLoader, train_shard_paths
from data.shards import HEADER_BYTES
from data.verify import verify_dataset
from tests.conftest import SP1024
from tests.fixtures.hub_server import DEFAULT_COMMIT, HubServer, reference_repo_files
from tests.fixtures.texts import prose_documents

REPO_ID = "willdepueoai/parameter-golf"
B260 = "datasets/datasets/fineweb10B_byte260"


def _pure_byte_json(path: Path) -> Path:
    """The reference's byte260 tokenizer file (data/pure_byte_tokenizer.py's save_json)."""
    cfg = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "byte_offset": 4, "byte_count": 256}
    path.write_text(
        json.dumps(
            {"tokenizer_type": "pure_byte", "config": cfg, "vocab_size": 260}, indent=2, sort_keys=True
        )
    )
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, list[Path]]]:
    root = tmp_path_factory.mktemp("hub_src")
    docs = prose_documents(79, 12_000)
    b260 = build_dataset(
        docs, root / "byte260", val_docs=8, tokenizer="byte260", shard_tokens=100_000, workers=1
    )
    variants = {"byte260": (b260, [_pure_byte_json(root / "fineweb_pure_byte_260.json")])}
    if SP1024.is_file():
        sp = build_dataset(
            docs, root / "sp1024", val_docs=8, tokenizer=SP1024, shard_tokens=40_000, workers=1
        )
        variants["sp1024"] = (sp, [SP1024, SP1024.with_suffix(".vocab")])
    return variants


@pytest.fixture(scope="module")
def repo_files(built) -> dict[str, bytes]:
    return reference_repo_files(built)


@pytest.fixture()
def hub(repo_files):
    with HubServer(REPO_ID, repo_files) as server:
        yield server


def _assert_same_dataset(out: Path, src: Path, train_shards: int | None = None) -> None:
    got, want = read_json(out / "manifest.json"), read_json(src / "manifest.json")
    want_shards = [s for s in want["shards"] if s["split"] == "val"]
    want_shards += [s for s in want["shards"] if s["split"] == "train"][:train_shards]
    assert got["shards"] == want_shards  # names, token / doc counts, sizes and sha256s
    assert got["docs"]["val"] == want["docs"]["val"]
    if train_shards is None:
        assert got["docs"] == want["docs"] and got["train_unigram_counts"] == want["train_unigram_counts"]
    assert verify_dataset(out).ok


@pytest.mark.parametrize("variant", ["byte260", "sp1024"])
def test_full_download_gives_a_verified_dataset(hub, built, tmp_path, variant):
    if variant not in built:
        pytest.skip(f"the official sp1024 tokenizer is not present at {SP1024}")
    src, _ = built[variant]
    n_train = sum(1 for s in read_json(src / "manifest.json")["shards"] if s["split"] == "train")
    out = download_variant(variant, tmp_path / variant, train_shards=2, endpoint=hub.endpoint)
    _assert_same_dataset(out, src, train_shards=2)
    m = read_json(out / "manifest.json")
    assert m["source"]["commit"] == DEFAULT_COMMIT and m["source"]["train_shards_available"] == n_train
    assert not (out / STAGING_NAME).exists()
    gets = [p for method, p, _ in hub.requests if method == "GET"]
    assert len(gets) == len(set(gets))  # every file fetched once
    assert not any(p.endswith(f"fineweb_train_{i:06d}.bin") for p in gets for i in range(2, n_train))
    if variant == "sp1024":
        assert m["tokenizer"]["sha256"] == "4f5e8adb109c66b4886963bc75a7befd73bda36d27fd7102df8e9e66503b0e2a"
    x, y = DistributedTokenLoader(train_shard_paths(out, 2), 0, 2).next_batch(256, 64)
    assert x.shape == (4, 64) and bool((x[:, 1:] == y[:, :-1]).all())


def test_all_training_shards_by_default_when_fewer_than_80(hub, built, tmp_path):
    out = download_variant("byte260", tmp_path / "all", endpoint=hub.endpoint)
    _assert_same_dataset(out, built["byte260"][0])
    assert (out / "byte260.json").is_file() and (out / "fineweb_pure_byte_260.json").is_file()


def test_resumes_with_a_range_request_after_the_connection_drops_mid_file(
    hub, repo_files, tmp_path, monkeypatch
):
    # huggingface_hub writes what it received in DOWNLOAD_CHUNK_SIZE pieces (10 MiB) and resumes from
    # there; 16 KiB pieces let a 300 kB test shard be cut and resumed mid-file.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16_384)
    path = f"{B260}/fineweb_train_000001.bin"
    hub.state.drop_after[path] = 100_000
    out = download_variant("byte260", tmp_path / "r", train_shards=2, endpoint=hub.endpoint)
    assert hub.gets(path) == [None, "bytes=98304-"]  # 6 whole 16 KiB pieces kept, the rest asked for
    assert (out / "fineweb_train_000001.bin").read_bytes() == repo_files[path]
    assert verify_dataset(out).ok


def test_an_interrupted_download_resumes_where_it_stopped(hub, built, tmp_path):
    path = f"{B260}/fineweb_train_000002.bin"
    hub.state.fail[path] = 403
    out = tmp_path / "i"
    with pytest.raises(DownloadError, match=r"fineweb_train_000002\.bin.*rerun the same command"):
        download_variant("byte260", out, train_shards=3, endpoint=hub.endpoint)
    assert not (out / "fineweb_train_000002.bin").exists() and not (out / "manifest.json").exists()
    assert (out / "fineweb_train_000001.bin").is_file()
    del hub.state.fail[path]
    download_variant("byte260", out, train_shards=3, endpoint=hub.endpoint)
    for name in ("fineweb_val_000000.bin", "fineweb_train_000000.bin", "fineweb_train_000001.bin"):
        assert len(hub.gets(f"{B260}/{name}")) == 1, f"{name} was fetched again"
    assert len(hub.gets(path)) == 1
    _assert_same_dataset(out, built["byte260"][0], train_shards=3)


def test_a_corrupted_file_is_refused_by_name_and_never_kept(repo_files, tmp_path):
    path = f"{B260}/fineweb_train_000001.bin"
    bad = bytearray(repo_files[path])
    bad[HEADER_BYTES + 5000] ^= 0x08
    with HubServer(REPO_ID, {**repo_files, path: bytes(bad)}) as hub:
        out = tmp_path / "c"
        with pytest.raises(DownloadError, match=r"fineweb_train_000001\.bin: sha256 .* refused and removed"):
            download_variant("byte260", out, train_shards=2, endpoint=hub.endpoint)
    assert not (out / "fineweb_train_000001.bin").exists() and not (out / "manifest.json").exists()
    assert not list((out / STAGING_NAME).rglob("fineweb_train_000001.bin"))


def test_a_bad_shard_is_refused_without_a_hash_to_compare(built, tmp_path):
    files = reference_repo_files(built, with_sha256=False)  # a manifest without sizes or sha256s
    path = f"{B260}/fineweb_val_000000.bin"
    files[path] = (1234).to_bytes(4, "little") + files[path][4:]  # wrong magic
    with (
        HubServer(REPO_ID, files) as hub,
        pytest.raises(DownloadError, match=r"fineweb_val_000000\.bin: not a valid shard .*magic 1234"),
    ):
        download_variant("byte260", tmp_path / "h", train_shards=1, endpoint=hub.endpoint)
    assert not (tmp_path / "h" / "fineweb_val_000000.bin").exists()


def test_a_missing_variant_lists_those_the_repo_has(hub, built, tmp_path, capsys):
    have = ", ".join(sorted(built))
    with pytest.raises(
        ValueError, match=rf"variant 'sp4096' \(fineweb10B_sp4096\) is not in .*; it has: {have}\."
    ):
        download_variant("sp4096", tmp_path / "m", endpoint=hub.endpoint)
    rc = data_main(
        ["download", "--variant", "sp8192", "--out", str(tmp_path / "m"), "--endpoint", hub.endpoint]
    )
    assert rc == 2 and f"it has: {have}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--variant must be"):
        download_variant("gpt2", tmp_path / "m", endpoint=hub.endpoint)


def test_cli_download_and_too_many_train_shards(hub, tmp_path, capsys):
    assert (
        data_main(
            [
                "download",
                "--variant",
                "byte260",
                "--train-shards",
                "1",
                "--out",
                str(tmp_path / "d"),
                "--endpoint",
                hub.endpoint,
            ]
        )
        == 0
    )
    assert "1 shard(s)" in capsys.readouterr().out
    assert (
        data_main(
            [
                "download",
                "--variant",
                "byte260",
                "--train-shards",
                "999",
                "--out",
                str(tmp_path / "d"),
                "--endpoint",
                hub.endpoint,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--train-shards 999" in err and "training shards on the hub" in err


def test_a_moved_revision_is_not_mixed_into_an_old_download(repo_files, tmp_path):
    out = tmp_path / "mv"
    with HubServer(REPO_ID, repo_files) as hub:
        download_variant("byte260", out, train_shards=1, endpoint=hub.endpoint)
        hub.state.commit = "f" * 40  # the same endpoint (files from another are fetched again anyway)
        with pytest.raises(ValueError, match="mixing commits"):
            download_variant("byte260", out, train_shards=2, endpoint=hub.endpoint)


def test_unreachable_hub_and_unknown_manifest_shapes_are_clear(tmp_path, built):
    with pytest.raises(FileExistsError, match="not downloaded from the hub"):
        download_variant("byte260", built["byte260"][0], endpoint="http://127.0.0.1:9")
    with pytest.raises(DownloadError, match="cannot reach datasets/manifest.json .*HINT"):
        download_variant("sp1024", tmp_path / "u", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="unknown manifest shape .*expected"):
        parse_hub_manifest({"shards": []}, variant="sp1024", train_shards=1)
    with pytest.raises(ValueError, match="lacks stats.files_train"):
        parse_hub_manifest({"datasets": [{"name": "fineweb10B_sp1024"}]}, variant="sp1024", train_shards=1)


def test_tolerant_manifest_reading():
    raw = {
        "datasets": {
            "fineweb10B_sp1024": {"tokenizer_name": "t", "stats": {"files_train": "3", "files_val": 1}}
        },
        "tokenizers": {"t": {"model_path": "/export/root/tokenizers/fineweb_1024_bpe.model"}},
        "files": [{"name": "fineweb_val_000000.bin", "bytes": 10, "sha256": "A" * 64}],
    }
    plan = parse_hub_manifest(raw, variant="sp1024", train_shards=None)
    assert [f.path for f in plan.files] == [
        "datasets/tokenizers/fineweb_1024_bpe.model",
        "datasets/datasets/fineweb10B_sp1024/fineweb_val_000000.bin",
        *(f"datasets/datasets/fineweb10B_sp1024/fineweb_train_{i:06d}.bin" for i in range(3)),
    ]
    assert plan.files[1].sha256 == "a" * 64 and plan.files[1].size_bytes == 10 and plan.train_shards == 3
    assert np.all([f.sha256 is None for f in plan.files[2:]])
