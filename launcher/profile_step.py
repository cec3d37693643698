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
    """{'step_ms', 'issue_ms', 'device', 'rows': [(ms per step, calls per step, name)], 'timeline', ...}.

    issue_ms: (forward, backward), the host's median time to issue each half of a step begun on an idle device (on
    CUDA: to queue its kernels or graph replays). An engine whose optimizer step waits on the device and then is
    bound by its own host work leaves the device idle for the next forward's issue time.

    compile_mode: torch.compile's mode for the model ("none": eager). SageBwd stays one opaque
    op in the compiled graph (its torch.library registration); "reduce-overhead" replays the
    step from CUDA graphs, which removes the op's host time (docs/benchmarks.md, "Host time")."""
    step, device, tokens = build_step(config, compile_mode, compile_backend)

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
    issue_forward, issue_backward = [], []   # each step from an idle device: the host's time for each half
    for _ in range(steps):
        sync()
        began = time.perf_counter()
        loss = step(backward=False)
        issued = time.perf_counter()
        loss.backward()
        issue_forward.append(issued - began)
        issue_backward.append(time.perf_counter() - issued)
    sync()

    rows, timeline = profiled_rows(lambda: [step() for _ in range(steps)], steps, device)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "step_ms": step_ms,
            "issue_ms": (median_ms(issue_forward), median_ms(issue_backward)), "tokens": tokens,
            "total_ms": sum(r[0] for r in rows), "rows": rows[:top], "timeline": timeline}


def build_step(config: RunConfig, compile_mode: str = "none", compile_backend: str = "inductor"):
    """(step, device, tokens per step): the config's model (bf16 on CUDA, fp32 on the CPU), compiled in
    compile_mode ("none": eager), and one micro-batch of its data; step(backward=True) takes one forward and
    backward with the trainer's loss, or with backward=False returns the loss after the forward."""
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

    def step(backward: bool = True):
        for p in model.parameters():
            p.grad = None
        if compile_mode == "reduce-overhead":   # a new step: the graphs' outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        loss = micro_batch_loss(forward, x, y, config.model.loss_impl)
        if not backward:
            return loss
        loss.backward()

    return step, device, x.numel()


def median_ms(seconds: list[float]) -> float:
    return 1000.0 * sorted(seconds)[len(seconds) // 2]


def profiled_rows(run_steps, steps: int, device: torch.device) -> tuple[list[tuple[float, float, str]], dict | None]:
    """([(ms per step, calls per step, name)], largest first; timeline): each CUDA kernel's device time (each CPU
    op's own time on the CPU) while `run_steps()` takes `steps` steps under torch.profiler (the device synchronised
    after), and on CUDA the device's timeline (`device_timeline`; None on the CPU). A record_function range (the
    optimizer's "Optimizer.step#AdamW.step") also carries device time, that of the kernels inside it: on CUDA it is
    left out, so that the rows add up to the kernels' time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run_steps()
        if device.type == "cuda":
            torch.cuda.synchronize()

    def on_device(evt) -> bool:
        return evt.device_type == torch.autograd.DeviceType.CUDA and not getattr(evt, "is_user_annotation", False)

    rows = []
    for evt in prof.key_averages():
        if device.type == "cuda":
            us = evt.self_device_time_total if on_device(evt) else 0
        else:
            us = evt.self_cpu_time_total
        if us > 0:
            rows.append((us / steps / 1000.0, evt.count / steps, evt.key))
    rows.sort(reverse=True)
    timeline = None
    if device.type == "cuda":
        timeline = device_timeline([(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                                    if on_device(e) and e.time_range.end > e.time_range.start], steps)
    return rows, timeline


def device_timeline(kernels: list[tuple[float, float, str]], steps: int, top: int = 10) -> dict:
    """Where the device's time per step goes, from its kernels' (start us, end us, name) over `steps` steps:
    span (first start to last end), busy (the union of the kernels: some kernel runs), overlap (their sum less
    busy: kernels of two streams at once), idle (span less busy: no kernel runs, the device waits on the host or
    on nothing), and "gaps": the idle time grouped by the kernels on either side of it, [ms per step, gaps per
    step, "before -> after"], largest first (the top `top`). Names are cut to 60 characters."""
    if not kernels:
        return {"span_ms": 0.0, "busy_ms": 0.0, "overlap_ms": 0.0, "idle_ms": 0.0, "gaps": []}
    kernels = sorted(kernels)
    total = sum(end - start for start, end, _ in kernels)
    busy = 0.0
    gaps: dict[str, list[float]] = {}
    run_start, run_end, last = kernels[0][0], kernels[0][1], kernels[0][2]   # the current busy run, its last end
    for start, end, name in kernels[1:]:
        if start > run_end:   # the device idles from run_end to start
            key = f"{last[:60]} -> {name[:60]}"
            gap = gaps.setdefault(key, [0.0, 0])
            gap[0] += start - run_end
            gap[1] += 1
            busy += run_end - run_start
            run_start, run_end, last = start, end, name
        elif end > run_end:
            run_end, last = end, name
    busy += run_end - run_start
    span = run_end - kernels[0][0]   # the last run ends at the latest end
    per_step = 1000.0 * steps
    listed = sorted(([us / per_step, n / steps, key] for key, (us, n) in gaps.items()), reverse=True)[:top]
    return {"span_ms": span / per_step, "busy_ms": busy / per_step, "overlap_ms": (total - busy) / per_step,
            "idle_ms": (span - busy) / per_step, "gaps": listed}


def timeline_table(timeline: dict) -> str:
    """device_timeline's result as a line and a table of its largest idle gaps."""
    t = timeline
    out = [f"device timeline, ms per step: span {t['span_ms']:.2f}, busy {t['busy_ms']:.2f}, "
           f"overlap {t['overlap_ms']:.2f} (kernels of two streams at once), idle {t['idle_ms']:.2f}",
           "| idle ms per step | gaps per step | between |", "|---|---|---|"]
    return "\n".join(out + [f"| {ms:.3f} | {n:g} | {between} |" for ms, n, between in t["gaps"]])


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
          f"{result['step_ms']:.2f} ms per step (wall), {result['issue_ms'][0]:.2f} + {result['issue_ms'][1]:.2f} "
          f"ms to issue its forward + backward from an idle device (host); "
          f"{what} {result['total_ms']:.2f} ms per step in all")
    print(f"| ms per step | calls per step | {what[:-1]} |")
    print("|---|---|---|")
    for ms, calls, name in result["rows"]:
        print(f"| {ms:.3f} | {calls:g} | {name[:110]} |")
    if result["timeline"]:
        print(timeline_table(result["timeline"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
