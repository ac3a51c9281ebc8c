"""The train phase's sandbox: what a training process can read, write, signal and reach.

The supervisor (harness/run/launch.py) plans a sandbox, writes it as a policy file outside the sandbox,
and runs `python -m isolation.sandbox enter POLICY -- torchrun ...`, which applies the policy to itself
and then execs torchrun, so every rank and every process a rank starts inherits it. Layers, each
used when the machine allows it and recorded either way (`SandboxPlan.describe()`):

- Landlock (Linux >= 5.13, no privilege needed): a filesystem allow-list. Reads only beneath the
  Python installation, the system directories (/usr, /lib*, /bin, /sbin, /etc, /opt, /proc, /sys),
  the harness's own packages (their Python code alone), and the phase's staging folder (the training
  view of the data, a copy of the submission, the spec); writes only beneath the phase's output
  folder; a few device files.
  Any allowed folder that holds the dataset is replaced by its other children, so the original
  dataset folder (both splits) and every validation shard are outside every rule. With ABI >= 6,
  signals to processes outside the sandbox are refused too, and connections to abstract Unix
  sockets bound outside it (which matter on the host's network, launch.network 'host'). Landlock also
  refuses ptrace and /proc/PID/mem of processes outside the sandbox (not their /proc/PID/cmdline or
  environ: the PID namespace hides those), and any mount.
- Namespaces (root, one node): a mount + PID namespace with a fresh /proc (the supervisor and every
  other process of the machine are invisible; when the namespace's first process dies the kernel
  kills every process left in it, so no rank can outlive the phase) and a private /dev/shm (the one
  folder outside the phase's own that training may write: nothing persists there from or to another
  run); and a network namespace with loopback only (nothing outside the machine can be reached, so
  no public copy of the validation data can be downloaded).
- Capabilities (root only): the bounding, inheritable and ambient sets are cleared and no_new_privs
  set before exec; in a world the process then becomes a uid of its own, so it holds none.
- A world of its own (isolation/world.py; root, a mount namespace and overlayfs): the namespace's first
  process swaps its root for a private tmpfs that holds only the rules' paths (read-only overlays,
  copied files, device nodes made anew, a fresh /proc, a sized /dev/shm) and becomes a random uid of
  its own before anything of the submission runs: no lock, mode, time or extended attribute of a file
  it can read is shared with another sandbox or a later run. Every world also gets the "world"
  seccomp profile (no page-cache queries or eviction, no async I/O, no keyrings, no kernel log, no
  new namespace); a sandbox without an IPC namespace of its own also gets no SysV IPC and no POSIX message
  queue (they outlive the run: isolation/seccomp.py NO_IPC_NAMESPACE_DENIED).

Not covered: namespaces and worlds on several nodes (ranks must reach each other, and torchrun's
rendezvous tells nodes apart by hostname and pid); data that is public
elsewhere (the embedded corpus's validation text ships with Python itself); opens made from C code
or child processes are refused but not reported (see isolation/monitor.py). The model worker, where a submission's scored code runs (scoring/worker/), is planned with the same
function and entered the same way, with a seccomp filter on top (isolation/seccomp.py); the
scorer, which runs no submitted code, confines itself with Landlock once it has read the validation
data (scoring/score/confine.py).

    python -m isolation.sandbox enter POLICY.json -- CMD...   apply, then exec CMD (used by launch.py)
    python -m isolation.sandbox probe PATH...                 try to read each PATH (run inside a sandbox)
    python -m isolation.sandbox report                        print what this machine allows

Mode "required" (every record track) refuses to start a phase when the machine lacks any layer the
phase would use (KERNEL_LAYERS: Landlock, the PID/mount namespaces, the network namespace, Landlock's
signal scoping, and seccomp for the model worker), naming each one and how to get it. An official who
accepts a missing layer says so explicitly, one layer at a time (`--allow-missing-layer NAME`, the
config key `launch.allow_missing_layers`, which a submission's own files cannot set); the plan records
the layers that were missing and which of them the official allowed, and the result carries it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from isolation.landlock import (
    SYSTEM_READ_ROOTS,
    Rule,
    apply_landlock,
    broad_read_roots,
    broad_read_rules,
    code_rules,
    device_rules,
    drop_capabilities,
    is_beneath,
    landlock_abi,
    loaded_gpu_library_dirs,
    loopback_up,
    own_rules,
    private_tmpfs,
    python_prefixes,
)
from isolation.seccomp import apply_seccomp, seccomp_supported
from isolation.world import (
    WorldPlan,
    build_world,
    memory_cgroup_available,
    overlay_supported,
    plan_world,
    sweep_cgroups,
)

POLICY_FORMAT = "pg-sandbox-policy"
POLICY_FORMAT_VERSION = 1
SANDBOX_MODES = ("auto", "off", "required")
NETWORK_MODES = ("auto", "host")
KERNEL_LAYERS: dict[str, str] = {
    "landlock": "Landlock, the filesystem allow-list (Linux >= 5.13 with Landlock enabled)",
    "namespaces": "PID, mount and IPC namespaces (root, util-linux `unshare` >= 2.32, not refused by a container; one node)",
    "network_namespace": "a network namespace with loopback only (`unshare --net`; one node)",
    "signal_scoping": "Landlock ABI >= 6: no signal reaches a process outside the sandbox (Linux >= 6.12)",
    "seccomp": "the seccomp filter (every world: no page-cache queries or eviction, no keyrings, no kernel log, no new namespace; the model worker: no ptrace, no other process's memory)",
    "world": "a world of its own (root, a mount namespace, overlayfs): private root and inodes, its own uid (isolation/world.py); without it a phase runs as the supervisor's uid and connects to every Unix socket of the host that uid may (a root tmux's or docker's: commands run outside the sandbox)",
}
"""The isolation layers a sandbox may use, by the name an official uses to allow one missing."""
GUARANTEES: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "no_network": ("no network but loopback", (("network_namespace",),)),
    "no_reads_outside": ("no file read outside the allowed roots", (("landlock",),)),
    "no_signals_or_tracing_outside": (
        "no signal or ptrace reaches a process outside",
        (("namespaces",), ("signal_scoping", "landlock")),
    ),
    "no_ipc_outside": (
        "no SysV/POSIX IPC or abstract socket shared with processes outside",
        (("namespaces", "network_namespace"),),
    ),
    "nothing_shared": (
        "no inode, lock, uid (so no Unix socket of the host's reached by its path), page-cache state, keyring or kernel log shared with the host",
        (("world", "seccomp"),),
    ),
}
"""What a "required" sandbox (every record track) guarantees: property -> (what it means, the mechanisms that
give it). A mechanism is a set of KERNEL_LAYERS that together give the property; any one mechanism that holds
is enough (a private PID namespace makes signal scoping moot: no process outside has a PID inside). A missing
layer refuses a required sandbox only when a property is then left without any mechanism."""
TOKEN_ENV = "PGOLF_PHASE_TOKEN"
"""Every process of a phase carries this in its environment; the supervisor finds leftovers by it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MachineCaps:
    """What this machine lets the supervisor use."""

    landlock_abi: int
    root: bool
    unshare: str | None
    """Path of util-linux `unshare`, when it can make a PID + mount namespace here (root, and not refused by a container)."""
    overlay: bool = False
    """overlayfs is in the kernel (a world's read-only folders)."""
    memory_cgroup: bool = False
    """A memory cgroup can be made here (a world's memory, shared memory included, counted)."""
    net_namespace: bool = True
    """`unshare --net` works too."""

    @property
    def namespaces(self) -> bool:
        return self.root and self.unshare is not None


