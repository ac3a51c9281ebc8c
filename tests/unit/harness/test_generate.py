"""`pgolf generate`: the KV cache against full recompute, speculative against plain, the confined run.

- The CPU baselines' forward_cached (baselines/cpu_mtp, baselines/cpu_moe) gives the logits of a full
  forward, prefix by prefix and after a rolled-back draft, within 1e-4 (float32; measured about 1e-5
  on logits of magnitude 9: a cached step multiplies [1, C] rows where the full pass multiplies
  [T, C], so the sums round differently).
- Speculative decoding at temperature 0 gives exactly the plain greedy tokens: on the MTP baseline
  with random weights, and, as a property, on a toy model whose logits depend on the whole prefix
  (so a stale cache would show) with drafts right or wrong by a per-position coin.
- At temperature > 0 the speculative sampler keeps the model's distribution (the exact law of the
  first three tokens of a two-token toy model against 4,000 draws, drafts deliberately biased).
- The confined `pgolf generate` end to end: a packed MTP model with kept heads prints the same text
  plainly and speculatively at temperature 0 (and twice the same), a model without heads is refused
  in one line with status 2, a model without forward_cached falls back to full recompute; the
  result it sends back is believed only when every id is in range.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from harness.commands.generate import GenerateFailure, parse_result
from scoring.artifact.cap import ARTIFACT_CAP_BYTES
from scoring.artifact.pack import pack_state
from scoring.worker.generate import Sampling, generate_cached, generate_recompute
from tests.conftest import REPO

SMALL = dict(vocab_size=1024, num_layers=3, model_dim=64, num_heads=4, num_kv_heads=2)
GREEDY = Sampling(temperature=0.0, top_k=0, vocab_size=1024)


def load_model_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gen_test_{name}", REPO / "baselines" / name / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_model(name: str, seed: int = 0, **config: object) -> Any:
    """A baseline's model with every weight random (its zero-initialised projections would hide the attention)."""
    torch.manual_seed(seed)
    model = load_model_module(name).build_model({**SMALL, **config})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


# ---- the KV cache ----


@pytest.mark.parametrize(("name", "config"), [("cpu_mtp", {"keep_mtp_heads": True}), ("cpu_moe", {})])
def test_cached_logits_equal_a_full_forward_prefix_by_prefix_and_after_a_rollback(name, config):
    model = random_model(name, **config)
    x = torch.randint(0, 1024, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(x)
        a, _, cache = model.forward_cached(x[:, :17], None, 0)
        b, _, cache = model.forward_cached(x[:, 17:30], cache, 17)
        _, _, junk = model.forward_cached(torch.tensor([[5, 6, 7, 8, 9]]), cache, 30)  # a rejected draft
        c, _, _ = model.forward_cached(x[:, 30:], junk, 30)  # positions >= 30 of the cache are dropped
        one_by_one = [model.forward_cached(x[:, :1], None, 0)]
        for t in range(1, 40):
            one_by_one.append(model.forward_cached(x[:, t : t + 1], one_by_one[-1][2], t))
    assert full.abs().max() > 1.0  # the weights are not trivial
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.cat([o[0] for o in one_by_one], 1), full, rtol=0, atol=1e-4)


def test_the_mtp_heads_draft_only_when_kept_and_cost_no_tensor_otherwise():
    kept, dropped = random_model("cpu_mtp", keep_mtp_heads=True), random_model("cpu_mtp")
    x = torch.randint(0, 1024, (1, 9))
    with torch.inference_mode():
        logits, drafts, _ = kept.forward_cached(x, None, 0)
        assert drafts is not None and tuple(drafts.shape) == (1, 9, 2, 1024)
        assert dropped.forward_cached(x, None, 0)[1] is None
        assert tuple(kept(x).shape) == (1, 9, 1024)  # the scored forward: next-token logits only
    assert not any(k.startswith("mtp_heads.") for k in dropped.state_dict())
    assert sum(k.startswith("mtp_heads.") for k in kept.state_dict()) == 4  # 2 heads x (fc, proj)


# ---- speculative == plain at temperature 0 ----


