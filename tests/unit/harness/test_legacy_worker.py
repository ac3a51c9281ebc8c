"""`pgolf verify-legacy` runs a record's code only in the confined model worker, and reads the record
folders as the reference repository has them (compressors, byte shuffle, self-extracting scripts),
refusing with one clear line what this machine cannot run."""

from __future__ import annotations

import base64
import io
import lzma
import os
import sys
import zlib
from typing import Any

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.score.evaluate import EvalConfig
from scoring.score.legacy import score_legacy
from scoring.score.probes import ProbeConfig
from scoring.worker.legacy import LegacyError, byte_unshuffle, exec_definitions, read_container
from scoring.worker.legacy_script import read_hyperparameters, script_source
from tests.conftest import REPO
from tests.unit.scoring.test_eval_support import _one_thread  # noqa: F401 (fixture)

TINY = REPO / "tests" / "fixtures" / "legacy" / "tiny_record" / "train_gpt.py"
CFG = EvalConfig(seq_len=32, batch_seqs=8, max_tokens=512)

HOSTILE = """
import os
import torch
from torch import nn

TARGET = {target!r}


class Hyperparameters:
    vocab_size = int(os.environ.get("VOCAB_SIZE", 260))
    train_seq_len = int(os.environ.get("TRAIN_SEQ_LEN", 32))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.leaked = len(open(TARGET, "rb").read(64))  # the validation shard, or the scorer's memory
        self.emb = nn.Embedding(vocab_size, vocab_size)

    def forward_logits(self, input_ids):
        return self.emb(input_ids)
"""


def hostile_record(tmp_path, target):
    rec = tmp_path / "record"
    rec.mkdir()
    (rec / "train_gpt.py").write_text(HOSTILE.format(target=str(target)), encoding="utf-8")
    buf = io.BytesIO()  # an artifact the model fits: it would score if the read were allowed
    torch.save(
        {
            "__quant_format__": "int8_clean_per_row_v1",
            "quantized": {},
            "scales": {},
            "dtypes": {},
            "passthrough": {"emb.weight": torch.randn(260, 260)},
        },
        buf,
    )
    (tmp_path / "a.ptz").write_bytes(zlib.compress(buf.getvalue()))
    return rec


@pytest.mark.parametrize("what", ["validation shard", "scorer environ", "scorer memory map"])
def test_record_code_cannot_reach_the_data_or_the_scorer(tmp_path, tiny_dataset, what):
    target = {
        "validation shard": sorted(tiny_dataset.glob("*val_*.bin"))[0],
        "scorer environ": f"/proc/{os.getpid()}/environ",
        "scorer memory map": f"/proc/{os.getpid()}/maps",
    }[what]
    assert open(target, "rb").read(1)  # readable here, in the scorer
    rec = hostile_record(tmp_path, target)
    with pytest.raises(
        LegacyError, match=r"failed in the model worker \(error\): (PermissionError|FileNotFoundError)"
    ):
        score_legacy(rec, tmp_path / "a.ptz", tiny_dataset, cfg=CFG, probe_cfg=ProbeConfig(probes=0))


@pytest.mark.long
def test_the_hostile_record_scores_when_it_reads_nothing(tmp_path, tiny_dataset):
    """The control: the same record reading its own script scores, so the refusals above are the sandbox's."""
    rec = hostile_record(tmp_path, tmp_path / "record" / "train_gpt.py")
    out = score_legacy(rec, tmp_path / "a.ptz", tiny_dataset, cfg=CFG)
    assert out["probes"]["passed"] and out["val_tokens"] == 512 and out["worker"]["isolation"]


