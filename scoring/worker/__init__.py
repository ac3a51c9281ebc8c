"""The worker side: every process that runs submitted code outside training, and what its two ends share.

scoring/worker/process.py      the model worker (`python -m scoring.worker SPEC_JSON`, started by the scorer)
scoring/worker/decode.py       a custom codec's decode (`pgolf unpack`)
scoring/worker/generate.py     `pgolf generate`'s model (started by harness/commands/generate.py)
scoring/worker/build_check.py  `pgolf check`'s model build (started by harness/commands/preflight.py)
scoring/worker/child.py        the one entry point of these processes: the spec, the limits, one error line,
                               the exit status; and the trusted side's reading of that line
scoring/worker/confined.py     how they are started: the sandbox plan, the environment, the output drain
scoring/worker/env.py          the environment of every sandboxed process: an allow-list (training's too)
scoring/worker/wire.py         the messages and shared buffers between scorer and worker
scoring/worker/loading.py      importing model.py and building the model; adapt.py: eval.py's score-first hook
scoring/worker/legacy.py       a reference-challenge record's script, definitions only

Nothing here imports scoring.score (tests/unit/test_architecture.py): the scorer imports this side, never
the other way round.
"""
