"""Shard format: round trips, and hostile files refused with the file named."""

from __future__ import annotations

import numpy as np
import pytest

from data.shards import (
    HEADER_BYTES,
    SHARD_MAGIC,
    ShardError,
    list_shards,
    read_header,
    read_shard,
    shard_name,
    write_shard,
)


def test_round_trip_and_exact_size(tmp_path):
    toks = np.array([1, 5, 65535, 0, 42], dtype=np.int64)
    p = tmp_path / shard_name("train", 0)
    n = write_shard(p, toks)
    assert n == p.stat().st_size == HEADER_BYTES + 2 * toks.size
    assert read_header(p) == 5
    np.testing.assert_array_equal(read_shard(p), toks)
    header = np.fromfile(p, dtype="<i4", count=3)
    assert header.tolist() == [SHARD_MAGIC, 1, 5]


def test_refuses_out_of_range_tokens(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", np.array([65536]))
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", np.array([-1]))
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b[:100], "shorter than"),
        (lambda b: b[:-2], "truncated or corrupt"),
        (lambda b: b + b"\0\0", "truncated or corrupt"),
        (lambda b: (123).to_bytes(4, "little") + b[4:], "magic 123"),
        (lambda b: b[:4] + (7).to_bytes(4, "little") + b[8:], "version 7"),
    ],
)
def test_hostile_shards_name_the_file(tmp_path, mutate, match):
    p = tmp_path / "fineweb_val_000000.bin"
    write_shard(p, np.arange(10))
    p.write_bytes(mutate(p.read_bytes()))
    with pytest.raises(ShardError, match=match) as e:
        read_shard(p)
    assert str(p) in str(e.value) and "HINT" in str(e.value)


def test_list_shards_orders_by_index(tmp_path):
    for i in (10, 2, 1):
        write_shard(tmp_path / shard_name("train", i), np.arange(3))
    write_shard(tmp_path / shard_name("val", 0), np.arange(3))
    (tmp_path / "fineweb_train_xx.bin").write_bytes(b"")
    assert [p.name for p in list_shards(tmp_path, "train")] == [shard_name("train", i) for i in (1, 2, 10)]
