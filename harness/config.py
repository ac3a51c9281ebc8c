"""Config: TOML presets in the submission folder, plus `--set section.key=value` overrides.

A submission's `config.toml` has top-level tables that are the defaults, and a `[presets.NAME]`
table per preset holding dotted overrides:

    [model]                 # given to build_model(config)      (owned by the submission)
    num_layers = 9
    [train]                 # given to train(ctx) as ctx.hparams (owned by the submission)
    matrix_lr = 0.04
    [budget]                # harness tables, each validated by its component's dataclass:
    train_s = 600.0         #   run, budget, launch, data, eval, pack
    [presets.cpu-smoke]
    model.num_layers = 2
    budget.train_s = 60.0

Every key a preset or an override sets must already exist in the defaults (or, for harness tables,
be a field of the component's dataclass), with the same type (an int is accepted for a float).
Unknown keys and type mismatches are refused with the key, the value and what was expected.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.run.launch import LaunchConfig
from harness.train.clock import BudgetConfig
from scoring.score.evaluate import EvalConfig

CONFIG_FILE = "config.toml"
SUBMISSION_SECTIONS = ("model", "train")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSection:
    track: str = "10min_16mb"
    """Track name (scoring/tracks.py): fixes the cap and the largest budgets allowed."""
    seed: int = 1337


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    train_shards: int = 0
    """Use the first N training shards (0: all). Recorded: the order of training data depends on it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PackConfig:
    codec: str = "int8_zlib"
    """Built-in codec name, or "submission" for the folder's codec.py."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalSection:
    mode: str = "standard"
    seq_len: int = 1024
    batch_seqs: int = 32
    max_tokens: int = 0
    """0: the track's subset (None on GPU tracks: the full split)."""
    dtype: str = "float32"
    stride: int = 0
    """sliding/documents modes: targets per window after the first (0: the mode's default)."""
    adapt_chunk_tokens: int = 32_768
    """score-first adaptation (the submission's eval.py): targets scored before the hook sees them."""

    def to_eval_config(self, track_max_tokens: int | None) -> EvalConfig:
        return EvalConfig(
            mode=self.mode,
            seq_len=self.seq_len,
            batch_seqs=self.batch_seqs,
            max_tokens=self.max_tokens or track_max_tokens,
            dtype=self.dtype,
            stride=self.stride or None,
            adapt_chunk_tokens=self.adapt_chunk_tokens,
        )


HARNESS_SECTIONS: dict[str, type] = {
    "run": RunSection,
    "budget": BudgetConfig,
    "launch": LaunchConfig,
    "data": DataConfig,
    "eval": EvalSection,
    "pack": PackConfig,
}


@dataclass(frozen=True)
class ResolvedConfig:
    preset: str | None
    tables: dict[str, dict[str, Any]]
    """Every table after preset and overrides (what is logged and recorded)."""

    def section(self, name: str) -> Any:
        return HARNESS_SECTIONS[name](**self.tables[name])

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.tables["model"])

    @property
    def train(self) -> dict[str, Any]:
        return dict(self.tables["train"])


def _type_ok(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, float):
        return isinstance(new, int | float)
    return type(old) is type(new)


def _apply(tables: dict[str, dict[str, Any]], key: str, value: Any, origin: str) -> None:
    section, _, name = key.partition(".")
    if not name or "." in name:
        raise ValueError(f"{origin}: key {key!r} must be SECTION.KEY (sections: {', '.join(sorted(tables))})")
    if section not in tables:
        raise ValueError(
            f"{origin}: unknown section {section!r} in {key!r}; sections are {', '.join(sorted(tables))}"
        )
    if name not in tables[section]:
        known = ", ".join(sorted(tables[section])) or "(none)"
        raise ValueError(f"{origin}: unknown key {key!r}; keys of [{section}] are: {known}")
    old = tables[section][name]
    if not _type_ok(old, value):
        raise ValueError(
            f"{origin}: {key} = {value!r} has type {type(value).__name__}, but the default {old!r} is {type(old).__name__}"
        )
    tables[section][name] = float(value) if isinstance(old, float) else value


def _flatten(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in table.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value`; value parsed as a Python literal, else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {text!r}: expected SECTION.KEY=VALUE, e.g. --set train.matrix_lr=0.02")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    return key.strip(), value


def load_config(
    submission_dir: str | Path, preset: str | None = None, overrides: list[str] | None = None
) -> ResolvedConfig:
    path = Path(submission_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a submission keeps its presets in {CONFIG_FILE}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path} is not valid TOML: {e}") from e
    presets = raw.pop("presets", {})
    unknown = set(raw) - set(HARNESS_SECTIONS) - set(SUBMISSION_SECTIONS)
    if unknown:
        raise ValueError(
            f"{path}: unknown table(s) {sorted(unknown)}; allowed: {sorted(HARNESS_SECTIONS) + list(SUBMISSION_SECTIONS)} and [presets.NAME]"
        )
    tables: dict[str, dict[str, Any]] = {}
    for name, cls in HARNESS_SECTIONS.items():
        tables[name] = {f.name: f.default for f in dataclasses.fields(cls)}
        for key, value in raw.get(name, {}).items():
            _apply(tables, f"{name}.{key}", value, str(path))
    for name in SUBMISSION_SECTIONS:
        tables[name] = copy.deepcopy(raw.get(name, {}))
    if preset is not None:
        if preset not in presets:
            raise ValueError(
                f"{path}: no preset {preset!r}; presets: {', '.join(sorted(presets)) or '(none)'}"
            )
        for key, value in _flatten(presets[preset]):
            _apply(tables, key, value, f"{path} [presets.{preset}]")
    for text in overrides or []:
        key, value = parse_override(text)
        _apply(tables, key, value, f"--set {text}")
    resolved = ResolvedConfig(preset, tables)
    for name in HARNESS_SECTIONS:
        try:
            resolved.section(name)  # validates in __post_init__
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path} [{name}] (preset {preset}): {e}") from e
    return resolved


def list_presets(submission_dir: str | Path) -> list[str]:
    raw = tomllib.loads((Path(submission_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
    return sorted(raw.get("presets", {}))
