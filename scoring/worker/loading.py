"""Load a submission's model code by path and build the model from an artifact (in a confined process).

The model worker (and every confined child that builds a model: scoring/worker/generate.py,
build_check.py) imports `model.py` from the folder it is given (with that folder first on sys.path so
the model may import its own files) and calls `build_model(config)` with the artifact's recorded
model config. Before importing, the code files are checked against the sha256 the artifact
recorded, so the scorer runs exactly the code that was packed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from harness.api import MODEL_FILE, MODEL_OUTPUT_ATTR, MODEL_OUTPUTS, build_submission_model
from scoring.artifact.format import Artifact, ArtifactError, check_code_hashes


def import_file(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def build_model(submission_dir: str | Path, config: dict) -> nn.Module:
    path = Path(submission_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a submission defines build_model(config) in {MODEL_FILE}")
    return build_submission_model(import_file(path, "pgolf_submission_model"), config, path)


def load_model(
    artifact: Artifact, state: dict[str, torch.Tensor], submission_dir: str | Path, device: torch.device
) -> nn.Module:
    """Build the model, load the decoded tensors with strict=True, move to `device`, eval mode."""
    check_code_hashes(artifact, Path(submission_dir))
    model = build_model(submission_dir, artifact.model_config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ArtifactError(
            f"the artifact's tensors do not fit the model built from {MODEL_FILE}: {e}"
        ) from e
    return model.to(device).eval()


def output_kind(model: Any) -> str:
    """ "logits" (the default) or "log_probs", from the model's `pgolf_output` attribute (a Scorable that is no
    nn.Module, scoring/score/evaluate.py's, says its own `output_kind`)."""
    kind = getattr(model, "output_kind", None) if not isinstance(model, nn.Module) else None
    kind = kind or getattr(model, MODEL_OUTPUT_ATTR, "logits")
    if kind not in MODEL_OUTPUTS:
        raise ValueError(f"model.pgolf_output must be one of {MODEL_OUTPUTS}, got {kind!r}")
    return kind
