"""The launcher's pieces without torch ranks: config, torchrun command, the supervisor's clock and wire, sandbox plans.

Supervisor tests run small Python scripts in place of torchrun, speaking the wire as ranks do (each
under a second or two): the clock's start, end and off-clock credit are the supervisor's own; data
is refused during a warm-up and comes as descriptors; strangers, forged fields, a planted link, a
state changed after its handover and a rank that floods the wire are all handled. Sandbox plan tests
run against fake machine capabilities, so they hold on any machine, with or without Landlock.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.config import LaunchConfig
from harness.run.clock_server import ClockServer
from harness.run.launch import supervise, torchrun_command
from harness.run.train_phase import rank_failures
from harness.train.budget import BudgetConfig
from isolation.landlock import carve
from isolation.monitor import AccessMonitor, parse_attempts
from isolation.processes import processes_with_token
from isolation.sandbox import TOKEN_ENV, MachineCaps, SandboxRefused, plan_sandbox
from tests.conftest import is_own_install

REPO = Path(__file__).resolve().parents[3]


def test_launch_config_validates():
    assert LaunchConfig().sandbox == "auto"
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        LaunchConfig(nnodes=2)
    with pytest.raises(ValueError, match="HOST:PORT"):
        LaunchConfig(nnodes=2, rdzv_endpoint="nohost")
    with pytest.raises(ValueError, match="launch.sandbox"):
        LaunchConfig(sandbox="maybe")
    with pytest.raises(ValueError, match="launch.network"):
        LaunchConfig(network="none")


def test_torchrun_command_standalone_and_multi_node(tmp_path):
    cmd = torchrun_command(LaunchConfig(nproc_per_node=8), tmp_path / "spec.json")
    assert (
        "--rdzv-endpoint=127.0.0.1:0" in cmd
        and "--local-addr=127.0.0.1" in cmd  # the ranks meet on loopback, never on the host's FQDN
        and "--nproc-per-node=8" in cmd
        and cmd[-2:] == ["harness.train.rank", str(tmp_path / "spec.json")]
    )
    cmd = torchrun_command(
        LaunchConfig(nproc_per_node=8, nnodes=4, rdzv_endpoint="node0:29500", rdzv_id="job7"), tmp_path / "s"
    )
    assert {
        "--nnodes=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29500",
        "--rdzv-id=job7",
        "--max-restarts=0",
    } <= set(cmd)
    assert "--standalone" not in cmd


def _torchrun_args(cmd: list[str]) -> list[str]:
    """torchrun's own arguments of a command torchrun_command made (between the module and the rank's `-m`)."""
    return cmd[cmd.index("torch.distributed.run") + 1 : cmd.index("harness.train.rank") - 1]


def test_one_node_meets_on_an_address_that_needs_no_name_lookup(tmp_path):
    """A world shows /etc as the image has it: in a container, the image's /etc/hosts is empty (the runtime binds
    its own over it), so no name resolves, "localhost" included, and torchrun's `--standalone` (which sets the
    rendezvous to localhost:0 in its run()) hung until its timeout. As torchrun's own parser reads the command: no
    --standalone, and a rendezvous endpoint and an address for rank 0 that are IP literals on loopback."""
    import ipaddress

    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(
        [*_torchrun_args(torchrun_command(LaunchConfig(nproc_per_node=8), tmp_path / "s")), "x.py"]
    )
    assert not args.standalone, "torchrun --standalone meets at the name localhost"
    config, _, _ = config_from_args(args)
    host, port = config.rdzv_endpoint.rsplit(":", 1)
    assert ipaddress.ip_address(host).is_loopback and port == "0", config.rdzv_endpoint
    assert config.rdzv_backend == "c10d" and config.max_nodes == 1
    assert ipaddress.ip_address(config.local_addr).is_loopback


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_ranks_meet_where_no_name_resolves(tmp_path):
    """The same for real: in a mount and network namespace (loopback only, as the sandbox's) with an empty
    /etc/hosts bound over the host's, torchrun as the launcher runs it starts its ranks (`python -m platform`
    stands in for the rank) in seconds, instead of waiting on a name that never resolves."""
    empty = tmp_path / "hosts"
    empty.write_text("")
    cmd = torchrun_command(LaunchConfig(nproc_per_node=2, device="cpu"), tmp_path / "spec.json")
    cmd = [*cmd[: cmd.index("harness.train.rank")], "platform"]
    lo_up = f"{sys.executable} -c 'from isolation.landlock import loopback_up; loopback_up()'"  # as the sandbox does
    script = f'{lo_up} && mount --bind {empty} /etc/hosts && exec "$@"'
    if subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --mount --net is refused here")
    try:
        out = subprocess.run(
            ["unshare", "--mount", "--net", "sh", "-c", script, "sh", *cmd],
            capture_output=True, text=True, timeout=30, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun's rendezvous waited 30 s on a name that does not resolve")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("Linux") == 2, out.stdout


# ---- supervise and its clock, with scripts standing in for torchrun ----
# Each script speaks the wire as a rank does (harness/train/wire.py, no torch import: ~50 ms to start).

SCRIPT_HEAD = """\
import json, os, socket, sys, time
from harness.train.wire import WireClient, WireError
ADDR = json.loads(sys.argv[1])
OUT = sys.argv[2]
def connect(local_rank=0):
    return WireClient.connect(ADDR, rank=local_rank, local_rank=local_rank)
