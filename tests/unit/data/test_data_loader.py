"""The training loader: deterministic order, disjoint rank slices, a fixed shard count; the benchmark runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.bench import bench_loader, bench_shard_write
from data.build import build_dataset
from data.loader import DistributedTokenLoader, train_shard_paths
from data.shards import shard_name, write_shard


@pytest.fixture()
def shards(tmp_path):
    """Three shards of distinct, recognisable tokens (0..2999 mod 65536), sizes 1000 / 1 / 1999."""
    stream = np.arange(3000, dtype=np.int64)
    paths = []
    for i, (a, b) in enumerate([(0, 1000), (1000, 1001), (1001, 3000)]):
        p = tmp_path / shard_name("train", i)
        write_shard(p, stream[a:b])
        paths.append(p)
    return paths, stream


def test_ranks_read_disjoint_consecutive_slices_of_each_global_batch(shards):
    paths, stream = shards
    world, batch, seq = 4, 64, 16
    loaders = [DistributedTokenLoader(paths, r, world) for r in range(world)]
    pos = 0
    for _ in range(30):  # 30 * 4 * 65 = 7800 tokens: wraps the 3000-token stream twice
        for r, ld in enumerate(loaders):
            x, y = ld.next_batch(batch, seq)
            assert x.shape == y.shape == (batch // seq, seq) and x.dtype == y.dtype == torch.int64
            want = np.take(stream, np.arange(pos + r * (batch + 1), pos + (r + 1) * (batch + 1)), mode="wrap")
            np.testing.assert_array_equal(x.flatten().numpy(), want[:-1])
            np.testing.assert_array_equal(y.flatten().numpy(), want[1:])
        pos += world * (batch + 1)
    assert all(ld.tokens_consumed == 30 * world * batch for ld in loaders)


def test_one_rank_k_calls_equals_k_ranks_one_call(shards):
    paths, _ = shards
    one = DistributedTokenLoader(paths, 0, 1)
    seq = [one.next_batch(32, 8)[0] for _ in range(5)]
    many = [DistributedTokenLoader(paths, r, 5).next_batch(32, 8)[0] for r in range(5)]
    for a, b in zip(seq, many, strict=True):
        assert a.equal(b)


def test_train_shard_paths_fixes_the_count_and_describe_records_it(tmp_path):
    docs = [f"document {i} " * 20 for i in range(60)]
    ds = build_dataset(docs, tmp_path / "ds", val_docs=5, tokenizer="byte260", shard_tokens=2000, workers=1)
    all_paths = train_shard_paths(ds)
    assert len(all_paths) > 3
    two = train_shard_paths(ds, 2)
    assert two == all_paths[:2]
    ld = DistributedTokenLoader(two, 1, 8)
    d = ld.describe()
    assert (
        d["train_shards_used"] == 2
        and d["train_shard_names"] == [p.name for p in two]
        and d["world_size"] == 8
    )
    with pytest.raises(ValueError, match=f"holds {len(all_paths)} training shards"):
        train_shard_paths(ds, len(all_paths) + 1)
    with pytest.raises(ValueError, match="positive"):
        train_shard_paths(ds, 0)


def test_bad_batch_and_rank_are_refused(shards):
    paths, _ = shards
    with pytest.raises(ValueError, match="rank 4 out of range"):
        DistributedTokenLoader(paths, 4, 4)
    with pytest.raises(ValueError, match="multiple of seq_len"):
        DistributedTokenLoader(paths, 0, 1).next_batch(100, 16)


def test_benchmark_functions_run_and_report_figures(tmp_path):
    """Prints, never asserts speed: the figures only have to be positive numbers."""
    mbps = bench_shard_write(tmp_path, 2, 200_000)
    paths = [tmp_path / shard_name("train", i) for i in range(2)]
    tps, steps = bench_loader(paths, 8, 8 * 4096, 1024)
    print(f"shard write {mbps:.1f} MB/s, loader {tps / 1e6:.1f} M tokens/s over {steps} steps")
    assert mbps > 0 and tps > 0 and steps >= 1
