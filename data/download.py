"""Download the official cached FineWeb shards: `pgolf data download --variant sp1024 [--train-shards N]`.

The challenge's export lives in the dataset repo `willdepueoai/parameter-golf` under the prefix
`datasets/`, described by `datasets/manifest.json`. Files are fetched with `huggingface_hub`'s
`hf_hub_download` (so `HF_ENDPOINT` / `--endpoint`, tokens, mirrors and Xet storage work as
usual), pinned to the commit that `--revision` resolves to, so every file of one download comes from
one commit. What is fetched: the manifest, the variant's tokenizer files, every validation shard,
and the first N training shards.

Assumed schema of the hub manifest (what the reference exporter writes; only these keys are read,
unknown keys are ignored, and a file of another shape is refused with this description):

    {"datasets": [{"name": "fineweb10B_sp1024",            # variant sp1024 <-> fineweb10B_sp1024
                   "tokenizer_name": "sp_bpe_1024",
                   "stats": {"files_train": 80, "files_val": 1, ...},
                   "files": [{"name": "fineweb_val_000000.bin", "bytes": N, "sha256": "..."}]},  # optional
                  ...],
     "tokenizers": [{"name": "sp_bpe_1024",
                     "model_path": "tokenizers/fineweb_1024_bpe.model",       # and/or "vocab_path",
                     "vocab_path": "tokenizers/fineweb_1024_bpe.vocab"}],     # "path" (byte260's .json)
     "files": [{"path": "datasets/fineweb10B_sp1024/fineweb_val_000000.bin", "sha256": "...", "bytes": N}]}  # optional

`datasets` and `tokenizers` may also be objects keyed by name. Shards are
`datasets/datasets/<name>/fineweb_{val,train}_NNNNNN.bin`, numbered from 0; tokenizer paths are
relative to the prefix. Sizes and sha256s are used wherever the manifest gives them.

Guarantees:
- Every file is checked before it gets its final name: its size (against the hub's), the shard
  header (magic, version, a size that matches the declared count, token ids below the vocabulary),
  and its sha256 where the manifest gives one. A corrupt file is deleted and the error names it.
  `hf_hub_download` itself writes to a temporary name, so a partial file never has a final name.
- Resumable: a dropped connection is resumed in place with an HTTP Range request (up to 5 times per
  file, by huggingface_hub); a rerun of an interrupted command at the same endpoint does not fetch
  again a file already verified (recorded in `.pgolf-download.json`), but checks it again against this
  run's hub manifest (the state file and the folder are no proof); at another endpoint it fetches all;
  the staging folder is emptied first, so nothing else (the hub manifest, a partial file) is reused.
- The hub is not trusted: a file is cut off once the hub sends more than its declared size (else
  MAX_TOKENIZER_BYTES / MAX_SHARD_BYTES; the hub manifest MAX_HUB_MANIFEST_BYTES); tokenizer files
  are plain names (`.model`, `.vocab`, `.json`) that collide with none of the folder's own; at most
  MAX_SHARDS shards per split; an official variant's tokenizer model must be the official file
  (data/official.py). The stored Hugging Face token goes to huggingface.co only, never to a mirror.
  A file must come at MIN_RATE_BYTES_PER_S or more after FILE_GRACE_S (measured on the bytes that came
  in, give or take the client's PROGRESS_PIECE_BYTES piece, never on the size the hub declares), and all of
  it within FILE_GRACE_S plus its limit at that rate (a hub trickling a byte now and then never trips the
  client's silence timeout), and the disk keeps MIN_FREE_BYTES free.
- The folder ends with this harness's own `manifest.json` (data/manifest.py), so it is used exactly
  like a built dataset: shard sha256s, document counts (BOS tokens), tokenizer entry, unigram counts.

Destination: `--out`, else `$PG_DATA_DIR/fineweb10B_<variant>` (default `~/.cache/pgolf/datasets`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from tqdm import tqdm

from data.io import read_json, sha256_file, write_bytes_atomic, write_json_atomic
from data.manifest import MANIFEST_NAME, write_manifest
from data.official import OFFICIAL_TOKENIZERS
from data.shards import HEADER_BYTES, ShardError, read_header, read_shard, shard_name
from data.tokenizer import BYTE260_FILENAME, BYTE260_OFFSET, BYTE260_VOCAB_SIZE, load_tokenizer, write_byte260

DEFAULT_REPO_ID = "willdepueoai/parameter-golf"
REMOTE_PREFIX = "datasets"
HUB_MANIFEST_NAME = "manifest.json"
DEFAULT_TRAIN_SHARDS = 80
STATE_NAME = ".pgolf-download.json"
STATE_FORMAT, STATE_VERSION = "pg-download-state", 2
"""Version 2 records the endpoint the files came from."""
STAGING_NAME = ".hub-staging"
HUB_MANIFEST_COPY = "hub_manifest.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_SHARDS = 10_000
"""Shards per split a hub manifest may declare (the reference export has a few hundred at most)."""
MAX_HUB_MANIFEST_BYTES = 16 << 20
MAX_TOKENIZER_BYTES = 64 << 20
MAX_SHARD_BYTES = HEADER_BYTES + 2 * (2**31 - 1)
"""Most bytes taken for a file the hub manifest gives no size for (a shard holds at most 2^31-1 tokens)."""
MIN_RATE_BYTES_PER_S = 64 << 10
"""A file whose transfer averages less than this (after FILE_GRACE_S) is cut off: a hub that trickles a byte
now and then never trips the HTTP client's silence timeout, and would hold the download for ever."""
FILE_GRACE_S = 60.0
PROGRESS_PIECE_BYTES = 10 << 20
"""The most bytes the HTTP client reads before it reports them (huggingface_hub's DOWNLOAD_CHUNK_SIZE, 10 MiB): a
file's deadline, moved by the bytes reported, allows one piece more than came in (`_Deadline`)."""
MIN_FREE_BYTES = 1 << 30
"""Space the download leaves free on the destination's disk: a file that would leave less is refused before it is
fetched (by its declared size), and a transfer is cut off when the disk falls below it."""
SCAN_TOKENS = 1 << 24
"""Tokens read at a time when a shard is scanned (max id, BOS count, unigram counts): memory stays bounded
whatever size a shard is (bincount widens to int64, 8 bytes per token)."""
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TOKENIZER_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(model|vocab|json)$")
HUB_TOKEN_HOSTS = ("huggingface.co",)
"""The stored Hugging Face token is sent to these endpoints only; another endpoint gets a token passed on purpose."""
SCHEMA_HINT = (
    'expected {"datasets": [{"name": "fineweb10B_sp1024", "tokenizer_name": ..., '
    '"stats": {"files_train": N, "files_val": M}}], "tokenizers": [{"name": ..., "model_path": ...}]}'
)


