"""What GPTQ buys on a trained model: the same state packed by an integer codec with and without the
harness's GPTQ step (harness/train/gptq.py), each artifact scored by the scorer.

    python scripts/gptq_effect.py RUN_DIR --data DATA [--codec int6_zlib9] [--batches 8]
        [--batch-tokens 8192] [--seq-len 256] [--max-tokens 262144] [--mode standard]

RUN_DIR is a finished run (state.safetensors, code/). The calibration batches are the last training
tokens of DATA (a run reads its stream from the start, so these are the least likely to have been
trained on; inside a run the step reads the batches after the submission's last). A measurement, off
any clock: in a run the step is on the clock (pack.gptq_batches). Prints one line per artifact.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data.shards import read_split  # noqa: E402
from harness.train.gptq import apply_gptq, codec_bits, scored_model  # noqa: E402
from harness.train.gptq_config import GptqConfig  # noqa: E402
from scoring.artifact.cap import ARTIFACT_CAP_BYTES  # noqa: E402
from scoring.artifact.pack import model_config_of, pack_state, read_state  # noqa: E402


def score(artifact: Path, code: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "scoring", "score", str(artifact), "--submission", str(code), "--data",
           str(args.data), "--mode", args.mode, "--seq-len", str(args.seq_len), "--max-tokens",
           str(args.max_tokens), "--probes", "0", "--json"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if r.returncode != 0:
        sys.exit(f"scoring {artifact} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--codec", default="int6_zlib9")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=262144)
    p.add_argument("--mode", default="standard")
    args = p.parse_args()
    state, meta = read_state(args.run_dir / "state.safetensors")
    model_config = model_config_of(meta)
    if model_config is None:
        sys.exit(f"{args.run_dir}/state.safetensors has no model_config metadata (not a run's state)")
    code = args.run_dir / "code"
    train = torch.from_numpy(read_split(args.data, "train").astype("int64"))
    need = args.batches * args.batch_tokens
    tail = train[-need - 1 :]
    offset = [0]

    def next_batch(tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = tail[offset[0] : offset[0] + tokens + 1]
        offset[0] += tokens
        return chunk[:-1].view(-1, seq_len), chunk[1:].view(-1, seq_len)

    cfg = GptqConfig(
        batches=args.batches, batch_tokens=args.batch_tokens, seq_len=args.seq_len, block_size=args.block_size
    )
    t0 = time.perf_counter()
    gptq_state, record = apply_gptq(
        state,
        model=scored_model(code, model_config, torch.device("cpu")),
        codec_roles=codec_bits(args.codec),
        next_batch=next_batch,
        cfg=cfg,
    )
    print(
        f"gptq: {time.perf_counter() - t0:.1f} s, rows re-rounded by the codec: {record['rows_rerounded_by_codec']}"
    )
    print(f"{'packing':<28} {'bytes_model':>12} {'val_bpb':>12} {'scored tokens':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, st in ((f"{args.codec}", state), (f"{args.codec} + GPTQ", gptq_state)):
            art = Path(tmp) / f"{label.replace(' ', '_').replace('+', 'gptq')}.pgolf"
            rec = pack_state(
                st, code, art, codec_name=args.codec, model_config=model_config, cap_bytes=ARTIFACT_CAP_BYTES
            )
            s = score(art, code, args)
            print(f"{label:<28} {rec['bytes_model']:>12,} {s['val_bpb']:>12.6f} {s['val_tokens']:>14,}")


if __name__ == "__main__":
    main()
