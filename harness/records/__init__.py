"""Records: verification, comparison, leaderboards, reproduction, legacy records.

Trusted-side tooling over the JSON records of runs (the result a run writes: harness/run/result.py);
never imported by a sealed process (the scorer, a training rank).
"""
