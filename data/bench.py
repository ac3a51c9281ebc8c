"""`pgolf bench data`: how fast the data layer is on this machine. Prints figures, asserts nothing.

    pgolf bench data [--data DIR] [--docs FILE] [--tokenizer MODEL|byte260] [--ranks 8]
                     [--global-batch-tokens 524288] [--seq-len 1024] [--shard-tokens 50000000] [--shards 2]
    python -m data.bench ...      (the same, without the harness)

Three figures:
- shard write MB/s: `write_shard` of `--shards` shards of `--shard-tokens` random tokens into a
  temporary folder (fsync and atomic rename included, as a build pays them);
- loader tokens/s from page cache: `--ranks` DistributedTokenLoader instances in one process, each
  calling `next_batch(global_batch / ranks, seq_len)` once per step (the 8-rank split of the
  official 524,288-token batch), over the shards just written (or `--data`'s training shards), after
  one untimed pass that brings every page into the cache;
- tokenization MB/s per core: `--tokenizer` on `--docs` (default: the embedded corpus and its
  tokenizer), once in this process alone, and once on all cores through the build's worker pool.
  Per core means text MB over CPU seconds (this process plus its workers), which stays meaningful
  on a shared machine; the wall-clock MB/s is printed beside it.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.build import EncodeBatch, default_workers, encode_documents, encode_ordered
from data.loader import DistributedTokenLoader, train_shard_paths
from data.shards import shard_name, write_shard
from data.tokenizer import BYTE260_FILENAME, load_tokenizer, write_byte260

OFFICIAL_GLOBAL_BATCH_TOKENS = 524_288
OFFICIAL_SEQ_LEN = 1024
OFFICIAL_RANKS = 8
BENCH_SHARD_TOKENS = 50_000_000
BENCH_SHARDS = 2
TOKENIZE_BATCH_DOCS = 64


def bench_shard_write(folder: Path, shards: int, shard_tokens: int, vocab_size: int = 1024) -> float:
    """Write `shards` shards of random tokens into `folder`; returns MB/s (1 MB = 1e6 bytes)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab_size, size=shard_tokens, dtype=np.uint16)
    written = 0
    t0 = time.perf_counter()
    for i in range(shards):
        written += write_shard(folder / shard_name("train", i), tokens)
    return written / 1e6 / (time.perf_counter() - t0)


def bench_loader(
    paths: Sequence[Path], ranks: int, global_batch_tokens: int, seq_len: int
) -> tuple[float, int]:
    """Tokens/s of `ranks` loaders in one process over one pass of `paths`; returns (tokens/s, steps)."""
    if global_batch_tokens % (ranks * seq_len):
        raise ValueError(
            f"--global-batch-tokens {global_batch_tokens} must be a multiple of ranks*seq_len ({ranks * seq_len})"
        )
    local = global_batch_tokens // ranks
    for p in paths:  # warm the page cache (untimed): the figure is "from page cache"
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass
    loaders = [DistributedTokenLoader(paths, r, ranks) for r in range(ranks)]
    total = sum(s.size for s in loaders[0].stream.shards)
    steps = max(1, total // (ranks * (local + 1)))
    for ld in loaders:  # one untimed step (first-touch of the memmaps)
        ld.next_batch(local, seq_len)
    t0 = time.perf_counter()
    for _ in range(steps):
        for ld in loaders:
            ld.next_batch(local, seq_len)
    return steps * global_batch_tokens / (time.perf_counter() - t0), steps


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeFigures:
    """Tokenization throughput; MB = 1e6 bytes of UTF-8 text. Per-core figures divide by CPU seconds,
    so they hold on a shared machine; wall figures say what this machine delivered just now."""

    text_mb: float
    one_wall_mbps: float
    one_cpu_mbps: float
    workers: int
    pool_wall_mbps: float
    pool_cpu_mbps: float


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench_tokenize(tokenizer_path: Path, docs: Sequence[str], workers: int) -> TokenizeFigures:
    """Encode `docs` once in this process alone, then once through the build's pool of `workers`."""
    tok = load_tokenizer(tokenizer_path)
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(docs), TOKENIZE_BATCH_DOCS):
        encode_documents(tok, docs[i : i + TOKENIZE_BATCH_DOCS])
    one_wall, one_cpu = time.perf_counter() - t0, time.process_time() - c0
    batches = (
        EncodeBatch("train", list(docs[i : i + TOKENIZE_BATCH_DOCS]), 0)
        for i in range(0, len(docs), TOKENIZE_BATCH_DOCS)
    )
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    for _ in encode_ordered(tokenizer_path, batches, workers):
        pass
    pool_wall = time.perf_counter() - t0
    pool_cpu = (time.process_time() - c0) + (_children_cpu_s() - k0)  # parent + reaped workers
    return TokenizeFigures(
        text_mb=mb,
        one_wall_mbps=mb / one_wall,
        one_cpu_mbps=mb / one_cpu,
        workers=workers,
        pool_wall_mbps=mb / pool_wall,
        pool_cpu_mbps=mb / pool_cpu,
    )


