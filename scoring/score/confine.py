"""The scorer confines itself once it has read the validation data.

`pgolf score` (the run's score phase and `pgolf verify` use it) runs no submitted code: the model,
its codec and its eval.py hook run in model workers (scoring/worker/, confined before they import
anything of the submission). The scorer reads everything it needs first (the artifact, the manifest,
the tokenizer and the validation tokens, kept in memory), then restricts itself with Landlock
(isolation/landlock.py), irreversibly, for itself and anything it starts later:

- reads only beneath the system folders, the Python installation, the project's `scoring`, `data`
  and `isolation` packages and the submission's code folder (hashes only; never imported); the
  dataset folder (both splits) and every validation shard are outside every rule (folders that hold
  them are carved), and so is the temp folder, where runs stage their views;
- writes only beneath the folder of the requested output file and a private temp folder;
- the usual device files, and the GPUs when scoring on CUDA; with Landlock ABI >= 6 no signal
  reaches a process outside.

So even a bug that let submitted code into this process could not reach the validation files by path.
Without Landlock (other kernels, other systems) the scorer runs unconfined and says so in its record;
`--no-confine` turns it off on purpose (also recorded).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from isolation.landlock import (
    Rule,
    apply_landlock,
    broad_read_roots,
    broad_read_rules,
    device_rules,
    landlock_abi,
    own_rules,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCORER_PACKAGES = ("scoring", "data", "isolation")


_REAPER = "import os, shutil, sys\nos.read(0, 1)\nshutil.rmtree(sys.argv[1], ignore_errors=True)\n"
_reapers: list[subprocess.Popen] = []


def private_workdir() -> tuple[Path, str]:
    """A fresh temp folder for the scorer (TMPDIR, compile caches); returns it and the system temp folder.

    Once confined, the scorer may empty that folder but not remove it (that takes a right on the temp
    folder itself), so a small process started now, unconfined, waits for this one to end (its stdin
    closes) and removes it, whatever way the scorer ends.
    """
    system_tmp = os.path.realpath(tempfile.gettempdir())
    work = Path(tempfile.mkdtemp(prefix="pgolf-score-"))
    _reapers.append(
        subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(work)], stdin=subprocess.PIPE, start_new_session=True
        )
    )
    for var, sub in (
        ("TMPDIR", "tmp"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
        ("CUDA_CACHE_PATH", "nv"),
    ):
        (work / sub).mkdir()
        os.environ[var] = str(work / sub)
    tempfile.tempdir = str(work / "tmp")
    return work, system_tmp


def plan_rules(
    *,
    code_dir: Path,
    protected: Iterable[Path],
    write_dirs: Iterable[Path],
    device: str,
    system_tmp: str,
) -> tuple[list[Rule], list[str], list[str]]:
    """(rules, protected real paths, warnings) for the confined scorer."""
    prot = sorted({os.path.realpath(p) for p in protected})
    warnings: list[str] = []
    rules: list[Rule] = []
    for path in dict.fromkeys(broad_read_roots(sys.path, PROJECT_ROOT)):
        if os.path.exists(path):
            rules += broad_read_rules(path, prot, prot, system_tmp, warnings)
    rules += own_rules(
        [code_dir, *(PROJECT_ROOT / pkg for pkg in SCORER_PACKAGES)], write_dirs, prot, "the scorer's"
    )
    rules += device_rules(device)
    return rules, prot, warnings


def confine_scorer(
    *,
    code_dir: Path,
    protected: Iterable[Path],
    write_dirs: Iterable[Path],
    device: str,
    workdir: tuple[Path, str],
) -> dict[str, Any]:
    """Apply the scorer's Landlock rules to this process (irreversible); the record says what was done.

    `workdir` is what private_workdir() returned: its folder stays writable, the system temp folder out of reach.
    """
    abi = landlock_abi()
    if abi == 0:
        return {
            "applied": False,
            "reason": "Landlock is not available on this kernel: the scorer ran unconfined",
        }
    rules, prot, warnings = plan_rules(
        code_dir=code_dir,
        protected=protected,
        write_dirs=[*write_dirs, workdir[0]],
        device=device,
        system_tmp=workdir[1],
    )
    # No signal scoping: the scorer must be able to kill its model workers, which it started before it
    # confined itself (so they are outside its new domain). It runs no submitted code to scope.
    apply_landlock(rules, abi, scope_signals=False)
    return {
        "applied": True,
        "landlock_abi": abi,
        "rules": len(rules),
        "protected": prot,
        "writable": [r.path for r in rules if r.access == "rw"],
        "warnings": warnings,
    }