"""


def _shards(tmp_path: Path) -> list[Path]:
    from data.shards import write_shard

    (tmp_path / "ds").mkdir(exist_ok=True)
    paths = [tmp_path / "ds" / f"fineweb_train_00000{i}.bin" for i in range(2)]
    for i, p in enumerate(paths):
        write_shard(p, np.arange(100 * i, 100 * i + 50, dtype=np.uint16))
    return paths


def _server(tmp_path: Path, budget: BudgetConfig, local_ranks: int = 1, nodes: int = 1) -> ClockServer:
    (tmp_path / "out").mkdir(parents=True, exist_ok=True)
    return ClockServer(
        shards=_shards(tmp_path),
        local_ranks=local_ranks,
        nodes=nodes,
        warmup_max_s=budget.warmup_max_s,
        state_src=tmp_path / "out" / "state.safetensors",
        state_dest=tmp_path / "handed-state.safetensors",
    )


def _supervise(
    tmp_path: Path,
    body: str,
    budget: BudgetConfig,
    token: str | None = None,
    local_ranks: int = 1,
    nodes: int = 1,
):
    # a token of its own: the supervisor kills whatever carries its token at the end, and the suite runs two
    # of these tests at once (a shared "t0" let one test's sweep kill the other's phase: status -9 at 0.06 s)
    token = token or f"t-{secrets.token_hex(8)}"
    wire = _server(tmp_path, budget, local_ranks, nodes)
    script = tmp_path / "fake_torchrun.py"
    script.write_text(SCRIPT_HEAD + body)
    cmd = [sys.executable, str(script), json.dumps(wire.address()), str(tmp_path / "out")]
    env = dict(os.environ, PYTHONPATH=str(REPO), **{TOKEN_ENV: token})
    out = supervise(cmd, tmp_path / "out", budget, tmp_path / "log.txt", env, token, wire=wire)
    return out, (tmp_path / "log.txt").read_text()


START = "w = connect()\nw.clock_start()\n"


def _bounds(log: str) -> tuple[float, float]:
    """The script's `BOUNDS lo hi`: the least and the most the supervisor can have timed between two of its
    messages (from the script's monotonic clock around each call), so a loaded machine widens the window
    instead of failing a fixed one."""
    lo, hi = next(line.split()[1:3] for line in log.splitlines() if line.startswith("BOUNDS "))
    return float(lo), float(hi)


def test_supervisor_kills_at_budget_plus_grace(tmp_path):
    budget = BudgetConfig(train_s=0.6, grace_s=0.4, startup_s=10)
    out, _ = _supervise(tmp_path, START + "time.sleep(30)\n", budget)
    assert out.status == "over_budget" and "train_s + budget.grace_s" in out.detail
    assert 1.0 <= out.clock_to_exit_s < 1.0 + 1.5  # then SIGKILL (slack for a loaded machine)
    assert out.train_time_s == out.clock_to_exit_s and out.clock["ended_by"] == "exit"


def test_supervisor_kills_when_the_clock_never_starts(tmp_path):
    out, _ = _supervise(tmp_path, "time.sleep(30)\n", BudgetConfig(train_s=5, startup_s=0.5))
    assert out.status == "over_budget" and "never started" in out.detail and out.wall_s < 0.5 + 1.5
    assert out.train_time_s is None and out.startup_s is None


def test_supervisor_reports_exit_codes(tmp_path):
    budget = BudgetConfig(train_s=5, startup_s=5)
    assert _supervise(tmp_path / "a", START + "sys.exit(0)\n", budget)[0].status == "ok"
    bad, _ = _supervise(tmp_path / "b", START + "sys.exit(3)\n", budget)
    assert bad.status == "error" and bad.returncode == 3


def test_supervisor_kills_detached_leftovers_by_token(tmp_path):
    token = f"test{os.getpid()}"
    body = START + (
        "import subprocess\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'],"
        " start_new_session=True)\n"
        "time.sleep(0.5)\n"
    )
    out, _ = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5), token)
    assert out.status == "ok" and len(out.leftover_pids) == 1
    time.sleep(0.1)
    assert processes_with_token(token) == []


def test_the_clock_is_the_supervisors_own(tmp_path):
    # startup before clock_start is not on the clock; the rank's fields claiming times are ignored; the
    # clock stops at the state's handover, not at the exit
    body = (
        "w = connect()\ntime.sleep(0.4)\n"
        "t0 = time.monotonic()\nw.call('clock_start', since_start_s=-1000.0, t=0.0)\nt1 = time.monotonic()\n"
        "time.sleep(0.5)\n"
        "open(os.path.join(OUT, 'state.safetensors'), 'wb').write(b'state')\n"
        "t2 = time.monotonic()\nprint('SHA', w.done(state=True))\nt3 = time.monotonic()\n"
        "print('BOUNDS', t2 - t1, t3 - t0)\n"
        "time.sleep(0.6)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5))
    assert out.status == "ok", log
    lo, hi = _bounds(log)  # the rank's own view of when its two messages left and were answered
    assert out.startup_s >= 0.4 and lo <= out.train_time_s <= hi and out.clock_to_exit_s >= 1.1, (lo, hi)
    assert lo >= 0.5  # and the time before clock_start (0.4 s) is not on it
    assert out.clock["ended_by"] == "state_handover" and out.clock["state_sha256"] in log
    assert (tmp_path / "handed-state.safetensors").read_bytes() == b"state"
    assert not (tmp_path / "out" / "state.safetensors").exists()


def test_warmup_credit_is_capped_and_no_data_flows_during_it(tmp_path):
    budget = BudgetConfig(train_s=5, startup_s=5, warmup_max_s=0.3)
    body = START + (
        "w.warmup_begin()\n"
        "try:\n    w.data()\nexcept WireError as e:\n    print('REFUSED', e)\n"
        "time.sleep(0.5)\n"
        "print('CREDIT', w.warmup_end())\n"
        "from data.loader import ShardStream\n"
        "stream = ShardStream.from_descriptors(w.data())\n"
        "print('TOKENS', json.dumps([stream.names, stream.take(60).tolist()], separators=(',', ':')))\n"
    )
    out, log = _supervise(tmp_path, body, budget)
    assert out.status == "ok", log
    assert "REFUSED" in log and "closed during ctx.clock.warmup()" in log and "CREDIT 0.3" in log
    assert out.off_clock_s == 0.3 and "capped" in out.clock["off_clock_detail"]
    assert out.clock["requests_refused"] == {"training data is closed during ctx.clock.warmup()": 1}
    names, tokens = json.loads(next(line[7:] for line in log.splitlines() if line.startswith("TOKENS ")))
    assert names == ["fineweb_train_000000.bin", "fineweb_train_000001.bin"]
    assert tokens == [*range(50), *range(100, 110)]  # the shards, through the supervisor's descriptors


def test_data_before_the_warmup_leaves_none_of_it_off_the_clock(tmp_path):
    budget = BudgetConfig(train_s=5, startup_s=5, warmup_max_s=10)
    body = START + "fds = w.data()\nw.warmup_begin()\ntime.sleep(0.3)\nprint('CREDIT', w.warmup_end())\n"
    out, log = _supervise(tmp_path, body, budget)
    assert out.status == "ok" and "CREDIT 0.0" in log, log
    assert out.off_clock_s == 0.0 and "received training data" in out.clock["off_clock_detail"]
    assert out.train_time_s >= 0.3


def test_on_several_nodes_no_warmup_is_off_the_clock(tmp_path):
    # this node's rank asked for no data, but a rank of another node may have, and handed it over the process
    # group inside the warm-up: this supervisor cannot see it, so it credits nothing (before: the whole 0.3 s)
    budget = BudgetConfig(train_s=5, startup_s=5, warmup_max_s=10)
    body = START + "w.warmup_begin()\ntime.sleep(0.3)\nprint('CREDIT', w.warmup_end())\nfds = w.data()\n"
    out, log = _supervise(tmp_path, body, budget, nodes=2)
    assert out.status == "ok" and "CREDIT 0.0" in log, log
    assert out.off_clock_s == 0.0 and "several nodes" in out.clock["off_clock_detail"], out.clock
    assert out.train_time_s >= 0.3


def test_a_rank_whose_wire_is_still_open_at_exit_keeps_its_warmup(tmp_path):
    # a child holds the rank's wire open past torchrun's exit, so the supervisor closes the wire before it
    # has read the rank's end: the rank's requests still count (once, a loaded machine lost them: "no warm-up")
    body = START + (
        "t0 = time.monotonic()\nw.warmup_begin()\nt1 = time.monotonic()\ntime.sleep(0.3)\n"
        "t2 = time.monotonic()\nw.warmup_end()\nt3 = time.monotonic()\nprint('BOUNDS', t2 - t1, t3 - t0, flush=True)\n"
        "if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5, warmup_max_s=10))
    assert out.status == "ok", log
    lo, hi = _bounds(log)
    assert (
        lo <= out.off_clock_s <= hi and "every rank of the node in warm-up" in out.clock["off_clock_detail"]
    )


def test_warmup_counts_only_while_every_rank_of_the_node_is_in_it(tmp_path):
    # two "ranks" on two connections; rank 1 begins its warm-up 0.3 s after rank 0
    body = (
        "a, b = connect(0), connect(1)\na.clock_start(); b.clock_start()\n"
        "a.warmup_begin()\na1 = time.monotonic()\ntime.sleep(0.3)\n"
        "t0 = time.monotonic()\nb.warmup_begin()\nt1 = time.monotonic()\ntime.sleep(0.3)\n"
        "t2 = time.monotonic()\na.warmup_end()\nt3 = time.monotonic()\nb.warmup_end()\n"
        "print('BOUNDS', t2 - t1, t3 - t0)\nprint('RANK0', t2 - a1)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5), local_ranks=2)
    assert out.status == "ok", log
    lo, hi = _bounds(log)
    rank0_s = float(next(line.split()[1] for line in log.splitlines() if line.startswith("RANK0 ")))
    assert lo <= out.off_clock_s <= hi, (lo, hi)  # the overlap of the two warm-ups, as the ranks saw it
    assert (
        out.off_clock_s < rank0_s or hi >= rank0_s
    )  # not rank 0's whole warm-up (unless load blurs the two)


def test_wire_refuses_strangers_and_lies(tmp_path):
    body = (
        "try:\n    WireClient.connect(dict(ADDR, secret='0' * 32), rank=0, local_rank=0)\n"
        "except WireError as e:\n    print('STRANGER', e)\n"
        "w = connect()\n"
        "try:\n    connect(0)\nexcept WireError as e:\n    print('TWICE', e)\n"
        "try:\n    w.warmup_begin()\nexcept WireError as e:\n    print('EARLY', e)\n"
        "w.clock_start()\n"
        "os.symlink('/etc/hostname', os.path.join(OUT, 'state.safetensors'))\n"
        "try:\n    w.done(state=True)\nexcept WireError as e:\n    print('LINK', e)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5))
    assert "STRANGER" in log and "wrong secret" in log and "TWICE" in log and "already connected" in log
    assert "EARLY" in log and "before clock_start" in log and "LINK" in log and "not a regular file" in log
    assert out.clock["state_sha256"] is None and out.clock["ended_by"] == "exit"


def test_a_state_changed_after_the_handover_is_an_error(tmp_path):
    body = START + (
        "f = open(os.path.join(OUT, 'state.safetensors'), 'wb')\nf.write(b'honest'); f.flush()\n"
        "w.done(state=True)\n"
        "f.seek(0); f.write(b'forged'); f.close()\n"  # a descriptor kept across the move
    )
    out, _ = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5))
    assert out.status == "error" and "changed after it was handed over" in out.detail


def test_a_state_written_while_the_supervisor_hashes_it_is_on_the_clock(tmp_path, monkeypatch):
    # The rank keeps a descriptor of its state (a hard link serves as well) and goes on training after `done`:
    # what it writes while the supervisor is still hashing lands before the hash reads it, so the final re-hash
    # matches. The clock stopped when `done` came, before the hash: a state of many GB (a padding tensor its
    # own codec drops) hashes for seconds, all of them training off the clock. Here the hash is slowed instead.
    from harness.run import clock_server

    real = clock_server._sha256_of

    def slow_hash(path):
        time.sleep(0.8)
        return real(path)

    monkeypatch.setattr(clock_server, "_sha256_of", slow_hash)
    body = START + (
        "import threading\nt0 = time.monotonic()\n"
        "f = open(os.path.join(OUT, 'state.safetensors'), 'wb')\nf.write(b'early'); f.flush()\n"
        "t = threading.Thread(target=w.done, kwargs={'state': True}); t.start()\n"
        "time.sleep(0.4); f.seek(0); f.write(b'later'); f.flush(); print('WROTE', time.monotonic() - t0)\n"
        "t.join(); f.close()\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5))
    wrote = float(next(line.split()[1] for line in log.splitlines() if line.startswith("WROTE ")))
    assert out.clock["ended_by"] == "state_handover", log
    assert (tmp_path / "handed-state.safetensors").read_bytes() == b"later"  # what the pack would read
    assert out.train_time_s is not None and out.train_time_s >= wrote, (out.train_time_s, wrote)


def test_a_link_swapped_in_during_the_handover_is_never_taken_as_the_state(tmp_path, monkeypatch):
    # A rank that swaps its state file for a symbolic link between the supervisor's check of the name and the
    # move (renameat2 RENAME_EXCHANGE in a loop, retrying `done`) won 4 races of 10: the link was moved out of
    # reach, the handover refused (the hash does not follow it), and run_train_phase then moved the link into
    # RUN_DIR as the state (is_file follows it): the pack read whatever host file it named, say weights
    # pretrained for days in an uncounted file of the entry's folder, and the run was ok. Here the rank
    # always wins the race: the swap happens inside the supervisor's os.rename.
    pretrained = tmp_path / "pretrained.log"
    pretrained.write_bytes(b"weights trained off the clock")
    state = tmp_path / "out" / "state.safetensors"
    real_rename = os.rename

    def racing_rename(src, dst, *args, **kwargs):
        if os.fspath(src) == str(state):
            os.symlink(pretrained, str(state) + ".link")
            os.replace(str(state) + ".link", state)  # the rank's swap, just after the check
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", racing_rename)
    body = START + (
        "open(os.path.join(OUT, 'state.safetensors'), 'wb').write(b'dummy')\n"
        "try:\n    w.done(state=True)\n    print('TAKEN')\nexcept WireError as e:\n    print('REFUSED', e)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=5, startup_s=5))
    handed = tmp_path / "handed-state.safetensors"
    # nothing of the link is left where run_train_phase takes the state
    assert not os.path.lexists(handed), log
    assert "REFUSED" in log and "not a regular file" in log, log
    assert out.clock["state_sha256"] is None and out.clock["ended_by"] != "state_handover"


def test_only_the_state_the_supervisor_hashed_is_taken_into_the_run_folder(tmp_path):
    from harness.run.train_phase import take_handed_state

    run_dir, pretrained = tmp_path / "run", tmp_path / "pretrained.log"
    run_dir.mkdir()
    pretrained.write_bytes(b"weights trained off the clock")
    handed = tmp_path / "handed-state.safetensors"
    handed.symlink_to(pretrained)
    assert take_handed_state(handed, run_dir, sha256=None) is False
    assert not os.path.lexists(run_dir / "state.safetensors")
    handed.unlink()
    handed.write_bytes(b"state")
    digest = hashlib.sha256(b"state").hexdigest()
    assert take_handed_state(handed, run_dir, sha256=digest) is True
    assert (run_dir / "state.safetensors").read_bytes() == b"state"


def test_a_deeply_nested_message_cannot_crash_the_supervisor(tmp_path):
    # 60,000 brackets in one message: json.loads raised RecursionError, not a ValueError, out of the supervisor's
    # loop; the phase was left running unsupervised (no deadline, no kill) and the run's verdict became "the
    # harness failed", which an official re-runs: a free retry for an entry about to be over_budget
    body = START + "w._sock.send(b'[' * 60_000)\nw._sock.recv(65_536)\ntime.sleep(30)\n"
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=0.5, grace_s=0.3, startup_s=5))
    assert out.status == "over_budget" and out.clock_to_exit_s < 0.8 + 1.5, log
    assert out.clock["requests_refused"] == {"not a wire message": 1}


def test_a_harness_failure_while_supervising_kills_the_phase(tmp_path, monkeypatch):
    # whatever goes wrong in the supervisor's own loop, the ranks do not outlive it unsupervised
    token = f"t-{secrets.token_hex(8)}"

    real_serve = ClockServer.serve

    def serve_then_fail(self: ClockServer, timeout_s: float) -> None:
        real_serve(self, timeout_s)
        if self.start is not None:
            raise RuntimeError("the supervisor's own bug")

    monkeypatch.setattr(ClockServer, "serve", serve_then_fail)
    with pytest.raises(RuntimeError, match="own bug"):
        _supervise(tmp_path, START + "time.sleep(30)\n", BudgetConfig(train_s=5, startup_s=5), token)
    time.sleep(0.2)
    assert processes_with_token(token) == []


def test_a_fifo_for_metrics_cannot_stall_the_supervisor(tmp_path, monkeypatch):
    # the supervisor's progress line reads the tail of OUT/metrics.jsonl while the ranks run; a rank that made it
    # a FIFO blocked the supervisor in open() until a writer came: no deadline was enforced meanwhile, and with
    # no writer ever (the rank gone) the run never ended. This rank lets it go after 6 s, once.
    monkeypatch.setattr("harness.run.launch.PROGRESS_EVERY_S", 0.05)
    body = START + (
        "fifo = os.path.join(OUT, 'metrics.jsonl')\nos.mkfifo(fifo)\n"
        "time.sleep(6)\nos.rename(fifo, fifo + '.old')\nopen(fifo + '.old', 'w').close()\ntime.sleep(30)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=0.5, grace_s=0.3, startup_s=5))
    assert out.status == "over_budget" and out.clock_to_exit_s < 0.8 + 1.5, (out, log)


def test_a_nested_metrics_line_cannot_crash_the_supervisor(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.run.launch.PROGRESS_EVERY_S", 0.05)
    body = START + "open(os.path.join(OUT, 'metrics.jsonl'), 'w').write('[' * 4000 + '\\n')\ntime.sleep(30)\n"
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=0.5, grace_s=0.3, startup_s=5))
    assert out.status == "over_budget" and out.clock_to_exit_s < 0.8 + 1.5, (out, log)


def test_a_rank_that_never_reads_its_replies_cannot_stall_the_supervisor(tmp_path):
    body = START + (
        "raw = json.dumps({'kind': 'clock_start'}).encode()\n"
        "try:\n    for _ in range(1_000_000):\n        w._sock.send(raw)\nexcept OSError as e:\n    print('CUT', e)\n"
        "time.sleep(30)\n"
    )
    out, log = _supervise(tmp_path, body, BudgetConfig(train_s=0.5, grace_s=0.3, startup_s=5))
    assert out.status == "over_budget" and out.clock_to_exit_s < 0.8 + 1.5, log
    assert "CUT" in log


def test_rank_failures_parses_torchrun_summary():
    log = "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n"
    assert rank_failures(log) == [{"rank": 1, "local_rank": 1, "exitcode": -9, "signal": "SIGKILL"}]


def test_a_rank_killed_by_sigkill_is_out_of_memory_only_when_the_kernel_oom_killer_did_it():
    """A rank that SIGKILLs itself read as out_of_memory (the signal was taken for the OOM killer's): now the
    supervisor's reading of the kernel's OOM kill count decides; a rank's MemoryError still picks it."""
    from harness.run.train_phase import ran_out_of_memory

    killed = {
        "errors": {},
        "rank_failures": [{"rank": 0, "local_rank": 0, "exitcode": -9, "signal": "SIGKILL"}],
    }
    assert not ran_out_of_memory({**killed, "kernel_oom_kill": False})  # it sent the signal itself
    assert not ran_out_of_memory({**killed, "kernel_oom_kill": None})  # cannot tell: error, not a resource
    assert ran_out_of_memory({**killed, "kernel_oom_kill": True})
    assert ran_out_of_memory({"errors": {"train_error_rank0.txt": "MemoryError"}, "rank_failures": []})


def test_the_kernel_oom_kill_count_is_read_from_proc_vmstat():
    from scoring.worker.process import kernel_oom_kills, oom_killed_since

    n = kernel_oom_kills()
    if n is None:
        pytest.skip("/proc/vmstat has no oom_kill on this kernel")
    assert n >= 0 and oom_killed_since(n) is False and oom_killed_since(n - 1) is True
    assert oom_killed_since(None) is None


# ---- sandbox plans ----

NO_LANDLOCK = MachineCaps(landlock_abi=0, root=False, unshare=None)
LANDLOCK_ROOT = MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True)


def test_carve_leaves_out_protected_paths_and_links_to_them(tmp_path):
    for d in ("a/b/prot", "a/b/x", "a/c"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "a/link").symlink_to(tmp_path / "a/b/prot")
    got = carve(str(tmp_path / "a"), [str(tmp_path / "a/b/prot")])
    assert got == [str(tmp_path / "a/b/x"), str(tmp_path / "a/c")]


def _plan(tmp_path, caps, **kw):
    data = tmp_path / "ds"
    (data / "val").mkdir(parents=True, exist_ok=True)
    (tmp_path / "stage/data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "stage/out").mkdir(parents=True, exist_ok=True)
    args = dict(
        mode="auto",
        network="auto",
        device="cpu",
        multi_node=False,
        project_root=REPO,
        read_paths=[tmp_path / "stage/data"],
        write_paths=[tmp_path / "stage/out"],
        protected=[data],
        private=[tmp_path / "stage"],
        caps=caps,
    )
    return plan_sandbox(**{**args, **kw}), data


def test_plan_uses_every_layer_offered(tmp_path):
    plan, data = _plan(tmp_path, LANDLOCK_ROOT)
    d = plan.describe()
    assert (
        d["landlock"]
        and d["namespaces"] == ["mount", "pid", "ipc", "net"]
        and d["capabilities_dropped"]
        and d["signals_scoped"]
    )
    assert str(tmp_path / "stage/out") in d["write_roots"]
    assert not any(r.path == str(data) or r.path.startswith(str(data) + "/") for r in plan.rules)
    (tmp_path / "other").mkdir()
    carved, _ = _plan(tmp_path, LANDLOCK_ROOT, extra_read=[str(tmp_path)])
    roots = carved.describe()["read_roots"]
    assert (
        str(tmp_path / "other") in roots and str(tmp_path / "stage/data") in roots
    )  # tmp_path carved around ds and stage
    assert str(tmp_path) not in roots and str(tmp_path / "stage") not in roots and str(data) not in roots
    wrapped = plan.wrap(["torchrun"], tmp_path / "policy.json")
    assert wrapped[0] == "/usr/bin/unshare" and "--net" in wrapped and wrapped[-2:] == ["--", "torchrun"]
    assert json.loads((tmp_path / "policy.json").read_text())["loopback_up"] is True
    multi, _ = _plan(tmp_path, LANDLOCK_ROOT, multi_node=True)
    assert multi.namespaces == () and multi.landlock and any("several nodes" in w for w in multi.warnings)


def test_a_dataset_inside_an_allowed_folder_is_carved_out(tmp_path):
    (tmp_path / "stage/data/inner_ds").mkdir(parents=True)
    (tmp_path / "stage/data/x.bin").write_bytes(b"")
    plan, _ = _plan(tmp_path, LANDLOCK_ROOT, protected=[tmp_path / "stage/data/inner_ds"])
    roots = plan.describe()["read_roots"]
    assert str(tmp_path / "stage/data/x.bin") in roots and str(tmp_path / "stage/data") not in roots
    assert not any(r.startswith(str(tmp_path / "stage/data/inner_ds")) for r in roots)


def test_a_broad_read_path_never_exposes_the_temp_folder(tmp_path):
    # running a script from the temp folder puts it on sys.path: it must not open other runs' staging there
    tmp = os.path.realpath(tempfile.gettempdir())
    plan, _ = _plan(tmp_path, LANDLOCK_ROOT, import_path=[tmp], extra_read=["/"])
    under_tmp = [
        r.path
        for r in plan.rules
        if (r.path == tmp or r.path.startswith(tmp + "/")) and not is_own_install(r.path)
    ]
    assert under_tmp and all(p.startswith(str(tmp_path / "stage") + "/") for p in under_tmp), under_tmp
    assert any("temp folder" in w for w in plan.warnings)


def test_plan_degrades_with_warnings_where_layers_are_missing(tmp_path):
    plan, data = _plan(tmp_path, NO_LANDLOCK)
    d = plan.describe()
    assert not d["landlock"] and d["namespaces"] == [] and not d["capabilities_dropped"]
    assert any("Landlock is not available" in w for w in d["warnings"]) and any(
        "not root" in w for w in d["warnings"]
    )
    no_net, _ = _plan(
        tmp_path,
        MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True, net_namespace=False),
    )
    assert no_net.namespaces == ("mount", "pid", "ipc") and any("--net" in w for w in no_net.warnings)
    assert plan.rules  # still planned: the access monitor reports against them
    assert plan.wrap(["torchrun"], tmp_path / "p.json")[-2:] == ["--", "torchrun"]
    with pytest.raises(SandboxRefused, match="landlock: Landlock"):
        _plan(tmp_path, NO_LANDLOCK, mode="required")
    with pytest.raises(ValueError, match="overlaps the protected"):
        _plan(tmp_path, LANDLOCK_ROOT, write_paths=[data / "val"])
    off, _ = _plan(tmp_path, LANDLOCK_ROOT, mode="off")
    assert off.wrap(["torchrun"], tmp_path / "p.json") == ["torchrun"] and off.describe()["warnings"]


def test_access_monitor_reports_denied_accesses_with_the_submission_frame(tmp_path, capfd):
    sub = tmp_path / "sub"
    mon = AccessMonitor(
        rank=3, read=[str(tmp_path / "ok")], listing=[], write=[str(tmp_path / "out")], attribute_to=str(sub)
    )
    assert mon.allowed(str(tmp_path / "ok/f"), "open", False) and not mon.allowed(
        str(tmp_path / "ok/f"), "open", True
    )
    code = compile("def peek(mon, p):\n    mon('open', (p, 'r', 0))\n", str(sub / "train.py"), "exec")
    ns: dict = {}
    exec(code, ns)
    ns["peek"](mon, str(tmp_path / "ok/f"))
    ns["peek"](mon, str(tmp_path / "secret/fineweb_val_000000.bin"))
    mon("os.scandir", (str(tmp_path),))
    mon("open", (5, "r", 0))  # a descriptor: not a path
    got = parse_attempts(capfd.readouterr().err)
    assert [a["path"] for a in got] == [str(tmp_path / "secret/fineweb_val_000000.bin"), str(tmp_path)]
    assert (
        got[0]["rank"] == 3
        and got[0]["submission_frame"] == "train.py:2"
        and got[1]["submission_frame"] is None
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock is Linux only")
def test_landlock_denies_what_the_plan_leaves_out(tmp_path):
    from isolation.landlock import landlock_abi

    if landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    plan, data = _plan(tmp_path, MachineCaps(landlock_abi=landlock_abi(), root=False, unshare=None))
    (data / "val/fineweb_val_000000.bin").write_bytes(b"x" * 32)
    (tmp_path / "stage/data/ok.txt").write_text("ok")
    cmd = plan.wrap(
        [
            sys.executable,
            "-m",
            "isolation.sandbox",
            "probe",
            str(data / "val/fineweb_val_000000.bin"),
            str(tmp_path / "stage/data/ok.txt"),
        ],
        tmp_path / "policy.json",
    )
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True
    )
    got = json.loads(r.stdout)
    assert (
        got[str(data / "val/fineweb_val_000000.bin")] == "PermissionError"
        and got[str(tmp_path / "stage/data/ok.txt")] == "read"
    )


def test_enter_skips_a_refused_layer_with_a_warning_unless_required(tmp_path, monkeypatch, capsys):
    import isolation.sandbox as sandbox

    def refused(*args, **kwargs):
        raise OSError(1, "blocked by a seccomp filter")

    ran: list[list[str]] = []
    filters: list[str] = []
    monkeypatch.setattr(sandbox, "apply_landlock", refused)
    monkeypatch.setattr(sandbox.os, "execvp", lambda prog, argv: ran.append(argv))
    # never in this process: a real filter would refuse memfd_create to every later test of the worker
    monkeypatch.setattr(sandbox, "apply_seccomp", lambda profile, **_: filters.append(profile))
    plan, _ = _plan(tmp_path, MachineCaps(landlock_abi=7, root=False, unshare=None))
    plan.wrap(["x"], tmp_path / "policy.json")
    sandbox.enter(str(tmp_path / "policy.json"), ["torchrun", "--x"])
    assert ran == [["torchrun", "--x"]] and filters == ["world"]  # every sandbox gets the world profile
    assert capsys.readouterr().err.startswith(sandbox.WARNING_PREFIX + "Landlock failed")
    required, _ = _plan(
        tmp_path,
        MachineCaps(landlock_abi=7, root=False, unshare=None),
        mode="required",
        allow_missing=("namespaces", "network_namespace", "world"),
    )
    required.wrap(["x"], tmp_path / "policy.json")
    with pytest.raises(OSError, match="seccomp"):
        sandbox.enter(str(tmp_path / "policy.json"), ["torchrun"])


@pytest.mark.parametrize(
    ("caps", "kw", "missing", "needed"),
    [
        (
            MachineCaps(landlock_abi=0, root=True, unshare="/usr/bin/unshare", overlay=True),
            {},
            ["landlock", "signal_scoping"],
            ["landlock"],  # signal scoping's guarantee: the PID namespace
        ),
        (
            MachineCaps(landlock_abi=7, root=False, unshare=None),
            {},
            ["namespaces", "network_namespace", "world"],
            ["namespaces", "network_namespace", "world"],
        ),
        (
            MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=False),
            {},
            ["world"],
            ["world"],
        ),
        (
            MachineCaps(
                landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True, net_namespace=False
            ),
            {},
            ["network_namespace"],
            ["network_namespace"],
        ),
        (
            MachineCaps(landlock_abi=5, root=True, unshare="/usr/bin/unshare", overlay=True),
            {},
            ["signal_scoping"],
            [],  # a 6.8 kernel with root and namespaces: every guarantee holds
        ),
        (
            MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True),
            {"multi_node": True},
            ["namespaces", "network_namespace", "world"],
            ["namespaces", "network_namespace", "world"],
        ),
        (
            MachineCaps(landlock_abi=7, root=True, unshare="/usr/bin/unshare", overlay=True),
            {"network": "host"},
            [],
            [],
        ),
    ],
)
def test_a_required_sandbox_names_every_needed_layer_and_takes_only_an_explicit_allowance(
    tmp_path, caps, kw, missing, needed
):
    """A required sandbox refuses a machine only for the layers whose guarantees nothing else gives."""
    if not needed:
        d = _plan(tmp_path, caps, mode="required", **kw)[0].describe()
        assert d["missing_layers"] == missing and d["missing_allowed_by_official"] == []
        held = {k: v for k, v in d["guarantees"].items() if not v.startswith("allowed missing")}
        assert "missing" not in held.values()
        if kw.get("network") == "host":  # the official's choice: recorded as such, never as held
            assert d["guarantees"]["no_network"] == "allowed missing: network_namespace"
        return
    with pytest.raises(SandboxRefused) as refused:
        _plan(tmp_path, caps, mode="required", **kw)
    message = str(refused.value)
    assert all(f"--allow-missing-layer {m}" in message for m in needed), message
    assert not any(f"--allow-missing-layer {m}" in message for m in missing if m not in needed), message
    # allowing all but one still refuses, naming the one
    if len(needed) > 1:
        with pytest.raises(SandboxRefused, match=f"--allow-missing-layer {needed[-1]}"):
            _plan(tmp_path, caps, mode="required", allow_missing=needed[:-1], **kw)
    plan, _ = _plan(tmp_path, caps, mode="required", allow_missing=needed, **kw)
    d = plan.describe()
    assert d["missing_layers"] == missing and d["missing_allowed_by_official"] == needed
    assert sum("allowed by the official" in w for w in d["warnings"]) == len(needed)
    auto, _ = _plan(tmp_path, caps, mode="auto", **kw)  # auto never refuses, and records the same gaps
    assert (
        auto.describe()["missing_layers"] == missing and auto.describe()["missing_allowed_by_official"] == []
    )


