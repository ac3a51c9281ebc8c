"""Kernel isolation, a leaf layer: it imports nothing of the project.

    isolation/landlock.py   Landlock rulesets (file access), planned from paths
    isolation/sandbox.py    sandbox plans (namespaces, capabilities, Landlock) and entering one
    isolation/monitor.py    the audit-hook monitor that records access attempts inside a sandbox
    isolation/processes.py  a phase's processes: found by token, killed, reaped

Used by the training sandbox (harness/run/train_phase.py) and by the scorer (scoring/score/confine.py).
"""
