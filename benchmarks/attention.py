"""Benchmark (and GPU correctness check) of the SageBwd Triton kernels against torch SDPA.

    python -m benchmarks.attention [--json PATH] [--check] [--kernel-times] [--sweep] [--diagnose] [--quick]
                                   [--once] [--kernels CHOICE] [--quant block token]
                                   [--baselines FLASH CUDNN EFFICIENT FA4 CUDNN-FP8] [--check-baselines]

Benchmark: forward, backward and forward+backward of SageBwd and of the baselines
(benchmarks/baselines.py): torch SDPA with the FLASH_ATTENTION (FA2), CUDNN_ATTENTION and
EFFICIENT_ATTENTION backends, and, where their packages import, FlashAttention-4 (FA4, bf16) and
cuDNN's FP8 attention (CUDNN-FP8, nvidia-cudnn-frontend; head dim 128 on Hopper), every column by
default ("not installed" / "unsupported" in its cells otherwise); bf16 inputs; median of
triton.testing.do_bench on random inputs; TFLOPS-equivalent by FlashAttention's convention
(forward 4 B H N^2 D, half when causal; backward 2.5x forward); peak memory of one fwd+bwd.
--check: kernels vs the simulation at real sizes (tests/kernel_checks.py's check_case: relative
L2 of O, dQ, dK, dV, every output element written, 50 reruns bit-identical), the error
against full precision next to the simulation's (the sigma table in docs/sagebwd.md), and every
column's O, dQ, dK, dV against fp64 attention (rel-L2; --check-baselines: that part alone).
--kernels: which kernels run (sagebwd.triton.registry; default: the table's defaults).
--sweep: times (num_warps, num_stages) per kernel, and the dK/dV block shape, at the target shapes.
--kernel-times: per-kernel milliseconds of one forward+backward (torch.profiler).
Also prints registers, spills and whether the INT8 dots compiled to wgmma, per kernel.
Run from the repository root (it imports the tests' reference checks).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch

from benchmarks import baselines

SHAPES = [(8, 16, 4096, 64), (8, 8, 4096, 128), (2, 16, 16384, 64)]
# The baseline columns (benchmarks/baselines.py; --baselines picks; by default every one).
BASELINES = baselines.DEFAULT
# SageBwd under each quantisation contract: "sage" is the paper's ("block"), "sage-token" the
# per-token one; --quant picks which the benchmark times.
SAGE_IMPLS = {"block": "sage", "token": "sage-token"}
# "fwd+bwd graph": one fwd+bwd captured in a CUDA graph and replayed, every column alike: the GPU's time without the
# host's launch work, which for SageBwd's eager call (~2 ms a fwd+bwd on the lent H200s' hosts) can reach the
# d=128 rows' GPU time and then sets the eager "fwd+bwd" row (`host_ms`); the trainer runs the op that way
# (train.compile_mode reduce-overhead).
MODES = ("fwd", "bwd", "fwd+bwd", "fwd+bwd graph")
# The run's kernel choice (--kernels), set once by main(): this tool's setting, not the package's.
RUN = {"kernels": "default"}


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend
    return {"FLASH": SDPBackend.FLASH_ATTENTION, "CUDNN": SDPBackend.CUDNN_ATTENTION,
            "EFFICIENT": SDPBackend.EFFICIENT_ATTENTION}[name]


def attention_fn(impl: str, causal: bool, tuning=None):
    """A callable (q, k, v) -> o for 'sage' ('block' contract), 'sage-token' or an SDPA backend name;
    `tuning` (sagebwd.triton.launch.Tuning): the sweep's launch settings."""
    import sagebwd
    if impl in SAGE_IMPLS.values():
        quant = "token" if impl == "sage-token" else "block"
        if tuning is not None:
            from sagebwd.triton import attention
            return lambda q, k, v: attention(q, k, v, causal, True, False, 128, 64, quant, kernels=RUN["kernels"],
                                             tuning=tuning)
        return lambda q, k, v: sagebwd.attention(q, k, v, causal=causal, quant=quant, backend="triton",
                                                 check_finite=False, kernels=RUN["kernels"])

    from torch.nn.attention import sdpa_kernel
    backend = _sdpa_backend(impl)

    def run(q, k, v):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def flops(shape, causal: bool, mode: str) -> float:
    b, h, n, d = shape
    fwd = 4.0 * b * h * n * n * d / (2 if causal else 1)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd, "fwd+bwd graph": 3.5 * fwd}[mode]