def test_an_unknown_layer_name_is_refused_with_the_list():
    from isolation.sandbox import KERNEL_LAYERS, parse_layers

    assert parse_layers("landlock, seccomp,landlock") == ("landlock", "seccomp")
    with pytest.raises(ValueError, match="unknown isolation layer.*'landlok'") as e:
        parse_layers("landlok")
    assert all(name in str(e.value) for name in KERNEL_LAYERS)


SHM_PROBE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
print(libc.shmget(ctypes.c_int(int(sys.argv[1])), ctypes.c_size_t(0), ctypes.c_int(0)))
"""


@pytest.mark.skipif(
    not (os.geteuid() == 0 and shutil.which("unshare")), reason="namespaces need root and unshare"
)
def test_a_sysv_shared_memory_segment_outside_is_not_reachable_inside(tmp_path):
    """SysV segments outlive a run and reach every process of an IPC namespace: an attacker's model worker
    kept validation rows in one for its probe workers and a later run's training. The sandbox has its own."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5047_0000 + os.getpid() % 0xFFFF
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(4096), ctypes.c_int(0o1000 | 0o666))  # IPC_CREAT
    assert shmid >= 0
    try:
        plan, _ = _plan(tmp_path, LANDLOCK_ROOT)
        if plan.unshare is None:
            pytest.skip("unshare cannot make namespaces here")
        seen = lambda argv: (
            subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
        )
        outside = seen([sys.executable, "-c", SHM_PROBE, str(key)])
        inside = seen(plan.wrap([sys.executable, "-c", SHM_PROBE, str(key)], tmp_path / "policy.json"))
        assert int(outside) == shmid and int(inside) == -1, (outside, inside)
    finally:
        libc.shmctl(ctypes.c_int(shmid), ctypes.c_int(0), None)  # IPC_RMID


