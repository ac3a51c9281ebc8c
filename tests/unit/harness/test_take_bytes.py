"""What the harness takes of the sealed pack's output (harness/run/train_phase.py take_bytes): the bytes alone.

HOLE (before the fix): the sealed pack's artifact was renamed into the run folder, which keeps what the codec's
process set on the file beside its bytes (user xattrs: about 3 kB on ext4, 26 MB measured on tmpfs for an empty
file, unbounded on XFS), and the scorer's workers read it in place on a machine without worlds: bytes no cap
counted (tests/e2e/test_attack_exec.py, test_worker_boundary.py show it end to end).
"""

from __future__ import annotations

import os
import time

import pytest

from harness.run.train_phase import take_bytes


def _user_xattrs_supported(folder) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


def test_the_bytes_are_taken_and_nothing_beside_them(tmp_path):
    if not _user_xattrs_supported(tmp_path):
        pytest.skip("no user xattrs on this file system")
    src, dest = tmp_path / "out" / "artifact.pgolf", tmp_path / "run" / "artifact.pgolf"
    src.parent.mkdir()
    dest.parent.mkdir()
    src.write_bytes(b"PGOLFART" + bytes(range(256)) * 100)
    os.setxattr(src, "user.pgolf.weights", b"w" * 1000)
    os.chmod(src, 0o4755)
    os.utime(src, ns=(1, 123_456_789))
    assert take_bytes(src, dest, max_bytes=16_000_000)
    assert dest.read_bytes() == b"PGOLFART" + bytes(range(256)) * 100 and not src.exists()
    assert [a for a in os.listxattr(dest) if a.startswith("user.")] == []
    st = os.stat(dest)
    assert st.st_mtime_ns != 123_456_789 and not st.st_mode & 0o4000
    assert sorted(p.name for p in dest.parent.iterdir()) == ["artifact.pgolf"]  # no temp file left


def test_a_link_or_a_fifo_is_not_taken(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not the pack's")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo", "missing"):
        assert take_bytes(tmp_path / name, tmp_path / f"{name}.taken", max_bytes=1 << 20) is False
        assert not (tmp_path / f"{name}.taken").exists()
    assert target.read_bytes() == b"not the pack's"


def test_a_sparse_file_over_the_cap_is_renamed_never_copied(tmp_path):
    """Over the cap the artifact is never scored (its size is its verdict): copied, a sparse terabyte a codec
    made in a millisecond would have filled the disk."""
    src, dest = tmp_path / "big", tmp_path / "big.taken"
    with open(src, "wb") as f:
        f.truncate(1 << 40)
    t0 = time.monotonic()
    assert take_bytes(src, dest, max_bytes=16_000_000)
    assert time.monotonic() - t0 < 1.0 and dest.stat().st_size == 1 << 40 and not src.exists()
