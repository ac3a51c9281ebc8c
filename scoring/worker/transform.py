"""A submitted reversible text transform (transform.py), run in a confined child, one child per split.

A submission's transform.py is submitted code: `pgolf data build|prove --transform FILE.py` and
`pgolf audit-tokenizer --transform FILE.py` never import it in the official's process. The contract
(docs/RULES.md "A submitted transform"): module-level

    NAME: str                          a short name (recorded in the manifest with the file's sha256)
    MARKERS: tuple[str, ...]           the characters it adds, each one character (each becomes one piece)
    def encode_text(text: str) -> str
    def decode_text(text: str) -> str  decode_text(encode_text(t)) == t, byte for byte

`ConfinedTransforms(path).for_split(split)` stages a copy of the file alone in a folder, resets the page
cache (isolation/world.py PageCacheReset, as the scorer does between worlds), and starts

    python -P -B -m scoring.worker.transform SPEC_JSON     (started by for_split; not by hand)

under plan_confined with read access to that staged folder and the Python installation only (not the
documents file). Texts go in and come back over two pipes, framed (`frame`: a u32 count, then per text a
u32 byte length and its UTF-8 bytes), a batch at a time. The child of one split is ended before the next
starts, and its temp folder (its HOME) is removed: what it saw of validation text cannot reach the child
that transforms the training text.

This side believes none of what comes back: exactly one valid UTF-8 text per input, each at most
4 x its input + 1 KiB, a batch at most MAX_REPLY_BYTES, within the deadline. Anything else is a
TransformFailure: one line naming the split and the document (its index in the batch's split).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from data.io import remove_tree
from scoring.worker.child import default_memory_limit_bytes, exit_how, one_line, run_child, where_raised

TRANSFORM_SPEC_FORMAT = "pg-transform-spec"
TRANSFORM_SPEC_VERSION = 2
"""2: a reply is K + frame, or X + {index, error} naming the text the transform raised on."""
TRANSFORM_TIMEOUT_S = 120.0
"""Per batch (and for the start): a transform that takes longer is refused."""
MAX_REPLY_BYTES = 1 << 30
STAGED_NAME = "transform.py"
_U32 = struct.Struct("<I")
OP_ENCODE, OP_DECODE = b"E", b"D"
REPLY_OK, REPLY_RAISED = b"K", b"X"
"""A reply: K + the frame, or X + JSON {index, error} when the transform raised on the batch's text `index`."""


class TransformFailure(ValueError):
    """The submitted transform failed, hung, or gave back something it may not (one printable line)."""


# ---- the framing (both sides) ----


def frame(texts: Sequence[str]) -> bytes:
    """u32 count, then per text u32 length + UTF-8 bytes."""
    parts = [_U32.pack(len(texts))]
    for t in texts:
        b = t.encode("utf-8")
        parts += [_U32.pack(len(b)), b]
    return b"".join(parts)


def unframe_bytes(data: bytes) -> list[bytes]:
    """The texts' bytes of one frame (ValueError when it is not exactly one frame)."""
    if len(data) < 4:
        raise ValueError("a frame shorter than its count")
    (n,) = _U32.unpack_from(data, 0)
    off, out = 4, []
    for _ in range(n):
        if off + 4 > len(data):
            raise ValueError("a frame cut short")
        (k,) = _U32.unpack_from(data, off)
        off += 4
        if off + k > len(data):
            raise ValueError("a frame cut short")
        out.append(data[off : off + k])
        off += k
    if off != len(data):
        raise ValueError("bytes after the frame")
    return out


def unframe(data: bytes) -> list[str]:
    return [b.decode("utf-8") for b in unframe_bytes(data)]


