"""Decode an artifact in a confined process: packed with the submission's own codec.py, or with a built-in
codec (whose payload is the artifact's word: a zlib stream of zeros decompresses ten thousand fold).

A custom codec is submitted code: `pgolf unpack` (unpack_artifact, below) must
not import it in the official's process. `decode_confined(artifact, code_dir)` runs

    python -m scoring.worker.decode SPEC_JSON     (started by decode_confined; not by hand)

inside the model worker's sandbox (isolation/sandbox.py with the seccomp filter, as
scoring/score/remote.py's WorkerModel starts it: Landlock reads of the code folder, the artifact and
the Python installation only, one private temp folder to write; PID, mount and network namespaces
where the machine allows; no capabilities; an address-space limit). The process checks the code
against the artifact's hashes, decodes with the submission's codec, checks the tensors against the
header and writes them as a safetensors file (no pickle) into its temp folder.

This side believes none of it: once the process has ended (killed past a deadline), it opens that
file without following links, refuses anything but a regular file, checks every name and shape
against the artifact's header before it loads a byte of a tensor, and loads plain tensors. A
failing or hostile decode becomes a DecodeFailure (an ArtifactError: one line, printable).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from data.io import remove_tree
from scoring.artifact.codecs import CODECS, StateDict
from scoring.artifact.format import (
    Artifact,
    ArtifactError,
    artifact_codec,
    check_code_hashes,
    decode_state,
    read_artifact,
)
from scoring.worker.child import default_memory_limit_bytes, exit_how, one_line, run_child

DECODE_SPEC_FORMAT = "pg-decode-spec"
DECODE_SPEC_VERSION = 1
DECODE_TIMEOUT_S = 600.0
STATE_FILE = "state.safetensors"


class DecodeFailure(ArtifactError):
    """The confined decode failed, or gave back something other than the header's tensors."""


# ---- the trusted side ----


