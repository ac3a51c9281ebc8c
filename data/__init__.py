"""Data layer of the parameter-golf harness: shards, tokenizers and byte tables, manifests, builds.

This package imports nothing else of the project (see tests/unit/test_architecture.py).
"""
