"""The model worker: its own confined process, the only one where submitted scored code runs.

scoring/worker/wire.py     the messages and shared buffers between scorer and worker
scoring/worker/process.py  the worker itself (`python -m scoring.worker SPEC_JSON`)
"""