_NS_FLAGS = ["--mount", "--pid", "--ipc", "--fork", "--mount-proc", "--kill-child"]
"""An IPC namespace too: SysV shared memory and message queues outlive a run and reach every process of
the host's namespace (an attacker's model worker kept validation rows in a segment for its probe workers
and for a later run's training)."""


def _unshare_that_works(root: bool) -> tuple[str | None, bool]:
    """(unshare's path, whether --net works) if namespaces can be made here, else (None, False).

    Tried, not assumed: a container's root often lacks CAP_SYS_ADMIN, and --kill-child needs
    util-linux >= 2.32 (without it a killed phase could leave its namespace behind).
    """
    path = shutil.which("unshare")
    if path is None or not root:
        return None, False

    def works(*extra: str) -> bool:
        try:
            return (
                subprocess.run(
                    [path, *_NS_FLAGS, *extra, "true"], capture_output=True, timeout=20, check=False
                ).returncode
                == 0
            )
        except (OSError, subprocess.SubprocessError):
            return False

    if not works():
        return None, False
    return path, works("--net")


class SandboxRefused(ValueError):
    """A "required" sandbox would miss a layer no official allowed (the message names each, and the fix)."""


def parse_layers(text: str | Iterable[str], what: str = "launch.allow_missing_layers") -> tuple[str, ...]:
    """Layer names from "a,b" or an iterable, checked against KERNEL_LAYERS (ValueError names the bad one)."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in KERNEL_LAYERS]
    if unknown:
        raise ValueError(
            f"{what}: unknown isolation layer(s) {', '.join(map(repr, unknown))}; layers: {', '.join(KERNEL_LAYERS)}"
        )
    return tuple(dict.fromkeys(names))


def missing_layers(caps: MachineCaps, *, network: str, multi_node: bool, seccomp: bool) -> tuple[str, ...]:
    """The KERNEL_LAYERS a phase planned with these settings would run without on this machine."""
    missing = []
    if caps.landlock_abi == 0:
        missing.append("landlock")
    if not caps.namespaces or multi_node:
        missing.append("namespaces")
    if network == "auto" and (not caps.namespaces or multi_node or not caps.net_namespace):
        missing.append("network_namespace")
    if caps.landlock_abi < 6:
        missing.append("signal_scoping")
    if not seccomp_supported():
        missing.append("seccomp")
    if not caps.namespaces or multi_node or not caps.root or not caps.overlay:
        missing.append("world")
    return tuple(missing)


def guarantees(missing: Sequence[str], allowed: Sequence[str] = ()) -> dict[str, str]:
    """For each GUARANTEES property: the mechanism that holds it ("namespaces", "signal_scoping+landlock"),
    "allowed missing: L" when the official allowed the missing layers of one of its mechanisms, or "missing"."""
    out: dict[str, str] = {}
    for prop, (_, mechanisms) in GUARANTEES.items():
        held = next((m for m in mechanisms if not set(m) & set(missing)), None)
        if held is not None:
            out[prop] = "+".join(held)
            continue
        accepted = next((m for m in mechanisms if set(m) & set(missing) <= set(allowed)), None)
        out[prop] = (
            "allowed missing: " + "+".join(sorted(set(accepted) & set(missing)))
            if accepted is not None
            else "missing"
        )
    return out


def _recorded_gaps(
    missing: Sequence[str], allowed: Sequence[str], network: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(missing, allowed) for the record: launch.network 'host' (several nodes) is an official's choice, so the
    loopback-only network it forgoes is recorded as allowed missing, never as held."""
    if network == "host":
        return (*missing, "network_namespace"), (*allowed, "network_namespace")
    return tuple(missing), tuple(allowed)


