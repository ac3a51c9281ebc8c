"""Config: TOML presets in the submission folder, `--set section.key=value` overrides, and the track.

A submission's `config.toml` has top-level tables that are the defaults, and a `[presets.NAME]`
table per preset holding dotted overrides:

    [model]                 # given to build_model(config)      (owned by the submission)
    num_layers = 9
    [train]                 # given to train(ctx) as ctx.hparams (owned by the submission)
    matrix_lr = 0.04
    [budget]                # harness tables, each validated by its component's dataclass:
    train_s = 600.0         #   run, budget, launch, data, eval, pack, log
    [presets.cpu-smoke]
    model.num_layers = 2
    run.track = "smoke"

Every key a preset or an override sets must already exist in the defaults (or, for harness tables,
be a field of the component's dataclass), with the same type (an int is accepted for a float).

Who sets what (the track wins; `load_config` applies it, in this order):
    1. the file (defaults, then the preset): [model], [train] and the harness keys of SUBMISSION_KEYS;
    2. `--set` (the official running it): any key;
    3. the track (run.track, scoring/tracks.py): every key of TRACK_KEYS not set above takes the
       track's value, and budget.train_s defaults to the track's budget. On a record track the file may
       not set a track key at all, `--set` may only tighten one, and budget.train_s may not exceed the
       track's; on an unranked track both may loosen them, and each loosened rule is recorded
       (ResolvedConfig.loosened, in the run's config.json). An untimed budget (inf) needs an untimed track.
Every value is checked here, before any process starts; a bad one is refused in one line naming the
file or the `--set`, the key, the value and what is allowed.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime as dt
import math
import os
import re
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.api import CODEC_FILE, CONFIG_FILE
from harness.submission import check_submission
from harness.train.budget import BudgetConfig
from harness.train.gptq_config import GptqConfig, integer_codec
from isolation.sandbox import parse_layers
from scoring.artifact.codec_names import BUILTIN_NAMES, CODEC_GRAMMAR, check_codec_spec
from scoring.errors import ConfigError, close_match, did_you_mean
from scoring.score.eval_config import EVAL_DTYPES, EVAL_MODES, EvalConfig
from scoring.tracks import TRACKS, Track

SUBMISSION_SECTIONS = ("model", "train")
SUBMISSION_CODEC = "submission"
"""pack.codec value that selects the folder's own codec.py."""
CONFIG_FORMAT = "pg-config"
CONFIG_FORMAT_VERSION = 1


DEVICES = ("auto", "cpu", "cuda")
"""launch.device's values."""
WANDB_MODES = ("disabled", "offline", "online")
"""log.wandb's values (harness/run/tracking.py)."""
WANDB_NAME_MAX_CHARS = 128
"""The longest log.project and log.run_name wandb takes (a longer one fails wandb.init: the run goes untracked)."""
_WANDB_PROJECT = re.compile(r"[A-Za-z0-9_.\- ]{1,128}")
_WANDB_RUN_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]{0,128}")


