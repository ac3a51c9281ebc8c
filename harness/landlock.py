"""The kernel interfaces the sandbox uses, through ctypes: Landlock, capabilities, loopback, tmpfs.

Landlock (Documentation/userspace-api/landlock.rst): `landlock_abi()` asks the kernel which version
it speaks (0: none); `apply_landlock(rules, abi, scope_signals)` builds a ruleset handling every
filesystem right that ABI knows, adds one path-beneath rule per allowed path, sets no_new_privs and
restricts the calling thread, irreversibly, for itself and everything it later starts. Rights a rule
grants beneath a folder: ro = execute + read files + list; rw = every right; list = list only;
dev = read/write/ioctl (for device files). With ABI >= 6 the ruleset also scopes signals: no signal
reaches a process outside the sandbox. Called only from harness/sandbox.py.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# ---- Landlock ABI (include/uapi/linux/landlock.h) ----
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
SCOPE_SIGNAL = 1 << 1
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
SYS_CAPGET, SYS_CAPSET, LINUX_CAPABILITY_VERSION_3 = 125, 126, 0x20080522


class PathRule(Protocol):
    path: str
    access: str


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
        v = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(v), 0)


def apply_landlock(rules: Sequence[PathRule], abi: int, scope_signals: bool) -> None:
    """Restrict this process (and all it will start) to `rules`. Irreversible."""
    libc = _libc()
    attr = (ctypes.c_uint64 * 3)(_fs_handled(abi), 0, SCOPE_SIGNAL if scope_signals else 0)
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
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({rule.path}): {os.strerror(ctypes.get_errno())}")
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
