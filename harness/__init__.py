"""The trusted side a person drives: CLI, config, the run's orchestrator, what runs inside a training
rank, records and benches. `harness/api.py` is the whole submission contract; submissions import it
and nothing else of the harness.

    harness/api.py      the submission contract (imports nothing of the project)
    harness/cli.py      `pgolf` (subcommands imported lazily)
    harness/config.py   typed config, validated before any process starts
    harness/submission.py  submission.json and the folder's files, checked (config, check, reproduce)
    harness/commands/   generate and sample, check, new, tune: one module per command
    harness/run/        the orchestrator: one module per phase, and the result it writes (docs/ARCHITECTURE.md)
    harness/train/      inside the training sandbox, one process per rank
    harness/records/    verify, reproduce, compare, leaderboard, legacy (never in a sealed process)
    harness/bench/      benchmarks that print figures
"""
