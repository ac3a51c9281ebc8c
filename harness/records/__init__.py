"""Records: the result, the ledger, verification, comparison, leaderboards, legacy records.

Trusted-side tooling over the JSON records of runs; never imported by a sealed process (the scorer,
a training rank).
"""
