"""`pgolf bench score`: scorer tokens/s against a plain evaluation loop, and the probes' share of a score.

    pgolf bench score [--submission DIR] [--model-config JSON] [--data DIR] [--seq-len 256] [--batch-seqs 32]
                      [--max-tokens 65536] [--repeats 3] [--rounds 5] [--probes 2] [--profile] [--sandbox auto]

One artifact is packed first (the submission's model code staged without train.py, random weights
with seed 0: speed does not depend on them; the submission's codec; by default the CPU track
baseline's shape, 4 x 192, seq_len 256, batch 32). Both sides then score it over the same
standard-mode windows of the same validation tokens, with the same batch and thread count:

The plain side, and the packing here, run the submission's model.py unconfined: a folder outside the
project's baselines is refused unless `--trust-submission` says it is the official's own code.

- plain: what anyone would write, in a plain Python process: the model decoded from the artifact
  and built in-process, `torch.no_grad()`, logits = model(x), `F.cross_entropy(logits.float(), y,
  reduction="sum")`.
- scorer: the real path, `score_artifact` (scoring/score/scorer.py) in a process of its own: the
  model in a confined worker process, each batch sent through shared memory, the logits read back
  into the scorer's float64 loss buffer, then the probes in fresh workers. Its `evaluate` is wrapped
  so that it runs `--repeats` + 1 times on the same worker; the first (cold: the worker's first
  batches) is the real score's evaluation and the plain loop's warm-up counterpart.

Each side times its evaluation passes only (tokens/s over the scored tokens: process start-up, the
worker's start-up and the model build are outside), one warm-up pass and `--repeats` timed ones,
the best counting. A round is a fresh scorer process and a fresh plain process whose passes run in
lock step (pass i of one, then pass i of the other; which leads alternates by pass and by round):
this machine's load moves by more than 10 % within a minute, so both sides of a pair see the same
spell. Each round gives a ratio (scorer / plain tokens/s; >= 1.0: the scorer is no slower), and the
median over `--rounds` is the headline.

Probes' share: the score record's `probes.probe_time_s` over the real score's evaluation time (the
cold pass), per round, and projected to a `--project-tokens` evaluation (default: the CPU track's
subset, 2,097,152 tokens) at the measured scorer speed: the probes cost a fixed time per score
(fresh workers: importing torch, decoding the artifact, building the model, one cold forward each),
while the evaluation grows with the tokens scored.

`--profile` adds one process (allocator tuned as the scorer's) that times, per full batch of the
same plan, one after the other: the forward pass in-process, the worker round trip
(`WorkerModel.logits`: write the batch, forward in the worker, its copy into shared memory, the
reply), a copy of the logits into a shared buffer, the scorer's float64 loss (`nats_of` with its
workspace) and the plain loop's float32 cross-entropy; medians and minima in ms (a loaded machine
only adds time), IPC = round trip - forward - copy; and a fresh worker's start-up and first round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SUBMISSION = REPO / "baselines" / "naive_baseline"
# The CPU track's baseline shape (preset `cpu` of baselines/naive_baseline/config.toml: model, eval.seq_len,
# eval.batch_seqs; tests/unit/harness/test_bench_score.py keeps them equal): the model that track scores.
DEFAULT_MODEL_CONFIG = {"num_layers": 4, "model_dim": 192, "num_heads": 4, "num_kv_heads": 2}
DEFAULT_SEQ_LEN, DEFAULT_BATCH_SEQS = 256, 32
DEFAULT_PROJECT_TOKENS = 2_097_152
"""About the CPU track's eval subset in sp1024 tokens (its first 1,700 documents, Track.eval_max_docs, at the
split's mean of 1,240 tokens a document): what a real score on that track evaluates."""
DEFAULT_PROBES = 2
"""The scorer's default (ProbeConfig.probes): each probe is a fresh worker and one forward pass."""
PROBES_TARGET = 0.05
RATIO_TARGET = 0.95