def host_ms(step, leaves=(), n: int = 20, repeats: int = 1, before=None) -> float:
    """Host (CPU) milliseconds to issue one call of step: each call starts on an idle GPU
    (synchronised before, not after; without CUDA there is nothing to wait for) and is timed until
    it returns, the least over `repeats` of the mean of n calls. Back to back, a GPU slower than
    the host fills the launch queue and the host then waits inside the launches, counting the GPU's
    time as its own (tools.host_profile times the same way). Near or above the GPU time the call is launch-bound: the GPU idles between
    kernels, and timings swing with the host's speed (the d=128 fwd+bwd rows that once read 2x
    their kernels' sum). before: run after each synchronisation, untimed (tools.host_profile queues GPU
    work there, so that the call is issued onto a busy GPU)."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(3):
        step()
    best = float("inf")
    for _ in range(repeats):
        spent = 0.0
        for _ in range(n):
            for t in leaves:
                t.grad = None
            synchronize()
            if before is not None:
                before()
            start = time.perf_counter()
            step()
            spent += time.perf_counter() - start
        best = min(best, spent / n * 1e3)
    synchronize()
    return best


def time_impl(impl: str, shape, causal: bool, mode: str, tuning=None) -> dict:
    """Median milliseconds of one mode, plus the host time and peak memory of one forward+backward.
    impl: a SageBwd contract ('sage', 'sage-token') or a baseline column (benchmarks/baselines.py);
    an optional column that does not run here returns its cell ("not installed", "unsupported")."""
    b, h, n, d = shape
    optional = impl in baselines.OPTIONAL
    if optional:
        skip = baselines.skip_cell(impl, shape, torch.cuda.get_device_capability())
        if skip:
            return skip
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    if not optional:
        return time_runner(baselines.AutogradRunner(attention_fn(impl, causal, tuning), q, k, v, do), shape, causal,
                           mode)
    try:   # layouts, FP8 casts, graph builds: before the timing
        runner = baselines.make_runner(impl, q, k, v, do, causal, mode)
    except Exception as err:  # noqa: BLE001  (an optional column must not stop the table)
        return baselines.failed_cell(err)
    del q, k, v, do
    cell = time_runner(runner, shape, causal, mode, catch=(Exception,))
    if hasattr(runner, "info"):
        cell[impl.lower()] = runner.info()
    return cell


def time_runner(runner, shape, causal: bool, mode: str, catch=(RuntimeError,)) -> dict:
    """Time one mode of a runner (benchmarks/baselines.py: forward(), backward_step(), step()):
    fwd is a forward without grad, bwd the backward of a kept forward, fwd+bwd the two, "fwd+bwd graph" the two
    replayed from a CUDA graph (MODES)."""
    import triton
    grads = list(runner.leaves)
    try:
        if mode == "fwd":
            ms = triton.testing.do_bench(runner.forward, return_mode="median")
        elif mode == "bwd":
            ms = triton.testing.do_bench(runner.backward_step(), grad_to_none=grads, return_mode="median")
        elif mode == "fwd+bwd graph":
            if not isinstance(runner, baselines.AutogradRunner):   # cuDNN FP8's graphs run on their handle's stream
                return baselines.failed_cell(NotImplementedError(f"{type(runner).__name__} is not captured"))
            ms = triton.testing.do_bench(captured(runner.step, grads)[0].replay, return_mode="median")
        else:
            ms = triton.testing.do_bench(runner.step, grad_to_none=grads, return_mode="median")
    except catch as err:   # e.g. a backend that does not take this shape
        return baselines.failed_cell(err)
    out = {"ms": ms, "tflops": flops(shape, causal, mode) / ms * 1e-9}
    if mode == "fwd+bwd":
        out["host_ms"] = host_ms(runner.step, runner.leaves)
        out["peak_mib"] = runner.peak_mib()
    return out


def model_layout_step(impl: str, shape, causal: bool = True):
    """(step, leaf): one fwd+bwd as the model runs it (model/attention.py): q, k, v views of one
    (B, N, 3*H*D) qkv projection split along its last dim, the output reshaped to (B, N, H*D);
    the reshapes and the joined qkv gradient (PyTorch copies outside the attention op) included.
    leaf is the projection, whose .grad the caller resets."""
    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, n, 3 * h * d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(b, n, h * d, device="cuda", dtype=torch.bfloat16, generator=gen)
    fn = attention_fn(impl, causal)

    def step():
        q, k, v = (t.view(b, n, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
        fn(q, k, v).transpose(1, 2).reshape(b, n, h * d).backward(grad)
    return step, qkv


def time_model_layout(impl: str, shape) -> float:
    """Median ms of one causal fwd+bwd in the model's layout (model_layout_step)."""
    import triton
    step, qkv = model_layout_step(impl, shape)
    return triton.testing.do_bench(step, grad_to_none=[qkv], return_mode="median")


GRAPH_SHAPES = [(2, 4, 1024, 128), (4, 8, 2048, 64), (8, 8, 4096, 128)]


def graph_vs_eager(shapes=GRAPH_SHAPES) -> list[dict]:
    """One causal fwd+bwd of SageBwd run eagerly, under torch.compile (the registered custom ops)
    and replayed from a CUDA graph (same inputs): the graph removes the host's launch work, which
    at small shapes is most of an eager call (`host_ms`); the compiled and replayed outputs must
    equal the eager ones bit for bit (tests/kernel_checks.py's graph_and_compiled)."""
    import triton
    from tests.kernel_checks import graph_and_compiled
    rows = []
    for shape in shapes:
        run = graph_and_compiled(shape, RUN["kernels"])
        step, compiled_step, graph = run["step"], run["compiled_step"], run["graph"]
        row = {"shape": list(shape), "eager_ms": triton.testing.do_bench(step, return_mode="median"),
               "graph_ms": triton.testing.do_bench(graph.replay, return_mode="median"),
               "host_ms": host_ms(step, ()),
               "compiled_ms": triton.testing.do_bench(compiled_step, return_mode="median"),
               "compiled_host_ms": host_ms(compiled_step, ()),
               "identical": run["identical"], "compiled_identical": run["compiled_identical"]}
        print(f"cuda graph {tuple(shape)} causal fwd+bwd: eager {row['eager_ms']:.3f} ms (host {row['host_ms']:.3f}),"
              f" torch.compile {row['compiled_ms']:.3f} ms (host {row['compiled_host_ms']:.3f}),"
              f" graph replay {row['graph_ms']:.3f} ms, outputs identical: {row['identical']} (compiled:"
              f" {row['compiled_identical']})", flush=True)
        rows.append(row)
        del run, graph
    return rows


