"""The supervisor's clock, `ClockServer`: run by `supervise` (harness/run/launch.py) outside the sandbox;
nothing a rank says about time is believed.

It is the supervisor's end of the wire (protocol: harness/train/wire.py): a Unix socket in
a private temp folder, one connection per rank of this node. Each request is timestamped on receipt
with this process's monotonic clock:
- the clock starts at the node's first `clock_start` (each rank sends it just before importing the
  submission's train.py);
- the off-clock warm-up is the time every rank of the node spent between `warmup_begin` and
  `warmup_end` (the intersection), at most budget.warmup_max_s, and nothing when any rank had
  received training data before it ended; data is refused while a warm-up runs. On several nodes
  nothing is off the clock: this process sees only its own node's requests, and a rank of another node
  that holds training data can hand it to this node's ranks over the process group inside their warm-up;
- training data exists in a rank only after its `data` request: the shards are outside the sandbox's
  rules, and the answer carries descriptors this process opened read-only (SCM_RIGHTS);
- the clock ends when the state is handed over (`done` with state: the file is moved out of the
  folder the ranks write, and hashed; after the phase it is hashed again, and a change made through
  a descriptor kept open makes the phase an `error`), else when every rank of the node said `done`,
  else at the exit of the phase.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import selectors
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.shards import read_header
from harness.train.wire import MAX_FDS_PER_MESSAGE, MAX_MESSAGE_BYTES, MAX_SOCKET_PATH_BYTES, decode, encode

MAX_CONNECTIONS_EXTRA = 8
"""Connections beyond one per local rank that are accepted (and then refused at hello if they lie)."""
HASH_CHUNK_BYTES = 1 << 22
SEVERAL_NODES = (
    "several nodes: none of the warm-up is off the clock (a rank of another node may hold training data and "
    "hand it over the process group; this supervisor sees only its own node's requests)"
)


@dataclass
class _Peer:
    """One connection; a rank of this node once its hello was accepted."""

    sock: socket.socket
    local_rank: int | None = None
    rank: int | None = None
    warmup_begin: float | None = None
    warmup_end: float | None = None
    done: float | None = None


def _sha256_of(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        h = hashlib.sha256()
        while chunk := os.read(fd, HASH_CHUNK_BYTES):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    """Remove what a rank left at `path` (a file, a link, a folder), never following a link. Whatever stays
    (it cannot be removed) is never taken: the run folder gets only a state this process hashed."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        pass


