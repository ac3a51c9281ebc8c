"""A world of its own for every sandboxed process: its own root, its own inodes, its own uid.

Every process that runs submitted code (training ranks, the sealed pack, the model worker, probe
workers, every confined child) enters through `isolation.sandbox enter`, which, on a machine that
allows it (root, a mount namespace, overlayfs), builds the process a private world before anything
of the submission runs (`build_world`, called as the namespace's first process, with the policy the
trusted side wrote):

- **Its own root.** A fresh tmpfs becomes `/` (pivot_root); only the paths of the sandbox's rules
  exist in it. A folder it may read is a read-only overlay of the real one: the overlay's inodes
  belong to this world's own superblock, so a lock (flock, POSIX or OFD byte ranges) taken on a file
  of the Python installation, the staged code or a system folder is seen by no other world, and a
  change of mode, times or extended attributes fails (EROFS) on every file, whoever asks. A mount
  beneath such a folder (a GPU host's driver at /usr/local/nvidia under /usr) is placed the same way,
  or its overlay would show an empty folder (the first H200 run: no libcuda in the world). A single
  file it may read (the artifact, a spec) is copied into the tmpfs: a private inode. Device files
  are made anew (mknod) on the tmpfs, so even /dev/null is this world's own inode. /proc is a fresh
  mount of the world's PID namespace; /sys a read-only overlay (in both, /proc/locks and the machine's
  event counters are empty files: MASKED_FILES); /dev/shm a tmpfs of its own, with a size; the root
  itself is remounted read-only once built.
- **Its own uid.** The world's processes run as a uid and gid drawn at random per world from a range
  no account uses (WORLD_UID_BASE + [0, WORLD_UID_SPAN)), with no supplementary groups: they own no
  file of the host, hold no capability, share no user keyring, and cannot signal another world.
  The folders it may write (its own phase folder) are handed to that uid first.
- **Its memory counted.** Where a memory cgroup can be made (cgroup v1 `memory` or v2 with the
  controller delegated), the world's first process joins a cgroup of its own whose limit is the
  sandbox's memory limit: anonymous memory, tmpfs and /dev/shm pages and memfds are all charged to
  it. Without one, the tmpfs mounts are sized and memfd_create and memfd_secret are refused by the seccomp filter
  (isolation/seccomp.py), so no memory escapes RLIMIT_AS uncounted.

What is still shared, and why it carries no useful bit, is in docs/ARCHITECTURE.md ("A world of its
own, and the channels it closes"): page-cache residency, which a world can set by reading and a later
one read by timing or its fault count, is emptied between the scorer's workers (PageCacheReset,
below); CPU caches, timing and global counters reach only worlds alive at the same time. The trusted
side plans a world with `plan_world` and records
`WorldPlan.describe()`; `build_world` returns the facts it could establish.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import secrets
import shutil
import signal
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from isolation.landlock import is_beneath

WORLD_UID_BASE = 1_500_000_000
WORLD_UID_SPAN = 1 << 28
"""Worlds run as uid = gid = WORLD_UID_BASE + a random offset below WORLD_UID_SPAN (no account uses them)."""
COPY_MAX_BYTES = 256 << 20
"""A single readable file up to this size is copied into the world (a private inode); a larger one is
bind-mounted read-only (recorded: its locks are shared with whoever else can open it)."""
SHM_DEFAULT_BYTES = 1 << 30
ROOT_SLACK_BYTES = 16 << 20
CGROUP_PREFIX = "pgolf-world-"
CGROUP_SWEEP_AGE_S = 30.0
OLD = "/.pgolf-old-root"
PRIVATE_FILES = "/.pgolf-files"
"""Where the world keeps its private copies of files that are mount points beneath a folder it reads."""
SUBMOUNT_COPY_MAX_BYTES = 1 << 20
"""A file mounted beneath a readable folder up to this size is copied (a private inode); a larger one is bound."""
NO_SUBMOUNTS = ("/proc", "/sys", "/dev", "/etc")
"""Folders whose mounts beneath are never placed: the kernel's own views (cgroups, debugfs, securityfs...), and
/etc, where a host mounts its configuration and secrets (a Kubernetes Secret or ConfigMap, a container's
resolv.conf): a world sees /etc as the image has it, which is all a single node needs (no DNS, loopback only)."""
EMPTY = "/.pgolf-empty-layer"
EMPTY_FILE = "/.pgolf-empty-file"
MASKED_FILES = (
    "/proc/locks",
    "/proc/vmstat",
    "/proc/zoneinfo",
    "/proc/softirqs",
    "/proc/interrupts",
    "/proc/diskstats",
    "/proc/pressure",
    "/sys/devices/system/node/node*/vmstat",
    "/sys/devices/system/node/node*/numastat",
    "/sys/kernel/mm/transparent_hugepage/hugepages-*/stats",
    "/sys/block/*/stat",
    "/sys/block/*/*/stat",
    "/sys/fs/ext4/*/*_write_kbytes",
)
"""Files of a world's /proc and /sys shown empty (an empty read-only file bound over each path the pattern
matches, an empty folder over a folder, as container runtimes mask /proc/kcore). /proc/locks lists an OFD lock
(F_OFD_SETLK) of every process of the machine, since such a lock belongs to no process and so to no PID
namespace, each with a byte range its holder chose: a channel of kilobits per read between worlds alive at the
same time (a scoring run's worker and another run's ranks). The others hold counts for the whole machine that
only grow and that a world moves at will: each mlock of a page is one more unevictable_pgs_mlocked, each huge
page faulted in one more anon_fault_alloc, each packet on its own loopback one more NET_RX softirq, each write it
forces to its disk one more of the device's, each second two of its processes share a CPU a second more of the
CPU's pressure total (and pages dirtied, NUMA hits, interrupts, bytes written). A closed
world left a number there that the next world read back, exactly where nothing but the world's own work moves
the count (16 bits a counter, dozens of counters). /proc/stat holds the softirq counts again and the machine's
fork count: ZEROED_PROC_STAT."""
ZEROED_PROC_STAT = "/.pgolf-proc-stat"
"""The world's /proc/stat: the machine's, read as the world is built, with every count zero but the boot time (and
one process running): the lines programs read there (a line per CPU, btime) stay, and no count of the machine's
(forks, interrupts, softirqs, context switches, CPU time) reaches the world."""

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1


class _PathRule(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def access(self) -> str: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class WorldPlan:
    """What `build_world` will make (a part of the sandbox policy; `describe()` goes into the records)."""

    uid: int
    """The world's uid and gid (WORLD_UID_BASE + a random offset)."""
    shm_bytes: int = SHM_DEFAULT_BYTES
    """Size of the world's /dev/shm tmpfs (and the ceiling of the root tmpfs beyond its copied files)."""
    memory_limit_bytes: int = 0
    """The memory cgroup's limit (0: no cgroup wanted)."""
    protected: tuple[str, ...] = ()
    """Paths no rule reaches (the dataset, the validation shards): a mount that shows one is never placed."""

    def policy(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "root": "private tmpfs; readable folders as read-only overlays, readable files copied",
            "devices": "made anew in the world (private inodes)",
            "shm_bytes": self.shm_bytes,
            "memory_cgroup_limit_bytes": self.memory_limit_bytes or None,
        }