def needed_layers(missing: Sequence[str], allowed: Sequence[str]) -> list[str]:
    """The missing layers a required sandbox cannot do without: for each property left without a mechanism, the
    missing layers of its first (for the official to allow, or for the machine to gain)."""
    need: list[str] = []
    for prop, state in guarantees(missing, allowed).items():
        if state == "missing":
            first = GUARANTEES[prop][1][0]
            need += [m for m in first if m in missing and m not in allowed and m not in need]
    return [m for m in KERNEL_LAYERS if m in need]


def require_layers(missing: Sequence[str], allowed: Sequence[str], phase: str) -> None:
    """Raise SandboxRefused when a GUARANTEES property is left without a mechanism (mode "required"): a missing
    layer whose properties another mechanism gives (signal scoping under a PID namespace) is no refusal."""
    refused = needed_layers(missing, allowed)
    if refused:
        lines = "; ".join(f"{m}: {KERNEL_LAYERS[m]}" for m in refused)
        flags = " ".join(f"--allow-missing-layer {m}" for m in refused)
        raise SandboxRefused(
            f"the {phase} must run fully isolated (sandbox 'required', every record track) but this machine lacks: "
            f"{lines} (unmet: {', '.join(p for p, st in guarantees(missing, allowed).items() if st == 'missing')}). HINT: run on a machine that has them; or, as an official who accepts the risk, pass "
            f"{flags} (recorded in the result); or run on an unranked track"
        )


