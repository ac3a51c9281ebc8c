"""The kernel interfaces the sandbox uses, through ctypes: Landlock, capabilities, loopback, tmpfs.

Landlock (Documentation/userspace-api/landlock.rst): `landlock_abi()` asks the kernel which version
it speaks (0: none); `apply_landlock(rules, abi, scope_signals)` builds a ruleset handling every
filesystem right that ABI knows, adds one path-beneath rule per allowed path, sets no_new_privs and
restricts the calling thread, irreversibly, for itself and everything it later starts. Rights a rule
grants beneath a folder: ro = execute + read files + list; rw = every right; list = list only;
dev = read/write/ioctl (for device files). With ABI >= 6 the ruleset also scopes signals (no signal
reaches a process outside the sandbox) and, asked with `scope_abstract_sockets`, abstract Unix sockets
(no connection to one bound outside the sandbox: a phase on the host's network reaches none of the
machine's). Used by isolation/sandbox.py (the training phase, applied before
exec) and scoring/score/confine.py (the scorer, applied to itself once it has read the validation data).

Path planning shared by both: `carve(root, protected)` (the children of a folder that cover all of
it except the protected paths), `python_roots` (the interpreter's folders), the system folders.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

SYSTEM_READ_ROOTS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
)
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
MAX_CARVED_RULES = 5_000
ACCESS_KINDS = ("ro", "rw", "list", "dev", "sock")
"""ro: read files, list and execute beneath; rw: everything beneath; list: list folders only; dev: read/write/ioctl a device;
sock: the folder of the supervisor's Unix socket (list only; a world binds it, the one shared inode a phase needs)."""

# ---- Landlock ABI (include/uapi/linux/landlock.h) ----
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
SYS_CAPGET, SYS_CAPSET, LINUX_CAPABILITY_VERSION_3 = 125, 126, 0x20080522


class PathRule(Protocol):
    # Read-only members: `Rule` (below) is a frozen dataclass.
    @property
    def path(self) -> str: ...
    @property
    def access(self) -> str: ...


def _fs_handled(abi: int) -> int:
    """Every filesystem right this ABI knows (1: bits 0-12, 2: +REFER, 3: +TRUNCATE, 5: +IOCTL_DEV)."""
    n = 13 + (abi >= 2) + (abi >= 3)
    mask = (1 << n) - 1
    return mask | (FS_IOCTL_DEV if abi >= 5 else 0)


def _rule_mask(kind: str, is_dir: bool, abi: int) -> int:
    file_bits = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
    mask = {
        "ro": FS_EXECUTE | FS_READ_FILE | FS_READ_DIR,
        "rw": _fs_handled(abi),
        "list": FS_READ_DIR,
        "sock": FS_READ_DIR,
        "dev": FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV,
    }[kind] & _fs_handled(abi)
    return mask if is_dir else mask & file_bits


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        v = _libc().syscall(
            SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION
        )
    except (OSError, AttributeError):
        return 0
    return max(int(v), 0)


def apply_landlock(
    rules: Sequence[PathRule], abi: int, scope_signals: bool, scope_abstract_sockets: bool = False
) -> None:
    """Restrict this process (and all it will start) to `rules`. Irreversible."""
    libc = _libc()
    scoped = (SCOPE_SIGNAL if scope_signals else 0) | (
        SCOPE_ABSTRACT_UNIX_SOCKET if scope_abstract_sockets else 0
    )
    attr = (ctypes.c_uint64 * 3)(_fs_handled(abi), 0, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for rule in rules:
            try:
                pfd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # vanished since planning
            try:
                is_dir = os.path.isdir(f"/proc/self/fd/{pfd}")
                beneath = struct.pack("=Qi", _rule_mask(rule.access, is_dir, abi), pfd)
                buf = ctypes.create_string_buffer(beneath, len(beneath))
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, LANDLOCK_RULE_PATH_BENEATH, buf, 0) != 0:
                    raise OSError(
                        ctypes.get_errno(),
                        f"landlock_add_rule({rule.path}): {os.strerror(ctypes.get_errno())}",
                    )
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def drop_capabilities() -> None:
    """Clear the bounding, ambient and inheritable sets and set no_new_privs: after exec, no capability."""
    libc = _libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.syscall(SYS_CAPGET, header, data) == 0:
        data[2] = data[5] = 0  # inheritable, both words
        libc.syscall(SYS_CAPSET, header, data)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def loopback_up() -> None:
    """Bring `lo` up in a fresh network namespace (SIOCSIFFLAGS: IFF_UP | IFF_LOOPBACK | IFF_RUNNING)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))


def private_tmpfs(path: str) -> None:
    """Mount a fresh tmpfs on `path` (in this process's own mount namespace: needs CAP_SYS_ADMIN there)."""
    libc = _libc()
    ms_nosuid, ms_nodev = 2, 4
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", ms_nosuid | ms_nodev, b"mode=1777") != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}: {os.strerror(ctypes.get_errno())}")


