"""The training curve of a run, as a PNG beside its records: RUN_DIR/train_curve.png.

    write_training_plot(run_dir / "metrics.jsonl", run_dir / "train_curve.png", val_loss=..., val_bpb=...)

Two panels: the training loss (nats/token) against the training time (the rank's `elapsed_s`, when its
metrics carry it) and against the step, with the learning-rate scale (`lr_scale`, when logged) on a
second axis, and the budget as a dotted line on the time panel. The scored point is marked at the end
of training (the step the rank ended at, not the last logged one): it sits on the loss axis as val_loss
(nats/token, the same unit as the training loss) and is labelled with val_bpb (bits/byte), the number
that ranks. A run that did not end ok says so in red in its title and across both panels. The metrics
file is the rank's word, read with the same checks as the live tail (harness/run/tracking.py
read_metrics); the marked point is the scorer's.

Drawn after training, outside the measured path, with matplotlib's Agg backend (no display). A plot
that cannot be drawn never changes a run's status: the caller records why on the card.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from data.io import write_bytes_atomic
from harness.run.tracking import read_metrics
from harness.train.rank import METRICS_FILE
from scoring.statuses import Status

PLOT_FILE = "train_curve.png"
PLOT_WIDTH_PX = 1200
PLOT_HEIGHT_PX = 480
_DPI = 100
LOSS_KEY = "train_loss"
TIME_KEY = "elapsed_s"
LR_KEY = "lr_scale"


def write_training_plot(
    metrics_path: Path,
    out_path: Path,
    *,
    title: str,
    val_loss: float | None = None,
    val_bpb: float | None = None,
    train_time_s: float | None = None,
    final_step: int | None = None,
    budget_s: float | None = None,
    status: str = Status.OK,
) -> dict[str, Any]:
    """Draw the curve of `metrics_path` into `out_path` (PNG, PLOT_WIDTH_PX x PLOT_HEIGHT_PX).

    `final_step`: the step training ended at (the rank's count; the scored point is drawn there, not at the
    last logged step); `budget_s`: the training budget, drawn as a vertical line on the time panel;
    `status` other than ok: the run failed, said in the title and across both panels.

    Returns {"file", "points", "skipped_lines"}; raises ValueError when there is nothing to draw
    (no metrics file, or no line with a train_loss) and OSError when it cannot be written."""
    if not metrics_path.is_file() and not metrics_path.is_symlink():
        raise ValueError(f"no {metrics_path.name}: the ranks wrote no metrics line (ctx.log.metrics)")
    records, skipped, refused = read_metrics(metrics_path)
    if refused:
        raise ValueError(f"{refused}: not read")
    pts = [r for r in records if LOSS_KEY in r]
    if not pts:
        raise ValueError(
            f"{metrics_path.name} has no line with {LOSS_KEY} ({len(records)} lines, {skipped} skipped)"
        )

    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, safe beside other threads

    fig = Figure(figsize=(PLOT_WIDTH_PX / _DPI, PLOT_HEIGHT_PX / _DPI), dpi=_DPI, layout="constrained")
    ax_time, ax_step = fig.subplots(1, 2)
    failed = status != Status.OK
    # a "$" starts matplotlib's math text: a name "${{{...}}}$" made the plot fail (RecursionError), "$x^{x}$"
    # drew other text than the name; escaped, every character is drawn as itself
    title = title.replace("$", r"\$")
    fig.suptitle(f"{status.upper()} (not scored) · {title}" if failed else title, fontsize=11,
                 color="#cf222e" if failed else "black")  # fmt: skip
    steps = [r["step"] for r in pts]
    losses = [r[LOSS_KEY] for r in pts]
    timed = [r for r in pts if TIME_KEY in r]
    end_step = max(steps) if final_step is None else max(final_step, max(steps))
    end_time = train_time_s if train_time_s is not None else (timed[-1][TIME_KEY] if timed else None)
    val_label = None
    if val_loss is not None:
        val_label = f"scored: val_loss {val_loss:.4f} nats/token"
        val_label += f", val_bpb {val_bpb:.4f} bits/byte" if val_bpb is not None else ""

    def panel(
        ax: Any,
        xs: list[float],
        ys: list[float],
        lr: list[tuple[float, float]],
        xlabel: str,
        x_end: Any,
        budget_line: float | None = None,
    ) -> None:
        few = len(xs) < 20  # a handful of logged points (or one) is drawn as points too, never empty axes
        ax.plot(
            xs,
            ys,
            color="#0969da",
            linewidth=1.2,
            marker="o" if few else None,
            markersize=4,
            label="train_loss (the rank's)",
        )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        ax.grid(True, color="#eaeef2")
        if budget_line is not None:  # in view even when training stopped well before it
            ax.axvline(
                budget_line, color="#9a6700", linewidth=1.5, linestyle=":", label=f"budget {budget_line:g} s"
            )
        if failed:
            ax.text(0.5, 0.5, f"run {status}", transform=ax.transAxes, ha="center", va="center", fontsize=28,
                    color="#cf222e", alpha=0.25, rotation=20)  # fmt: skip
        if val_label is not None and x_end is not None:
            ax.plot(
                [x_end],
                [val_loss],
                marker="*",
                markersize=14,
                color="#cf222e",
                linestyle="none",
                label=val_label,
            )
        if budget_line is not None:  # after every point: fixing the limits ends autoscaling
            lo, hi = ax.get_xlim()
            ax.set_xlim(lo, max(hi, budget_line + 0.03 * (budget_line - lo)))
        handles, labels = ax.get_legend_handles_labels()
        top = ax
        if lr:
            ax2 = ax.twinx()
            ax2.plot(
                [x for x, _ in lr],
                [v for _, v in lr],
                color="#8c959f",
                linewidth=1,
                linestyle="--",
                label=LR_KEY,
            )
            ax2.set_ylabel("learning-rate scale")
            ax2.set_ylim(0, 1.35 * max(max(v for _, v in lr), 1e-12))  # headroom: the legend sits above it
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels, top = handles + h2, labels + l2, ax2
        top.legend(handles, labels, loc="upper right", fontsize=8, framealpha=0.95)  # above both curves

    if timed:
        panel(
            ax_time,
            [r[TIME_KEY] for r in timed],
            [r[LOSS_KEY] for r in timed],
            [(r[TIME_KEY], r[LR_KEY]) for r in timed if LR_KEY in r],
            "training time (s, the rank's clock)",
            end_time,
            budget_s if budget_s is not None and math.isfinite(budget_s) else None,
        )
    else:
        ax_time.set_axis_off()
        ax_time.text(0.5, 0.5, f"the metrics carry no {TIME_KEY}:\nno time axis", ha="center", va="center")
    panel(ax_step, steps, losses, [(r["step"], r[LR_KEY]) for r in pts if LR_KEY in r], "step", end_step)

    from io import BytesIO

    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    write_bytes_atomic(out_path, buf.getvalue())
    return {
        "file": out_path.name,
        "points": len(pts),
        "skipped_lines": skipped,
        "scored_at_step": end_step if val_label is not None else None,
        "budget_line_s": budget_s if timed and budget_s is not None and math.isfinite(budget_s) else None,
        "marked_failed": failed,
    }


def plot_run(
    run_dir: Path,
    phases: dict[str, Any],
    *,
    title: str,
    budget_s: float | None = None,
    status: str = Status.OK,
) -> dict[str, Any]:
    """The run's plot, drawn from RUN_DIR/metrics.jsonl and the phases' records: {"file", "points",
    "skipped_lines"}, or {"error"} saying why there is none. Never raises: a plot is not a verdict."""
    score, train = phases.get("score") or {}, phases.get("train") or {}
    try:
        return write_training_plot(
            run_dir / METRICS_FILE,
            run_dir / PLOT_FILE,
            title=title,
            val_loss=score.get("val_loss") if "val_bpb" in score else None,
            val_bpb=score.get("val_bpb"),
            train_time_s=train.get("train_time_s"),
            final_step=train.get("steps") if isinstance(train.get("steps"), int) else None,
            budget_s=budget_s,
            status=status,
        )
    except Exception as e:  # noqa: BLE001 - plotting never changes a run's status; the card says why
        return {"error": " ".join(f"{type(e).__name__}: {e}".split())[:300]}
