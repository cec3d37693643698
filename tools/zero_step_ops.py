"""Where DeepSpeed's ZeRO step spends host work, counted on the CPU.

    python -m tools.zero_step_ops [--layers 6 12] [--variants zero1 manual ...] [--steps 2]
                                  [--json PATH]

The trainer's real DeepSpeed engine (``launcher.engine.build_engine`` on launcher's ``Llama``, in a
one-process gloo world as ``benchmarks.train_throughput --engine deepspeed`` builds it) on a model
with gpu-124m's structure (experiments/configs/gpu-124m.yaml: qk_norm, SwiGLU, tied embedding,
chunked loss, ZeRO-1, ``train.precision: bf16``, clipping at 1.0, the overflow check off) at tiny
sizes (hidden 64, 2 heads, ffn 128, seq 32, vocab 512, micro-batch 1), so the number of parameter
tensors is the real one (9 per layer + 2: 110 at 12 layers) and the arithmetic costs nothing.

Per optimizer step (after ``--warmup`` steps, the mean of ``--steps`` counted steps; every counted
step must give the same counts) it counts, with a TorchDispatchMode, the aten ops dispatched in
``engine.backward(loss)`` and in ``engine.step()``, each op attributed to the first caller outside
torch: ``autograd`` (the autograd engine itself: the model's backward, AccumulateGrad),
``deepspeed`` (its gradient hooks, the IPG buckets and epilogue, the flat partitions, the norm,
clipping, the copy back), ``torch.optim`` (the client AdamW and the lr scheduler, called by
DeepSpeed), ``model``/``launcher``. A composite op is counted once at the level Python dispatches
it (``_foreach_norm`` is one op, as one launch on a GPU; ``x.to(dtype)`` is its ``_to_copy``).
Also counted: the host reads (``item``, ``tolist``, ``bool()``, ... of a tensor, hooked as
tests/test_train_host_sync.py hooks them; the client optimizer's left out) and the Python function
calls made in DeepSpeed's own modules (``sys.setprofile``): per-parameter Python work shows up as
counts that grow with the number of parameter tensors (``--layers 6 12``).

Variants (``--variants``; each builds its own model and engine from the same seed):

  manual   benchmarks.train_throughput's stand-in (``MasterAdamW``: bf16 weights, fp32 masters, grads
           cast, foreach clip, fused AdamW, ``_foreach_copy_`` back) after a plain ``loss.backward()``
  zero1    the project's engine as configured (DeepSpeed's ZeRO stage 1 optimizer)
  the rest change ONE documented DeepSpeed 0.19.8 option of zero1 (deepspeed/runtime/zero/config.py,
  deepspeed/runtime/engine.py), listed in VARIANTS with the option they set.

On a GPU the client AdamW is fused (``launcher.engine``: ``fused=torch.cuda.is_available()``); on
the CPU it would be the per-tensor loop. So that the optimizer rows mean what they mean on a GPU,
``--adamw fused`` (the default) switches the client AdamW's groups (and the stand-in's) to torch's
fused AdamW, which has a CPU kernel; ``--adamw as-built`` leaves the CPU's choice.

These are op and call counts on the CPU, not GPU time: an aten op is roughly one kernel launch (or
a view/metadata op that launches nothing) and its dispatcher and Python overhead on the host. The
CPU accelerator also takes a few branches of DeepSpeed's CUDA path differently (no streams or
events: those are not aten ops either way). The model runs eagerly (the trainer compiles it; the
compiled forward/backward changes the ``autograd`` column only, not DeepSpeed's hooks or step).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BASE_CONFIG = "experiments/configs/gpu-124m.yaml"
TINY = ["model.hidden_size=64", "model.num_heads=2", "model.ffn_hidden_size=128", "model.seq_len=32",
        "model.vocab_size=512", "model.block_q=32", "model.block_kv=32", "model.loss_chunk_tokens=16",
        "train.micro_batch_size=1", "train.precision=bf16", "train.check_grad_overflow=false"]


@dataclass(frozen=True)
class Variant:
    what: str                              # the table's description
    overrides: tuple[str, ...] = ()        # run-config overrides (launcher's `--set` form)
    zero: dict = field(default_factory=dict)   # merged into the DeepSpeed config's zero_optimization
    ds: dict = field(default_factory=dict)     # merged into the DeepSpeed config's top level


VARIANTS: dict[str, Variant] = {
    "manual": Variant("stand-in: MasterAdamW (benchmarks.train_throughput --engine manual)"),
    "zero1": Variant("the project's engine: ZeRO-1, bf16, clip 1.0, overflow check and throughput timer off"),
    "zero1-check": Variant("train.check_grad_overflow: true (bf16.check_grad_overflow)",
                           overrides=("train.check_grad_overflow=true",)),
    "zero1-noclip": Variant("optimizer.grad_clip: 0 (gradient_clipping 0)",
                            overrides=("optimizer.grad_clip=0",)),
    "zero1-noncontig": Variant("zero_optimization.contiguous_gradients: false",
                               zero={"contiguous_gradients": False}),
    "zero1-overlap": Variant("zero_optimization.overlap_comm: true", zero={"overlap_comm": True}),
    "zero1-bucket": Variant("zero_optimization.reduce_bucket_size: 50000 (about 12 buckets at 12 "
                            "layers; default 5e8: one)", zero={"reduce_bucket_size": 50000}),
    "zero1-allreduce": Variant("zero_optimization.reduce_scatter: false",
                               zero={"reduce_scatter": False}),
    "zero1-roundrobin": Variant("zero_optimization.round_robin_gradients: true",
                                zero={"round_robin_gradients": True}),
    "zero1-fp32acc": Variant("data_types.grad_accum_dtype: fp32 (engine picks BF16_Optimizer)",
                             ds={"data_types": {"grad_accum_dtype": "fp32"}}),
    "zero1-timer": Variant("timers.throughput.enabled: true (DeepSpeed's default throughput timer)",
                           ds={"timers": {"throughput": {"enabled": True}}}),
    "zero2": Variant("zero_optimization.stage: 2", overrides=("parallel.zero_stage=2",)),
    "zero0": Variant("zero_optimization.stage: 0 (bf16 without ZeRO)",
                     overrides=("parallel.zero_stage=0",)),
}
PHASES = ("forward", "backward", "step")
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__format__")
ENGINE_OWNERS = ("deepspeed", "benchmarks")   # the engine's own code: DeepSpeed's or the stand-in's


def owner_of(frame) -> str:
    """The first caller outside torch: its top-level package; `autograd` where the autograd
    engine dispatched the op itself, `torch.optim` where torch's optimizer (or lr scheduler)
    did."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_filename == __file__:   # this tool's hooks and drivers
            frame = frame.f_back
            continue
        if name.split(".")[0] != "torch":
            return name.split(".")[0] or "?"
        if name.startswith("torch.optim"):
            return "torch.optim"
        if frame.f_code.co_name == "_engine_run_backward":
            return "autograd"
        frame = frame.f_back
    return "?"