def plain_loop(
    model: nn.Module,
    tokens: np.ndarray,
    seq_len: int,
    batch_seqs: int,
    max_tokens: int | None,
    device: torch.device,
) -> tuple[float, int]:
    """(Σ nats, tokens) the way a plain evaluation loop computes it, over the standard windows."""
    from scoring.score.windows import standard_targets

    toks, windows = standard_targets(tokens, seq_len, max_tokens)
    all_t = torch.from_numpy(toks.astype(np.int64))
    total, n = 0.0, 0
    with torch.no_grad():
        for w0 in range(0, windows, batch_seqs):
            w1 = min(w0 + batch_seqs, windows)
            chunk = all_t[w0 * seq_len : w1 * seq_len + 1].to(device)
            x, y = chunk[:-1].reshape(-1, seq_len), chunk[1:].reshape(-1, seq_len)
            logits = model(x)
            total += float(
                F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), reduction="sum")
            )
            n += y.numel()
    return total, n


# ---- preparing the artifact (in the parent) ----


def pack_random(
    submission: Path, model_config: dict[str, Any], data_dir: Path, workdir: Path, codec: str | None
) -> dict[str, Any]:
    """Stage the submission's model code, pack a seed-0 random model: (code_dir, artifact, ...) for the spec."""
    import tomllib

    from data.manifest import load_manifest
    from data.tokenizer import load_tokenizer
    from harness.run.staging import stage_model_code
    from scoring.artifact.cap import ARTIFACT_CAP_BYTES
    from scoring.artifact.pack import pack_state
    from scoring.worker.loading import build_model

    vocab = load_tokenizer(load_manifest(data_dir).tokenizer_path).byte_table().vocab_size
    cfg_file = submission / "config.toml"
    if codec is None:
        conf = tomllib.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        codec = conf.get("pack", {}).get("codec", "int8_zlib")
    code = stage_model_code(submission, workdir / "code")
    config = {**model_config, "vocab_size": vocab}
    torch.manual_seed(0)
    model = build_model(code, config)
    rec = pack_state(
        model.state_dict(),
        code,
        workdir / "bench.pgolf",
        codec_name=codec,
        model_config=config,
        cap_bytes=ARTIFACT_CAP_BYTES,
    )
    return {
        "code_dir": str(code),
        "artifact": str(workdir / "bench.pgolf"),
        "codec": codec,
        "vocab_size": vocab,
        "params": rec["num_params"],
        "artifact_bytes": rec["bytes_total"],
    }


# ---- the measuring processes ----


def _load_plain(spec: dict[str, Any]) -> tuple[nn.Module, np.ndarray, torch.device]:
    """The model as the worker builds it (decoded from the artifact, strict load), here in-process."""
    from data.shards import read_split
    from scoring.artifact.format import artifact_codec, decode_state, read_artifact
    from scoring.worker.loading import load_model

    dev = torch.device(spec["device"])
    art = read_artifact(spec["artifact"])
    model = load_model(art, decode_state(art, artifact_codec(art, spec["code_dir"])), spec["code_dir"], dev)
    return model, read_split(spec["data"], "val"), dev


def _eval_config(spec: dict[str, Any]) -> Any:
    from scoring.score.evaluate import EvalConfig

    return EvalConfig(seq_len=spec["seq_len"], batch_seqs=spec["batch_seqs"], max_tokens=spec["max_tokens"])


MARK = "@@bench "
"""Prefix of the lines a measuring process writes for the bench (anything else on its stdout is ignored)."""


def _say(**obj: Any) -> None:
    print(MARK + json.dumps(obj), flush=True)


def _wait_turn() -> None:
    """Block until the bench says "go" (it alternates the two processes pass by pass)."""
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("bench: the parent is gone")


