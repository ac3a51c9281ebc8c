"""`pgolf sample`: run a packed model — decode its artifact and generate text on CPU or GPU.

    pgolf sample RUN_DIR [--prompt TEXT]          a run folder: its artifact, packed code and data
    pgolf sample ARTIFACT --submission DIR (--data DIR | --tokenizer MODEL) [--prompt TEXT]
                 [--tokens N] [--temperature T] [--top-k K] [--seed S] [--context N]

The model is built exactly as the scorer builds it, and where: in a confined model worker
(scoring/score/remote.py's WorkerModel; scoring/worker/), the only process where submitted code
(model.py, codec.py) runs. The worker checks the code against the artifact's hashes, decodes the
tensors with the artifact's codec and loads them strictly, so what you sample is what was scored.
This process holds the tokenizer, sends the worker the sequence so far, reads back its logits and
samples. Generation re-runs the model on the last `--context` tokens for each new token (no KV
cache: the worker runs the contract's forward only), which is fine for the small models of this
challenge; `pgolf generate` (harness/commands/generate.py) runs the model's optional KV cache and drafting.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from data.manifest import load_manifest
from data.tokenizer import Tokenizer, load_tokenizer
from scoring.artifact.format import check_code_hashes, read_artifact
from scoring.score.remote import (
    EvalDeadline,
    WorkerConfig,
    WorkerFailure,
    start_worker,
)
from scoring.worker.child import default_memory_limit_bytes, one_line
from scoring.worker.generate import Sampling, next_token


@torch.inference_mode()
def generate(
    model: Callable[[torch.Tensor], torch.Tensor],
    prompt_ids: list[int],
    n_tokens: int,
    *,
    context: int,
    temperature: float,
    top_k: int,
    generator: torch.Generator,
    vocab_size: int,
) -> list[int]:
    """Autoregressive sampling; temperature 0 is greedy. Returns only the new tokens.

    `model` maps [1, L] token ids to [1, L, V] logits: a WorkerModel's `logits` (what `pgolf sample`
    uses), or an nn.Module of this process (trusted code only)."""
    s = Sampling(temperature=temperature, top_k=top_k, vocab_size=vocab_size)
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(n_tokens):
        x = torch.tensor([ids[-context:]], dtype=torch.long)
        nxt = next_token(model(x)[0, -1], s, generator)
        ids.append(nxt)
        out.append(nxt)
    return out


RUN_ARTIFACT = "artifact.pgolf"
RUN_CODE = "code"


def resolve_run_folder(args: argparse.Namespace) -> None:
    """ARTIFACT may be a run folder (`pgolf run`'s RUN_DIR): its artifact.pgolf, the code that was packed
    (RUN_DIR/code) unless --submission is given, and the tokenizer of the data it was scored on (result.json's
    provenance.data_dir) unless --data or --tokenizer is. Sets args.artifact, args.submission, args.data."""
    given = Path(args.artifact)
    if given.is_dir():
        if not (given / RUN_ARTIFACT).is_file():
            raise FileNotFoundError(
                f"{given}: a folder without {RUN_ARTIFACT}: not a run folder that packed (pass the artifact file)"
            )
        args.artifact = str(given / RUN_ARTIFACT)
        if not args.submission:
            if not (given / RUN_CODE).is_dir():
                raise FileNotFoundError(f"{given}: no {RUN_CODE}/ (the packed code); pass --submission DIR")
            args.submission = str(given / RUN_CODE)
        if not args.data and not args.tokenizer:
            from data.io import read_json

            try:
                data_dir = (read_json(given / "result.json", what="result.json").get("provenance") or {}).get(
                    "data_dir"
                )
            except (OSError, ValueError):
                data_dir = None
            if isinstance(data_dir, str) and (Path(data_dir) / "manifest.json").is_file():
                args.data = data_dir
    elif not args.submission:
        raise ValueError(f"{given}: an artifact file needs --submission DIR (or pass the run folder instead)")


def tokenizer_for(args: argparse.Namespace) -> Tokenizer:
    """`--tokenizer`, else `--data`'s tokenizer, else the embedded corpus's (`pgolf sample` and `pgolf generate`)."""
    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    if args.data:
        return load_tokenizer(load_manifest(args.data).tokenizer_path)
    from data.embedded import ensure_embedded_dataset

    return load_tokenizer(load_manifest(ensure_embedded_dataset()).tokenizer_path)


def cmd_sample(args: argparse.Namespace) -> int:
    if args.tokens <= 0 or args.context <= 0:
        raise ValueError(f"--tokens and --context must be positive, got {args.tokens}, {args.context}")
    resolve_run_folder(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = tokenizer_for(args)
    artifact_path, code_dir = Path(args.artifact).resolve(), Path(args.submission).resolve()
    # a friendly early refusal, before anything starts (the worker checks again, and decodes)
    check_code_hashes(read_artifact(artifact_path), code_dir)
    prompt = [tok.bos_id] + (tok.encode([args.prompt])[0] if args.prompt else [])
    longest = min(args.context, len(prompt) + args.tokens - 1)  # the longest sequence generate() sends
    worker = start_worker(
        WorkerConfig(
            code_dir=code_dir,
            artifact=artifact_path,
            threads=torch.get_num_threads(),
            vocab_size=tok.vocab_size,
            max_tokens_per_batch=longest,
            memory_limit_bytes=default_memory_limit_bytes(),
            role="sample",
        )
    )
    try:
        for warning in worker.plan.warnings:
            print(f"sandbox: {warning}", file=sys.stderr)
        worker.wait_ready()
        g = torch.Generator().manual_seed(args.seed)
        t0 = time.perf_counter()
        new = generate(
            worker.logits,
            prompt,
            args.tokens,
            context=args.context,
            temperature=args.temperature,
            top_k=args.top_k,
            generator=g,
            vocab_size=tok.vocab_size,
        )
        dt = time.perf_counter() - t0
    except (WorkerFailure, EvalDeadline, ValueError) as e:  # the model's failure, told in one printable line
        kind = getattr(e, "kind", "error")
        print(f"error: the model worker failed ({kind}): {one_line(str(e))}", file=sys.stderr)
        return 1
    finally:
        worker.close()
    print(tok.decode(prompt[1:] + new))  # decoded together, so the join keeps its spaces
    print(
        f"\n[{len(new)} tokens in {dt:.2f} s: {len(new) / dt:.1f} tokens/s on {torch.get_num_threads()} CPU thread(s)]"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate text from a packed model (what was scored)")
    p.add_argument("artifact", help="an artifact file, or a run folder (its artifact, packed code and data)")
    p.add_argument(
        "--submission", help="the submission folder the artifact was packed from (a run folder: its code/)"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="dataset folder whose tokenizer to use (default: the embedded corpus)")
    src.add_argument("--tokenizer", help="a tokenizer file (.model or byte260.json)")
    p.add_argument("--prompt", default="", help="text to continue")
    p.add_argument("--tokens", type=int, default=64, help="new tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--context", type=int, default=1024, help="tokens of context fed to the model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(func=cmd_sample)
