"""What crosses between the scorer and a model worker: small JSON messages and two shared buffers.

- Messages travel over a SOCK_SEQPACKET socket pair (message boundaries kept by the kernel), each a
  JSON object of at most MAX_MESSAGE_BYTES. The scorer treats every reply as hostile input: it is
  size-bounded, parsed, and every field it uses is type- and range-checked (`Reply`).
- Tensors travel through two anonymous shared-memory files (memfd) that the scorer creates and
  passes to the worker at start: `inbuf` (int64 token ids the scorer writes: a batch of windows and
  each row's scored range, or the tokens of a scored chunk for adaptation) and `outbuf` (float32
  logits the worker writes at the scored positions only, row major [N, V]: N = the positions in the
  rows' ranges, in row order; a sliding window's first L - stride positions never cross). Neither has a path, so no file rule is needed and nothing else can open them.
  After a `forward` reply, the scorer reads the logits out of `outbuf` into its own memory (the
  float64 loss buffer) before it sends the next message: the worker is idle then, and whatever it
  wrote later could only change values the scorer has already copied.
- On CUDA each side may register its mapping of a buffer as page-locked memory (scoring/worker/pinning.py,
  `SharedBuffer.pin`): the same bytes, copied by DMA; the scorer still copies the logits into a device
  tensor of its own, and waits for that copy, before it reads any of them. A buffer that cannot be
  registered stays pageable; the score is the same either way.

Messages, scorer -> worker (`op`): forward {rows, length} (inbuf: rows x length token ids, then
rows x 2 scored ranges [from, to) of each row); chunk_begin {chunk}; adapt {chunk, n,
first_position}; quit. Worker -> scorer: ready {output, pid, facts}; ok {shape: [N, V]} (forward) or
ok {} (the others); error {kind, message} with kind one of ERROR_KINDS.

Every batch asks for its scored positions the same way (a probe batch too, with the ranges of the
batch it varies), so the ranges tell a worker nothing about whether it is being probed; what a
scored position depends on is what the probes check.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import resource
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scoring.statuses import Status
from scoring.worker.pinning import Registrar

WIRE_VERSION = 2
"""2: a forward answers the scored positions only ([N, V]); 1 answered [B, L, V]."""
MAX_MESSAGE_BYTES = 1 << 16
ERROR_KINDS = (Status.ERROR, Status.ILLEGAL, Status.OUT_OF_MEMORY)
"""How a worker says it failed: its code raised, it broke a rule (score-first), or it ran out of memory."""


class WorkerGone(RuntimeError):
    """The worker closed its end (it exited or was killed)."""


class ProtocolError(ValueError):
    """A message between scorer and model worker that breaks the protocol (too big, not JSON, wrong fields):
    the worker is not believed. (harness/train/wire.py's WireError is the training ranks' wire to the clock.)"""


class BadAnswer(ValueError):
    """A model's answer the scorer refuses (another shape than asked, another width than its earlier answers,
    values it cannot score): the submission's failure, never the scorer's (scoring/score/cli.py origin_of); in a
    probe worker, a failed probe (scoring/score/probes.py)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(scorer end, worker end); the worker end is inheritable so it survives exec."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.set_inheritable(True)
    return a, b


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    data = json.dumps(msg, allow_nan=False).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    sock.sendall(data)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def recv(sock: socket.socket, timeout_s: float | None = None) -> dict[str, Any]:
    """One message; TimeoutError past `timeout_s`, WorkerGone at end of stream, ProtocolError if malformed."""
    sock.settimeout(timeout_s)
    data = sock.recv(MAX_MESSAGE_BYTES + 1)
    if not data:
        raise WorkerGone("the worker closed the connection")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a message over {MAX_MESSAGE_BYTES} bytes")
    try:
        # NaN and Infinity are no JSON (`send` never writes one): taken, a worker's NaN reached the score record,
        # whose writer (allow_nan=False) then failed, the run "a harness failure" whatever its probes found
        msg = json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # deep nesting: RecursionError
        raise ProtocolError(f"a message that is not JSON: {data[:80]!r}") from e
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message that is not an object: {data[:80]!r}")
    return msg