class DownloadError(RuntimeError):
    """A file could not be fetched or failed its checks; the message names it and how to go on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteFile:
    """One file to fetch: its path in the repo, its name in the dataset folder, what we know of it."""

    path: str
    name: str
    kind: str  # "val" | "train" | "tokenizer"
    size_bytes: int | None = None
    sha256: str | None = None
    official_sha256: str | None = None  # an official variant's tokenizer model: its sha256 is known here


@dataclass(frozen=True, kw_only=True, slots=True)
class VariantPlan:
    variant: str
    dataset_name: str
    files_train: int
    files_val: int
    train_shards: int
    tokenizer_name: str
    files: tuple[RemoteFile, ...]
    docs_sha256: str | None = None


# ---- The hub manifest ----


def dataset_name_for(variant: str) -> str:
    """sp1024 -> fineweb10B_sp1024 (byte260 -> fineweb10B_byte260), as the reference names them."""
    if variant != "byte260" and not re.fullmatch(r"sp\d+", variant):
        raise ValueError(f"--variant must be sp<VOCAB> (sp1024, sp4096, sp8192) or byte260, got {variant!r}")
    return f"fineweb10B_{variant}"


def _variant_of(name: str) -> str:
    return name.split("_", 1)[1] if name.startswith("fineweb") and "_" in name else name


def _entries(raw: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    value = raw.get(key)
    if isinstance(value, dict):
        return [{"name": k, **v} for k, v in value.items() if isinstance(v, dict)]
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    raise ValueError(f"{where}: unknown manifest shape (no list {key!r}); {SCHEMA_HINT}")


def _int_field(entry: dict[str, Any], keys: Iterable[str]) -> int | None:
    raw_stats = entry.get("stats")
    stats: dict[str, Any] = raw_stats if isinstance(raw_stats, dict) else {}
    for k in keys:
        for d in (stats, entry):
            text = str(d.get(k))
            # at most 18 digits: int() refuses a string of over 4300 with a message naming no input
            if isinstance(d.get(k), int | str) and text.isascii() and text.isdigit() and len(text) <= 18:
                return int(text)
    return None


def _file_index(*lists: Any) -> dict[str, dict[str, Any]]:
    """Known sizes / sha256s from optional `files` lists, keyed by repo-relative path and by base name."""
    index: dict[str, dict[str, Any]] = {}
    for lst in lists:
        for f in lst if isinstance(lst, list) else []:
            if not isinstance(f, dict):
                continue
            key = f.get("path") or f.get("name")
            if not isinstance(key, str):
                continue
            info: dict[str, Any] = {"size_bytes": _int_field(f, ("bytes", "size", "size_bytes"))}
            sha = f.get("sha256")
            info["sha256"] = sha.lower() if isinstance(sha, str) and _HEX64.match(sha.lower()) else None
            index[key.lstrip("/")] = info
            index.setdefault(Path(key).name, info)
    return index


def _relative(path: str) -> str:
    """A tokenizer path as the exporter wrote it -> relative to the prefix (absolute paths keep their
    `tokenizers/...` tail, since the exporter sometimes wrote its own local paths)."""
    parts = Path(path).parts
    if "tokenizers" in parts:
        return "/".join(parts[parts.index("tokenizers") :])
    if Path(path).is_absolute():
        raise ValueError(f"tokenizer path {path!r} in the hub manifest is absolute and not under tokenizers/")
    return path.lstrip("./")


def _check_tokenizer_path(rel: str, taken: list[str], where: str) -> None:
    """A tokenizer file lands in the dataset folder under its base name: a plain name of a tokenizer's kind, none
    of the folder's own files (manifest.json, the state, a shard) and not twice."""
    name = rel.rsplit("/", 1)[-1]
    reserved = (MANIFEST_NAME, HUB_MANIFEST_COPY, BYTE260_FILENAME, STATE_NAME)
    if (
        not all(_SEGMENT.match(part) for part in rel.split("/"))
        or not _TOKENIZER_FILE.match(name)
        or name in reserved
        or name in taken
    ):
        raise ValueError(
            f"{where}: tokenizer file {rel!r} in the hub manifest is refused: a tokenizer is a plain "
            f"name ending .model, .vocab or .json under tokenizers/, none of {', '.join(reserved)}, each once"
        )


