"""Provenance: hardware, library versions, git commit. Recorded in every result."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

LIBRARIES = (
    "torch",
    "numpy",
    "sentencepiece",
    "safetensors",
    "zstandard",
    "huggingface_hub",
    "datasets",
    "scipy",
)


def library_versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    hw: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cuda_devices": [],
    }
    if torch.cuda.is_available():
        hw["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        mem_kb = next(
            int(x.split()[1])
            for x in Path("/proc/meminfo").read_text().splitlines()
            if x.startswith("MemTotal")
        )
        hw["memory_bytes"] = mem_kb * 1024
    except (OSError, StopIteration, ValueError):
        pass
    return hw


def git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