def self_extracting(source: str, raw: bool = True) -> str:
    if raw:
        blob = lzma.compress(source.encode(), format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
        tail = ',format=L.FORMAT_RAW,filters=[{"id":L.FILTER_LZMA2}]'
    else:
        blob, tail = lzma.compress(source.encode()), ""
    enc = base64.b85encode(blob).decode()
    return f'import lzma as L,base64 as B\nexec(L.decompress(B.b85decode("{enc}"){tail}))\n'


@pytest.mark.parametrize("raw", [True, False])
def test_self_extracting_scripts_are_decoded_as_data(tmp_path, raw):
    source = TINY.read_text(encoding="utf-8")
    (tmp_path / "train_gpt.py").write_text(self_extracting(source, raw), encoding="utf-8")
    decoded, packaging = script_source(tmp_path / "train_gpt.py")
    assert decoded == source and packaging == ["self-extracting (lzma + base85)"]
    assert read_hyperparameters(tmp_path / "train_gpt.py", {})["model_dim"] == 136
    (tmp_path / "b.py").write_text('exec(open(__file__.replace("b.py","c.py")).read())\n')
    (tmp_path / "c.py").write_text(source)
    assert script_source(tmp_path / "b.py") == (source, ["exec of c.py"])


MODEL_WITH_FA3 = """
import torch
from torch import nn
from flash_attn_interface import flash_attn_func as fa3


class Hyperparameters:
    vocab_size = 260


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()

    def forward(self, x, y):
        return fa3(x, x, x)
"""


def test_what_the_machine_lacks_is_refused_in_one_line(tmp_path, tiny_dataset):
    (tmp_path / "r").mkdir()
    (tmp_path / "a.ptz").write_bytes(b"x")
    (tmp_path / "r" / "train_gpt.py").write_text(MODEL_WITH_FA3)
    with pytest.raises(LegacyError, match=r"needs flash_attn_interface \(FlashAttention 3, CUDA only\)"):
        score_legacy(tmp_path / "r", tmp_path / "a.ptz", tiny_dataset, cfg=CFG)
    # used only by main() (training): not a reason to refuse
    (tmp_path / "r" / "train_gpt.py").write_text(
        MODEL_WITH_FA3.replace("return fa3(x, x, x)", "return x") + "\ndef main():\n    fa3()\n"
    )
    import ast

    from scoring.worker.legacy_script import missing_modules

    assert missing_modules(ast.parse((tmp_path / "r" / "train_gpt.py").read_text())) == []
    if sys.version_info < (3, 12):  # PEP 701 f-strings (Python 3.12) in an April record
        (tmp_path / "r" / "train_gpt.py").write_text('d = {"a": 1}\nx = f"{d["a"]}"\n')
        with pytest.raises(LegacyError, match=r"needs Python >= 3.12 \(line 2 uses the f-string syntax"):
            score_legacy(tmp_path / "r", tmp_path / "a.ptz", tiny_dataset, cfg=CFG)


def test_a_dropped_class_field_drops_the_fields_that_read_it(tmp_path):
    (tmp_path / "s.py").write_text(
        "import os\n_X = 'train_*.bin'\nclass Hyperparameters:\n"
        "    data_path = os.environ.get('DATA_PATH', './data')\n"
        "    train_files = os.path.join(data_path, _X)\n"
        "    pattern = train_files + '.idx'\n"
        "    layers = 11\n"
        "    deeper = layers + 1\n"
    )
    ns, skipped = exec_definitions(tmp_path / "s.py")
    hp = ns["Hyperparameters"]
    assert (
        hp.layers == 11 and hp.deeper == 12 and not hasattr(hp, "pattern") and not hasattr(hp, "train_files")
    )
    assert any("Hyperparameters.pattern (reads a dropped field)" in s for s in skipped)
    assert read_hyperparameters(tmp_path / "s.py", {})["data_path"] == "./data"


def _shuffle(data: bytes, stride: int, header_bytes: int = 2) -> bytes:  # the records' writers, restated
    planes = b"".join(data[s::stride] for s in range(stride))
    return b"BSHF" + stride.to_bytes(header_bytes, "little") + planes


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 9))
def test_byte_unshuffle_inverts_both_of_the_records_shuffles(data, stride):
    container = b"PK\x03\x04" + data  # what torch.save writes
    assert byte_unshuffle(_shuffle(container, stride)) == container  # March: 2-byte stride
    if stride >= 2:
        assert byte_unshuffle(_shuffle(container, stride, header_bytes=1)) == container  # April: 1 byte
    if data[:4] != b"BSHF":
        assert byte_unshuffle(data) == data  # no header: left as it is