def parse_hub_manifest(
    raw: Any,
    *,
    variant: str,
    train_shards: int | None,
    prefix: str = REMOTE_PREFIX,
    where: str = "hub manifest",
) -> VariantPlan:
    """Read the hub manifest (schema in the module docstring) into the list of files to fetch."""
    if not isinstance(raw, dict):
        raise ValueError(
            f"{where}: unknown manifest shape (a {type(raw).__name__}, not an object); {SCHEMA_HINT}"
        )
    wanted = dataset_name_for(variant)
    datasets = _entries(raw, "datasets", where)
    entry = next((d for d in datasets if d.get("name") == wanted), None) or next(
        (d for d in datasets if _variant_of(str(d.get("name"))) == variant), None
    )
    if entry is None:
        have = sorted({_variant_of(str(d.get("name")))[:40] for d in datasets if d.get("name")})
        listed = ", ".join(have[:20]) + (f" and {len(have) - 20} more" if len(have) > 20 else "")
        raise ValueError(
            f"variant {variant!r} ({wanted}) is not in {where}; it has: {listed or 'no datasets'}. "
            "HINT: pick one of those with --variant, or another --repo / --revision"
        )
    name = str(entry["name"])
    if not _SEGMENT.match(name):
        raise ValueError(
            f"{where}: dataset name {name!r} is not a plain folder name ([A-Za-z0-9._-]); refused"
        )
    files_train = _int_field(entry, ("files_train", "train_shards", "num_train_shards"))
    files_val = _int_field(entry, ("files_val", "val_shards", "num_val_shards"))
    if files_train is None or files_val is None or files_val < 1:
        raise ValueError(f"{where}: dataset {name} lacks stats.files_train / stats.files_val; {SCHEMA_HINT}")
    for key, count in (("files_train", files_train), ("files_val", files_val)):
        if count > MAX_SHARDS:
            raise ValueError(
                f"{where}: dataset {name} declares {key} {count}; an export has at most {MAX_SHARDS} shards per "
                "split: not the challenge's export. HINT: check --endpoint / --repo"
            )
    if train_shards is None:
        n = min(DEFAULT_TRAIN_SHARDS, files_train)
    elif not 0 <= train_shards <= files_train:
        raise ValueError(
            f"--train-shards {train_shards}: {variant} has {files_train} training shards on the hub (0..{files_train})"
        )
    else:
        n = train_shards

    tok_name = entry.get("tokenizer_name")
    if tok_name is not None and not (
        isinstance(tok_name, str) and _SEGMENT.match(tok_name) and len(tok_name) <= 200
    ):
        raise ValueError(
            f"{where}: dataset {name}'s tokenizer_name {str(tok_name)[:80]!r} is not a plain name; refused"
        )
    tokenizers = _entries(raw, "tokenizers", where) if "tokenizers" in raw else []
    tok = next((t for t in tokenizers if t.get("name") == tok_name), None)
    tok_paths = [str(tok[k]) for k in ("model_path", "vocab_path", "path") if tok and tok.get(k)]
    if not tok_paths and isinstance(entry.get("tokenizer_files"), list):
        tok_paths = [f"tokenizers/{f}" for f in entry["tokenizer_files"]]
    if not tok_paths:
        raise ValueError(
            f"{where}: no tokenizer files for {name} (tokenizer_name {tok_name!r}); {SCHEMA_HINT}"
        )

    index = _file_index(raw.get("files"), entry.get("files"), entry.get("shards"), (tok or {}).get("files"))
    files: list[RemoteFile] = []
    official = {v: sha for sha, v in OFFICIAL_TOKENIZERS.items()}.get(variant)
    for rel in map(_relative, tok_paths):
        _check_tokenizer_path(rel, [f.name for f in files], where)
        info = index.get(rel) or index.get(Path(rel).name) or {}
        pin = official if rel.endswith(".model") else None
        files.append(
            RemoteFile(
                path=f"{prefix}/{rel}", name=Path(rel).name, kind="tokenizer", official_sha256=pin, **info
            )
        )
    need = ".json" if variant == "byte260" else ".model"
    if not any(f.name.endswith(need) for f in files):
        raise ValueError(
            f"{where}: the tokenizer files of {name} ({', '.join(f.name for f in files)}) hold no {need}: "
            f"a {variant} dataset is made with one; refused"
        )
    for split, count in (("val", files_val), ("train", n)):
        for i in range(count):
            rel = f"datasets/{name}/{shard_name(split, i)}"
            info = index.get(rel) or index.get(shard_name(split, i)) or {}
            files.append(RemoteFile(path=f"{prefix}/{rel}", name=shard_name(split, i), kind=split, **info))
    raw_docs_meta = raw.get("docs_meta")
    docs_meta: dict[str, Any] = raw_docs_meta if isinstance(raw_docs_meta, dict) else {}
    # copied into our manifest: a sha256 or nothing, never a value of the hub's shape
    docs_sha256 = docs_meta.get("docs_sha256")
    return VariantPlan(
        variant=variant,
        dataset_name=name,
        files_train=files_train,
        files_val=files_val,
        train_shards=n,
        tokenizer_name=str(tok_name),
        files=tuple(files),
        docs_sha256=docs_sha256 if isinstance(docs_sha256, str) and _HEX64.match(docs_sha256) else None,
    )