def test_a_project_under_a_broad_read_root_shows_its_code_and_nothing_else(tmp_path):
    """A clone at /opt/pgolf (/opt is a broad read root) showed the ranks and model workers all of it: the other
    runs under runs/ (an entrant's trained weights to start from), the ledger, a dataset built there. Now the
    project's folder is out of every broad rule; its code packages are the phase's own rules, and a Python
    installation inside it (.venv) is still read."""
    from isolation.sandbox import broad_hidden

    opt = tmp_path / "opt"
    project = opt / "pgolf"
    for d in ("harness", "data", "scoring", "isolation", "runs/other-entry", ".venv/lib"):
        (project / d).mkdir(parents=True)
    (project / "runs/other-entry/state.safetensors").write_bytes(b"their weights")
    (opt / "other-tool").mkdir()
    plan, _ = _plan(
        tmp_path, LANDLOCK_ROOT, project_root=project, extra_read=[str(opt), str(project / ".venv")]
    )
    readable = [r.path for r in plan.rules if r.access == "ro"]

    def covered(path: Path) -> bool:
        return any(str(path) == r or str(path).startswith(r.rstrip("/") + "/") for r in readable)

    assert not covered(project / "runs/other-entry/state.safetensors")
    assert all(covered(project / d) for d in ("harness", "data", "scoring", "isolation", ".venv/lib"))
    assert covered(opt / "other-tool")  # the rest of the broad root is as it was
    warnings: list[str] = []
    assert broad_hidden([Path(sys.prefix) / "lib", "/", opt / "other-tool"], warnings) == [
        str(opt / "other-tool")
    ]
    assert len(warnings) == 2  # inside the Python installation (installed there), and a folder holding /usr

    # another dataset of the same documents (its validation text in other tokens) under a broad read root: the
    # machine's dataset locations are private to every phase too
    other = opt / "datasets/fineweb10B_sp8192"
    other.mkdir(parents=True)
    (other / "fineweb_val_000000.bin").write_bytes(b"validation text")
    plan, _ = _plan(
        tmp_path, LANDLOCK_ROOT, project_root=project, extra_read=[str(opt)], private=[opt / "datasets"]
    )
    readable = [r.path for r in plan.rules if r.access == "ro"]
    assert not covered(other / "fineweb_val_000000.bin") and covered(opt / "other-tool")