@dataclass(frozen=True)
class Reply:
    """A worker's reply, checked field by field."""

    kind: str
    """"ready", "ok" or "error"."""
    fields: dict[str, Any]

    @staticmethod
    def parse(msg: dict[str, Any]) -> Reply:
        kind = msg.get("reply")
        if kind not in ("ready", "ok", "error"):
            raise ProtocolError(f"a reply of unknown kind {kind!r}")
        if kind == "error":
            if msg.get("kind") not in ERROR_KINDS or not isinstance(msg.get("message"), str):
                raise ProtocolError("an error reply without a known kind and a message")
        return Reply(kind, msg)

    def shape(self, positions: int, vocab_size: int, max_vocab: int) -> tuple[int, int]:
        """The [N, V] of a forward reply, checked against the positions asked for and the buffer's room."""
        s = self.fields.get("shape")
        if not (isinstance(s, list) and len(s) == 2 and all(type(v) is int for v in s)):
            raise ProtocolError(f"a forward reply without an [N, V] shape: {s!r}")
        if s[0] != positions or not vocab_size <= s[1] <= max_vocab:
            raise BadAnswer(
                f"model returned logits of shape {tuple(s)} at the scored positions; expected ({positions}, V) "
                f"with {vocab_size} <= V <= {max_vocab}"
            )
        return s[0], s[1]


def check_ranges(ranges_B2: np.ndarray, rows: int, length: int) -> np.ndarray:
    """The scored ranges of a forward, as int64 [rows, 2], each 0 <= from <= to <= length (ValueError otherwise)."""
    r = np.asarray(ranges_B2, dtype=np.int64).reshape(rows, 2)
    if r.size and not (np.all(r[:, 0] >= 0) and np.all(r[:, 0] <= r[:, 1]) and np.all(r[:, 1] <= length)):
        raise ValueError(f"scored ranges outside [0, {length}]: {r[:4].tolist()}...")
    return r


def scored_positions(ranges_B2: np.ndarray, length: int) -> np.ndarray:
    """Flat indices (row * length + offset) of the positions in the rows' ranges, in row order."""
    offs = np.arange(length, dtype=np.int64)
    mask_BL = (offs[None, :] >= ranges_B2[:, :1]) & (offs[None, :] < ranges_B2[:, 1:])
    return np.flatnonzero(mask_BL.reshape(-1))


def select_scored(out_BLV: torch.Tensor, ranges_B2: np.ndarray) -> torch.Tensor:
    """out_BLV at the positions in each row's range [from, to), row by row: [N, V] (a view when every row
    has the same range: a standard batch, or a batch of full sliding windows)."""
    B, L, V = out_BLV.shape
    if B == 0:
        return out_BLV.reshape(0, V)
    a, b = int(ranges_B2[0, 0]), int(ranges_B2[0, 1])
    if np.all(ranges_B2[:, 0] == a) and np.all(ranges_B2[:, 1] == b):
        return out_BLV[:, a:b].reshape(B * (b - a), V) if (a, b) != (0, L) else out_BLV.reshape(B * L, V)
    idx = torch.from_numpy(scored_positions(ranges_B2, L)).to(out_BLV.device)
    return out_BLV.reshape(B * L, V).index_select(0, idx)