# ---- Fetching ----


def _network_errors() -> tuple[type[BaseException], ...]:
    """OSError covers huggingface_hub's own errors; the HTTP client's transport errors are not OSErrors."""
    errors: list[type[BaseException]] = [OSError]
    for module, attr in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def _token_for(endpoint: str | None, token: str | bool | None) -> str | bool | None:
    """The token to send: one passed on purpose; else the stored one (HF_TOKEN, `hf auth login`) only to
    https://huggingface.co, never to a mirror nor in clear text (False: none)."""
    if token is not None:
        return token
    from huggingface_hub import constants

    url = urlsplit(endpoint or constants.ENDPOINT)
    return None if url.scheme == "https" and url.hostname in HUB_TOKEN_HOSTS else False


class _TooLarge(RuntimeError):
    pass


class _TooSlow(RuntimeError):
    pass


class _DiskLow(RuntimeError):
    pass


def _file_deadline_s(limit_bytes: int) -> float:
    """The longest a file of at most `limit_bytes` may take: FILE_GRACE_S, then MIN_RATE_BYTES_PER_S."""
    return FILE_GRACE_S + limit_bytes / MIN_RATE_BYTES_PER_S


def _free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


class _Deadline:
    """A file's deadline, moved by the bytes that come in: at any time the transfer must have taken at least
    MIN_RATE_BYTES_PER_S since FILE_GRACE_S, give or take one PROGRESS_PIECE_BYTES piece, and the whole file must come
    within `_file_deadline_s(limit_bytes)`. The hub's word (the size it declares, or none: the kind's limit) sets only
    that last bound: a deadline of the limit alone gave a trickling hub that declared no size 18 hours a shard."""

    def __init__(self, limit_bytes: int, armed: bool):
        self.limit_s = _file_deadline_s(limit_bytes)
        self.armed = armed
        self.t0 = time.monotonic()

    def allowed_s(self, received_bytes: int) -> float:
        """Seconds from the start the transfer may run, `received_bytes` in."""
        at_rate_s = FILE_GRACE_S + (received_bytes + PROGRESS_PIECE_BYTES) / MIN_RATE_BYTES_PER_S
        return min(self.limit_s, at_rate_s)

    def progress(self, received_bytes: int) -> None:
        """The bytes so far of this transfer (the client reports them): the timer set to the deadline they earn."""
        if self.armed:
            left_s = self.t0 + self.allowed_s(received_bytes) - time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, max(left_s, 1e-3))