def machine_report(caps: MachineCaps, allowed: Sequence[str] = ()) -> list[str]:
    """What a record track's sandbox would hold on a machine: its layers, then one line per GUARANTEES property
    (the mechanism that gives it, or what is missing), then the verdict; for `pgolf check --machine`."""
    missing = tuple(
        dict.fromkeys(
            missing_layers(caps, network="auto", multi_node=False, seccomp=False)
            + missing_layers(caps, network="auto", multi_node=False, seccomp=True)
        )
    )
    lines = [
        f"machine: Landlock ABI {caps.landlock_abi}, {'root' if caps.root else 'not root'}, namespaces "
        f"{'yes' if caps.namespaces else 'no'} (network {'yes' if caps.namespaces and caps.net_namespace else 'no'}), "
        f"overlayfs {'yes' if caps.overlay else 'no'}, seccomp {'yes' if seccomp_supported() else 'no'}; "
        f"layers missing: {', '.join(missing) or 'none'}"
    ]
    for prop, state in guarantees(missing, allowed).items():
        mark = "FAIL" if state == "missing" else "ok  "
        if state == "missing":
            how = "missing: needs " + " or ".join("+".join(m) for m in GUARANTEES[prop][1])
        else:
            how = state if state.startswith("allowed") else f"by {state}"
        lines.append(f"{mark} {prop:30s} {GUARANTEES[prop][0]}: {how}")
    need = needed_layers(missing, allowed)
    lines.append(
        "a record track can run here (sandbox 'required')"
        if not need
        else "a record track is refused here: "
        + ", ".join(f"{m} ({KERNEL_LAYERS[m]})" for m in need)
        + "; run on an unranked track, or as an official pass "
        + " ".join(f"--allow-missing-layer {m}" for m in need)
    )
    return lines


def probe_machine() -> MachineCaps:
    root = os.geteuid() == 0
    unshare, net = _unshare_that_works(root)
    return MachineCaps(
        landlock_abi=landlock_abi(),
        root=root,
        unshare=unshare,
        net_namespace=net,
        overlay=overlay_supported(),
        memory_cgroup=root and memory_cgroup_available(),
    )


