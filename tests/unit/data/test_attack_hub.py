"""Attacks on `pgolf data download` by a hostile hub or mirror (HF_ENDPOINT / --endpoint), and by a destination
folder someone prepared. Each test is one attack, made against the loopback hub of tests/fixtures/hub_server.py
serving the byte260 export that tests/unit/data/test_download.py builds."""

from __future__ import annotations

import json
import signal
import time

import pytest

from data import download
from data.cli import main as data_main
from data.download import (
    MAX_HUB_MANIFEST_BYTES,
    MAX_SHARDS,
    STATE_NAME,
    STATE_VERSION,
    DownloadError,
    _token_for,
    download_variant,
    parse_hub_manifest,
)
from data.io import read_json, sha256_bytes
from data.verify import verify_dataset
from tests.conftest import SP1024
from tests.fixtures.hub_server import HubServer
from tests.unit.data import test_download as td

REPO_ID = td.REPO_ID
B260 = td.B260
MANIFEST = "datasets/manifest.json"
VAL0, TRAIN0, TRAIN1 = (
    f"{B260}/{n}" for n in ("fineweb_val_000000.bin", "fineweb_train_000000.bin", "fineweb_train_000001.bin")
)

built = td.built
repo_files = td.repo_files


def _edit_manifest(files: dict[str, bytes], edit) -> dict[str, bytes]:
    raw = json.loads(files[MANIFEST])
    edit(raw)
    return {**files, MANIFEST: json.dumps(raw).encode()}


def _serve_as(files: dict[str, bytes], path: str, content: bytes) -> dict[str, bytes]:
    """`path` served as `content`, the hub manifest's size and sha256 for it rewritten to match."""

    def edit(raw):
        for f in raw["files"]:
            if f"datasets/{f['path']}" == path:
                f["bytes"], f["sha256"] = len(content), sha256_bytes(content)

    return _edit_manifest({**files, path: content}, edit)


