"""scripts/cpu_table.py: the CPU-track table from run folders, exact rows, the README rewritten between its markers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("cpu_table", REPO / "scripts" / "cpu_table.py")
assert _spec is not None and _spec.loader is not None
ct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ct)


def run_dir(tmp: Path, name: str, **over: object) -> Path:
    d = tmp / name
    d.mkdir()
    result = {
        "format": "pg-result",
        "format_version": 1,
        "submission": {"name": "cpu_moe"},
        "track": "cpu_10min_16mb",
        "status": "ok",
        "steps": 484,
        "tokens_seen": 3_964_928,
        "train_time_s": 600.4,
        "val_bpb": 2.23981234,
        "bytes_total": 1_537_848,
        "created_unix_s": 1000.0,
        "phase_times_s": {"pipeline": 100.0},
        "machine_load": {"train": {"others_cores": 0.013}, "score": {"others_cores": 1.5}},
    }
    result.update(over)
    (d / "result.json").write_text(json.dumps(result))
    return d


def test_rows_are_the_results_figures(tmp_path):
    ok = run_dir(tmp_path, "a")
    failed = run_dir(tmp_path, "b", status="over_budget", val_bpb=None, bytes_total=None)
    log = tmp_path / "load.log"
    log.write_text("850 9.0 1 1\n900 2.0 1 1\n950 4.0 1 1\n1001 30.0 1 1\n\n")
    lines = ct.table([ok, failed], log).splitlines()
    row_ok = (
        "| a | cpu_moe | cpu_10min_16mb | ok | 484 | 600.4 | 6,604 | 2.2398 | 1,537,848 | 3.0 | 0.01 / 1.50 |"
    )
    assert lines[2] == row_ok
    assert (
        lines[3]
        == "| b | cpu_moe | cpu_10min_16mb | over_budget | 484 | 600.4 | 6,604 | - | - | 3.0 | 0.01 / 1.50 |"
    )
    assert ct.table([ok]).splitlines()[2].endswith("| not logged | 0.01 / 1.50 |")
    bare = run_dir(tmp_path, "c", machine_load=None)
    assert ct.table([bare]).splitlines()[2].endswith("| not logged | - / - |")


def test_write_replaces_only_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\nbefore\n{ct.BEGIN}\nold table\n{ct.END}\nafter\n")
    assert ct.main([str(run_dir(tmp_path, "a")), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"# x\nbefore\n{ct.BEGIN}\n| run |") and text.endswith(f"|\n{ct.END}\nafter\n")
    assert "old table" not in text


@pytest.mark.parametrize(
    "content", [None, "not json", json.dumps({"format": "pg-score"}), json.dumps([1, 2])]
)
def test_a_folder_without_a_result_is_one_line_and_status_2(tmp_path, capsys, content):
    d = tmp_path / "r"
    d.mkdir()
    if content is not None:
        (d / "result.json").write_text(content)
    assert ct.main([str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_a_readme_without_markers_is_refused(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert ct.main([str(run_dir(tmp_path, "a")), "--write", str(readme)]) == 2
    assert "cpu-table:begin" in capsys.readouterr().err
    assert readme.read_text() == "no markers\n"