def measure_plain(spec: dict[str, Any]) -> dict[str, Any]:
    """A plain process: a warm-up pass, then `repeats` timed passes of plain_loop (the best counts)."""
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    model, tokens, dev = _load_plain(spec)
    L, B, mt = spec["seq_len"], spec["batch_seqs"], spec["max_tokens"]
    _say(ready=True)
    times, r = [], (0.0, 0)
    for i in range(spec["repeats"] + 1):  # the first is the warm-up
        _wait_turn()
        t0 = time.perf_counter()
        r = plain_loop(model, tokens, L, B, mt, dev)
        times.append(time.perf_counter() - t0)
        _say(**{"pass": i, "s": times[-1]})
    return {
        "threads": torch.get_num_threads(),
        "plain_s": min(times[1:]),
        "passes_s": times,
        "tokens": r[1],
        "val_loss": r[0] / r[1],
    }


def measure_scorer(spec: dict[str, Any]) -> dict[str, Any]:
    """The real score_artifact, its evaluate run repeats + 1 times on the same worker (the first is the cold one).

    Each pass is timed as the scorer times its evaluation (`EvalResult.eval_time_s`: windows, the
    round trips to the worker, the float64 loss, the byte counts); the last pass's result is the one
    the score goes on with (the probes compare fresh workers against its kept batches).
    """
    import scoring.score.scorer as scorer_mod
    from scoring.score.probes import ProbeConfig

    real_evaluate = scorer_mod.evaluate
    times: list[float] = []
    entered: list[float] = []

    def timed_evaluate(*args: Any, **kwargs: Any) -> Any:
        entered.append(time.perf_counter())
        _say(ready=True)
        res = None
        for i in range(spec["repeats"] + 1):
            _wait_turn()
            res = real_evaluate(*args, **kwargs)
            times.append(res.eval_time_s)
            _say(**{"pass": i, "s": times[-1]})
        _wait_turn()  # the probes run once the plain process is gone
        return res

    scorer_mod.evaluate = timed_evaluate
    t0 = time.perf_counter()
    try:
        rec = scorer_mod.score_artifact(
            spec["artifact"],
            spec["code_dir"],
            spec["data"],
            _eval_config(spec),
            spec["device"],
            spec["threads"],
            sandbox=spec["sandbox"],
            probe_cfg=ProbeConfig(probes=spec["probes"]),
        )
    finally:
        scorer_mod.evaluate = real_evaluate
    probes = rec["probes"]
    return {
        "threads": rec["threads"],
        "scorer_s": min(times[1:]),
        "cold_eval_s": times[0],
        "passes_s": times,
        "startup_s": entered[0] - t0,
        "tokens": rec["val_tokens"],
        "val_loss": rec["val_loss"],
        "probes_s": probes.get("probe_time_s", 0.0),
        "probes": len(probes.get("probes", [])),
        "sandbox": _layers(rec["workers"][0]["isolation"]),
    }


def _layers(iso: dict[str, Any]) -> str:
    on = [k for k in ("landlock", "seccomp", "capabilities_dropped") if iso.get(k)]
    return f"{iso.get('mode')} ({', '.join(on + list(iso.get('namespaces', []))) or 'no layer'})"