def test_the_stored_token_is_never_sent_to_another_endpoint(repo_files, tmp_path, monkeypatch):
    """HOLE (before the fix): the user's Hugging Face token (HF_TOKEN or `hf auth login`'s file) went to whatever
    --endpoint / HF_ENDPOINT named, in an Authorization header on every request: a mirror collected it."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_user")
    with HubServer(REPO_ID, repo_files) as hub:
        download_variant("byte260", tmp_path / "t", train_shards=1, endpoint=hub.endpoint)
        assert hub.state.authorizations and set(hub.state.authorizations) == {None}
        # one passed on purpose still goes
        download_variant("byte260", tmp_path / "t2", train_shards=1, endpoint=hub.endpoint, token="hf_given")
        assert set(hub.state.authorizations) == {None, "Bearer hf_given"}
    assert _token_for("https://huggingface.co", None) is None  # huggingface_hub's own: the stored token
    for other in (
        "http://huggingface.co",
        "https://huggingface.co.example",
        "https://huggingface.co@evil.example",
    ):
        assert _token_for(other, None) is False


@pytest.mark.parametrize("with_sha256", [True, False])
def test_a_rerun_at_another_endpoint_keeps_nothing_the_mirror_sent(built, tmp_path, with_sha256):
    """HOLE (before the fix): a rerun kept every file `.pgolf-download.json` listed if its size matched. A mirror
    claiming the official commit served its own training shard 0 (a valid shard, its own manifest agreeing) and
    then failed on shard 1; the rerun against the honest hub kept the mirror's shard, wrote its sha256 into
    manifest.json and `pgolf data verify` passed (and hf_hub_download even reused the mirror's staged manifest)."""
    repo_files = td.reference_repo_files(built, with_sha256=with_sha256)
    poisoned = repo_files[TRAIN1]
    hostile = _serve_as(repo_files, TRAIN0, poisoned) if with_sha256 else {**repo_files, TRAIN0: poisoned}
    out = tmp_path / "p"
    with HubServer(REPO_ID, hostile) as mirror:
        mirror.state.fail[TRAIN1] = 403
        with pytest.raises(DownloadError, match="fineweb_train_000001"):
            download_variant("byte260", out, train_shards=2, endpoint=mirror.endpoint)
    assert (out / "fineweb_train_000000.bin").read_bytes() == poisoned
    with HubServer(REPO_ID, repo_files) as hub:
        download_variant("byte260", out, train_shards=2, endpoint=hub.endpoint)
        assert len(hub.gets(TRAIN0)) == 1
    assert (out / "fineweb_train_000000.bin").read_bytes() == repo_files[TRAIN0]
    shards = {s["name"]: s["sha256"] for s in read_json(out / "manifest.json")["shards"]}
    assert shards["fineweb_train_000000.bin"] == sha256_bytes(repo_files[TRAIN0])
    assert verify_dataset(out).ok


def test_a_planted_state_file_and_links_in_the_destination_change_nothing_outside_it(repo_files, tmp_path):
    """HOLE (before the fix): a destination folder prepared by someone else, holding a state file that lists a
    tampered shard and a link `byte260.json` -> a file of the user's, made the download keep the tampered shard
    unchecked and overwrite the user's file through the link."""
    out = tmp_path / "planted"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    (out / "byte260.json").symlink_to(victim)
    tampered = bytearray(repo_files[VAL0])
    tampered[-1] ^= 1
    (out / "fineweb_val_000000.bin").write_bytes(tampered)
    record = {"bytes": len(tampered), "sha256": sha256_bytes(bytes(tampered)), "tokens": 1, "docs": 1}
    with HubServer(REPO_ID, repo_files) as hub:
        state = {
            "format": "pg-download-state",
            "format_version": STATE_VERSION,
            "repo_id": REPO_ID,
            "commit": td.DEFAULT_COMMIT,
            "endpoint": hub.endpoint,
            "files": {"fineweb_val_000000.bin": record},
        }
        (out / STATE_NAME).write_text(json.dumps(state))
        download_variant("byte260", out, train_shards=1, endpoint=hub.endpoint)
    assert victim.read_text() == "the user's file\n"
    assert not (out / "byte260.json").is_symlink()
    assert (out / "fineweb_val_000000.bin").read_bytes() == repo_files[VAL0]
    assert verify_dataset(out).ok


@pytest.mark.parametrize(
    "name",
    [
        "manifest.json",
        "hub_manifest.json",
        "fineweb_val_000000.bin",
        "byte260.json",
        ".pgolf-download.json",
        "a\\b.json",
        "x.sh",
    ],
)
def test_a_tokenizer_file_named_like_a_file_of_the_folder_is_refused(repo_files, tmp_path, name):
    """HOLE (before the fix): a tokenizer path `tokenizers/manifest.json` was fetched to DEST/manifest.json: when a
    later file failed, the folder was left with a manifest.json the hub wrote, which every later run trusts."""
    forged = json.dumps({"format": "pg-dataset", "source": {"kind": "hub"}, "forged": True}).encode()

    def edit(raw):
        raw["tokenizers"][0]["vocab_path"] = f"tokenizers/{name}"

    files = _edit_manifest({**repo_files, f"datasets/tokenizers/{name}": forged}, edit)
    out = tmp_path / "n"
    with HubServer(REPO_ID, files) as hub:
        hub.state.fail[TRAIN0] = 403
        with pytest.raises(ValueError, match=r"tokenizer file .* in the hub manifest"):
            download_variant("byte260", out, train_shards=1, endpoint=hub.endpoint)
        assert not any("tokenizers/" in p for m, p, _ in hub.requests if m == "GET")
    assert not (out / "manifest.json").exists()


def test_shard_counts_beyond_any_export_are_refused():
    """HOLE (before the fix): `files_val` of 10**9 made parse_hub_manifest list 10**9 files (memory, then a hang);
    a count given as a string of 5000 digits raised int()'s own message, naming no input."""
    raw = {
        "datasets": [
            {
                "name": "fineweb10B_sp1024",
                "tokenizer_name": "t",
                "stats": {"files_train": 3, "files_val": MAX_SHARDS + 1},
            }
        ],
        "tokenizers": [{"name": "t", "model_path": "tokenizers/fineweb_1024_bpe.model"}],
    }
    with pytest.raises(ValueError, match=rf"files_val {MAX_SHARDS + 1}; an export has at most {MAX_SHARDS} "):
        parse_hub_manifest(raw, variant="sp1024", train_shards=1)
    raw["datasets"][0]["stats"] = {"files_train": 10**12, "files_val": 1}
    with pytest.raises(ValueError, match=rf"files_train {10**12};"):
        parse_hub_manifest(raw, variant="sp1024", train_shards=1)
    raw["datasets"][0]["stats"] = {"files_train": "9" * 5000, "files_val": 1}
    with pytest.raises(ValueError, match=r"lacks stats\.files_train"):
        parse_hub_manifest(raw, variant="sp1024", train_shards=1)


def test_a_file_served_larger_than_declared_is_cut_off_at_its_size(repo_files, tmp_path):
    """HOLE (before the fix): a shard the hub manifest (and HEAD) said was 200 kB, served with 64 MiB more,
    was written to disk whole (every byte the mirror sent) and only then refused: a mirror could fill the disk."""
    with HubServer(REPO_ID, repo_files) as hub:
        hub.state.inflate[VAL0] = 64 << 20
        with pytest.raises(
            DownloadError, match=r"fineweb_val_000000\.bin: the hub sent more than the \d+ bytes"
        ):
            download_variant("byte260", tmp_path / "big", train_shards=0, endpoint=hub.endpoint)
        assert hub.state.sent_bytes[VAL0] < 32 << 20  # one 10 MiB piece taken, and what the sockets buffer
    assert not list((tmp_path / "big").rglob("*.incomplete"))


def test_a_huge_hub_manifest_is_refused_unread(repo_files, tmp_path):
    """HOLE (before the fix): the hub manifest was read whole into memory whatever its size."""
    big = repo_files[MANIFEST][:-1] + b" " * MAX_HUB_MANIFEST_BYTES + b"}"
    with (
        HubServer(REPO_ID, {**repo_files, MANIFEST: big}) as hub,
        pytest.raises(DownloadError, match=r"datasets/manifest\.json: the hub sent more than the"),
    ):
        download_variant("byte260", tmp_path / "m", train_shards=0, endpoint=hub.endpoint)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b'{"datasets": [], "x": ' + b"9" * 5000 + b"}"])