def test_greedy_speculative_equals_plain_and_recompute_on_the_mtp_baseline():
    model = random_model("cpu_mtp", seed=3, keep_mtp_heads=True)
    with torch.no_grad():  # heads that guess what the model says next: some drafts are accepted
        for head in model.mtp_heads:
            head.proj.weight.zero_()
    prompt = [1, 17, 300, 42]
    plain = generate_cached(model, prompt, 60, GREEDY, torch.Generator())
    spec = generate_cached(model, prompt, 60, GREEDY, torch.Generator(), draft_k=2)
    full = generate_recompute(model, prompt, 60, GREEDY, torch.Generator(), context=1024)
    assert plain.tokens == spec.tokens == full.tokens
    assert len(spec.tokens) == 60 and plain.forwards == 60
    assert spec.drafted > 0 and 0 < spec.accepted <= spec.drafted
    assert spec.forwards == 60 - spec.accepted  # every accepted draft saved one forward


class ToyModel(torch.nn.Module):
    """Logits depend on the whole prefix (a stale cache shows); each draft is right or wrong by a coin of its position.

    The cache is the token list itself; forward_cached keeps cache[:start], as the contract says."""

    def __init__(self, vocab: int, heads: int, right: float, salt: int):
        super().__init__()
        self.vocab, self.heads, self.right, self.salt = vocab, heads, right, salt

    def _logits(self, prefix: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.salt, *prefix)) % (1 << 62))
        return torch.randn(self.vocab, generator=g) * 3

    def greedy_after(self, prefix: list[int], steps: int) -> list[int]:
        out = list(prefix)
        for _ in range(steps):
            out.append(int(torch.argmax(self._logits(out))))
        return out[len(prefix) :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x[0].tolist()
        return torch.stack([self._logits(ids[: t + 1]) for t in range(len(ids))])[None]

    def forward_cached(self, x, cache, start):
        ids = (cache or [])[:start] + x[0].tolist()
        logits = torch.stack([self._logits(ids[: t + 1]) for t in range(start, len(ids))])
        drafts = []
        for t in range(start, len(ids)):
            truth = self.greedy_after(ids[: t + 1], self.heads + 1)[1:]
            rows = []
            for j, tok in enumerate(truth):
                coin = hash((self.salt, t, j, *ids[: t + 1])) % 1000 < self.right * 1000
                row = torch.zeros(self.vocab)
                row[tok if coin else (tok + 1) % self.vocab] = 10.0
                rows.append(row)
            drafts.append(torch.stack(rows))
        return logits[None], torch.stack(drafts)[None], ids


@settings(max_examples=25, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 11), min_size=1, max_size=6),
    n=st.integers(1, 12),
    heads=st.integers(1, 4),
    draft_k=st.integers(1, 5),
    right=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    salt=st.integers(0, 1000),
)
def test_property_greedy_speculative_equals_plain(prompt, n, heads, draft_k, right, salt):
    model = ToyModel(12, heads, right, salt)
    s = Sampling(temperature=0.0, top_k=0, vocab_size=12)
    plain = generate_cached(model, prompt, n, s, torch.Generator())
    spec = generate_cached(model, prompt, n, s, torch.Generator(), draft_k=draft_k)
    assert plain.tokens == spec.tokens == model.greedy_after(prompt, n)
    assert spec.accepted <= spec.drafted
    assert spec.forwards + spec.accepted == n  # one forward per token, less one per accepted draft
    if right == 1.0:
        assert spec.accepted == spec.drafted


def test_sampled_speculative_keeps_the_model_distribution():
    """Two tokens; p(next | prefix) fixed per prefix; the drafts propose a biased q. The law of the first three
    tokens, from 4,000 speculative draws, is within 0.04 (total variation) of the exact one."""

    class Two(torch.nn.Module):
        def p1(self, ids):  # probability of token 1 after this prefix
            return 0.15 + 0.7 * ((sum(ids) * 7 + len(ids)) % 5) / 4

        def forward_cached(self, x, cache, start):
            ids = (cache or [])[:start] + x[0].tolist()
            p1 = [self.p1(ids[: t + 1]) for t in range(start, len(ids))]
            logits = torch.tensor([[1 - p, p] for p in p1]).log()
            # every head proposes token 1 with probability 0.8, whatever the truth
            drafts = torch.tensor([0.2, 0.8]).log().expand(len(p1), 2, 2)
            return logits[None], drafts[None], ids

    model = Two()
    s = Sampling(temperature=1.0, top_k=0, vocab_size=2)
    prompt = [0, 1]
    counts = dict.fromkeys(itertools.product((0, 1), repeat=3), 0)
    g = torch.Generator().manual_seed(0)
    n_draws = 4000
    for _ in range(n_draws):
        counts[tuple(generate_cached(model, prompt, 3, s, g, draft_k=2).tokens)] += 1
    exact = {}
    for seq in counts:
        prob, ids = 1.0, list(prompt)
        for tok in seq:
            p1 = model.p1(ids)
            prob *= p1 if tok == 1 else 1 - p1
            ids.append(tok)
        exact[seq] = prob
    tv = 0.5 * sum(abs(counts[k] / n_draws - exact[k]) for k in counts)
    assert tv < 0.04, (tv, counts, exact)