def decode_confined(
    artifact_path: str | os.PathLike[str],
    code_dir: str | os.PathLike[str] | None,
    *,
    sandbox: str = "auto",
    timeout_s: float = DECODE_TIMEOUT_S,
    memory_limit_bytes: int | None = None,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """The artifact's tensors, decoded in a confined process (see the module docstring): by the submission's
    codec.py, or by a built-in codec when `code_dir` is None (its payload is the artifact's word too)."""
    from scoring.worker.confined import ConfinedChild, plan_confined

    artifact_path = Path(artifact_path).resolve()
    code_path = Path(code_dir).resolve() if code_dir is not None else None
    artifact = read_artifact(artifact_path)  # the header is parsed here, by this process (no code runs)
    if code_path is not None:
        check_code_hashes(artifact, code_path)  # a friendly early refusal; the confined process checks again
    tmp = Path(tempfile.mkdtemp(prefix="pgolf-decode-", dir=workdir))
    policy = tmp.with_name(tmp.name + "-policy.json")  # outside the process's own folder
    child: ConfinedChild | None = None
    try:
        plan = plan_confined(tmp, [p for p in (code_path, artifact_path) if p is not None], sandbox=sandbox)
        spec = {
            "format": DECODE_SPEC_FORMAT,
            "format_version": DECODE_SPEC_VERSION,
            "code_dir": str(code_path) if code_path is not None else None,
            "artifact": str(artifact_path),
            "out": str(tmp / STATE_FILE),
            "memory_limit_bytes": default_memory_limit_bytes()
            if memory_limit_bytes is None
            else memory_limit_bytes,
        }
        child = ConfinedChild(plan, "scoring.worker.decode", spec, tmp, policy)
        code = child.wait(timeout_s)
        who = "the submission's codec" if code_path is not None else f"codec {artifact.codec_name}"
        if code is None:
            raise DecodeFailure(f"{who} did not decode {artifact_path.name} within {timeout_s:.0f} s")
        if code != 0:
            said = child.error_line()
            raise DecodeFailure(
                f"{who} failed to decode {artifact_path.name} ({exit_how(code)})"
                + (f": {said}" if said else "")
            )
        return _read_checked(tmp / STATE_FILE, artifact)
    finally:
        if child is not None:
            child.close()
        remove_tree(tmp)  # the codec wrote in it: however deep
        policy.unlink(missing_ok=True)


def _read_checked(path: Path, artifact: Artifact) -> dict[str, Any]:
    """Plain tensors from the file the confined process wrote: a regular file, no link, the header's names and
    shapes (checked before any tensor is loaded, so a hostile file cannot make this process allocate more)."""
    from safetensors import safe_open

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise DecodeFailure(f"the confined decode wrote no readable state file ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DecodeFailure("the confined decode's state file is not a regular file")
        want = artifact.header["tensors"]
        try:
            with safe_open(f"/proc/self/fd/{fd}", framework="pt") as f:
                names = set(f.keys())
                if names != set(want):
                    missing, extra = sorted(set(want) - names), sorted(names - set(want))
                    raise DecodeFailure(
                        f"the submission's codec decoded the wrong tensors: missing {missing[:5]}, "
                        f"unexpected {[one_line(n, 80) for n in extra[:5]]}"
                    )
                for name in want:
                    shape = list(f.get_slice(name).get_shape())
                    if shape != want[name]["shape"]:
                        raise DecodeFailure(
                            f"the submission's codec decoded {name} with shape {shape}, "
                            f"header says {want[name]['shape']}"
                        )
                state = {name: f.get_tensor(name) for name in want}
        except DecodeFailure:
            raise
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError, ...: a file this process did not write
            raise DecodeFailure(f"the confined decode's state file is not valid safetensors ({e})") from None
    finally:
        os.close(fd)

    class _Decoded:  # the header check of decode_state, once more, on what this process holds
        name = artifact.codec_name
        version = 0

        @staticmethod
        def encode(state: dict[str, Any]) -> bytes:
            raise NotImplementedError

        @staticmethod
        def decode(payload: bytes) -> dict[str, Any]:
            return state

    return decode_state(artifact, _Decoded())


def unpack_artifact(
    artifact_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    submission_dir: str | os.PathLike[str] | None = None,
) -> StateDict:
    """Decode an artifact and write the dequantized tensors as safetensors (a standard format).

    Every artifact decodes in a confined process (scoring/worker/decode.py) under its memory limit: the
    submission's own codec.py is submitted code, and a built-in codec's payload is the artifact's word (a
    98 KB int8_zlib payload of zeros decompressed to 400 MB here, 1.2 GB of memory: a 16 MB one would take
    the machine). This process reads back plain tensors, checked against the header, and writes `out`.
    """
    from safetensors.torch import save_file

    artifact = read_artifact(artifact_path)
    if artifact.codec_name in CODECS:
        state = decode_confined(artifact_path, None)
    elif submission_dir is None:
        raise ValueError(
            f"{artifact_path} was packed with the submission's own codec ({artifact.codec_name!r}): "
            "pass --submission, the folder it was packed from"
        )
    else:
        state = decode_confined(artifact_path, submission_dir)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_name(f".{Path(out).name}.tmp")
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(tmp),
        metadata={"model_config": json.dumps(artifact.model_config, sort_keys=True)},
    )
    os.replace(tmp, out)
    return state


# ---- the confined side ----


def _decode(spec: dict[str, Any], memory: str) -> int:
    import torch
    from safetensors.torch import save_file

    artifact = read_artifact(spec["artifact"])
    state = decode_state(artifact, artifact_codec(artifact, spec["code_dir"]))  # checks the code hashes first
    plain = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"the codec decoded {name} as {type(t).__name__}, not a tensor")
        # a plain, dense, contiguous CPU copy of its own (safetensors refuses tensors that share memory)
        plain[name] = t.detach().as_subclass(torch.Tensor).to("cpu").clone().contiguous()
    save_file(plain, spec["out"])
    return 0


def main(argv: list[str]) -> int:
    """The confined decode (scoring/worker/child.py: the spec, the limits, one error line, the exit status)."""
    return run_child(
        argv,
        spec_format=DECODE_SPEC_FORMAT,
        spec_version=DECODE_SPEC_VERSION,
        usage="python -m scoring.worker.decode SPEC_JSON  (started by pgolf unpack)",
        body=_decode,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
