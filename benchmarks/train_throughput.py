"""`python -m benchmarks.train_throughput [--quick] [--profile K] [--out FILE.json]`: trainer throughput on one device.

tokens/s, step ms, MFU and peak memory of one training step (forward, loss, backward, AdamW)
for FPA and SageBwd (K-smoothing), eager and compiled, with the old loss path ("plain": the
whole micro-batch's logits out of the model, fp32 cross-entropy outside it) and the new one
("chunked": `model.loss_impl=chunked`, the LM head and loss inside the model, model/loss.py), both
through the trainer's `launcher.train.micro_batch_loss`, and with the trainer's old and new host reads
(`--sync step`: the loss read every step; `log`: once per `train.log_every` steps, as
launcher/step_metrics.py reads it now) side by side, in one process on one device.

Default cases (issue 27): gpu-124m and gpu-325m at seq 4096 (micro-batch 4: 16,384 tokens per
step), gpu-124m at seq 16384 (micro-batch 1). Pick others with `--case CONFIG[@SEQ[xMICRO]]`
(repeatable) or `--config CONFIG` (its own seq and micro-batch), and narrow the grid with
`--attention`, `--compile`, `--loss`, `--engine`.

Two engines (`--engine`, a row's `engine`): `manual` (the default) is the stand-in below;
`deepspeed` is the trainer's own step with the real DeepSpeed engine: the model built, compiled
(in place, as `train.compile` does) and wrapped exactly as launcher/train.py does it
(`launcher.engine.build_engine`: ZeRO stage, bf16 on CUDA, clipping and
`train.check_grad_overflow` from the config) in a one-process world (a single rank on a free
localhost port unless one is initialised; nccl on CUDA, gloo on the CPU), and each step
`launcher.train.train_step` (per micro-batch `engine.backward(loss); engine.step()`, the
train.grad_accum_steps micro-batches of the config's layout), its loss and grad norm read as the
trainer reads them (`launcher.step_metrics.read_metrics`, at the points `--sync` says). So
DeepSpeed's own host reads inside its ZeRO step are in its rows; `--set
train.check_grad_overflow=false` takes two of them out (docs/benchmarks.md, "Host reads"). It
needs DeepSpeed (pure Python with the client AdamW: no C++ build), no MLflow.

Machinery: launcher/profile_step.py's (one device, no DeepSpeed, no MLflow; the config's model
in bf16 on CUDA, fp32 on the CPU; `torch.compile` of the whole model as `train.compile` does),
plus what the trainer adds around it: the tokens copied from pinned host memory each step,
an optimizer step as DeepSpeed ZeRO-1 runs it on one GPU (fp32 master weights: the bf16
gradients cast to fp32, clipped to the global norm, fused AdamW, the bf16 weights copied back;
`--optimizer none` leaves it out) and the loss read on the host as the trainer reads it
(`--sync`; the rows of one case, attention, compile mode, loss and engine share one model and
its warm-up, then each times its own steps). DeepSpeed's own reads inside its ZeRO-1 step are
not modelled by `manual` (docs/benchmarks.md, "Host reads"). Data are random tokens
of the config's vocabulary (seeded): speed does not depend on them, and nothing is read from
disk. FLOPs per token and the peak table are launcher/throughput.py's; MFU is blank where no
peak is known (the CPU, an unknown GPU; `--peak-tflops` sets one).

`--profile K` takes as many steps again after each row's timed ones, under torch.profiler, and prints the row's
top K kernels and the device time of all its kernels per step beside its timed step: where a step of the trainer's
own engine goes (launcher.profile_step's kernel table, with DeepSpeed's step and the host's reads in it).

Each row runs in its own try/except: an error (an out-of-memory, a compile failure) is
recorded in the row and the table goes on. Needs torch (+ triton for SageBwd on a GPU),
pydantic and pyyaml (+ DeepSpeed for `--engine deepspeed`); no MLflow or network.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import logging
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

from launcher.config import RunConfig, load_run_config
from launcher.garbage import CollectionPauses, ScheduledCollection
from launcher.overrides import ConfigError
from launcher.throughput import device_peak_tflops, mfu, train_flops_per_token

DEFAULT_CASES = ("experiments/configs/gpu-124m.yaml@4096x4", "experiments/configs/gpu-325m.yaml@4096x4",
                 "experiments/configs/gpu-124m.yaml@16384x1")
ATTENTIONS = {"fpa": ["model.attention=fpa", "model.smoothing=none"],
              "sagebwd": ["model.attention=sagebwd", "model.smoothing=k"],
              "sagebwd-token": ["model.attention=sagebwd", "model.smoothing=k", "model.quant=token"]}
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
ENGINES = ("manual", "deepspeed")


@dataclass
class Case:
    config: str
    seq_len: int | None = None      # None: the config's
    micro_batch: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Case":
        path, _, shape = text.partition("@")
        if not shape:
            return cls(path)
        seq, _, micro = shape.partition("x")
        try:
            return cls(path, int(seq), int(micro) if micro else None)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--case {text}: give CONFIG[@SEQ[xMICRO]], e.g. "
                                             "experiments/configs/gpu-124m.yaml@16384x1") from None

    def overrides(self) -> list[str]:
        out = []
        if self.seq_len:
            out.append(f"model.seq_len={self.seq_len}")
        if self.micro_batch:
            out.append(f"train.micro_batch_size={self.micro_batch}")
        return out


@dataclass
class Row:
    config: str
    attention: str
    compile: str
    loss: str
    sync: str = "log"
    engine: str = "manual"          # "manual" (MasterAdamW) or "deepspeed" (the trainer's engine)
    seq_len: int = 0
    micro_batch: int = 0
    tokens_per_step: int = 0
    step_ms: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    first_loss: float | None = None     # step 1's loss: plain and chunked should agree
    warmup_s: float | None = None       # compilation included (shared by the sync rows)
    error: str | None = None
    extra: dict = field(default_factory=dict)
    # Python's collections during the timed steps (launcher.garbage): {"every": train.gc_every, "collections":
    # [generation 0, 1, 2], "ms_per_step": their pauses}
    gc: dict | None = None
    # --profile K: {"kernel_ms": device time per step, all kernels; "rows": the top K as [ms per step, calls per
    # step, kernel]; "timeline": launcher.profile_step.device_timeline's (None on the CPU)}, from as many more steps
    # under torch.profiler (CPU ops and their own time on the CPU)
    profile: dict | None = None


class MasterAdamW:
    """The optimizer step of DeepSpeed ZeRO-1 on one GPU with bf16: fp32 master weights and
    AdamW state; bf16 grads cast to fp32, clipped to the global norm, fused AdamW (foreach on
    the CPU), the result copied back into the bf16 weights. With fp32 weights (the CPU) it is
    torch's AdamW on the weights themselves, as the trainer's fp32 engine runs it."""

    def __init__(self, model: torch.nn.Module, config: RunConfig):
        from launcher.engine import adamw_param_groups

        opt = config.optimizer
        self.clip = opt.grad_clip
        groups = adamw_param_groups(model, opt.weight_decay)
        self.params = [p for g in groups for p in g["params"]]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        if self.mixed:
            masters = {id(p): p.detach().float().clone().requires_grad_(True) for p in self.params}
            groups = [{**g, "params": [masters[id(p)] for p in g["params"]]} for g in groups]
            self.masters = [masters[id(p)] for p in self.params]
        else:
            self.masters = self.params
        fused = True if self.params[0].is_cuda else None
        self.optimizer = torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                           fused=fused)

    @torch.no_grad()
    def step(self) -> None:
        if self.mixed:
            for m, p in zip(self.masters, self.params):
                m.grad = p.grad.float() if p.grad is not None else None
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.masters, self.clip, foreach=True)
        self.optimizer.step()
        if self.mixed:
            torch._foreach_copy_(self.params, self.masters)
        for p in self.params:
            p.grad = None
        if self.mixed:
            for m in self.masters:
                m.grad = None


def run_rows(rows: list[Row], config: RunConfig, steps: int, warmup: int, optimizer: bool,
             compile_backend: str, peak: float | None, profile_top: int = 0) -> None:
    """One model, compiled and warmed up once; then `steps` timed steps per row, which differ
    only in when the host reads the loss (Row.sync). The rows' engine (Row.engine) says how a
    step is taken: `manual_steps` or `deepspeed_steps`."""
    first = rows[0]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    m = config.model
    micro, seq = config.train.micro_batch_size, m.seq_len
    g = torch.Generator().manual_seed(config.seed)
    batches = [torch.randint(0, m.vocab_size, (micro, seq + 1), generator=g) for _ in range(2)]
    if first.engine == "deepspeed":
        steps_of = deepspeed_steps(config, first, compile_backend, batches)
    else:
        steps_of = manual_steps(config, first, compile_backend, batches, optimizer, device)
    with steps_of as (step, read, tokens_per_step, extra):
        for row in rows:
            row.seq_len, row.micro_batch, row.tokens_per_step = seq, micro, tokens_per_step
            row.extra.update(extra)
        time_rows(rows, config, steps, warmup, peak, device, step, read, profile_top)


def time_rows(rows: list[Row], config: RunConfig, steps: int, warmup: int, peak: float | None,
              device: torch.device, step, read, profile_top: int = 0) -> None:
    """The warm-up, then each row's timed steps; `step(i)` queues step i and hands back what
    `read(pending)` reads on the host at the rows' read points. profile_top: after a row's timed steps, as many
    more under torch.profiler (Row.profile). Python collects garbage on the trainer's schedule (train.gc_every)."""
    from launcher.profile_step import profiled_rows

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    first_loss = read([step(0)])[0]
    for i in range(1, warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - start
    done = warmup
    collection = ScheduledCollection(config.train.gc_every)

    def take(first: int, read_every: int) -> None:   # steps first.. first + steps - 1, read as the row reads
        pending = []
        for i in range(first, first + steps):
            pending.append(step(i))
            collection.step(i + 1)   # the trainer's schedule (launcher/train.py), by its 1-based step
            if (i + 1) % read_every == 0:
                read(pending)
                pending = []
        sync()

    with collection:
        for row in rows:
            # the trainer's reads: every step before launcher/step_metrics.py, now at its log points
            read_every = 1 if row.sync == "step" else config.train.log_every
            start = time.perf_counter()
            with CollectionPauses() as pauses:
                take(done, read_every)
            done += steps
            row.step_ms = (time.perf_counter() - start) * 1000.0 / steps
            row.gc = {"every": config.train.gc_every, **pauses.summary(steps)}
            if profile_top:
                first = done
                kernels, timeline = profiled_rows(lambda: take(first, read_every), steps, device)
                done += steps
                row.profile = {"kernel_ms": sum(r[0] for r in kernels),
                               "rows": [list(r) for r in kernels[:profile_top]], "timeline": timeline}
            row.tokens_per_s = row.tokens_per_step / row.step_ms * 1000.0
            row.first_loss, row.warmup_s = first_loss, warmup_s
            if peak:
                row.mfu = mfu(row.tokens_per_s, train_flops_per_token(config.model), peak)
            if device.type == "cuda":
                row.peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30


@contextlib.contextmanager
def manual_steps(config: RunConfig, first: Row, compile_backend: str, batches: list[torch.Tensor],
                 optimizer: bool, device: torch.device):
    """The stand-in: the config's model in bf16 on CUDA (fp32 on the CPU), `torch.compile` of
    the whole model, the loss read with `.item()`, `MasterAdamW` (or no optimizer step).
    A context: -> (step(i) -> the loss on the device, read(losses) -> their values, tokens per
    step, what the rows' `extra` records)."""
    from launcher.train import micro_batch_loss   # the trainer's loss, by model.loss_impl
    from model import Llama

    torch.manual_seed(config.seed)
    model = Llama(config.model).to(device=device,
                                   dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    opt = MasterAdamW(model, config) if optimizer else None
    forward = model
    if first.compile != "none":
        forward = torch.compile(model, backend=compile_backend,
                                **({} if first.compile == "default" else {"mode": first.compile}))

    def to_device(t):
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t

    def step(i: int) -> torch.Tensor:
        tokens = to_device(batches[i % len(batches)])
        x, y = tokens[:, :-1], tokens[:, 1:]
        if first.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = micro_batch_loss(forward, x, y, first.loss)
        loss.backward()
        if opt is not None:
            opt.step()
        else:
            for p in model.parameters():
                p.grad = None
        return loss.detach()

    def read(losses: list[torch.Tensor]) -> list[float]:
        return [losses[-1].item()]   # one read: the last step's loss

    micro, seq = config.train.micro_batch_size, config.model.seq_len
    yield step, read, micro * seq, {}


@contextlib.contextmanager
def deepspeed_steps(config: RunConfig, first: Row, compile_backend: str,
                    batches: list[torch.Tensor]):
    """The trainer's step, with its DeepSpeed engine: launcher/train.py's model, compilation,
    `build_engine` and `train_step` in a one-process world (launcher.distributed's: a free
    localhost port, nccl on CUDA, gloo on the CPU). The loss and grad norm stay on the device
    and are read as the trainer's loop reads them (read_metrics, one copy for all pending).
    -> as manual_steps."""
    from launcher.distributed import init_process_group, world_size
    from launcher.engine import build_engine, use_bf16
    from launcher.layout import resolve_layout
    from launcher.step_metrics import PendingStep, read_metrics
    from launcher.train import Shard, compile_model, train_step
    from model import Llama

    init_process_group()   # before DeepSpeed's first import: on the CPU it is told its accelerator
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)   # as launcher.logs: no INFO lines
    if world_size() != 1:
        raise RuntimeError(f"--engine deepspeed runs one process; this one is in a world of "
                           f"{world_size()} (unset RANK/WORLD_SIZE or run without a launcher)")
    layout = resolve_layout(config, 1)
    torch.manual_seed(config.seed)
    model = Llama(config.model)
    if first.compile != "none":   # in place, as train.compile (the trainer) does it, in its mode
        compile_model(model, first.compile, compile_backend)
    engine = build_engine(model, config, layout)
    # reduce-overhead: a new CUDA-graph iteration per micro-batch, as the trainer's Shard marks it
    shard = Shard(layout, 0, engine.device, config.model.loss_impl, cuda_graphs=first.compile == "reduce-overhead")
    # (inputs, targets) on the host, as the trainer's loader hands them over
    pairs = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in batches]

    def micro_batches(i: int):
        for k in range(layout.grad_accum):
            yield pairs[(i * layout.grad_accum + k) % len(pairs)]

    def step(i: int) -> PendingStep:
        loss, grad_norm = train_step(engine, micro_batches(i), layout.grad_accum, shard)
        return PendingStep(i + 1, loss, grad_norm, lr=0.0, tokens_seen=0, memory_gib=0.0,
                           time_ms=0)

    def read(pending: list[PendingStep]) -> list[float]:
        return [loss for loss, _ in read_metrics(pending)]

    extra = {"zero_stage": config.parallel.zero_stage, "grad_accum": layout.grad_accum,
             "bf16": use_bf16(config), "check_grad_overflow": config.train.check_grad_overflow,
             "grad_accum_dtype": config.train.grad_accum_dtype, "optimizer": type(engine.optimizer).__name__,
             "grad_clip": config.optimizer.grad_clip}
    try:
        yield step, read, layout.tokens_per_step, extra
    finally:
        # Its gradient hooks keep the engine (and its model, optimizer state) alive past the
        # group otherwise: the next group's peak memory would count them.
        engine.destroy()


