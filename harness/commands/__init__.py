"""The commands of `pgolf` that are neither a phase of a run nor a record's tool, one module each; each
module's `register(sub)` adds its command (harness/cli.py COMMANDS).

generate.py    pgolf generate, pgolf sample    text from a packed model, in a confined process
preflight.py   pgolf check                     a submission folder pre-flighted in seconds
scaffold.py    pgolf new                       a new submission folder from a baseline
tune.py        pgolf tune                      the CPU settings of a preset, by measurement
"""