def model_layout_table(shapes) -> list[dict]:
    rows = []
    for shape in shapes:
        row = {"shape": list(shape), **{impl: time_model_layout(impl, shape) for impl in ("sage", "FLASH", "CUDNN")}}
        rows.append(row)
        print(f"model layout {tuple(shape)} causal fwd+bwd: " + ", ".join(f"{k} {row[k]:.3f} ms"
                                                                       for k in ("sage", "FLASH", "CUDNN")),
              flush=True)
    return rows


def benchmark(shapes, quick: bool, sage_impls=tuple(SAGE_IMPLS.values()), columns=BASELINES) -> list[dict]:
    rows = []
    for shape in shapes:
        for causal in (True, False):
            for mode in MODES:
                row = {"shape": list(shape), "causal": causal, "mode": mode}
                for impl in tuple(sage_impls) + tuple(columns):
                    row[impl] = time_impl(impl, shape, causal, mode)
                rows.append(row)
                print(_format_row(row), flush=True)
            if quick:
                break
    return rows


def _columns(row) -> tuple[list, list]:
    """The SageBwd contracts and the baseline columns a row has, in the table's order."""
    return ([i for i in SAGE_IMPLS.values() if i in row], [b for b in baselines.BASELINES if b in row])


def _format_row(row) -> str:
    sages, bases = _columns(row)

    def cell(r):
        if r.get("ms"):
            return f"{r['ms']:8.3f} ms {r['tflops']:6.1f}"
        return f"{baselines.cell_text(r):>18}"

    def ratios(sage):
        return " ".join(f"{sage.get('ms') and row[b].get('ms') and row[b]['ms'] / sage['ms'] or float('nan'):5.2f}x"
                        for b in bases)
    host = ""
    if row["mode"] == "fwd+bwd":
        host = " | host ms " + "/".join(f"{row[i]['host_ms']:.2f}" if row[i].get("host_ms") else "n/a"
                                        for i in (*sages, *bases))
        if any(row[i].get("host_ms") and row[i].get("ms") and row[i]["host_ms"] > 0.8 * row[i]["ms"] for i in sages):
            host += " (sage near launch-bound: its GPU time depends on the host)"
    return (f"{str(tuple(row['shape'])):20} {'causal' if row['causal'] else 'full':6} {row['mode']:8}"
            + "".join(f" | {i} {cell(row[i])}" for i in sages) + " | "
            + " | ".join(f"{b} {cell(row[b])}" for b in bases)
            + "".join(f" | {i} speed-up vs {'/'.join(bases)}: {ratios(row[i])}" for i in sages) + host)