def cleanup() -> None:
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    for package in ("deepspeed", "pydantic"):   # not imported: DeepSpeed only after the world
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = None
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    """Markdown table; `x plain` is the row's tokens/s over the plain-loss row of the same
    case, attention, compile mode, sync and engine; `gc ms a step`: Python's collection pauses in its timed steps."""
    base = {(r.config, r.seq_len, r.micro_batch, r.attention, r.compile, r.sync, r.engine):
            r.tokens_per_s for r in rows if r.loss == "plain" and r.tokens_per_s}
    lines = ["| config | seq x micro | attention | compile | loss | sync | engine | step ms "
             "| tokens/s | x plain | MFU | peak GiB | step-1 loss | gc ms a step | error |", "|" + "---|" * 15]
    for r in rows:
        ref = base.get((r.config, r.seq_len, r.micro_batch, r.attention, r.compile, r.sync,
                        r.engine))
        speedup = r.tokens_per_s / ref if ref and r.tokens_per_s else None
        name = r.config.rsplit("/", 1)[-1].removesuffix(".yaml")
        lines.append(
            f"| {name} | {r.seq_len} x {r.micro_batch} | {r.attention} | {r.compile} | {r.loss} "
            f"| {r.sync} | {r.engine} | {fmt(r.step_ms, '.2f')} | {fmt(r.tokens_per_s, ',.0f')} "
            f"| {fmt(speedup, '.3f')} "
            f"| {fmt(r.mfu and 100 * r.mfu, '.1f')}{'%' if r.mfu else ''} "
            f"| {fmt(r.peak_memory_gib, '.2f')} | {fmt(r.first_loss, '.4f')} "
            f"| {fmt(r.gc and r.gc['ms_per_step'], '.2f')} | {r.error or ''} |")
    return "\n".join(lines)