class ClockServer:
    """The supervisor's end of the wire for one node's ranks (see the module docstring and harness/train/wire.py).

    `shards`: the training shards a `data` request gets, in stream order (headers checked here, now).
    `local_ranks`: how many ranks this node runs; `nodes`: how many nodes the run has (on several, no warm-up
    is off the clock: module docstring). `state_src`: where global rank 0 writes the state (in
    the folder the ranks write); `state_dest`: where the handover moves it (same filesystem, out of the
    ranks' reach). Nothing is created until `open()`; `close()` removes the socket and its folder.
    """

    def __init__(
        self,
        *,
        shards: Sequence[Path],
        local_ranks: int,
        warmup_max_s: float,
        nodes: int = 1,
        state_src: Path,
        state_dest: Path,
        tmp_dir: str | None = None,
    ):
        self.secret = secrets.token_hex(16)
        self.path = (
            Path(tmp_dir or tempfile.gettempdir()) / f"pgolf-wire-{secrets.token_hex(6)}" / "clock.sock"
        )
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"the wire's socket path {self.path} is longer than the {MAX_SOCKET_PATH_BYTES} bytes a Unix "
                "socket allows. HINT: point TMPDIR at a shorter folder"
            )
        self.shards = [Path(p) for p in shards]
        self.counts = [read_header(p) for p in self.shards]
        self.local_ranks = local_ranks
        self.nodes = nodes
        self.warmup_max_s = warmup_max_s
        self.state_src, self.state_dest = Path(state_src), Path(state_dest)
        self.start: float | None = None
        """The node's clock start (time.monotonic() of the first clock_start)."""
        self.first_data: float | None = None
        self.handover: float | None = None
        self.state_sha256: str | None = None
        self.refused: dict[str, int] = {}
        """Refused requests by reason (a hostile or broken rank's traces)."""
        self._peers: dict[int, _Peer] = {}
        self._gone: list[_Peer] = []
        """Ranks whose connection closed (kept: their times still count)."""
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._fds: list[int] = []

    def address(self) -> dict[str, str]:
        """What the spec tells the ranks: where to connect, and the secret that proves they are this phase's."""
        return {"path": str(self.path), "secret": self.secret}

    def data_record(self) -> dict[str, Any]:
        """What a result records about the training stream (the data order depends on all of it)."""
        return {
            "train_shards_used": len(self.shards),
            "train_shard_names": [p.name for p in self.shards],
            "train_tokens_available": int(sum(self.counts)),
        }

    # ---- serving ----

    def open(self) -> None:
        self.path.parent.mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.bind(str(self.path))
        listener.listen(self.local_ranks + MAX_CONNECTIONS_EXTRA)
        listener.setblocking(False)
        self._listener = listener
        self._fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in self.shards]
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ)

    def watch(self, fd: int) -> None:
        """Also wake `serve` when `fd` becomes readable (a pidfd: the phase's exit)."""
        assert self._sel is not None
        self._sel.register(fd, selectors.EVENT_READ)

    def serve(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for requests; answer those that came (at most one per connection)."""
        assert self._sel is not None and self._listener is not None
        for key, _ in self._sel.select(max(timeout_s, 0.0)):
            if key.fileobj is self._listener:
                self._accept()
            elif isinstance(key.data, _Peer):
                self._receive(key.data)

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if len(self._peers) >= self.local_ranks + MAX_CONNECTIONS_EXTRA:
                conn.close()
                self._refuse("too many connections")
                continue
            conn.setblocking(False)  # a rank that stops reading its replies must not stall the supervisor
            peer = _Peer(conn)
            self._peers[conn.fileno()] = peer
            self._sel.register(conn, selectors.EVENT_READ, peer)

    def _drop(self, peer: _Peer) -> None:
        assert self._sel is not None
        self._peers.pop(peer.sock.fileno(), None)
        self._sel.unregister(peer.sock)
        peer.sock.close()
        if peer.local_rank is not None:
            self._gone.append(peer)

    def _refuse(self, reason: str) -> dict[str, Any]:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return {"error": reason}

    def _receive(self, peer: _Peer) -> None:
        try:
            raw = peer.sock.recv(MAX_MESSAGE_BYTES + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            raw = b""
        now = time.monotonic()  # the request's time: on receipt, by this process's clock
        if not raw:
            self._drop(peer)  # the rank closed the wire or exited
            return
        fds: list[int] = []
        try:
            msg = decode(raw) if len(raw) <= MAX_MESSAGE_BYTES else None
            kind = msg.get("kind") if msg is not None else None
            if msg is None or not isinstance(kind, str):
                reply = self._refuse("not a wire message")
            elif peer.local_rank is None and kind != "hello":
                reply = self._refuse(f"{kind!r} before hello")
            else:
                reply, fds = self._handle(peer, kind, msg, now)
        except ValueError:
            reply = self._refuse("not a wire message")
        try:
            if fds:
                socket.send_fds(peer.sock, [encode("reply", **reply)], fds)
            else:
                peer.sock.send(encode("reply", **reply))
        except OSError:
            self._drop(peer)  # it does not read its replies (or is gone): no more service
            return
        if peer.local_rank is None:
            self._drop(peer)  # a refused hello

    def _handle(
        self, peer: _Peer, kind: str, msg: dict[str, Any], now: float
    ) -> tuple[dict[str, Any], list[int]]:
        if kind == "hello":
            return self._hello(peer, msg), []
        if kind == "clock_start":
            if self.start is None:
                self.start = now
            return {"since_start_s": time.monotonic() - self.start}, []
        if self.start is None:
            return self._refuse(f"{kind!r} before clock_start"), []
        if kind == "warmup_begin":
            if peer.warmup_begin is not None:
                return self._refuse("a second warm-up"), []
            peer.warmup_begin = now
            return {}, []
        if kind == "warmup_end":
            if peer.warmup_begin is None or peer.warmup_end is not None:
                return self._refuse("warmup_end without warmup_begin"), []
            peer.warmup_end = now
            credit = (
                0.0
                if self.first_data is not None or self.nodes > 1
                else min(now - peer.warmup_begin, self.warmup_max_s)
            )
            return {"credit_s": credit}, []
        if kind == "data":
            if any(p.warmup_begin is not None and p.warmup_end is None for p in self._ranks()):
                return self._refuse("training data is closed during ctx.clock.warmup()"), []
            first = msg.get("first", 0)
            if not isinstance(first, int) or not 0 <= first <= len(self._fds):
                return self._refuse("data: 'first' out of range"), []
            if self.first_data is None:
                self.first_data = now
            part = slice(first, first + MAX_FDS_PER_MESSAGE)
            names = [p.name for p in self.shards[part]]
            return {"names": names, "counts": self.counts[part], "total": len(self._fds)}, self._fds[part]
        if kind == "done":
            if msg.get("state") is True and self.handover is None:
                problem = self._hand_over()
                if problem:
                    return self._refuse(problem), []
                # the clock stops once the state is hashed, not when `done` came: a rank that kept a descriptor
                # (or a hard link) wrote on while the hash ran, ahead of its reads, and the re-hash matched
                self.handover = time.monotonic()
            if peer.done is None:
                peer.done = now
            return {"sha256": self.state_sha256} if msg.get("state") is True else {}, []
        return self._refuse(f"unknown request {kind!r}"), []

    def _hello(self, peer: _Peer, msg: dict[str, Any]) -> dict[str, Any]:
        secret, local_rank = msg.get("secret"), msg.get("local_rank")
        if not isinstance(secret, str) or not hmac.compare_digest(secret, self.secret):
            return self._refuse("hello: wrong secret")
        if not isinstance(local_rank, int) or not 0 <= local_rank < self.local_ranks:
            return self._refuse(f"hello: local rank {local_rank!r} is not one of this node's")
        if any(p.local_rank == local_rank for p in self._ranks()):
            return self._refuse(f"hello: local rank {local_rank} is already connected")
        peer.local_rank = local_rank
        peer.rank = msg.get("rank") if isinstance(msg.get("rank"), int) else None
        return {}

    def _hand_over(self) -> str:
        """Move the state file out of the ranks' reach, then check and hash it there; '' or what went wrong.

        The check is of what was moved, where no rank can touch it: a check of the name before the move raced a
        rank that swapped a symbolic link in between (it won 4 races of 10), and the link, left at state_dest,
        was taken into the run folder as the state: the pack read whatever host file it named."""
        try:  # the name first, early and friendly; the check after the move is the one that holds
            if not stat.S_ISREG(os.lstat(self.state_src).st_mode):
                return f"{self.state_src.name} is not a regular file"
            os.rename(self.state_src, self.state_dest)
        except OSError as e:
            return f"cannot take the state: {e}"
        try:
            if not stat.S_ISREG(os.lstat(self.state_dest).st_mode):
                _discard(self.state_dest)
                return f"{self.state_src.name} is not a regular file"
            self.state_sha256 = _sha256_of(self.state_dest)
        except OSError as e:
            _discard(self.state_dest)
            return f"cannot take the state: {e}"
        return ""

    def _ranks(self) -> list[_Peer]:
        return [p for p in self._peers.values() if p.local_rank is not None]

    # ---- the clock's figures ----

    def credit(self) -> tuple[float, str]:
        """Seconds of warm-up off the clock, and why that much."""
        ranks = [*self._ranks(), *self._gone]
        if not any(p.warmup_begin is not None for p in ranks):
            return 0.0, "no warm-up"
        if self.nodes > 1:
            return 0.0, SEVERAL_NODES
        if len({p.local_rank for p in ranks}) < self.local_ranks or any(
            p.warmup_begin is None or p.warmup_end is None for p in ranks
        ):
            return 0.0, "not every rank of the node ran the warm-up to its end: none of it is off the clock"
        begin = max(p.warmup_begin for p in ranks if p.warmup_begin is not None)
        end = min(p.warmup_end for p in ranks if p.warmup_end is not None)
        last_end = max(p.warmup_end for p in ranks if p.warmup_end is not None)
        if self.first_data is not None and self.first_data < last_end:
            return 0.0, "a rank received training data before the warm-up ended: none of it is off the clock"
        span = max(end - begin, 0.0)
        if span > self.warmup_max_s:
            return self.warmup_max_s, f"capped at budget.warmup_max_s ({span:.2f} s ran)"
        return span, "every rank of the node in warm-up, no training data handed out yet"

    def warmup_running_s(self, now: float) -> float:
        """While every rank of the node is inside its warm-up (begun, not ended, no data handed out): its
        seconds so far, at most warmup_max_s. The deadline waits for a warm-up as long as it would be
        credited (a CPU compile on a busy machine can outlast train_s + grace_s)."""
        ranks = self._ranks()
        if (
            self.first_data is not None
            or self.nodes > 1
            or not ranks
            or len({p.local_rank for p in ranks}) < self.local_ranks
        ):
            return 0.0
        begun = [p.warmup_begin for p in ranks if p.warmup_begin is not None and p.warmup_end is None]
        if len(begun) < len(ranks):
            return 0.0
        return min(max(now - max(begun), 0.0), self.warmup_max_s)

    def end(self, exit_time: float) -> tuple[float, str]:
        """When the clock stopped: the state's handover (once hashed), else the last rank's done, else the phase's exit."""
        if self.handover is not None:
            return self.handover, "state_handover"
        ranks = [*self._ranks(), *self._gone]
        if len({p.local_rank for p in ranks}) == self.local_ranks and all(p.done is not None for p in ranks):
            return max(p.done for p in ranks if p.done is not None), "ranks_done"
        return exit_time, "exit"

    def verify_state(self) -> str:
        """After the phase: '' if the handed-over state is still what was hashed at the handover."""
        if self.state_sha256 is None:
            return ""
        try:
            now = _sha256_of(self.state_dest)
        except OSError as e:
            return f"the handed-over state cannot be read back: {e}"
        if now != self.state_sha256:
            return "the state file changed after it was handed over (a rank kept writing to it)"
        return ""

    def close(self) -> None:
        for peer in list(self._peers.values()):
            peer.sock.close()
            if peer.local_rank is not None:
                self._gone.append(peer)  # its requests still count: a rank whose exit was not read yet
        self._peers.clear()
        if self._sel is not None:
            self._sel.close()
        if self._listener is not None:
            self._listener.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        try:
            self.path.unlink()
        except OSError:
            pass
        try:
            self.path.parent.rmdir()
        except OSError:
            pass