def test_a_hub_manifest_not_utf8_is_named(repo_files, tmp_path, content):
    """Before the fix: a manifest of bytes that are not UTF-8 gave only "'utf-8' codec can't decode byte 0xff",
    one with an integer of 5000 digits "Exceeds the limit (4300 digits) ...", naming no file."""
    with (
        HubServer(REPO_ID, {**repo_files, MANIFEST: content}) as hub,
        pytest.raises(ValueError, match=r"hub manifest datasets/manifest\.json .* is not valid JSON"),
    ):
        download_variant("byte260", tmp_path / "u", train_shards=0, endpoint=hub.endpoint)


def test_hub_strings_reach_the_terminal_without_control_characters(repo_files, tmp_path, capsys):
    """HOLE (before the fix): dataset names from the hub manifest were printed raw in the error listing the
    variants: an escape sequence (set the terminal title, rewrite the screen) reached the user's terminal."""

    def edit(raw):
        raw["datasets"][0]["name"] = "fineweb10B_\x1b]2;owned\x07\x1b[2Jbyte999"

    with HubServer(REPO_ID, _edit_manifest(repo_files, edit)) as hub:
        rc = data_main(
            ["download", "--variant", "sp4096", "--out", str(tmp_path / "e"), "--endpoint", hub.endpoint]
        )
    err = capsys.readouterr().err
    assert rc == 2 and "it has: " in err and "\x1b" not in err and "\x07" not in err

    def many(raw):
        raw["datasets"] = [{"name": f"fineweb10B_v{i}_" + "x" * 1000} for i in range(10_000)]

    with HubServer(REPO_ID, _edit_manifest(repo_files, many)) as hub:
        rc = data_main(
            ["download", "--variant", "sp4096", "--out", str(tmp_path / "e"), "--endpoint", hub.endpoint]
        )
    err = capsys.readouterr().err
    assert rc == 2 and len(err) < 2_000 and "and 9980 more" in err


