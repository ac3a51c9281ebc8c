"""Code shipped compressed (code.tar.xz): the bytes counted are the bytes shipped, the code staged is the
code expanded, and a hostile archive is refused in one line before anything is written."""

from __future__ import annotations

import io
import lzma
import tarfile

import pytest
import torch

import scoring.artifact.cap as cap
from harness.records.verify import Check, _code_checks
from harness.run.staging import FolderRefused, inspect_folder, stage_folder, stage_model_code
from scoring.artifact.cap import CODE_BUNDLE, code_bytes, counted_files, read_bundle
from scoring.artifact.format import read_artifact
from scoring.artifact.pack import pack_state

MODEL = "def build_model(config):\n    return None\n" + "# a long comment that compresses well\n" * 200
TRAIN = "def train(ctx):\n    pass\n" + "# another comment that compresses well\n" * 200


def tar_xz(members: list[tuple[str, bytes]], *, kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return lzma.compress(buf.getvalue(), preset=9)


@pytest.fixture
def bundled(tmp_path):
    sub = tmp_path / "sub"
    (sub / "pkg").mkdir(parents=True)
    (sub / CODE_BUNDLE).write_bytes(
        tar_xz([("model.py", MODEL.encode()), ("train.py", TRAIN.encode()), ("pkg/util.py", b"X = 1\n")])
    )
    (sub / "config.toml").write_text("[model]\n")
    (sub / "README.md").write_text("not counted")
    return sub


def test_the_bytes_counted_are_the_bytes_shipped(bundled, tmp_path):
    shipped = sum((bundled / f).stat().st_size + len(f) for f in (CODE_BUNDLE, "config.toml"))  # bytes, names
    assert code_bytes(bundled) == shipped
    assert shipped < len(MODEL) + len(TRAIN)  # the point of shipping it compressed
    staged = stage_folder(bundled, tmp_path / "staged")
    assert sorted(staged.files) == [CODE_BUNDLE, "config.toml", "model.py", "pkg/util.py", "train.py"]
    assert (tmp_path / "staged" / "model.py").read_text() == MODEL
    # the staged copy holds the bundle and its members: counted once, as shipped; staging it again is a no-op
    assert code_bytes(tmp_path / "staged") == shipped
    again = stage_folder(tmp_path / "staged", tmp_path / "again")
    assert again.files == staged.files
    # the packed artifact binds the expanded code and counts the shipped bytes
    out = tmp_path / "a.pgolf"
    rec = pack_state(
        {"w": torch.zeros(4, 4)},
        tmp_path / "staged",
        out,
        codec_name="int8_zlib",
        model_config={},
        cap_bytes=10**9,
    )
    assert rec["bytes_code"] == shipped and rec["bytes_total"] == shipped + out.stat().st_size
    assert read_artifact(out).header["code_files"] == counted_files(tmp_path / "staged")


def test_verify_compares_the_shipped_folder_as_it_was_packed(bundled, tmp_path):
    staged = tmp_path / "staged"
    stage_folder(bundled, staged)
    files = counted_files(staged)
    result = {"bytes_code": code_bytes(bundled)}
    expanded = tmp_path / "from-shipped"
    stage_folder(bundled, expanded)  # what verify does with --submission (the folder as shipped)
    checks: list[Check] = []
    _code_checks(checks, result, files, expanded)
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
    checks = []
    _code_checks(checks, {"bytes_code": code_bytes(bundled) + 1}, files, expanded)
    assert [c.name for c in checks if not c.ok] == ["bytes_code"]


def test_the_scorer_gets_neither_train_py_nor_the_bundle_that_holds_it(bundled, tmp_path):
    dest = stage_model_code(bundled, tmp_path / "model_code")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "config.toml",
        "model.py",
        "pkg/util.py",
    ]


