"""harness/run/plot.py: the training curve PNG of a run, opened back as an image (its size, that
it holds the curve), and a plot that cannot be drawn recorded as a note, never a failure."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from harness.run.plot import PLOT_FILE, PLOT_HEIGHT_PX, PLOT_WIDTH_PX, plot_run, write_training_plot
from harness.run.result import _plot_lines


def write_metrics(path, n=120, *, elapsed=True, lr=True):
    with open(path, "w") as f:
        for i in range(1, n + 1):
            rec = {"step": i, "train_loss": 3.5 + 6 * math.exp(-i / 30)}
            if lr:
                rec["lr_scale"] = min(1.0, i / 10) * (1.0 if i < 0.7 * n else (n - i) / (0.3 * n))
            if elapsed:
                rec["elapsed_s"] = 0.25 * i
            f.write(json.dumps(rec) + "\n")
        f.write("garbage\n")


def test_the_png_is_a_valid_image_of_the_expected_size(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl")
    out = write_training_plot(
        tmp_path / "metrics.jsonl",
        tmp_path / PLOT_FILE,
        title="naive_baseline · smoke · preset cpu-smoke · seed 1337",
        val_loss=4.2,
        val_bpb=2.465,
        train_time_s=30.1,
    )
    assert out == {"file": PLOT_FILE, "points": 120, "skipped_lines": 1, "scored_at_step": 120,
                   "budget_line_s": None, "marked_failed": False}  # fmt: skip
    with Image.open(tmp_path / PLOT_FILE) as im:
        im.verify()  # the PNG's structure and checksums
    with Image.open(tmp_path / PLOT_FILE) as im:
        assert im.format == "PNG" and im.size == (PLOT_WIDTH_PX, PLOT_HEIGHT_PX) == (1200, 480)
        px = np.asarray(im.convert("RGB")).astype(int)
    # it is drawn: the loss curve's blue (#0969da) and the scored point's red (#cf222e) are on it
    blue = (abs(px - [9, 105, 218]).sum(axis=2) < 30).sum()
    red = (abs(px - [207, 34, 46]).sum(axis=2) < 30).sum()
    assert blue > 500 and red > 50, (blue, red)
    # in both panels: the curve against time (left half) and against step (right half)
    for half in (px[:, : PLOT_WIDTH_PX // 2], px[:, PLOT_WIDTH_PX // 2 :]):
        assert (abs(half - [9, 105, 218]).sum(axis=2) < 30).sum() > 200


def test_without_elapsed_time_or_a_score_it_still_draws_the_steps(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", elapsed=False, lr=False)
    out = write_training_plot(tmp_path / "metrics.jsonl", tmp_path / "p.png", title="t")
    assert out["points"] == 120
    with Image.open(tmp_path / "p.png") as im:
        assert im.size == (PLOT_WIDTH_PX, PLOT_HEIGHT_PX)
        px = np.asarray(im.convert("RGB")).astype(int)
    assert (abs(px - [207, 34, 46]).sum(axis=2) < 30).sum() == 0  # no scored point to mark
    assert (abs(px[:, : PLOT_WIDTH_PX // 2] - [9, 105, 218]).sum(axis=2) < 30).sum() == 0  # no time axis


def test_a_plot_that_cannot_be_drawn_is_a_note_not_a_failure(tmp_path):
    assert "no metrics.jsonl" in plot_run(tmp_path, {"train": {}}, title="t")["error"]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "other": 1.0}\nnot json\n')
    note = plot_run(tmp_path, {"train": {}}, title="t")
    assert note == {"error": "ValueError: metrics.jsonl has no line with train_loss (1 lines, 1 skipped)"}
    assert not (tmp_path / PLOT_FILE).exists()
    result = {"run_dir": "runs/x", "phases": {"plot": note}}
    assert _plot_lines(result) == [
        "│ plot          not drawn: ValueError: metrics.jsonl has no line with train_loss (1 lines, 1 skipped) "
        "(the run's status is unchanged)"
    ]


def test_a_linked_metrics_file_is_not_followed(tmp_path):
    secret = tmp_path / "secret.jsonl"
    write_metrics(secret)
    (tmp_path / "metrics.jsonl").symlink_to(secret)
    assert "not read" in plot_run(tmp_path, {"train": {}}, title="t")["error"]


def test_plot_run_marks_the_score_and_the_card_names_the_file(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl")
    phases = {"train": {"train_time_s": 30.0}, "score": {"val_loss": 4.0, "val_bpb": 2.3}}
    rec = plot_run(tmp_path, phases, title="t")
    assert rec == {"file": PLOT_FILE, "points": 120, "skipped_lines": 1, "scored_at_step": 120,
                   "budget_line_s": None, "marked_failed": False}  # fmt: skip
    assert _plot_lines({"run_dir": str(tmp_path), "phases": {"plot": rec}}) == [
        f"│ plot          {tmp_path}/{PLOT_FILE}  (training loss against time and step)"
    ]
    assert _plot_lines({"run_dir": "x", "phases": {}}) == []


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_points_draw(tmp_path, n):
    write_metrics(tmp_path / "metrics.jsonl", n=n)
    assert plot_run(tmp_path, {"train": {}}, title="t")["points"] == n


def _count(px, rgb, tol=30):
    return int((abs(px - rgb).sum(axis=2) < tol).sum())


def test_the_score_sits_at_the_final_step_and_the_budget_is_drawn(tmp_path):
    """Logged every step up to 120, trained to 137: the scored point at 137; a dotted budget line at 40 s,
    on the time panel only."""
    write_metrics(tmp_path / "metrics.jsonl")
    phases = {"train": {"train_time_s": 34.5, "steps": 137}, "score": {"val_loss": 4.0, "val_bpb": 2.3}}
    rec = plot_run(tmp_path, phases, title="t", budget_s=40.0)
    assert rec["scored_at_step"] == 137 and rec["budget_line_s"] == 40.0 and rec["marked_failed"] is False
    with Image.open(tmp_path / PLOT_FILE) as im:
        px = np.asarray(im.convert("RGB")).astype(int)
    amber = [0x9A, 0x67, 0x00]
    assert _count(px[:, : PLOT_WIDTH_PX // 2], amber) > 50 and _count(px[:, PLOT_WIDTH_PX // 2 :], amber) < 5
    plain = plot_run(tmp_path, {"train": {}}, title="t")  # no budget given: no line
    assert plain["budget_line_s"] is None and plain["scored_at_step"] is None


def test_a_failed_run_is_marked(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl")
    ok = plot_run(tmp_path, {"train": {}}, title="t")
    with Image.open(tmp_path / PLOT_FILE) as im:
        red_ok = _count(np.asarray(im.convert("RGB")).astype(int), [207, 34, 46])
    rec = plot_run(tmp_path, {"train": {}}, title="t", status="over_budget")
    assert ok["marked_failed"] is False and rec["marked_failed"] is True
    with Image.open(tmp_path / PLOT_FILE) as im:
        red = _count(np.asarray(im.convert("RGB")).astype(int), [207, 34, 46])
    assert red_ok == 0 and red > 100, (red_ok, red)  # the red title "OVER_BUDGET (not scored) · t"


@pytest.mark.parametrize(
    "name", ["$" + "{" * 35 + "x" + "}" * 35 + "$", "$\\boldsymbol{\\x}$", "$x^{x}$ costs $5"]
)
def test_a_name_with_dollars_is_drawn_as_text_never_math(tmp_path, name):
    """A "$" started matplotlib's math text in the title: "${{{...}}}$" failed the plot (RecursionError),
    an unknown command failed it (ParseException), "$x^{x}$" drew a superscript instead of the name."""
    from harness.run.pipeline import plot_title

    write_metrics(tmp_path / "metrics.jsonl", n=5)
    rec = plot_run(tmp_path, {}, title=plot_title(name, "smoke", "tiny", 1))
    assert rec.get("file") == PLOT_FILE, rec
