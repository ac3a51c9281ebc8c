"""The wire between a training rank and its supervisor: the one way time and data cross the sandbox.

The supervisor (`ClockServer` in harness/run/clock_server.py, outside the sandbox) listens on a Unix
socket in a private temp folder that no rank may read or write; each rank connects once, before the
submission is imported, and keeps the connection. A pathname socket works across the sandbox's PID
and network namespaces, and connecting to one is not a Landlock file access.

Protocol: SOCK_SEQPACKET, so one send is one message. Each message is a JSON object
`{"kind": ..., ...}` sent by a rank and answered by exactly one reply; an error reply
`{"error": "..."}` raises `WireError` here. The supervisor timestamps every request on receipt with
its own clock; no message carries a time, so there is no time for a rank to forge.

    hello {secret, rank, local_rank}  -> {}               first; the phase's secret (from the spec) proves the
                                                           caller is one of this phase's ranks
    clock_start                       -> {since_start_s}  just before train.py is imported; the node's clock
                                                           starts at the first one
    warmup_begin                      -> {}               ctx.clock.warmup() starts (after a barrier)
    warmup_end                        -> {credit_s}       and ends: off the clock only if no rank of the node
                                                           had received data before it ended, and never on
                                                           several nodes (another node's data is unseen)
    data {first}                      -> {names, counts, total} with up to MAX_FDS_PER_MESSAGE
                                                           descriptors (SCM_RIGHTS): the training shards,
                                                           opened read-only by the supervisor; refused while a
                                                           warm-up runs
    done {state}                      -> {sha256}         train(ctx) returned; with state=true the state file
                                                           is handed over: the supervisor moves it out of the
                                                           ranks' reach and the clock stops there

The rank side is `WireClient`: harness/train/clock.py's HarnessClock sends the clock messages,
harness/train/rank.py hello and done, and its token stream (data/loader.py OnDemandTokenStream) the
data request on the first batch. Nothing is sent per training step. Standard library only, so the
supervisor and light test scripts load it without torch.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 65_536
MAX_FDS_PER_MESSAGE = 200
"""The kernel passes at most 253 descriptors per message (SCM_MAX_FD); a longer list comes in parts."""
MAX_SOCKET_PATH_BYTES = 107
KINDS = ("hello", "clock_start", "warmup_begin", "warmup_end", "data", "done")


class WireError(RuntimeError):
    """The supervisor refused a request, or the wire broke. The one WireError: the scorer's wire to its model
    worker says ProtocolError (scoring/worker/wire.py). Its name shows in a rank's record ("WireError: ...")."""


def encode(kind: str, **fields: Any) -> bytes:
    raw = json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ValueError(f"wire message {kind!r} is {len(raw)} bytes, over {MAX_MESSAGE_BYTES}")
    return raw


def decode(raw: bytes) -> dict[str, Any]:
    """A message as a dict, or ValueError for anything that is not one JSON object.

    Nesting past the interpreter's recursion limit is a ValueError too: json.loads raises RecursionError for 60,000
    brackets, which once ended the supervisor's loop and left the phase running unsupervised."""
    try:
        msg = json.loads(raw)
    except RecursionError:
        raise ValueError("a wire message nested too deeply") from None
    if not isinstance(msg, dict):
        raise ValueError("a wire message is a JSON object")
    return msg


class WireClient:
    """One rank's connection to its supervisor. Every call is one request and its reply."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    @classmethod
    def connect(cls, address: Mapping[str, Any], *, rank: int, local_rank: int) -> WireClient:
        """Connect to the supervisor named in the spec (`{"path", "secret"}`) and introduce this rank."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(str(address["path"]))
        except OSError as e:
            sock.close()
            raise WireError(
                f"cannot reach the supervisor's socket {address['path']}: {e}. "
                "HINT: ranks are started by `pgolf run` (harness/run/train_phase.py), never by hand"
            ) from e
        client = cls(sock)
        client.call("hello", secret=address["secret"], rank=rank, local_rank=local_rank, version=WIRE_VERSION)
        return client

    def call(self, kind: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Send one request; return the reply and any descriptors that came with it."""
        try:
            self._sock.send(encode(kind, **fields))
            raw, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_MESSAGE_BYTES, MAX_FDS_PER_MESSAGE)
        except OSError as e:
            raise WireError(f"the wire to the supervisor broke during {kind!r}: {e}") from e
        if not raw:
            raise WireError(f"the supervisor closed the wire during {kind!r}")
        reply = decode(raw)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise WireError(f"the supervisor refused {kind!r}: {reply['error']}")
        return reply, fds

    def clock_start(self) -> float:
        """The node's clock has started: seconds since its start, by the supervisor's clock."""
        return float(self.call("clock_start")[0]["since_start_s"])

    def warmup_begin(self) -> None:
        self.call("warmup_begin")

    def warmup_end(self) -> float:
        """The seconds of this rank's warm-up the supervisor leaves off the clock."""
        return float(self.call("warmup_end")[0]["credit_s"])

    def data(self) -> list[tuple[str, int, int]]:
        """The training shards: (name, token count, read-only descriptor), in stream order."""
        shards: list[tuple[str, int, int]] = []
        total = None
        while total is None or len(shards) < total:
            reply, fds = self.call("data", first=len(shards))
            names, counts, total = reply["names"], reply["counts"], int(reply["total"])
            if len(fds) != len(names) or len(counts) != len(names) or (not names and len(shards) < total):
                for fd in fds:
                    os.close(fd)
                raise WireError(f"the supervisor sent {len(fds)} descriptors for {len(names)} shards")
            shards += [(str(n), int(c), fd) for n, c, fd in zip(names, counts, fds, strict=True)]
        return shards

    def done(self, state: bool) -> str | None:
        """train(ctx) returned on this rank; with `state`, hand the state file over. Returns its sha256."""
        return self.call("done", state=state)[0].get("sha256")

    def close(self) -> None:
        self._sock.close()
