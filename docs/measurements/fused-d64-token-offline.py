"""The prepared fused d=64 token backward (trial-fused-d64-token.patch) built offline for sm_90: shared memory,
registers, spills, local accesses in loops, and the unmasked loop's SASS per score element; and the same counts for
the sixteenth session's probe it is built on (dkdv_launches with dq_product 3, causal) (docs/kernel-notes.md,
"Seventeenth session"). Run in a tree with the patch applied (it calls hopper.run_fused_token), Triton 3.6.0:

    PYTHONPATH=<triton 3.6 site>:. python docs/measurements/fused-d64-token-offline.py
"""
import torch

from sagebwd.triton import backward as kb
from sagebwd.triton import hopper
from sagebwd.triton.launch import Tuning
from tools import sass_mix
from tools.offline import _resource_usage, compile_recorded

b, h, n, d = 1, 2, 1024, 64


def call(causal: bool):
    """A token BackwardCall of placeholder values with the shapes and dtypes the kernel is built for."""
    def f(*s): return torch.rand(*s) + 0.5
    def bf(*s): return torch.randn(*s).bfloat16()
    def i8(*s): return torch.zeros(*s, dtype=torch.int8)
    s_q = f(b, h, n)
    return kb.BackwardCall(bf(b, h, n, d), f(b, h, n), torch.zeros(b, h, d, n).to(torch.float8_e4m3fn),
                           f(b, h, n // 128), i8(b, h, n, d), i8(b, h, d, n), s_q, i8(b, h, n, d), i8(0), f(b, h, n),
                           bf(b, h, n, d), f(b, h, n), bf(b, h, n, d), bf(b, h, n, d), bf(b, h, n, d), s_q, causal,
                           True, None, bf(b, h, n, d), None, 128, 64, True, f(b, h, n), f(b, h, n), bf(b, h, n, d))


for causal in (True, False):
    recorded = Tuning(recorded=[])
    hopper.run_fused_token(call(causal), recorded)
    [(name, kernel, args, kwargs)] = recorded.recorded
    built = compile_recorded(kernel, args, kwargs)
    sass = sass_mix.disassemble(built.asm["cubin"])
    row = {"causal": causal, "shared": built.metadata.shared, **_resource_usage(built.asm["cubin"]),
           "local_ops_in_loops": sass_mix.local_memory_in_loops(sass)}
    if not causal:
        constexprs = {k: v for k, v in kwargs.items() if k.isupper()}
        row["per_element"] = round(sass_mix.loop_mix(sass, name, constexprs, kwargs.get("num_warps", 4))
                                   ["per_element"], 2)
    print(row)

probe_call = call(True)
c = probe_call
buffer = torch.zeros(b * h * n, d, dtype=torch.int32)
for name, kernel, grid, args, kwargs in hopper.dkdv_launches(
        c.q8, c.q8t, c.s_q, c.k8, c.s_k, c.v, c.do_s, c.do8t, c.s_do, c.lse2_p, c.delta_sq, c.tile_scales, c.dk, c.dv,
        causal=True, block_q=128, ws=True, token=True, dq_reduce=(buffer, None, 1.0), dq_product=3):
    built = compile_recorded(kernel, args, kwargs)
    print({"probe": "y16", "causal": True, "shared": built.metadata.shared, **_resource_usage(built.asm["cubin"]),
           "local_ops_in_loops": sass_mix.local_memory_in_loops(sass_mix.disassemble(built.asm["cubin"]))})
