"""Reference checks of the Triton kernels on a GPU, shared by the GPU tests and the benchmark's --check.

``check_case``: the kernels against the simulation at one shape (relative L2 of O, dQ, dK, dV with
the simulation's outputs cast to the same dtype), every output element written (the allocator's
cache is poisoned with NaN first) and reruns bit-identical. ``graph_and_compiled``: one causal
fwd+bwd eagerly, under torch.compile and replayed from a CUDA graph, with whether the outputs agree
bit for bit (``captured``: the capture, which the benchmark's replayed rows use too). ``python -m
benchmarks.attention --check`` runs them at larger sizes.
"""
from __future__ import annotations

import torch

TOLERANCE = {"bfloat16": 5e-3, "float16": 2e-3}
# The fused backward's dQ between reruns (rel. L2): its fp32 atomics add in any order, and the cast
# to 16 bits can then round an element the other way (one ulp: ~4e-3 relative in bf16, ~5e-4 in fp16).
DQ_RERUN_TOLERANCE = 1e-4


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def cpu(*tensors):
    return [t.detach().cpu() for t in tensors]


def simulate_on_cpu(q, k, v, do, o, cfg):
    """The simulation's O and (given the kernel's O) gradients, computed on the CPU.

    sagebwd.quant divides tensor by tensor (IEEE on both devices); the reference still runs on
    the CPU so that its exp/sum rounding is the one the CI interpreter tests see.
    """
    from sagebwd import simulate
    q, k, v, do, o = cpu(q, k, v, do, o)
    with torch.no_grad():
        o_sim, saved = simulate.forward(q, k, v, cfg)
        grads = simulate.backward(saved._replace(o=o), do, cfg)
    return o_sim, grads


def poison_allocator(mib: int) -> None:
    """Fill cached-but-free device memory with NaN, so an output element the kernels never write shows."""
    torch.cuda.synchronize()
    blocks = [torch.full((64 * 2**20 // 4,), float("nan"), device="cuda") for _ in range(max(1, mib // 64))]
    del blocks


def check_case(shape, dtype, causal: bool, smooth_q: bool, block_q=128, block_kv=64, reruns=50,
               quant="block", kernels="default", do_scale=1.0) -> dict:
    """The kernels `kernels` (sagebwd.triton.registry) against the simulation at one shape; dO ~ do_scale."""
    from sagebwd import simulate
    from sagebwd.triton import attention, registry
    gen = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v, do = [torch.randn(*shape, device="cuda", generator=gen) for _ in range(4)]
    q, k, v, do = q.to(dtype), k.to(dtype), v.to(dtype), (do * do_scale).to(dtype)
    q, k, v = [t.requires_grad_() for t in (q, k, v)]

    def run():
        o = attention(q, k, v, causal, True, smooth_q, block_q, block_kv, quant, kernels=kernels)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    poison_allocator(4096)
    outs = run()
    # the fused backward adds dQ with atomics: its dQ may differ in the last bits from run to run
    fused = registry.resolve(registry.arch_of(q.device), shape[-1], "dq", quant, kernels, block_q=block_q,
                             block_kv=block_kv, smooth_q=smooth_q, seq=shape[2], causal=causal).name == "fused"
    written = all(bool(torch.isfinite(t).all()) for t in outs)
    identical, rerun_diff = True, [0.0] * 4   # largest rel L2 between reruns, per output
    for _ in range(reruns):
        for i, (a, b) in enumerate(zip(outs, run())):
            if not torch.equal(a, b):
                identical = False
                rerun_diff[i] = max(rerun_diff[i], rel(b, a))
    cfg = simulate.SageConfig(causal=causal, smooth_q=smooth_q, block_q=block_q, block_kv=block_kv, quant=quant)
    o_sim, grads_sim = simulate_on_cpu(q, k, v, do, outs[0], cfg)   # backward given the O returned
    errs = {name: rel(a.cpu(), b) for name, a, b in zip(("o", "dq", "dk", "dv"), outs, (o_sim, *grads_sim))}
    return {"shape": list(shape), "dtype": str(dtype).split(".")[-1], "causal": causal, "smooth_q": smooth_q,
            "blocks": [block_q, block_kv], "quant": quant, "rel_l2_vs_sim": errs, "all_written": written,
            f"identical_over_{reruns}_reruns": identical,
            "rerun_rel_l2": dict(zip(("o", "dq", "dk", "dv"), rerun_diff)), "fused_backward": fused,
            # reproducible: every output bit-identical over the reruns, except (fused backward) dQ,
            # whose atomics' order may move its last bits: within DQ_RERUN_TOLERANCE
            "reproducible": all(d == 0.0 or (name == "dq" and fused and d <= DQ_RERUN_TOLERANCE)
                                for name, d in zip(("o", "dq", "dk", "dv"), rerun_diff))}


def captured(step, leaves=()):
    """(graph, outputs): one call of step captured in a CUDA graph, after three warm-up calls on a side stream (as
    torch.cuda.graphs asks); the leaves' .grad reset before each call, so that a captured backward writes them
    afresh. graph.replay() reruns the call into the same outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for t in leaves:
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def graph_and_compiled(shape, kernels="default", quant="block") -> dict:
    """One causal fwd+bwd of SageBwd eagerly (`step`), under torch.compile (`compiled_step`: the
    registered custom ops) and captured in a CUDA graph (`graph`), on the same inputs; `identical`
    and `compiled_identical`: whether the replayed and compiled outputs equal the eager ones bit for
    bit (no host synchronisation, nothing read back on the host)."""
    import sagebwd
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
    q, k, v = [t.requires_grad_() for t in (q, k, v)]

    def fn(q, k, v):
        return sagebwd.attention(q, k, v, causal=True, backend="triton", check_finite=False, kernels=kernels,
                                 quant=quant)

    def step():
        o = fn(q, k, v)
        return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))
    eager_out = [t.clone() for t in step()]
    compiled_fn = torch.compile(fn, dynamic=False)

    def compiled_step():
        o = compiled_fn(q, k, v)
        return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))
    compiled_out = [t.clone() for t in compiled_step()]
    graph, graph_out = captured(step)
    graph.replay()
    torch.cuda.synchronize()
    return {"step": step, "compiled_step": compiled_step, "graph": graph,
            "identical": all(bool(torch.equal(a, b)) for a, b in zip(graph_out, eager_out)),
            "compiled_identical": all(bool(torch.equal(a, b)) for a, b in zip(compiled_out, eager_out))}
