"""`pgolf generate` and `pgolf sample`: run a packed model on CPU; the one generation path.

    pgolf generate ARTIFACT --submission DIR (--data DIR | --tokenizer MODEL) --prompt TEXT
                   [--max-tokens N] [--temperature T] [--top-k K] [--seed S] [--speculative]
                   [--draft-k K] [--context N] [--threads N]
    pgolf sample RUN_DIR [--prompt TEXT]          (ARTIFACT may be a run folder for both)
    pgolf sample ARTIFACT --submission DIR (--data DIR | --tokenizer MODEL) [--prompt TEXT]
                 [--tokens N] [--temperature T] [--top-k K] [--seed S] [--context N] [--threads N]

`sample` is `generate` with the model's forward only (the contract's, what the scorer ran: never a
cache), on the last `--context` tokens for every new token, sampling at temperature 0.8 by default.

This process holds the tokenizer and runs no submitted code. The model is built and run in one
confined process (scoring/worker/generate.py, inside the sandbox the scorer's model worker gets:
isolation/sandbox.py's plan with the seccomp filter, an address-space limit, a private temp folder),
which generates the whole continuation there, where its KV cache lives, and writes back token ids
and timings through a pipe; this side checks every id against the vocabulary before decoding,
and prints the text with control characters escaped (`printable`: byte tokens decode to any byte).

Plain generation uses the model's optional `forward_cached` (the generation contract,
submissions/README.md) and falls back to re-running the whole sequence per token without it.
With `--speculative` the same prompt is generated twice, plainly and with the model's kept
multi-token heads drafting up to `--draft-k` tokens per forward; tokens/s is printed both ways with
the acceptance rate, and at temperature 0 the two outputs must be identical (exit status 1 if not).
Timings are the confined process's own (perf_counter around each generation, prefill included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import torch

from data.io import remove_tree
from data.manifest import load_manifest
from data.tokenizer import Tokenizer, load_tokenizer
from scoring.artifact.format import check_code_hashes, read_artifact
from scoring.worker.child import EXIT_UNSUPPORTED, default_memory_limit_bytes, exit_how, one_line
from scoring.worker.generate import (
    GENERATE_RESULT_FORMAT,
    GENERATE_RESULT_VERSION,
    GENERATE_SPEC_FORMAT,
    GENERATE_SPEC_VERSION,
)

GENERATE_TIMEOUT_S = 900.0
RESULT_MAX_BYTES = 8 << 20


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


class GenerateFailure(RuntimeError):
    """The confined generation failed; `kind` is "error", or "unsupported" (the model lacks what was asked)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class GenRun:
    mode: str
    cached: bool
    tokens: list[int]
    seconds: float
    forwards: int
    drafted: int
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else math.inf