def measure_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """Per-batch parts of the scorer's path against the plain loop's, alternating, in one process (full batches)."""
    from data.manifest import load_manifest
    from data.tokenizer import load_tokenizer
    from scoring.score.evaluate import LossWorkspace, nats_of
    from scoring.score.remote import WorkerConfig, start_worker
    from scoring.score.windows import eval_tokens, plan_windows
    from scoring.worker.child import default_memory_limit_bytes, tune_cpu_allocator
    from scoring.worker.wire import SharedBuffer

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    tune_cpu_allocator()  # as the scorer and the worker do
    model, tokens, dev = _load_plain(spec)
    cfg = _eval_config(spec)
    bos = load_tokenizer(load_manifest(spec["data"]).tokenizer_path).bos_id
    L, B = cfg.seq_len, cfg.batch_seqs
    worker = start_worker(
        WorkerConfig(
            code_dir=Path(spec["code_dir"]),
            artifact=Path(spec["artifact"]),
            device=dev.type,
            dtype=cfg.dtype,
            threads=torch.get_num_threads(),
            vocab_size=spec["vocab_size"],
            max_tokens_per_batch=B * L,
            sandbox=spec["sandbox"],
            memory_limit_bytes=default_memory_limit_bytes(),
        )
    )
    t0 = time.perf_counter()
    worker.wait_ready()
    startup = time.perf_counter() - t0
    toks = eval_tokens(tokens, cfg)
    plan = plan_windows(toks, cfg, bos)
    batch_starts = list(range(0, plan.num_windows - B + 1, B)) or [0]  # full batches only (one shape)
    ws = LossWorkspace()
    parts: dict[str, list[float]] = {k: [] for k in ("forward", "round_trip", "copy", "loss_f64", "loss_f32")}
    first: dict[str, float] = {}
    try:
        shm = SharedBuffer.create("bench", B * L * spec["vocab_size"] * 4)
        with torch.inference_mode():
            for rep in range(spec["repeats"] + 1):
                for w0 in batch_starts:
                    s = plan.starts[w0 : w0 + B]
                    pos = s[:, None] + np.arange(L)[None, :]
                    x = torch.from_numpy(toks[pos].astype(np.int64))
                    y = torch.from_numpy(toks[pos + 1].astype(np.int64)).reshape(-1)
                    t = [time.perf_counter()]
                    logits = model(x)
                    t.append(time.perf_counter())
                    out = worker.logits(x)
                    t.append(time.perf_counter())
                    n, V = out.shape[0] * out.shape[1], out.shape[2]
                    shm.tensor(torch.float32, n * V).view_as(logits).copy_(logits)
                    t.append(time.perf_counter())
                    nats_of(out.reshape(n, V), y, "logits", ws)
                    t.append(time.perf_counter())
                    float(F.cross_entropy(logits.reshape(n, V).float(), y, reduction="sum"))
                    t.append(time.perf_counter())
                    if rep:  # the first pass is the warm-up
                        for k, a, b in zip(parts, t[:-1], t[1:], strict=True):
                            parts[k].append(b - a)
                    elif w0 == 0:  # the first batch of a fresh worker: what each probe's forward costs
                        first = {"forward": t[1] - t[0], "round_trip": t[2] - t[1]}
        shm.close()
    finally:
        worker.close()
    med = {k: statistics.median(v) * 1e3 for k, v in parts.items()}
    med["ipc"] = med["round_trip"] - med["forward"] - med["copy"]
    best = {k: min(v) * 1e3 for k, v in parts.items()}  # a loaded machine only ever adds time
    best["ipc"] = best["round_trip"] - best["forward"] - best["copy"]
    return {
        "batches": len(parts["forward"]),
        "ms": med,
        "best_ms": best,
        "first_ms": {k: v * 1e3 for k, v in first.items()},
        "worker_startup_s": startup,
    }


def worker(spec: dict[str, Any]) -> None:
    fn = {"plain": measure_plain, "scorer": measure_scorer, "profile": measure_profile}[spec["kind"]]
    _say(result=fn(spec))


