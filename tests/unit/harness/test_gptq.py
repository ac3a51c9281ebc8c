"""GPTQ as a pack step (harness/train/gptq.py): the algorithm's properties, and its grid kept by the codec."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from harness.train.gptq import apply_gptq, codec_bits, gptq_quantize
from harness.train.gptq_config import GptqConfig
from scoring.artifact.codecs import get_codec
from scoring.artifact.codecs.rowquant import quantize_rows


def _correlated(rows: int, cols: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, X): X's columns strongly correlated (as a layer's inputs are), W with an outlier or two."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g) @ torch.randn(8, cols, generator=g) + 0.1 * torch.randn(
        n, cols, generator=g
    )
    w = torch.randn(rows, cols, generator=g) * 0.05
    w[0, 0] = 0.6
    return w, x


def _output_err(x: torch.Tensor, w: torch.Tensor, w_q: torch.Tensor) -> float:
    return float((x.double() @ (w.double() - w_q.double()).T).square().sum())


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([5, 6, 8]), block=st.sampled_from([7, 32, 128]))
def test_gptq_lowers_the_layers_output_error_against_rounding(seed, bits, block):
    w, x = _correlated(24, 96, 1024, seed)
    q_rtn, s16 = quantize_rows(w, bits)
    s = s16.float()
    qmax = 2 ** (bits - 1) - 1
    q = gptq_quantize(w, x.T @ x, s, qmax, block)
    assert torch.equal(q, q.round()) and int(q.abs().max()) <= qmax
    err_gptq = _output_err(x, w, q * s[:, None])
    err_rtn = _output_err(x, w, q_rtn.float() * s[:, None])
    assert err_gptq < 0.7 * err_rtn, (err_gptq, err_rtn)


def test_with_uncorrelated_inputs_gptq_is_plain_rounding():
    """H diagonal: no column's error has anywhere to go, so every column rounds to nearest (the block
    size does not matter), and an input never seen (diag 0) gets q = 0."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 40, generator=g)
    h = torch.diag(torch.rand(40, generator=g) + 0.5)
    h[5, 5] = 0.0
    s = torch.full((16,), 0.07)
    q = gptq_quantize(w, h, s, 31, 16)
    expected = torch.clamp(torch.round(w / s[:, None]), -31, 31)
    expected[:, 5] = 0
    assert torch.equal(q, expected)


class TinyLM(nn.Module):
    """An embedding, two linears whose weights the codec quantises (>= 4,096 elements), a tied head."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(64, 64)
        self.mlp = nn.ModuleDict(
            {"fc": nn.Linear(64, 128, bias=False), "proj": nn.Linear(128, 64, bias=False)}
        )
        self.norm_gain = nn.Parameter(torch.ones(64))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(idx)
        h = h + self.mlp["proj"](torch.relu(self.mlp["fc"](h)))
        return (h * self.norm_gain) @ self.tok_emb.weight.T


def test_apply_gptq_hands_over_integers_the_codec_keeps_exactly():
    torch.manual_seed(0)
    model = TinyLM()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    reads: list[tuple[int, int]] = []

    def next_batch(tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        reads.append((tokens, seq_len))
        t = torch.randint(0, 64, (tokens + 1,), generator=g)
        return t[:-1].view(-1, seq_len), t[1:].view(-1, seq_len)

    cfg = GptqConfig(batches=3, batch_tokens=256, seq_len=32, block_size=16)
    codec_spec = "int6_zlib9"
    out, record = apply_gptq(
        state,
        model=TinyLM(),
        codec_roles=codec_bits(codec_spec),
        next_batch=next_batch,
        cfg=cfg,
        log=lambda m: None,
    )
    assert (
        reads == [(256, 32)] * 3 and record["tokens_read"] == 768 and record["rows_rerounded_by_codec"] == 0
    )
    assert record["matrices"] == ["mlp.fc.weight", "mlp.proj.weight"]
    assert record["left_to_codec"] == [
        "tok_emb.weight"
    ]  # an embedding, read by no nn.Linear: rounded by the codec
    for name in record["matrices"]:
        assert out[name].dtype == torch.float32 and not torch.equal(out[name], state[name])
    assert torch.equal(out["tok_emb.weight"], state["tok_emb.weight"])
    decoded = get_codec(codec_spec).decode(get_codec(codec_spec).encode(out))
    for name in record["matrices"]:  # GPTQ's integers, not a re-rounding
        assert torch.equal(decoded[name], out[name]), name


def test_only_a_per_row_integer_codec_takes_gptq():
    for spec in ("int8_zlib", "submission"):
        try:
            codec_bits(spec)
        except ValueError as e:
            assert "per-row integer codec" in str(e) or "submission folder" in str(e)
        else:
            raise AssertionError(f"{spec} accepted")
    bits = codec_bits("mixed_zstd22:mlp=int5,attention=int6")
    assert bits("blocks.0.mlp.fc.weight", torch.zeros(64, 64)) == 5
    assert bits("blocks.0.attn.c_q.weight", torch.zeros(64, 64)) == 6
    assert bits("tok_emb.weight", torch.zeros(64, 64)) == 8
    assert bits("blocks.0.attn_scale", torch.zeros(64)) is None
