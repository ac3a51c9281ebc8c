"""A seccomp filter for confined processes: the system calls that reach other processes or the kernel fail.

The model worker (scoring/worker/) applies it, through `isolation.sandbox enter`, before it imports
any submitted code. Denied with EPERM: ptrace, reading or writing another process's memory
(process_vm_readv/writev), kcmp, perf_event_open, bpf, userfaultfd, mounting, open_by_handle_at,
kernel modules, kexec, keyrings, reboot, swap and process accounting. Every world (profile "world",
training included) gets WORLD_DENIED: no page-cache queries or eviction, no keyrings, no reading the
kernel log, no new namespace (unshare, setns, clone with a CLONE_NEW* flag; clone3 answers ENOSYS), no
perf_event_open, bpf or userfaultfd; where the sandbox has no IPC namespace, no SysV IPC or POSIX message queue).
On x86-64 the x32 system-call range is denied whole. Everything else is allowed: this is a
deny-list of the calls a model never needs, a layer on top of Landlock (which already refuses
ptrace of processes outside the domain) and the PID namespace (which hides them), not a
replacement for them. Architectures other than x86-64 and aarch64: not applied (recorded).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF_0000
SECCOMP_RET_ERRNO = 0x0005_0000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
X32_SYSCALL_BIT = 0x4000_0000

WORLD_DENIED = (
    "mincore", "cachestat", "fadvise64", "readahead", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "io_setup", "io_submit", "keyctl", "add_key", "request_key", "syslog", "unshare", "setns",
    "perf_event_open", "bpf", "userfaultfd",
)  # fmt: skip
"""Refused in every world (training included): the calls that read or change which pages of a shared file
are in the page cache (a channel between worlds and into later runs: docs/ARCHITECTURE.md "Channels"),
asynchronous I/O whose flags the filter cannot read, the kernel keyrings (root's are shared), and reading
the kernel log (syslog(2)): any process writes lines of its choosing there by crashing (its name, the
faulting address), kept until reboot, and where kernel.dmesg_restrict is 0 any process may read them back.
And new namespaces (unshare, setns; clone with a CLONE_NEW* flag below): a user namespace gives its maker every
capability inside it, over a network namespace of its own too (nftables and the rest of the kernel that most
privilege escalations go through). And perf_event_open, bpf and userfaultfd, which no training needs: where the
machine's settings relax them (perf_event_paranoid, unprivileged_bpf_disabled) they watch other processes' CPUs or
load programs into the kernel, channels and attack surface the model worker was already kept from."""
RWF_NOWAIT = 8
CLONE_NEW_FLAGS = 0x7E02_0000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME, 0x80, is no flag of clone's:
those bits are its exit signal)."""
WORLD_DENIED_ARGS: dict[str, tuple[int, tuple[int, ...] | int]] = {
    "madvise": (2, (20, 21)),
    "preadv2": (5, RWF_NOWAIT),
    "pwritev2": (5, RWF_NOWAIT),
    "clone": (0, CLONE_NEW_FLAGS),
}
"""name -> (argument index, the values refused, or an int: the bits any of which refuses it): madvise(MADV_COLD=20,
MADV_PAGEOUT=21) evicts shared pages; preadv2/pwritev2 with RWF_NOWAIT tell a cached page from one that is not;
clone with a namespace flag makes a namespace."""
WORLD_NO_SUCH_CALL = ("clone3",)
"""Answered ENOSYS in every world: clone3 takes its flags in memory the filter cannot read, and ENOSYS (not EPERM)
is what makes glibc start a thread or a process with clone instead, whose flags it reads (as container runtimes do)."""
NO_CGROUP_DENIED = ("memfd_create", "memfd_secret")
"""Refused where the world has no memory cgroup: a memfd's pages would escape RLIMIT_AS uncounted (a secret memfd's
too: mapped a few MiB at a time under RLIMIT_MEMLOCK, each unmapped again, its pages stay in the file)."""

NO_IPC_NAMESPACE_DENIED = (
    "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
"""Refused where the sandbox has no IPC namespace of its own (not root, several nodes): a SysV shared memory
segment, message queue or semaphore set, or a POSIX message queue, is the host's and outlives the run that made it
until the machine reboots (one seed's run left a segment the next seed's run read whole), and Landlock covers none
of them. No training needs them: torch, NCCL and Python's multiprocessing share memory through /dev/shm."""

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "perf_event_open", "bpf", "userfaultfd",
    "mount", "umount2", "pivot_root", "open_by_handle_at", "init_module",
    "finit_module", "delete_module", "kexec_load", "keyctl", "add_key", "request_key", "reboot",
    "swapon", "swapoff", "acct",
)  # fmt: skip

ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000_003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "kcmp": 312,
            "perf_event_open": 298,
            "bpf": 321,
            "userfaultfd": 323,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "unshare": 272,
            "setns": 308,
            "open_by_handle_at": 304,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "acct": 163,
            "mincore": 27,
            "cachestat": 451,
            "fadvise64": 221,
            "readahead": 187,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "io_setup": 206,
            "io_submit": 209,
            "memfd_create": 319,
            "memfd_secret": 447,
            "madvise": 28,
            "preadv2": 327,
            "pwritev2": 328,
            "syslog": 103,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "semget": 64,
            "semop": 65,
            "semtimedop": 220,
            "semctl": 66,
            "mq_open": 240,
            "mq_unlink": 241,
            "mq_timedsend": 242,
            "mq_timedreceive": 243,
            "mq_notify": 244,
            "mq_getsetattr": 245,
            "clone": 56,
            "clone3": 435,
        },  # fmt: skip
    ),
    "aarch64": (
        0xC000_00B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "kcmp": 272,
            "perf_event_open": 241,
            "bpf": 280,
            "userfaultfd": 282,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "unshare": 97,
            "setns": 268,
            "open_by_handle_at": 265,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "acct": 89,
            "mincore": 232,
            "cachestat": 451,
            "fadvise64": 223,
            "readahead": 213,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "io_setup": 0,
            "io_submit": 2,
            "memfd_create": 279,
            "memfd_secret": 447,
            "madvise": 233,
            "preadv2": 286,
            "pwritev2": 287,
            "syslog": 116,
            "shmget": 194,
            "shmat": 196,
            "shmctl": 195,
            "msgget": 186,
            "msgsnd": 189,
            "msgrcv": 188,
            "msgctl": 187,
            "semget": 190,
            "semop": 193,
            "semtimedop": 192,
            "semctl": 191,
            "mq_open": 180,
            "mq_unlink": 181,
            "mq_timedsend": 182,
            "mq_timedreceive": 183,
            "mq_notify": 184,
            "mq_getsetattr": 185,
            "clone": 220,
            "clone3": 435,
        },  # fmt: skip
    ),
}
"""Machine -> (AUDIT_ARCH value, system-call numbers of DENIED)."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str, profile: str = "worker", *, memfd: bool = True, ipc: bool = True) -> bytes:
    """The BPF program for `machine` (platform.machine()); the refused calls get EPERM.

    profile "world" (every sandboxed process): WORLD_DENIED and WORLD_DENIED_ARGS; "worker" (processes
    that run scored code): those and DENIED. `memfd=False` also refuses NO_CGROUP_DENIED; `ipc=False` (no IPC
    namespace of the sandbox's own) NO_IPC_NAMESPACE_DENIED.
    """
    arch, numbers = ARCHES[machine]
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    allow = SECCOMP_RET_ALLOW
    absent = SECCOMP_RET_ERRNO | errno.ENOSYS
    names = [
        *WORLD_DENIED,
        *(DENIED if profile == "worker" else ()),
        *(() if memfd else NO_CGROUP_DENIED),
        *(() if ipc else NO_IPC_NAMESPACE_DENIED),
    ]
    body = [_insn(BPF_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    if machine == "x86_64":
        body.append(_insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT))
        body.append(_insn(BPF_RET_K, 0, 0, deny))
    for name in dict.fromkeys(names):
        body.append(_insn(BPF_JEQ_K, 0, 1, numbers[name]))
        body.append(_insn(BPF_RET_K, 0, 0, deny))
    for name in WORLD_NO_SUCH_CALL:
        body.append(_insn(BPF_JEQ_K, 0, 1, numbers[name]))
        body.append(_insn(BPF_RET_K, 0, 0, absent))
    for name, (arg, values) in WORLD_DENIED_ARGS.items():
        # if nr == name: load the argument's low 32 bits, refuse the values (or any of the bits), allow
        tests = [_insn(BPF_LD_W_ABS, 0, 0, 16 + 8 * arg)]
        if isinstance(values, tuple):
            for v in values:
                tests += [_insn(BPF_JEQ_K, 0, 1, v), _insn(BPF_RET_K, 0, 0, deny)]
        else:
            tests += [_insn(BPF_JSET_K, 0, 1, values), _insn(BPF_RET_K, 0, 0, deny)]
        tests.append(_insn(BPF_RET_K, 0, 0, allow))
        body.append(_insn(BPF_JEQ_K, 0, len(tests), numbers[name]))
        body += tests
    body.append(_insn(BPF_RET_K, 0, 0, allow))
    # a foreign architecture (a 32-bit call through int 0x80, say) is refused outright
    head = [_insn(BPF_LD_W_ABS, 0, 0, 4), _insn(BPF_JEQ_K, 1, 0, arch), _insn(BPF_RET_K, 0, 0, deny)]
    return b"".join(head + body)


def seccomp_supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in ARCHES


def apply_seccomp(profile: str = "worker", *, memfd: bool = True, ipc: bool = True) -> None:
    """Install the filter on this process (and all it starts). Irreversible; sets no_new_privs first."""
    if not seccomp_supported():
        raise OSError(errno.ENOSYS, f"no seccomp filter for {platform.system()} {platform.machine()}")
    prog = build_filter(platform.machine(), profile, memfd=memfd, ipc=ipc)
    n = len(prog) // 8
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(n, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