class _Child:
    """A fresh measuring process (`python -m harness.bench.score SPEC`), spoken to line by line."""

    def __init__(self, spec: dict[str, Any], log_dir: Path):
        self.kind = spec["kind"]
        self.log = (log_dir / f"{self.kind}.stderr").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.bench.score", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )

    def expect(self, key: str) -> Any:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                msg = json.loads(line[len(MARK) :])
                if key in msg:
                    return msg[key] if key == "result" else msg
                raise ValueError(f"bench {self.kind} process: expected {key!r}, got {msg}")
        self.proc.wait()
        self.log.seek(0)
        raise ValueError(
            f"bench {self.kind} process exited ({self.proc.returncode}) before {key!r}:\n{self.log.read()[-3000:]}"
        )

    def go(self) -> _Child:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self

    def turn(self) -> float:
        return float(self.go().expect("pass")["s"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            if f is not None and not f.closed:
                f.close()


def _round(spec: dict[str, Any], first: str, log_dir: Path) -> dict[str, Any]:
    """One round: a fresh scorer process and a fresh plain process, their passes in lock step.

    The scorer starts first and alone (its start-up, the worker's included, is timed without the
    plain process building next to it); the plain process starts once the scorer waits at its first
    pass. Then pass i of one and pass i of the other run back to back, `first` leading on even
    passes, the other on odd ones: a slow spell of the machine weighs on both sides of a pair. The
    scorer goes on to its probes only once the plain process has exited.
    """
    children: dict[str, _Child] = {}
    load = [os.getloadavg()[0]]
    try:
        for kind in ("scorer", "plain"):
            children[kind] = _Child({**spec, "kind": kind}, log_dir)
            children[kind].expect("ready")
        second = "plain" if first == "scorer" else "scorer"
        for i in range(spec["repeats"] + 1):
            for kind in (first, second) if i % 2 == 0 else (second, first):
                children[kind].turn()
        out = {"plain": children["plain"].expect("result")}
        children["plain"].proc.wait(
            timeout=60
        )  # gone before the scorer goes on to its probes: they run alone
        out["scorer"] = children["scorer"].go().expect("result")
    finally:
        for c in children.values():
            c.close()
    load.append(os.getloadavg()[0])
    return {**out, "first": first, "load": load}


def _profile(spec: dict[str, Any], log_dir: Path) -> dict[str, Any]:
    child = _Child({**spec, "kind": "profile"}, log_dir)
    try:
        return child.expect("result")
    finally:
        child.close()


def run_bench(
    submission: Path,
    model_config: dict[str, Any],
    data_dir: Path,
    *,
    seq_len: int,
    batch_seqs: int,
    max_tokens: int | None,
    repeats: int,
    rounds: int,
    device: str = "cpu",
    threads: int = 0,
    sandbox: str = "auto",
    probes: int = DEFAULT_PROBES,
    codec: str | None = None,
    profile: bool = False,
    project_tokens: int = DEFAULT_PROJECT_TOKENS,
) -> dict[str, Any]:
    """`rounds` rounds of a fresh plain and a fresh scorer process (which leads alternating), then the profile if asked.

    Each round's ratio is the plain process's best pass over the scorer's best pass, their passes
    having alternated (this machine's load moves by more than 10 % within a minute); the headline
    is the median of the rounds' ratios. The best time of each kind over all rounds is kept too.
    """
    if repeats < 1 or rounds < 1:
        raise ValueError(f"repeats and rounds must be >= 1, got {repeats}, {rounds}")
    with tempfile.TemporaryDirectory(prefix="pgolf-bench-score-") as tmp:
        packed = pack_random(submission, model_config, data_dir, Path(tmp), codec)
        spec = {
            **packed,
            "data": str(data_dir),
            "seq_len": seq_len,
            "batch_seqs": batch_seqs,
            "max_tokens": max_tokens,
            "repeats": repeats,
            "device": device,
            "threads": threads,
            "sandbox": sandbox,
            "probes": probes,
        }
        done = [_round(spec, "plain" if r % 2 == 0 else "scorer", Path(tmp)) for r in range(rounds)]
        prof = _profile(spec, Path(tmp)) if profile else None
    plain, scorer = [d["plain"] for d in done], [d["scorer"] for d in done]
    round_ratios = [p["plain_s"] / s["scorer_s"] for p, s in zip(plain, scorer, strict=True)]
    pass_ratios = [
        a / b
        for p, s in zip(plain, scorer, strict=True)
        for a, b in zip(p["passes_s"][1:], s["passes_s"][1:], strict=True)
    ]
    probe_shares = [s["probes_s"] / s["cold_eval_s"] for s in scorer]
    p, s = min(plain, key=lambda o: o["plain_s"]), min(scorer, key=lambda o: o["scorer_s"])
    n = s["tokens"]
    if p["tokens"] != n:
        raise ValueError(f"the plain loop scored {p['tokens']} tokens, the scorer {n}")
    probes_s = statistics.median(o["probes_s"] for o in scorer)
    projected_eval_s = project_tokens * statistics.median(o["scorer_s"] for o in scorer) / n
    loads = [x for d in done for x in d["load"]]
    return {
        "format": "pg-bench-score",
        "format_version": 3,
        "device": device,
        "threads": s["threads"],
        "sandbox": s["sandbox"],
        "submission": str(submission),
        "model_config": model_config,
        "vocab_size": packed["vocab_size"],
        "codec": packed["codec"],
        "params": packed["params"],
        "seq_len": seq_len,
        "batch_seqs": batch_seqs,
        "tokens": n,
        "repeats": repeats,
        "rounds": rounds,
        "load_average": [min(loads), max(loads)],
        "plain_s": p["plain_s"],
        "scorer_s": s["scorer_s"],
        "plain_tokens_per_s": n / p["plain_s"],
        "scorer_tokens_per_s": n / s["scorer_s"],
        "ratio": statistics.median(round_ratios),
        "round_ratios": round_ratios,
        "round_leads": [d["first"] for d in done],
        "pass_ratio_median": statistics.median(pass_ratios),
        "best_ratio": p["plain_s"] / s["scorer_s"],
        "ratio_target": RATIO_TARGET,
        "plain_passes_s": [o["passes_s"] for o in plain],
        "scorer_passes_s": [o["passes_s"] for o in scorer],
        "cold_eval_s": [o["cold_eval_s"] for o in scorer],
        "startup_s": [o["startup_s"] for o in scorer],
        "probes": s["probes"],
        "probes_s": [o["probes_s"] for o in scorer],
        "probe_shares": probe_shares,
        "probe_share": statistics.median(probe_shares),
        "probe_share_target": PROBES_TARGET,
        "project_tokens": project_tokens,
        "projected_eval_s": projected_eval_s,
        "projected_probe_share": probes_s / projected_eval_s,
        "projected_probe_share_best": min(o["probes_s"] for o in scorer)
        / (project_tokens * s["scorer_s"] / n),
        "val_loss_scorer": s["val_loss"],
        "val_loss_plain": p["val_loss"],
        "profile": prof,
    }


def format_report(rec: dict[str, Any]) -> list[str]:
    def seq(xs: list[float], f: str = ".3f") -> str:
        return ", ".join(format(x, f) for x in xs)

    ok = "meets" if rec["ratio"] >= rec["ratio_target"] else "BELOW"
    pok = "meets" if rec["probe_share"] <= rec["probe_share_target"] else "ABOVE"
    lines = [
        f"bench score: {rec['params']:,} params (vocab {rec['vocab_size']}, {rec['codec']}), {rec['tokens']:,} tokens, "
        f"seq_len {rec['seq_len']}, batch {rec['batch_seqs']}, {rec['threads']} thread(s) on {rec['device']}, "
        f"worker sandbox {rec['sandbox']}, best of {rec['repeats']}",
        f"  plain loop  {rec['plain_tokens_per_s']:>12,.0f} tokens/s  ({rec['plain_s']:.3f} s)  val_loss {rec['val_loss_plain']:.6f}",
        f"  scorer      {rec['scorer_tokens_per_s']:>12,.0f} tokens/s  ({rec['scorer_s']:.3f} s)  val_loss {rec['val_loss_scorer']:.6f}",
        f"  ratio scorer/plain = {rec['ratio']:.3f}  (median of {rec['rounds']} rounds: {seq(rec['round_ratios'])}; "
        f"target >= {rec['ratio_target']}: {ok}); best against best {rec['best_ratio']:.3f}, median of paired passes "
        f"{rec['pass_ratio_median']:.3f}; load average {rec['load_average'][0]:.1f}-{rec['load_average'][1]:.1f} "
        f"on {os.cpu_count()} cores",
        f"  probes ({rec['probes']} fresh worker(s)): {seq(rec['probes_s'])} s against the score's evaluation "
        f"{seq(rec['cold_eval_s'])} s: share {rec['probe_share']:.1%} (median; rounds {seq(rec['probe_shares'], '.1%')}; "
        f"target <= {rec['probe_share_target']:.0%}: {pok})",
        f"  probes at a {rec['project_tokens']:,}-token evaluation ({rec['projected_eval_s']:.1f} s at the scorer's "
        f"speed): share {rec['projected_probe_share']:.1%} (medians; best probes against the best speed "
        f"{rec['projected_probe_share_best']:.1%}); score start-up before evaluation {seq(rec['startup_s'], '.2f')} s",
    ]
    prof = rec.get("profile")
    if prof:
        for what in ("median", "best"):
            ms = prof["ms" if what == "median" else "best_ms"]
            lines.append(
                f"  per batch ({what} of {prof['batches']}, ms): forward in-process {ms['forward']:.2f}, worker round "
                f"trip {ms['round_trip']:.2f} (IPC {ms['ipc']:.2f} after the forward and a {ms['copy']:.2f} copy into "
                f"shared memory), loss float64 {ms['loss_f64']:.2f} vs plain float32 {ms['loss_f32']:.2f}"
            )
        lines.append(
            "  a fresh worker: start-up "
            f"{prof['worker_startup_s']:.2f} s, first round trip {prof['first_ms']['round_trip']:.0f} ms "
            f"(in-process first forward {prof['first_ms']['forward']:.0f} ms)"
        )
    return lines


def cmd_bench_score(args: argparse.Namespace) -> int:
    from data.embedded import ensure_embedded_dataset
    from scoring.errors import SubmissionError

    submission = Path(args.submission)
    if submission.resolve().parent != DEFAULT_SUBMISSION.resolve().parent and not args.trust_submission:
        raise SubmissionError(
            f"{submission}: pgolf bench score builds its model.py in this process and in a plain one beside the "
            "validation tokens, unconfined; only for code you trust (yours, never an entry's): pass "
            "--trust-submission, or use `pgolf bench model` (the model confined)"
        )

    data_dir = Path(args.data) if args.data else ensure_embedded_dataset()
    cfg = json.loads(args.model_config) if args.model_config else dict(DEFAULT_MODEL_CONFIG)
    rec = run_bench(
        submission,
        cfg,
        data_dir,
        seq_len=args.seq_len,
        batch_seqs=args.batch_seqs,
        max_tokens=args.max_tokens or None,
        repeats=args.repeats,
        rounds=args.rounds,
        device=args.device,
        threads=args.threads,
        sandbox=args.sandbox,
        probes=args.probes,
        codec=args.codec,
        profile=args.profile,
        project_tokens=args.project_tokens,
    )
    if args.json:
        print(json.dumps(rec, sort_keys=True))
    else:
        print("\n".join(format_report(rec)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="scorer tokens/s vs a plain evaluation loop on the same model and data")
    p.add_argument(
        "--submission", default=str(DEFAULT_SUBMISSION), help="folder whose model.py builds the model"
    )
    p.add_argument(
        "--model-config", help=f"JSON for build_model (default: {json.dumps(DEFAULT_MODEL_CONFIG)})"
    )
    p.add_argument("--data", help="dataset folder (default: the embedded corpus)")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--batch-seqs", type=int, default=DEFAULT_BATCH_SEQS)
    p.add_argument("--max-tokens", type=int, default=65_536, help="validation tokens to score (0: all)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per process (best counts)")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="pairs of fresh plain and scorer processes, order alternated (median ratio counts)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--sandbox", default="auto", choices=("auto", "required", "off"), help="the workers' sandbox"
    )
    p.add_argument(
        "--probes", type=int, default=DEFAULT_PROBES, help="probes per score (the scorer's default)"
    )
    p.add_argument("--codec", help="artifact codec (default: the submission's config.toml [pack] codec)")
    p.add_argument(
        "--project-tokens",
        type=int,
        default=DEFAULT_PROJECT_TOKENS,
        help="evaluation size the probes' share is projected to (default: the CPU track's subset)",
    )
    p.add_argument(
        "--profile", action="store_true", help="per-batch parts of the scorer's path (one more process)"
    )
    p.add_argument(
        "--trust-submission",
        action="store_true",
        help="run a --submission outside the project's baselines unconfined (its model.py, in this process and "
        "a plain one beside the validation tokens): your own code only",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_score)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
