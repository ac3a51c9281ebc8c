"""The submission contract: everything a submission is, may use, and must do. One module, read whole.

It imports nothing of the project and nothing outside torch and the standard library, so a
submission folder depends on this file alone; the harness, the scorer and the model worker take
every name below from here (file names, hooks, output kinds, allowed imports), so the contract and
its enforcement cannot drift apart. API_VERSION is recorded in every record a run writes.

A submission folder holds (see submissions/README.md):
    submission.json  metadata (harness/submission.py validates it against its schema).
    config.toml      presets: [model] (given to build_model), [train] (ctx.hparams), and the harness keys
                     the contract lets a submission set (harness/config.py SUBMISSION_KEYS); a track's
                     own rules (budgets, grace, eval subset, sandbox) are the track's, never the folder's.
    train.py         train(ctx: TrainContext) -> TrainResult. Runs in the training sandbox, one process per
                     rank. Imports this module and its own folder only.
    model.py         build_model(config: dict) -> nn.Module; forward(input_ids [B, L] int64) -> logits
                     [B, L, V]. Scored code: runs in the model worker, never beside validation data.
                     Optional module attribute of the built model: `pgolf_output` (MODEL_OUTPUTS).
    eval.py          optional score-first adaptation hook: adapt(model, tokens) -> None (EVAL_HOOK_NAME).
    codec.py         optional custom codec: NAME, VERSION, encode(state) -> bytes, decode(bytes) -> state
                     (CODEC_ATTRS). Its encode runs in the training sandbox on the clock; its decode in the
                     model worker.
    transform.py     optional reversible text transform, part of the tokenizer: NAME, MARKERS,
                     encode_text(str) -> str, decode_text(str) -> str (docs/RULES.md). Runs only confined,
                     one child per split (`pgolf data build --transform transform.py`).
Counted code bytes: every file of the folder except UNCOUNTED_FILES (scoring/artifact/cap.py has the
exact rule), each file its bytes and its path's; bytes_code + bytes_model = bytes_total, at most the track's cap.
Code may be shipped compressed as one `code.tar.xz` at the top of the folder (`tar -cJf code.tar.xz
model.py train.py ...`): its bytes are the ones counted, and every process gets its members expanded
beside the folder's other files (regular files only, counted paths, sources strict UTF-8; a member and a
different loose file of the same path are refused). The scored code never gets train.py nor the archive.

What train(ctx) may do, and must not:
    - It reads training tokens only through ctx.data; it is never given validation data or its path.
    - It checks the clock once per step with ctx.clock.tick(); every rank gets the same reading, and
      when reading.stop is True every rank must return (or raise TrainingComplete) at once. Taking a
      batch or ticking again after a stop reading makes the run over_budget.
      A run that is still going at budget + grace is killed and reported over_budget, never scored.
    - The only time off the clock is ctx.clock.warmup(...) (compile on synthetic tokens, undone after; on
      one node only: on several nodes it runs on the clock).
    - It returns the trained model (or its state dict). Rank 0's return value is what gets packed.
    - It logs through ctx.log (rank 0 prints; metrics go to the run's metrics file).

What scored code (model.py, eval.py, codec.py and the local modules they import) may do:
    - compute with the tensors it is handed: the artifact's tensors, the windows it is sent, and (eval.py)
      the tokens already scored. It runs in its own confined process: it can read its staged code, the
      artifact and the Python installation, write a private temp folder, nothing else.
    - import the standard library modules and packages of SCORED_IMPORTS (codec.py also CODEC_IMPORTS).
      The static check (scoring/codecheck.py) says so early and friendly; the process is the boundary.
      A source of over 500,000 Python tokens is refused unparsed (SOURCE_MAX_TOKENS): weights belong in
      the artifact, not in literals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:  # torch is imported where it is used: the config, `pgolf check` and --help load no torch
    import torch
    from torch import nn

API_VERSION = 1
"""Version of this contract; recorded as `api_version` in every record (pg-train, pg-pack, pg-score, pg-result)."""

# ---- The folder ----

SUBMISSION_JSON = "submission.json"
CONFIG_FILE = "config.toml"
TRAIN_FILE = "train.py"
MODEL_FILE = "model.py"
EVAL_HOOK_FILE = "eval.py"
CODEC_FILE = "codec.py"
README_FILE = "README.md"
SCORED_FILES = (MODEL_FILE, EVAL_HOOK_FILE, CODEC_FILE)
"""The entry files of scored code: they (and what they import) run in the model worker."""
UNCOUNTED_FILES = frozenset({README_FILE, SUBMISSION_JSON})
"""Not counted against the cap (with logs, results and caches: scoring/artifact/cap.py)."""

# ---- Entry points ----

TRAIN_FN = "train"
"""train.py: train(ctx: TrainContext) -> TrainResult."""
BUILD_MODEL_FN = "build_model"
"""model.py: build_model(config: dict) -> nn.Module."""


def build_submission_model(module: Any, config: Mapping[str, Any], where: str | Path) -> nn.Module:
    """model.py's BUILD_MODEL_FN(config), held to the contract (a callable that returns an nn.Module);
    ValueError naming `where` otherwise. The scorer's loader and the GPTQ pack step build through it."""
    from torch import nn

    fn = getattr(module, BUILD_MODEL_FN, None)
    if not callable(fn):
        raise ValueError(f"{where} must define {BUILD_MODEL_FN}(config) -> nn.Module")
    model = fn(dict(config))
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"{where}: {BUILD_MODEL_FN} returned {type(model).__name__}, expected torch.nn.Module"
        )
    return model