@contextlib.contextmanager
def _deadline(limit_bytes: int) -> Iterator[_Deadline]:
    """Raise _TooSlow in this thread once the file's `_Deadline` has passed (a real-time interval timer, so a read
    the hub keeps alive with a byte now and then is interrupted too). Only the main thread receives signals;
    elsewhere (a library caller's worker thread) the transfer is bounded by the HTTP client's timeouts alone. A
    caller's own SIGALRM handler is put back after, and its timer too, less the time the file took (one due
    meanwhile fires as the file ends)."""
    if threading.current_thread() is not threading.main_thread():
        yield _Deadline(limit_bytes, armed=False)
        return
    deadline = _Deadline(limit_bytes, armed=True)

    def expire(signum: int, frame: object) -> None:
        raise _TooSlow(time.monotonic() - deadline.t0)

    previous = signal.signal(signal.SIGALRM, expire)
    theirs_s, theirs_every_s = signal.setitimer(signal.ITIMER_REAL, deadline.allowed_s(0))
    try:
        yield deadline
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if theirs_s > 0:
            left_s = theirs_s - (time.monotonic() - deadline.t0)
            signal.setitimer(signal.ITIMER_REAL, max(left_s, 1e-6), theirs_every_s)


def _bounded_progress(limit_bytes: int, disk: Path, deadline: _Deadline | None = None) -> type:
    """A progress-bar class for hf_hub_download that stops the transfer once more than `limit_bytes` came in
    (huggingface_hub reports every piece it writes to it), so a file served larger than declared is cut off, and
    once the disk holding `disk` has less than MIN_FREE_BYTES free; each piece moves the file's `deadline`."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bounded(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.received_bytes = self.resumed_bytes = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)
            if self.received_bytes > limit_bytes:
                raise _TooLarge(limit_bytes)

        def update(self, n: float | None = 1) -> bool | None:
            self.received_bytes += int(n or 0)
            if self.received_bytes > limit_bytes:
                raise _TooLarge(limit_bytes)
            if _free_bytes(disk) < MIN_FREE_BYTES:
                raise _DiskLow()
            if deadline is not None:  # this transfer's bytes: a partial file resumed came before its clock
                deadline.progress(self.received_bytes - self.resumed_bytes)
            return super().update(n)

    return Bounded


class _Hub:
    def __init__(self, repo_id: str, endpoint: str | None, token: str | bool | None, staging: Path):
        from huggingface_hub import constants

        self.repo_id, self.endpoint, self.staging = repo_id, endpoint, staging
        self.endpoint_url = (endpoint or constants.ENDPOINT).rstrip("/")
        self.token = _token_for(endpoint, token)

    def resolve(self, path: str, revision: str) -> str:
        """The commit `revision` points at (from the X-Repo-Commit header of a HEAD on `path`)."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(self.repo_id, path, repo_type="dataset", revision=revision, endpoint=self.endpoint)
        try:
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        except _network_errors() as e:
            raise DownloadError(
                f"cannot reach {path} in dataset repo {self.repo_id} at revision {revision!r} ({type(e).__name__}: {e}). "
                "HINT: check --repo / --revision, the network, or point HF_ENDPOINT / --endpoint at a mirror"
            ) from e
        if not meta.commit_hash:
            raise DownloadError(f"{url} gave no X-Repo-Commit header: is --endpoint a Hugging Face hub?")
        if not _COMMIT.match(meta.commit_hash):
            raise DownloadError(f"{url} gave X-Repo-Commit {meta.commit_hash!r}, not a commit: refused")
        return meta.commit_hash

    def fetch(self, path: str, commit: str, limit_bytes: int, *, declared_bytes: int | None = None) -> Path:
        """The file at `path` in the staging folder, fetched (or resumed); more than `limit_bytes` is refused, and
        so is a transfer slower than MIN_RATE_BYTES_PER_S or one that would leave the disk short of MIN_FREE_BYTES
        (checked first by `declared_bytes`, the size the hub manifest gives, then as the bytes come in)."""
        from huggingface_hub import hf_hub_download

        self.staging.mkdir(parents=True, exist_ok=True)
        free_bytes = _free_bytes(self.staging)
        if declared_bytes is not None and free_bytes - declared_bytes < MIN_FREE_BYTES:
            raise DownloadError(
                f"{path}: its {declared_bytes} bytes would leave less than {MIN_FREE_BYTES} bytes free on the disk "
                f"of {self.staging} ({free_bytes} free). HINT: free some space, or choose another --out"
            )
        try:
            with _deadline(limit_bytes) as deadline:
                local = Path(
                    hf_hub_download(
                        self.repo_id,
                        path,
                        repo_type="dataset",
                        revision=commit,
                        local_dir=self.staging,
                        endpoint=self.endpoint,
                        token=self.token,
                        tqdm_class=_bounded_progress(limit_bytes, self.staging, deadline),
                    )
                )
        except (_TooLarge, _TooSlow, _DiskLow) as e:
            for partial in self.staging.rglob(f"{Path(path).name}*.incomplete"):
                partial.unlink(missing_ok=True)
            if isinstance(e, _TooLarge):
                why = f"the hub sent more than the {limit_bytes} bytes it may hold"
                hint = "the hub or mirror is broken or hostile; use another --endpoint"
            elif isinstance(e, _TooSlow):
                why = (
                    f"not received within {float(e.args[0]):.0f} s (after {FILE_GRACE_S:.0f} s it must come at "
                    f"{MIN_RATE_BYTES_PER_S} bytes/s or more, and all of its at most {limit_bytes} bytes within "
                    f"{_file_deadline_s(limit_bytes):.0f} s)"
                )
                hint = "the hub or the network is too slow; rerun, or use another --endpoint"
            else:
                why = f"the disk of {self.staging} fell below {MIN_FREE_BYTES} bytes free"
                hint = "free some space, or choose another --out"
            raise DownloadError(f"{path}: {why}; refused and removed. HINT: {hint}") from None
        except _network_errors() as e:
            raise DownloadError(
                f"could not download {path} from {self.repo_id}@{commit[:12]} ({type(e).__name__}: {e}). "
                "HINT: rerun the same command to resume; files already verified are kept"
            ) from e
        if local.is_symlink() or not local.is_file():
            local.unlink(missing_ok=True)
            raise DownloadError(
                f"{path}: the staging folder held a link or special file there; removed, rerun"
            )
        return local


