"""Config: presets, overrides, and the loud failures on unknown keys and wrong types."""

from __future__ import annotations

import pytest

from harness.config import load_config, parse_override
from tests.conftest import BASELINE, REPO


def test_presets_and_overrides_resolve():
    cfg = load_config(
        BASELINE, "cpu-smoke", ["train.matrix_lr=0.02", "budget.train_s=30", "model.num_layers=3"]
    )
    assert cfg.train["matrix_lr"] == 0.02
    assert cfg.section("budget").train_s == 30.0 and isinstance(cfg.section("budget").train_s, float)
    assert cfg.model["num_layers"] == 3 and cfg.model["model_dim"] == 128
    assert cfg.section("launch").device == "cpu"
    official = load_config(BASELINE, "official")
    assert official.model["num_layers"] == 9 and official.section("launch").nproc_per_node == 8


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.matrix_lrr=0.1", "unknown key 'train.matrix_lrr'"),
        ("bogus.x=1", "unknown section 'bogus'"),
        ("model.num_layers=2.5", "has type float"),
        ("train.compile=1", "has type int"),
        ("launch.device='tpu'", "launch.device must be one of"),
        ("budget.train_s=-1", "budget.train_s must be positive"),
        ("noequals", "expected SECTION.KEY=VALUE"),
        ("train=1", "must be SECTION.KEY"),
    ],
)
def test_bad_overrides_are_refused_clearly(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(BASELINE, "cpu-smoke", [override])


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="presets: cpu, cpu-bench, cpu-smoke, official, one-gpu, tiny"):
        load_config(BASELINE, "nope")


def test_bad_toml_files(tmp_path):
    (tmp_path / "config.toml").write_text("[model]\nx = 1\n[presets.p]\nmodel.y = 2\n")
    with pytest.raises(ValueError, match=r"\[presets.p\]: unknown key 'model.y'"):
        load_config(tmp_path, "p")
    (tmp_path / "config.toml").write_text("[modle]\n")
    with pytest.raises(ValueError, match="unknown table"):
        load_config(tmp_path)
    (tmp_path / "config.toml").write_text("[model\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.toml not found"):
        load_config(tmp_path / "missing")


def test_override_values_are_literals_or_strings():
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override("a.b=cpu") == ("a.b", "cpu")
    assert parse_override("a.b = 3e-4") == ("a.b", 3e-4)


@pytest.mark.parametrize(
    "train_py", sorted((REPO / "baselines").glob("*/train.py")), ids=lambda p: p.parent.name
)
def test_baseline_defaults_live_in_its_config_alone(train_py) -> None:
    """A baseline's [train] defaults are its config.toml's table and nothing else: train.py keeps no
    defaults of its own (no Hparams class) and reads exactly the table's keys as hp.NAME, so a key it reads
    is always there (the harness refuses any other) and no key listed is dead."""
    import ast

    tree = ast.parse(train_py.read_text(encoding="utf-8"))
    assert not [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Hparams"]
    read = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "hp"
    }
    assert read == set(load_config(train_py.parent).train)


def test_the_eval_and_pack_sections_mirror_their_configs():
    """[eval] is EvalConfig and [pack]'s gptq_* keys are GptqConfig, derived (one set of defaults), not repeated."""
    import dataclasses

    from harness.config import EvalSection, PackConfig
    from harness.train.gptq_config import GptqConfig
    from scoring.score.evaluate import EvalConfig
    from scoring.tracks import TRACKS

    def defaults(cls, prefix=""):
        return {prefix + f.name: f.default for f in dataclasses.fields(cls)}

    assert defaults(PackConfig) == {"codec": "int8_zlib", **defaults(GptqConfig, "gptq_")}
    assert defaults(EvalSection) == {k: 0 if v is None else v for k, v in defaults(EvalConfig).items()}
    assert list(defaults(EvalSection)) == list(defaults(EvalConfig))  # the record's key order
    section = EvalSection(mode="sliding", stride=64, max_tokens=0)
    smoke = dataclasses.replace(TRACKS["smoke"], eval_max_tokens=5000)
    assert section.to_eval_config(smoke) == EvalConfig(mode="sliding", stride=64, max_tokens=5000)
    cpu = section.to_eval_config(TRACKS["cpu_10min_16mb"])
    assert (cpu.max_tokens, cpu.max_docs) == (None, 1_700)  # the CPU record track's subset: documents
    assert EvalSection().to_eval_config(None) == EvalConfig()  # 0 back to None
    pack = PackConfig(gptq_batches=2, gptq_seq_len=64, gptq_batch_tokens=128, codec="int6_zlib9")
    assert pack.gptq() == GptqConfig(batches=2, seq_len=64, batch_tokens=128)


def test_a_mirrored_section_follows_its_source():
    import dataclasses

    from harness.config import mirrored, unmirrored

    @dataclasses.dataclass(frozen=True)
    class Source:
        width: int = 3
        limit: int | None = None

    @dataclasses.dataclass(frozen=True, kw_only=True)
    @mirrored(Source, "s_")
    class Section:
        own: str = "x"

    assert [(f.name, f.default) for f in dataclasses.fields(Section)] == [
        ("own", "x"),
        ("s_width", 3),
        ("s_limit", 0),
    ]
    assert unmirrored(Section(s_width=5), Source, "s_") == {"width": 5, "limit": None}
    assert unmirrored(Section(s_limit=7), Source, "s_") == {"width": 3, "limit": 7}