def markdown_table(rows) -> str:
    """One line per (shape, mask, pass): each contract's ms and TFLOPS, each baseline column's ms
    (or "not installed" / "unsupported"), each contract's speed-up over every baseline but
    EFFICIENT (baseline ms / SageBwd ms), peak MiB of one fwd+bwd (contracts, then those baselines)."""
    sages, bases = _columns(rows[0]) if rows else ([], [])
    ratio_bases = [b for b in bases if baselines.BASELINES[b].ratio]
    label = {v: f"SageBwd {k}" for k, v in SAGE_IMPLS.items()}
    head = ["(B,H,N,D)", "mask", "pass"]
    for i in sages:
        head += [f"{label[i]} ms", "TFLOPS"]
    head += [f"{b} ms" for b in bases]
    for i in sages:
        head += [f"{label[i]} ×{b}" if j == 0 else f"×{b}" for j, b in enumerate(ratio_bases)]
    head.append("peak MiB " + " / ".join([label[i].split()[-1] for i in sages] + [b.lower() for b in ratio_bases]))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        def ratio(b, s):
            return f"{r[b]['ms'] / s['ms']:.2f}" if r[b].get("ms") and s.get("ms") else "n/a"

        def peak(i):
            return f"{r[i]['peak_mib']:.0f}" if r[i].get("peak_mib") is not None else "n/a"
        cells = [str(tuple(r["shape"])), "causal" if r["causal"] else "full", r["mode"]]
        for i in sages:
            cells += [baselines.cell_text(r[i]), f"{r[i].get('tflops', 0):.0f}"]
        cells += [baselines.cell_text(r[b]) for b in bases]
        for i in sages:
            cells += [ratio(b, r[i]) for b in ratio_bases]
        cells.append(" / ".join(peak(i) for i in (*sages, *ratio_bases)) if r["mode"] == "fwd+bwd" else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# correctness at real sizes


from tests.kernel_checks import (DQ_RERUN_TOLERANCE, TOLERANCE, captured, check_case,  # noqa: E402,F401
                                 cpu as _cpu, rel as _rel, simulate_on_cpu)


def sigma_case(sigma: float, causal: bool, seq=1024, head_dim=64, heads=4, quant="block") -> dict:
    """Error against full precision for kernel and simulation on the same bf16 inputs."""
    from sagebwd import fpa_attention, simulate
    from sagebwd.triton import attention
    gen = torch.Generator(device="cuda").manual_seed(7)
    shape = (1, heads, seq, head_dim)
    q, k = [(sigma * torch.randn(*shape, device="cuda", generator=gen)).bfloat16() for _ in range(2)]
    v, do = [torch.randn(*shape, device="cuda", generator=gen).bfloat16() for _ in range(2)]
    qg, kg, vg = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention(qg, kg, vg, causal, True, False, 128, 64, quant, kernels=RUN["kernels"])
    kernel = (o, *torch.autograd.grad(o, (qg, kg, vg), do))
    cfg = simulate.SageConfig(causal=causal, quant=quant)
    o_cpu, saved = simulate.forward(*_cpu(q, k, v), cfg)
    sim = (o_cpu, *simulate.backward(saved, do.cpu(), cfg))
    ref = fpa_attention(q.double(), k.double(), v.double(), do.double(), causal=causal)
    refs = [t.cpu() for t in (ref.o, ref.dq, ref.dk, ref.dv)]
    kernel = [t.cpu() for t in kernel]
    names = ("o", "dq", "dk", "dv")
    return {"sigma": sigma, "causal": causal, "seq": seq, "quant": quant,
            "kernel_vs_fpa": {n: _rel(a, r) for n, a, r in zip(names, kernel, refs)},
            "sim_vs_fpa": {n: _rel(a, r) for n, a, r in zip(names, sim, refs)}}


def fp32_gap(shape, dtype, causal: bool) -> dict:
    """Kernel vs simulation before the outputs are rounded to 16 bits (kernels run with fp32
    outputs, the simulation on fp32 copies of the same 16-bit inputs): how far apart the two
    computations really are, and how much of the 16-bit gap is the final rounding."""
    from sagebwd import simulate
    from sagebwd.triton import backward as kb, forward as kf, quantize as kq
    gen = torch.Generator(device="cuda").manual_seed(99)
    q, k, v, do = [torch.randn(*shape, device="cuda", generator=gen).to(dtype) for _ in range(4)]
    k_mean = kq.sequence_mean(k)
    q8, q8t, s_q, _ = kq.quantize_blocks(q, 128, cols=True)
    k8, k8t, s_k, _ = kq.quantize_blocks(k, 64, mean=k_mean, cols=True)
    _, v8t, s_v, _ = kq.quantize_blocks(v, 64, rows=False, cols=True)
    o32, lse = kf.forward(q8, k8, v8t, s_q, s_k, s_v, out_dtype=torch.float32, causal=causal, smooth_k=True,
                          block_q=128, block_kv=64, kernels=RUN["kernels"])
    o16 = o32.to(dtype)
    pre = kq.backward_preprocess(do, o16, lse, 128)
    grads32 = kb.backward(do, pre.delta, pre.do8t, pre.s_do, q8, q8t, s_q, k8, k8t, s_k, v, pre.lse2, causal=causal,
                          smooth_k=True, block_q=128, block_kv=64, out_dtype=torch.float32, kernels=RUN["kernels"])
    cfg = simulate.SageConfig(causal=causal)
    o_sim, grads_sim = simulate_on_cpu(q.float(), k.float(), v.float(), do.float(), o16.float(), cfg)
    o32, grads32 = o32.cpu(), [g.cpu() for g in grads32]
    names = ("o", "dq", "dk", "dv")
    out = {"shape": list(shape), "dtype": str(dtype).split(".")[-1], "causal": causal,
           "fp32": {n: _rel(a, b) for n, a, b in zip(names, (o32, *grads32), (o_sim, *grads_sim))},
           "rounded": {n: _rel(a.to(dtype), b.to(dtype)) for n, a, b in zip(names, (o32, *grads32),
                                                                             (o_sim, *grads_sim))}}
    print(f"fp32 gap {tuple(shape)} {out['dtype']} causal={causal}: "
          + " ".join(f"{n} {out['fp32'][n]:.2e}->{out['rounded'][n]:.2e}" for n in names), flush=True)
    return out


def diagnose(shape=(1, 2, 4096, 64), dtype=torch.bfloat16, causal=False) -> dict:
    """Where the kernel and the simulation part: the INT8 operands, the LSE, O per row, and O
    with the compiler's fp contraction (a*b+c -> fma) switched off."""
    from sagebwd import simulate
    from sagebwd.triton import _common, forward as kf, quantize as kq
    from sagebwd.triton.launch import Tuning
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = [torch.randn(*shape, device="cuda", generator=gen).to(dtype) for _ in range(3)]
    cfg = simulate.SageConfig(causal=causal)
    o_sim, saved = simulate.forward(*_cpu(q.float(), k.float(), v.float()), cfg)
    v_hat_sim, s_v_sim = [t.cuda() for t in simulate.quantize_row_blocks(v.float().cpu(), 64)]
    o_sim, saved = o_sim.cuda(), simulate.Saved(*[t.cuda() if t is not None else None for t in saved])
    k_mean = kq.sequence_mean(k)
    q8, _, s_q, _ = kq.quantize_blocks(q, 128)
    k8, _, s_k, _ = kq.quantize_blocks(k, 64, mean=k_mean)
    _, v8t, s_v, _ = kq.quantize_blocks(v, 64, rows=False, cols=True)
    out = {"q8_mismatch": int((q8.float() != saved.q_hat).sum()), "k8_mismatch": int((k8.float() != saved.k_hat).sum()),
           "v8_mismatch": int((_common.from_k_order(v8t).transpose(-1, -2).float() != v_hat_sim).sum()),
           "s_q_equal": bool(torch.equal(s_q, saved.s_q)), "s_k_equal": bool(torch.equal(s_k, saved.s_k)),
           "s_v_equal": bool(torch.equal(s_v, s_v_sim)),
           "k_mean_maxdiff": float((k_mean.view(shape[0], shape[1], -1).cpu() - k.float().cpu().mean(-2)).abs().max())}
    for label, override in (("default", {}), ("no_fma", {"enable_fp_fusion": False})):
        o32, lse = kf.forward(q8, k8, v8t, s_q, s_k, s_v, out_dtype=torch.float32, causal=causal, smooth_k=True,
                              block_q=128, block_kv=64, kernels="triton", tuning=Tuning({"forward": override}))
        row_err = ((o32 - o_sim).norm(dim=-1) / o_sim.norm(dim=-1)).flatten()
        out[label] = {"o_rel": _rel(o32, o_sim), "lse_maxdiff": float((lse - saved.lse).abs().max()),
                      "rows_err_gt_1e-5": int((row_err > 1e-5).sum()), "rows": row_err.numel(),
                      "row_err_max": float(row_err.max()), "row_err_median": float(row_err.median())}
    print("diagnose", out, flush=True)
    return out


def check_correctness(quick: bool, quants=("block", "token")) -> dict:
    cases = [((2, 4, 4096, 64), torch.bfloat16, True, False), ((2, 4, 4096, 64), torch.bfloat16, False, False),
             ((2, 2, 4096, 128), torch.bfloat16, True, False), ((2, 2, 4096, 128), torch.float16, False, True),
             ((1, 4, 4096, 64), torch.float16, True, True), ((1, 1, 16384, 64), torch.bfloat16, True, False)]
    extra = [((1, 4, 2048, 64), torch.bfloat16, True, False, 64, 64),
             ((1, 4, 2048, 128), torch.bfloat16, False, False, 128, 128)]
    if quick:
        cases, extra = cases[:1], []
    runs = [(case, quant) for quant in quants for case in cases + extra]
    results, ok = [], True
    for case, quant in runs:
        r = check_case(*case[:4], *case[4:], quant=quant, kernels=RUN["kernels"])
        tol = TOLERANCE[r["dtype"]]
        r["pass"] = (r["all_written"] and r["reproducible"]
                     and all(e <= tol for e in r["rel_l2_vs_sim"].values()))
        ok &= r["pass"]
        results.append(r)
        errs = " ".join(f"{k} {e:.2e}" for k, e in r["rel_l2_vs_sim"].items())
        print(f"check {r['quant']} {tuple(r['shape'])} {r['dtype']} causal={r['causal']} smooth_q={r['smooth_q']} "
              f"blocks={r['blocks']}: {errs} written={r['all_written']} "
              f"deterministic={r['identical_over_50_reruns']} fused={r['fused_backward']} "
              f"rerun dQ {r['rerun_rel_l2']['dq']:.1e} -> {'PASS' if r['pass'] else 'FAIL'}", flush=True)
        torch.cuda.empty_cache()
    sigmas = [] if quick else [sigma_case(s, c, quant=qt) for qt in quants for s in (1.0, 5.0) for c in (True, False)]
    for s in sigmas:
        print(f"sigma {s['quant']} {s['sigma']} causal={s['causal']}: kernel vs FPA "
              + " ".join(f"{k} {e:.4f}" for k, e in s["kernel_vs_fpa"].items()) + " | sim vs FPA "
              + " ".join(f"{k} {e:.4f}" for k, e in s["sim_vs_fpa"].items()), flush=True)
    return {"cases": results, "sigma": sigmas, "pass": ok}


ACCURACY_SHAPES = [(1, 8, 4096, 64), (1, 8, 4096, 128)]


def baseline_accuracy(impls, quick: bool = False, shapes=ACCURACY_SHAPES) -> dict:
    """Each column's O, dQ, dK, dV against fp64 attention (sagebwd.fpa_attention) on the same bf16
    inputs (std 1), rel-L2. A baseline with a tolerance (benchmarks/baselines.py: 2e-2 for bf16,
    0.25 for FP8: they catch a wrong layout, mask or scale, not rounding) fails above it; the
    SageBwd contracts are reported only (their checks are check_correctness's). A column that is
    not installed or does not take the shape is skipped, one that raises fails."""
    from sagebwd import fpa_attention
    capability = torch.cuda.get_device_capability()
    names = ("o", "dq", "dk", "dv")
    rows, ok = [], True
    for shape in (shapes[-1:] if quick else shapes):
        for causal in ((True,) if quick else (True, False)):
            b, h, n, d = shape
            gen = torch.Generator(device="cuda").manual_seed(11)
            q, k, v, do = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for _ in range(4)]
            ref = fpa_attention(q.double(), k.double(), v.double(), do.double(), causal=causal)
            refs = (ref.o, ref.dq, ref.dk, ref.dv)
            del ref
            for impl in impls:
                row = {"impl": impl, "shape": list(shape), "causal": causal}
                tol = baselines.BASELINES[impl].tolerance if impl in baselines.BASELINES else None
                skip = baselines.skip_cell(impl, shape, capability) if impl in baselines.OPTIONAL else None
                if skip:
                    row.update(skip, passed=None)
                else:
                    try:
                        if impl in baselines.OPTIONAL:
                            runner = baselines.make_runner(impl, q, k, v, do, causal)
                        else:
                            runner = baselines.AutogradRunner(attention_fn(impl, causal), q, k, v, do)
                        outs = runner.outputs()
                        row["rel_l2"] = {nm: _rel(a, r) for nm, a, r in zip(names, outs, refs)}
                        row["tolerance"] = tol
                        row["passed"] = tol is None or all(e <= tol for e in row["rel_l2"].values())
                        if hasattr(runner, "info"):
                            row[impl.lower()] = {**runner.info(), "amax_check": runner.amax_check}
                        del runner, outs
                    except Exception as err:  # noqa: BLE001
                        row.update(baselines.failed_cell(err))
                        row["passed"] = None if row["status"] == baselines.UNSUPPORTED else False
                ok &= row["passed"] is not False
                rows.append(row)
                errs = " ".join(f"{nm} {e:.2e}" for nm, e in row["rel_l2"].items()) if "rel_l2" in row \
                    else f"{row.get('status')}: {row.get('error')}"
                verdict = {True: "PASS", False: "FAIL", None: "skipped"}[row["passed"]]
                print(f"accuracy {impl} {tuple(shape)} causal={causal} vs fp64: {errs}"
                      + (f" (bound {tol:g})" if tol is not None and "rel_l2" in row else "") + f" -> {verdict}",
                      flush=True)
                torch.cuda.empty_cache()
            del refs
    return {"rows": rows, "pass": ok}