# ---- Checking ----


def _check_file(local: Path, f: RemoteFile, vocab_size: int | None, bos_id: int) -> dict[str, Any]:
    """Size, shard header, token range and sha256 of a fetched file; raises DownloadError naming it."""
    size = local.stat().st_size
    if f.size_bytes is not None and size != f.size_bytes:
        raise DownloadError(
            f"{f.path}: {size} bytes but the hub manifest says {f.size_bytes}; refused and removed"
        )
    record: dict[str, Any] = {"bytes": size}
    if f.kind == "tokenizer" and f.name.endswith(".model"):
        try:
            load_tokenizer(local)
        except ValueError as e:
            raise DownloadError(f"{f.path}: not a usable tokenizer ({e}); refused and removed") from e
    if f.kind in ("val", "train"):
        try:
            record["tokens"] = read_header(local)
        except ShardError as e:
            raise DownloadError(
                f"{f.path}: not a valid shard ({str(e).split(' HINT')[0]}); refused and removed"
            ) from e
        tokens = read_shard(local)
        top = docs = 0
        for i in range(0, tokens.size, SCAN_TOKENS):
            piece = np.asarray(tokens[i : i + SCAN_TOKENS])
            top = max(top, int(piece.max()))
            docs += int(np.count_nonzero(piece == bos_id))
        if vocab_size is not None and top >= vocab_size:
            raise DownloadError(
                f"{f.path}: token id {top} >= vocabulary {vocab_size}: corrupt; refused and removed"
            )
        record["docs"] = docs
    digest = sha256_file(local)
    if f.sha256 is not None and digest != f.sha256:
        raise DownloadError(
            f"{f.path}: sha256 {digest} but the hub manifest says {f.sha256}: corrupt download, refused and removed. "
            "HINT: rerun to fetch it again"
        )
    if f.official_sha256 is not None and digest != f.official_sha256:
        raise DownloadError(
            f"{f.path}: sha256 {digest}, not the official {OFFICIAL_TOKENIZERS[f.official_sha256]} tokenizer "
            f"({f.official_sha256}); refused and removed. HINT: the hub or mirror serves another tokenizer"
        )
    record["sha256"] = digest
    return record


