"""The QUANT_COMPRESSOR[_shuffle] codecs (scoring/artifact/codecs/rowquant.py): round trips, the clip rule,
roles, exact bytes, and the spec grammar.

Hand-worked values (module docstring of rowquant.py), int6 so qmax = 31:
- a row of +-1: rms = amax = 1, so every candidate clips at 1 and the first (k = 2.5) is kept;
  s = fp16(1/31) = 2^-5 * (1 + 33/1024) = 0.032257080078125 and q = +-31 -> +-0.999969482421875.
- a row of 99 x 0.1 and one 10.0: rms = sqrt(1.0099) ~ 1.005. Clipping at k*rms (k <= 8) costs the
  outlier at least (10 - 8.04)^2 = 3.8; clipping at amax = 10 gives s = fp16(10/31) = 0.322509765625,
  every 0.1 rounds to 0 (error 99 * 0.01 = 0.99) and 10 -> 31 * s = 9.997802734375. k = 12 caps at
  amax too (same scale, same error, the smaller k kept), so the row is [9.997802734375, 0, ...].
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoring.artifact.codecs import CODEC_GRAMMAR, CODECS, check_codec_spec, get_codec
from scoring.artifact.codecs.compress import COMPRESSORS
from scoring.artifact.codecs.rowquant import (
    CLIP_K,
    ROLE_TABLE_DEFAULT,
    SMALL_NUMEL,
    RowQuantCodec,
    codec_names,
    parse_codec,
    quantize_rows,
    role_of,
)

ROWQUANT = [n for n in CODECS if n != "int8_zlib"]
FAST = ["int6_zlib9", "int5_zstd22_shuffle", "int7_lzma9", "int8_brotli11_shuffle", "mixed_zstd22"]


def fixed_state() -> dict[str, torch.Tensor]:
    """A small state built from integer arithmetic only (exact on any machine): every role and dtype."""

    def lcg(n: int, seed: int, scale_pow2: int) -> np.ndarray:
        i = np.arange(n, dtype=np.int64)
        v = (i * 1103515245 + 12345 + seed * 7919) % 65536 - 32768  # in [-32768, 32767]
        w = (v * v * v) // (1 << 30)  # heavier tails than uniform, still integers
        return w.astype(np.float32) / np.float32(1 << scale_pow2)

    def t(shape: tuple[int, ...], seed: int, p: int) -> torch.Tensor:
        return torch.from_numpy(lcg(math.prod(shape), seed, p).reshape(shape))

    return {
        "tok_emb.weight": t((96, 64), 1, 12),
        "blocks.0.attn.c_q.weight": t((64, 64), 2, 10),
        "blocks.0.mlp.fc.weight": t((128, 64), 3, 10).to(torch.bfloat16),
        "blocks.0.mlp.proj.weight": t((64, 128), 4, 10).to(torch.float16),
        "head.weight": t((64, 80), 5, 11),
        "blocks.0.attn_scale": t((64,), 6, 14),
        "blocks.0.resid_mix": t((2, 64), 7, 14),
        "skip": t((), 8, 14),
        "steps": torch.tensor([3, -1, 2**40], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


# sha256 of encode(fixed_state()) per codec. Any change of numerics or layout changes one: bump the
# codec's version and say why before regenerating (python -m tests.unit.scoring.test_codecs_rowquant).
GOLDEN_SHA256: dict[str, str] = {
    "int5_zlib9": "f5ceffeaf05e74492de2005c9c71090bf25431df6e5183863d1294f339ede103",
    "int5_zlib9_shuffle": "06384a2da988bd2ac1216abdcc1ad93fa2d4cb09c785c1f26fa7d89f306ee4ab",
    "int5_zstd22": "81847d7fa3b7c88e48fc2c3964abc4784ce1524880a3c48e72b7a6fdd39f1f45",
    "int5_zstd22_shuffle": "bf944b7cb825d6d25701352c5a647a84bd8b8effd5d57500d067a6d5e0caa6ac",
    "int5_lzma9": "6d3fd6bee2c6e930b5db8cf448e0dab9fb0c9eec10d57f85069eff3598800173",
    "int5_lzma9_shuffle": "0edeba492d89bded6e7ee2faa8dce6801a88b4c4a20cd194aea04426e446e66a",
    "int5_brotli11": "44dd8116b66a71c1e07b2ad80988a3e470ad2809fd2dae31b2d77dea2b197db3",
    "int5_brotli11_shuffle": "1ec759639330a9283af0b6898add4a03c148d5651a031a2e88636478d17cb9fe",
    "int6_zlib9": "35daa43b254be00b4ad57bb28a047b14c6c87c667550e6edeee4f7b302409953",
    "int6_zlib9_shuffle": "1bb8dbef3a6993d04266b3f43721e34e7f9863b6a8917bdfc118e45d5e87e0df",
    "int6_zstd22": "28898ee06866e52b35ce302f4f6330eada0cf97ecd3069dff6b89cdedb1046fb",
    "int6_zstd22_shuffle": "1c5b242238318d05a952e3b54371bc45dc33bee84399c18f77ea77a62db52fe5",
    "int6_lzma9": "85606ef867a69949648ac902139d4e88599d505e2fd5aae28493a9cfdcae4e41",
    "int6_lzma9_shuffle": "80059ac79a5f524599e10db17ff943a95f45523fd72c501cb8af9f0968f976bd",
    "int6_brotli11": "77adf13d8b3f96968423332dc40c9bba57b96e93cc71af452a18bc9e29aac6d8",
    "int6_brotli11_shuffle": "3e5ceb083b5bb8324b993302b2a77715c56b92921dc2339acb482a9db3df1eb6",
    "int7_zlib9": "614e1e0233704e6881963b2f831150d2a01477643b7a2efbb1bff4a92340e6cb",
    "int7_zlib9_shuffle": "0864fbd689d8df113c1240613d274ff0fc75bf7a8fb5a342419f7704ea72ed71",
    "int7_zstd22": "bc4d97410610fed021704962ad572362fcda83a00cb391968bf33b06f20b1fe9",
    "int7_zstd22_shuffle": "b7d13d510e6f89eb309e19e34b68d335a1f154488fb38445f46cca07161b7dcc",
    "int7_lzma9": "716a57b6d142cd2a902ea5c1eb2cdd436b5b7411618ee37d83c5314197738959",
    "int7_lzma9_shuffle": "71dd02498e85faf13723532be196b03e4f723fb009a8b03ee73eb891f1bb45f4",
    "int7_brotli11": "5db4cd6ec1eaa976dd301d9f0203950f03b91e66cf62c49da5cde8815d2ea948",
    "int7_brotli11_shuffle": "7b8a18d9cf0029be49aa281a1c3401e42e63e1a68e9dd66f4063bc104bc67dcb",
    "int8_zlib9": "66b4976f14b7492fc5cc4b2681f5c1e39896045db1cc46ec10271252f5ebbc66",
    "int8_zlib9_shuffle": "36e3941b87239b5d5c7cfadbd2492cf2bf1895a78a6214c1507e0a997e2c0e63",
    "int8_zstd22": "c0e955f0b02db38fb25117b8f60c868a01a3ebef2f5a4f95c3b426b55ddd0d47",
    "int8_zstd22_shuffle": "a7fd7d263d7409688d2fb6529a49225ae4b4a06a2828a62c4d66aa57ad102357",
    "int8_lzma9": "b2462c732b30bfa0667c50d3bb6f10c526effc9e5b4b378bc2cfde8607187f0c",
    "int8_lzma9_shuffle": "6e196af7ff4f185ce0cead303112c40bbe324f31db8655ae69f10d5622257769",
    "int8_brotli11": "9494b167aba2171ca5c05fab714def54c7eb6a36850e20a0b38e83c0d7187d6c",
    "int8_brotli11_shuffle": "c2b5b3e106fb565ebee275de0c2c20613814934f3ca5aa2308146d20044ba03e",
    "mixed_zlib9": "e91d5a7c39151994b13cf3570ca92bbfb063e226207e8085c038c6efa384c44e",
    "mixed_zlib9_shuffle": "185b1a6fdf29f6b9540244c0c7980accba594b0e83778ee720569cdc318b4a90",
    "mixed_zstd22": "968c6b1cc356ba99627c17e651e0d32f1d223105cec6a4d849d4ca2a1cc4da4e",
    "mixed_zstd22_shuffle": "26be487f5f5adc65547bc326d47d718d7005bab6227651c8e7ee6fed05291ec5",
    "mixed_lzma9": "3d1f0b2f8530c5f0c302de4953fcdf7f3c6502740f6d7fc8a68f46b8d69cb825",
    "mixed_lzma9_shuffle": "1c96b44a877d4b01f913982a1d4e0a62518a5bf35385c39d6e3bb691125bdf17",
    "mixed_brotli11": "5eeae67e17c8f6b4ec860a863df0b4b1f4d51eb3c8bddaf6f92a53316eb9ffb4",
    "mixed_brotli11_shuffle": "30559a2ef1bb560a19a4488adea5824030c01123aec80b54cadd836eca19d061",
}


def test_golden_bytes_per_codec():
    state = fixed_state()
    got = {n: hashlib.sha256(CODECS[n].encode(state)).hexdigest() for n in ROWQUANT}
    assert set(GOLDEN_SHA256) == set(ROWQUANT)
    changed = {n: got[n] for n in ROWQUANT if got[n] != GOLDEN_SHA256[n]}
    assert not changed, f"payload bytes changed: {changed}"


def test_bytes_do_not_depend_on_torch_threads():
    state = fixed_state()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = CODECS["int6_zlib9"].encode(state)
        torch.set_num_threads(2)
        two = CODECS["int6_zlib9"].encode(state)
    finally:
        torch.set_num_threads(before)
    assert one == two


def test_registry_is_the_grammar():
    assert len(ROWQUANT) == 5 * 4 * 2 == len(codec_names())
    for n in ("int6_zstd22", "int6_brotli11_shuffle", "int5_lzma9", "mixed_brotli11_shuffle", "int7_zlib9"):
        assert n in CODECS and CODECS[n].name == n and CODECS[n].version == 1
    assert "int8_zlib" in CODECS and CODECS["int8_zlib"].name == "int8_zlib"


def test_hand_worked_rows():
    q, s = quantize_rows(torch.tensor([[1.0, -1.0] * 50]), 6)
    assert s.dtype == torch.float16 and s.tolist() == [0.032257080078125]
    assert q.dtype == torch.int8 and q[0, :4].tolist() == [31, -31, 31, -31]
    assert (q.float() * s.float()[:, None])[0, :2].tolist() == [0.999969482421875, -0.999969482421875]
    row = torch.full((1, 100), 0.1)
    row[0, 0] = 10.0
    q, s = quantize_rows(row, 6)
    assert s.tolist() == [0.322509765625]
    assert q[0, 0].item() == 31 and torch.count_nonzero(q[0, 1:]) == 0
    assert (q.float() * s.float())[0, 0].item() == 9.997802734375


def test_zero_rows_come_back_zero():
    q, s = quantize_rows(torch.zeros(3, 50), 5)
    assert s.tolist() == [1.0, 1.0, 1.0] and torch.count_nonzero(q) == 0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 6),
    cols=st.integers(1, 300),
    bits=st.sampled_from([5, 6, 7, 8]),
    scale=st.sampled_from([1e-6, 0.02, 1.0, 300.0]),
    outlier=st.booleans(),
)
def test_clip_rule_keeps_the_least_error_candidate(seed, rows, cols, bits, scale, outlier):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * scale
    if outlier:
        w[0, 0] = 40 * scale
    q, s = quantize_rows(w, bits)
    qmax = 2 ** (bits - 1) - 1
    assert q.dtype == torch.int8 and int(q.abs().max()) <= qmax and s.dtype == torch.float16
    w64 = w.double()
    got_err = ((q.double() * s.double()[:, None]) - w64).square().sum(1)
    rms, amax = w.square().mean(1).sqrt(), w.abs().amax(1)
    for k in CLIP_K:  # an independent evaluation of every candidate, in float64
        clip = amax if math.isinf(k) else torch.minimum(rms * k, amax)
        sc = (clip / qmax).to(torch.float16)
        sc = torch.where(sc == 0, torch.ones_like(sc), sc).double()[:, None]
        cand = torch.clamp(torch.round(w64 / sc), -qmax, qmax) * sc
        cand_err = (cand - w64).square().sum(1)
        assert torch.all(got_err <= cand_err * (1 + 1e-5) + 1e-30), (k, got_err, cand_err)
    # the bound of the no-clip candidate: every element within half a step (plus fp16 scale rounding)
    step = amax.double() / qmax
    bound = step / 2 + amax.double() * 2**-10 + qmax * 2**-25  # float16 scale: relative 2^-11, absolute 2^-25
    assert torch.all(got_err.sqrt() <= math.sqrt(cols) * bound)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([5, 6, 7, 8]), scale_exp=st.integers(-14, 2))
def test_weights_already_on_the_grid_are_kept_exactly(seed, bits, scale_exp):
    """A row q * s (fp16 s, integer q with max |q| = qmax), as a training-time quantiser such as GPTQ
    hands over, comes back bit for bit: the candidate clip = amax gives the same s and zero error."""
    g = torch.Generator().manual_seed(seed)
    qmax = 2 ** (bits - 1) - 1
    q = torch.randint(-qmax, qmax + 1, (8, 64), generator=g)
    q[:, 0] = qmax * torch.where(torch.rand(8, generator=g) < 0.5, -1, 1)
    s = (torch.rand(8, generator=g) + 1).to(torch.float16) * 2.0**scale_exp
    w = q.float() * s.float()[:, None]
    q2, s2 = quantize_rows(w, bits)
    assert torch.equal(q2.long(), q) and torch.equal(s2, s.to(torch.float16))


NAMES = ["tok_emb.weight", "lm_head.weight", "blocks.1.attn.c_k.weight", "blocks.1.mlp.proj.weight",
         "blocks.1.attn_scale", "x.weight", "blocks.0.resid_mix", "q_gain"]  # fmt: skip


@st.composite
def states(draw) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    out: dict[str, torch.Tensor] = {}
    for name in names:
        shape = draw(
            st.sampled_from([(64, 64), (65, 70), (4096, 1), (3, 5), (7,), (), (2, 3, 700), (0, 64), (80, 0)])
        )
        kind = draw(st.sampled_from(["float32", "bfloat16", "float16", "int64", "bool"]))
        scale = draw(st.sampled_from([1e-3, 0.05, 2.0]))
        t = torch.randn(shape, generator=g) * scale
        if kind == "int64":
            t = (t * 1000).long()
        elif kind == "bool":
            t = t > 0
        else:
            t = t.to(getattr(torch, kind))
        out[name] = t
    return out


def _expected_scheme(codec: RowQuantCodec, name: str, t: torch.Tensor) -> str:
    return codec.role_table()[role_of(name, t)] if t.is_floating_point() else "keep"


@pytest.mark.parametrize("name", FAST)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states())
def test_round_trip_is_exact_in_layout_and_bounded_in_value(name, state):
    codec = CODECS[name]
    assert isinstance(codec, RowQuantCodec)
    payload = codec.encode(state)
    assert codec.encode(state) == payload  # deterministic
    out = codec.decode(payload)
    assert list(out) == list(state)
    for k, t in state.items():
        o = out[k]
        assert o.shape == t.shape and o.dtype == t.dtype, k
        scheme = _expected_scheme(codec, k, t)
        if scheme == "keep":
            assert torch.equal(o, t), k
            continue
        x, y = t.double(), o.double()
        cast = {torch.float32: 0.0, torch.float16: 2**-11, torch.bfloat16: 2**-8}[
            t.dtype
        ]  # the dtype's rounding
        if scheme == "fp16":
            assert torch.all((y - x).abs() <= x.abs() * (2**-11 + cast) * 1.01 + 2**-24), k
            continue
        qmax = 2 ** (int(scheme[3:]) - 1) - 1
        amax = x.abs().amax(1)
        # no element moves by more than its row's amax; the row's RMS error is at most the no-clip
        # candidate's: half a step, plus float16 rounding of the scale, plus the dtype's own rounding
        assert torch.all((y - x).abs() <= amax[:, None] * (1 + 2 * cast) + 1e-12), k
        row_rms = (y - x).square().mean(1).sqrt()
        bound = amax * (0.5 / qmax + 2**-10 + cast) + qmax * 2**-25
        assert torch.all(row_rms <= bound + 1e-12), (k, row_rms.max(), bound)


@pytest.mark.parametrize("compressor", list(COMPRESSORS))
def test_shuffle_is_lossless_and_changes_only_the_bytes(compressor):
    state = fixed_state()
    plain, shuffled = CODECS[f"int6_{compressor}"], CODECS[f"int6_{compressor}_shuffle"]
    a, b = plain.decode(plain.encode(state)), shuffled.decode(shuffled.encode(state))
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in state)
    tensors, layout = shuffled.container(state)
    assert tensors["s.tok_emb.weight"].dtype == torch.uint8 and tensors["s.tok_emb.weight"].shape == (2, 96)
    assert tensors["p.steps"].shape == (8, 3) and tensors["q.tok_emb.weight"].dtype == torch.int8
    assert plain.container(state)[0]["s.tok_emb.weight"].dtype == torch.float16


def test_roles_and_the_mixed_table():
    state = fixed_state()
    assert {k: role_of(k, v) for k, v in state.items()} == {
        "tok_emb.weight": "embedding",
        "blocks.0.attn.c_q.weight": "attention",
        "blocks.0.mlp.fc.weight": "mlp",
        "blocks.0.mlp.proj.weight": "mlp",
        "head.weight": "other",
        "blocks.0.attn_scale": "small",
        "blocks.0.resid_mix": "small",
        "skip": "small",
        "steps": "small",
        "mask": "small",
    }
    assert (
        role_of("w", torch.zeros(SMALL_NUMEL - 1, 1)) == "small"
        and role_of("w", torch.zeros(SMALL_NUMEL, 1)) == "other"
    )
    _, layout = CODECS["mixed_zlib9"].container(state)
    schemes = {k: v["scheme"] for k, v in layout["tensors"].items()}
    assert layout["roles"] == ROLE_TABLE_DEFAULT
    assert schemes["tok_emb.weight"] == "int8" and schemes["blocks.0.mlp.fc.weight"] == "int5"
    assert (
        schemes["head.weight"] == "int6"
        and schemes["blocks.0.attn_scale"] == "fp16"
        and schemes["steps"] == "keep"
    )
    custom = get_codec("mixed_zlib9:mlp=keep,embedding=int5, attention=fp16,small=keep")
    assert custom.name == "mixed_zlib9"
    _, layout = custom.container(state)
    schemes = {k: v["scheme"] for k, v in layout["tensors"].items()}
    assert schemes["blocks.0.mlp.fc.weight"] == "keep" and schemes["tok_emb.weight"] == "int5"
    assert schemes["blocks.0.attn.c_q.weight"] == "fp16" and schemes["blocks.0.attn_scale"] == "keep"
    out = CODECS["mixed_zlib9"].decode(custom.encode(state))  # the payload says how it was packed
    assert torch.equal(out["blocks.0.mlp.fc.weight"], state["blocks.0.mlp.fc.weight"])
    _, int7 = CODECS["int7_zstd22"].container(state)
    assert {v["scheme"] for v in int7["tensors"].values()} == {"int8", "int7", "fp16", "keep"}
    assert int7["tensors"]["tok_emb.weight"]["scheme"] == "int8"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("int9_zstd22", "is not a codec"),
        ("int6_zstd21", "is not a codec"),
        ("int6_zstd22_shuffled", "is not a codec"),
        ("mixed_zstd22:foo=int6", "unknown role 'foo'; roles: embedding, attention, mlp, other, small"),
        ("mixed_zstd22:mlp=int4", "mlp='int4' is not a scheme; allowed: int5, int6, int7, int8, fp16, keep"),
        ("mixed_zstd22:small=int6", "small='int6' is not a scheme; allowed: fp16, keep"),
        ("mixed_zstd22:mlp", "'mlp' is not ROLE=SCHEME"),
        ("int6_zstd22:mlp=int5", "takes no role table"),
        ("int8_zlib:mlp=int5", "is not a codec"),
    ],
)
def test_bad_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(ValueError) as e:
        check_codec_spec(spec)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError):
        get_codec(spec)


def test_grammar_names_every_part():
    for part in ("int5", "int8", "mixed", "zlib9", "zstd22", "lzma9", "brotli11", "_shuffle"):
        assert part in CODEC_GRAMMAR
    assert parse_codec("mixed_lzma9_shuffle:mlp=int7").role_table()["mlp"] == "int7"


if __name__ == "__main__":
    s = fixed_state()
    print("GOLDEN_SHA256: dict[str, str] = {")
    for n in ROWQUANT:
        print(f'    "{n}": "{hashlib.sha256(CODECS[n].encode(s)).hexdigest()}",')
    print("}")