# ---- The sections of their components: the launcher (harness/run/launch.py) and tracking ----
# Here, not beside them, so that the config imports nothing of the orchestrator that reads it.


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchConfig:
    nproc_per_node: int = 1
    """Ranks per node (GPUs per node on CUDA; one GPU per rank)."""
    nnodes: int = 1
    rdzv_endpoint: str = ""
    """host:port of torchrun's c10d rendezvous for several nodes; empty: one standalone node."""
    rdzv_id: str = "pgolf"
    """The job's id at the rendezvous: the same on every node."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    threads: int = 0
    """torch intra-op threads per rank; 0: the machine's cores divided among its ranks."""
    sandbox: str = "auto"
    """auto: every isolation layer the machine offers (recorded); required: refuse to train without Landlock; off."""
    network: str = "auto"
    """auto: on one node and as root, a network namespace with loopback only; host: the machine's network."""
    sandbox_read_paths: str = ""
    """Extra folders training may read (os.pathsep-separated), e.g. a GPU driver's libraries outside /usr and /opt."""
    memory_limit_bytes: int = -1
    """Command line only. On CPU, each process of the train phase (every rank) gets this address-space limit
    (RLIMIT_AS): -1, three quarters of the machine's memory divided among the node's ranks; 0, none.
    An allocation past it fails in the rank and the run ends `out_of_memory` instead of taking the machine.
    On CUDA none (CUDA reserves more virtual memory than any such limit)."""
    allow_missing_layers: str = ""
    """An official's decision, command line only (`--allow-missing-layer NAME`): comma-separated isolation
    layers (isolation.sandbox.KERNEL_LAYERS) a "required" sandbox may run without on this machine; recorded."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"launch.device must be one of {DEVICES}, got {self.device!r}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(
                f"launch.nproc_per_node and launch.nnodes must be >= 1, got {self.nproc_per_node}, {self.nnodes}"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(
                "launch.nnodes > 1 needs launch.rdzv_endpoint = 'HOST:PORT' (the same on every node)"
            )
        if self.rdzv_endpoint and ":" not in self.rdzv_endpoint:
            raise ValueError(f"launch.rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")
        if self.threads < 0:
            raise ValueError(f"launch.threads must be >= 0, got {self.threads}")
        if self.sandbox not in ("auto", "off", "required"):
            raise ValueError(f"launch.sandbox must be 'auto', 'required' or 'off', got {self.sandbox!r}")
        if self.network not in ("auto", "host"):
            raise ValueError(f"launch.network must be 'auto' or 'host', got {self.network!r}")
        parse_layers(self.allow_missing_layers)
        if self.memory_limit_bytes < -1:
            raise ValueError(
                f"launch.memory_limit_bytes must be -1 (auto), 0 (none) or a byte count, got {self.memory_limit_bytes}"
            )

    def resolved_device(self) -> str:
        import torch  # here, not at the top: the config loads without torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "launch.device = 'cuda' but this machine has no CUDA device. "
                "HINT: use a CPU preset (--preset cpu-smoke) or --set launch.device='cpu'"
            )
        if self.device == "cuda" and self.nproc_per_node > torch.cuda.device_count():
            raise ValueError(
                f"launch.nproc_per_node = {self.nproc_per_node} but this node has {torch.cuda.device_count()} GPU(s). "
                f"HINT: --nproc {torch.cuda.device_count()} (gradient accumulation keeps the global batch)"
            )
        return self.device

    def memory_limit_per_process_bytes(self, device: str) -> int:
        """The RLIMIT_AS each process of the train phase gets on `device` (0: none)."""
        if device != "cpu" or self.memory_limit_bytes == 0:
            return 0
        if self.memory_limit_bytes > 0:
            return self.memory_limit_bytes
        from scoring.worker.child import default_memory_limit_bytes  # the model worker's: 3/4 of the machine

        return default_memory_limit_bytes() // self.nproc_per_node

    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.nproc_per_node)


@dataclass(frozen=True, kw_only=True, slots=True)
class LogConfig:
    """The [log] table: where a run's numbers are tracked. The runner's setting, never a track rule."""

    wandb: str = "disabled"
    """disabled, offline (RUN_DIR/wandb, upload later with `wandb sync`) or online."""
    project: str = "pgolf"
    """wandb project."""
    entity: str = ""
    """wandb entity (team or user); empty: the API key's default."""
    run_name: str = ""
    """wandb run name; empty: the run folder's name."""
    init_timeout_s: float = 20.0
    """Longest wait for wandb.init; past it the run goes on untracked."""

    def __post_init__(self) -> None:
        if self.wandb not in WANDB_MODES:
            raise ValueError(f"log.wandb = {self.wandb!r} is not a mode; allowed: {', '.join(WANDB_MODES)}")
        if not self.project.strip():
            raise ValueError("log.project = '' must name a wandb project, e.g. log.project='pgolf'")
        # a name wandb refuses fails wandb.init (the official's run goes untracked); an escape reaches the terminal
        if not _WANDB_PROJECT.fullmatch(self.project):
            raise ValueError(
                f"log.project = {self.project[:WANDB_NAME_MAX_CHARS]!r} must be 1 to {WANDB_NAME_MAX_CHARS} "
                "letters, digits, spaces or '_.-', e.g. log.project='pgolf'"
            )
        if not _WANDB_RUN_NAME.fullmatch(self.run_name):
            raise ValueError(
                f"log.run_name = {self.run_name[:WANDB_NAME_MAX_CHARS]!r} must be at most "
                f"{WANDB_NAME_MAX_CHARS} characters and no control characters, e.g. log.run_name='seed-1'"
            )
        if not (0 < self.init_timeout_s <= 300):
            raise ValueError(f"log.init_timeout_s = {self.init_timeout_s} must be in (0, 300] seconds")