class Counts(TorchDispatchMode):
    """Per counted step: aten ops by (phase, owner, op), host reads by (phase, owner, method),
    DeepSpeed's Python calls and its accelerator's device synchronisations by phase, while
    `phase` is set (None: not counted)."""

    def __init__(self):
        super().__init__()
        self.phase: str | None = None
        self.ops: Counter = Counter()
        self.reads: Counter = Counter()
        self.calls: Counter = Counter()
        self.syncs: Counter = Counter()
        self.steps: list[tuple[Counter, Counter, Counter, Counter]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.phase is not None:
            name = func.name().removeprefix("aten::").split(".")[0]
            self.ops[(self.phase, owner_of(sys._getframe(1)), name)] += 1
        return func(*args, **(kwargs or {}))

    def profile(self, frame, event, arg):
        if event != "call" or self.phase is None:
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("deepspeed"):
            self.calls[self.phase] += 1
            # get_accelerator().synchronize(): torch.cuda.synchronize() on a GPU
            if module.startswith("deepspeed.accelerator") and frame.f_code.co_name == "synchronize":
                caller = frame.f_back
                self.syncs[(self.phase, f"{caller.f_globals.get('__name__', '')}.{caller.f_code.co_name}")] += 1

    @contextlib.contextmanager
    def hooked(self):
        """The mode, the host-read hooks on torch.Tensor and the profile hook, all undone after."""
        originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

        def reader(name, original):
            def read(tensor, *args, **kwargs):
                if self.phase is not None:
                    who = owner_of(sys._getframe(1))
                    if who != "torch.optim":   # the client optimizer's host scalars: not device reads
                        self.reads[(self.phase, who, name)] += 1
                return original(tensor, *args, **kwargs)
            return read

        for name, original in originals.items():
            setattr(torch.Tensor, name, reader(name, original))
        sys.setprofile(self.profile)
        try:
            with self:
                yield self
        finally:
            sys.setprofile(None)
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)

    @contextlib.contextmanager
    def at(self, phase: str):
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None

    def end_step(self) -> None:
        self.steps.append((self.ops, self.reads, self.calls, self.syncs))
        self.ops, self.reads, self.calls, self.syncs = Counter(), Counter(), Counter(), Counter()