@pytest.mark.parametrize("compressor", ["zlib", "zstd", "lzma", "brotli"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_every_compressor_the_records_used_is_read(tmp_path, compressor, shuffled):
    obj: dict[str, Any] = {"w": {"a": torch.arange(12, dtype=torch.int8).view(3, 4)}, "m": {"a": "int6"}}
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = _shuffle(buf.getvalue(), 2) if shuffled else buf.getvalue()
    pack = {
        "zlib": lambda b: zlib.compress(b, 9),
        "zstd": lambda b: zstandard.ZstdCompressor(level=22).compress(b),
        "lzma": lambda b: lzma.compress(b, preset=9),
        "brotli": lambda b: pytest.importorskip("brotli").compress(b, quality=11),
    }[compressor]
    (tmp_path / "a.ptz").write_bytes(pack(payload))
    got, how = read_container(tmp_path / "a.ptz")
    assert isinstance(got, dict)
    assert torch.equal(got["w"]["a"], obj["w"]["a"]) and got["m"] == obj["m"]
    assert how.startswith(compressor) and how.endswith("byte-shuffle") == shuffled


def test_the_flash_attention_stand_in_is_causal_grouped_attention(tmp_path):
    import ast

    from scoring.worker.legacy import FALLBACKS
    from scoring.worker.legacy_script import refuse_missing

    torch.manual_seed(0)
    B, T, H, Hkv, D = 2, 7, 4, 2, 8
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
    y = FALLBACKS["flash_attn_interface"]["flash_attn_func"](q, k, v, causal=True)
    kk, vv = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, kk) / D**0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), vv)
    assert y.shape == (B, T, H, D) and torch.allclose(y, want, atol=1e-5)
    tree = ast.parse(MODEL_WITH_FA3)
    with pytest.raises(LegacyError, match="--fallback flash_attn_interface runs it on PyTorch"):
        refuse_missing(tree, tmp_path / "train_gpt.py")
    refuse_missing(tree, tmp_path / "train_gpt.py", ("flash_attn_interface",))  # asked for: no refusal


def test_gpt_arguments_read_from_mains_locals_are_carried_to_the_worker(tmp_path):
    import ast

    from scoring.worker.legacy import gpt_arguments
    from scoring.worker.legacy_script import gpt_call

    src = (
        "import os\nclass Hyperparameters:\n    dim = int(os.environ.get('DIM', 8))\n"
        "    layers_str = os.environ.get('LAYERS', '1,3').strip()\n"
        "def parse(s):\n    return [int(x) for x in s.split(',') if x]\n"
        "class GPT:\n    def __init__(self, dim, layers, deep=False):\n        pass\n"
        "def main():\n    args = Hyperparameters()\n    layers = parse(args.layers_str)\n"
        "    unused = 5\n    model = GPT(dim=args.dim, layers=layers, deep=bool(layers))\n"
    )
    tree = ast.parse(src)
    hp = {"dim": 8, "layers_str": "1,3"}
    kw, exprs, locs = gpt_call(tree, tmp_path / "s.py", hp)
    assert kw == {"dim": 8} and exprs == {"layers": "layers", "deep": "bool(layers)"}
    assert locs == [("layers", "parse(args.layers_str)")]  # not `args = Hyperparameters()`, not `unused`
    ns = {"parse": lambda s: [int(x) for x in s.split(",") if x]}
    spec = {"gpt_kwargs": kw, "gpt_call": exprs, "gpt_locals": locs, "hyperparameters": hp}
    assert gpt_arguments(spec, ns) == {"dim": 8, "layers": [1, 3], "deep": True}
