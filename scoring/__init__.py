"""Scoring: the artifact format, codecs, the byte cap, bits-per-byte evaluation.

Imports `data` only, never `harness`: the scorer must not be able to run training code.
Run as its own process with `python -m scoring` (what `pgolf score` and the run pipeline use).
"""
