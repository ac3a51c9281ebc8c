"""`pgolf reproduce ENTRY_DIR`: re-train an entry from its folder, as submitted, and test its claim.

    pgolf reproduce ENTRY_DIR [--preset P] [--seeds N] [--data DIR] [--out DIR] [--ledger FILE]
                    [--k K] [--floor-bpb X] [--json]

`pgolf verify` re-scores the artifact a run produced: it proves the numbers follow from that artifact,
not that the folder trains to it (a result whose `steps` or `train_time_s` were edited by hand still
verifies). This command re-trains: every seed through `pgolf run`'s own pipeline (harness/run/pipeline.py
`run_pipeline`: the clock, the sandbox, the pack, the sealed scorer), then compares what came out with
what the entry claims (docs/OFFICIALS.md, "Verify or reproduce").

The claim. Every `pg-result` file under ENTRY_DIR/results/ or ENTRY_DIR/runs/ (uncounted folders,
scoring/artifact/cap.py) with status ok is one claimed seed: its seed, preset, val_bpb, val_loss, steps,
train_time_s, bytes_total and the code it ran. Without one, submission.json's `claimed.val_bpb` is a
claimed mean, and `--seeds N` fresh seeds (derived from the entry's digest, so a resumed queue picks the
same ones) are run. `--seeds N` with claimed results runs N fresh seeds instead of the claimed ones.

Chosen seeds. Training is deterministic, so claimed seeds reproduce exactly even when they are the best of a
hundred an entrant tried: only fresh seeds test a claimed mean. Derived from the digest alone, an entrant can
compute them too, train them first and reformat submission.json until they are good ones; `--seed-salt-file F`
(the official's secret, the same for every entry of a queue and kept for its resumption) derives them from
the salt and the digest instead, and the record names the salt by its sha256 (`fresh_seeds`). A file, not an
argument: a process's arguments are readable by every process of the machine (/proc/PID/cmdline), and several
nodes' ranks run without a PID namespace of their own.

Seeds that reached the run. The harness seeds torch, numpy and random with the seed; a train.py that seeds them
again with its own (the best of a hundred tried at home) makes every fresh seed its lucky run. Two seeds that
are one run (`same_runs`: one artifact, or one score to the last bit) fail the verdict, and the chain refuses
them too. Fresh seeds are drawn each on its own (never base, base + 1, ...): a train.py that seeds torch with
LUCKY[seed % k], k lucky seeds of its own, gives two of n fresh seeds one run with probability
1 - (k-1)!/((k-n)! k^(n-1)): 7 in 9 for k = n = 3 (consecutive seeds gave each lucky seed once, never caught),
about half for k = 5, 28% for k = 10, 15% for k = 20 (each lucky seed then the best fifth, not the best of all).
A seed-dependent perturbation that moves the score by a few ulps passes: nothing past the seeding
carries the seed across a process boundary (the token stream runs in the rank's process with every training
shard mapped, so even a seed-dependent data order would be train.py's to undo), and no check here sees further.

The test (`compare_claim`; every number is in the record):
- val_bpb: the claimed mean must lie within the reproduced mean ± (k · SE + floor_bpb), SE the standard
  error of the reproduced mean, s_r/sqrt(n_r) (0 for one seed; the claimed seeds' own spread never widens
  the bound, so one edited seed cannot buy itself room); k = 3, floor_bpb = 0.003 by default. Welch's two-sided t p-value is reported beside it (information,
  not the rule: a deterministic re-run has no spread to test). Per claimed seed also re-run, the claimed
  and reproduced values must agree within floor_bpb + k · s_r (s_r the reproduced seeds' spread).
- steps: per seed, |claimed - reproduced| <= rel_steps (10%) of the reproduced steps.
- train_time_s: per seed, |claimed - reproduced| <= rel_time (50%) of the reproduced time + 5 s, and
  never over the track's training budget.
- bytes_total: per seed, within 2% of the reproduced artifact's.
- the claim itself: its val_bpb must follow from its own val_loss, val_tokens and val_bytes; it must have
  run this folder's counted code (sha256 of each file), on this track and the same tokenizer.
- no two re-trained seeds are one run (same_runs, "Seeds that reached the run").
- every re-trained seed ran on submission.json's track, the one `pgolf chain` files the entry under (the
  config's `[run] track` may name another: an entry that said `10min_16mb` and trained on `smoke`, scored on
  a loosened 2,048-token subset, was `reproduced` for the record track).

Verdicts: `reproduced` (every run ok and every check passes), `not_reproduced` (a check differs, named in
`differences`, or a run of the entry ended with a status other than ok), `could_not_run` (the harness or
the machine failed: a run's harness error, a job that died, the official's data refused; nothing is said
of the entry). The "pg-reproduction" record goes to the ledger; `pgolf chain` reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import stat
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data.io import read_regular
from harness.records.verify import Check, append_ledger
from isolation.landlock import is_beneath
from scoring.statuses import Status
from scoring.tracks import TRACKS

REPRO_FORMAT = "pg-reproduction"
REPRO_FORMAT_VERSION = 1
RUN_FORMAT = "pg-repro-run"
RUN_FORMAT_VERSION = 1
REPRODUCED, NOT_REPRODUCED, COULD_NOT_RUN = "reproduced", "not_reproduced", "could_not_run"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, COULD_NOT_RUN)
CLAIM_DIRS = ("results", "runs")
CLAIM_MAX_FILES = 64
CLAIM_MAX_BYTES = 4 << 20
CLAIM_MAX_DEPTH = 3
CLAIM_MAX_ENTRIES = 100_000
RUN_NUMBERS = ("val_bpb", "val_loss", "val_tokens", "val_bytes", "steps", "train_time_s", "bytes_total")
HARNESS_STATUSES = frozenset({"invalid_data"})
"""Run statuses that are the official's setup, not the entry (the data given was not the track's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Tolerance:
    k: float = 3.0
    """Standard errors of the difference of the means allowed between claimed and reproduced val_bpb."""
    floor_bpb: float = 0.003
    """bits/byte always allowed (run-to-run noise of one seed on other hardware)."""
    rel_steps: float = 0.10
    rel_time: float = 0.50
    floor_time_s: float = 5.0
    rel_bytes: float = 0.02

    def __post_init__(self) -> None:
        for name in ("k", "floor_bpb", "rel_steps", "rel_time", "floor_time_s", "rel_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    source: str
    seed: int | None
    preset: str | None
    track: str | None
    val_bpb: float
    val_loss: float | None = None
    val_tokens: int | None = None
    val_bytes: int | None = None
    steps: int | None = None
    train_time_s: float | None = None
    bytes_total: int | None = None
    code_files: dict[str, str] | None = None
    tokenizer_sha256: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    root: Path
    meta: dict[str, Any]
    claims: tuple[Claim, ...]
    claimed_mean_bpb: float | None
    """submission.json's claimed.val_bpb (used when no claimed result exists)."""
    preset: str | None
    digest: str
    code_files: dict[str, str]
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(self.meta.get("name", "entry")))
        return f"{name[:60]}-{self.digest[:12]}"

    @property
    def track(self) -> str:
        return str(self.meta.get("track"))

    def claimed_seeds(self, fresh: int | None) -> bool:
        """Whether `seeds(fresh)` are the claimed ones (every claim names its seed, no fresh count asked)."""
        return fresh is None and bool(self.claims) and all(c.seed is not None for c in self.claims)

    def seeds(self, fresh: int | None, salt: str | None = None) -> list[int]:
        """The claimed seeds (in claim order), or `fresh` seeds derived from the digest (and the official's
        `salt`, when given: the module docstring, "Chosen seeds")."""
        if self.claimed_seeds(fresh):
            return list(dict.fromkeys(int(c.seed) for c in self.claims if c.seed is not None))
        n = 3 if fresh is None else fresh
        key = self.digest if not salt else hashlib.sha256(f"{salt}\0{self.digest}".encode()).hexdigest()
        # each drawn on its own (never base, base + 1, ...: consecutive seeds hand a train.py that seeds torch with
        # LUCKY[seed % n] each of its n lucky seeds once), below 2**31 (numpy's seed), no seed twice
        out: list[int] = []
        i = 0
        while len(out) < n:
            seed = int(hashlib.sha256(f"{key}\0{i}".encode()).hexdigest()[:16], 16) % 2**31
            i += 1
            if seed not in out:
                out.append(seed)
        return out