def _write_msg(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """Write one framed message; with a `deadline` the fd must be non-blocking (a child that stops reading
    its pipe cannot stall the trusted side past it: TimeoutError)."""
    data = _U32.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_msg(fd: int, deadline: float | None, limit: int) -> bytes:
    (n,) = _U32.unpack(_read_exact(fd, 4, deadline))
    if n > limit:
        raise OverflowError(n)
    return _read_exact(fd, n, deadline)


# ---- the trusted side ----


def _code_points(text: str) -> Any:
    import numpy as np

    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def unexplained_change(
    text: str, out: str, markers: Sequence[str], escapes: dict[str, str] | None = None
) -> str | None:
    """Why `out` (the transform's encoding of `text`) says more than a case transform may, or None.

    Checked on every encode reply: the reply less its declared markers must be `text` character for
    character, but for a character of another case (str.lower or str.casefold equal) or one standing where
    `text` has a marker character (its escape); and it may hold at most one marker per character so changed.
    Without this a reply could decode back to its document and still hand the tokenizer text of the
    transform's own (validation text it carries, spelled in the document's bytes) with the document hidden
    in zero-byte markers: the proof holds and the text reaches the training shards.

    An escape is one fixed character per marker: `escapes` (marker -> the character written for it) is kept
    by the caller across every reply of a transform (a fresh table per call when None). Any character at a
    marker's place let a transform that declares ordinary letters its markers spell text of its own there."""
    import numpy as np

    mset = set(markers)
    bare = out.translate(dict.fromkeys(map(ord, mset))) if mset else out
    added = len(out) - len(bare)
    if bare == text:
        return None if added == 0 else f"adds {added:,} marker(s) to a text it leaves unchanged"
    a, b = _code_points(bare), _code_points(text)
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n]) if n else a[:0]
    lo, lt = bare.lower(), text.lower()
    if len(lo) == len(bare) and len(lt) == len(text):  # fast path: positions still differing in lower case
        la, lb = _code_points(lo), _code_points(lt)
        suspect = diff[la[diff] != lb[diff]] if a.size == b.size else diff
    else:
        suspect = diff
    escapes = {} if escapes is None else escapes
    for i in (int(j) for j in suspect):
        x, y = bare[i], text[i]
        if x.lower() == y.lower() or x.casefold() == y.casefold():
            continue
        where = f"at byte {len(text[:i].encode('utf-8', 'surrogatepass')):,}"
        if y not in mset:
            return f"{where}: {y!r} became {x!r}"
        if escapes.setdefault(y, x) != x:
            return f"{where}: the marker {y!r} became {x!r}, elsewhere {escapes[y]!r} (one escape per marker)"
    if a.size != b.size:
        at = len(text[:n].encode("utf-8", "surrogatepass"))
        return f"at byte {at:,}: its text less the markers has {a.size:,} characters, the document {b.size:,}"
    if added > diff.size:
        return f"adds {added:,} markers for {diff.size:,} changed character(s)"
    return None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


BUILD_SPLITS = ("train", "val", "probe")
"""The splits of a build (a failure there leaves no dataset); `audit` and `declare` are not."""