MODEL_OUTPUT_ATTR = "pgolf_output"
"""Optional attribute of the built model: one of MODEL_OUTPUTS (default "logits")."""
MODEL_OUTPUTS = ("logits", "log_probs")
"""What forward returns: raw logits (the scorer applies log-softmax in float64), or log-probabilities
(checked to sum to one within 1e-4 nats at every position, else illegal, then normalised exactly by the
scorer's own log-softmax: scoring/score/evaluate.py check_normalized)."""
EVAL_HOOK_NAME = "adapt"
"""eval.py: adapt(model, tokens) -> None. Called after a chunk of validation tokens was scored, with a
fresh int64 tensor of exactly those tokens; it may update the model (score-first test-time training).
Over several scoring workers every worker gets every chunk, and torch.distributed is initialized over them
(rank, world size; gloo on CPU, NCCL on CUDA): the hook may share the training and all-reduce
(docs/RULES.md, "Score-first test-time training")."""
CODEC_ATTRS = ("NAME", "VERSION", "encode", "decode")
"""codec.py: NAME (str), VERSION (int), encode(state: dict[str, Tensor]) -> bytes, decode(bytes) -> state."""

# ---- What scored code may import ----

SCORED_IMPORTS = frozenset(
    {
        "torch",
        "numpy",
        "math",
        "typing",
        "dataclasses",
        "collections",
        "functools",
        "itertools",
        "__future__",
        "einops",
        "enum",
    }
)
"""Top-level modules model.py, eval.py and their local modules may import (docs/RULES.md, "Isolation": model.py is torch only)."""
CODEC_IMPORTS = frozenset(
    {"json", "struct", "io", "zlib", "lzma", "bz2", "zstandard", "safetensors", "brotli"}
)
"""A codec turns bytes into tensors: it may also use these (to compress, never to read files)."""

BuildModelFn: TypeAlias = "Callable[[dict[str, Any]], nn.Module]"
AdaptFn: TypeAlias = "Callable[[nn.Module, torch.Tensor], None]"

TrainResult: TypeAlias = "nn.Module | Mapping[str, torch.Tensor]"
"""What train(ctx) returns: the trained module, or its state dict (CPU or device tensors)."""


class TrainingComplete(Exception):  # noqa: N818  (a signal, not an error)
    """Raise from anywhere in train() to end training early. Attach the result: TrainingComplete(model)."""

    def __init__(self, result: TrainResult | None = None):
        super().__init__("training complete")
        self.result = result


class ClockReading(NamedTuple):
    elapsed_s: float
    """Training seconds on the harness's clock, agreed by all ranks (the maximum over ranks)."""
    remaining_s: float
    """budget_s - elapsed_s, at least 0."""
    stop: bool
    """True on every rank at the same step once the budget is spent, or once the next step, if it takes as
    long as the last one did, would end past it (so the last step ends inside the budget): return now."""


