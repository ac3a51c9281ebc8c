"""The orchestrator of `pgolf run`: one module per phase, each started as its own process.

pipeline.py     data -> train -> pack -> score -> report
train_phase.py  stage, sandbox and supervise the training ranks
launch.py       the torchrun command and the supervisor's clock
"""