def test_the_projects_packages_show_their_code_and_no_dataset_kept_in_them(tmp_path, monkeypatch):
    """The reference challenge keeps its datasets at ./data/datasets, inside this project's `data` package: a
    rank trained on fineweb10B_sp1024 read fineweb10B_byte260/fineweb_val_000000.bin (the validation text
    verbatim) through the package's rule, PG_DATA_DIR pointing there or not. A package's rule covers its code
    alone now: its .py files, its subpackages and their bytecode caches."""
    project = tmp_path / "pgolf"
    code = [
        project / pkg / f
        for pkg in ("harness", "data", "scoring", "isolation")
        for f in ("__init__.py", "sub/__init__.py", "sub/__pycache__/m.cpython-311.pyc")
    ]
    for f in code:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    mine, other = project / "data/datasets/fineweb10B_sp1024", project / "data/datasets/fineweb10B_byte260"
    for d in (mine, other):
        d.mkdir(parents=True)
        (d / "fineweb_val_000000.bin").write_bytes(b"validation text")
    (project / "data/stray_val.bin").write_bytes(b"validation text")
    for configured in (False, True):
        if configured:
            monkeypatch.setenv("PG_DATA_DIR", str(project / "data/datasets"))
        plan, _ = _plan(tmp_path, LANDLOCK_ROOT, project_root=project, protected=[mine])
        readable = [r.path for r in plan.rules if r.access == "ro"]

        def covered(path: Path, readable: list[str] = readable) -> bool:
            return any(str(path) == r or str(path).startswith(r.rstrip("/") + "/") for r in readable)

        assert not covered(other / "fineweb_val_000000.bin") and not covered(project / "data/stray_val.bin")
        assert all(covered(f) for f in code)