SEED_SALT_MAX_BYTES = 4096


def sandbox_readable(path: str | os.PathLike[str]) -> str | None:
    """The broad read root of a sandboxed phase that holds `path`, links resolved (a system folder, /dev/shm, the
    Python installation, an import folder of the ranks: isolation/landlock.py); None when none does."""
    from isolation import landlock

    real = os.path.realpath(path)
    project = Path(__file__).resolve().parents[2]
    # the ranks' import folders are this interpreter's but its first (the working folder): sys.path[1:]
    roots = [
        *landlock.broad_read_roots([p for p in sys.path[1:] if p], project),
        # every phase reads and writes it (isolation/sandbox.py plan_sandbox); the host's one, without a world
        "/dev/shm",
    ]
    return next(
        (r for r in roots if r not in ("/proc", "/sys") and is_beneath(real, os.path.realpath(r))), None
    )


def read_seed_salt(path: str | None) -> str | None:
    """The official's seed salt: the text of the file `path` (None: no salt), its ends stripped. ValueError, naming
    the file, for one that cannot be read, is empty or is larger than SEED_SALT_MAX_BYTES, and for one a sandboxed
    phase could read: a training rank that read a salt in /opt (mode 644) could compute the fresh seeds of every
    later reproduction, which the salt is there to deny it."""
    if path is None:
        return None
    root = sandbox_readable(path)
    if root is not None:
        raise ValueError(
            f"--seed-salt-file {path}: lies beneath {root}, which every sandboxed phase reads (an entrant's train.py "
            "would learn it, and with it every later entry's fresh seeds; one without a world of its own reads it "
            "as the file's owner). HINT: keep it in your home folder, chmod 600"
        )
    try:
        raw = Path(path).read_bytes()[: SEED_SALT_MAX_BYTES + 1]
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as e:
        raise ValueError(f"--seed-salt-file {path}: cannot read it ({e.strerror})") from None
    if mode & 0o077:
        raise ValueError(
            f"--seed-salt-file {path}: other users may read it (mode {mode:04o}), and every sandboxed phase runs "
            f"as another user. HINT: chmod 600 {path}"
        )
    salt = raw.decode("utf-8", "replace").strip()
    if not salt or len(raw) > SEED_SALT_MAX_BYTES:
        raise ValueError(
            f"--seed-salt-file {path}: holds {'nothing' if not salt else 'more than 4 KB'}. HINT: a line of random "
            "text, e.g. `python -c 'import secrets; print(secrets.token_hex(16))' > salt; chmod 600 salt`"
        )
    return salt


