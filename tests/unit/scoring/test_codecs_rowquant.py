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

from scoring.artifact.codec_names import rowquant_names
from scoring.artifact.codecs import CODEC_GRAMMAR, CODECS, check_codec_spec, get_codec
from scoring.artifact.codecs.compress import COMPRESSORS
from scoring.artifact.codecs.rowquant import (
    CLIP_K,
    GRID_STEPS,
    ROLE_TABLE_DEFAULT,
    SMALL_NUMEL,
    RowQuantCodec,
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
    "int5_zlib9": "06c8aa4520098249b93638acbb6f66597bf391eb3f6da338c66381564567c53e",
    "int5_zlib9_shuffle": "203b21c7eb3f8eba7f046ef357e56404e321f692bfeb5feb5e3e6e411a3ce181",
    "int5_zstd22": "c4a161bd5b70c57d924eaffd448c19ba8af8268ff4dd6df5e6c54179f56d7e72",
    "int5_zstd22_shuffle": "afd0c9f4529d29e14ed7b0647d78896280b5abb35392e046596fd129d2448659",
    "int5_lzma9": "b08a73d6d5604b31f6a1db470eacd4dbbdda67374cf8d380af57985b62b93fd8",
    "int5_lzma9_shuffle": "6f456ca755417e1d12e31dd70d46513145bc587a0cd37624d9706c34b3749408",
    "int5_brotli11": "e6f22347aa67df0ed372f0e28cdfca47d09ef25606ef145c28d0f9c23f4b4ef3",
    "int5_brotli11_shuffle": "688d89df63a516f697e6140bfdec36384a4f58d07d7912963c9619f568ddaf60",
    "int6_zlib9": "c06e1d9262bef6d611e8b34f9f7f1ad4013414a82c151e646ab2073d300291ad",
    "int6_zlib9_shuffle": "faa0d342363065f481be83947d0903afd8dcb241abe642e8264d365b420e9ddb",
    "int6_zstd22": "e3eec774c7d41fbcec6899d27553a8eed5a80ad33860c0dc413fea52eaa3784d",
    "int6_zstd22_shuffle": "abf2f9c4f2553c65bf0fb70d3b36d74a595414f7ceb3d606efab30bc49fe938c",
    "int6_lzma9": "a1d0003503908fe7461f99ad60199ba518c11fe99c5511acf386b6ff038789cb",
    "int6_lzma9_shuffle": "65b7d8a9084474813de25a540466619ecce1f33e6b93d338b300cfff3dc2d25e",
    "int6_brotli11": "6fa19e022bbc59427b8fa490c58fe9e2d51750ca25732dbba18f0de966b44943",
    "int6_brotli11_shuffle": "3d6beb38fd9925edb55aba50cedb29b0619667c2a87131559572c4fd92b7b62c",
    "int7_zlib9": "cc1f1ec45de076746c8c04e3bae33364296396dcca79bf78dd3cbb89f6b01842",
    "int7_zlib9_shuffle": "74d5c6ec87804b0ecd1a22baf3579aa5f7ba2e40a5265a341d461caf0806188d",
    "int7_zstd22": "6b77e4b4baf6b441d4787f73ff72b3f0205a19c81ffb920cc68565fcfd5cca4f",
    "int7_zstd22_shuffle": "79b33ffabe48cee50690bf83eed5deeb19cd8f9b429fcb5708ee7fd0b0fafffd",
    "int7_lzma9": "461aa1c5051b08e700f2934556720cab62d4739fa1f65ef7a23efb262e537e53",
    "int7_lzma9_shuffle": "3591d1846fadabc485c27b3062a28d8b8726b0747f4b85fb8044269fb25018a2",
    "int7_brotli11": "e0b85bea34b72b210a6f2f44bd2f50fc81a640553657f930b4ee167e71592469",
    "int7_brotli11_shuffle": "001850e146dec67ce09bcc41435f6c6accb8fe3ea881a347c8b6b4571632f5e7",
    "int8_zlib9": "945e7d73e4a99e09763558056a4eadb57b3ee1d1c97add10802c4e8975f2a5e7",
    "int8_zlib9_shuffle": "bfe61cad6c0e8554f19b817f0df874524cd6fdeda403ff2cc73f171ee35cdac6",
    "int8_zstd22": "6795ab24628c37749933705d151c48fa96a2ecf79fbc2841d9af38a22bf18421",
    "int8_zstd22_shuffle": "39ea796d68b1eb114c61afa8e29b657559c38661a967c61263404d99eddae9a0",
    "int8_lzma9": "15676bd630c34e23aa1dcc4779bec4d2ad37c46414deeb3f667752cc62e15d73",
    "int8_lzma9_shuffle": "e7da3d221a88d5105231fa29ec11cb99f1fa36386fbe4a458bed73d1e9178669",
    "int8_brotli11": "cbc76963ed3f2e3d481d3cbe5ea68d83f1dff92d3de58d6392b9fc08e0ad2ae7",
    "int8_brotli11_shuffle": "a58da29416dd6948e87081f6999c76f0a9b9370207bc61c66b132265541c9f29",
    "mixed_zlib9": "b6d864df1081bdf4b10cf76b70626ab38d72bb082f0b195a579079b32daaa899",
    "mixed_zlib9_shuffle": "3751b04af04ee86d56fafedce9cdc226f285f842544cff47fadf3130b9c5e072",
    "mixed_zstd22": "6ddba6b55d79ed927249d3a6d65350cc58720c2b0e5d23900e18b53d5542aba0",
    "mixed_zstd22_shuffle": "98d8ac5e89a7a4ab81d17beb1574de640414aa507370f23f7173cc271197c1aa",
    "mixed_lzma9": "bd5bf9ea157e697eeb5fa740f97856bef2c58c0e65e0c5c27aba214ba72d9f9b",
    "mixed_lzma9_shuffle": "7f14faac75859cdb50987807e21843ccfdd9e7116b5ecef7291e5dbff4bc251a",
    "mixed_brotli11": "cd49c4d69a7213007b005578a50d75a209f3bfb63c8ac6bdb7cf1564b0665104",
    "mixed_brotli11_shuffle": "f2e3aaa7f88742d21aa081e2df5e26ffa81c7fa1ecf0b91f2c2a3b6fb629f092",
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
    assert len(ROWQUANT) == 5 * 4 * 2 == len(rowquant_names())
    for n in ("int6_zstd22", "int6_brotli11_shuffle", "int5_lzma9", "mixed_brotli11_shuffle", "int7_zlib9"):
        assert n in CODECS and CODECS[n].name == n and CODECS[n].version == 2
    assert "int8_zlib" in CODECS and CODECS["int8_zlib"].name == "int8_zlib"


def test_hand_worked_rows():
    q, s = quantize_rows(torch.tensor([[1.0, -1.0] * 50]), 6)
    assert s.dtype == torch.float16 and s.tolist() == [0.032257080078125]
    assert q.dtype == torch.int8 and q[0, :4].tolist() == [31, -31, 31, -31]
    assert (q.float() * s.float()[:, None])[0, :2].tolist() == [0.999969482421875, -0.999969482421875]
    row = torch.full((1, 100), 0.1)
    row[0, 0] = 10.0
    q, s = quantize_rows(row, 6)
    # clip = amax gives s = fp16(10/31) = 0.322509765625 and 31 s = 9.997802734375 (error 2.2e-3); the grid
    # candidate m = 28 gives s = fp16(10/28) = 0.357177734375 and 28 s = 10.0009765625 (error 9.8e-4): kept
    assert s.tolist() == [0.357177734375]
    assert q[0, 0].item() == 28 and torch.count_nonzero(q[0, 1:]) == 0
    assert (q.float() * s.float())[0, 0].item() == 10.0009765625


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
    clips = [amax if math.isinf(k) else torch.minimum(rms * k, amax) for k in CLIP_K]
    clips += [amax * qmax / m for m in range(qmax - 1, qmax - 1 - GRID_STEPS, -1)]  # the grid candidates
    for k, clip in enumerate(clips):  # an independent evaluation of every candidate, in float64
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
@given(
    seed=st.integers(0, 2**31 - 1),
    bits=st.sampled_from([5, 6, 7, 8]),
    scale_exp=st.integers(-14, 2),
    below=st.integers(0, GRID_STEPS),
)
def test_weights_already_on_the_grid_are_kept_exactly(seed, bits, scale_exp, below):
    """A row q * s (fp16 s, integer q with max |q| = qmax - below, below <= GRID_STEPS), as GPTQ
    (harness/train/gptq.py) hands it over, comes back bit for bit: the candidate s = amax / max|q| is
    the row's own s, with zero error."""
    g = torch.Generator().manual_seed(seed)
    qmax = 2 ** (bits - 1) - 1
    top = qmax - below
    q = torch.randint(-top, top + 1, (8, 64), generator=g)
    q[:, 0] = top * torch.where(torch.rand(8, generator=g) < 0.5, -1, 1)
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