class WarmupReport(NamedTuple):
    steps: int
    """Warm-up steps run on synthetic tokens."""
    off_clock_s: float
    """Seconds left off the clock (the warm-up's duration, at most budget.warmup_max_s, none on several nodes; the
    same on every rank)."""
    verified: bool
    """The named modules' weights and the optimizers' state were bit-identical to before it, after restoring them."""


class BudgetClock(Protocol):
    budget_s: float
    """The training budget in seconds (inf on untimed tracks), less pack.gptq_reserve_s when the harness's
    GPTQ pack step is asked for (docs/RULES.md): the step runs after train() returns, on the same clock."""

    def tick(self) -> ClockReading:
        """One collective call per training step, on every rank. Synchronises the device first."""
        ...

    def elapsed_s(self) -> float:
        """This rank's own elapsed training seconds; no collective (for logging only)."""
        ...

    def warmup(
        self,
        step: Callable[[torch.Tensor, torch.Tensor], object],
        *,
        modules: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        steps: int,
        batch_tokens: int,
        seq_len: int,
        vocab_size: int,
    ) -> WarmupReport:
        """Run `step(x, y)` `steps` times on synthetic tokens, off the clock (e.g. to compile); then undo it.

        The only time off the clock. Call it once, on every rank together, before the first tick().
        x, y are [batch_tokens // seq_len, seq_len] int64 on ctx.dist.device, random ids < vocab_size
        (y is x shifted by one). While it runs ctx.data refuses batches. Before it, the parameters,
        buffers and grads of `modules`, the state and hyperparameters of `optimizers`, and the torch,
        numpy and random RNG states are copied; after it they are restored and verified bit-identical
        (a RuntimeError otherwise). Anything else the step function changes is not undone: keep it to
        compiling. Its duration, up to budget.warmup_max_s, is off the clock (on one node; on several,
        none of it: a node's supervisor cannot see another node's data); any excess counts.
        """
        ...