def fresh_seeds_record(entry: Entry, fresh: int | None, salt: str | None) -> dict[str, Any]:
    """How a reproduction's seeds were chosen (the record's `fresh_seeds`): the salt named by its sha256 only."""
    if entry.claimed_seeds(fresh):
        return {"chosen": "claimed"}
    if not salt:
        return {"chosen": "from the entry's digest (an entrant can compute them: pass --seed-salt-file)"}
    return {
        "chosen": "from the official's salt and the entry's digest",
        "salt_sha256": hashlib.sha256(salt.encode()).hexdigest(),
    }


def _claim_files(root: Path) -> list[tuple[Path, bytes]]:
    """The claimed-result candidates under results/ and runs/ with their bytes, each read once, bounded and never
    through a link. The walk stops at CLAIM_MAX_FILES + 1 candidates (the caller refuses that many) and refuses a
    tree of more than CLAIM_MAX_ENTRIES names, so a folder of millions of files costs a bounded walk."""
    found: list[tuple[Path, bytes]] = []
    seen = 0
    for top in CLAIM_DIRS:
        d = root / top
        if not d.is_dir() or d.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(d, followlinks=False):
            seen += len(dirnames) + len(filenames)
            if seen > CLAIM_MAX_ENTRIES:
                raise ValueError(
                    f"{root}: more than {CLAIM_MAX_ENTRIES:,} files and folders under results/ and runs/; "
                    "keep only the result records there"
                )
            depth = len(Path(dirpath).relative_to(d).parts)
            dirnames[:] = sorted(x for x in dirnames if depth < CLAIM_MAX_DEPTH)
            for f in sorted(filenames):
                p = Path(dirpath) / f
                if f == "result.json" or (f.endswith(".json") and Path(dirpath) == d):
                    try:
                        found.append((p, read_regular(p, CLAIM_MAX_BYTES)))
                    except (OSError, ValueError):
                        # a link, a FIFO, a folder or an oversized file: not a claim, as before
                        continue
                    if len(found) > CLAIM_MAX_FILES:
                        return found
    return found