def test_an_official_variant_with_another_tokenizer_is_refused(built, tmp_path):
    """HOLE (before the fix): a mirror could serve sp1024 with a tokenizer of its own (its pieces decide every
    token's bytes, the denominator of bpb); the download took it as the official one."""
    if "sp1024" not in built:
        pytest.skip(f"the official sp1024 tokenizer is not present at {SP1024}")
    files = td.reference_repo_files(built)
    path = "datasets/tokenizers/fineweb_1024_bpe.model"
    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2", reason="needs protobuf to edit a model")
    m = pb.ModelProto()
    m.ParseFromString(files[path])
    m.pieces[500].score += 1.0
    files[path] = m.SerializeToString()
    with (
        HubServer(REPO_ID, files) as hub,
        pytest.raises(DownloadError, match=r"not the official sp1024 tokenizer"),
    ):
        download_variant("sp1024", tmp_path / "o", train_shards=1, endpoint=hub.endpoint)
    assert not (tmp_path / "o" / "fineweb_1024_bpe.model").exists()


def test_an_sp_variant_whose_tokenizer_is_not_a_sentencepiece_model_is_refused(repo_files, tmp_path):
    """HOLE (before the fix): a mirror listing fineweb10B_sp1024 with the byte260 .json as its only tokenizer
    file (and byte-level shards) passed: manifest.json said variant sp1024, tokenizer byte260, and the official
    sp1024 tokenizer's sha256 was never asked for (there was no .model to check)."""
    files = {p: b for p, b in repo_files.items() if "fineweb10B_sp1024" not in p}
    files = {p.replace("fineweb10B_byte260", "fineweb10B_sp1024"): b for p, b in files.items()}

    def edit(raw):
        raw["datasets"] = [
            {**d, "name": "fineweb10B_sp1024"} for d in raw["datasets"] if "byte260" in d["name"]
        ]
        raw["files"] = [
            {**f, "path": f["path"].replace("byte260", "sp1024")}
            for f in raw["files"]
            if "byte260" in f["path"]
        ]

    with (
        HubServer(REPO_ID, _edit_manifest(files, edit)) as hub,
        pytest.raises(
            ValueError,
            match=r"tokenizer files of fineweb10B_sp1024 \(fineweb_pure_byte_260\.json\) hold no \.model",
        ),
    ):
        download_variant("sp1024", tmp_path / "x", train_shards=1, endpoint=hub.endpoint)