# ---- the result the confined process sends back ----


def result(tokens: list[int], **over: object) -> bytes:
    run = dict(mode="plain", cached=True, tokens=tokens, seconds=1.0, forwards=3, drafted=0, accepted=0)
    run.update(over)
    return json.dumps({"format": "pg-generate-result", "format_version": 1, "runs": [run]}).encode()


def test_the_result_is_believed_only_within_bounds():
    ok = parse_result(result([1, 2, 3]), vocab_size=4, max_tokens=3, speculative=False)
    assert ok[0].tokens == [1, 2, 3]
    hostile = [
        result([1, 2, 4]),  # an id past the vocabulary
        result([1, 2, -1]),
        result([1, 2]),  # too few
        result([1, 2, True]),  # not an int
        result([1, 2, 3], seconds=float("nan")),
        result([1, 2, 3], drafted=1, accepted=2),
        b"\xff not json",
        json.dumps({"format": "pg-generate-result", "format_version": 2, "runs": []}).encode(),
    ]
    for raw in hostile:
        with pytest.raises(GenerateFailure):
            parse_result(raw, vocab_size=4, max_tokens=3, speculative=False)
    with pytest.raises(GenerateFailure):  # a speculative run asked for, only the plain one returned
        parse_result(result([1, 2, 3]), vocab_size=4, max_tokens=3, speculative=True)


# ---- end to end, confined ----


def pack_random(folder: Path, out: Path, tmp: Path, config: dict) -> Path:
    model = random_model(folder.name, seed=5, **config)
    if folder.name == "cpu_mtp":
        with torch.no_grad():
            for head in model.mtp_heads:
                head.proj.weight.zero_()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "state.safetensors"))
    pack_state(
        state,
        folder,
        out,
        codec_name="int8_zlib",
        model_config={**SMALL, **config},
        cap_bytes=ARTIFACT_CAP_BYTES,
    )
    return out


def pgolf(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv], capture_output=True, text=True, cwd=REPO, timeout=300
    )


@pytest.mark.long
def test_generate_confined_greedy_speculative_is_plain_and_deterministic(tmp_path, tiny_dataset):
    folder = REPO / "baselines" / "cpu_mtp"
    art = pack_random(folder, tmp_path / "mtp.pgolf", tmp_path, {"keep_mtp_heads": True})
    args = [
        "generate", str(art), "--submission", str(folder), "--data", str(tiny_dataset),
        "--prompt", "The quick brown fox", "--max-tokens", "40", "--speculative", "--threads", "1",
    ]  # fmt: skip
    first, second = pgolf(*args), pgolf(*args)
    assert first.returncode == 0, first.stderr
    assert "identical to plain generation: yes" in first.stdout
    assert "drafts accepted" in first.stdout and "[plain, KV cache:" in first.stdout
    text = first.stdout.split("\n\n[")[0]
    assert text.startswith("The quick brown fox") and second.stdout.split("\n\n[")[0] == text


def test_generate_refuses_drafting_without_heads_and_recomputes_without_a_cache(tmp_path, tiny_dataset):
    folder = REPO / "baselines" / "cpu_moe"
    art = pack_random(folder, tmp_path / "moe.pgolf", tmp_path, {})
    common = ["--submission", str(folder), "--data", str(tiny_dataset), "--prompt", "Hello", "--threads", "1"]
    r = pgolf("generate", str(art), *common, "--max-tokens", "5", "--speculative")
    assert r.returncode == 2, r.stderr
    assert "keeps no multi-token heads" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    naive = REPO / "baselines" / "naive_baseline"
    cfg = dict(vocab_size=1024, num_layers=2, model_dim=64, num_heads=2, num_kv_heads=1)
    state = load_model_module("naive_baseline").build_model(cfg).state_dict()
    pack_state(state, naive, tmp_path / "naive.pgolf", codec_name="int8_zlib", model_config=cfg,
               cap_bytes=ARTIFACT_CAP_BYTES)  # fmt: skip
    common[1] = str(naive)
    r = pgolf("generate", str(tmp_path / "naive.pgolf"), *common, "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert "[plain, full recompute (the model has no forward_cached): 5 tokens" in r.stdout
