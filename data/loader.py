"""The training loader: a deterministic stream over memory-mapped training shards.

Every rank opens the same shards in the same order. One `next_batch` call on every rank takes the
next world_size * (batch_tokens + 1) tokens of the stream (wrapping around at the end of the last
shard) and gives rank r the r-th disjoint slice; x and y are that slice shifted by one. Slicing is
numpy on memory maps: no per-token Python loop. The number of training shards used is fixed at
construction and recorded in every result, since the order of training data depends on it:
`train_shard_paths(dataset_dir, n)` picks the first n training shards of a dataset's manifest (and
refuses to silently use fewer), and `loader.describe()` gives the record.

In the train phase a rank cannot open the shards by path (they are outside its sandbox): the
supervisor opens them read-only and passes the descriptors over the wire (harness/train/wire.py) when
the rank's `OnDemandTokenStream` takes its first batch, and `ShardStream.from_descriptors` maps them
the same way (`shard_from_descriptor`).

Speed: a call costs a few memmap slice copies (uint16 → int64) per rank, so an 8-rank split of a
524,288-token global batch runs at well over 100M tokens/s from page cache (`pgolf bench data`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from data.manifest import load_manifest
from data.shards import HEADER_BYTES, TOKEN_DTYPE, ShardError, read_shard


def train_shard_paths(dataset_dir: str | os.PathLike[str], num_shards: int | None = None) -> list[Path]:
    """The first `num_shards` training shards of a dataset folder, in manifest order (None: all).

    The count is part of a run's identity (it fixes where the stream wraps), so asking for more
    shards than the folder holds is an error, never a silent shortfall.
    """
    paths = load_manifest(dataset_dir).shard_paths("train")
    if num_shards is None:
        return paths
    if num_shards <= 0:
        raise ValueError(f"train_shards must be positive (or None for all), got {num_shards}")
    if num_shards > len(paths):
        raise ValueError(
            f"train_shards={num_shards} but {dataset_dir} holds {len(paths)} training shards. "
            f"HINT: download more with `pgolf data download --train-shards {num_shards}` or ask for fewer"
        )
    return paths[:num_shards]


def shard_from_descriptor(fd: int, name: str, count: int) -> np.ndarray:
    """A shard's tokens from an open read-only descriptor (its header already checked by whoever opened
    it, which also says `count`): the size is checked, then the tokens are mapped read-only (no copy)."""
    size = os.fstat(fd).st_size
    expected = HEADER_BYTES + 2 * count
    if count < 0 or size != expected:
        raise ShardError(
            f"training shard {name} should be {expected} bytes ({count} tokens) but its descriptor holds {size}: "
            "the file changed after it was opened. HINT: do not rewrite a dataset while a run uses it"
        )
    if count == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    return np.frombuffer(mapped, dtype=TOKEN_DTYPE, count=count, offset=HEADER_BYTES)


class ShardStream:
    """Endless concatenation of shards; `take(n)` returns the next n tokens as an int64 array."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]):
        if not paths:
            raise FileNotFoundError("no training shards given; build or download a dataset first")
        self.paths = [Path(p) for p in paths]
        self._setup(
            [p.name for p in self.paths], [read_shard(p) for p in self.paths], str(self.paths[0].parent)
        )

    @classmethod
    def from_descriptors(cls, shards: Sequence[tuple[str, int, int]]) -> ShardStream:
        """A stream over (name, token count, read-only descriptor) shards; the descriptors may be closed after."""
        if not shards:
            raise FileNotFoundError("no training shards given; build or download a dataset first")
        self = cls.__new__(cls)
        self.paths = []
        self._setup(
            [n for n, _, _ in shards], [shard_from_descriptor(fd, n, c) for n, c, fd in shards], "given"
        )
        return self

    def _setup(self, names: list[str], shards: list[np.ndarray], where: str) -> None:
        self.names = names
        self.shards = shards
        if sum(s.size for s in self.shards) == 0:
            raise ValueError(f"training shards {where} hold no tokens")
        self.shard_idx = 0
        self.pos = 0

    def take(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        filled = 0
        while filled < n:
            shard = self.shards[self.shard_idx]
            k = min(n - filled, shard.size - self.pos)
            if k > 0:
                out[filled : filled + k] = shard[self.pos : self.pos + k]
                filled += k
                self.pos += k
            if self.pos >= shard.size:
                self.shard_idx = (self.shard_idx + 1) % len(self.shards)
                self.pos = 0
        return out

    def skip(self, n: int) -> None:
        """Advance by n tokens without copying them."""
        while n > 0:
            shard = self.shards[self.shard_idx]
            k = min(n, shard.size - self.pos)
            self.pos += k
            n -= k
            if self.pos >= shard.size:
                self.shard_idx = (self.shard_idx + 1) % len(self.shards)
                self.pos = 0


class DistributedTokenLoader:
    """`harness.api.TokenStream` over training shards (paths, or a ShardStream) for one rank of `world_size`."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]] | ShardStream,
        rank: int,
        world_size: int,
        device: torch.device | str = "cpu",
        *,
        pin_memory: bool = False,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.stream = paths if isinstance(paths, ShardStream) else ShardStream(paths)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.pin_memory = pin_memory and self.device.type == "cuda"
        self._consumed = 0

    @property
    def num_shards(self) -> int:
        return len(self.stream.names)

    @property
    def shard_names(self) -> list[str]:
        return list(self.stream.names)

    @property
    def tokens_consumed(self) -> int:
        return self._consumed

    def describe(self) -> dict[str, object]:
        """What a result records about the training stream (the data order depends on all of it)."""
        return {
            "train_shards_used": self.num_shards,
            "train_shard_names": self.shard_names,
            "train_tokens_available": int(sum(s.size for s in self.stream.shards)),
            "world_size": self.world_size,
        }

    def next_batch(self, batch_tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        if batch_tokens <= 0 or seq_len <= 0 or batch_tokens % seq_len:
            raise ValueError(
                f"batch_tokens ({batch_tokens}) must be a positive multiple of seq_len ({seq_len})"
            )
        span = batch_tokens + 1
        self.stream.skip(self.rank * span)
        local = self.stream.take(span)
        self.stream.skip((self.world_size - self.rank - 1) * span)
        self._consumed += self.world_size * batch_tokens
        t = torch.from_numpy(local)
        if self.pin_memory:
            t = t.pin_memory()
        t = t.to(self.device, non_blocking=True)
        return t[:-1].view(-1, seq_len), t[1:].view(-1, seq_len)


class OnDemandTokenStream:
    """`harness.api.TokenStream` that gets its shards on the first batch: `open_shards()` returns
    (name, token count, read-only descriptor) for each, in stream order (a rank's: harness/train/wire.py
    WireClient.data, which asks the supervisor).

    Until then the process holds no training token; after that, batches come from memory maps of the
    descriptors exactly as from files, with no further call.
    """

    def __init__(
        self,
        open_shards: Callable[[], Sequence[tuple[str, int, int]]],
        rank: int,
        world_size: int,
        device: torch.device | str = "cpu",
        *,
        pin_memory: bool = False,
    ):
        self._open_shards, self._rank, self._world = open_shards, rank, world_size
        self._device, self._pin = device, pin_memory
        self._loader: DistributedTokenLoader | None = None

    def _open(self) -> DistributedTokenLoader:
        shards = self._open_shards()
        try:
            stream = ShardStream.from_descriptors(shards)
        finally:
            for _, _, fd in shards:
                os.close(fd)  # the maps keep the files
        self._loader = DistributedTokenLoader(
            stream, self._rank, self._world, self._device, pin_memory=self._pin
        )
        return self._loader

    def next_batch(self, batch_tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        loader = self._loader if self._loader is not None else self._open()
        return loader.next_batch(batch_tokens, seq_len)

    @property
    def opened(self) -> bool:
        return self._loader is not None

    @property
    def tokens_consumed(self) -> int:
        return self._loader.tokens_consumed if self._loader is not None else 0
