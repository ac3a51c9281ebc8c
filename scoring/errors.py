"""The domain errors: what a user's input got wrong, as a small hierarchy the command lines map to exit codes.

    PgolfError          bad input: a config, a dataset, a submission folder, an artifact (exit 2)
      ConfigError       a config.toml, a preset, a `--set`, a track name
      DataError         a dataset folder, a manifest, a shard the scorer reads
      SubmissionError   a submission folder (its files, its code, its layout)
      ArtifactError     an artifact file (its format, its codec, its bytes)

Each prints as one line naming the input, what was wrong and how to fix it (`error: ...`), and the process
exits with the class's `exit_code`. PgolfError is a ValueError, so the callers that caught a ValueError
before these existed still catch every one. A programming error (TypeError, KeyError, AttributeError,
...) is none of these: the command lines let it through with its traceback.

A leaf like scoring/statuses.py: it imports nothing of the project, so the scorer and the orchestrator both
import it (harness/train/ and data/ may not, by the layer table; their errors are plain ValueErrors, which the
command lines still treat as bad input). `did_you_mean` words the hint after an unknown name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

USER_EXIT_CODE = 2
"""The exit status of every user error (docs/ARCHITECTURE.md: one line, exit status 2)."""


class PgolfError(ValueError):
    """Bad input, said in one line that names the input and the fix."""

    exit_code: int = USER_EXIT_CODE


class ConfigError(PgolfError):
    """A config.toml table or key, a preset, a `--set` override or a track the config names."""


class DataError(PgolfError):
    """A dataset the harness or the scorer reads."""


class SubmissionError(PgolfError):
    """A submission folder: its files, its layout, its code."""


class ArtifactError(PgolfError):
    """An artifact file: not one, truncated, or failing its own checks."""


def exit_code_of(exc: BaseException) -> int | None:
    """The exit status of a user error (a PgolfError's own, USER_EXIT_CODE for the plain ValueError and the
    missing or existing file the command lines treat as bad input); None for anything else: a bug."""
    if isinstance(exc, PgolfError):
        return exc.exit_code
    if isinstance(exc, ValueError | FileNotFoundError | FileExistsError):
        return USER_EXIT_CODE
    return None


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The one of `choices` closest to `word` (difflib's ratio at least 0.6), or None."""
    found = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` when `word` is close to one of `choices` (a typo of it), else ""."""
    found = close_match(word, choices)
    return f" (did you mean {found}?)" if found else ""