# ---- Planning (in the supervisor) ----


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxPlan:
    """What the train phase will run under; `describe()` is what the result records."""

    mode: str
    landlock_abi: int = 0
    rules: tuple[Rule, ...] = ()
    namespaces: tuple[str, ...] = ()
    """Subset of ("mount", "pid", "ipc", "net")."""
    drop_caps: bool = False
    scope_signals: bool = False
    unshare: str | None = None
    warnings: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    """Paths no rule reaches (the dataset folder, the validation shards)."""
    seccomp: bool = False
    """Install isolation/seccomp.py's filter (the model worker: no ptrace, no other process's memory)."""
    missing_layers: tuple[str, ...] = ()
    """KERNEL_LAYERS this machine could not give the phase."""
    allowed_missing: tuple[str, ...] = ()
    """The layers an official explicitly allowed to be missing (recorded; only these may be skipped)."""
    guarantees: tuple[tuple[str, str], ...] = ()
    """(GUARANTEES property, the mechanism that held it / "allowed missing: ..." / "missing"), for the record."""
    memory_limit_bytes: int = 0
    """RLIMIT_AS set before exec, inherited by every process of the phase (each gets it); 0: none."""
    world: WorldPlan | None = None
    """The phase's world of its own (isolation/world.py), where the machine allows one."""
    memory_cgroup: bool = False
    """The world joins a memory cgroup of its own (else memfd_create is refused and tmpfs sizes bound shm)."""
    memlock_unlimited: bool = False
    """RLIMIT_MEMLOCK raised to unlimited before capabilities go (CUDA: NCCL's InfiniBand/EFA registration
    pins memory; without CAP_SYS_RESOURCE a process cannot raise it past root's default 8 MiB)."""
    join_net: int | None = None
    """A descriptor (of this process, passed to the child: Popen pass_fds) of the loopback-only network namespace
    of an isolation/shared_net.py holder, which this sandbox enters in place of one of its own (a group of model
    workers that all-reduce among themselves); None: its own. A descriptor, not the holder's pid: a pid can be
    reused once the holder is gone, the namespace a descriptor names cannot change."""

    @property
    def landlock(self) -> bool:
        return self.landlock_abi > 0 and bool(self.rules)

    def wrap(self, cmd: Sequence[str], policy_path: Path) -> list[str]:
        """The command line that runs `cmd` inside this sandbox."""
        if self.mode == "off":
            return list(cmd)
        policy_path.write_text(json.dumps(self.policy(), indent=1), encoding="utf-8")
        inner = [sys.executable, "-m", "isolation.sandbox", "enter", str(policy_path), "--", *cmd]
        if not self.namespaces:
            return inner
        joined = self.joined_net
        # a shared network namespace is the holder's: entered first (util-linux nsenter, as unshare), never made
        enter_net = (
            []
            if joined is None
            else [shutil.which("nsenter") or "nsenter", f"--net=/proc/self/fd/{joined}", "--"]
        )
        ns = list(_NS_FLAGS) + (["--net"] if "net" in self.namespaces and joined is None else [])
        return [*enter_net, str(self.unshare), *ns, "--", *inner]

    @property
    def scope_abstract_sockets(self) -> bool:
        """Landlock refuses connections to abstract Unix sockets bound outside the sandbox (with the signal scope:
        ABI >= 6): on the host's network (launch.network 'host') a phase reached every one of the machine's. Not
        for a group's worker, whose namespace is the group's own and whose peers are sandboxes of their own."""
        return self.scope_signals and self.joined_net is None

    @property
    def joined_net(self) -> int | None:
        """`join_net` where this sandbox has a network namespace at all (else there is nothing to join)."""
        return self.join_net if "net" in self.namespaces else None

    def policy(self) -> dict[str, Any]:
        return {
            "format": POLICY_FORMAT,
            "format_version": POLICY_FORMAT_VERSION,
            "landlock_abi": self.landlock_abi,
            "rules": [asdict(r) for r in self.rules],
            "drop_caps": self.drop_caps,
            "scope_signals": self.scope_signals,
            "scope_abstract_sockets": self.scope_abstract_sockets,
            "loopback_up": "net" in self.namespaces,
            "private_shm": "mount" in self.namespaces and os.path.isdir("/dev/shm"),
            "ipc_namespace": "ipc" in self.namespaces,
            "required": self.mode == "required",
            "allow_missing": list(self.allowed_missing),
            "seccomp": self.seccomp,
            "memory_limit_bytes": self.memory_limit_bytes,
            "world": self.world.policy() if self.world else None,
            "memory_cgroup": self.memory_cgroup,
            "memlock_unlimited": self.memlock_unlimited,
            "join_net_fd": self.joined_net,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "landlock_abi": self.landlock_abi,
            "landlock": self.landlock,
            "namespaces": list(self.namespaces),
            "network_namespace_shared": self.joined_net is not None,
            "capabilities_dropped": self.drop_caps,
            "signals_scoped": self.scope_signals,
            "abstract_sockets_scoped": self.scope_abstract_sockets,
            # enter() gives every sandbox the "world" profile wherever seccomp exists, world or not
            "seccomp": "worker"
            if self.seccomp
            else ("world" if seccomp_supported() and self.mode != "off" else "none"),
            "separate_user": self.world is not None,
            "world": self.world.describe() if self.world else None,
            "read_roots": sorted(r.path for r in self.rules if r.access in ("ro", "dev")),
            "write_roots": sorted(r.path for r in self.rules if r.access == "rw"),
            "protected": list(self.protected),
            "missing_layers": list(self.missing_layers),
            "missing_allowed_by_official": [m for m in self.allowed_missing if m in self.missing_layers],
            "guarantees": dict(self.guarantees),
            "memory_limit_bytes_per_process": self.memory_limit_bytes or None,
            "warnings": list(self.warnings),
        }


SECRET_LOCATION_ENV = ("XDG_CONFIG_HOME", "WANDB_CONFIG_DIR", "WANDB_DIR", "HF_TOKEN_PATH", "NETRC")
"""Variables that name where the official's own credentials and settings live, beside the home folder."""
SECRET_FILE_ENV = frozenset({"HF_TOKEN_PATH", "NETRC"})
"""Of SECRET_LOCATION_ENV, those that name a file: its folder is left out."""


def official_homes() -> list[str]:
    """The official's home folder (HOME, the account's own from the password database, and under sudo the
    invoking account's, SUDO_USER: its ~/.ssh and tokens are the official's too), the folders SECRET_LOCATION_ENV
    names (a file's folder for SECRET_FILE_ENV) and the Hugging Face token's folder where XDG_CACHE_HOME moves it
    ($XDG_CACHE_HOME/huggingface, written mode 644): where keys live (~/.ssh, ~/.netrc with the wandb key,
    ~/.cache/huggingface/token, cloud credentials). A phase's broad read rules leave them out, so an import root
    the official's PYTHONPATH names (`PYTHONPATH=.` run from home) shows a phase none of them; a Python
    installation inside one (a venv in home) is a broad rule of its own and stays readable."""
    import pwd

    named = [os.path.expanduser("~")]
    try:
        named.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user:
        try:
            named.append(pwd.getpwnam(sudo_user).pw_dir)
        except KeyError:
            pass
    for key in SECRET_LOCATION_ENV:
        v = os.environ.get(key)
        if v:
            named.append(os.path.dirname(v) if key in SECRET_FILE_ENV else v)
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache:
        named.append(os.path.join(cache, "huggingface"))
    return sorted({os.path.realpath(p) for p in named if p and os.path.isdir(p)})


