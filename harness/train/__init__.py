"""What runs inside the training sandbox, one process per rank (`python -m harness.train.rank SPEC`).

A rank imports harness.api, data (the loader) and isolation (the monitor); never the scorer or the
records (tests/unit/test_import_closure.py).
"""
