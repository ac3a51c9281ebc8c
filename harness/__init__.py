"""The parameter-golf runner: CLI, config, launch, the budget clock and the public submission API.

Submissions import `harness.api` and nothing else of the harness.
"""
