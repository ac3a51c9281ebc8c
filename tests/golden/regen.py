"""Print the golden tiny run's text from a run folder: `python -m tests.golden.regen RUN_DIR > tests/golden/tiny_run.txt`.

The run is `pgolf run` with GOLDEN_ARGS (below) on the embedded corpus; tests/e2e/test_pipeline.py (test_golden_tiny_run_is_reproduced_exactly)
runs the same command and compares every line exactly.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

GOLDEN_ARGS = [
    "--preset",
    "tiny",
    "--set",
    "train.warmdown_iters=0",
    "--set",
    "budget.train_s=300.0",
    "--set",
    "train.train_log_every=1",
]
"""A step count ends the run (30 iterations, constant LR): the losses do not depend on the clock."""
PINNED_NUMERICS_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
"""The golden run's kernels, pinned to AVX2 for every process of the run (ATen's vectorised kernels, MKL's
BLAS and vector maths, oneDNN): unpinned, each CPU kind picks its own (AVX-512, AMX) and the last digits
differ (the unpinned golden recorded on an AMD EPYC with AVX-512 missed by 4.8e-7 in the loss at step 3 on
an Intel Xeon with AMX), and MKL's strict mode makes a row's logits independent of where the scorer's
secret row order puts it in its batch (without it, two scorings of one artifact differed by 1e-10 in
val_bpb on that Xeon). AVX2 is what every x86-64 machine this project runs on has. The harness passes
these machine facts through to the ranks, the scorer and the model worker."""

HEADER = """\
# Golden tiny run: the naive baseline's tiny preset on the embedded corpus, ended by a fixed step count.
# Regenerate only after a deliberate change of numerics (the baseline, the codec, METRIC_VERSION):
#   env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \\
#   pgolf run baselines/naive_baseline --preset tiny --set train.warmdown_iters=0 \\
#     --set budget.train_s=300.0 --set train.train_log_every=1 --out /tmp/golden/run
#   python -m tests.golden.regen /tmp/golden/run > tests/golden/tiny_run.txt
# Tolerance: none. Losses as repr() prints them, val_bpb bit for bit, the artifact's sha256.
# Kernels pinned to AVX2 (tests/golden/regen.py PINNED_NUMERICS_ENV), so the golden holds on every CPU kind.
# The embedded corpus is built from this Python's own documentation: on another Python version the
# shards differ and the test skips, naming both hashes."""


def shards_identity(data_dir: Path) -> str:
    """sha256 over the dataset's shard hashes: the tokens themselves (the tokenizer file's bytes vary by build)."""
    manifest = json.loads((data_dir / "manifest.json").read_text(encoding="utf-8"))
    return hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest()


def golden_lines(run_dir: Path) -> list[str]:
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    metrics = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if line
    ]
    lines = [
        f"data_shards_sha256 {shards_identity(Path(result['provenance']['data_dir']))}",
        f"status {result['status']}",
        f"val_bpb {result['val_bpb']!r}",
        f"val_loss {result['val_loss']!r}",
        f"artifact_sha256 {result['provenance']['artifact_sha256']}",
        f"bytes_model {result['bytes_model']}",
        f"steps {result['steps']}",
    ]
    return lines + [f"loss {m['step']} {m['train_loss']!r}" for m in metrics]


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(golden_lines(Path(sys.argv[1]))))