def test_a_large_shard_is_scanned_in_bounded_memory(repo_files, tmp_path, monkeypatch):
    """HOLE (before the fix): the unigram counts widened a whole training shard to int64 (8 bytes per token), and
    the document count made a bool copy of it: a shard of the format's 2^31-1 tokens (4.3 GB, as a mirror may
    serve) needed some 19 GB. Scanned 2^20 tokens at a time, an 8M-token shard stays under 40 MB (was 64 MB+)."""
    import tracemalloc

    import numpy as np

    from data.shards import write_shard

    monkeypatch.setattr("data.download.SCAN_TOKENS", 1 << 20, raising=False)
    n = 8 << 20
    tokens = (np.arange(n, dtype=np.int64) % 259 + 1).astype(np.uint16)
    write_shard(tmp_path / "big.bin", tokens)
    files = _serve_as(repo_files, TRAIN0, (tmp_path / "big.bin").read_bytes())
    del tokens
    with HubServer(REPO_ID, files) as hub:
        tracemalloc.start()
        try:
            out = download_variant("byte260", tmp_path / "b", train_shards=1, endpoint=hub.endpoint)
            peak_bytes = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert read_json(out / "manifest.json")["train_unigram_counts"][1] == -(-n // 259)
    assert peak_bytes < 40 << 20, peak_bytes


def test_hub_values_copied_into_our_manifest_are_plain(repo_files, tmp_path):
    """HOLE (before the fix): `docs_meta.docs_sha256` and `tokenizer_name` went into manifest.json as whatever the
    hub gave: a 1 MB string, a nested structure, control characters."""
    out = tmp_path / "v"

    def edit(raw):
        raw["docs_meta"] = {"docs_sha256": {"nested": [[["x" * 1_000_000]]]}}

    with HubServer(REPO_ID, _edit_manifest(repo_files, edit)) as hub:
        download_variant("byte260", out, train_shards=0, endpoint=hub.endpoint)
    assert read_json(out / "manifest.json")["source"]["docs_sha256"] is None
    assert (out / "manifest.json").stat().st_size < 100_000

    def edit_name(raw):
        raw["datasets"][0]["tokenizer_name"] = raw["tokenizers"][0]["name"] = "tok\x1b[2J"

    with (
        HubServer(REPO_ID, _edit_manifest(repo_files, edit_name)) as hub,
        pytest.raises(ValueError, match=r"tokenizer_name 'tok\\x1b\[2J' is not a plain name"),
    ):
        download_variant("byte260", tmp_path / "w", train_shards=0, endpoint=hub.endpoint)


def test_a_file_planted_in_the_staging_folder_is_not_taken_for_the_hubs(built, tmp_path):
    """HOLE (before the fix): hf_hub_download returns a file of its local folder, unasked, when a metadata file
    beside it names the commit; a file and metadata planted in DEST/.hub-staging (or left by a run against another
    endpoint) became the dataset's training shard without the hub being asked, when the manifest had no sha256."""
    files = td.reference_repo_files(built, with_sha256=False)
    out = tmp_path / "s"
    staged = out / ".hub-staging" / TRAIN0
    staged.parent.mkdir(parents=True)
    staged.write_bytes(files[TRAIN1])
    meta = out / ".hub-staging/.cache/huggingface/download" / f"{TRAIN0}.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text(f'{td.DEFAULT_COMMIT}\n"planted"\n9999999999\n')
    with HubServer(REPO_ID, files) as hub:
        download_variant("byte260", out, train_shards=1, endpoint=hub.endpoint)
        assert len(hub.gets(TRAIN0)) == 1
    assert (out / "fineweb_train_000000.bin").read_bytes() == files[TRAIN0]


@pytest.mark.parametrize("content", [b"[]", b'{"tokenizer_type": "pure_byte", "config": [1]}', b'"x"'])
def test_a_byte260_tokenizer_file_of_another_shape_is_one_line(repo_files, tmp_path, content):
    """HOLE (before the fix): a byte260 .json that was a list, or whose `config` was not an object, ended the
    download in a bare AttributeError traceback."""
    path = "datasets/tokenizers/fineweb_pure_byte_260.json"
    with (
        HubServer(REPO_ID, {**repo_files, path: content}) as hub,
        pytest.raises(DownloadError, match=r"fineweb_pure_byte_260\.json: not the byte260 layout"),
    ):
        download_variant("byte260", tmp_path / "j", train_shards=0, endpoint=hub.endpoint)


def test_a_hub_that_trickles_a_file_is_cut_off_at_its_deadline(repo_files, tmp_path, monkeypatch):
    """HOLE (before the fix): a hub sending a byte every 50 ms never went silent for the HTTP client's 10 s
    timeout, so `pgolf data download` waited for ever (a 200 kB shard at 20 bytes/s: 3 hours). A file now has
    FILE_GRACE_S plus its size at MIN_RATE_BYTES_PER_S."""
    monkeypatch.setattr(download, "FILE_GRACE_S", 1.0)
    with HubServer(REPO_ID, repo_files) as hub:
        hub.state.trickle[VAL0] = 0.05
        start = time.monotonic()
        with pytest.raises(DownloadError, match=r"fineweb_val_000000\.bin: not received within \d+ s"):
            download_variant("byte260", tmp_path / "slow", train_shards=0, endpoint=hub.endpoint)
        assert time.monotonic() - start < 15
    assert not list((tmp_path / "slow").rglob("*.incomplete"))
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)