class TokenStream(Protocol):
    """The training tokens: a deterministic stream over the training shards, shared by all ranks."""

    def next_batch(self, batch_tokens: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next (x, y), each [batch_tokens // seq_len, seq_len] int64 on ctx.dist.device.

        One call on every rank consumes world_size * (batch_tokens + 1) tokens of the stream; rank r
        gets the r-th disjoint slice, and y is x shifted by one token. So a 1-rank run calling it k
        times sees the same tokens as a k-rank run calling it once.
        """
        ...

    @property
    def tokens_consumed(self) -> int:
        """Training tokens handed out so far, summed over ranks."""
        ...


class Logger(Protocol):
    def info(self, msg: str) -> None:
        """A human line (printed by rank 0, kept in the run log)."""
        ...

    def metrics(self, step: int, **values: float) -> None:
        """Numbers for this step (rank 0 writes them to metrics.jsonl)."""
        ...


StepFn: TypeAlias = "Callable[[torch.Tensor, torch.Tensor], object]"
"""A training step on one batch (x, y): what ctx.clock.warmup runs and ctx.cpu.choose times."""

CPU_AUTO = "auto"
CPU_MODES = ("float32", "float32_compile", "bfloat16", "bfloat16_compile")
"""CPU step modes: the dtype of autocast (float32: none) and whether the step's model is torch.compile'd.
A submission's `train.cpu_mode` names one of them, or CPU_AUTO (measure, keep the fastest)."""


def cpu_mode_as_given(requested: str) -> str:
    """The mode a run without a trial uses: a fixed mode as it is, "auto" as float32; ValueError otherwise."""
    if requested == CPU_AUTO:
        return CPU_MODES[0]
    if requested not in CPU_MODES:
        raise ValueError(f"cpu mode {requested!r} is not one of {[CPU_AUTO, *CPU_MODES]}")
    return requested


class CpuTuning(Protocol):
    """ctx.cpu: the CPU this rank runs on, and a measured choice of how to run a step (harness/train/cpu.py)."""

    facts: Mapping[str, Any]
    """model, flags (of those that decide a dtype's speed), torch_capability, cores, threads, l3_bytes,
    native_bf16 (a bfloat16 instruction set AND a torch capability of AVX-512 or above); empty where
    nothing was read (CpuAsGiven)."""

    def choose(
        self,
        requested: str,
        make_step: Callable[[str], StepFn],
        *,
        modules: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        batch_tokens: int,
        seq_len: int,
        vocab_size: int,
        repeats: int = 2,
        compiled: bool = True,
    ) -> str:
        """The step mode to train with, for `requested` (CPU_AUTO or one of CPU_MODES); call it once, on
        every rank, in place of ctx.clock.warmup (it is that call, when a trial runs).

        `make_step(mode)` returns a whole training step in that mode. A fixed eager mode is used as it is,
        no trial. Otherwise the trial runs inside ctx.clock.warmup (off the clock, undone; `modules`,
        `optimizers`, `batch_tokens`, `seq_len`, `vocab_size` are passed to it as they are): "auto" times float32 and, only where
        bfloat16 is native, bfloat16, `repeats` timed steps each after an untimed first, then the faster
        one compiled; a fixed compiled mode runs its steps there so that it compiles off the clock. With
        `compiled=False` (a step that does not compile) a compiled mode runs eager and auto compiles
        nothing. Several CPU ranks, or a GPU run, get the first mode with no trial (ranks timing alone
        could choose differently). The choice, why, and the trial's step times are in train.json `cpu`."""
        ...

    def record(self, **values: Any) -> None:
        """JSON-able facts about the setting the run chose; written to train.json `cpu` with `facts`."""
        ...


class CpuAsGiven:
    """ctx.cpu where nothing is measured (a context built by hand, e.g. in a test): no facts, and
    choose() answers the mode as given (cpu_mode_as_given) without a trial or a warm-up."""

    def __init__(self) -> None:
        self.facts: Mapping[str, Any] = {}
        self.recorded: dict[str, Any] = {}

    def choose(self, requested: str, make_step: Callable[[str], StepFn], **_: Any) -> str:
        mode = cpu_mode_as_given(requested)
        self.record(chosen=mode, chosen_by="as given (no trial: nothing measured)")
        return mode

    def record(self, **values: Any) -> None:
        self.recorded.update(values)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job, and the collectives a submission commonly needs."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    """"nccl", "gloo", or "none" for a single process without a process group."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce ("sum", "mean", "max", "min"); returns `t`. No-op on one rank."""
        if not self.distributed:
            return t
        import torch.distributed as dist

        ops = {
            "sum": dist.ReduceOp.SUM,
            "mean": dist.ReduceOp.SUM,
            "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN,
        }
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        dist.all_reduce(t, op=ops[op])
        if op == "mean":
            t.div_(self.world_size)
        return t

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.distributed:
            import torch.distributed as dist

            dist.broadcast(t, src=src)
        return t

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def ddp(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        """Wrap in DistributedDataParallel when there is more than one rank; else return `model`."""
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        return DDP(model, **kwargs)


@dataclass(frozen=True)
class TrainContext:
    """Everything train(ctx) receives. Nothing here reaches validation data."""

    hparams: Mapping[str, Any]
    """The resolved [train] table of the preset (with --set overrides applied)."""
    model_config: Mapping[str, Any]
    """The resolved [model] table: pass it to your build_model; the scorer gets the same dict."""
    data: TokenStream
    dist: DistInfo
    clock: BudgetClock
    log: Logger
    seed: int
    """The run's seed; the harness has already seeded torch, numpy and random with it. The run must depend on it
    (initialisation, data order): reproductions re-train under fresh seeds the official draws, and two seeds that
    give one artifact or one score to the last bit fail the reproduction (harness/records/reproduce.py same_runs)."""
    vocab_size: int
    """The tokenizer's vocabulary size (token ids are < vocab_size)."""
    submission_dir: Path
    scratch_dir: Path
    """A private folder for checkpoints or caches (not counted, not packed)."""
    cpu: CpuTuning = field(default_factory=CpuAsGiven)
    """The CPU's facts and the choice of a step mode (ctx.cpu.choose). Always present: the harness sets a
    measuring one; a context built by hand gets CpuAsGiven (the mode as given, no trial)."""
