"""`python -m launcher.profile_step --config FILE [--set KEY=VALUE ...] [--steps N] [--top K] [--compile MODE]`

Where one training step's time goes, on one device and without DeepSpeed: the config's model
(bf16 on CUDA, fp32 on the CPU) and one micro-batch of its data, `--steps` forward and
backward passes with the trainer's loss, timed, then profiled with torch.profiler: the top-K
CUDA kernels (or CPU ops, without a GPU) by time per step. Run it with `--set
model.attention=fpa` and `--set model.attention=sagebwd --set model.smoothing=k` to see the
attention kernels against the rest of the step, and which SDPA kernel FPA actually ran.
`--compile reduce-overhead` times the step compiled and replayed from CUDA graphs, where no
launch costs host time.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from launcher.config import RunConfig, load_run_config
from launcher.overrides import ConfigError


COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")


def profile_step(config: RunConfig, steps: int, top: int, compile_mode: str = "none",
                 compile_backend: str = "inductor") -> dict:
    """{'step_ms', 'device', 'rows': [(ms per step, calls per step, name)], ...}.

    compile_mode: torch.compile's mode for the model ("none": eager). SageBwd stays one opaque
    op in the compiled graph (its torch.library registration); "reduce-overhead" replays the
    step from CUDA graphs, which removes the op's host time (docs/benchmarks.md, "Host time")."""
    from launcher.data import build_batches
    from launcher.train import micro_batch_loss
    from model import Llama

    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Llama(config.model).to(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    x, y = (t.to(device) for t in next(iter(build_batches(config)[0])))
    forward = model
    if compile_mode != "none":
        forward = torch.compile(model, backend=compile_backend,
                                **({} if compile_mode == "default" else {"mode": compile_mode}))

    def step():
        for p in model.parameters():
            p.grad = None
        if compile_mode == "reduce-overhead":   # a new step: the graphs' outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        micro_batch_loss(forward, x, y, config.model.loss_impl).backward()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(2 if compile_mode == "none" else 4):   # compilation, autotuning, graph capture, allocator
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    step_ms = (time.perf_counter() - start) * 1000.0 / steps

    rows = profiled_rows(lambda: [step() for _ in range(steps)], steps, device)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "step_ms": step_ms,
            "tokens": x.numel(), "total_ms": sum(r[0] for r in rows), "rows": rows[:top]}


def profiled_rows(run_steps, steps: int, device: torch.device) -> list[tuple[float, float, str]]:
    """[(ms per step, calls per step, name)], largest first: each CUDA kernel's device time (each CPU op's own time
    on the CPU) while `run_steps()` takes `steps` steps under torch.profiler (the device synchronised after). A
    record_function range (the optimizer's "Optimizer.step#AdamW.step") also carries device time, that of the kernels
    inside it: on CUDA it is left out, so that the rows add up to the kernels' time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run_steps()
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        if device.type == "cuda":
            kernel = evt.device_type == torch.autograd.DeviceType.CUDA and not getattr(evt, "is_user_annotation", False)
            us = evt.self_device_time_total if kernel else 0
        else:
            us = evt.self_cpu_time_total
        if us > 0:
            rows.append((us / steps / 1000.0, evt.count / steps, evt.key))
    rows.sort(reverse=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.profile_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a run config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=3, help="steps timed, then steps profiled (default 3)")
    parser.add_argument("--top", type=int, default=20, help="kernels (or ops) listed (default 20)")
    parser.add_argument("--compile", choices=COMPILE_MODES, default="none",
                        help="torch.compile the model in this mode (default: none, eager)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend (default inductor; aot_eager traces without code generation)")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--top", args.top)):
        if value < 1:
            parser.error(f"{flag} {value}: give a positive count")
    if args.compile != "none":
        backends = torch._dynamo.list_backends(exclude_tags=())
        if args.compile_backend not in backends:
            parser.error(f"--compile-backend {args.compile_backend}: not a torch.compile backend here; "
                         f"use one of {', '.join(sorted(backends))}")
    try:
        config = load_run_config(args.config, args.overrides)
        result = profile_step(config, args.steps, args.top, args.compile, args.compile_backend)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    what = "CUDA kernels" if result["device"] != "cpu" else "CPU ops"
    print(f"{result['device']}: attention={config.model.attention}, compile={args.compile}, "
          f"{result['tokens']:,} tokens per step, "
          f"{result['step_ms']:.2f} ms per step (wall); {what} {result['total_ms']:.2f} ms per step in all")
    print(f"| ms per step | calls per step | {what[:-1]} |")
    print("|---|---|---|")
    for ms, calls, name in result["rows"]:
        print(f"| {ms:.3f} | {calls:g} | {name[:110]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