def broad_hidden(paths: Iterable[str | Path], warnings: list[str]) -> list[str]:
    """Of `paths` (the phase's private folders, the project's, the machine's dataset locations), those every broad
    read rule leaves out, resolved. A folder that holds the Python installation is left out around it (each Python
    prefix is a broad rule of its own: a clone's .venv stays readable); one inside it (a project installed into
    site-packages) or one that holds a system folder (HF_HOME=/opt) cannot be left out: skipped, with a warning."""
    prefixes = [os.path.realpath(p) for p in python_prefixes()]
    out: list[str] = []
    for p in paths:
        real = os.path.realpath(p)
        if any(is_beneath(real, q) for q in prefixes) or any(is_beneath(r, real) for r in SYSTEM_READ_ROOTS):
            warnings.append(
                f"{p} lies in the Python installation or holds a system folder: it stays readable"
            )
        else:
            out.append(real)
    return out


def plan_sandbox(
    *,
    mode: str,
    network: str,
    device: str,
    multi_node: bool,
    project_root: Path,
    read_paths: Iterable[Path],
    write_paths: Iterable[Path],
    protected: Iterable[Path],
    private: Iterable[Path] = (),
    import_path: Iterable[str] = (),
    extra_read: Iterable[str] = (),
    caps: MachineCaps | None = None,
    seccomp: bool = False,
    allow_missing: Iterable[str] = (),
    phase: str = "phase",
    memory_limit_bytes: int = 0,
    sockets: Iterable[Path] = (),
) -> SandboxPlan:
    """Decide the sandbox for one phase.

    `read_paths` and `write_paths` are the phase's own (its staging folder's contents). `protected`
    paths (the dataset, the validation shards) end up outside every rule; `private` ones (the staging
    folder, where the scorer's view is made later) outside every broad rule; so does the temp folder.
    `import_path` is the ranks' sys.path (ask their interpreter: see harness/run/train_phase.py).

    mode "auto" uses every layer the machine offers and records a warning for each it lacks; "required"
    refuses (SandboxRefused) to run without any of KERNEL_LAYERS the phase would use, except those in
    `allow_missing` (an official's explicit, recorded decision); "off" runs unsandboxed (recorded).
    """
    if mode not in SANDBOX_MODES:
        raise ValueError(f"launch.sandbox must be one of {SANDBOX_MODES}, got {mode!r}")
    if network not in NETWORK_MODES:
        raise ValueError(f"launch.network must be one of {NETWORK_MODES}, got {network!r}")
    prot = sorted({os.path.realpath(p) for p in protected})
    if memory_limit_bytes < 0:
        raise ValueError(f"memory_limit_bytes must be >= 0, got {memory_limit_bytes}")
    if mode == "off":
        return SandboxPlan(
            mode="off",
            protected=tuple(prot),
            warnings=("sandbox off (launch.sandbox = 'off'): training can read any file",),
        )
    caps = caps or probe_machine()
    allowed = parse_layers(allow_missing, "allow_missing")
    missing = missing_layers(caps, network=network, multi_node=multi_node, seccomp=seccomp)
    if mode == "required":
        require_layers(missing, allowed, phase)
    warnings: list[str] = [
        f"missing layer {m} allowed by the official (--allow-missing-layer {m})"
        for m in missing
        if m in allowed
    ]
    if mode == "required":
        held = guarantees(missing, allowed)
        warnings += [
            f"missing layer {m}: its guarantees hold by other means ({', '.join(f'{p}: {held[p]}' for p in props)})"
            for m in missing
            if m not in allowed
            and (props := [p for p, (_, mechs) in GUARANTEES.items() if any(m in mech for mech in mechs)])
        ]
    if caps.landlock_abi == 0:
        warnings.append(
            "Landlock is not available on this kernel: the phase runs without a filesystem allow-list"
        )
    namespaces: tuple[str, ...] = ()
    if caps.namespaces and multi_node:
        # torchrun's rendezvous names a node by hostname and pid; in a PID namespace every node's torchrun
        # is pid 1, so nodes sharing a hostname would be taken for one. And the nodes must reach each other.
        warnings.append(
            "several nodes: no PID/mount/network namespaces (leftovers are found by their "
            f"{TOKEN_ENV} environment variable; the network is the host's)"
        )
    elif caps.namespaces:
        namespaces = ("mount", "pid", "ipc") + (("net",) if network == "auto" and caps.net_namespace else ())
        if network == "auto" and not caps.net_namespace:
            warnings.append("`unshare --net` is refused here: the network is the host's")
    else:
        warnings.append(
            "no PID/mount/network namespaces here (not root, no `unshare` >= 2.32, or refused by a container): "
            f"leftover processes are found by their {TOKEN_ENV} environment variable, and the network is the host's"
        )
    rules: list[Rule] = []  # planned even without Landlock: the access monitor reports against them
    hidden = sorted({*prot, *broad_hidden([*private, project_root, *official_homes()], warnings)})
    tmp = os.path.realpath(tempfile.gettempdir())
    broad = [*broad_read_roots(import_path, project_root), *extra_read]
    if device.startswith("cuda"):  # the CUDA/NCCL libraries the ranks will load, where they are
        broad += loaded_gpu_library_dirs(broad)
    for path in dict.fromkeys(broad):
        if os.path.exists(path):
            rules += broad_read_rules(path, prot, hidden, tmp, warnings)
    rules += own_rules([str(p) for p in read_paths], [], prot, "sandbox")
    rules += code_rules([project_root / pkg for pkg in ("harness", "data", "scoring", "isolation")], prot)
    rules.append(Rule(path=str(project_root.resolve()), access="list"))
    rules += own_rules([], write_paths, prot, "sandbox")
    rules += device_rules(device)
    rules += [Rule(path=os.path.realpath(p), access="sock") for p in sockets]
    if os.path.isdir("/dev/shm"):
        rules.append(Rule(path="/dev/shm", access="rw"))
    if 0 < caps.landlock_abi < 6:
        warnings.append(
            f"Landlock ABI {caps.landlock_abi} < 6: training can signal processes outside the sandbox"
        )
    for p in prot:
        if os.path.isfile(p) and os.stat(p).st_nlink > 1:
            warnings.append(
                f"{p} has {os.stat(p).st_nlink} hard links; links elsewhere are not known to be outside the sandbox"
            )
    world = None
    if "world" not in missing:
        sweep_cgroups()
        world = plan_world(memory_limit_bytes, prot)
    else:
        warnings.append(
            "no world of its own (needs root, a mount namespace and overlayfs): the phase shares inodes, "
            "locks and file metadata with the host and runs as uid 0 without capabilities (Landlock does not govern "
            "connect(): it reaches every Unix socket of the host root may, a root tmux's or docker's)"
        )
    return SandboxPlan(
        mode=mode,
        world=world,
        memory_cgroup=world is not None and bool(memory_limit_bytes) and caps.memory_cgroup,
        memlock_unlimited=device.startswith("cuda") and caps.root,
        landlock_abi=caps.landlock_abi,
        rules=tuple(rules),
        namespaces=namespaces,
        drop_caps=caps.root,
        scope_signals=caps.landlock_abi >= 6,
        unshare=caps.unshare,
        warnings=tuple(warnings),
        protected=tuple(prot),
        seccomp=seccomp and seccomp_supported(),
        missing_layers=missing,
        allowed_missing=allowed,
        guarantees=tuple(guarantees(*_recorded_gaps(missing, allowed, network)).items()),
        memory_limit_bytes=memory_limit_bytes,
    )


