#!/usr/bin/env bash
# The GPU check on a lent, bare GPU machine (one command there), prepared here first.
#
#   bash scripts/gpu_session.sh prepare          # here: wheels the GPU image lacks (.whl/) and the sp1024
#                                                #   dataset from ../shared/data (.gpucheck/sp1024), both ignored
#   bash scripts/gpu_session.sh run OUT [ARGS]   # there, from the repo root, with .whl and .gpucheck carried:
#                                                #   installs the wheels, runs scripts/gpu_check.py ARGS, and leaves
#                                                #   OUT/setup.log, gpu_check.log, gpu_check.json and runs.tgz
#                                                #   (each run's records and logs, no weights)
#
# The image seen on 2026-12-04 (one H200): Python 3.12 with torch 2.11.0+cu130, numpy, sentencepiece,
# safetensors, scipy, matplotlib, tqdm, huggingface_hub; without zstandard, brotli and submitit (the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    mkdir -p .whl .gpucheck
    for p in zstandard brotli submitit; do
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$p"
    done
    if [ ! -f .gpucheck/sp1024/manifest.json ]; then
      python -m harness.cli data build --docs ../shared/data/fineweb/sample.jsonl \
        --tokenizer ../shared/data/tokenizers/fineweb_1024_bpe.model --val-docs 200 --out .gpucheck/sp1024
    fi
    du -sh .whl .gpucheck
    ;;
  run)
    out="${2:?usage: gpu_session.sh run OUT [gpu_check args]}"
    shift 2
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
      uname -r || true
      python3 -c "import sys, torch; print(sys.executable, sys.version.split()[0], torch.__version__, torch.version.cuda)" \
        || echo "SETUP FAILED: python3 cannot import torch"
      # each step's failure is a line here, never the end of the session: the check imports the project from
      # PYTHONPATH, and a missing wheel shows as its own one-line failure there
      python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl && echo "wheels installed" \
        || echo "SETUP FAILED: the wheels of .whl/ did not install (the check runs without them)"
      python3 -m pip install -q --no-deps --no-build-isolation -e . && echo "pgolf installed (editable)" \
        || echo "SETUP FAILED: the editable install of pgolf (the check runs from PYTHONPATH)"
    } 2>&1 | tee "$out/setup.log" || true
    rc=0
    python3 scripts/gpu_check.py --data .gpucheck/sp1024 --workdir /tmp/pgolf-gpu-check \
      --json-out "$out/gpu_check.json" "$@" > "$out/gpu_check.log" 2>&1 || rc=$?
    tar czf "$out/runs.tgz" --exclude='*.safetensors' --exclude='*.pgolf' --exclude='*.bin' \
      -C /tmp/pgolf-gpu-check . 2>/dev/null || true
    grep -v '^│\|^┌\|^└' "$out/gpu_check.log" | tail -c 9000 || true
    echo "gpu_check exit $rc"
    exit "$rc"
    ;;
  *)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