def parse_result(raw: bytes, *, vocab_size: int, max_tokens: int, speculative: bool) -> list[GenRun]:
    """The confined process's result, believed only as far as checked: format, ids in range, counts, numbers."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise GenerateFailure("error", f"the generation process wrote no valid result ({e})") from None
    if (
        not isinstance(obj, dict)
        or obj.get("format") != GENERATE_RESULT_FORMAT
        or obj.get("format_version") != GENERATE_RESULT_VERSION
    ):
        raise GenerateFailure("error", f"the generation result is not {GENERATE_RESULT_FORMAT} v1")
    runs = obj.get("runs")
    want = ["plain", "speculative"] if speculative else ["plain"]
    if not isinstance(runs, list) or [r.get("mode") if isinstance(r, dict) else None for r in runs] != want:
        raise GenerateFailure("error", f"the generation result must hold the runs {want}")
    out = []
    for r in runs:
        toks = r.get("tokens")
        if (
            not isinstance(toks, list)
            or len(toks) != max_tokens
            or not all(type(t) is int and 0 <= t < vocab_size for t in toks)
        ):
            raise GenerateFailure(
                "error",
                f"the {r['mode']} run returned token ids that are not {max_tokens} ids below {vocab_size}",
            )
        nums = [r.get(k) for k in ("seconds", "forwards", "drafted", "accepted")]
        if not all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in nums):
            raise GenerateFailure("error", f"the {r['mode']} run's timings and counts are not finite numbers")
        if r["accepted"] > r["drafted"] or type(r.get("cached")) is not bool:
            raise GenerateFailure("error", f"the {r['mode']} run's counts are inconsistent")
        out.append(GenRun(r["mode"], r["cached"], toks, float(r["seconds"]), *map(int, nums[1:])))
    return out


def generate_confined(
    artifact: Path,
    code_dir: Path,
    *,
    prompt: list[int],
    max_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
    speculative: bool,
    draft_k: int,
    context: int,
    vocab_size: int,
    threads: int = 0,
    sandbox: str = "auto",
    timeout_s: float = GENERATE_TIMEOUT_S,
    recompute: bool = False,
) -> list[GenRun]:
    """Generate in a confined process (see the module docstring); the checked runs, plain first."""
    from scoring.worker.confined import ConfinedChild, plan_confined

    artifact, code_dir = artifact.resolve(), code_dir.resolve()
    check_code_hashes(read_artifact(artifact), code_dir)  # a friendly early refusal; the process checks again
    tmp = Path(tempfile.mkdtemp(prefix="pgolf-generate-"))
    policy = tmp.with_name(tmp.name + "-policy.json")  # outside the process's own folder
    read_fd, write_fd = os.pipe()
    child: ConfinedChild | None = None
    try:
        plan = plan_confined(tmp, [code_dir, artifact], sandbox=sandbox)
        for warning in plan.warnings:
            print(f"sandbox: {warning}", file=sys.stderr)
        spec = {
            "format": GENERATE_SPEC_FORMAT,
            "format_version": GENERATE_SPEC_VERSION,
            "code_dir": str(code_dir),
            "artifact": str(artifact),
            "result_fd": write_fd,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "seed": seed,
            "speculative": speculative,
            "draft_k": draft_k,
            "context": context,
            "vocab_size": vocab_size,
            "threads": threads,
            "recompute": recompute,
            "memory_limit_bytes": default_memory_limit_bytes(),
        }
        child = ConfinedChild(
            plan, "scoring.worker.generate", spec, tmp, policy, threads=threads, pass_fds=(write_fd,)
        )
        os.close(write_fd)
        write_fd = -1
        chunks: list[bytes] = []
        size = [0]

        def read_result() -> None:  # bounded: a hostile process cannot make this one hold more
            while chunk := os.read(read_fd, 1 << 16):
                size[0] += len(chunk)
                if size[0] > RESULT_MAX_BYTES:
                    return
                chunks.append(chunk)

        reader = threading.Thread(target=read_result, daemon=True)
        reader.start()
        code = child.wait(timeout_s)  # whatever it started in its process group goes too
        reader.join(timeout=2)
        if code is None:
            raise GenerateFailure("error", f"the generation did not end within {timeout_s:.0f} s")
        if code != 0:
            said = child.error_line()
            kind = "unsupported" if code == EXIT_UNSUPPORTED else "error"
            said = said.removeprefix(
                "Unsupported: "
            )  # the line names the exception's type; this one is the kind
            raise GenerateFailure(
                kind, f"the generation process failed ({exit_how(code)})" + (f": {said}" if said else "")
            )
        if size[0] > RESULT_MAX_BYTES:
            raise GenerateFailure("error", f"the generation result is over {RESULT_MAX_BYTES:,} bytes")
        return parse_result(
            b"".join(chunks), vocab_size=vocab_size, max_tokens=max_tokens, speculative=speculative
        )
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        if child is not None:
            child.close()
        remove_tree(tmp)
        policy.unlink(missing_ok=True)


_SHOWN_AS_IS = frozenset("\n\t")
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: str) -> str:
    """The model's text as it may reach a terminal: newlines and tabs kept, every other control, format or
    unassigned character (ESC, BEL, bidi overrides, ...) written as its escape (`\\x1b`), so a model cannot
    send the terminal commands (a hostile model chooses its tokens, and byte tokens decode to any byte)."""
    return "".join(
        c if c in _SHOWN_AS_IS or unicodedata.category(c) not in _HIDDEN_CATEGORIES else ascii(c)[1:-1]
        for c in text
    )


def describe(run: GenRun) -> str:
    how = "KV cache" if run.cached else "full recompute (the model has no forward_cached)"
    line = (
        f"[{run.mode}, {how}: {len(run.tokens)} tokens in {run.seconds:.2f} s = {run.tokens_per_s:.1f} tokens/s, "
        f"{run.forwards} forward passes"
    )
    if run.mode == "speculative":
        rate = run.accepted / run.drafted if run.drafted else 0.0
        line += f"; drafts accepted {run.accepted}/{run.drafted} = {rate:.1%}"
    return line + "]"


def cmd_generate(args: argparse.Namespace) -> int:
    if args.max_tokens <= 0 or args.context <= 0 or args.draft_k < 0:
        raise ValueError(
            f"--max-tokens and --context must be positive and --draft-k at least 0, "
            f"got {args.max_tokens}, {args.context}, {args.draft_k}"
        )
    resolve_run_folder(args)
    tok = tokenizer_for(args)
    prompt = [tok.bos_id] + (tok.encode([args.prompt])[0] if args.prompt else [])
    if len(prompt) + args.max_tokens > args.context:
        raise ValueError(
            f"the prompt ({len(prompt)} tokens with BOS) + --max-tokens {args.max_tokens} exceeds --context "
            f"{args.context}: shorten them or raise --context"
        )
    threads = args.threads or torch.get_num_threads()
    try:
        runs = generate_confined(
            Path(args.artifact),
            Path(args.submission),
            prompt=prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            speculative=args.speculative,
            draft_k=args.draft_k,
            context=args.context,
            vocab_size=tok.vocab_size,
            threads=threads,
        )
    except GenerateFailure as e:
        if e.kind == "unsupported":
            raise ValueError(f"{args.artifact}: --speculative: {e}") from None
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 1
    shown = runs[-1]
    print(printable(tok.decode(prompt[1:] + shown.tokens)))  # decoded together, so the join keeps its spaces
    print()
    for run in runs:
        print(describe(run))
    print(f"[{threads} CPU thread(s); temperature {args.temperature:g}, seed {args.seed}]")
    if args.speculative:
        plain, spec = runs
        speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else math.nan
        print(f"[speculative / plain: {speedup:.2f}x tokens/s]")
        if args.temperature <= 0:
            same = plain.tokens == spec.tokens
            first = next(
                (i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens, strict=True)) if a != b), None
            )
            print(
                "[temperature 0: speculative output identical to plain generation: "
                + ("yes]" if same else f"NO, first difference at new token {first}]")
            )
            if not same:
                return 1
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """`pgolf sample`: generate's process with the model's forward only (`recompute`), on the last
    `--context` tokens, sampled at --temperature (0.8 by default); the text, then one line of speed."""
    if args.tokens <= 0 or args.context <= 0:
        raise ValueError(f"--tokens and --context must be positive, got {args.tokens}, {args.context}")
    resolve_run_folder(args)
    tok = tokenizer_for(args)
    prompt = [tok.bos_id] + (tok.encode([args.prompt])[0] if args.prompt else [])
    threads = args.threads or torch.get_num_threads()
    try:
        (run,) = generate_confined(
            Path(args.artifact),
            Path(args.submission),
            prompt=prompt,
            max_tokens=args.tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            speculative=False,
            draft_k=0,
            context=args.context,
            vocab_size=tok.vocab_size,
            threads=threads,
            recompute=True,
        )
    except GenerateFailure as e:  # the model's failure, told in one printable line
        print(f"error: the model worker failed ({e.kind}): {one_line(str(e))}", file=sys.stderr)
        return 1
    print(printable(tok.decode(prompt[1:] + run.tokens)))  # decoded together, so the join keeps its spaces
    print(
        f"\n[{len(run.tokens)} tokens in {run.seconds:.2f} s: {run.tokens_per_s:.1f} tokens/s on {threads} CPU thread(s)]"
    )
    return 0


def _model_source_args(p: argparse.ArgumentParser) -> None:
    """What both commands generate from: the artifact (or run folder), its code, its tokenizer, the prompt."""
    p.add_argument("artifact", help="an artifact file, or a run folder (its artifact, packed code and data)")
    p.add_argument(
        "--submission", help="the submission folder the artifact was packed from (a run folder: its code/)"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="dataset folder whose tokenizer to use (default: the embedded corpus)")
    src.add_argument("--tokenizer", help="a tokenizer file (.model or byte260.json)")
    p.add_argument("--prompt", default="", help="text to continue")


def register(sub: argparse._SubParsersAction) -> None:
    """`generate`, and `sample` (its alias with sample's own flags and defaults)."""
    p = sub.add_parser("generate", help="generate with a packed model on CPU: KV cache, speculative drafting")
    _model_source_args(p)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k most likely (temperature > 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--speculative",
        action="store_true",
        help="also generate with the model's multi-token heads drafting; print both speeds and the acceptance rate",
    )
    p.add_argument(
        "--draft-k", type=int, default=0, help="most tokens drafted per forward (0: all the heads)"
    )
    p.add_argument("--context", type=int, default=1024, help="longest sequence (prompt + new tokens)")
    p.add_argument(
        "--threads", type=int, default=0, help="CPU threads of the generating process (0: this one's)"
    )
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("sample", help="generate text from a packed model (what was scored)")
    _model_source_args(p)
    p.add_argument("--tokens", type=int, default=64, help="new tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--context", type=int, default=1024, help="tokens of context fed to the model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(func=cmd_sample)
