"""Importing a submission's file by path: the one loader of train.py (the rank) and model.py (the GPTQ
pack step, the benches).

A leaf of harness/train/: torch-free, it imports nothing of the project, so the rank and the pack
step may both use it without importing each other.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_submission_file(path: Path, module_name: str) -> ModuleType:
    """Import a submission's file by path, its folder first on sys.path (so it may import its own files).

    Here rather than from scoring/: the training process needs torch and numpy only, nothing of the scorer.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    return module
