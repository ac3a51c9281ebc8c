"""The orchestrator of `pgolf run`: one module per phase, each started as its own process.

pipeline.py     data -> train -> pack -> score -> report
train_phase.py  stage, sandbox and supervise the training ranks
launch.py       the torchrun and pack command lines; the supervisor of the train phase
clock_server.py the supervisor's clock: the server end of the ranks' wire
datacheck.py    the dataset against the submission and the track
staging.py      the submission folder, copied and counted
load.py         the machine's load, and the threads it leaves
report: result.py (result.json, the ledger line, the card), plot.py, tracking.py (wandb),
        text.py (a submission's text, escaped), provenance.py (git, hardware, libraries)
"""