def profile_tables(rows: list[Row]) -> str:
    """Each profiled row's top kernels (CPU ops on the CPU), under a line with its timed step and the device time
    of all its kernels per step (more than the step where kernels overlap, less where the device waits), and on CUDA
    its device timeline."""
    from launcher.profile_step import timeline_table
    out = []
    for r in (r for r in rows if r.profile):
        name = r.config.rsplit("/", 1)[-1].removesuffix(".yaml")
        out += ["", f"{name} {r.seq_len} x {r.micro_batch} {r.attention} compile={r.compile} loss={r.loss} "
                f"sync={r.sync} engine={r.engine}: step {r.step_ms:.2f} ms (timed), kernels "
                f"{r.profile['kernel_ms']:.2f} ms per step (profiled)",
                "| ms per step | calls per step | kernel |", "|---|---|---|"]
        out += [f"| {ms:.3f} | {calls:g} | {kernel[:110]} |" for ms, calls, kernel in r.profile["rows"]]
        if r.profile.get("timeline"):
            out += ["", timeline_table(r.profile["timeline"])]
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", dest="cases", action="append", type=Case.parse, default=[],
                   metavar="CONFIG[@SEQ[xMICRO]]", help="a config at a seq and micro-batch (repeatable)")
    p.add_argument("--config", dest="configs", action="append", default=[],
                   help="a config at its own seq and micro-batch (repeatable)")
    p.add_argument("--attention", nargs="+", choices=sorted(ATTENTIONS), default=["fpa", "sagebwd"])
    p.add_argument("--compile", nargs="+", choices=COMPILE_MODES, default=["none", "default"],
                   help="torch.compile modes ('none': eager; default: none default)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend (aot_eager: tracing only, for CPU smoke tests)")
    p.add_argument("--loss", nargs="+", choices=("plain", "chunked"), default=["plain", "chunked"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every row, e.g. model.loss_chunk_tokens=4096")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row (default 10)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first (default: 2 eager, 4 compiled)")
    p.add_argument("--quick", action="store_true", help="2 timed steps after 1 warm-up (2 compiled)")
    p.add_argument("--optimizer", choices=("adamw", "none"), default="adamw",
                   help="the manual engine's optimizer step (deepspeed always steps)")
    p.add_argument("--engine", nargs="+", choices=ENGINES, default=["manual"],
                   help="manual: the MasterAdamW stand-in (default); deepspeed: the trainer's "
                   "DeepSpeed engine and train_step, one process")
    p.add_argument("--sync", nargs="+", choices=("step", "log"), default=["log"],
                   help="when the host reads the loss: every step (the trainer before its reads "
                   "were batched) or once per train.log_every steps (the trainer now; default)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: launcher/throughput.py's table)")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="after each row's timed steps, as many more under torch.profiler: its top K kernels "
                   "(CPU ops on the CPU) and all kernels' device time per step (default 0: off)")
    p.add_argument("--out", help="write the rows and the environment as JSON here")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps {args.steps}: give a positive count")
    if args.profile < 0:
        p.error(f"--profile {args.profile}: give how many kernels to list (0: no profile)")
    if args.optimizer == "none" and "deepspeed" in args.engine:
        p.error("--optimizer none applies to the manual engine only (DeepSpeed always steps)")
    if args.quick:
        args.steps = min(args.steps, 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = args.cases + [Case(c) for c in args.configs] or [Case.parse(c) for c in DEFAULT_CASES]
    peak = device_peak_tflops(args.peak_tflops)
    env = environment()
    print(f"{env['device']}: torch {env['torch']}, triton {env['triton']}, python {env['python']}; "
          f"peak {peak or 'unknown'} TFLOP/s", flush=True)
    rows: list[Row] = []
    for case in cases:
        for attention in args.attention:
            for mode in args.compile:
                for loss, engine in ((lo, en) for lo in args.loss for en in args.engine):
                    group = [Row(case.config, attention, mode, loss, sync, engine)
                             for sync in args.sync]
                    warmup = args.warmup if args.warmup is not None else (
                        (1 if mode == "none" else 2) if args.quick else (2 if mode == "none" else 4))
                    sets = [*case.overrides(), *ATTENTIONS[attention], f"model.loss_impl={loss}",
                            *args.overrides]
                    try:
                        config = load_run_config(case.config, sets)
                        run_rows(group, config, args.steps, max(warmup, 1),
                                 args.optimizer == "adamw", args.compile_backend, peak, args.profile)
                    except ConfigError as err:
                        for row in group:
                            row.error = f"config: {err}".replace("\n", " ")
                    except Exception as err:  # noqa: BLE001 - one row's failure must not end the table
                        for row in (r for r in group if r.step_ms is None):   # the rows not timed
                            row.error = (f"{type(err).__name__}: "
                                         f"{str(err).splitlines()[0] if str(err) else ''}")[:300]
                            row.extra["traceback"] = traceback.format_exc(limit=-3)
                    finally:
                        cleanup()
                    rows.extend(group)
                    for row in group:
                        print(f"  {case.config} seq {row.seq_len} x {row.micro_batch} {attention} "
                              f"compile={mode} loss={loss} sync={row.sync} engine={engine}: "
                              + (f"{row.step_ms:.2f} ms, {row.tokens_per_s:,.0f} tok/s"
                                 if row.error is None else f"ERROR {row.error}"), flush=True)
    print(table(rows))
    if args.profile:
        print(profile_tables(rows))
    if args.out:
        payload = {"environment": env, "peak_tflops": peak,
                   "args": {k: (v if k != "cases" else [asdict(c) for c in v]) for k, v in vars(args).items()},
                   "rows": [asdict(r) for r in rows]}
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.out}")
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    from launcher.distributed import exit_after_run   # the process group of the runs trained here
    exit_after_run(main())
