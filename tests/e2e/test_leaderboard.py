"""`pgolf leaderboard`: from a results ledger to markdown, JSON and a web page, the page tested in a
real headless browser (Debian's chromium, which .ci/run installs; skipped with a reason without it):
only verified results rank, the others are listed apart, lineage links, the table sorts when a
header is clicked, and a screenshot shows the table and both plots. Then nine runs of one entry on one
day, under different presets and overrides, as `pgolf run` records them: every row can be told apart
(preset, track, overrides, run time), the time axis labels each tick differently (times of day), and
each row links its run's training-curve PNG.

The screenshots are written to $PG_LEADERBOARD_SCREENSHOT and $PG_LEADERBOARD_RUNS_SCREENSHOT when set
(else into the test's tmp folder).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records.leaderboard import build
from harness.records.verify import result_digest
from tests.conftest import REPO

ENTRIES = [  # name, date, builds_on, [(seed, val_bpb, bytes_total)], verification
    ("naive_baseline", "2026-03-18", None, [(1, 1.2244, 15_863_489), (2, 1.2251, 15_861_002)], "verified"),
    (
        "longer_context",
        "2026-03-25",
        "naive_baseline",
        [(1, 1.2011, 15_901_337), (2, 1.2019, 15_899_120), (3, 1.2004, 15_900_001)],
        "verified",
    ),
    (
        "int6_mlp3x",
        "2026-04-08",
        "longer_context",
        [(1, 1.1520, 15_990_212), (2, 1.1533, 15_989_998)],
        "verified",
    ),
    ("tiny_vocab", "2026-04-02", "naive_baseline", [(1, 1.2390, 9_812_443)], "verified"),
    ("unverified_claim", "2026-04-10", "int6_mlp3x", [(1, 1.0900, 15_999_000)], None),
    ("failed_check", "2026-04-11", "int6_mlp3x", [(1, 1.1000, 15_950_000)], "failed"),
    ("hand_edited", "2026-04-12", None, [(1, 1.0500, 15_000_000)], "forged"),
]


def result(name, date, builds_on, seed, bpb, nbytes):
    return {
        "format": "pg-result",
        "format_version": 1,
        "status": "ok",
        "verification": "unverified",
        "track": "10min_16mb",
        "preset": "official",
        "seed": seed,
        "created_unix_s": dt.datetime.fromisoformat(date + "T09:00:00+00:00").timestamp() + 600 * seed,
        "run_dir": f"runs/{name}-{seed}",
        "submission": {
            "name": name,
            "author": f"{name} author",
            "github_id": name,
            "date": date,
            "builds_on": builds_on,
        },
        "val_bpb": bpb,
        "val_loss": None if bpb is None else bpb * 0.6931 * 2.436,
        "bytes_total": nbytes,
        "within_cap": True,
    }


@pytest.fixture(scope="module")
def board_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("board")
    lines = []
    for name, date, builds_on, runs, ver in ENTRIES:
        for seed, bpb, nbytes in runs:
            r = result(name, date, builds_on, seed, bpb, nbytes)
            if ver == "forged":
                r["verification"] = "verified"  # written by hand, without a verification record
            lines.append(r)
            if ver in ("verified", "failed"):
                lines.append(
                    {
                        "format": "pg-verification",
                        "format_version": 1,
                        "status": ver,
                        "result_sha256": result_digest(r),
                    }
                )
    lines.append({**result("crashed", "2026-04-01", None, 1, None, None), "status": "error"})
    lines.append(result("other_track", "2026-04-01", None, 1, 1.0, 1000) | {"track": "smoke"})
    ledger = tmp / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "leaderboard",
            "--ledger",
            str(ledger),
            "--track",
            "10min_16mb",
            "--out",
            str(tmp / "site"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "4 ranked, 4 not ranked" in r.stdout
    return tmp / "site"


def test_only_verified_results_rank(board_dir):
    board = json.loads((board_dir / "leaderboard.json").read_text())
    assert board["format"] == "pg-leaderboard"
    assert [r["name"] for r in board["ranked"]] == [
        "int6_mlp3x",
        "longer_context",
        "naive_baseline",
        "tiny_vocab",
    ]
    top = board["ranked"][0]
    assert (
        top["seeds"] == 2
        and top["val_bpb"] == pytest.approx((1.1520 + 1.1533) / 2)
        and top["builds_on"] == "longer_context"
    )
    apart = {r["name"]: r["verification"] for r in board["unranked"]}
    assert apart == {
        "unverified_claim": "unverified",
        "failed_check": "failed",
        "hand_edited": "unverified",
        "crashed": "unverified",
    }
    md = (board_dir / "leaderboard.md").read_text()
    assert (
        md.index("int6_mlp3x")
        < md.index("longer_context")
        < md.index("naive_baseline")
        < md.index("## Not ranked")
    )
    assert "| 1 | int6_mlp3x | official | 10min_16mb | - | 1.152" in md


def test_build_is_pure_and_filters_tracks():
    r = result("a", "2026-01-01", None, 1, 1.1, 10)
    board = build([r], {result_digest(r): {"status": "verified"}}, track="smoke")
    assert board["ranked"] == [] and board["unranked"] == []


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium found: install Debian's chromium (apt-get install chromium), as .ci/run does")


def browse(url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--virtual-time-budget=3000",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def ranked_names(dom: str) -> list[str]:
    table = dom[dom.index('id="ranked"') : dom.index("</table>", dom.index('id="ranked"'))]
    return re.findall(r'<tr id="row-[0-9a-f]{12}(?:-\d+)?" data-name="([^"]+)"', table)


def test_page_in_a_real_browser_sorts_and_shows_both_plots(board_dir, tmp_path):
    url = (board_dir / "index.html").as_uri()
    dom = browse(url, "--dump-dom").stdout
    assert ranked_names(dom) == ["int6_mlp3x", "longer_context", "naive_baseline", "tiny_vocab"]
    target = re.search(r'<tr id="(row-[0-9a-f]{12})" data-name="longer_context"', dom)
    assert target and f'href="#{target.group(1)}"' in dom  # lineage links to the row it builds on
    for plot in ("plot-bytes", "plot-date"):
        svg = dom[dom.index(f'id="{plot}"') : dom.index("</svg>", dom.index(f'id="{plot}"'))]
        assert svg.count('class="pt ranked"') == 4 and svg.count('class="pt unranked"') == 3
    # Sorting: the page's script clicks the header named in the fragment, as a user would.
    by_bytes = ranked_names(browse(url + "#sort=bytes_total", "--dump-dom").stdout)
    assert by_bytes == ["tiny_vocab", "naive_baseline", "longer_context", "int6_mlp3x"]
    worst_first = browse(url + "#sort=-val_bpb", "--dump-dom").stdout
    assert ranked_names(worst_first) == ["tiny_vocab", "naive_baseline", "longer_context", "int6_mlp3x"]
    assert 'data-key="val_bpb" data-type="num" aria-sort="descending"' in worst_first
    by_name = ranked_names(browse(url + "#sort=name", "--dump-dom").stdout)
    assert by_name == sorted(by_name)
    shot = Path(os.environ.get("PG_LEADERBOARD_SCREENSHOT") or tmp_path / "leaderboard.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    r = browse(url, f"--screenshot={shot}", "--window-size=1240,1100")
    assert shot.is_file(), r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # a rendered page, not a blank one


# ---- nine runs of one entry on one day: rows that can be told apart ----

NINE = [  # preset, seed, overrides (as `pgolf run` records them), minute of the day, val_bpb, bytes_total
    ("cpu-smoke", 1337, [], 9 * 60 + 5, 2.4650, 1_005_720),
    ("cpu-smoke", 1, [], 9 * 60 + 12, 2.4702, 1_005_688),
    ("cpu-smoke", 1337, ["train.matrix_lr=0.02"], 9 * 60 + 31, 2.4411, 1_005_801),
    ("cpu-smoke", 1337, ["train.matrix_lr=0.08", "log.wandb='offline'"], 9 * 60 + 58, 2.5120, 1_005_514),
    ("cpu", 1337, [], 10 * 60 + 40, 2.1034, 3_412_377),
    (
        "cpu",
        1337,
        ["model.num_layers=4", "train.warmdown_frac=0.5", "eval.batch_seqs=16"],
        662,
        2.0807,
        4_380_912,
    ),
    ("tiny", 1337, ["budget.train_s=300", "train.iterations=8"], 11 * 60 + 30, 3.7246, 256_352),
    ("tiny", 1337, ["budget.train_s=300", "train.iterations=12"], 12 * 60 + 1, 3.6012, 256_350),
    ("cpu", 1337, ["launch.nproc_per_node=2"], 13 * 60 + 47, 2.0950, 3_412_377),
]
DAY = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def nine_runs(tmp_path_factory) -> Path:
    from harness.records.leaderboard import write_leaderboard
    from harness.run.plot import PLOT_FILE, write_training_plot

    tmp = tmp_path_factory.mktemp("nine")
    metrics = tmp / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": i, "train_loss": 7 - i / 40, "elapsed_s": i / 4}) + "\n"
            for i in range(1, 121)
        )
    )
    lines = []
    for i, (preset, seed, overrides, minute, bpb, nbytes) in enumerate(NINE):
        run_dir = tmp / "runs" / f"naive_baseline-{preset}-{i}"
        run_dir.mkdir(parents=True)
        phases = {"command": {"overrides": overrides}}
        if i != 4:  # one run drew no plot: its row says so
            write_training_plot(
                metrics, run_dir / PLOT_FILE, title=f"run {i}", val_loss=bpb * 1.7, val_bpb=bpb
            )
            phases["plot"] = {"file": PLOT_FILE, "points": 120, "skipped_lines": 0}
        r = result("naive_baseline", "2026-03-18", None, seed, bpb, nbytes)
        r.update(
            preset=preset,
            track="smoke",
            run_dir=str(run_dir),
            phases=phases,
            created_unix_s=(DAY + dt.timedelta(minutes=minute)).timestamp(),
        )
        lines.append(r)
    ledger = tmp / "runs" / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_leaderboard(ledger, tmp / "site")
    return tmp / "site"


def test_nine_runs_of_one_entry_can_be_told_apart(nine_runs):
    board = json.loads((nine_runs / "leaderboard.json").read_text())
    rows = board["unranked"]
    assert len(rows) == 9 and {r["name"] for r in rows} == {"naive_baseline"}
    told = {(r["preset"], r["track"], r["overrides"], r["seed"], r["run_time"]) for r in rows}
    assert len(told) == 9
    assert rows[3]["overrides"] == "train.matrix_lr=0.08"  # log.* left out: tracking changes no result
    assert rows[0]["run_time"] == "2026-12-01 09:05" and rows[8]["run_time"] == "2026-12-01 13:47"
    md = (nine_runs / "leaderboard.md").read_text()
    assert (
        "| naive_baseline | cpu | smoke | model.num_layers=4 train.warmdown_frac=0.5 eval.batch_seqs=… |"
        in md
    )


def test_one_day_of_runs_gets_times_of_day_on_its_axis(nine_runs):
    page = (nine_runs / "index.html").read_text()
    for plot in ("plot-bytes", "plot-date"):
        svg = page[page.index(f'id="{plot}"') : page.index("</svg>", page.index(f'id="{plot}"'))]
        assert svg.count('class="pt unranked"') == 9
    svg = page[page.index('id="plot-date"') : page.index("</svg>", page.index('id="plot-date"'))]
    ticks = re.findall(r'class="tick">([^<]+)</text>', svg)
    ticks = [t for t in ticks if t not in ("ranked", "not ranked") and not re.fullmatch(r"[0-9.]+", t)]
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks  # never the same label twice
    assert all(re.fullmatch(r"\d\d:\d\d", t) for t in ticks), ticks
    assert "run time (UTC, 2026-12-01)" in svg


def test_time_axis_on_days_and_across_midnight():
    from harness.records.leaderboard import time_axis

    t0 = DAY.timestamp()
    ticks, fmt, label = time_axis(t0 - 3600, t0 + 3 * 3600)  # across midnight: the day is in each label
    labels = [fmt(t) for t in ticks]
    assert labels[0] == "11-30 23:00" and "12-01 00:00" in labels and len(set(labels)) == len(labels)
    assert label == "run time (UTC, 2026-11-30 to 2026-12-01)"
    ticks, fmt, label = time_axis(t0, t0 + 90 * 86400)  # months: whole days, as dates
    labels = [fmt(t) for t in ticks]
    assert label == "run date (UTC)" and len(set(labels)) == len(labels) >= 3
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", x) for x in labels)


def test_each_row_links_its_runs_plot(nine_runs):
    page = (nine_runs / "index.html").read_text()
    hrefs = re.findall(r'<a class="plot-link" href="([^"]+)">plot</a>', page)
    assert len(hrefs) == 8  # the run without a plot has none
    for h in hrefs:
        assert not h.startswith("/") and (nine_runs / h).resolve().is_file(), h  # relative, and it is there


def test_the_runs_page_in_a_real_browser(nine_runs, tmp_path):
    url = (nine_runs / "index.html").as_uri()
    dom = browse(url, "--dump-dom").stdout
    table = dom[dom.index('id="unranked"') :]
    assert table.count('class="plot-link"') == 8
    shot = Path(os.environ.get("PG_LEADERBOARD_RUNS_SCREENSHOT") or tmp_path / "runs.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    r = browse(url, f"--screenshot={shot}", "--window-size=1500,1000")
    assert shot.is_file(), r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- what people look at: unknown tracks, unranked tracks, marks, an empty board, the page's width ----


def test_an_unknown_track_is_refused_in_one_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps(result("a", "2026-01-01", None, 1, 1.1, 10)) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "leaderboard", "--ledger", str(ledger), "--track", "10min_16MB",
         "--out", str(tmp_path / "site")],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith(
        "error: --track '10min_16MB' is not a track; the tracks: "
    )
    assert not (tmp_path / "site").exists()  # nothing written for a track that does not exist


def test_only_record_tracks_rank_and_rows_are_marked():
    smoke = result("smoke_entry", "2026-01-01", None, 1, 1.0, 10) | {"track": "smoke"}
    busy = result("busy_entry", "2026-01-02", None, 1, 1.2, 10) | {"machine_load": {"contended": True}}
    broke = result("broke", "2026-01-03", None, 1, None, None) | {"status": "over_budget"}
    ver = {result_digest(r): {"status": "verified"} for r in (smoke, busy)}
    board = build([smoke, busy, broke], ver, track=None)
    assert [(r["name"], r["marks"]) for r in board["ranked"]] == [("busy_entry", ["contended"])]
    why = {r["name"]: (r["why"], r["marks"]) for r in board["unranked"]}
    assert why == {
        "smoke_entry": ("track smoke is not a record track: listed, never ranked", []),
        "broke": ("status over_budget", ["failed"]),
    }
    from harness.records.leaderboard import NO_RESULTS, markdown, page

    md = markdown(board)
    assert "| 1 | busy_entry **[contended]** |" in md and "| broke **[failed]** |" in md
    html_page = page(board)
    assert '<span class="mark contended">contended</span>' in html_page and '<tr class="failed">' in html_page
    empty = build([broke], {}, track="10min_16mb")
    assert NO_RESULTS in markdown(empty) and NO_RESULTS in page(empty)
    assert (
        NO_RESULTS
        == "No verified results yet: a result ranks once `pgolf verify` has re-scored it on a record track."
    )


MEASURE = (
    "<script>window.addEventListener('load',()=>{const d=document.createElement('div');d.id='measured';"
    "d.textContent=JSON.stringify({scroll:document.documentElement.scrollWidth,"
    "client:document.documentElement.clientWidth});document.body.appendChild(d);});</script>"
)


@pytest.mark.parametrize("which", ["board_dir", "nine_runs"])
def test_the_board_fits_1280_px_without_scrolling_sideways(which, request):
    """A copy of the page with a measuring script appended (the page itself is unchanged): at a 1,280 px
    window the document is no wider than the window (the ranked board was 1,376 px before the cells were
    narrowed; the runs page, 1,352 px before a run's folder showed its name and its path on hover)."""
    site = request.getfixturevalue(which)
    probe = site / "measure.html"
    probe.write_text((site / "index.html").read_text() + MEASURE)
    dom = browse(probe.as_uri(), "--dump-dom", "--window-size=1280,900").stdout
    found = re.search(r'<div id="measured">([^<]+)</div>', dom)
    assert found, dom[-2000:]
    width = json.loads(found.group(1))
    assert width["client"] == 1280 and width["scroll"] <= 1280, width