class _SplitChild:
    """The one live child of a split: encode_texts / decode_texts, each one round trip per batch."""

    def __init__(self, split: str, child: Any, to_child: int, from_child: int, timeout_s: float):
        self.split, self.child, self.to_child, self.from_child = split, child, to_child, from_child
        self.timeout_s = timeout_s
        self.markers: tuple[str, ...] = ()
        """The markers its hello declared (each encode reply is held to them: unexplained_change)."""
        self.escapes: dict[str, str] = {}
        """Marker -> the one character its escape writes, the transform's across splits (unexplained_change)."""
        self.done = 0
        """Documents of this split already through encode (the index of a failing one is done + i)."""

    def _fail(self, what: str) -> TransformFailure:
        return TransformFailure(
            f"the submitted transform {what} (split {self.split})"
            + ("; no dataset was written" if self.split in BUILD_SPLITS else "")
        )

    def _call(self, op: bytes, texts: list[str], what: str) -> list[str]:
        payload = frame(texts)
        limit = min(MAX_REPLY_BYTES, 4 * len(payload) + 1024 * (len(texts) + 1))
        deadline = time.monotonic() + self.timeout_s
        try:
            _write_msg(self.to_child, op + payload, deadline)
            reply = _read_msg(self.from_child, deadline, limit)
        except TimeoutError:
            raise self._fail(f"did not {what} a batch within {self.timeout_s:g} s") from None
        except OverflowError:
            raise self._fail(f"gave back more than {limit:,} bytes for a batch of {len(texts)}") from None
        except (EOFError, BrokenPipeError):
            code = self.child.wait(5)
            said = self.child.error_line()
            how = "did not end" if code is None else exit_how(code)
            raise self._fail(f"failed to {what} a batch ({how})" + (f": {said}" if said else "")) from None
        if reply[:1] == REPLY_RAISED:
            try:
                said = json.loads(reply[1:])
                i, error = int(said["index"]), str(said["error"])
            except (ValueError, KeyError, TypeError, RecursionError):
                raise self._fail(f"gave back a malformed reply to {what}") from None
            raise self._fail(
                f"raised on document {self.done + i} of the split ({what}): {one_line(error, 200)}"
            )
        try:
            if reply[:1] != REPLY_OK:
                raise ValueError("no reply tag")
            outs = unframe_bytes(reply[1:])
        except ValueError as e:
            raise self._fail(f"gave back a malformed reply to {what} ({e})") from None
        if len(outs) != len(texts):
            raise self._fail(f"gave back {len(outs)} texts for {len(texts)} to {what}")
        result = []
        for i, (t, b) in enumerate(zip(texts, outs, strict=True)):
            doc = f"document {self.done + i} of the batch's split"
            if len(b) > 4 * len(t.encode("utf-8")) + 1024:
                raise self._fail(f"gave back {len(b):,} bytes for {doc} ({what}; at most 4 x input + 1 KiB)")
            try:
                result.append(b.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise self._fail(
                    f"gave back text that is not UTF-8 for {doc} ({what}, byte offset {e.start})"
                ) from None
        return result

    def encode_texts(self, texts: list[str]) -> list[str]:
        out = self._call(OP_ENCODE, texts, "encode")
        for i, (t, e) in enumerate(zip(texts, out, strict=True)):
            why = unexplained_change(t, e, self.markers, self.escapes)
            if why is not None:
                raise self._fail(
                    f"changed document {self.done + i} of the batch's split (encode) beyond case and markers {why}"
                )
        return out

    def decode_texts(self, texts: list[str]) -> list[str]:
        out = self._call(OP_DECODE, texts, "decode")
        self.done += len(texts)
        return out


CONFINEMENT_KEYS = (
    "mode",
    "landlock_abi",
    "namespaces",
    "seccomp",
    "separate_user",
    "guarantees",
    "missing_layers",
    "missing_allowed_by_official",
)
"""What a transform child's record keeps of its sandbox (not its temporary folders' paths)."""


def _confinement(split: str, sandbox: dict[str, Any], page_cache_reset: bool) -> dict[str, Any]:
    return {
        "split": split,
        **{k: sandbox.get(k) for k in CONFINEMENT_KEYS},
        "page_cache_reset_before": page_cache_reset,
    }


class ConfinedTransforms:
    """A submitted transform.py (data/proof.py SplitTransforms): one confined child per split, in turn."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sandbox: str = "auto",
        timeout_s: float = TRANSFORM_TIMEOUT_S,
        reset_page_cache: bool = True,
    ):
        self.path = Path(path).resolve()
        if not self.path.is_file():
            raise FileNotFoundError(f"--transform {path}: no such file (HINT: none, case, or a transform.py)")
        self.sandbox, self.timeout_s, self.reset_page_cache = sandbox, timeout_s, reset_page_cache
        self.sha256 = file_sha256(self.path)
        self._live = False
        self.children = 0
        """Children started so far (the page cache is reset before each one after the first)."""
        self.confinement: list[dict[str, Any]] = []
        """Each child's split and how it was confined (its sandbox's layers and guarantees): the manifest's."""
        self.name: str = ""
        self.markers: tuple[str, ...] = ()
        self.escapes: dict[str, str] = {}
        """Each marker's escape, as the first reply that escaped it wrote it: every child's is held to it."""
        with self.for_split("declare") as _:
            pass  # name and markers, from a child that sees no document

    @contextmanager
    def for_split(self, split: str) -> Iterator[_SplitChild]:
        from scoring.worker.confined import ConfinedChild, plan_confined

        if self._live:
            raise RuntimeError("one transform child at a time: close the other split's first")
        self._live = True
        root = Path(tempfile.mkdtemp(prefix="pgolf-transform-"))
        code_dir, tmp = root / "code", root / "tmp"
        code_dir.mkdir()
        tmp.mkdir()
        policy = root / "policy.json"
        staged = code_dir / STAGED_NAME
        shutil.copyfile(self.path, staged)
        if file_sha256(staged) != self.sha256:
            raise TransformFailure(f"{self.path} changed while it was staged")
        r1, w1 = os.pipe()  # trusted -> child
        r2, w2 = os.pipe()  # child -> trusted
        child = None
        try:
            plan = plan_confined(tmp, [code_dir], sandbox=self.sandbox)
            if self.reset_page_cache and self.children:  # the boundary between two children, as the scorer's
                from isolation.world import PageCacheReset

                cache = PageCacheReset.open(roots=[r.path for r in plan.rules if r.access == "ro"])
                try:
                    cache.reset()
                finally:
                    cache.close()
            self.children += 1
            self.confinement.append(
                _confinement(split, plan.describe(), self.children > 1 and self.reset_page_cache)
            )
            spec = {
                "format": TRANSFORM_SPEC_FORMAT,
                "format_version": TRANSFORM_SPEC_VERSION,
                "code_dir": str(code_dir),
                "file": str(staged),
                "in_fd": r1,
                "out_fd": w2,
                "memory_limit_bytes": default_memory_limit_bytes(),
            }
            child = ConfinedChild(plan, "scoring.worker.transform", spec, tmp, policy, pass_fds=(r1, w2))
            os.close(r1)
            os.close(w2)
            r1 = w2 = -1
            os.set_blocking(w1, False)  # writes to the child are bounded by the deadline too
            sc = _SplitChild(split, child, w1, r2, self.timeout_s)
            try:
                hello = _read_msg(r2, time.monotonic() + self.timeout_s, 1 << 20)
                info = json.loads(hello)
                name, markers = str(info["name"]), tuple(str(m) for m in info["markers"])
            except TimeoutError:
                raise sc._fail(f"did not start within {self.timeout_s:g} s") from None
            except (EOFError, OverflowError, ValueError, KeyError, TypeError, RecursionError):
                code = child.wait(5)
                said = child.error_line()
                raise sc._fail(
                    "failed to start"
                    + ("" if code is None else f" ({exit_how(code)})")
                    + (f": {said}" if said else "")
                ) from None
            if not name.isidentifier() or len(name) > 40:
                raise sc._fail(f"declares NAME {one_line(name, 60)!r}: expected a short identifier")
            for m in markers:
                if len(m) != 1:
                    raise sc._fail(
                        f"declares a marker {one_line(m, 20)!r} of {len(m)} characters: expected one"
                    )
            sc.markers, sc.escapes = markers, self.escapes
            if split == "declare":
                self.name, self.markers = name, markers
            elif (name, markers) != (self.name, self.markers):
                raise sc._fail("declared a different NAME or MARKERS than before")
            yield sc
        finally:
            for fd in (r1, w2, w1, r2):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if child is not None:
                child.wait(min(5.0, self.timeout_s))  # it ends at the closed pipe; else its group is killed
                child.close()
            remove_tree(root)  # the child wrote in it: however deep
            self._live = False


