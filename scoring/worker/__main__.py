"""`python -m scoring.worker SPEC_JSON`: the model worker (started by the scorer, confined).

It imports torch and the worker's own code at once (nothing of the submission), then waits for the
scorer's `start` before it reads the artifact or imports any submitted code: a probe worker started
early, before the scorer confines itself, does its slow imports while the main worker scores, and
has seen no data when it is used.
"""

import json
import os
import socket
import sys

from scoring.worker.process import main

if len(sys.argv) != 2:
    sys.exit("usage: python -m scoring.worker SPEC_JSON  (started by the scorer)")
_sock = socket.socket(fileno=int(json.loads(sys.argv[1])["sock_fd"]))
_first = _sock.recv(1 << 16)
_sock.detach()
if not _first or json.loads(_first).get("op") != "start":
    os._exit(0)  # closed, or told to quit, before it was needed (no teardown of the torch it imported)
sys.exit(main(sys.argv[1:]))