def test_a_member_and_a_different_loose_file_of_its_path_are_refused(bundled, tmp_path):
    (bundled / "model.py").write_text("def build_model(config):\n    return 'other'\n")
    with pytest.raises(FolderRefused, match="also in .* with other bytes"):
        stage_folder(bundled, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (bundled / "model.py").write_text(MODEL)  # the same bytes: staged once, counted once (in the bundle)
    assert code_bytes(bundled) == sum(
        (bundled / f).stat().st_size + len(f) for f in (CODE_BUNDLE, "config.toml")
    )
    stage_folder(bundled, tmp_path / "y")


def _header_fix(hdr: bytes) -> bytes:
    hdr = bytearray(hdr)
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


def gnu_sparse(name: str, claimed: int) -> bytes:
    """A GNU old-sparse ('S') member: no data, a real size of `claimed` zeros (the attacker's bomb)."""
    info = tarfile.TarInfo(name)
    hdr = bytearray(info.tobuf(tarfile.GNU_FORMAT)[:512])
    hdr[156:157] = b"S"
    hdr[483:495] = b"%011o\0" % claimed
    return lzma.compress(_header_fix(bytes(hdr)) + bytes(1024))


def pax_path(path: str) -> bytes:
    """A member whose PAX path record says `path` (a NUL in it survives there, not in the ustar name)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("model.py")
        info.size, info.pax_headers = 6, {"path": path}
        tar.addfile(info, io.BytesIO(b"A = 1\n"))
    return lzma.compress(buf.getvalue())


def with_tail(tail: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("model.py")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"A = 1\n"))
    return lzma.compress(buf.getvalue() + tail)


HOSTILE = {
    "a sparse bomb": (gnu_sparse("model.py", 100 << 20), "not a plain regular file"),
    "a contiguous member": (
        tar_xz([("model.py", b"A = 1\n")], kind=tarfile.CONTTYPE),
        "not a plain regular file",
    ),
    "a NUL in a name": (pax_path("model.py\x00evil"), "letters, digits"),
    "a newline in a name": (tar_xz([("a\nFAKE: ok.py", b"A = 1\n")]), "letters, digits"),
    "a 300-character name": (tar_xz([("a" * 300 + ".py", b"A = 1\n")]), "letters, digits"),
    "a space in a name": (tar_xz([("my model.py", b"A = 1\n")]), "letters, digits"),
    "a nested bundle deeper": (tar_xz([("pkg/" + CODE_BUNDLE, b"")]), "never counted or staged"),
    "a payload after the end blocks": (with_tail(b"hidden payload" + bytes(500)), "after its last member"),
    "a symbolic link": (
        tar_xz([("model.py", b"")], kind=tarfile.SYMTYPE, link="/data/val.bin"),
        "not a plain regular file",
    ),
    "a hard link": (
        tar_xz([("model.py", b"")], kind=tarfile.LNKTYPE, link="train.py"),
        "not a plain regular file",
    ),
    "a device": (tar_xz([("dev", b"")], kind=tarfile.CHRTYPE), "not a plain regular file"),
    "a parent path": (tar_xz([("../escape.py", b"X = 1\n")]), "relative and normalised"),
    "an absolute path": (tar_xz([("/tmp/abs.py", b"X = 1\n")]), "relative and normalised"),
    "a dotted path": (tar_xz([("./model.py", b"X = 1\n")]), "relative and normalised"),
    "bytecode": (tar_xz([("__pycache__/model.cpython-311.pyc", b"\0")]), "never counted or staged"),
    "a hidden file": (tar_xz([(".env", b"X=1\n")]), "never counted or staged"),
    "a bundle in the bundle": (tar_xz([(CODE_BUNDLE, b"")]), "never counted or staged"),
    "a native module": (tar_xz([("fast.so", b"\x7fELF")]), "native extension module"),
    "a name twice": (tar_xz([("model.py", b"A = 1\n"), ("model.py", b"A = 2\n")]), "twice"),
    "not xz": (b"PK\x03\x04 a zip file", "not an xz stream"),
    "a truncated stream": (tar_xz([("model.py", MODEL.encode())])[:-20], "truncated|not an xz stream"),
    "bytes after the stream": (tar_xz([("model.py", b"A = 1\n")]) + b"trailing", "after its xz stream"),
    "not a tar inside": (lzma.compress(b"just text, no tar headers" * 40), "not a tar archive"),
    "a non-UTF-8 source": (tar_xz([("model.py", b"X = '\xff'\n")]), "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundles_are_refused_before_anything_is_staged(case, tmp_path):
    data, why = HOSTILE[case]
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / CODE_BUNDLE).write_bytes(data)
    for check in (lambda: inspect_folder(sub), lambda: stage_folder(sub, tmp_path / "dest")):
        with pytest.raises(FolderRefused, match=why) as e:
            check()
        assert e.value.status == "illegal" and "\n" not in str(e.value)
    assert not (tmp_path / "dest").exists()


def test_a_bundle_that_expands_past_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cap, "MAX_BUNDLE_EXPANDED_BYTES", 64 * 1024)
    bomb = lzma.compress(bytes(10 << 20))  # 10 MiB of zeros in a few KB
    assert len(bomb) < 4096
    with pytest.raises(FolderRefused, match="expands to more than 65,536 bytes"):
        read_bundle(bomb, tmp_path / CODE_BUNDLE)


def test_a_member_under_a_path_that_is_a_file_is_refused(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "pkg").write_text("a file, not a folder\n")
    (sub / CODE_BUNDLE).write_bytes(tar_xz([("pkg/util.py", b"X = 1\n")]))
    for check in (lambda: inspect_folder(sub), lambda: stage_folder(sub, tmp_path / "dest")):
        with pytest.raises(FolderRefused, match="needs 'pkg' to be a folder, but it is a file"):
            check()
    assert not (tmp_path / "dest").exists()


def test_an_unstaged_folder_counts_a_loose_file_that_differs_from_its_member(tmp_path):
    """code_bytes on a folder as shipped: only a loose file byte-identical to its member is counted once."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / CODE_BUNDLE).write_bytes(tar_xz([("big.py", b"A = 1\n")]))
    (sub / "big.py").write_bytes(b"# " + b"x" * 1_000_000 + b"\n")
    assert code_bytes(sub) == sum((sub / f).stat().st_size + len(f) for f in (CODE_BUNDLE, "big.py"))