# ---- the confined side ----


def _serve(spec: dict[str, Any], memory: str) -> int:
    import importlib.util

    mspec = importlib.util.spec_from_file_location("submitted_transform", spec["file"])
    if mspec is None or mspec.loader is None:
        raise ImportError(f"cannot load {spec['file']}")
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    name, markers = mod.NAME, tuple(mod.MARKERS)
    encode, decode = mod.encode_text, mod.decode_text
    fin, fout = int(spec["in_fd"]), int(spec["out_fd"])
    _write_msg(fout, json.dumps({"name": name, "markers": list(markers)}).encode())
    while True:
        try:
            msg = _read_msg(fin, None, MAX_REPLY_BYTES)
        except EOFError:
            return 0
        fn = encode if msg[:1] == OP_ENCODE else decode
        outs = []
        for i, t in enumerate(unframe(msg[1:])):
            try:
                outs.append(fn(t))
            except Exception as e:  # noqa: BLE001 - reported, naming the text; the child then ends
                where = where_raised(e, spec["code_dir"])
                said = json.dumps({"index": i, "error": f"{type(e).__name__}: {e}{where}"})
                _write_msg(fout, REPLY_RAISED + said.encode())
                return 1
        _write_msg(fout, REPLY_OK + frame(outs))


def main(argv: list[str]) -> int:
    """The confined transform (scoring/worker/child.py: the spec, the limits, one error line, the exit status)."""
    return run_child(
        argv,
        spec_format=TRANSFORM_SPEC_FORMAT,
        spec_version=TRANSFORM_SPEC_VERSION,
        usage="python -m scoring.worker.transform SPEC_JSON  (started by pgolf data build --transform FILE.py)",
        body=_serve,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