class _Planned(Exception):
    """Raised by a recording plan_sandbox: the phase is planned, nothing more is wanted of it."""


def test_a_phase_never_shows_the_other_runs_beside_its_own(tmp_path, monkeypatch, tiny_dataset):
    """`pgolf run` puts a run in ./runs/NAME of the folder it is started from, and the ledger beside it: started
    from a folder under a broad read root (/opt/work, or an official's extra read path), every rank and the
    sealed pack read the other runs (an entrant's trained state to start from) and the ledger. The folder that
    holds the run's own is private to its phases."""
    import harness.run.train_phase as train_phase
    from harness.config import load_config
    from harness.run.pipeline import ledger_path

    assert ledger_path(tmp_path / "runs/mine", None) == tmp_path / "runs/ledger.jsonl"  # the default: beside

    opt = tmp_path / "opt"
    runs = opt / "work/runs"
    (runs / "other-entry").mkdir(parents=True)
    (runs / "other-entry/state.safetensors").write_bytes(b"their weights")
    (runs / "ledger.jsonl").write_text("{}\n")
    (opt / "elsewhere").mkdir()
    (opt / "elsewhere/ledger.jsonl").write_text(
        "{}\n"
    )  # a ledger given with --ledger, in a folder of its own
    (opt / "other-tool").mkdir()
    run_dir = runs / "mine"
    run_dir.mkdir()
    (run_dir / train_phase.STATE_FILE).write_bytes(b"state")
    cfg = load_config(REPO / "tests/fixtures/submissions/peek_val", None, [])
    launch = LaunchConfig(sandbox_read_paths=str(opt))
    planned: list[dict] = []

    def record(**kw):
        planned.append(kw)
        raise _Planned

    monkeypatch.setattr(train_phase, "plan_sandbox", record)
    sub, budget = REPO / "tests/fixtures/submissions/peek_val", cfg.section("budget")
    (tmp_path / "views").mkdir()
    with pytest.raises(_Planned):
        train_phase.run_train_phase(
            submission_dir=sub, data_root=tiny_dataset, run_dir=run_dir, stage_root=tmp_path / "views",
            model_config=cfg.model, hparams=cfg.train, seed=1, budget=budget, launch=launch, device="cpu",
            private=[ledger_path(run_dir, opt / "elsewhere/ledger.jsonl").parent],
        )  # fmt: skip
    with pytest.raises(_Planned):
        train_phase.run_sealed_pack(
            run_dir=run_dir, submission_dir=sub, data_root=tiny_dataset, budget=budget, launch=launch,
            train_time_s=0.0, cap_bytes=16_000_000, log_path=run_dir / "pack.log", private=[opt / "elsewhere"],
        )  # fmt: skip
    for kw in planned:
        plan = plan_sandbox(**{**kw, "caps": LANDLOCK_ROOT})
        readable = [r.path for r in plan.rules if r.access == "ro"]
        seen = [
            p
            for p in (
                runs / "other-entry/state.safetensors",
                runs / "ledger.jsonl",
                opt / "elsewhere/ledger.jsonl",
            )
            if any(str(p) == r or str(p).startswith(r.rstrip("/") + "/") for r in readable)
        ]
        assert not seen, f"the {kw['phase']} reads {seen}"
        assert str(opt / "other-tool") in readable  # the rest of the broad root is as it was

    # the model worker, /opt/work on its import path: the pipeline and verify name the runs' folder
    from scoring.score.remote import WorkerConfig, WorkerModel

    monkeypatch.setattr(sys, "path", [sys.path[0], str(opt), *sys.path[1:]])
    (run_dir / "artifact.pgolf").write_bytes(b"artifact")
    worker = WorkerModel(
        WorkerConfig(
            code_dir=sub, artifact=run_dir / "artifact.pgolf", vocab_size=260, max_tokens_per_batch=64,
            private=(runs,),
        )
    )  # fmt: skip
    worker.close()
    readable = [r.path for r in worker.plan.rules if r.access == "ro"]
    theirs = str(runs / "other-entry/state.safetensors")
    assert not any(theirs.startswith(r.rstrip("/") + "/") for r in readable), "the model worker reads them"
    assert str(opt / "other-tool") in readable and str(run_dir / "artifact.pgolf") in readable