def test_a_file_that_would_fill_the_disk_is_refused_before_and_while_it_comes(
    repo_files, tmp_path, monkeypatch
):
    """HOLE (before the fix): nothing compared a file with the space left, so a hub declaring (or sending
    undeclared) shards up to 4 GiB each filled the official's disk before any check."""
    free = [download.MIN_FREE_BYTES + 1000]
    monkeypatch.setattr(download, "_free_bytes", lambda folder: free[0])
    with HubServer(REPO_ID, repo_files) as hub:
        with pytest.raises(
            DownloadError, match=r"fineweb_val_000000\.bin: its \d+ bytes would leave less than"
        ):
            download_variant("byte260", tmp_path / "full", train_shards=0, endpoint=hub.endpoint)
        assert hub.gets(VAL0) == []
    # no size declared: refused once the bytes that came in leave too little
    sizeless = _edit_manifest(repo_files, lambda raw: raw.pop("files"))
    calls = []

    def falling(folder):
        calls.append(folder)
        return download.MIN_FREE_BYTES + (1 << 40 if len(calls) <= 2 else -1)

    monkeypatch.setattr(download, "_free_bytes", falling)
    with (
        HubServer(REPO_ID, sizeless) as hub,
        pytest.raises(DownloadError, match=r"fell below \d+ bytes free; refused and removed"),
    ):
        download_variant("byte260", tmp_path / "fill", train_shards=0, endpoint=hub.endpoint)
    assert not list((tmp_path / "fill").rglob("*.incomplete"))


def test_a_hub_that_trickles_a_file_of_no_declared_size_is_cut_off_by_its_rate(
    repo_files, tmp_path, monkeypatch
):
    """HOLE (before the fix): a file's deadline was FILE_GRACE_S plus its *limit* at MIN_RATE_BYTES_PER_S, and a
    hub that declares no size (or 4 GB) sets the limit: a shard's deadline was 60 s + MAX_SHARD_BYTES / 64 KiB/s =
    65,596 s (18 hours), a file, up to MAX_SHARDS files. A hub trickling a byte every 20 ms held the download for
    that long. Now the bytes that came in set the deadline (the rate the constant names, after the grace and one
    piece of the client's), so a trickle is cut off after the grace whatever the hub declares. Here the trickle is
    lifted after 20 s: before the fix the download then completed, no refusal."""
    import threading

    monkeypatch.setattr(download, "FILE_GRACE_S", 1.0)
    monkeypatch.setattr(download, "PROGRESS_PIECE_BYTES", 1024)
    sizeless = _edit_manifest(repo_files, lambda raw: raw.pop("files"))
    with HubServer(REPO_ID, sizeless) as hub:
        hub.state.trickle[VAL0] = 0.02
        lift = threading.Timer(20.0, lambda: hub.state.trickle.pop(VAL0, None))
        lift.start()
        start = time.monotonic()
        try:
            with pytest.raises(
                DownloadError, match=r"fineweb_val_000000\.bin: not received .*refused and removed"
            ):
                download_variant("byte260", tmp_path / "slow", train_shards=0, endpoint=hub.endpoint)
            took_s = time.monotonic() - start
        finally:
            lift.cancel()
            hub.state.trickle.pop(VAL0, None)
    assert took_s < 15
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_callers_own_alarm_survives_a_download(repo_files, tmp_path):
    """HOLE (before the fix): the per-file deadline (SIGALRM) restored the caller's handler but not its timer: a
    library caller's own alarm (pytest-timeout's signal method, a tool's overall deadline) was cancelled by the
    first file fetched and never fired. Its timer now runs on, less the time the download took."""
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 120.0)
        with HubServer(REPO_ID, repo_files) as hub:
            download_variant("byte260", tmp_path / "ok", train_shards=0, endpoint=hub.endpoint)
        left_s, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 60.0 < left_s <= 120.0, left_s
        assert not fired
        signal.setitimer(signal.ITIMER_REAL, 0.01)  # and its handler is the caller's again
        time.sleep(0.2)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
