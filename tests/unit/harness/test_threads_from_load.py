"""Torch threads per rank from the machine's measured load (harness/run/load.py choose_threads, the
pipeline's choose_launch_threads) and the card's line naming the choice. Load readings are injected:
nothing sleeps and nothing reads this machine's /proc."""

from __future__ import annotations

from harness.config import LaunchConfig
from harness.run.load import LoadReading, choose_threads, measure_load
from harness.run.pipeline import choose_launch_threads
from harness.run.result import _cpu_lines


def reading(t_s: float, busy_s: float, own_s: float = 0.0) -> LoadReading:
    return LoadReading(t_s=t_s, busy_s=busy_s, steal_s=0.0, own_s=own_s, loadavg_1m=1.0)


def injected(others_cores: float, window_s: float = 1.0, cores: int = 2):
    """A measure() whose two readings say other processes kept `others_cores` busy over the window."""
    readings = iter([reading(100.0, 50.0), reading(100.0 + window_s, 50.0 + others_cores * window_s)])
    waited: list[float] = []

    def measure():
        return measure_load(window_s, read=lambda: next(readings), wait=waited.append, cores=cores)

    return measure, waited


def test_one_busy_core_of_two_gives_one_thread() -> None:
    measure, waited = injected(1.02)
    launch, rec = choose_launch_threads(LaunchConfig(device="cpu"), "cpu", measure)
    assert waited == [1.0]  # the window was waited through the injected wait, not slept
    assert launch.threads == 1 and launch.threads_per_rank() == 1
    assert rec is not None and rec["chosen_by"] == "load" and rec["threads_per_rank"] == 1
    assert rec["load"]["others_cores"] == 1.02
    assert (
        rec["why"]
        == "2 cores less 1.02 busy with other processes over 1.0 s = 0.98 free, divided among 1 rank(s)"
    )


def test_an_idle_machine_keeps_every_core() -> None:
    measure, _ = injected(0.1)
    launch, rec = choose_launch_threads(LaunchConfig(device="cpu"), "cpu", measure)
    assert launch.threads == 2 and rec is not None and rec["threads_per_rank"] == 2


def test_both_cores_busy_still_trains_on_one_thread() -> None:
    measure, _ = injected(2.0)
    assert choose_launch_threads(LaunchConfig(device="cpu"), "cpu", measure)[0].threads == 1


def test_free_cores_are_shared_among_ranks() -> None:
    load = {"cores": 8, "others_cores": 2.4, "wall_s": 1.0}
    assert choose_threads(load, ranks=2)["threads_per_rank"] == 3  # 5.6 free -> 6 cores, 3 each
    assert choose_threads(load, ranks=8)["threads_per_rank"] == 1  # never below one
    unmeasured = choose_threads({"cores": 4, "others_cores": None}, ranks=2)
    assert unmeasured["threads_per_rank"] == 2 and "not measured" in unmeasured["why"]


def test_launch_threads_set_is_kept_and_nothing_is_measured() -> None:
    def measure():
        raise AssertionError("measured although launch.threads was set")

    launch, rec = choose_launch_threads(LaunchConfig(device="cpu", threads=2), "cpu", measure)
    assert launch.threads == 2 and rec is not None and rec["chosen_by"] == "launch.threads"
    assert choose_launch_threads(LaunchConfig(), "cuda", measure) == (LaunchConfig(), None)


def test_the_card_says_the_choice_and_why() -> None:
    measure, _ = injected(1.02)
    _, rec = choose_launch_threads(LaunchConfig(device="cpu"), "cpu", measure)
    lines = _cpu_lines({"phases": {"train": {"threads": rec}}})
    assert lines == [
        "│ threads       1 per rank, chosen from the load (2 cores less 1.02 busy with other processes over "
        "1.0 s = 0.98 free, divided among 1 rank(s)); --set launch.threads=N fixes it"
    ]


def test_the_card_names_the_scorers_threads_when_the_load_chose_them() -> None:
    measure, _ = injected(1.5)
    rec = choose_threads(measure(), 1)
    lines = _cpu_lines({"phases": {"score": {"threads_choice": rec}}})
    assert lines == [
        "│ score threads 1, chosen from the load (2 cores less 1.50 busy with other processes over 1.0 s "
        "= 0.50 free, divided among 1 rank(s))"
    ]
    assert _cpu_lines({"phases": {"score": {"threads_choice": None}}}) == []
