"""The confined side of `pgolf generate`: build the packed model and generate, plain and speculative.

    python -m scoring.worker.generate SPEC_JSON     (started by harness/commands/generate.py; not by hand)

(`pgolf sample` is the same process with `recompute`: the model's forward only, on the last `context`
tokens, never its cache: what it prints is what the scorer's forward gives.)

It runs in the model worker's sandbox (harness/commands/generate.py starts it as scoring/worker/decode.py
starts the confined decode, through scoring/worker/confined.py, and its entry point is every confined
child's, scoring/worker/child.py: exit status 3 when the model lacks what was asked). Landlock reads of the code folder, the artifact and the Python
installation only, a private temp folder, namespaces, no capabilities, seccomp, an address-space
limit). Submitted code (model.py, codec.py) runs only here. It decodes the artifact with its codec,
checks the code against the artifact's hashes, builds the model and loads it strictly (as the
scorer does), generates, and writes one JSON result (`pg-generate-result` v1) to the file
descriptor it was given. The other side believes only token ids in range and finite numbers.

The generation contract (optional; submissions/README.md, "Generation"): a model may define

    forward_cached(input_ids [B, L] int64, cache, start: int) -> (logits [B, L, V], drafts, cache)

`input_ids` are the tokens at positions start .. start + L - 1; `cache` is None when start is 0,
else what the previous call returned: the model keeps what it needs of positions < start (e.g. the
keys and values of attention) and drops anything it holds at positions >= start (so a rejected
draft is undone by calling again with an earlier start). `drafts` is None, or [B, L, J, V]: at each
position, J multi-token heads' logits for the tokens 2 .. J + 1 ahead. Without forward_cached the
model is re-run on the whole sequence (at most `context` tokens) for every new token, and
`--speculative` is refused.

Speculative decoding (Leviathan et al. 2023, with the model's own heads as the drafter): after a
token y is chosen at position n, the heads' guesses made at position n - 1 for positions n + 1 ..
n + k are fed with y in one forward at start n; each guess is kept while it matches what the model
itself picks there (temperature 0: the argmax; otherwise accepted with probability min(1, p/q), the
first rejected position resampled from max(0, p - q)), so greedy output equals plain greedy
generation, and sampled output has the model's distribution.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from scoring.worker.child import Unsupported, run_child

GENERATE_SPEC_FORMAT = "pg-generate-spec"
GENERATE_SPEC_VERSION = 2
"""2: `recompute` (pgolf sample: the contract's forward only, even where the model offers a cache)."""
GENERATE_RESULT_FORMAT = "pg-generate-result"
GENERATE_RESULT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Sampling:
    temperature: float
    top_k: int
    vocab_size: int


def probabilities(logits_V: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The sampling distribution (float64) of one position's logits: temperature, then top-k."""
    logits = logits_V[: s.vocab_size].double() / s.temperature
    if 0 < s.top_k < logits.numel():
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, -1)


def next_token(logits_V: torch.Tensor, s: Sampling, generator: torch.Generator) -> int:
    """Temperature 0: the argmax (the first on ties); else a draw from `probabilities`."""
    if s.temperature <= 0:
        return int(torch.argmax(logits_V[: s.vocab_size]))
    return int(torch.multinomial(probabilities(logits_V, s), 1, generator=generator))


@dataclass
class Stats:
    mode: str
    tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    cached: bool = True

    def record(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "cached": self.cached,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "forwards": self.forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
        }


def _checked(out: Any, L: int) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
    if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], torch.Tensor)):
        raise ValueError("forward_cached must return (logits [B, L, V], drafts or None, cache)")
    logits, drafts, cache = out
    if logits.ndim != 3 or tuple(logits.shape[:2]) != (1, L):
        raise ValueError(
            f"forward_cached returned logits of shape {tuple(logits.shape)}; expected (1, {L}, V)"
        )
    if drafts is not None and (
        not isinstance(drafts, torch.Tensor) or drafts.ndim != 4 or tuple(drafts.shape[:2]) != (1, L)
    ):
        raise ValueError("forward_cached returned drafts that are not None or [1, L, J, V]")
    return logits[0].float(), None if drafts is None else drafts[0].float(), cache


@torch.inference_mode()
def generate_recompute(
    model: Callable[[torch.Tensor], torch.Tensor],
    prompt: list[int],
    n_tokens: int,
    s: Sampling,
    generator: torch.Generator,
    context: int,
) -> Stats:
    """No cache: the model re-run on the last `context` tokens for every new token (the fallback)."""
    st, ids = Stats("plain", cached=False), list(prompt)
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        logits = model(torch.tensor([ids[-context:]], dtype=torch.long))[0, -1]
        st.forwards += 1
        ids.append(next_token(logits, s, generator))
        st.tokens.append(ids[-1])
    st.seconds = time.perf_counter() - t0
    return st


