"""A record track runs only with every isolation layer, unless an official allows one missing, on the
command line, recorded (isolation/sandbox.py KERNEL_LAYERS, harness/run/pipeline.py require_isolation)."""

from __future__ import annotations

import pytest

import harness.run.pipeline as pipeline
from harness.cli import main as pgolf_main
from harness.config import load_config
from harness.run.result import card
from isolation.sandbox import MachineCaps, SandboxRefused
from tests.conftest import BASELINE

NO_LANDLOCK = MachineCaps(landlock_abi=0, root=True, unshare="/usr/bin/unshare", overlay=True)
OLD_KERNEL = MachineCaps(
    landlock_abi=1, root=True, unshare="/usr/bin/unshare", overlay=True
)  # Linux 5.15, root
NO_NAMESPACES = MachineCaps(landlock_abi=5, root=False, unshare=None)  # a container without user namespaces
FULL = MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True)


def test_the_allowance_is_the_officials_alone(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    for f in BASELINE.iterdir():
        if f.is_file():
            (sub / f.name).write_bytes(f.read_bytes())
    with (sub / "config.toml").open("a") as f:
        f.write(
            '\n[presets.sneaky]\nrun.track = "cpu_10min_16mb"\nlaunch.allow_missing_layers = "landlock"\n'
        )
    with pytest.raises(ValueError, match="launch.allow_missing_layers is not a submission's to set"):
        load_config(sub, "sneaky")
    with pytest.raises(ValueError, match="unknown isolation layer.*'landlok'.*layers: landlock, namespaces"):
        load_config(BASELINE, "cpu", ["launch.allow_missing_layers='landlok'"])
    cfg = load_config(BASELINE, "cpu", ["launch.allow_missing_layers='landlock,signal_scoping'"])
    assert (
        cfg.tables["launch"]["allow_missing_layers"] == "landlock,signal_scoping"
    )  # recorded in config.json
    assert cfg.loosened == []  # not a loosened track rule: a recorded decision about this machine


def test_a_record_track_without_a_layer_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "probe_machine", lambda: NO_LANDLOCK)
    rc = pgolf_main(["run", str(BASELINE), "--preset", "cpu", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "landlock: Landlock" in err and "--allow-missing-layer landlock" in err
    assert "unmet: no_reads_outside" in err  # the guarantee left without a mechanism
    # signal scoping is missing too (Landlock ABI 0), but the PID namespace gives its guarantee: not refused for it
    assert "--allow-missing-layer signal_scoping" not in err
    assert list(tmp_path.iterdir()) == []  # no run folder, no ledger line: nothing started


def test_an_official_allowance_lets_it_start_and_names_only_what_was_missing(monkeypatch):
    monkeypatch.setattr(pipeline, "probe_machine", lambda: NO_LANDLOCK)
    launch = load_config(BASELINE, "cpu", ["launch.allow_missing_layers='landlock,signal_scoping'"]).section(
        "launch"
    )
    pipeline.require_isolation(launch)
    partial = load_config(BASELINE, "cpu", ["launch.allow_missing_layers='landlock'"]).section("launch")
    pipeline.require_isolation(partial)  # signal scoping's guarantee holds by the PID namespace
    monkeypatch.setattr(pipeline, "probe_machine", lambda: NO_NAMESPACES)
    some = load_config(BASELINE, "cpu", ["launch.allow_missing_layers='namespaces,network_namespace'"])
    with pytest.raises(SandboxRefused, match=r"lacks: world: .*unmet: nothing_shared\)") as e:
        pipeline.require_isolation(some.section("launch"))
    assert "--allow-missing-layer namespaces" not in str(e.value)
    assert "signal_scoping" not in str(e.value)  # its guarantee: the namespaces the official allowed missing
    monkeypatch.setattr(pipeline, "probe_machine", lambda: NO_LANDLOCK)
    monkeypatch.setattr(pipeline, "probe_machine", lambda: FULL)
    pipeline.require_isolation(load_config(BASELINE, "cpu").section("launch"))
    unranked = load_config(BASELINE, "cpu-smoke").section("launch")  # sandbox auto: never refused
    monkeypatch.setattr(pipeline, "probe_machine", lambda: NO_LANDLOCK)
    pipeline.require_isolation(unranked)


def test_the_card_says_when_an_official_allowed_a_missing_layer():
    base = {
        "submission": {"name": "x"},
        "track": "cpu_10min_16mb",
        "preset": "cpu",
        "seed": 1,
        "status": "ok",
        "verification": "unverified",
        "run_dir": "/r",
        "provenance": {"hardware": {"cpu": "cpu", "cuda_devices": []}},
        "cap_bytes": 16_000_000,
        "within_cap": True,
        **dict.fromkeys(
            "val_bpb val_loss unigram_bpb val_tokens val_bytes eval_mode eval_dtype eval_time_s bytes_total "
            "bytes_code bytes_model train_time_s steps tokens_seen world_size".split()
        ),
    }
    assert "official override" not in card({**base, "config": {"launch": {}}})
    text = card({**base, "config": {"launch": {"allow_missing_layers": "landlock,seccomp"}}})
    assert "official override: ran without landlock, seccomp (--allow-missing-layer)" in text


def test_the_score_request_carries_the_allowance_through_its_argv(tmp_path):
    import argparse

    from scoring.score.cli import ScoreRequest, register
    from scoring.score.evaluate import EvalConfig

    def build_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command"))
        return parser

    req = ScoreRequest(
        artifact=tmp_path / "a.pgolf",
        code_dir=tmp_path / "code",
        data_dir=tmp_path / "data",
        eval=EvalConfig(seq_len=64, batch_seqs=2),
        sandbox="required",
        private=(tmp_path / "runs",),
        allow_missing_layers=("seccomp", "landlock"),
    )
    back = ScoreRequest.from_args(build_parser().parse_args(req.to_argv()))
    assert back == req
    with pytest.raises(ValueError, match="--allow-missing-layer: unknown isolation layer"):
        ScoreRequest.from_args(build_parser().parse_args([*req.to_argv(), "--allow-missing-layer", "x"]))


RESCORED = {
    "eval_mode": "standard",
    "eval_seq_len": 64,
    "eval_dtype": "float32",
    "device": "cpu",
    "threads": 1,
}
"""The fields of a score record a re-score request reads (harness/records/verify.py rescore_request)."""


def test_a_verification_re_scores_under_the_tracks_sandbox_rule(tmp_path):
    from harness.records.verify import VerifyConfig, rescore_request

    score = dict(RESCORED)
    paths = {k: tmp_path / k for k in ("artifact", "staged", "val_view", "out", "data_dir")}
    cfg = VerifyConfig(allow_missing_layers=("seccomp",))
    for track, sandbox in [("cpu_10min_16mb", "required"), ("10min_16mb", "required"), ("smoke", "auto")]:
        req = rescore_request({"track": track, "phases": {"score": score}}, cfg=cfg, **paths)
        assert (req.sandbox, req.allow_missing_layers) == (sandbox, ("seccomp",))
    with pytest.raises(ValueError, match="--allow-missing-layer: unknown isolation layer"):
        VerifyConfig(allow_missing_layers=("bogus",))


def test_a_card_says_why_a_run_did_not_end_ok():
    base = {
        "submission": {"name": "x"},
        "track": "smoke",
        "preset": "tiny",
        "seed": 1,
        "verification": "unverified",
        "run_dir": "/r",
        "provenance": {"hardware": {"cpu": "cpu", "cuda_devices": []}},
        "cap_bytes": 16_000_000,
        "within_cap": None,
        **dict.fromkeys(
            "val_bpb val_loss unigram_bpb val_tokens val_bytes eval_mode eval_dtype eval_time_s bytes_total "
            "bytes_code bytes_model train_time_s steps tokens_seen world_size".split()
        ),
    }
    over = {
        "train": {"status": "over_budget", "detail": "trained 70.2 s by the supervisor's clock:\n past 60 s"}
    }
    text = card({**base, "status": "over_budget", "phases": over})
    assert "│ why           train: trained 70.2 s by the supervisor's clock: past 60 s" in text
    assert "why" not in card({**base, "status": "ok", "phases": over})
    long = card({**base, "status": "error", "detail": "x" * 500})
    assert any(
        line.startswith("│ why") and line.endswith("…") and len(line) < 250 for line in long.splitlines()
    )


def test_required_means_guarantees_each_held_by_any_of_its_mechanisms(tmp_path):
    """A record track's sandbox requires properties, not layers: on a 5.15 kernel (Landlock ABI 1, no signal
    scoping) with root and namespaces, every property holds (signals by the PID namespace) and the plan says
    which mechanism held each; without namespaces, the properties they give are missing and it is refused."""
    from isolation.sandbox import guarantees, machine_report
    from tests.unit.harness.test_launch import _plan

    plan, _ = _plan(tmp_path, OLD_KERNEL, mode="required")
    d = plan.describe()
    assert d["missing_layers"] == ["signal_scoping"]
    assert d["guarantees"] == {
        "no_network": "network_namespace",
        "no_reads_outside": "landlock",
        "no_signals_or_tracing_outside": "namespaces",
        "no_ipc_outside": "namespaces+network_namespace",
        "nothing_shared": "world+seccomp",
    }
    assert any("missing layer signal_scoping: its guarantees hold by other means" in w for w in d["warnings"])
    with pytest.raises(
        SandboxRefused, match="unmet: no_network, no_signals_or_tracing_outside, no_ipc_outside"
    ):
        _plan(tmp_path, NO_NAMESPACES, mode="required")
    allowed = guarantees(("namespaces", "network_namespace", "signal_scoping", "world"), ("namespaces",))
    assert allowed["no_signals_or_tracing_outside"] == "allowed missing: namespaces"
    assert allowed["no_network"] == "missing"
    report = machine_report(OLD_KERNEL)
    assert report[-1] == "a record track can run here (sandbox 'required')"
    assert "ok   no_signals_or_tracing_outside" in report[3] and report[3].endswith("by namespaces")
    bad = machine_report(NO_NAMESPACES)
    assert [line[:4] for line in bad[1:-1]] == ["FAIL", "ok  ", "FAIL", "FAIL", "FAIL"]
    assert bad[-1].startswith("a record track is refused here: namespaces")


def test_pgolf_check_machine_prints_one_line_per_guarantee(capsys, monkeypatch):
    import isolation.sandbox as sandbox

    monkeypatch.setattr(sandbox, "probe_machine", lambda: NO_NAMESPACES)
    rc = pgolf_main(["check", "--machine"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and len(out) == 7 and out[1].startswith("FAIL no_network"), out
    monkeypatch.setattr(sandbox, "probe_machine", lambda: OLD_KERNEL)
    assert pgolf_main(["check", "--machine"]) == 0
