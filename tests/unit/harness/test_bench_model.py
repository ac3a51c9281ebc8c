"""`pgolf bench model`'s verdict (harness/bench/model.py boundedness): which limit a forward is near."""

from __future__ import annotations

from harness.bench.model import bandwidth_bytes_per_s, boundedness

MiB = 2**20
BASE = dict(tokens_per_batch=2048, flops_per_token=1e6, peak_flop_per_s=1e11, bandwidth=1e10)


def test_compute_bound_when_the_forward_reaches_half_the_matmul_peak() -> None:
    line = boundedness(weight_bytes=64 * MiB, l3_bytes=32 * MiB, tokens_per_s=6e4, **BASE)  # 6e10 FLOP/s
    assert line.startswith("compute-bound here") and "60%" in line


def test_bandwidth_bound_only_when_the_weights_do_not_fit_in_l3() -> None:
    light = {**BASE, "flops_per_token": 1e4}  # 4 % of the peak at 400,000 tokens/s
    # 64 MiB per 2,048-token batch at 400,000 tokens/s: 13.1 GB/s of weights read, over half the 10 GB/s
    big = boundedness(weight_bytes=64 * MiB, l3_bytes=32 * MiB, tokens_per_s=4e5, **light)
    assert big.startswith("bandwidth-bound here")
    small = boundedness(weight_bytes=16 * MiB, l3_bytes=32 * MiB, tokens_per_s=1.6e6, **light)
    assert small.startswith("cache-resident here")  # the same read rate, but the weights stay in L3
    slow = boundedness(weight_bytes=64 * MiB, l3_bytes=32 * MiB, tokens_per_s=5e4, **light)
    assert slow.startswith("overhead-bound here")
    unknown = boundedness(weight_bytes=1 * MiB, l3_bytes=None, tokens_per_s=50, **light)
    assert unknown.startswith("overhead-bound here") and "L3 unknown" in unknown


def test_bandwidth_probe_measures_a_positive_rate() -> None:
    assert bandwidth_bytes_per_s(nbytes=8 * MiB, repeats=2) > 1e7