# ---- Path planning ----


def is_beneath(path: str, root: str) -> bool:
    """`path` is `root` or lies beneath it (both absolute, resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def carve(root: str, protected: Sequence[str], budget: list[int] | None = None) -> list[str]:
    """The children of `root`, recursively, that together cover everything beneath `root` except `protected`.

    A child whose real path is protected, or lies beneath a protected path, is left out; a child on
    the way to a protected path is split in turn. Symbolic links are judged by their targets.
    """
    budget = budget if budget is not None else [MAX_CARVED_RULES]
    out: list[str] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        real = os.path.realpath(entry.path)
        if any(is_beneath(real, p) for p in protected):
            continue
        if any(is_beneath(p, real) for p in protected):
            if entry.is_dir(follow_symlinks=True):
                out += carve(real, protected, budget)
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError(
                f"the sandbox needs more than {MAX_CARVED_RULES} rules to exclude {list(protected)} from {root}. "
                "HINT: keep datasets out of the Python installation and system folders (e.g. under ~/.cache/pgolf)"
            )
        out.append(entry.path)
    return out


def python_prefixes() -> list[str]:
    """The interpreter's installation prefixes (a virtual environment's and the base one's), as sys names them."""
    return [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]


def broad_read_roots(import_path: Iterable[str], project_root: Path) -> list[str]:
    """The folders a sandboxed phase reads whole, as broad rules (less what is hidden beneath them): the system
    folders, the Python installation and the import folders `import_path` (python_roots)."""
    return [*SYSTEM_READ_ROOTS, *python_roots(import_path, project_root)]


def python_roots(import_path: Iterable[str], project_root: Path) -> list[str]:
    """The interpreter's prefixes and the import folders the ranks will have (their sys.path), less the project."""
    roots = {*python_prefixes(), str(Path(os.path.realpath(sys.executable)).parents[1])}
    project = os.path.realpath(project_root)
    for p in import_path:
        real = os.path.realpath(p) if p else ""
        if real and os.path.exists(real) and not is_beneath(real, project):
            roots.add(real)
    return sorted(roots)


GPU_LIBRARY_PREFIXES = (
    "libcuda.",
    "libcudart",
    "libcublas",
    "libcudnn",
    "libcufft",
    "libcurand",
    "libcusolver",
    "libcusparse",
    "libcupti",
    "libnvrtc",
    "libnvJitLink",
    "libnvToolsExt",
    "libnvidia-",
    "libnccl",
    "libibverbs",
    "libmlx5",
    "librdmacm",
    "libefa",
    "libfabric",
)
"""Basenames of the CUDA, NCCL and fabric libraries a GPU phase loads (the driver's libcuda.so.1, the runtime,
NCCL and its network plugins, InfiniBand/EFA verbs)."""


def gpu_library_dirs(maps_text: str, ld_library_path: str, covered: Iterable[str]) -> list[str]:
    """Folders of CUDA/NCCL libraries (GPU_LIBRARY_PREFIXES) outside the `covered` read roots: those mapped in
    a process (`maps_text`: /proc/PID/maps) and the LD_LIBRARY_PATH folders that hold one (the driver's
    libcuda.so.1 is opened only when CUDA starts; the loader finds it there). Resolved, sorted, each once.

    A cluster's module system keeps CUDA and NCCL under folders of its own (/cm/shared/apps, /software, ...):
    without a rule for them a sandboxed rank could not load what the supervisor's torch already has."""
    roots = [os.path.realpath(c) for c in covered]
    found: set[str] = set()

    def add(folder: str) -> None:
        real = os.path.realpath(folder)
        if os.path.isdir(real) and not any(is_beneath(real, r) for r in roots):
            found.add(real)

    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5].strip().removesuffix(" (deleted)")
            if os.path.basename(path).startswith(GPU_LIBRARY_PREFIXES):
                add(os.path.dirname(path))
    for folder in ld_library_path.split(os.pathsep):
        if folder and os.path.isdir(folder):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            if any(n.startswith(GPU_LIBRARY_PREFIXES) and ".so" in n for n in names):
                add(folder)
    return sorted(found)