SEED_MAX = 2**32 - 1
"""The largest run.seed: numpy's RNG, seeded with it on every rank (harness/train/rank.py), takes 32 bits."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSection:
    track: str = "10min_16mb"
    """Track name (scoring/tracks.py): the rules the run is held to (budgets, cap, data, sandbox)."""
    seed: int = 1337
    """Seed of the submission's RNGs (torch, numpy, random) on every rank."""

    def __post_init__(self) -> None:
        if self.track not in TRACKS:
            raise ConfigError(
                f"run.track = {self.track!r} is not a track{did_you_mean(self.track, TRACKS)}; tracks: {', '.join(TRACKS)}"
            )
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(
                f"run.seed = {self.seed} must be in [0, {SEED_MAX}] (every rank seeds numpy with it, which takes 32 bits)"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    train_shards: int = 0
    """Use the first N training shards (0: all). Recorded: the order of training data depends on it."""

    def __post_init__(self) -> None:
        if self.train_shards < 0:
            raise ConfigError(f"data.train_shards = {self.train_shards} must be >= 0 (0: every shard)")


def mirrored(source: type, prefix: str = "") -> Callable[[type], type]:
    """A class decorator under @dataclass: `source`'s dataclass fields, named `prefix` + name, with its types
    and defaults, after the class's own (a config section that is another module's config, flat for TOML,
    said once). A `T | None` field of `source` is a T here whose default None is 0: TOML has no null, and
    0 says "none" (the section's `to_...` method maps it back)."""

    def wrap(cls: type) -> type:
        hints = typing.get_type_hints(source)
        for f in dataclasses.fields(source):
            hint, default = hints[f.name], f.default
            if type(None) in typing.get_args(hint):
                (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
                default = 0 if default is None else default
            cls.__annotations__[prefix + f.name] = hint
            setattr(cls, prefix + f.name, default)
        return cls

    return wrap


def unmirrored(section: Any, source: type, prefix: str = "") -> dict[str, Any]:
    """A mirrored section's values as `source`'s keyword arguments (a 0 of a `T | None` field: None)."""
    hints = typing.get_type_hints(source)
    values = {f.name: getattr(section, prefix + f.name) for f in dataclasses.fields(source)}
    return {k: (v or None) if type(None) in typing.get_args(hints[k]) else v for k, v in values.items()}


GPTQ_PREFIX = "gptq_"


@dataclass(frozen=True, kw_only=True, slots=True)
@mirrored(GptqConfig, GPTQ_PREFIX)
class PackConfig:
    """[pack]: the codec, and GptqConfig's keys as gptq_batches, gptq_batch_tokens, gptq_seq_len,
    gptq_reserve_s and gptq_block_size (harness/train/gptq.py has their defaults and meaning)."""

    codec: str = "int8_zlib"
    """A built-in codec spec (scoring/artifact/codecs: int8_zlib, QUANT_COMPRESSOR[_shuffle], or a mixed_*
    codec with its role table, e.g. "mixed_brotli11_shuffle:mlp=int5,attention=int6"), or "submission"
    for the folder's codec.py. The role table is checked here: an unknown role or scheme is refused."""

    def gptq(self) -> GptqConfig:
        return GptqConfig(**unmirrored(self, GptqConfig, GPTQ_PREFIX))

    def __post_init__(self) -> None:
        self._check_codec()
        gptq = self.gptq()  # GptqConfig checks its own values
        if gptq.enabled:
            try:
                integer_codec(self.codec)
            except ValueError as e:
                raise ConfigError(f"pack.gptq_batches = {gptq.batches}: {e}") from e

    def _check_codec(self) -> None:
        if self.codec == SUBMISSION_CODEC or self.codec in BUILTIN_NAMES:
            return
        if ":" in self.codec and self.codec.partition(":")[0] in BUILTIN_NAMES:
            try:
                check_codec_spec(self.codec)
            except ValueError as e:
                raise ConfigError(f"pack.codec = {self.codec!r}: {e}") from e
            return
        raise ConfigError(
            f"pack.codec = {self.codec!r} is not a codec; allowed: int8_zlib, {SUBMISSION_CODEC}, or {CODEC_GRAMMAR}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
@mirrored(EvalConfig)
class EvalSection:
    """[eval]: scoring/score/evaluate.py's EvalConfig, its keys and defaults, with 0 for its None: max_tokens
    and max_docs 0 score the full split (the track's, Track.eval_max_tokens / eval_max_docs, is applied), stride
    0 is the mode's default.
    The checks here name the key; EvalConfig's own run after them."""

    def __post_init__(self) -> None:
        v: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        mode, seq_len, max_tokens, stride = v["mode"], v["seq_len"], v["max_tokens"], v["stride"]
        if mode not in EVAL_MODES:
            raise ConfigError(f"eval.mode = {mode!r} is not a mode; allowed: {', '.join(EVAL_MODES)}")
        if v["dtype"] not in EVAL_DTYPES:
            raise ConfigError(
                f"eval.dtype = {v['dtype']!r} is not allowed; allowed: {', '.join(EVAL_DTYPES)}"
            )
        for name in ("seq_len", "batch_seqs", "adapt_chunk_tokens"):
            if v[name] <= 0:
                raise ConfigError(f"eval.{name} = {v[name]} must be positive")
        if max_tokens < 0 or 0 < max_tokens <= seq_len:
            raise ConfigError(
                f"eval.max_tokens = {max_tokens} must be 0 (the full split) or more than eval.seq_len ({seq_len})"
            )
        if v["max_docs"] < 0 or (v["max_docs"] and max_tokens):
            raise ConfigError(
                f"eval.max_docs = {v['max_docs']} with eval.max_tokens = {max_tokens}: give at most one subset, "
                "max_docs >= 0 (0: the full split)"
            )
        if stride and mode == "standard":
            raise ConfigError(
                f"eval.stride = {stride} applies to the sliding and documents modes only; set eval.mode or drop eval.stride"
            )
        if not 0 <= stride <= seq_len:
            raise ConfigError(
                f"eval.stride = {stride} must be in [0, eval.seq_len = {seq_len}] (0: the mode's default)"
            )
        self.to_eval_config(None)  # the scorer's own checks, now rather than after training

    def to_eval_config(self, track: Track | None) -> EvalConfig:
        """The scorer's config, with the track's subset where this one names none."""
        values = unmirrored(self, EvalConfig)
        if track is not None and not values["max_tokens"] and not values["max_docs"]:
            values.update(max_tokens=track.eval_max_tokens, max_docs=track.eval_max_docs)
        return EvalConfig(**values)


HARNESS_SECTIONS: dict[str, type] = {
    "run": RunSection,
    "budget": BudgetConfig,
    "launch": LaunchConfig,
    "data": DataConfig,
    "eval": EvalSection,
    "pack": PackConfig,
    "log": LogConfig,
}

# The harness keys a submission's config.toml (its defaults and presets) may set, besides [model] and
# [train]: what the entry is and how it runs (its track, seed, training time up to the track's,
# parallelism, the data it reads, how it is windowed for scoring, its codec), never how strictly it is
# judged. Grace, startup and warm-up allowances, the scored subset and the sandbox are the track's
# (TRACK_KEYS); rendezvous settings are facts of the official's machines (OFFICIAL_KEYS).
SUBMISSION_KEYS: frozenset[str] = frozenset(
    {
        "run.track",
        "run.seed",
        "budget.train_s",  # at most the track's budget (a run may use less time, never more)
        "launch.nproc_per_node",
        "launch.nnodes",
        "launch.device",
        "launch.threads",
        "data.train_shards",
        "eval.mode",
        "eval.seq_len",
        "eval.batch_seqs",
        "eval.dtype",
        "eval.stride",
        "eval.adapt_chunk_tokens",
        "pack.codec",
        *(f"pack.{GPTQ_PREFIX}{f.name}" for f in dataclasses.fields(GptqConfig)),  # GPTQ on its own clock
        "log.project",  # how the run is named in tracking; never how it is judged
        "log.run_name",
    }
)

# The keys a track fixes, with the track's value in the config's terms. A record track's are
# applied whatever the file says (and the file may not say); an unranked track's may be loosened.
TRACK_KEYS: dict[str, Callable[[Track], Any]] = {
    "budget.grace_s": lambda t: t.grace_s,
    "budget.startup_s": lambda t: t.startup_s,
    "budget.warmup_max_s": lambda t: t.warmup_max_s,
    "eval.max_tokens": lambda t: t.eval_max_tokens or 0,
    "eval.max_docs": lambda t: t.eval_max_docs or 0,
    "launch.sandbox": lambda t: t.sandbox,
    "launch.network": lambda t: t.network,
    "launch.sandbox_read_paths": lambda t: "",  # no folder beyond the sandbox's own plan
}

# Facts of the machines a run is launched on: the official's (`--set`, --nnodes, --rdzv-endpoint).
OFFICIAL_KEYS: frozenset[str] = frozenset(
    {"launch.rdzv_endpoint", "launch.rdzv_id", "launch.allow_missing_layers", "launch.memory_limit_bytes"}
)
"""Command line only (a submission's files cannot set them): rendezvous facts, the training memory limit, and
the isolation layers an official accepts as missing on this machine (`--allow-missing-layer`, recorded in
config.json and the result)."""

TRACKING_KEYS: frozenset[str] = frozenset({"log.wandb", "log.entity", "log.init_timeout_s"})
"""The runner's too, command line only (`--wandb`, `--set`): whether a run is tracked, and in whose account."""
OFFICIAL_KEYS = OFFICIAL_KEYS | TRACKING_KEYS

SET_ORIGIN = "--set"
UNTIMED_TRACK = "non_record_16mb"
_SANDBOX_STRICTNESS = {"off": 0, "auto": 1, "required": 2}
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _looser(key: str, value: Any, track_value: Any) -> bool:
    """Whether `value` judges the run less strictly than the track's value for `key`."""
    if key == "launch.sandbox":
        return _SANDBOX_STRICTNESS.get(value, 0) < _SANDBOX_STRICTNESS[track_value]
    if key == "launch.network":
        return value == "host" and track_value != "host"
    if key == "launch.sandbox_read_paths":
        return value != track_value
    if key in ("eval.max_tokens", "eval.max_docs"):
        return value != track_value  # another subset is another score
    return value > track_value  # seconds: more time is looser


def _to_record(value: Any) -> Any:
    """JSON-ready: a non-finite float becomes the string "inf", "-inf" or "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _from_record(section: str, table: dict[str, Any]) -> dict[str, Any]:
    """A harness table as recorded -> its values (the strings of non-finite floats read back)."""
    floats = {f.name for f in dataclasses.fields(HARNESS_SECTIONS[section]) if isinstance(f.default, float)}
    return {
        k: _NONFINITE[v] if k in floats and isinstance(v, str) and v in _NONFINITE else v
        for k, v in table.items()
    }


@dataclass(frozen=True)
class ResolvedConfig:
    preset: str | None
    tables: dict[str, dict[str, Any]]
    """Every table after the file, the preset, the overrides and the track, as recorded: JSON-ready
    (a non-finite float of a harness table is the string "inf", "-inf" or "nan"; `section` reads it back)."""
    loosened: list[dict[str, Any]] = field(default_factory=list)
    """Track rules this run loosens (unranked tracks only): {"key", "value", "track_value", "origin"}."""

    def section(self, name: str) -> Any:
        return HARNESS_SECTIONS[name](**_from_record(name, self.tables[name]))

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.tables["model"])

    @property
    def train(self) -> dict[str, Any]:
        return dict(self.tables["train"])

    def record(self) -> dict[str, Any]:
        """What `pgolf run` writes as RUN_DIR/config.json (valid JSON; `from_record` reads it back)."""
        return {
            "format": CONFIG_FORMAT,
            "format_version": CONFIG_FORMAT_VERSION,
            "preset": self.preset,
            "tables": self.tables,
            "loosened": self.loosened,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ResolvedConfig:
        if record.get("format") != CONFIG_FORMAT or record.get("format_version") != CONFIG_FORMAT_VERSION:
            raise ConfigError(
                f"not a {CONFIG_FORMAT} v{CONFIG_FORMAT_VERSION} record: format {record.get('format')!r} "
                f"v{record.get('format_version')!r}"
            )
        return cls(record["preset"], record["tables"], list(record.get("loosened", [])))


def _type_ok(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, float):
        return isinstance(new, int | float)
    return type(old) is type(new)


class _Layers:
    """The tables being resolved, with where each key was last set (for errors and the loosened list)."""

    def __init__(self, tables: dict[str, dict[str, Any]]) -> None:
        self.tables = tables
        self.origins: dict[str, list[str]] = {}
        """key -> every origin that set it, in order."""

    def apply(self, key: str, value: Any, origin: str, *, from_file: bool) -> None:
        tables = self.tables
        section, _, name = key.partition(".")
        if not name or "." in name:
            raise ConfigError(
                f"{origin}: key {key!r} must be SECTION.KEY (sections: {', '.join(sorted(tables))})"
            )
        if section not in tables:
            raise ConfigError(
                f"{origin}: unknown section {section!r} in {key!r}{did_you_mean(section, tables)}; "
                f"sections are {', '.join(sorted(tables))}"
            )
        if name not in tables[section]:
            known = ", ".join(sorted(tables[section])) or "(none)"
            near = close_match(name, tables[section])  # a typo of a key of its section, else one of another's
            elsewhere = [f"{s}.{n}" for s, t in tables.items() if s != section for n in t]
            hint = f" (did you mean {section}.{near}?)" if near else did_you_mean(key, elsewhere)
            raise ConfigError(f"{origin}: unknown key {key!r}{hint}; keys of [{section}] are: {known}")
        old = tables[section][name]
        if not _type_ok(old, value):
            raise ConfigError(
                f"{origin}: {key} = {value!r} has type {type(value).__name__}, but the default {old!r} is {type(old).__name__}"
            )
        if from_file and section in HARNESS_SECTIONS and key not in SUBMISSION_KEYS and key not in TRACK_KEYS:
            raise ConfigError(
                f"{origin}: {key} is not a submission's to set (a fact of the machines the run is launched on); "
                f"pass it on the command line, e.g. --set {key}=..."
            )
        tables[section][name] = float(value) if isinstance(old, float) else value
        self.origins.setdefault(key, []).append(origin)

    def value(self, key: str) -> Any:
        section, _, name = key.partition(".")
        return self.tables[section][name]

    def last_origin(self, key: str, default: str) -> str:
        return self.origins.get(key, [default])[-1]

    def section_error(self, name: str, err: Exception, default: str) -> ConfigError:
        """A section's validation error, prefixed with the origin of the key it names."""
        msg = " ".join(str(err).split())  # one line
        keys = [k for k in self.origins if k.startswith(f"{name}.")]
        at = {k: m.start() for k in keys if (m := re.search(rf"(?<![\w.]){re.escape(k)}(?!\w)", msg))}
        named = sorted(at, key=at.__getitem__)  # the first key the message names
        origin = self.last_origin(named[0], default) if named else default
        if not named and keys:
            origin = ", ".join(dict.fromkeys(self.last_origin(k, default) for k in keys))
        return ConfigError(f"{origin}: {msg}")


MAX_TABLE_DEPTH = 32
"""The deepest nesting of tables and arrays a config.toml may hold: tomllib reads a dotted key or a table header
of any depth without recursing, and every walk of the tables after it (here, the records' JSON) recurses."""


def _nesting(value: Any) -> int:
    """How deeply tables and arrays nest in `value` (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def _flatten(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in table.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value`; value parsed as a Python literal (inf, -inf and nan as floats), else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected SECTION.KEY=VALUE, e.g. --set train.matrix_lr=0.02")
    raw = raw.strip()
    if raw.lower().lstrip("+") in _NONFINITE:
        return key.strip(), float(raw)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key.strip(), value


def _not_json(value: Any) -> bool:
    """Whether a TOML value holds what JSON has no type for: a date, a time or a date-time (tomllib's datetime)."""
    if isinstance(value, list | tuple):
        return any(_not_json(v) for v in value)
    if isinstance(value, dict):
        return any(_not_json(v) for v in value.values())
    return isinstance(value, dt.date | dt.time)  # a datetime is a date


def _nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    return False


def _apply_track(layers: _Layers, track: Track, path: Path) -> list[dict[str, Any]]:
    """Step 3 of the module docstring: the track's values, its refusals, and what was loosened."""
    loosened: list[dict[str, Any]] = []
    unranked = "an unranked track (--set run.track=smoke, or non_record_16mb)"

    def loosen(key: str, value: Any, track_value: Any, origin: str) -> None:
        loosened.append(
            {"key": key, "value": _to_record(value), "track_value": _to_record(track_value), "origin": origin}
        )

    for key, of_track in TRACK_KEYS.items():
        tv = of_track(track)
        if key not in layers.origins:
            section, _, name = key.partition(".")
            layers.tables[section][name] = tv
            continue
        value, origin = layers.value(key), layers.origins[key][-1]
        if track.record:
            in_file = next((o for o in layers.origins[key] if not o.startswith(SET_ORIGIN)), None)
            if in_file is not None:
                raise ConfigError(
                    f"{in_file}: {key} is set by the track {track.name}: {tv!r}; a submission on a record "
                    f"track cannot change how it is judged: remove {key} from the file"
                )
            if _looser(key, value, tv):
                raise ConfigError(
                    f"{origin}: {key} = {value!r} loosens a rule set by the track {track.name}: {tv!r}; "
                    f"a record track's rules are never loosened: run it on {unranked}"
                )
        elif _looser(key, value, tv):
            loosen(key, value, tv, origin)

    device = layers.value("launch.device")
    if track.device != "auto" and device != track.device:
        if device == "auto":  # "auto" would take a GPU where the machine has one
            layers.tables["launch"]["device"] = track.device
        elif track.record:
            origin = layers.last_origin("launch.device", str(path))
            raise ConfigError(
                f"{origin}: launch.device = {device!r} is not the hardware of the track {track.name} "
                f"({track.hardware}: launch.device = {track.device!r}); set launch.device = {track.device!r}, or "
                f"run it on {unranked}"
            )
    budget_s = track.train_budget_s
    if "budget.train_s" not in layers.origins:
        layers.tables["budget"]["train_s"] = budget_s
    else:
        value, origin = layers.value("budget.train_s"), layers.last_origin("budget.train_s", str(path))
        if value == math.inf and math.isfinite(budget_s):
            raise ConfigError(
                f"{origin}: budget.train_s = inf (untimed), but the track {track.name} is timed ({budget_s:g} s); "
                f"an untimed run belongs on the track {UNTIMED_TRACK} (--set run.track={UNTIMED_TRACK})"
            )
        if value > budget_s:
            if track.record:
                raise ConfigError(
                    f"{origin}: budget.train_s = {value:g} exceeds the training budget set by the track "
                    f"{track.name}: {budget_s:g} s (a run may use less, never more)"
                )
            loosen("budget.train_s", value, budget_s, origin)
    return loosened


def load_config(
    submission_dir: str | Path, preset: str | None = None, overrides: list[str] | None = None
) -> ResolvedConfig:
    """The folder's config.toml with `preset` and `overrides` applied, held to its track, every value checked."""
    path = Path(submission_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a submission keeps its presets in {CONFIG_FILE}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e
    except RecursionError:
        # tomllib recurses per nested array or inline table: the entrant's file, not our crash
        raise ConfigError(f"{path} is not valid TOML: nested too deeply") from None
    depth = _nesting(raw)
    if depth > MAX_TABLE_DEPTH:
        raise ConfigError(
            f"{path}: tables nested {depth} deep; a config holds at most {MAX_TABLE_DEPTH} levels of tables "
            "(a dotted key or a table header names one level per part)"
        )
    presets = raw.pop("presets", {})
    unknown = set(raw) - set(HARNESS_SECTIONS) - set(SUBMISSION_SECTIONS)
    if unknown:
        tables_allowed = [*HARNESS_SECTIONS, *SUBMISSION_SECTIONS, "presets"]
        hints = "".join(did_you_mean(u, tables_allowed) for u in sorted(unknown))
        raise ConfigError(
            f"{path}: unknown table(s) {sorted(unknown)}{hints}; allowed: {sorted(HARNESS_SECTIONS) + list(SUBMISSION_SECTIONS)} and [presets.NAME]"
        )
    for name, table in [*raw.items(), *((f"presets.{p}", t) for p, t in presets.items())]:
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name} must be a table ([{name}]), got {table!r}")
    tables: dict[str, dict[str, Any]] = {
        name: {f.name: f.default for f in dataclasses.fields(cls)} for name, cls in HARNESS_SECTIONS.items()
    }
    for name in SUBMISSION_SECTIONS:
        tables[name] = copy.deepcopy(raw.get(name, {}))
    layers = _Layers(tables)
    for name in HARNESS_SECTIONS:
        for key, value in _flatten(raw.get(name, {}), f"{name}."):
            layers.apply(key, value, str(path), from_file=True)
    if preset is not None:
        if preset not in presets:
            raise ConfigError(
                f"{path}: no preset {preset!r}{did_you_mean(preset, presets)}; "
                f"presets: {', '.join(sorted(presets)) or '(none)'}"
            )
        for key, value in _flatten(presets[preset]):
            layers.apply(key, value, f"{path} [presets.{preset}]", from_file=True)
    for text in overrides or []:
        key, value = parse_override(text)
        layers.apply(key, value, f"{SET_ORIGIN} {text}", from_file=False)
    for key, value in _flatten({n: tables[n] for n in SUBMISSION_SECTIONS}):
        if _nonfinite(value):
            origin = layers.last_origin(key, str(path))
            raise ConfigError(
                f"{origin}: {key} = {value!r}: [model] and [train] values must be finite (records are JSON)"
            )
        if _not_json(value):  # config.json could not be written: the run stopped before its result record
            origin = layers.last_origin(key, str(path))
            raise ConfigError(
                f"{origin}: {key} = {str(value)[:80]}: a TOML date or time has no JSON type (records are JSON); "
                'write it as a string, e.g. "1979-05-27"'
            )

    def validate(*names: str) -> None:
        for name in names:
            try:
                HARNESS_SECTIONS[name](**tables[name])  # validates in __post_init__
            except (TypeError, ValueError) as e:
                raise layers.section_error(name, e, str(path)) from e  # attributed to where it was said

    validate("run")
    track = TRACKS[tables["run"]["track"]]
    loosened = _apply_track(layers, track, path)  # the track's refusals first: they say what to remove
    validate(*HARNESS_SECTIONS)
    if tables["pack"]["codec"] == SUBMISSION_CODEC and not (Path(submission_dir) / CODEC_FILE).is_file():
        from scoring.artifact.codecs import CODEC_GRAMMAR

        origin = layers.last_origin("pack.codec", str(path))
        raise ConfigError(
            f"{origin}: pack.codec = {SUBMISSION_CODEC!r} needs {Path(submission_dir) / CODEC_FILE}, which is missing; "
            f"allowed: int8_zlib, {CODEC_GRAMMAR}, or add {CODEC_FILE}"
        )
    reserve_s = tables["pack"]["gptq_reserve_s"] if tables["pack"]["gptq_batches"] > 0 else 0.0
    if reserve_s >= tables["budget"]["train_s"]:
        origin = layers.last_origin("pack.gptq_reserve_s", str(path))
        raise ConfigError(
            f"{origin}: pack.gptq_reserve_s = {reserve_s:g} leaves no training time in budget.train_s = "
            f"{tables['budget']['train_s']:g}; make it smaller than the budget"
        )
    recorded = {
        name: {k: _to_record(v) for k, v in table.items()} if name in HARNESS_SECTIONS else table
        for name, table in tables.items()
    }
    return ResolvedConfig(preset, recorded, loosened)


def validate_run(
    submission_dir: str | Path,
    preset: str | None = None,
    overrides: list[str] | None = None,
    *,
    seed: int | None = None,
) -> tuple[dict[str, Any], ResolvedConfig]:
    """Everything `pgolf run` checks before any process starts: the folder and its submission.json,
    the config held to its track, and the data variant the submission declares against the track's.

    Returns (submission.json, the resolved config). Raises ConfigError (a ValueError, one line) on the first problem.
    """
    meta = check_submission(submission_dir)
    cfg = load_config(submission_dir, preset, overrides)
    if seed is not None:
        try:
            RunSection(track=cfg.tables["run"]["track"], seed=seed)
        except ValueError as e:
            raise ConfigError(f"--seed {seed}: {e}") from e
        cfg.tables["run"]["seed"] = seed
    return meta, cfg