def _tokenizer_entry(dest: Path, plan: VariantPlan) -> dict[str, Any]:
    """Our manifest's tokenizer entry; for byte260, check the reference's JSON and write our marker file."""
    names = [f.name for f in plan.files if f.kind == "tokenizer"]
    model = next((n for n in names if n.endswith(".model")), None)
    if model is not None:
        tok = load_tokenizer(dest / model)
        path = dest / model
    else:
        js = next((n for n in names if n.endswith(".json")), None)
        if js is None:
            raise DownloadError(f"{plan.dataset_name}: no .model or .json tokenizer among {names}")
        cfg = read_json(dest / js, what="byte tokenizer file")
        expect = {
            "pad_id": 0,
            "bos_id": 1,
            "eos_id": 2,
            "unk_id": 3,
            "byte_offset": BYTE260_OFFSET,
            "byte_count": 256,
        }
        cfg = cfg if isinstance(cfg, dict) else {}
        config = cfg.get("config") or {}
        got = {k: config.get(k, v) for k, v in expect.items()} if isinstance(config, dict) else config
        if cfg.get("tokenizer_type") != "pure_byte" or got != expect:
            raise DownloadError(f"{js}: not the byte260 layout this harness reads ({got}); expected {expect}")
        path = dest / BYTE260_FILENAME
        write_byte260(path)
        tok = load_tokenizer(path)
        assert tok.vocab_size == BYTE260_VOCAB_SIZE
    return {
        "file": path.name,
        "kind": tok.kind,
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "sha256": sha256_file(path),
        "trained_here": False,
    }


# ---- The download ----


def _load_state(dest: Path, repo_id: str, commit: str, endpoint: str) -> dict[str, Any]:
    """What a previous run verified. Files another endpoint served are fetched again: a mirror can claim the
    official commit, and without sha256s in the hub manifest the checks alone cannot tell its files apart."""
    path = dest / STATE_NAME
    fresh = {
        "format": STATE_FORMAT,
        "format_version": STATE_VERSION,
        "repo_id": repo_id,
        "commit": commit,
        "endpoint": endpoint,
        "files": {},
    }
    if not path.is_file():
        return fresh
    state = read_json(path, what="download state")
    if (
        not isinstance(state, dict)
        or state.get("format") != STATE_FORMAT
        or state.get("format_version") != STATE_VERSION
        or not isinstance(state.get("files"), dict)
        or state.get("endpoint") != endpoint
    ):
        return fresh
    if state["files"] and (state.get("repo_id"), state.get("commit")) != (repo_id, commit):
        raise ValueError(
            f"{dest} holds files from {state.get('repo_id')}@{state.get('commit')}, but this download resolves to "
            f"{repo_id}@{commit}; mixing commits would give an inconsistent dataset. "
            f"HINT: pass --revision {state.get('commit')} to finish that download, or a new --out"
        )
    return state


def _limit_bytes(f: RemoteFile) -> int:
    """The most bytes taken for `f`: its declared size, else what a file of its kind may hold."""
    cap = MAX_TOKENIZER_BYTES if f.kind == "tokenizer" else MAX_SHARD_BYTES
    return cap if f.size_bytes is None else min(cap, f.size_bytes)


def default_destination(variant: str) -> Path:
    from data.manifest import data_root

    return data_root() / dataset_name_for(variant)


