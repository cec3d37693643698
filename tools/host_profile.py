"""`python -m tools.host_profile [--quant token] [--shape B,H,N,D] [--calls 50] [--top 25] [--busy-ms 20] [--json FILE]`

Where SageBwd's host (CPU) time per causal forward + backward goes: the op's Python, its tensor
allocations, the TMA descriptors of the Gluon kernels, Triton's launcher, autograd. In training the
op is host-heavy (about 2 ms per forward + backward on an H100's host, against cuDNN's 0.5; at 12
layers the step can wait for the host: docs/benchmarks.md, "CUDA graphs in the trainer"), so this
is the measurement to take before cutting that cost, and after.

On CUDA: `sagebwd.attention` called `--calls` times as the model calls it (check_finite=False),
each call issued onto an idle GPU and timed until it returns (benchmarks.attention.host_ms: back
to back, the launch queue would fill and the GPU's time would count as the host's), then again
under cProfile: the top functions by their own time and the cumulative time of the op's stages.
cProfile inflates Python-heavy paths, so the CUDA mode also times, without a profiler, the ways
into the op (breakdown_calls: the public op; its eager path without the input checks; the same
with its launches recorded instead of run, which leaves the project's Python, the allocations and
autograd; the op under torch.compile, the trainer's path through the custom ops; SDPA-cuDNN for
scale), the same while the GPU works through --busy-ms of queued work (busy_breakdown: in training
the op is called on a busy GPU), and the host time of each kernel's launch, the launch signatures and
the TMA descriptors (launch_costs).

Without a GPU: the same op path with the sm90 kernels chosen and every launch recorded instead of
run (tools.offline.recorded_fwd_bwd: Tuning(recorded=..., arch="sm90")), so it
profiles this project's own Python up to the launches (kernel choice, allocations, descriptors,
launch arguments) but not Triton's launcher, the driver or autograd (K's mean is taken inside the quantise
launch, as on the GPU).
Beside it the CPU mode times the autograd paths with Triton's launcher stubbed (cpu_breakdown): the
eager autograd.Function, the registered custom ops, and torch.compile (aot_eager) of the op, whose
differences are the custom ops' dispatch and the compiled wrappers' host time.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from unittest import mock

import torch

# The op's stages as cProfile names them (module path fragment, function): their cumulative time
STAGES = {
    "forward (quantise + kernel)": ("sagebwd/triton/ops.py", "_forward_impl"),
    "backward (preprocess + dQ + dK/dV)": ("sagebwd/triton/ops.py", "_backward_impl"),
    "TMA descriptors (Gluon)": ("sagebwd/triton/hopper.py", "desc"),
    "kernel launches": ("sagebwd/triton/launch.py", "launch"),
}


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        b, h, n, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes B,H,N,D (four integers), not {text!r}") from None
    if min(b, h, n, d) < 1 or d not in (64, 128) or n % 128:
        raise argparse.ArgumentTypeError(f"--shape {text}: head dim 64 or 128 and a sequence that is a multiple "
                                         f"of 128 (the kernels' tiles)")
    return b, h, n, d


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds, not {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _gpu_inputs(shape):
    q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
    return q, k, v, torch.randn_like(q)


def _fwd_bwd(attention, q, k, v, do):
    """call() running attention(q, k, v) forward and backward, the gradients dropped."""
    def call():
        attention(q, k, v).backward(do)
        q.grad = k.grad = v.grad = None
    return call


def call_on_gpu(shape, quant: str):
    """One causal fwd+bwd through the public op as the model calls it (no finiteness check: that one
    waits for the GPU), the gradients dropped (the benchmark's call)."""
    import sagebwd
    return _fwd_bwd(lambda q, k, v: sagebwd.attention(q, k, v, causal=True, quant=quant, check_finite=False),
                    *_gpu_inputs(shape))


def breakdown_calls(shape, quant: str) -> dict:
    """The ways into the op that BREAKDOWN times, each a call() of one causal fwd+bwd on CUDA."""
    import sagebwd
    from sagebwd.triton import attention as eager_op
    from sagebwd.triton.launch import Tuning
    inputs = _gpu_inputs(shape)
    recorded = Tuning(recorded=[])

    def without_launches(q, k, v):
        recorded.recorded.clear()
        return eager_op(q, k, v, True, True, False, 128, 64, quant, tuning=recorded)

    def sdpa(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    public = lambda q, k, v: sagebwd.attention(q, k, v, causal=True, quant=quant, check_finite=False)  # noqa: E731
    return {"public op (sagebwd.attention, as the model calls it)": _fwd_bwd(public, *inputs),
            "eager path, no input checks (sagebwd.triton.attention)":
                _fwd_bwd(lambda q, k, v: eager_op(q, k, v, True, True, False, 128, 64, quant), *inputs),
            "the same, launches recorded instead of run": _fwd_bwd(without_launches, *inputs),
            "torch.compile of the public op (custom ops)": _fwd_bwd(torch.compile(public), *inputs),
            "SDPA-cuDNN, eager": _fwd_bwd(sdpa, *inputs)}


def launch_costs(shape, quant: str, calls: int) -> dict[str, float]:
    """Host us per fwd+bwd spent in each kernel's launch (launch.launch: its signature, then the compiled
    kernel's launcher: TMA descriptor encoding and the driver call), in the signatures alone
    (launch.launch_signature), in any launch that still goes through JITFunction.run (argument binding
    and specialisation, the cache lookup; a signature's first launch), and in building the Gluon kernels'
    TMA descriptors (hopper.desc), timed without a profiler in the public op's calls."""
    from unittest import mock

    from triton.runtime.jit import JITFunction

    from sagebwd.triton import backward, forward, hopper, launch, quantize
    spent: dict[str, float] = {}

    def timed(name_of, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                name = name_of(args)
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    call = call_on_gpu(shape, quant)
    for _ in range(3):
        call()
    patches = [mock.patch.object(module, "launch", timed(lambda args: f"launch {args[0]}", launch.launch))
               for module in (forward, backward, quantize, hopper)]   # each calls the name it imported
    patches += [mock.patch.object(JITFunction, "run", timed(lambda args: f"JITFunction.run {args[0].fn.__name__}",
                                                            JITFunction.run)),
                mock.patch.object(launch, "launch_signature",
                                  timed(lambda args: "launch signatures (launch.launch_signature)",
                                        launch.launch_signature)),
                mock.patch.object(hopper, "desc", timed(lambda args: "TMA descriptors (hopper.desc)", hopper.desc))]
    for patch in patches:
        patch.start()
    try:
        for _ in range(calls):
            torch.cuda.synchronize()   # an idle GPU: no launch waits for room in the queue (as host_ms)
            call()
        torch.cuda.synchronize()
    finally:
        for patch in patches:
            patch.stop()
    return {name: s / calls * 1e6 for name, s in spent.items()}


def breakdown(shape, quant: str, calls: int) -> dict[str, float]:
    """Host ms per fwd+bwd of each of breakdown_calls (no profiler; benchmarks.attention.host_ms: each
    call on an idle GPU, the least of three means)."""
    from benchmarks.attention import host_ms
    return {name: host_ms(call, n=calls, repeats=3) for name, call in breakdown_calls(shape, quant).items()}


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles of torch.cuda._sleep per millisecond, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def busy_breakdown(shape, quant: str, calls: int, busy_ms: float) -> dict[str, float]:
    """Host ms per fwd+bwd of each of breakdown_calls issued while the GPU still works through busy_ms of
    queued work (a torch.cuda._sleep just before each call), as in training, where the GPU is rarely idle
    when the op is called; the least of three means. (The trainer's step gained about four times what the
    idle timing of the direct launches predicted: docs/benchmarks.md, "Launching compiled kernels directly".)"""
    from benchmarks.attention import host_ms
    cycles = int(_sleep_cycles_per_ms() * busy_ms)
    out = {name: host_ms(call, n=calls, repeats=3, before=lambda: torch.cuda._sleep(cycles))
           for name, call in breakdown_calls(shape, quant).items()}
    torch.cuda.synchronize()
    return out


def cpu_breakdown(shape, quant: str, calls: int) -> dict[str, float]:
    """CPU: host ms per causal fwd+bwd (_fwd_bwd: the gradients dropped) of the op's autograd paths,
    with the sm90 kernels chosen and Triton's launcher stubbed out (JITFunction.run does nothing, so each
    launch computes its signature and goes to the stub, as a signature's first launch would; K's mean is
    taken inside the quantise launch, as on a GPU): the eager autograd.Function, the registered custom ops
    (what torch.compile's graph calls), and those under torch.compile with the aot_eager backend
    (AOTAutograd's runtime wrappers, no code generation). Their differences are the custom ops' dispatch and
    the compiled wrappers'."""
    from triton.runtime.jit import JITFunction

    from benchmarks.attention import host_ms
    from sagebwd.triton import attention as eager_op
    from sagebwd.triton import ops, quantize, registry
    q, k, v, do = [torch.randn(*shape).to(torch.bfloat16) for _ in range(4)]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    token = quant == "token"
    eager = lambda q, k, v: eager_op(q, k, v, True, True, False, 128, 64, quant)   # noqa: E731
    paths = {"eager path (autograd.Function)": eager,
             "the custom ops (torch.compile's graph calls them)":
                 lambda q, k, v: ops._forward_op(q, k, v, True, True, False, 128, 64, token, True, "default")[0],
             "torch.compile(backend='aot_eager') of the public op": torch.compile(eager, backend="aot_eager",
                                                                                  fullgraph=True)}
    with mock.patch.object(JITFunction, "run", lambda self, *args, **kwargs: None), \
            mock.patch.object(torch.cuda, "current_device", lambda: 0), \
            mock.patch.object(registry, "arch_of", lambda device: "sm90"), \
            mock.patch.object(quantize, "mean_in_quantise_launch", lambda k, tuning: True):
        # the least of five means: the host's other load only adds
        return {name: host_ms(_fwd_bwd(attention, q, k, v, do), n=calls, repeats=5)
                for name, attention in paths.items()}


def call_recorded(shape, quant: str):
    """The op's own path on the CPU, its sm90 launches recorded instead of run (tools.offline's way)."""
    from tools.offline import recorded_fwd_bwd
    q, k, v, do = [torch.randn(*shape).to(torch.bfloat16) for _ in range(4)]

    def call():
        return [name for name, *_ in recorded_fwd_bwd(q, k, v, do, quant=quant)]
    return call


def stage_ms(stats: pstats.Stats, calls: int) -> dict[str, float]:
    """Cumulative ms per op call of each stage in STAGES (0 where it did not run)."""
    out = {}
    for stage, (path, func) in STAGES.items():
        total = sum(cum for (file, _, name), (_, _, _, cum, _) in stats.stats.items()
                    if name == func and file.replace("\\", "/").endswith(path))
        out[stage] = total / calls * 1e3
    return out


def top_functions(stats: pstats.Stats, calls: int, top: int) -> list[dict]:
    """The `top` functions by their own time: ms per op call, calls per op call, where."""
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return [{"function": name, "where": f"{file}:{line}", "own_ms": own / calls * 1e3,
             "cumulative_ms": cum / calls * 1e3, "calls": n / calls}
            for (file, line, name), (_, n, own, cum, _) in rows]


def profile(shape, quant: str, calls: int, top: int, busy_ms: float = 0.0) -> dict:
    gpu = torch.cuda.is_available()
    call = call_on_gpu(shape, quant) if gpu else call_recorded(shape, quant)
    launches = None
    for _ in range(3):   # compiled kernels, allocator and descriptor caches warm
        launches = call()
    from benchmarks.attention import host_ms
    host = host_ms(call, n=calls)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    if gpu:
        torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    stages = stage_ms(stats, calls)
    return {"device": torch.cuda.get_device_name() if gpu else "cpu (launches recorded, not run)",
            "shape": list(shape), "quant": quant, "calls": calls, "host_ms_per_call": host,
            "launches": launches, "stages_ms": stages, "top": top_functions(stats, calls, top),
            "breakdown_ms": breakdown(shape, quant, calls) if gpu else cpu_breakdown(shape, quant, calls),
            "launch_us": launch_costs(shape, quant, calls) if gpu else {},
            "busy_ms": busy_ms if gpu else 0.0,
            "breakdown_busy_ms": busy_breakdown(shape, quant, calls, busy_ms) if gpu and busy_ms > 0 else {}}


def print_report(report: dict) -> None:
    print(f"{report['device']}: {report['quant']} contract, causal fwd+bwd at {tuple(report['shape'])}, "
          f"{report['calls']} calls: {report['host_ms_per_call']:.3f} ms of host time per call"
          + (f"; launches {report['launches']}" if report["launches"] else ""))
    if report["breakdown_ms"]:
        busy = report.get("breakdown_busy_ms") or {}
        title = f" | the same, GPU busy for {report['busy_ms']:g} ms" if busy else ""
        print(f"\n| way into the op (no profiler) | host ms per fwd+bwd{title} |\n|---|---|" + ("---|" if busy else ""))
        for name, ms in report["breakdown_ms"].items():
            print(f"| {name} | {ms:.3f} |" + (f" {busy[name]:.3f} |" if name in busy else ""))
    if report["launch_us"]:
        print("\n| launch or descriptors (no profiler) | host us per fwd+bwd |\n|---|---|")
        for name, us in report["launch_us"].items():
            print(f"| {name} | {us:.1f} |")
    print("\n| stage | ms per call (cProfile, cumulative) |\n|---|---|")
    for stage, ms in report["stages_ms"].items():
        print(f"| {stage} | {ms:.3f} |")
    print("\n| function | own ms per call | cumulative ms | calls per call | where |\n|---|---|---|---|---|")
    for row in report["top"]:
        print(f"| {row['function']} | {row['own_ms']:.3f} | {row['cumulative_ms']:.3f} | {row['calls']:g} | "
              f"{row['where']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.host_profile", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quant", choices=["block", "token"], default="token")
    ap.add_argument("--shape", type=_shape, default=(4, 12, 4096, 64),
                    help="B,H,N,D (default: gpu-124m's attention at seq 4096, micro-batch 4)")
    ap.add_argument("--calls", type=_positive, default=50)
    ap.add_argument("--top", type=_positive, default=25)
    ap.add_argument("--busy-ms", type=_non_negative, default=20.0,
                    help="on CUDA, also time each way into the op while the GPU works through this many ms "
                         "queued before each call, as in training (default 20; 0: skip)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    report = profile(args.shape, args.quant, args.calls, args.top, args.busy_ms)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