def test_the_machines_dataset_locations_are_the_configured_ones_that_exist(tmp_path, monkeypatch):
    from data.manifest import dataset_locations

    (tmp_path / "pg").mkdir()
    (tmp_path / "hf").mkdir()
    monkeypatch.setenv("PG_DATA_DIR", str(tmp_path / "pg"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PGOLF_DATA", str(tmp_path / "absent"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    assert dataset_locations() == [tmp_path / "hf", tmp_path / "pg"]


def test_the_officials_home_is_out_of_every_broad_rule(tmp_path, monkeypatch):
    """`PYTHONPATH=.` run from the official's home made the home folder an import root, so a broad read rule:
    train.py read ~/.ssh, ~/.netrc (the wandb key) and the Hugging Face token. The home folder and the folders
    that name the official's credentials are now out of every broad rule; a Python installation inside the home
    (a venv) is a rule of its own and stays readable."""
    from isolation.sandbox import official_homes

    home = tmp_path / "home"
    for d in (".ssh", ".venv/lib", "wandb-config"):
        (home / d).mkdir(parents=True)
    (home / ".ssh/id_ed25519").write_text("PRIVATE KEY")
    (home / ".netrc").write_text("machine api.wandb.ai password SECRET")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    assert str(home.resolve()) in official_homes()
    plan, _ = _plan(tmp_path, LANDLOCK_ROOT, import_path=[str(home)], extra_read=[str(home / ".venv")])
    readable = [r.path for r in plan.rules if r.access == "ro"]

    def covered(path: Path) -> bool:
        return any(str(path) == r or str(path).startswith(r.rstrip("/") + "/") for r in readable)

    assert not covered(home / ".ssh/id_ed25519") and not covered(home / ".netrc")
    assert covered(home / ".venv/lib")


def test_the_officials_tokens_under_sudo_and_xdg_cache_are_out_of_every_broad_rule(tmp_path, monkeypatch):
    """Two spellings of the official's secrets official_homes missed. Under sudo HOME is root's: the invoking
    account's home (SUDO_USER), an import root when `sudo PYTHONPATH=. pgolf run` runs from it, stayed readable with
    its ~/.ssh. XDG_CACHE_HOME moves the Hugging Face token ($XDG_CACHE_HOME/huggingface/token, written mode 644)
    beneath a broad root (/opt/cache): train.py read it."""
    import pwd

    from isolation.sandbox import official_homes

    opt, alice = tmp_path / "opt", tmp_path / "alice"
    (opt / "cache/huggingface").mkdir(parents=True)
    (opt / "cache/huggingface/token").write_text("hf_SECRET")
    (opt / "other-tool").mkdir()
    (alice / ".ssh").mkdir(parents=True)
    (alice / ".ssh/id_ed25519").write_text("PRIVATE KEY")
    (tmp_path / "root").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "root"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(opt / "cache"))
    monkeypatch.setenv("SUDO_USER", "alice")
    real_getpwnam = pwd.getpwnam
    monkeypatch.setattr(
        pwd,
        "getpwnam",
        lambda name: SimpleNamespace(pw_dir=str(alice)) if name == "alice" else real_getpwnam(name),
    )
    homes = official_homes()
    assert str(alice.resolve()) in homes and str((opt / "cache/huggingface").resolve()) in homes
    plan, _ = _plan(tmp_path, LANDLOCK_ROOT, import_path=[str(alice), str(opt)])
    readable = [r.path for r in plan.rules if r.access == "ro"]

    def covered(path: Path) -> bool:
        return any(str(path) == r or str(path).startswith(r.rstrip("/") + "/") for r in readable)

    assert not covered(alice / ".ssh/id_ed25519") and not covered(opt / "cache/huggingface/token")
    assert covered(opt / "other-tool")  # the rest of the broad root is as it was