CLAIM_INT_MAX = 10**18
"""A claimed integer (seed, token, byte and step counts) larger than this is no claim's: a val_tokens of 4,000
digits overflowed compare_claim's float arithmetic and stopped the whole queue at that entry's verdict."""
CLAIM_NUM_MAX = 1e15
"""A claimed number (val_bpb, val_loss, train_time_s) larger than this is no claim's: two claims of 1.7e308 bits
per byte overflowed the mean (fsum) and stopped the whole queue the same way."""


def _num(v: Any) -> float | None:
    ok = (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and abs(v) <= CLAIM_NUM_MAX
    )
    return float(v) if ok else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) <= CLAIM_INT_MAX else None


def claim_of(raw: bytes, rel: str) -> Claim | None:
    """One claimed result (a pg-result with status ok and a score); None for any other JSON."""
    try:
        r = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(r, dict) or r.get("format") != "pg-result" or r.get("status") != Status.OK:
        return None
    bpb = _num(r.get("val_bpb"))
    if bpb is None:
        return None
    prov: dict[str, Any] = r["provenance"] if isinstance(r.get("provenance"), dict) else {}
    code = prov.get("code_files")
    return Claim(
        source=rel,
        seed=_int(r.get("seed")),
        preset=r.get("preset") if isinstance(r.get("preset"), str) else None,
        track=r.get("track") if isinstance(r.get("track"), str) else None,
        val_bpb=bpb,
        val_loss=_num(r.get("val_loss")),
        val_tokens=_int(r.get("val_tokens")),
        val_bytes=_int(r.get("val_bytes")),
        steps=_int(r.get("steps")),
        train_time_s=_num(r.get("train_time_s")),
        bytes_total=_int(r.get("bytes_total")),
        code_files={str(k): str(v) for k, v in code.items()} if isinstance(code, dict) else None,
        tokenizer_sha256=prov.get("tokenizer_sha256")
        if isinstance(prov.get("tokenizer_sha256"), str)
        else None,
    )


def load_entry(entry_dir: str | os.PathLike[str], preset: str | None = None) -> Entry:
    """The entry folder, its counted code and its claim; a user error (one line) when it is not an entry."""
    from harness.submission import check_submission
    from scoring.artifact.cap import counted_files

    root = Path(entry_dir).absolute()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such entry folder; pass a submission folder holding submission.json"
        )
    meta = check_submission(root)
    code = counted_files(root, cap_bytes=TRACKS[meta["track"]].cap_bytes if meta["track"] in TRACKS else None)
    files = _claim_files(root)
    if len(files) > CLAIM_MAX_FILES:
        raise ValueError(f"{root}: more than {CLAIM_MAX_FILES} claimed result files under results/ and runs/")
    h = hashlib.sha256()
    # the folder's name too: two folders of the same bytes (a copy of another's pull request) are two entries, each
    # its own runs and verdict (one digest shared one run folder and one verdict: the copy's failed run overwrote it)
    h.update(root.name.encode("utf-8", "surrogateescape") + b"\0")
    h.update(json.dumps(code, sort_keys=True).encode())
    h.update((root / "submission.json").read_bytes())
    claims: list[Claim] = []
    notes: list[str] = []
    for p, raw in files:
        rel = p.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + raw)
        c = claim_of(raw, rel)
        if c is not None:
            claims.append(c)
        else:
            notes.append(f"{rel}: not a scored pg-result with status ok; not a claim")
    presets = sorted({str(c.preset) for c in claims})
    if preset is None and len(presets) > 1:
        raise ValueError(f"{root}: claimed results name presets {presets}; pass --preset to choose one")
    chosen = preset if preset is not None else (claims[0].preset if claims else None)
    kept = [c for c in claims if c.preset == chosen]
    notes += [
        f"{c.source}: preset {c.preset!r}, not {chosen!r}; not a claim here" for c in claims if c not in kept
    ]
    mean = _num((meta.get("claimed") or {}).get("val_bpb"))
    return Entry(
        root=root,
        meta=meta,
        claims=tuple(kept),
        claimed_mean_bpb=mean,
        preset=chosen,
        digest=h.hexdigest(),
        code_files=code,
        notes=tuple(notes),
    )


# ---- The statistics (pure) ----


