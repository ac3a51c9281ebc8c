"""The scorer's loss kernel: blocked, in-place float64 log-softmax, bit-identical to the plain formula.

`nats_of(out, y, ws=LossWorkspace())` is what the scorer runs on every batch; it must give exactly
-F.log_softmax(out.double())[y] for every row, whatever the block size, the row count (blocks that do
not divide it), the buffer's reuse across calls of different shapes, and -inf logits off the target.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.score.evaluate import LossWorkspace, nats_of


def _reference(out_NV: torch.Tensor, y_N: torch.Tensor) -> torch.Tensor:
    return -F.log_softmax(out_NV.double(), dim=-1).gather(-1, y_N[:, None]).squeeze(-1)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few rows, so that every call crosses block boundaries."""
    monkeypatch.setattr(LossWorkspace, "BLOCK_BYTES", 8 * 64 * 5)  # 5 rows of V=64 per block


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 23),
    v=st.sampled_from([1, 2, 64, 257]),
    scale=st.sampled_from([0.0, 1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**16),
)
def test_workspace_loss_is_bit_identical_to_plain_log_softmax(n, v, scale, seed):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(n, v, generator=g) * scale
    y = torch.randint(0, v, (n,), generator=g)
    ws = LossWorkspace()
    ws.BLOCK_BYTES = 8 * v * 3  # 3 rows per block
    got = nats_of(out, y, ws=ws)
    assert got.dtype == torch.float64
    assert torch.equal(got, _reference(out, y))


def test_one_workspace_serves_batches_of_different_shapes(small_blocks):
    ws = LossWorkspace()
    g = torch.Generator().manual_seed(1)
    for n, v in [(17, 64), (3, 64), (40, 64), (9, 32), (17, 64)]:
        out = torch.randn(n, v, generator=g) * 5
        y = torch.randint(0, v, (n,), generator=g)
        assert torch.equal(nats_of(out, y, ws=ws), _reference(out, y)), (n, v)


def test_uniform_logits_give_exactly_log_v(small_blocks):
    out = torch.zeros(11, 256)
    y = torch.arange(11)
    assert nats_of(out, y, ws=LossWorkspace()).tolist() == [math.log(256)] * 11


def test_minus_inf_off_target_is_probability_zero_and_at_target_is_refused(small_blocks):
    out = torch.zeros(7, 64)
    out[:, 1:] = -math.inf  # all mass on token 0
    assert nats_of(out, torch.zeros(7, dtype=torch.long), ws=LossWorkspace()).tolist() == [0.0] * 7
    with pytest.raises(ValueError, match="probability of zero"):
        nats_of(out, torch.ones(7, dtype=torch.long), ws=LossWorkspace())
    out[3, 5] = math.nan
    with pytest.raises(ValueError, match="non-finite logits"):
        nats_of(out, torch.zeros(7, dtype=torch.long), ws=LossWorkspace())


def test_float16_and_bfloat16_logits_are_widened_exactly(small_blocks):
    g = torch.Generator().manual_seed(2)
    for dt in (torch.float16, torch.bfloat16):
        out = (torch.randn(13, 64, generator=g) * 4).to(dt)
        y = torch.randint(0, 64, (13,), generator=g)
        assert torch.equal(nats_of(out, y, ws=LossWorkspace()), _reference(out, y))
