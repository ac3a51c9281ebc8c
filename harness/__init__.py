"""The trusted side a person drives: CLI, config, the run's orchestrator, what runs inside a training
rank, records and benches. `harness/api.py` is the whole submission contract; submissions import it
and nothing else of the harness.

    harness/api.py      the submission contract (imports nothing of the project)
    harness/cli.py      `pgolf` (subcommands imported lazily)
    harness/config.py   typed config, validated before any process starts
    harness/run/        the orchestrator: one module per phase (process map: docs/ARCHITECTURE.md)
    harness/train/      inside the training sandbox, one process per rank
    harness/records/    result, ledger, verify, compare, leaderboard, legacy (never in a sealed process)
    harness/bench/      benchmarks that print figures
"""