def plan_world(memory_limit_bytes: int, protected: Sequence[str] = ()) -> WorldPlan:
    """A world with a fresh uid; /dev/shm sized to a quarter of the memory limit (at most 1 GiB)."""
    shm = min(SHM_DEFAULT_BYTES, memory_limit_bytes // 4) if memory_limit_bytes else SHM_DEFAULT_BYTES
    return WorldPlan(
        uid=WORLD_UID_BASE + secrets.randbelow(WORLD_UID_SPAN),
        shm_bytes=max(shm, 64 << 20),
        memory_limit_bytes=memory_limit_bytes,
        protected=tuple(protected),
    )


def overlay_supported() -> bool:
    try:
        return any(
            line.split()[-1] == "overlay" for line in Path("/proc/filesystems").read_text().splitlines()
        )
    except OSError:
        return False


# ---- system calls ----


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    enc = [x.encode() if x is not None else None for x in (src, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} {src or ''} on {target}: {os.strerror(err)}")


def _pivot_root(new: str, put_old: str) -> None:
    libc = _libc()
    if libc.syscall(155 if os.uname().machine == "x86_64" else 41, new.encode(), put_old.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root({new}, {put_old}): {os.strerror(err)}")


def _umount(target: str) -> None:
    if _libc().umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


# ---- the memory cgroup ----


def _cgroup_base() -> Path | None:
    """The folder under which this process may make a memory cgroup (v1 `memory`, or v2 delegated), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
            if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
                return base
    v2 = Path("/sys/fs/cgroup")
    for line in lines:
        if line.startswith("0::"):
            base = v2 / line[3:].lstrip("/")
            try:
                delegated = "memory" in (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = False
            if delegated and os.access(base, os.W_OK):
                return base
    return None


def memory_cgroup_available() -> bool:
    return _cgroup_base() is not None


def sweep_cgroups(now: float | None = None) -> int:
    """Remove this harness's empty world cgroups older than CGROUP_SWEEP_AGE_S (a world cannot remove its own)."""
    base = _cgroup_base()
    if base is None:
        return 0
    now = time.time() if now is None else now
    removed = 0
    for d in base.glob(CGROUP_PREFIX + "*"):
        try:
            if now - d.stat().st_mtime > CGROUP_SWEEP_AGE_S and not (d / "cgroup.procs").read_text().strip():
                d.rmdir()
                removed += 1
        except OSError:
            continue
    return removed


def _join_cgroup(uid: int, limit_bytes: int) -> str | None:
    base = _cgroup_base()
    if base is None:
        return None
    group = base / f"{CGROUP_PREFIX}{uid}-{os.getpid()}-{secrets.token_hex(4)}"
    group.mkdir(mode=0o755)
    limit_file = "memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max"
    (group / limit_file).write_text(str(limit_bytes))
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return str(group)


# ---- building the root ----


def _ensure_dir(path: str, depth: int = 0) -> None:
    """Make `path` a folder in the new root, recreating any symbolic link the old root has on the way."""
    if depth > 40:
        raise OSError(40, f"too many symbolic links on the way to {path}")
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/")) or "/"
    if parent != path:
        _ensure_dir(parent, depth + 1)
    old = OLD + path
    if os.path.islink(old) and not os.path.lexists(path):
        os.symlink(os.readlink(old), path)
        _ensure_dir(os.path.realpath(path), depth + 1)
    elif not os.path.lexists(path):
        os.mkdir(path, 0o755)


def _make_node(path: str, st: os.stat_result) -> None:
    os.mknod(path, stat.S_IFMT(st.st_mode) | stat.S_IMODE(st.st_mode), st.st_rdev)
    os.chmod(path, stat.S_IMODE(st.st_mode))  # mknod applies the umask


def _copy_devices(src: str, dst: str) -> None:
    st = os.stat(src)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        _make_node(dst, st)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dst, 0o755)
        for name in sorted(os.listdir(src)):
            _copy_devices(os.path.join(src, name), os.path.join(dst, name))


def _read_only_folder(path: str) -> None:
    _mount("overlay", path, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, f"lowerdir={OLD + path}:{EMPTY}")


def _bind_read_only(source: str, path: str) -> None:
    _mount(source, path, None, MS_BIND)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _bind_host_read_only(old: str, path: str, facts: dict[str, list[str]]) -> None:
    """The host's inode itself, read-only: recorded (its locks are shared with whoever else can open it)."""
    _bind_read_only(old, path)
    facts["bound_files"].append(path)


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo: space, tab, newline and backslash are escaped in octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_table() -> list[tuple[str, str, str]]:
    """(device major:minor, root of the mount within its file system, mount point) of this process's mounts, in
    the order the kernel lists them (a mount stacked on another comes after it)."""
    # the old root's /proc (this world's own is mounted later, or not yet): it shows this process's mounts too
    where = next(
        (p for p in (OLD + "/proc/self/mountinfo", "/proc/self/mountinfo") if os.path.exists(p)), None
    )
    if where is None:
        return []
    table = []
    with open(where, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                table.append((fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return table


def _mounts_beneath(path: str, table: Sequence[tuple[str, str, str]]) -> list[str]:
    """The old root's mount points strictly beneath `path` (as paths of the new root), shallowest first, once each."""
    prefix = OLD + path.rstrip("/") + "/"
    found = {point[len(OLD) :] for _, _, point in table if point.startswith(prefix)}
    return sorted(found, key=lambda p: (p.count("/"), p))


def _where_in_file_system(table: Sequence[tuple[str, str, str]], path: str) -> tuple[str, str] | None:
    """(device, path within that file system) of `path` (a path as the table names it), through the mount that
    shows it: the deepest mount point above it, the last one mounted there."""
    best: tuple[str, str, str] | None = None
    for dev, root, point in table:
        if is_beneath(path, point) and (best is None or len(point) >= len(best[2])):
            best = (dev, root, point)
    if best is None:
        return None
    dev, root, point = best
    rest = path[len(point) :].lstrip("/") if point != "/" else path.lstrip("/")
    return dev, (root.rstrip("/") + "/" + rest).rstrip("/") or "/"


def _shows_protected(
    table: Sequence[tuple[str, str, str]], point: str, protected: Sequence[tuple[str, str]]
) -> bool:
    """Whether the mount at `point` (the table's last there) shows a protected path or a part of one: the same
    file system, and its root above, at or beneath the protected path there (a bind mount, a volume mounted twice)."""
    mine = [(dev, root) for dev, root, p in table if p == point]
    if not mine:
        return False
    dev, root = mine[-1]
    return any(dev == pdev and (is_beneath(prel, root) or is_beneath(root, prel)) for pdev, prel in protected)


@dataclass(frozen=True)
class _OldMounts:
    """The old root's mount table, read once per world after pivot_root (the world's own mounts, made at other
    paths, never change it), and where each protected path lies in its file system."""

    table: list[tuple[str, str, str]]
    protected: list[tuple[str, str]]

    @classmethod
    def read(cls, protected: Sequence[str]) -> _OldMounts:
        table = _mount_table()
        return cls(table, [w for p in protected if (w := _where_in_file_system(table, OLD + p)) is not None])


def _place_mounts_beneath(path: str, facts: dict[str, list[str]], mounts: _OldMounts) -> None:
    """A folder's overlay shows only the file system it is on: a mount beneath it (a GPU host's driver at
    /usr/local/nvidia under /usr, a container's /etc/hosts) would be an empty folder or the file it hides. Each is
    placed too, as the folder itself is: a folder as a read-only overlay (its own inodes), a small file as a
    private copy bound over the path; anything else, or an overlay the kernel refuses, as a read-only bind of
    the host's (recorded in bound_files: its locks are shared with whoever else can open it)."""
    if any(is_beneath(path, top) for top in NO_SUBMOUNTS):
        return
    for rel in _mounts_beneath(path, mounts.table):
        old = OLD + rel
        if _shows_protected(mounts.table, old, mounts.protected):
            facts["protected_mounts_left_out"].append(rel)
            continue  # the dataset again, at another path: the world shows the folder beneath, as before
        try:
            st = os.stat(old)
        except OSError:
            continue
        if not os.path.lexists(rel):
            continue  # beneath a mount this world does not show
        if stat.S_ISDIR(st.st_mode):
            try:
                _read_only_folder(rel)
            except OSError:
                _bind_host_read_only(old, rel, facts)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= SUBMOUNT_COPY_MAX_BYTES:
            os.makedirs(PRIVATE_FILES, mode=0o755, exist_ok=True)
            private = os.path.join(PRIVATE_FILES, str(len(os.listdir(PRIVATE_FILES))))
            try:
                shutil.copyfile(old, private)
            except (
                OSError
            ):  # the root's slack is spent (many such files): the host's inode, read-only, recorded
                if os.path.exists(private):
                    os.unlink(private)
                _bind_host_read_only(old, rel, facts)
                continue
            os.chmod(private, 0o444 | (stat.S_IMODE(st.st_mode) & 0o111))
            _bind_read_only(private, rel)
        else:
            _bind_host_read_only(old, rel, facts)


def _place(
    path: str,
    access: str,
    facts: dict[str, list[str]],
    shm_bytes: int,
    uid: int,
    mounts: _OldMounts,
) -> None:
    old = OLD + path
    if not os.path.lexists(old):
        return  # vanished since planning: Landlock skips it too
    _ensure_dir(os.path.dirname(path) or "/")
    if os.path.islink(old):
        if not os.path.lexists(path):
            os.symlink(os.readlink(old), path)
        return
    st = os.stat(old)
    if access == "list":
        _ensure_dir(path)
    elif path == "/proc":
        _ensure_dir(path)
        _mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    elif path == "/dev/shm":
        _ensure_dir(path)
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_bytes},mode=1777")
    elif access == "sock":  # the phase's own wire: bound (a socket is reached by its inode), handed over
        _ensure_dir(path)
        _mount(old, path, None, MS_BIND)
        _hand_over(old, uid)
    elif access == "dev":
        if not os.path.lexists(path):
            _copy_devices(old, path)
    elif access == "rw":
        _ensure_dir(path)
        _mount(old, path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
        _hand_over(old, uid)
    elif stat.S_ISDIR(st.st_mode):
        _ensure_dir(path)
        _read_only_folder(path)
        _place_mounts_beneath(path, facts, mounts)
    elif stat.S_ISREG(st.st_mode) and st.st_size <= COPY_MAX_BYTES:
        shutil.copyfile(old, path)
        os.chmod(path, 0o444 | (stat.S_IMODE(st.st_mode) & 0o111))
    else:  # a large file (or something odd): read-only bind, recorded
        Path(path).touch(0o444)
        _bind_host_read_only(old, path, facts)


def _mask_files() -> None:
    """MASKED_FILES of the world's /proc and /sys (once both are placed), each an empty read-only file or folder."""
    with open(EMPTY_FILE, "x"):
        pass
    os.chmod(EMPTY_FILE, 0o444)
    for pattern in MASKED_FILES:
        for path in sorted(glob.glob(pattern)):
            _bind_read_only(EMPTY if os.path.isdir(path) else EMPTY_FILE, path)
    if os.path.exists("/proc/stat"):
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            zeroed = _zeroed_stat(f.read())
        with open(ZEROED_PROC_STAT, "x", encoding="ascii") as f:
            f.write(zeroed)
        os.chmod(ZEROED_PROC_STAT, 0o444)
        _bind_read_only(ZEROED_PROC_STAT, "/proc/stat")


def _zeroed_stat(text: str) -> str:
    """/proc/stat's `text` with every number zero, the boot time kept and one process running (ZEROED_PROC_STAT)."""
    lines = []
    for line in text.splitlines():
        name, *fields = line.split() or [""]
        if name in ("btime", ""):
            lines.append(line)
        elif name == "procs_running":
            lines.append("procs_running 1")
        else:
            lines.append(" ".join([name, *("0" for _ in fields)]))
    return "\n".join(lines) + "\n"


def _hand_over(folder: str, uid: int) -> None:
    """The world's uid owns its write folder and what the trusted side put in it."""
    os.chown(folder, uid, uid)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
            except OSError:
                continue


def _root_bytes(rules: Sequence[_PathRule], shm_bytes: int) -> int:
    total = ROOT_SLACK_BYTES
    for r in rules:
        try:
            st = os.stat(r.path)
        except OSError:
            continue
        if r.access == "ro" and stat.S_ISREG(st.st_mode) and st.st_size <= COPY_MAX_BYTES:
            total += st.st_size + 4096
    return total


def build_world(rules: Iterable[_PathRule], plan: dict[str, Any]) -> dict[str, Any]:
    """Make this process's private world and become its uid (see the module docstring). Irreversible.

    Runs as root in a fresh mount + PID namespace, before Landlock and seccomp; the rules are the
    sandbox's (isolation/landlock.py Rule: ro, rw, list, dev), each path absolute.
    """
    uid = int(plan["uid"])
    rules = sorted(rules, key=lambda r: (r.path.count("/"), r.path))
    cwd = os.getcwd()
    facts: dict[str, Any] = {
        "uid": uid,
        "bound_files": [],
        "protected_mounts_left_out": [],
        "memory_cgroup": None,
    }
    protected = [os.path.normpath(str(p)) for p in plan.get("protected", ())]
    if plan.get("memory_limit_bytes"):
        facts["memory_cgroup"] = _join_cgroup(uid, int(plan["memory_limit_bytes"]))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    base = "/tmp"
    size = _root_bytes(rules, int(plan["shm_bytes"]))
    _mount("tmpfs", base, "tmpfs", MS_NOSUID, f"size={size},mode=0755")
    os.mkdir(base + OLD, 0o700)
    os.chdir(base)
    _pivot_root(".", "." + OLD)
    os.chdir("/")
    os.mkdir(EMPTY, 0o555)
    for top in sorted(os.listdir(OLD)):  # /bin -> usr/bin and the like, on merged-/usr systems
        if os.path.islink(f"{OLD}/{top}") and not top.startswith("."):
            os.symlink(os.readlink(f"{OLD}/{top}"), f"/{top}")
    mounts = _OldMounts.read(protected)
    for rule in rules:
        _place(os.path.normpath(rule.path), rule.access, facts, int(plan["shm_bytes"]), uid, mounts)
    _mask_files()
    _ensure_dir("/tmp")
    _ensure_dir("/dev")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        if not os.path.lexists(f"/dev/{name}"):
            os.symlink(target, f"/dev/{name}")
    _umount(OLD)
    os.rmdir(OLD)
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # a change of uid clears the parent-death signal `unshare --kill-child` armed: armed again, so that the
    # world still dies with the process that started it (the supervisor's kill reaches every rank)
    if _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    return facts


# ---- the page cache between worlds ----

DROP_CACHES = "/proc/sys/vm/drop_caches"
DROP_PAGES_AND_NAMES = b"3"
"""What `reset()` writes: 1 drops the page cache alone, 2 the dentries and inodes too; 3 both."""


class PageCacheReset:
    """Empties the page cache of what a world left there, at every boundary between worlds of one scoring.

    A world can make pages of a file it reads resident (read it) and a later world can tell resident
    from absent (the time of a read, or its major-fault count): an attacker carried 20 kbit/s this way
    from a closed main worker to its probe workers. Eviction by a world is refused (seccomp), so
    dropping every clean, unmapped page after a world closes (`reset()`) leaves the next world nothing
    of it: pages the trusted side keeps mapped stay resident, a constant no world controls.

    The names a world looked up are dropped too (the dentry and inode caches): a path it stat'ed stays
    cached on the host beneath its overlay, and a later world's stat of it took 7 us against 76 us
    uncached (255 of 256 bits through a reset of the page cache alone).

    Dirty pages are written back first (sync): drop_caches drops clean pages alone, and a world's writes to
    its own folder stayed dirty for up to 30 s, counted in the machine's /proc/meminfo (a closed world wrote
    300 MiB and the next world read 307,876 kB Dirty across the reset).

    `open()` opens /proc/sys/vm/drop_caches for writing while the process may (before the scorer
    confines itself, which keeps the descriptor); where it cannot (a container without
    CAP_SYS_ADMIN), `reset(roots)` walks `roots` and drops each regular file's pages with
    posix_fadvise (slower: seconds for a Python installation and /usr). `describe()` is recorded.
    """

    def __init__(self, fd: int | None, roots: Sequence[str] = ()) -> None:
        self.fd = fd
        self.roots = tuple(roots)
        self.how = (
            "drop_caches" if fd is not None else ("posix_fadvise over the read roots" if roots else "none")
        )
        self.resets = 0
        self.seconds = 0.0

    @classmethod
    def open(cls, roots: Sequence[str] = ()) -> PageCacheReset:
        try:
            return cls(os.open(DROP_CACHES, os.O_WRONLY | os.O_CLOEXEC), roots)
        except OSError:
            return cls(None, roots)

    def reset(self) -> None:
        t0 = time.perf_counter()
        os.sync()  # the pages a world wrote, clean now: dropped with the rest, and no Dirty count of its left
        if self.fd is not None:
            os.write(self.fd, DROP_PAGES_AND_NAMES)
        else:
            for root in self.roots:
                _fadvise_tree(root)
        self.resets += 1
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def describe(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "resets": self.resets,
            "seconds": round(self.seconds, 3),
        }


def _fadvise_tree(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(
                    os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                )
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)
