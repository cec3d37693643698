"""Kernel-only timing of the fused d=64 token backward (docs/measurements/trial-fused-d64-token.patch) on a GPU, ms,
medians, on the same operands. Run in a tree with the patch applied (`bash docs/measurements/gpu-calls-h200-1128h.sh
prepare`, then its `fused` and `ring` calls):

    cd .gpu/fused && PYTHONPATH=$PWD python3 ../../docs/measurements/fused-d64-token-timing.py TAG
        the fused launch with its factors and buffer prepared, its parts (zeroing, factors, conversion: torch), the
        whole of hopper.run_fused_token, and the two kernels it replaces (TAG names the tree in the output)
    cd .gpu/fused && PYTHONPATH=$PWD python3 ../../docs/measurements/fused-d64-token-timing.py --ring
        the default token dK/dV and the fused launch at ring depths 3 and 2 (dkdv_ws_hopper.STAGES["dkdv"]),
        interleaved twice in one process
"""
import sys

if __name__ == "__main__" and len(sys.argv) != 2:
    raise SystemExit("usage: fused-d64-token-timing.py TAG | --ring (run in a tree with the fused patch applied)")

import torch  # noqa: E402 (after the usage check)
import triton  # noqa: E402

from sagebwd.triton import dkdv_ws_hopper, hopper  # noqa: E402
from sagebwd.triton.launch import launch  # noqa: E402
from tools.dq_add_bench import token_backward_call  # noqa: E402

SHAPES = [(4, 12, 4096, 64), (8, 16, 4096, 64)]


def bench(f) -> float:
    return triton.testing.do_bench(f, return_mode="median")


def fused_launch(c, buffer, factor):
    """The fused kernel's launch alone (its factors and zeroed buffer made beforehand), as a callable."""
    launches = hopper.dkdv_launches(
        c.q8, c.q8t, c.s_q, c.k8, c.s_k, c.v, c.do_s, c.do8t, c.s_do, c.lse2_p, c.delta_sq, c.tile_scales, c.dk,
        c.dv, causal=c.causal, block_q=c.block_q, ws=True, token=True, dq_reduce=(buffer, None, factor),
        dq_product=4, dq_k16=c.k.to(torch.bfloat16))

    def run():
        for name, kernel, grid, args, kwargs in launches:
            launch(name, kernel, grid, *args, **kwargs)
    return run


def parts(tag: str, c, shape, causal: bool) -> str:
    b, h, n, d = shape
    factor, u = hopper.fused_dq_factors(c)
    buffer = torch.zeros(b * h * n, d, device="cuda", dtype=torch.int32)
    two = bench(lambda: (hopper.run_dq(c, ws=True), hopper.run_dkdv(c, ws=True)))
    dkdv = bench(lambda: hopper.run_dkdv(c, ws=True))
    dq = bench(lambda: hopper.run_dq(c, ws=True))
    ref = c.dq.clone()
    k_only = bench(fused_launch(c, buffer, factor))
    zero = bench(lambda: buffer.zero_())
    fac = bench(lambda: hopper.fused_dq_factors(c))
    conv = bench(lambda: c.dq.copy_(buffer.view(b, h, n, d) * u[..., None]))
    whole = bench(lambda: hopper.run_fused_token(c))
    err = ((c.dq.float() - ref.float()).norm() / ref.float().norm()).item()
    return (f"[{tag}] {shape} causal={causal}: dq {dq:.3f} dkdv {dkdv:.3f} two {two:.3f} | fused kernel {k_only:.3f} "
            f"({k_only / two - 1:+.1%}) zero {zero:.3f} factors {fac:.3f} convert {conv:.3f} whole {whole:.3f} "
            f"| dq rel err vs Gluon dq {err:.2e}")


def ring_depths(c, shape, causal: bool) -> str:
    b, h, n, d = shape
    factor, _ = hopper.fused_dq_factors(c)
    buffer = torch.zeros(b * h * n, d, device="cuda", dtype=torch.int32)
    row = []
    for stages in (3, 2, 3, 2):
        dkdv_ws_hopper.STAGES["dkdv"] = stages
        dkdv = bench(lambda: hopper.run_dkdv(c, ws=True))
        row.append(f"STAGES {stages}: dkdv {dkdv:.3f} fused {bench(fused_launch(c, buffer, factor)):.3f}")
    return f"{shape} causal={causal}: " + " | ".join(row)


if __name__ == "__main__":
    for shape in SHAPES:
        for causal in (True, False):
            call = token_backward_call(*shape, causal=causal)
            ring = sys.argv[1] == "--ring"
            print(ring_depths(call, shape, causal) if ring else parts(sys.argv[1], call, shape, causal), flush=True)
