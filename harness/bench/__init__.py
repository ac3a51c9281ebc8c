"""Benchmarks that print figures (`pgolf bench ...`): the runner's overhead, the scorer's speed, the data path,
the codecs' bytes and error.

Speed targets live here, not in timed tests: each bench measures ratios side by side in one run.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from data import bench as data_bench
    from harness.bench import codecs, model, reference, runner, score

    runner.register(sub)
    reference.register(sub)
    model.register(sub)
    data_bench.register(sub)
    score.register(sub)
    codecs.register(sub)