class SharedBuffer:
    """A memfd-backed buffer mapped in both processes; grown by its creator, re-mapped by the other side.

    On CUDA a side may `pin` its mapping (scoring/worker/pinning.py): registered as page-locked memory, and
    registered again whenever it is re-mapped (a grow on the creator's side, a new size announced on the
    other), unregistered before any mapping is closed. A registration that fails leaves the buffer pageable
    (`pinned` False, `pin_why` the reason): the copies work either way, only their speed differs."""

    def __init__(self, fd: int, nbytes: int):
        self.fd = fd
        self.nbytes = 0
        self._map: mmap.mmap | None = None
        self._registrar: Registrar | None = None
        self._registered: int | None = None
        """The address registered with `_registrar` (None: nothing registered)."""
        self.pin_why = "not asked"
        """Why the buffer is pageable ("" while pinned)."""
        self.remap(nbytes)

    @staticmethod
    def create(name: str, nbytes: int) -> SharedBuffer:
        fd = os.memfd_create(f"pgolf-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, max(nbytes, 8))
        # the worker may not shrink it under the scorer's mapping (a read past the end would be SIGBUS)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        os.set_inheritable(fd, True)
        return SharedBuffer(fd, max(nbytes, 8))

    @property
    def pinned(self) -> bool:
        return self._registered is not None

    def pin(self, registrar: Registrar | None) -> bool:
        """Register this mapping as page-locked memory with `registrar` (None: no CUDA device, reason "cpu"),
        now and after every re-map; whether it is pinned now (`pin_why` says why not)."""
        if registrar is None:
            self.pin_why = "cpu"
            return False
        if self._registered is None:
            self._registrar = registrar
            self._register()
        return self.pinned

    def _address(self) -> int:
        assert self._map is not None
        view = np.frombuffer(self._map, dtype=np.uint8, count=1)
        address = int(view.ctypes.data)
        del view  # no export of the mapping may outlive this call (it could not be closed)
        return address

    def _register(self) -> None:
        assert self._registrar is not None and self._registered is None
        address = self._address()
        try:
            code = self._registrar.register(address, self.nbytes)
        # noqa reason: an optimisation may not fail a score, whatever the CUDA runtime raises (no CUDA in this
        # build, a driver refusal, an out-of-range pointer): the buffer stays on the pageable path, recorded
        except Exception as e:  # noqa: BLE001
            self.pin_why = (
                f"cudaHostRegister of {self.nbytes} bytes raised {type(e).__name__}: {str(e)[:200]}"
            )
            return
        if code != 0:
            self.pin_why = f"cudaHostRegister of {self.nbytes} bytes returned {code}" + _memlock_note()
            return
        self._registered, self.pin_why = address, ""

    def _unregister(self) -> None:
        """Before the mapping closes: the registration must not outlive the pages it names."""
        if self._registered is None:
            return
        assert self._registrar is not None
        address, self._registered = self._registered, None
        try:
            code = self._registrar.unregister(address)
        except Exception as e:  # noqa: BLE001 - as in _register: recorded, never a failed score
            self.pin_why = f"cudaHostUnregister raised {type(e).__name__}: {str(e)[:200]}"
            self._registrar = None  # a registration of unknown state: never register this buffer again
            return
        if code != 0:
            self.pin_why = f"cudaHostUnregister returned {code}"
            self._registrar = None

    def grow(self, nbytes: int) -> None:
        """Creator side: make room for `nbytes` (the other side re-maps when told the new size)."""
        if nbytes > self.nbytes:
            os.ftruncate(self.fd, nbytes)
            self.remap(nbytes)

    def remap(self, nbytes: int) -> None:
        if self._map is not None and nbytes == self.nbytes:
            return
        if os.fstat(self.fd).st_size < nbytes:
            raise ProtocolError(f"shared buffer holds {os.fstat(self.fd).st_size} bytes, {nbytes} announced")
        if self._map is not None:
            self._unregister()
            self._map.close()
        self._map = mmap.mmap(self.fd, nbytes)
        self.nbytes = nbytes
        if self._registrar is not None:
            self._register()

    def array(self, dtype: np.dtype[Any] | type | str, count: int) -> np.ndarray:
        """A numpy view of the first `count` items (no copy)."""
        assert self._map is not None
        return np.frombuffer(self._map, dtype=dtype, count=count)

    def tensor(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """A torch view of the first `count` items (no copy): valid until the buffer is re-mapped."""
        np_dtype = {torch.int64: np.int64, torch.float32: np.float32}[dtype]
        return torch.from_numpy(self.array(np_dtype, count))

    def close(self) -> None:
        self._unregister()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still exported: the mapping goes with the process
                pass
            self._map = None
        try:
            os.close(self.fd)
        except OSError:
            pass


def _memlock_note() -> str:
    """RLIMIT_MEMLOCK, for a failed registration's reason (a limit too low is the usual cause)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return f" (RLIMIT_MEMLOCK {'unlimited' if soft == resource.RLIM_INFINITY else f'{soft} bytes'})"
