"""`python -m scoring.worker SPEC_JSON`: the model worker (started by the scorer, confined).

It waits for the scorer's `start` before importing torch or anything of the submission, so a probe
worker started early (before the scorer confines itself) costs nothing until it is needed.
"""

import json
import socket
import sys

if len(sys.argv) != 2:
    sys.exit("usage: python -m scoring.worker SPEC_JSON  (started by the scorer)")
_sock = socket.socket(fileno=int(json.loads(sys.argv[1])["sock_fd"]))
_first = _sock.recv(1 << 16)
_sock.detach()
if not _first or json.loads(_first).get("op") != "start":
    sys.exit(0)  # closed, or told to quit, before it was needed

from scoring.worker.process import main  # noqa: E402 (only once started)

sys.exit(main(sys.argv[1:]))