# ---- Applying (in the sandboxed process, before exec) ----


def load_policy(path: str) -> dict[str, Any]:
    policy = json.loads(Path(path).read_text(encoding="utf-8"))
    if policy.get("format") != POLICY_FORMAT or policy.get("format_version") != POLICY_FORMAT_VERSION:
        raise ValueError(f"{path} is not a {POLICY_FORMAT} v{POLICY_FORMAT_VERSION} file")
    return policy


WARNING_PREFIX = "[pgolf-sandbox-warning] "


def raise_memlock() -> tuple[int, int]:
    """RLIMIT_MEMLOCK to unlimited, or as high as this machine lets root set it (a container may withhold
    CAP_SYS_RESOURCE: then the soft limit rises to the hard one, with a warning line)."""
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        print(f"{WARNING_PREFIX}RLIMIT_MEMLOCK cannot rise past {hard} bytes here (no CAP_SYS_RESOURCE)",
              file=sys.stderr, flush=True)  # fmt: skip
    return resource.getrlimit(resource.RLIMIT_MEMLOCK)


def enter(policy_path: str, argv: Sequence[str]) -> NoReturn:
    """Apply the policy to this process, then exec `argv`.

    A layer the kernel refuses (a container's seccomp filter may block Landlock's system calls) is
    skipped with a `[pgolf-sandbox-warning]` line on stderr, unless the policy says `required`, and
    the supervisor's probe, which runs through here too, then records the sandbox as not verified.
    """
    policy = load_policy(policy_path)
    if policy.get("join_net_fd") is not None:  # nsenter has used it: the confined program never holds it
        try:
            os.close(int(policy["join_net_fd"]))
        except OSError:
            pass
    if policy["loopback_up"]:
        loopback_up()  # no skipping: in a network namespace without loopback, ranks cannot meet
    world = policy.get("world")
    if world and not policy.get("memory_cgroup"):
        world = {**world, "memory_limit_bytes": 0}
    rules = [Rule(**r) for r in policy["rules"]]
    layers = [  # (name, its KERNEL_LAYERS name, wanted, apply)
        (
            "private /dev/shm",
            "namespaces",
            policy.get("private_shm") and not world,
            lambda: private_tmpfs("/dev/shm"),
        ),
        ("dropping capabilities", "", policy["drop_caps"], drop_capabilities),
        ("a world of its own", "world", world, lambda: build_world(rules, world or {})),
        (
            "Landlock",
            "landlock",
            policy["landlock_abi"] and policy["rules"],
            lambda: apply_landlock(
                rules,
                policy["landlock_abi"],
                policy["scope_signals"],
                bool(policy.get("scope_abstract_sockets")),
            ),
        ),
        (
            "seccomp",
            "seccomp",
            seccomp_supported(),  # every world gets the "world" profile; scored code the "worker" one
            lambda: apply_seccomp(
                "worker" if policy.get("seccomp") else "world",
                memfd=bool(policy.get("memory_cgroup")),
                ipc=bool(policy.get("ipc_namespace")),
            ),
        ),
    ]
    allowed = set(policy.get("allow_missing", ()))
    if policy.get("memlock_unlimited"):  # while this process still holds CAP_SYS_RESOURCE
        raise_memlock()
    if policy.get("memory_limit_bytes"):  # not a kernel feature that may be missing: it always applies
        limit = int(policy["memory_limit_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for name, layer, wanted, apply in layers:
        if not wanted:
            continue
        try:
            apply()
        except OSError as e:
            if (policy.get("required") and layer not in allowed) or layer == "world":
                raise  # a world half built (its root already swapped) cannot be left for the host's
            print(f"{WARNING_PREFIX}{name} failed, continuing without it: {e}", file=sys.stderr, flush=True)
    os.execvp(argv[0], list(argv))


def probe(paths: Sequence[str]) -> dict[str, str]:
    """Try to read each path; 'read' or the error's name (run inside the sandbox)."""
    out = {}
    for p in paths:
        try:
            with open(p, "rb") as f:
                f.read(16)
            out[p] = "read"
        except OSError as e:
            out[p] = type(e).__name__
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "enter" and "--" in argv:
        cut = argv.index("--")
        enter(argv[1], argv[cut + 1 :])
    if len(argv) >= 1 and argv[0] == "probe":
        print(json.dumps(probe(argv[1:])))
        return 0
    if argv[:1] == ["report"]:
        caps = probe_machine()
        print(
            json.dumps(
                {
                    "landlock_abi": caps.landlock_abi,
                    "root": caps.root,
                    "unshare": caps.unshare,
                    "net_namespace": caps.net_namespace,
                    "overlay": caps.overlay,
                    "memory_cgroup": caps.memory_cgroup,
                    "missing_layers": list(
                        missing_layers(caps, network="auto", multi_node=False, seccomp=True)
                    ),
                }
            )
        )
        return 0
    print(__doc__.strip().splitlines()[-3:], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