def accuracy_table(rows) -> str:
    """The columns' rel-L2 against fp64 attention (baseline_accuracy), one line per column and case."""
    label = {v: f"SageBwd {k}" for k, v in SAGE_IMPLS.items()}
    lines = ["| column | (B,H,N,D) | mask | O | dQ | dK | dV | bound | result |", "|" + "---|" * 9]
    for r in rows:
        errs = [f"{r['rel_l2'][n]:.1e}" for n in ("o", "dq", "dk", "dv")] if "rel_l2" in r \
            else [r.get("status", "n/a")] * 4
        bound = f"{r['tolerance']:g}" if r.get("tolerance") is not None else "-"
        verdict = {True: "pass" if r.get("tolerance") is not None else "reported", False: "FAIL",
                   None: r.get("status", "skipped")}[r["passed"]]
        lines.append(f"| {label.get(r['impl'], r['impl'])} | {tuple(r['shape'])} | {'causal' if r['causal'] else 'full'} | "
                     + " | ".join(errs) + f" | {bound} | {verdict} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# diagnostics and launch-setting sweep


def kernel_report(quants=("block",)) -> dict:
    """Registers, spills, shared memory and INT8 wgmma counts of the kernels of one causal fwd+bwd at
    each target shape (the last shape's, per launch name and contract)."""
    from sagebwd.triton import attention
    from sagebwd.triton.launch import Tuning
    compiled = {}
    for quant in quants:
        tuning = Tuning(compiled={})
        for shape in SHAPES[:2]:
            q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
            attention(q, k, v, True, quant=quant, kernels=RUN["kernels"], tuning=tuning).backward(torch.randn_like(q))
        compiled.update({name if quant == "block" else f"{name} ({quant})": kernel
                         for name, kernel in tuning.compiled.items()})
    report = {}
    for name, kernel in compiled.items():
        ptx = kernel.asm.get("ptx", "")
        report[name] = {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
                        "shared": kernel.metadata.shared if hasattr(kernel.metadata, "shared") else None,
                        "wgmma_s8": ptx.count(".s32.s8.s8"), "wgmma_bf16": ptx.count(".f32.bf16.bf16"),
                        "mma_sync_s8": ptx.count("mma.sync.aligned") if "wgmma" not in ptx else 0,
                        "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages}
        print(f"kernel {name}: {report[name]}", flush=True)
    return report


SWEEP = {
    # (kernel, head_dim): settings (maxnreg 0 = the compiler's choice)
    # dkdv: (rows, cols, split_d, chain, num_warps, num_stages, maxnreg, separate dV/dK launches)
    ("dkdv", 128): [(128, 128, 2, 0, 8, 2, 0, 0), (128, 128, 1, 0, 8, 2, 0, 1), (128, 128, 2, 0, 8, 2, 0, 1),
                    (128, 128, 1, 0, 8, 3, 0, 1), (64, 128, 1, 0, 4, 2, 0, 1)],
    ("dkdv", 64): [(64, 64, 1, 1, 4, 2, 0, 0), (64, 64, 1, 1, 4, 2, 0, 1), (128, 64, 1, 1, 8, 3, 0, 0),
                   (64, 128, 1, 0, 4, 2, 0, 0), (64, 128, 1, 0, 4, 2, 0, 1), (128, 128, 1, 0, 8, 2, 0, 0),
                   (128, 128, 1, 0, 8, 2, 0, 1)],
    # dv, dk (d=128's two dK/dV launches): (num_warps, num_stages, maxnreg)
    ("dv", 128): [(8, 3, 0), (8, 4, 0), (8, 2, 0), (8, 2, 128)],
    ("dk", 128): [(8, 2, 0), (8, 1, 0)],
    # dq: (num_warps, num_stages, maxnreg)
    ("dq", 128): [(8, 3, 0), (8, 2, 128)],
    ("dq", 64): [(4, 3, 0), (8, 3, 128), (8, 2, 128)],
    # forward: (rows, num_warps, num_stages, maxnreg)
    ("forward", 128): [(64, 4, 3, 0), (64, 4, 4, 0), (64, 4, 2, 0), (128, 8, 3, 0), (128, 8, 2, 0), (64, 4, 3, 168)],
    ("forward", 64): [(64, 4, 3, 128), (64, 4, 4, 128), (64, 4, 2, 128), (64, 4, 3, 0), (128, 8, 3, 0),
                      (128, 8, 2, 0)],
}


def sweep(shapes, kernels=("dkdv", "dv", "dk", "dq", "forward"), impl: str = "sage") -> list[dict]:
    """Time each kernel's launch settings (and the dK/dV kernel's block shape) at the target shapes.

    Each variant changes one kernel; the pass that contains it is timed (bwd for dq/dkdv, fwd
    for the forward). The defaults in sagebwd/triton come from this table (docs/kernel-notes.md).
    impl: "sage" (the block contract; time it with --kernels triton for the Triton kernels) or
    "sage-token" (Triton kernels on every GPU; its dK/dV slices are whole q blocks, so the cols
    of a dkdv variant do not apply there).
    """
    from sagebwd.triton.launch import Tuning
    out = []
    for shape in shapes:
        d = shape[-1]
        for (kernel, head_dim), variants in SWEEP.items():
            if head_dim != d or kernel not in kernels:
                continue
            for variant in variants:
                overrides = {}
                maxnreg = 0
                if kernel == "dkdv":
                    rows, cols, split_d, chain, warps, stages, maxnreg, separate = variant
                    overrides["dkdv_blocks"] = dict(rows=rows, cols=cols, split_d=split_d, chain=chain,
                                                    separate=separate)
                elif kernel == "forward":
                    rows, warps, stages, maxnreg = variant
                    overrides["forward_rows"] = rows
                else:
                    warps, stages, maxnreg = variant
                # maxnreg 0: no cap, also where the kernel's default sets one (None removes it)
                overrides[kernel] = dict(num_warps=warps, num_stages=stages, maxnreg=maxnreg or None)
                mode = "fwd" if kernel == "forward" else "bwd"
                try:   # the Triton kernels: the settings swept are theirs
                    r = time_impl(impl, shape, True, mode, Tuning(overrides))
                except Exception as err:  # noqa: BLE001  (e.g. out of shared memory)
                    r = {"ms": None, "error": str(err).splitlines()[0][:200]}
                out.append({"shape": list(shape), "impl": impl, "kernel": kernel, "variant": list(variant),
                            "mode": mode, **r})
                print(f"sweep {impl} {tuple(shape)} causal {mode} {kernel} {variant}: {r.get('ms')}", flush=True)
    return out


def profiled_ms(step, iters: int, warmup: int = 2) -> dict[str, float]:
    """Milliseconds per call of `step` spent in each CUDA kernel (torch.profiler), after `warmup` calls."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    times = {}
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if total:
            times[evt.key] = total / iters / 1000.0
    return times


def kernel_times(shape, causal: bool = True, iters: int = 5, layout: str = "contiguous", impl: str = "sage") -> dict:
    """Milliseconds per fwd+bwd spent in each CUDA kernel (torch.profiler), SageBwd only; layout
    "model" profiles model_layout_step instead (its PyTorch copies show up as kernels too)."""
    b, h, n, d = shape
    if layout == "model":
        model_step, qkv = model_layout_step(impl, shape, causal)

        def step():
            qkv.grad = None
            model_step()
    else:
        q, k, v = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
        do = torch.randn_like(q)
        fn = attention_fn(impl, causal)

        def step():   # grads set to None first: accumulating into .grad would add elementwise kernels
            q.grad = k.grad = v.grad = None
            fn(q, k, v).backward(do)

    times = {name[:60]: ms for name, ms in profiled_ms(step, iters).items()}
    times = dict(sorted(times.items(), key=lambda kv: -kv[1]))
    print(f"kernel times {impl} {tuple(shape)} causal={causal} {layout} layout (ms per fwd+bwd): "
          + ", ".join(f"{name} {ms:.3f}" for name, ms in times.items()), flush=True)
    return {"shape": list(shape), "causal": causal, "layout": layout, "impl": impl, "ms": times}


def environment() -> dict:
    import triton
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def _shape(text: str) -> tuple:
    """argparse type of B,H,N,D."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected four positive integers B,H,N,D, e.g. 8,8,4096,128")
    return shape


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--check", action="store_true", help="correctness at real sizes first")
    ap.add_argument("--sweep", action="store_true", help="time num_warps/num_stages per kernel")
    ap.add_argument("--sweep-kernels", nargs="+", default=["dkdv", "dv", "dk", "dq", "forward"],
                    choices=["dkdv", "dv", "dk", "dq", "forward"], help="with --sweep: only these kernels")
    ap.add_argument("--no-bench", action="store_true", help="skip the benchmark table")
    ap.add_argument("--quick", action="store_true", help="one shape, one mask (smoke test)")
    ap.add_argument("--diagnose", action="store_true", help="where kernel and simulation part (fp32)")
    ap.add_argument("--kernel-times", action="store_true", help="per-kernel times of one fwd+bwd (profiler)")
    ap.add_argument("--kernel-shapes", nargs="+", type=_shape, metavar="B,H,N,D",
                    help="with --kernel-times: these shapes instead of the two causal targets")
    ap.add_argument("--kernel-layout", choices=["contiguous", "model"], default="contiguous",
                    help="with --kernel-times: contiguous (B,H,N,D) inputs, or the model's layout "
                         "(views of one qkv projection; the PyTorch copies around the op included)")
    ap.add_argument("--kernel-masks", nargs="+", choices=["causal", "full"], default=["causal"],
                    help="with --kernel-times: the masks to time (default causal)")
    ap.add_argument("--kernels", default="default", metavar="CHOICE",
                    help="which kernels run (sagebwd.triton.registry: default, triton, fused or PASS=NAME items, "
                         "e.g. triton,dkdv=gluon-ws; python -m sagebwd.triton.registry lists them)")
    ap.add_argument("--model-layout", action="store_true",
                    help="causal fwd+bwd in the model's layout (q, k, v views of one qkv projection), "
                         "its reshapes included, vs SDPA FLASH and CUDNN")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="causal fwd+bwd eager vs replayed from a CUDA graph (the host's launch work removed)")
    ap.add_argument("--quant", nargs="+", choices=list(SAGE_IMPLS),
                    help="the quantisation contracts to check and time (default: block and token; with --once: "
                         "block)")
    ap.add_argument("--once", action="store_true",
                    help="run one causal fwd+bwd per contract (--quant) at each shape (--shapes, default the two "
                         "causal targets) and exit (for ncu and other profilers)")
    ap.add_argument("--baselines", nargs="+", default=list(BASELINES), metavar="NAME",
                    help="the baseline columns (default: all of " + " ".join(BASELINES) + "; also fa4, cudnn-fp8, "
                         "all). FA4 and CUDNN-FP8 need flash-attn-4 / nvidia-cudnn-frontend and say "
                         "'not installed' without them (docs/benchmarks.md)")
    ap.add_argument("--shapes", nargs="+", type=_shape, metavar="B,H,N,D",
                    help="the table's shapes (default: " + " ".join(",".join(map(str, s)) for s in SHAPES) + ")")
    ap.add_argument("--check-baselines", action="store_true",
                    help="only the columns' accuracy against fp64 attention (part of --check)")
    args = ap.parse_args(argv)
    try:
        columns = baselines.parse_selection(args.baselines)
    except ValueError as err:
        ap.error(str(err))
    from sagebwd.triton.registry import KernelChoiceError, parse
    try:
        parse(args.kernels)
    except KernelChoiceError as err:
        ap.error(str(err))
    RUN["kernels"] = args.kernels
    if not torch.cuda.is_available():
        print("benchmarks.attention needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.once:
        for shape in args.shapes or SHAPES[:2]:
            for quant in args.quant or ["block"]:
                q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
                attention_fn(SAGE_IMPLS[quant], True)(q, k, v).backward(torch.randn_like(q))
        torch.cuda.synchronize()
        return 0
    args.quant = args.quant or list(SAGE_IMPLS)
    result = {"env": environment()}
    from sagebwd.triton import registry
    arch = registry.arch_of(torch.device("cuda"))
    # which kernel each contract runs per head dim and pass ("block" keys unprefixed, as before), and
    # without the causal mask where that differs
    def runs(quant, d, p):
        masked, unmasked = (registry.select(arch, d, p, quant, args.kernels, causal).name for causal in (True, False))
        return masked if masked == unmasked else f"{masked} (without the mask: {unmasked})"
    result["env"]["kernels"] = {"choice": args.kernels, **{
        f"{'' if quant == 'block' else quant + ' '}d{d} {p}": runs(quant, d, p)
        for quant in registry.QUANTS for d in (64, 128) for p in registry.PASSES}}
    result["env"]["baselines"] = baselines.describe(columns)
    print(result["env"], flush=True)
    if args.diagnose:
        result["diagnose"] = [diagnose(), diagnose(shape=(1, 2, 4096, 128), causal=True)]
    if args.check:
        result["fp32_gap"] = [fp32_gap((2, 4, 4096, d), dt, True) for d in (64, 128)
                              for dt in (torch.bfloat16, torch.float16)]
        result["check"] = check_correctness(args.quick, tuple(args.quant))
    if args.check or args.check_baselines:
        result["baseline_check"] = baseline_accuracy(tuple(SAGE_IMPLS[q] for q in args.quant) + columns, args.quick)
    if args.kernel_times:
        result["kernel_times"] = [kernel_times(shape, mask == "causal", layout=args.kernel_layout,
                                               impl=SAGE_IMPLS[quant])
                                  for quant in args.quant for shape in (args.kernel_shapes or SHAPES[:2])
                                  for mask in args.kernel_masks]
    if args.model_layout:
        result["model_layout"] = model_layout_table(SHAPES[:2])
    if args.cuda_graph:
        result["cuda_graph"] = graph_vs_eager()
    shapes = args.shapes or SHAPES
    shapes = shapes[:1] if args.quick else shapes
    if not args.no_bench:
        result["bench"] = benchmark(shapes, args.quick, tuple(SAGE_IMPLS[q] for q in args.quant), columns)
    result["kernels"] = kernel_report(tuple(args.quant))
    if args.sweep:
        result["sweep"] = [row for quant in args.quant
                           for row in sweep([(8, 8, 4096, 128), (8, 16, 4096, 64)], tuple(args.sweep_kernels),
                                            SAGE_IMPLS[quant])]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if "bench" in result:
        print(f"\n{result['env']}\n" + markdown_table(result["bench"]), flush=True)
    if "baseline_check" in result:
        print("\naccuracy against fp64 attention (rel-L2):\n" + accuracy_table(result["baseline_check"]["rows"]),
              flush=True)
    if "check" in result:
        print("correctness:", "PASS" if result["check"]["pass"] else "FAIL", flush=True)
    if "baseline_check" in result:
        print("baselines' accuracy:", "PASS" if result["baseline_check"]["pass"] else "FAIL", flush=True)
    ok = result.get("check", {}).get("pass", True) and result.get("baseline_check", {}).get("pass", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