def _docs_and_tokenizer(args: argparse.Namespace, tmp: Path) -> tuple[list[str], Path]:
    if args.docs:
        from data.sources import source_from_path

        docs = list(source_from_path(args.docs, max_docs=args.max_docs or None))
    else:
        from data.embedded import embedded_documents

        docs = embedded_documents()
    if args.tokenizer == "byte260":
        path = tmp / BYTE260_FILENAME
        write_byte260(path)
        return docs, path
    if args.tokenizer:
        return docs, Path(args.tokenizer)
    from data.embedded import ensure_embedded_dataset
    from data.manifest import load_manifest

    return docs, load_manifest(ensure_embedded_dataset()).tokenizer_path


def cmd_bench_data(args: argparse.Namespace) -> int:
    workers = args.workers or default_workers()
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-") as tmp_s:
        tmp = Path(tmp_s)
        if args.data:
            paths = train_shard_paths(args.data)
            source = f"training shards of {args.data}"
        else:
            mbps = bench_shard_write(tmp, args.shards, args.shard_tokens)
            print(
                f"shard write: {mbps:,.1f} MB/s ({args.shards} shards of {args.shard_tokens:,} tokens, fsync + rename included)"
            )
            paths = [tmp / shard_name("train", i) for i in range(args.shards)]
            source = f"{args.shards} shards of {args.shard_tokens:,} tokens just written"
        tps, steps = bench_loader(paths, args.ranks, args.global_batch_tokens, args.seq_len)
        print(
            f"loader: {tps / 1e6:,.1f} M tokens/s from page cache; {args.ranks} ranks x "
            f"{args.global_batch_tokens // args.ranks:,} tokens (global batch {args.global_batch_tokens:,}, "
            f"seq {args.seq_len}), {steps} steps over {source}"
        )
        if not args.skip_tokenize:
            docs, tok_path = _docs_and_tokenizer(args, tmp)
            f = bench_tokenize(tok_path, docs, workers)
            print(
                f"tokenize ({tok_path.name}, {len(docs):,} docs, {f.text_mb:,.1f} MB of text): "
                f"{f.one_cpu_mbps:,.2f} MB/s per core (1 process, CPU time; {f.one_wall_mbps:,.2f} MB/s wall); "
                f"{f.workers} processes: {f.pool_wall_mbps:,.2f} MB/s wall, {f.pool_cpu_mbps:,.2f} MB/s per core (CPU time)"
            )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `data` to the `pgolf bench` family."""
    p = sub.add_parser("data", help="loader tokens/s, tokenization MB/s per core, shard write MB/s")
    p.add_argument(
        "--data", help="benchmark the loader on this dataset's training shards instead of synthetic ones"
    )
    p.add_argument(
        "--docs", help="documents to tokenize (.jsonl/.parquet/.txt; default: the embedded corpus)"
    )
    p.add_argument("--max-docs", type=int, default=0, help="tokenize only the first N documents (0 = all)")
    p.add_argument("--tokenizer", help="a .model file or byte260 (default: the embedded dataset's tokenizer)")
    p.add_argument(
        "--workers", type=int, help="processes for the parallel tokenization figure (default: all cores)"
    )
    p.add_argument(
        "--ranks", type=int, default=OFFICIAL_RANKS, help=f"simulated ranks (default {OFFICIAL_RANKS})"
    )
    p.add_argument("--global-batch-tokens", type=int, default=OFFICIAL_GLOBAL_BATCH_TOKENS)
    p.add_argument("--seq-len", type=int, default=OFFICIAL_SEQ_LEN)
    p.add_argument("--shards", type=int, default=BENCH_SHARDS, help="synthetic shards to write")
    p.add_argument("--shard-tokens", type=int, default=BENCH_SHARD_TOKENS, help="tokens per synthetic shard")
    p.add_argument("--skip-tokenize", action="store_true", help="only the shard write and loader figures")
    p.set_defaults(func=cmd_bench_data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    register(parser.add_subparsers(dest="bench_command", required=True, metavar="BENCH"))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