def mean_test(claimed: list[float], reproduced: list[float], tol: Tolerance) -> dict[str, Any]:
    """Is the claimed mean inside the reproduced mean ± (k·SE + floor)? SE = s_r/sqrt(n_r), the standard error of
    the reproduced mean: the claimed seeds' own spread never widens the bound (an edited seed would)."""
    if not reproduced or not claimed:
        raise ValueError("mean_test needs at least one claimed and one reproduced value")
    mc, mr = statistics.fmean(claimed), statistics.fmean(reproduced)
    sc = statistics.stdev(claimed) if len(claimed) > 1 else 0.0
    sr = statistics.stdev(reproduced) if len(reproduced) > 1 else 0.0
    se = sr / math.sqrt(len(reproduced))
    bound = tol.k * se + tol.floor_bpb
    welch_p: float | None = None
    if len(claimed) > 1 and len(reproduced) > 1 and (sc > 0 or sr > 0):
        from scipy import stats

        welch_p = float(stats.ttest_ind(claimed, reproduced, equal_var=False).pvalue)
    return {
        "n_claimed": len(claimed),
        "n_reproduced": len(reproduced),
        "mean_claimed": mc,
        "mean_reproduced": mr,
        "std_claimed": sc,
        "std_reproduced": sr,
        "stderr_reproduced": se,
        "diff": mc - mr,
        "bound": bound,
        "k": tol.k,
        "floor_bpb": tol.floor_bpb,
        "welch_p_two_sided": welch_p,
        "ok": abs(mc - mr) <= bound,
    }


def _close(claimed: float, reproduced: float, rel: float, floor: float = 0.0) -> bool:
    return abs(claimed - reproduced) <= rel * abs(reproduced) + floor


SAME_RUN_WHY = {
    "artifact": "the same artifact (sha256)",
    "val_loss and val_bpb": "the same val_loss and val_bpb to the last bit",
    "seed": "one seed counted twice",
}