@torch.inference_mode()
def generate_cached(
    model: Any,
    prompt: list[int],
    n_tokens: int,
    s: Sampling,
    generator: torch.Generator,
    draft_k: int = 0,
) -> Stats:
    """With the model's KV cache; draft_k > 0 drafts up to that many tokens per forward with its heads."""
    st = Stats("speculative" if draft_k else "plain")
    t0 = time.perf_counter()
    logits, drafts, cache = _checked(model.forward_cached(torch.tensor([prompt]), None, 0), len(prompt))
    st.forwards += 1
    if draft_k and drafts is None:
        raise Unsupported("the model keeps no multi-token heads (forward_cached returned drafts None)")
    n = len(prompt)  # the position of the next token
    last, last_drafts = logits[-1], None if drafts is None else drafts[-1]  # [V], [J, V]
    residual: torch.Tensor | None = None  # after a rejection: the next token comes from max(0, p - q)
    while True:
        if residual is not None:
            y = int(torch.multinomial(residual, 1, generator=generator))
        else:
            y = next_token(last, s, generator)
        st.tokens.append(y)
        remaining = n_tokens - len(st.tokens)
        if remaining == 0:
            break
        guesses: list[int] = []
        qs: list[torch.Tensor] = []
        k = 0 if last_drafts is None else min(draft_k, last_drafts.shape[0], remaining - 1)
        for j in range(k):  # the heads' guesses for positions n + 1 .. n + k
            assert last_drafts is not None
            if s.temperature <= 0:
                guesses.append(next_token(last_drafts[j], s, generator))
            else:
                qs.append(probabilities(last_drafts[j], s))
                guesses.append(int(torch.multinomial(qs[-1], 1, generator=generator)))
        x = torch.tensor([[y, *guesses]])
        logits, drafts, cache = _checked(model.forward_cached(x, cache, n), k + 1)
        st.forwards += 1
        st.drafted += k
        residual, taken = None, 0
        for j, g in enumerate(guesses):  # logits[j] is the model at position n + 1 + j
            if s.temperature <= 0:
                ok = int(torch.argmax(logits[j][: s.vocab_size])) == g
            else:
                p = probabilities(logits[j], s)
                ok = bool(torch.rand((), generator=generator, dtype=torch.float64) * qs[j][g] < p[g])
                if not ok:
                    diff = (p - qs[j]).clamp_min(0)
                    residual = diff / diff.sum() if float(diff.sum()) > 0 else p
            if not ok:
                break
            taken += 1
            st.tokens.append(g)
        st.accepted += taken
        n += 1 + taken
        last = logits[taken]
        last_drafts = None if drafts is None else drafts[taken]
    st.seconds = time.perf_counter() - t0
    return st


def run(spec: dict[str, Any], model: Any) -> list[dict[str, Any]]:
    """Plain generation (cached when the model offers it), then speculative when asked; their records."""
    s = Sampling(
        temperature=float(spec["temperature"]), top_k=int(spec["top_k"]), vocab_size=int(spec["vocab_size"])
    )
    prompt, n = [int(t) for t in spec["prompt"]], int(spec["max_tokens"])
    cached = callable(getattr(model, "forward_cached", None)) and not spec["recompute"]
    if spec["speculative"] and not cached:
        raise Unsupported(
            "the model defines no forward_cached(input_ids, cache, start) (see submissions/README.md)"
        )
    # one short untimed pass first, so that neither timed run pays the first call's set-up
    with torch.inference_mode():
        model(torch.tensor([prompt[-8:]]))
    seed = int(spec["seed"])
    if cached:
        plain = generate_cached(model, prompt, n, s, torch.Generator().manual_seed(seed))
    else:
        plain = generate_recompute(
            model, prompt, n, s, torch.Generator().manual_seed(seed), int(spec["context"])
        )
    runs = [plain.record()]
    if spec["speculative"]:
        draft_k = int(spec["draft_k"]) or 1 << 30
        spec_run = generate_cached(model, prompt, n, s, torch.Generator().manual_seed(seed), draft_k)
        runs.append(spec_run.record())
    return runs


def _generate(spec: dict[str, Any]) -> dict[str, Any]:
    from scoring.artifact.format import artifact_codec, decode_state, read_artifact
    from scoring.worker.loading import load_model

    artifact = read_artifact(spec["artifact"])
    state = decode_state(artifact, artifact_codec(artifact, spec["code_dir"]))  # checks the code hashes first
    model = load_model(artifact, state, spec["code_dir"], torch.device("cpu"))
    return {
        "format": GENERATE_RESULT_FORMAT,
        "format_version": GENERATE_RESULT_VERSION,
        "threads": torch.get_num_threads(),
        "runs": run(spec, model),
    }


def _write_result(spec: dict[str, Any], memory: str) -> None:
    out = os.fdopen(int(spec["result_fd"]), "w")
    result = _generate(spec)
    out.write(json.dumps(result, allow_nan=False))
    out.close()


def main(argv: list[str]) -> int:
    """The confined generation (scoring/worker/child.py: the spec, the limits, one error line, the exit status)."""
    return run_child(
        argv,
        spec_format=GENERATE_SPEC_FORMAT,
        spec_version=GENERATE_SPEC_VERSION,
        usage="python -m scoring.worker.generate SPEC_JSON  (started by pgolf generate)",
        body=_write_result,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