def loaded_gpu_library_dirs(covered: Iterable[str]) -> list[str]:
    """gpu_library_dirs of this process (/proc/self/maps) and its LD_LIBRARY_PATH."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    return gpu_library_dirs(maps, os.environ.get("LD_LIBRARY_PATH", ""), covered)


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    path: str
    access: str
    """One of ACCESS_KINDS."""

    def __post_init__(self) -> None:
        if self.access not in ACCESS_KINDS:
            raise ValueError(f"sandbox rule access must be one of {ACCESS_KINDS}, got {self.access!r}")


def broad_read_rules(
    path: str, prot: Sequence[str], hidden: Sequence[str], tmp: str, warnings: list[str]
) -> list[Rule]:
    """Read rules for a folder the phase did not make (system, Python, extra): never over a hidden path.

    `prot` must stay out of every rule, `hidden` (prot and the phase's own staging folder) out of
    every broad rule, and so must the temp folder as a whole (other runs stage their views there).
    """
    real = os.path.realpath(path)
    if any(is_beneath(real, p) for p in prot):
        warnings.append(
            f"read path {path} lies inside the protected {next(p for p in prot if is_beneath(real, p))}: left out"
        )
        return []
    if is_beneath(tmp, real):  # "/" or the temp folder itself: everything but the temp folder
        if real == tmp:
            warnings.append(f"read path {path} is the temp folder, where runs stage their data: left out")
        return [Rule(path=c, access="ro") for c in carve(real, [*hidden, tmp])]
    if any(is_beneath(h, real) for h in hidden):
        return [Rule(path=c, access="ro") for c in carve(real, hidden)]
    return [Rule(path=real, access="ro")]


def own_rules(
    read_paths: Iterable[str | Path], write_paths: Iterable[str | Path], prot: Sequence[str], who: str
) -> list[Rule]:
    """ro rules for a phase's own read paths (a protected path beneath one is carved out), rw rules for its write paths.

    A read path inside a protected one, or a write path overlapping one, is refused (ValueError naming `who`).
    """
    rules: list[Rule] = []
    for path in read_paths:
        rules += _read_rules(path, prot, (), who)
    for path in write_paths:
        real = os.path.realpath(path)
        if any(is_beneath(real, p) or is_beneath(p, real) for p in prot):
            raise ValueError(
                f"{who} write path {path} overlaps the protected {list(prot)}; write outside the dataset"
            )
        rules.append(Rule(path=real, access="rw"))
    return rules


def _not_code(package: str) -> list[str]:
    """What a package folder holds beyond Python code, resolved: every entry that is neither a .py file, nor a
    subpackage (a folder with __init__.py, searched in turn), nor a bytecode cache (__pycache__)."""
    out: list[str] = []
    try:
        entries = list(os.scandir(package))
    except OSError:
        return out
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name == "__pycache__":
                continue
            if os.path.isfile(os.path.join(entry.path, "__init__.py")):
                out += _not_code(entry.path)
                continue
        elif entry.is_file(follow_symlinks=False) and entry.name.endswith(".py"):
            continue
        out.append(os.path.realpath(entry.path))
    return out


def code_rules(packages: Iterable[str | Path], prot: Sequence[str]) -> list[Rule]:
    """ro rules for the Python code of `packages` (the harness's own) and nothing else kept in them.

    The reference challenge keeps its datasets at ./data/datasets, inside this project's `data` package: a rule
    for the whole package showed a rank every dataset there (another tokenizer's validation shards: the text).
    Anything but .py files, subpackages and bytecode caches is carved out, and so is every protected path."""
    rules: list[Rule] = []
    for package in packages:
        real = os.path.realpath(package)
        rules += _read_rules(package, prot, _not_code(real) if os.path.isdir(real) else (), "the package")
    return rules


def _read_rules(path: str | Path, prot: Sequence[str], left_out: Sequence[str], who: str) -> list[Rule]:
    """ro rules for `path`, less `left_out` and every protected path beneath it (carved); [] if it does not exist.
    A path inside a protected one is refused (ValueError naming `who`)."""
    real = os.path.realpath(path)
    if any(is_beneath(real, p) for p in prot):
        raise ValueError(
            f"{who} read path {path} lies inside the protected {list(prot)}; keep code and data apart"
        )
    # e.g. a dataset built inside the project's data/ package
    out = [*left_out, *(p for p in prot if is_beneath(p, real))]
    if out:
        return [Rule(path=c, access="ro") for c in carve(real, out)]
    return [Rule(path=real, access="ro")] if os.path.exists(real) else []


def device_rules(device: str) -> list[Rule]:
    """The usual device files; on CUDA also the GPUs and InfiniBand (NCCL across nodes)."""
    devices = [d for d in DEVICE_FILES if os.path.exists(d)]
    if device.startswith("cuda"):
        devices += sorted(
            str(p) for p in [*Path("/dev").glob("nvidia*"), Path("/dev/infiniband")] if p.exists()
        )
    return [Rule(path=d, access="dev") for d in devices]