def same_runs(runs: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """Pairs of ok runs that are one run: (index of the first, index of the later one, what they share), each
    later run paired with the first it repeats. What is shared: `seed` (one seed listed twice), `artifact` (the
    same artifact_sha256: the same weights, whatever the seed) or `val_loss and val_bpb` (the same score to the
    last bit, a float64 sum over every scored token: two trainings that differ in anything the forward reads
    never agree in all 53 bits). Two different seeds that are one run show a train.py that ignored the harness's
    seed (module docstring, "Seeds that reached the run"): its seeds are one sample, counted as many."""
    seen: list[int] = []
    out: list[tuple[int, int, str]] = []
    for j, r in enumerate(runs):
        if r.get("status") != Status.OK:
            continue
        for i in seen:
            f = runs[i]
            sha = r.get("artifact_sha256")
            if f.get("seed") == r.get("seed"):
                what = "seed"
            elif isinstance(sha, str) and sha and sha == f.get("artifact_sha256"):
                what = "artifact"
            elif all(
                _num(r.get(k)) is not None and _num(r.get(k)) == _num(f.get(k))
                for k in ("val_loss", "val_bpb")
            ):
                what = "val_loss and val_bpb"
            else:
                continue
            out.append((i, j, what))
            break
        else:
            seen.append(j)
    return out


def compare_claim(
    entry: Entry, runs: list[dict[str, Any]], tol: Tolerance
) -> tuple[list[Check], dict[str, Any]]:
    """The checks of the module docstring, from the claim and the reproduced runs (ok runs only)."""
    checks: list[Check] = []
    track = TRACKS.get(entry.track)
    ok_runs = [r for r in runs if r.get("status") == Status.OK and _num(r.get("val_bpb")) is not None]
    by_seed = {r["seed"]: r for r in ok_runs}
    stats_rec: dict[str, Any] = {}
    claimed_bpb = [c.val_bpb for c in entry.claims] or (
        [entry.claimed_mean_bpb] if entry.claimed_mean_bpb is not None else []
    )
    if not claimed_bpb:
        checks.append(
            Check("a claim to test", False, "claimed results or submission.json claimed.val_bpb", "none")
        )
    elif ok_runs:
        stats_rec = mean_test(claimed_bpb, [float(r["val_bpb"]) for r in ok_runs], tol)
        checks.append(
            Check(
                f"val_bpb mean (claimed within reproduced ± {tol.k:g}·SE + {tol.floor_bpb:g})",
                bool(stats_rec["ok"]),
                round(stats_rec["mean_claimed"], 6),
                f"{stats_rec['mean_reproduced']:.6f} ± {stats_rec['bound']:.6f}",
            )
        )
    for i, j, what in same_runs(ok_runs):  # a seed the run ignored tested nothing (module docstring)
        a, b = ok_runs[i]["seed"], ok_runs[j]["seed"]
        checks.append(Check(f"seeds {a} and {b} gave different runs", False, "a run that depends on its seed",
                            f"{SAME_RUN_WHY[what]}: the seed did not reach the run (train.py must seed from ctx.seed: "
                            "a run that ignores it, lucky or deterministic, is one sample however many seeds)"))  # fmt: skip
    for run in ok_runs:  # the chain files the entry under submission.json's track; its runs must be there
        checks.append(Check(f"seed {run['seed']} ran on the entry's track", run.get("track") == entry.track,
                            entry.track, run.get("track")))  # fmt: skip
    sr = float(stats_rec.get("std_reproduced") or 0.0)
    for c in entry.claims:
        tag = f"seed {c.seed}"
        if c.val_loss is not None and c.val_tokens and c.val_bytes:
            implied = c.val_loss * c.val_tokens / (c.val_bytes * math.log(2.0))
            checks.append(
                Check(f"{tag} claimed val_bpb follows from its val_loss", abs(implied - c.val_bpb) <= 1e-6,
                      c.val_bpb, round(implied, 9))
            )  # fmt: skip
        if c.code_files is not None:
            same = c.code_files == entry.code_files
            diff = sorted(set(c.code_files.items()) ^ set(entry.code_files.items()))
            checks.append(Check(f"{tag} claim ran this folder's code", same, "the folder's counted files",
                                "the same" if same else f"differs in {sorted({k for k, _ in diff})}"))  # fmt: skip
        if c.track is not None:
            checks.append(Check(f"{tag} claim's track", c.track == entry.track, entry.track, c.track))
        r = by_seed.get(c.seed)
        if r is None:
            continue
        if c.tokenizer_sha256 is not None:
            tok = r.get("tokenizer_sha256")
            checks.append(Check(f"{tag} tokenizer", c.tokenizer_sha256 == tok, c.tokenizer_sha256, tok))
        bound = tol.floor_bpb + tol.k * sr
        checks.append(
            Check(f"{tag} val_bpb (within {bound:.6f})", abs(c.val_bpb - r["val_bpb"]) <= bound, c.val_bpb,
                  r["val_bpb"])
        )  # fmt: skip
        if c.steps is not None and _int(r.get("steps")) is not None:
            checks.append(
                Check(f"{tag} steps (within {tol.rel_steps:.0%})", _close(c.steps, r["steps"], tol.rel_steps),
                      c.steps, r["steps"])
            )  # fmt: skip
        rt = _num(r.get("train_time_s"))
        if c.train_time_s is not None and rt is not None:
            near = _close(c.train_time_s, rt, tol.rel_time, tol.floor_time_s)
            budget = track.train_budget_s if track else math.inf
            checks.append(
                Check(f"{tag} train_time_s (within {tol.rel_time:.0%} + {tol.floor_time_s:g} s, budget {budget:g})",
                      near and c.train_time_s <= budget, round(c.train_time_s, 3), round(rt, 3))
            )  # fmt: skip
        if c.bytes_total is not None and _int(r.get("bytes_total")) is not None:
            checks.append(
                Check(f"{tag} bytes_total (within {tol.rel_bytes:.0%})",
                      _close(c.bytes_total, r["bytes_total"], tol.rel_bytes), c.bytes_total, r["bytes_total"])
            )  # fmt: skip
    return checks, stats_rec


# ---- One seed (the unit of work: inline here, or a queue's job) ----


def run_failure_kind(run: dict[str, Any]) -> str | None:
    """None for an ok run; COULD_NOT_RUN for the harness's or the official's failure; else NOT_REPRODUCED."""
    if run.get("status") == Status.OK:
        return None
    if run.get("harness_failed") or run.get("status") in HARNESS_STATUSES:
        return COULD_NOT_RUN
    return NOT_REPRODUCED


def reproduce_seed(task: dict[str, Any]) -> dict[str, Any]:
    """Train, pack and score one seed of an entry through `pgolf run`'s pipeline; the "pg-repro-run" record.

    task: entry_dir, entry_digest, entry_key, seed, preset, data, run_dir, ledger (the results ledger the
    run appends its pg-result to), set (the official's --set), private (folders no sandboxed phase may read
    beyond the run's own: the other entries' reproductions). Never raises for the entry's failure."""
    from harness.run.pipeline import run_pipeline

    t0 = time.time()
    rec: dict[str, Any] = {
        "format": RUN_FORMAT,
        "format_version": RUN_FORMAT_VERSION,
        "entry_key": task["entry_key"],
        "entry_digest": task["entry_digest"],
        "seed": task["seed"],
        "run_dir": task["run_dir"],
        "job_id": task.get("job_id"),
        "started_unix_s": t0,
    }
    try:
        result = run_pipeline(
            task["entry_dir"],
            preset=task.get("preset"),
            seed=int(task["seed"]),
            data_dir=task.get("data"),
            out_dir=task["run_dir"],
            overrides=list(task.get("set") or []),
            ledger=task.get("ledger"),
            private=list(task.get("private") or []),
        )
        phases = result.get("phases") or {}
        rec.update(
            status=result.get("status"),
            detail=result.get("detail"),
            harness_failed="harness" in phases,
            track=result.get("track"),  # the config's track, which submission.json's need not be
            **{k: result.get(k) for k in RUN_NUMBERS},
            pipeline_s=(result.get("phase_times_s") or {}).get("pipeline"),
            tokenizer_sha256=(result.get("provenance") or {}).get("tokenizer_sha256"),
            artifact_sha256=(result.get("provenance") or {}).get("artifact_sha256"),
        )
    except Exception as e:  # noqa: BLE001 - refused before a run started (machine, data): no verdict on the entry
        where = traceback.extract_tb(e.__traceback__)[-1:]
        at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
        rec.update(
            status=Status.ERROR,
            detail="not run: " + f"{type(e).__name__}{at}: {e}"[:600],
            harness_failed=True,
        )
    rec["ended_unix_s"] = time.time()
    rec["job_wall_s"] = rec["ended_unix_s"] - t0
    return rec


def verdict_of(
    entry: Entry, runs: list[dict[str, Any]], tol: Tolerance, fresh_seeds: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The "pg-reproduction" record of an entry from its seeds' runs (`fresh_seeds`: fresh_seeds_record)."""
    checks, stats_rec = compare_claim(entry, runs, tol)
    kinds = [run_failure_kind(r) for r in runs]
    for r, kind in zip(runs, kinds, strict=True):
        if kind is not None:
            checks.append(
                Check(f"seed {r['seed']} run", False, "status ok", f"{r.get('status')}: {r.get('detail')}")
            )
    if not runs:
        verdict = COULD_NOT_RUN
    elif COULD_NOT_RUN in kinds and NOT_REPRODUCED not in kinds:
        verdict = COULD_NOT_RUN
    elif all(c.ok for c in checks) and checks:
        verdict = REPRODUCED
    else:
        verdict = NOT_REPRODUCED
    ok_runs = [r for r in runs if r.get("status") == Status.OK]
    return {
        "format": REPRO_FORMAT,
        "format_version": REPRO_FORMAT_VERSION,
        "verdict": verdict,
        "entry_key": entry.key,
        "entry_digest": entry.digest,
        "entry_dir": str(entry.root),
        "submission": {k: entry.meta.get(k) for k in ("name", "author", "github_id", "date", "track")},
        "track": entry.track,
        "preset": entry.preset,
        "code_files": entry.code_files,
        "seeds": [r["seed"] for r in runs],
        "fresh_seeds": fresh_seeds,
        "claimed": [asdict(c) for c in entry.claims],
        "claimed_mean_bpb": entry.claimed_mean_bpb,
        "tolerance": asdict(tol),
        "stats": stats_rec,
        "reproduced": [
            {
                k: r.get(k)
                for k in (
                    "seed",
                    "status",
                    "detail",
                    "track",
                    *RUN_NUMBERS,
                    "tokenizer_sha256",
                    "artifact_sha256",
                    "run_dir",
                    "job_id",
                    "job_wall_s",
                    "pipeline_s",
                )
            }
            for r in runs
        ],  # fmt: skip
        "reproduced_val_bpb": [r["val_bpb"] for r in ok_runs],
        "reproduced_val_loss": [r["val_loss"] for r in ok_runs],
        "notes": list(entry.notes),
        "checks": [asdict(c) for c in checks],
        "differences": [asdict(c) for c in checks if not c.ok],
        "decided_unix_s": time.time(),
    }


def describe(rec: dict[str, Any], all_checks: bool = False) -> str:
    st = rec.get("stats") or {}
    head = f"reproduce {rec['entry_key']} ({rec['track']}, preset {rec['preset']}, seeds {rec['seeds']}): "
    head += rec["verdict"].upper().replace("_", " ")
    if st:
        head += (
            f"; claimed mean {st['mean_claimed']:.6f} vs reproduced {st['mean_reproduced']:.6f} "
            f"(|diff| {abs(st['diff']):.6f}, bound {st['bound']:.6f}"
            + (f", Welch p {st['welch_p_two_sided']:.3g}" if st.get("welch_p_two_sided") is not None else "")
            + ")"
        )
    lines = [head]
    for c in rec["checks"] if all_checks else rec["differences"]:
        lines.append(Check(**c).line())
    return "\n".join(lines)


def default_out(entry: Entry) -> Path:
    return Path("runs") / "reproduce" / entry.key


def cmd_reproduce(args: argparse.Namespace) -> int:
    tol = Tolerance(k=args.k, floor_bpb=args.floor_bpb)
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    entry = load_entry(args.entry, args.preset)
    out = Path(args.out).absolute() if args.out else default_out(entry).absolute()
    ledger = Path(args.ledger).absolute() if args.ledger else out / "ledger.jsonl"
    runs = []
    salt = read_seed_salt(args.seed_salt_file)
    for seed in entry.seeds(args.seeds, salt):
        run_dir = out / f"seed-{seed}"
        if run_dir.exists() and any(run_dir.iterdir()):
            raise FileExistsError(f"{run_dir} already exists and is not empty; pass a new --out")
        print(f"[reproduce] {entry.key} seed {seed} -> {run_dir}", file=sys.stderr, flush=True)
        task = {"entry_dir": str(entry.root), "entry_digest": entry.digest, "entry_key": entry.key, "seed": seed,
                "preset": entry.preset, "data": args.data, "run_dir": str(run_dir), "ledger": str(ledger),
                "set": args.set, "private": [str(out.parent)]}  # fmt: skip
        with contextlib.redirect_stdout(sys.stderr):  # the run's card and phases: progress, not the verdict
            run = reproduce_seed(task)
        append_ledger(ledger, run)
        runs.append(run)
    rec = verdict_of(entry, runs, tol, fresh_seeds_record(entry, args.seeds, salt))
    append_ledger(ledger, rec)
    print(json.dumps(rec, sort_keys=True) if args.json else describe(rec, all_checks=True))
    return {REPRODUCED: 0, NOT_REPRODUCED: 1, COULD_NOT_RUN: 3}[rec["verdict"]]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reproduce", help="re-train an entry from its folder and test its claimed scores")
    p.add_argument("entry", help="the entry's submission folder (claimed results under results/ or runs/)")
    p.add_argument("--preset", help="preset to re-train (default: the one its claimed results name)")
    p.add_argument("--seeds", type=int, help="run N fresh seeds instead of the claimed ones")
    p.add_argument(
        "--seed-salt-file",
        metavar="FILE",
        help="a file holding the official's secret: fresh seeds from it and the entry's digest, which no entrant "
        "can compute (recorded by its sha256)",
    )
    p.add_argument(
        "--data", help="dataset folder (default: the embedded corpus; a record track needs its own)"
    )
    p.add_argument("--out", help="folder of the reproduced runs (default: runs/reproduce/ENTRY_KEY)")
    p.add_argument("--ledger", help="ledger for the runs and the verdict (default: OUT/ledger.jsonl)")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="official's override"
    )
    p.add_argument(
        "--k", type=float, default=Tolerance().k, help="standard errors allowed on the val_bpb mean"
    )
    p.add_argument("--floor-bpb", type=float, default=Tolerance().floor_bpb, help="bits/byte always allowed")
    p.add_argument("--json", action="store_true", help="print the pg-reproduction record as one JSON object")
    p.set_defaults(func=cmd_reproduce)


__all__ = ["Claim", "Entry", "Tolerance", "compare_claim", "load_entry", "mean_test", "verdict_of"]
