"""The sealed side: the artifact and its cap, and the scorer.

    scoring/artifact/   the artifact format (PGOLFART), the byte cap, pack/unpack, codecs
    scoring/score/      everything the scorer process imports, and nothing else
    scoring/tracks.py   the rules a result is held to
    scoring/codecheck.py  the static lint of scored code (a friendly early error, not the boundary)

Imports `data`, `isolation` and the contract `harness.api`; never the rest of `harness` (the scorer
must not be able to run training code). Run as its own process with `python -m scoring score`.
"""