class Clock:
    """The same drivers, timed instead of counted: CPU wall seconds per phase (no hooks)."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.steps = 0

    @contextlib.contextmanager
    def at(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def end_step(self) -> None:
        self.steps += 1


@dataclass
class Row:
    variant: str
    layers: int
    params: int = 0                 # parameter tensors
    optimizer: str = ""             # DeepSpeed's optimizer class (or the stand-in's)
    backward_autograd: int = 0      # ops the autograd engine dispatched (the model's backward)
    backward_engine: int = 0        # ops of the engine's own code inside backward (DeepSpeed's hooks)
    step_engine: int = 0            # ... inside step() (DeepSpeed's, or MasterAdamW's)
    step_optim: int = 0             # torch.optim's inside step() (the client AdamW, lr scheduler)
    forward_engine: int = 0         # the engine's own ops in its forward
    host_reads: int = 0             # the engine's reads of a tensor's value
    device_syncs: int = 0           # DeepSpeed's get_accelerator().synchronize() calls
    python_calls: int = 0           # calls into DeepSpeed's Python functions (forward, backward, step)
    backward_ms: float | None = None   # CPU wall time at these tiny sizes (--time-steps)
    step_ms: float | None = None
    top_ops: dict = field(default_factory=dict)     # the engine's own op -> count
    reads_at: dict = field(default_factory=dict)    # "phase:method" -> count
    syncs_at: dict = field(default_factory=dict)    # "phase:caller" -> count
    error: str | None = None

    @property
    def engine_ops(self) -> int:
        return self.forward_engine + self.backward_engine + self.step_engine + self.step_optim


def config_for(variant: Variant, layers: int):
    from launcher.config import load_run_config

    return load_run_config(BASE_CONFIG, [*TINY, f"model.num_layers={layers}", *variant.overrides])


@contextlib.contextmanager
def deepspeed_engine(config, variant: Variant, fused: bool):
    """The trainer's engine for `config`, with the variant's DeepSpeed options merged into the
    config launcher.engine derives (the project's defaults are not touched)."""
    import launcher.engine as engine_module
    from launcher.distributed import init_process_group
    from launcher.layout import resolve_layout
    from model import Llama

    init_process_group()   # before DeepSpeed's first import: on the CPU it is told its accelerator
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    real = engine_module.deepspeed_config

    def merged(*args, **kwargs):
        out = real(*args, **kwargs)
        out["zero_optimization"] = {**out["zero_optimization"], **variant.zero}
        return {**out, **variant.ds}

    torch.manual_seed(config.seed)
    model = Llama(config.model)
    with mock.patch.object(engine_module, "deepspeed_config", merged), \
            contextlib.redirect_stdout(sys.stderr):   # BF16_Optimizer prints its memory use
        engine = engine_module.build_engine(model, config, resolve_layout(config, 1))
    if fused:   # as on a GPU: the state is made at the first step, so this is in time
        for group in engine.basic_optimizer.param_groups:
            group["fused"], group["foreach"] = True, False
    try:
        yield engine
    finally:
        engine.destroy()


def drive_deepspeed(probes, config, variant: Variant, fused: bool, warmup: int) -> str:
    """`warmup` steps, then one step per probe, each inside `probe.at(phase)` and ended by
    `probe.end_step()`: the trainer's order (forward through the engine, engine.backward,
    engine.step; one micro-batch a step, as gpu-124m on one GPU)."""
    from launcher.layout import resolve_layout
    from launcher.train import Shard

    with deepspeed_engine(config, variant, fused) as engine:
        shard = Shard(resolve_layout(config, 1), 0, engine.device, config.model.loss_impl)
        batch = tokens(config)
        for probe in [None] * warmup + list(probes):
            with at(probe, "forward"):
                loss = shard.loss(engine, batch)
            with at(probe, "backward"):
                engine.backward(loss)
            with at(probe, "step"):
                engine.step()
            if probe is not None:
                probe.end_step()
        return type(engine.optimizer).__name__


def drive_manual(probes, config, fused: bool, warmup: int) -> str:
    """As drive_deepspeed, for the stand-in: bf16 weights (the GPU's: MasterAdamW's mixed path),
    loss.backward(), MasterAdamW.step()."""
    from benchmarks.train_throughput import MasterAdamW
    from launcher.train import micro_batch_loss
    from model import Llama

    torch.manual_seed(config.seed)
    model = Llama(config.model).to(torch.bfloat16)
    opt = MasterAdamW(model, config)
    if fused:
        for group in opt.optimizer.param_groups:
            group["fused"], group["foreach"] = True, False
    x, y = tokens(config)
    for probe in [None] * warmup + list(probes):
        with at(probe, "forward"):
            loss = micro_batch_loss(model, x, y, config.model.loss_impl)
        with at(probe, "backward"):
            loss.backward()
        with at(probe, "step"):
            opt.step()
        if probe is not None:
            probe.end_step()
    return f"{type(opt).__name__}({type(opt.optimizer).__name__})"


def at(probe, phase: str):
    return contextlib.nullcontext() if probe is None else probe.at(phase)


def tokens(config) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(config.seed)
    t = torch.randint(0, config.model.vocab_size,
                      (config.train.micro_batch_size, config.model.seq_len + 1), generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def measure(name: str, layers: int, fused: bool = True, warmup: int = 2, steps: int = 2,
            time_steps: int = 0) -> Row:
    """One variant at one depth -> its Row (with `error` set, and no counts, if it fails)."""
    from model import Llama

    variant = VARIANTS[name]
    row = Row(name, layers)

    def drive(probes):
        if name == "manual":
            return drive_manual(probes, config, fused, warmup)
        return drive_deepspeed(probes, config, variant, fused, warmup)

    try:
        config = config_for(variant, layers)
        row.params = sum(1 for _ in Llama(config.model).parameters())
        counts = Counts()
        with counts.hooked():
            row.optimizer = drive([counts] * steps)
        if any(s != counts.steps[0] for s in counts.steps[1:]):
            raise RuntimeError(f"the counts differ step to step: {counts.steps}")
        fill(row, *counts.steps[0])
        if time_steps:
            clock = Clock()
            drive([clock] * time_steps)
            row.backward_ms = 1000.0 * clock.seconds["backward"] / clock.steps
            row.step_ms = 1000.0 * clock.seconds["step"] / clock.steps
    except Exception as err:   # noqa: BLE001 -- a variant DeepSpeed rejects is a result too
        row.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
    return row


def fill(row: Row, ops: Counter, reads: Counter, calls: Counter, syncs: Counter) -> None:
    def count(phase, owners):
        return sum(n for (p, who, _), n in ops.items() if p == phase and who in owners)

    row.forward_engine = count("forward", ENGINE_OWNERS)
    row.backward_autograd = count("backward", ("autograd",))
    row.backward_engine = count("backward", ENGINE_OWNERS)
    row.step_engine = count("step", ENGINE_OWNERS)
    row.step_optim = count("step", ("torch.optim",))
    row.host_reads = sum(n for (_, who, _), n in reads.items() if who in ENGINE_OWNERS)
    row.device_syncs = sum(syncs.values())
    row.python_calls = sum(calls.values())
    top = Counter()
    for (_, who, op), n in ops.items():
        if who in ENGINE_OWNERS + ("torch.optim",):
            top[op] += n
    row.top_ops = dict(top.most_common())
    row.reads_at = dict(Counter({f"{p}:{how}": n for (p, who, how), n in reads.items()
                                 if who in ENGINE_OWNERS}))
    row.syncs_at = {f"{p}:{caller}": n for (p, caller), n in syncs.items()}


def fmt(x) -> str:
    if x is None:
        return ""
    return f"{x:.0f}" if float(x).is_integer() else (f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}")


COLUMNS = [  # (header, the row's value)
    ("backward: autograd ops", lambda r: r.backward_autograd),
    ("backward: engine ops", lambda r: r.backward_engine),
    ("step: engine ops", lambda r: r.step_engine),
    ("step: torch.optim ops", lambda r: r.step_optim),
    ("host reads", lambda r: r.host_reads),
    ("device syncs", lambda r: r.device_syncs),
    ("DeepSpeed Python calls", lambda r: r.python_calls),
    ("CPU ms backward + step", lambda r: None if r.step_ms is None else r.backward_ms + r.step_ms),
]


def table(rows: list[Row]) -> str:
    """One line per variant; each count is given per depth (`a / b`: --layers in order), per
    optimizer step. `per param tensor`: the growth of the engine's ops (forward, backward, step,
    torch.optim) and of DeepSpeed's Python calls per added parameter tensor, from the smallest
    to the largest depth (linear growth: a per-parameter loop)."""
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.variant, []).append(r)
    depths = sorted({r.layers for r in rows})
    params = " / ".join(str(next((r.params for r in rows if r.layers == d and r.params), "?"))
                        for d in depths)
    head = ["variant", "optimizer", *(h for h, _ in COLUMNS), "per param tensor: engine ops, Python calls",
            "top engine ops (largest depth)"]
    lines = [f"Layers {' / '.join(map(str, depths))} (parameter tensors {params}); per optimizer step.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in by.items():
        rs = sorted(rs, key=lambda r: r.layers)
        errors = {r.error for r in rs if r.error}
        if errors:
            lines.append(f"| {name} | {'; '.join(sorted(errors))} |" + " |" * (len(head) - 2))
            continue
        cells = [" / ".join(fmt(get(r)) for r in rs) for _, get in COLUMNS]
        slope = ""
        if len(rs) > 1 and rs[-1].params != rs[0].params:
            d = rs[-1].params - rs[0].params
            slope = (f"{fmt((rs[-1].engine_ops - rs[0].engine_ops) / d)}, "
                     f"{fmt((rs[-1].python_calls - rs[0].python_calls) / d)}")
        top = ", ".join(f"{op} {fmt(n)}" for op, n in list(rs[-1].top_ops.items())[:5])
        lines.append(f"| {name} | {rs[-1].optimizer} | " + " | ".join(cells) + f" | {slope} | {top} |")
    lines += ["", "Variants:"] + [f"- `{name}`: {VARIANTS[name].what}" for name in by]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tools.zero_step_ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, nargs="+", default=[6, 12])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--adamw", choices=("fused", "as-built"), default="fused")
    p.add_argument("--warmup", type=int, default=2,
                   help="uncounted steps first (>= 2: DeepSpeed's throughput timer starts at step 3)")
    p.add_argument("--steps", type=int, default=2, help="counted steps (they must agree)")
    p.add_argument("--time-steps", type=int, default=10,
                   help="steps timed without the hooks (CPU ms column); 0: not timed")
    p.add_argument("--json", help="write the rows (with every engine op's count) here")
    args = p.parse_args(argv)
    for flag, values, least in (("--layers", args.layers, 1), ("--steps", [args.steps], 1),
                                ("--warmup", [args.warmup], 0), ("--time-steps", [args.time_steps], 0)):
        bad = [v for v in values if v < least]
        if bad:
            p.error(f"{flag} {bad[0]}: give a count of at least {least}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny tensors; the counts do not depend on it
    rows = []
    try:
        for layers in args.layers:
            for name in args.variants:
                rows.append(measure(name, layers, args.adamw == "fused", args.warmup, args.steps,
                                    args.time_steps))
                print(f"# {name} layers={layers}: " + (rows[-1].error or "ok"), file=sys.stderr,
                      flush=True)
    finally:   # a caller in the same process (a test session) keeps its thread count
        torch.set_num_threads(threads)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0 if all(r.error is None for r in rows if r.variant in ("manual", "zero1")) else 1


if __name__ == "__main__":
    from launcher.distributed import exit_after_run   # the process group of the runs trained here
    exit_after_run(main())