def download_variant(
    variant: str = "sp1024",
    dest: str | os.PathLike[str] | None = None,
    *,
    train_shards: int | None = None,
    repo_id: str = DEFAULT_REPO_ID,
    revision: str = "main",
    endpoint: str | None = None,
    token: str | bool | None = None,
    prefix: str = REMOTE_PREFIX,
) -> Path:
    """Fetch one variant of the cached export into `dest` and write its manifest; returns `dest`.

    `train_shards` None means the first min(80, available) training shards, as the reference does.
    """
    dataset_name_for(variant)
    dest = Path(dest) if dest is not None else default_destination(variant)
    dest.mkdir(parents=True, exist_ok=True)
    ours = (
        read_json(dest / MANIFEST_NAME) if (dest / MANIFEST_NAME).is_file() else {"source": {"kind": "hub"}}
    )
    if (
        not isinstance(ours, dict)
        or not isinstance(ours.get("source"), dict)
        or ours["source"].get("kind") != "hub"
    ):
        raise FileExistsError(
            f"{dest} holds a dataset that was not downloaded from the hub; HINT: choose another --out"
        )
    # hf_hub_download returns a staged file its metadata says is of this commit without asking the hub, and
    # resumes a partial one: what an earlier run (another endpoint) or someone else left there is not reused
    if (dest / STAGING_NAME).is_symlink():
        (dest / STAGING_NAME).unlink()
    shutil.rmtree(dest / STAGING_NAME, ignore_errors=True)
    hub = _Hub(repo_id, endpoint, token, dest / STAGING_NAME)
    manifest_path = f"{prefix}/{HUB_MANIFEST_NAME}"
    commit = hub.resolve(manifest_path, revision)
    where = f"{repo_id}@{revision} {manifest_path}"
    hub_manifest = hub.fetch(manifest_path, commit, MAX_HUB_MANIFEST_BYTES)
    raw = read_json(hub_manifest, what=f"hub manifest {manifest_path}")
    plan = parse_hub_manifest(raw, variant=variant, train_shards=train_shards, prefix=prefix, where=where)
    state = _load_state(dest, repo_id, commit, hub.endpoint_url)
    write_bytes_atomic(dest / HUB_MANIFEST_COPY, hub_manifest.read_bytes())

    vocab_size: int | None = None  # known once the tokenizer (fetched first) is in place
    bos_id = 1
    fetched = kept = 0
    with tqdm(plan.files, desc=f"download {variant}", unit="file", disable=None) as bar:
        for f in bar:
            final = dest / f.name
            # A file a previous run verified is checked again against this hub manifest (the state file and
            # the folder are not proof): kept when it passes, fetched again when not.
            record = None
            if state["files"].get(f.name) and final.is_file() and not final.is_symlink():
                try:
                    record = _check_file(final, f, vocab_size, bos_id)
                    kept += 1
                except DownloadError:
                    record = None
            if record is None:
                state["files"].pop(f.name, None)
                local = hub.fetch(f.path, commit, _limit_bytes(f), declared_bytes=f.size_bytes)
                try:
                    record = _check_file(local, f, vocab_size, bos_id)
                except DownloadError:
                    local.unlink(missing_ok=True)
                    raise
                os.replace(local, final)
                fetched += 1
            state["files"][f.name] = record
            write_json_atomic(dest / STATE_NAME, state)
            if f.kind == "tokenizer" and f.name.endswith(".model"):
                tok = load_tokenizer(final)
                vocab_size, bos_id = tok.vocab_size, tok.bos_id
            elif f.kind == "tokenizer" and f.name.endswith(".json"):
                vocab_size, bos_id = BYTE260_VOCAB_SIZE, 1

    tokenizer = _tokenizer_entry(dest, plan)
    write_manifest(dest, _our_manifest(dest, plan, state, tokenizer, repo_id, revision, commit, prefix))
    shutil.rmtree(dest / STAGING_NAME, ignore_errors=True)
    print(f"{dest}: {fetched} file(s) downloaded, {kept} already present and verified; manifest written")
    return dest


def _our_manifest(
    dest: Path,
    plan: VariantPlan,
    state: dict[str, Any],
    tokenizer: dict[str, Any],
    repo_id: str,
    revision: str,
    commit: str,
    prefix: str,
) -> dict[str, Any]:
    # Every verified training shard present from index 0 on (a rerun with a smaller --train-shards
    # keeps what is there; the loader picks its first N with train_shard_paths).
    val = [shard_name("val", i) for i in range(plan.files_val)]
    train = []
    i = 0
    while shard_name("train", i) in state["files"] and (dest / shard_name("train", i)).is_file():
        train.append(shard_name("train", i))
        i += 1
    counts = np.zeros(tokenizer["vocab_size"], dtype=np.int64)
    shards = []
    for split, names in (("val", val), ("train", train)):
        for n in names:
            rec = state["files"][n]
            shards.append(
                {
                    "name": n,
                    "split": split,
                    "tokens": rec["tokens"],
                    "docs": rec["docs"],
                    "bytes": rec["bytes"],
                    "sha256": rec["sha256"],
                }
            )
            if split == "train":
                tokens = read_shard(dest / n)
                for i in range(0, tokens.size, SCAN_TOKENS):
                    counts += np.bincount(np.asarray(tokens[i : i + SCAN_TOKENS]), minlength=counts.size)[
                        : counts.size
                    ]
    return {
        "tokenizer": tokenizer,
        "docs": {s: sum(e["docs"] for e in shards if e["split"] == s) for s in ("val", "train")},
        "tokens": {s: sum(e["tokens"] for e in shards if e["split"] == s) for s in ("val", "train")},
        "selection_sha256": None,
        "source": {
            "kind": "hub",
            "repo_id": repo_id,
            "revision": revision,
            "commit": commit,
            "prefix": prefix,
            "variant": plan.variant,
            "dataset": plan.dataset_name,
            "tokenizer_name": plan.tokenizer_name,
            "train_shards": len(train),
            "train_shards_available": plan.files_train,
            "val_shards": plan.files_val,
            "hub_manifest_sha256": sha256_file(dest / HUB_MANIFEST_COPY),
            "docs_sha256": plan.docs_sha256,
        },
        "shards": shards,
        "train_unigram_counts": counts.tolist(),
    }
