"""Host time of one fwd+bwd of model/qkv.py's op, eager: through the custom op's dispatch (what qkv_norm_rope calls
under torch.compile) against its eager path, a plain torch.autograd.Function calling the same implementations
(model.qkv._EagerQkv since 2026-11-29, twenty-eighth session; sagebwd/triton/ops.py does the same), with the
kernels' launches stubbed so that only host work is timed. No GPU needed.

    python docs/measurements/qkv-host-eager.py [--rounds 8] [--calls 300]

Prints each path's host microseconds per fwd+bwd per round, alternating the paths, and their medians.
"""
import argparse
import statistics
import time

import torch

from model import qkv as mq
from model.layers import RotaryEmbedding


class _NoLaunch:   # kernel[grid](...) does nothing
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    mq._qkv_forward_kernel = mq._qkv_backward_kernel = _NoLaunch()
    rope = RotaryEmbedding(64, 256, 1e4)
    qkv = torch.randn(1, 256, 3 * 2 * 64, requires_grad=True)
    weights = [torch.nn.Parameter(torch.ones(64)) for _ in range(2)]
    cos, sin = rope.tables(256)

    def op():
        outs = mq._forward_op(qkv, weights[0], weights[1], cos, sin, 2, 1e-6)
        torch.autograd.backward(outs, outs)

    def function():
        outs = mq._EagerQkv.apply(qkv, weights[0], weights[1], cos, sin, 2, 1e-6)
        torch.autograd.backward(outs, outs)

    paths = {"custom op": op, "autograd.Function": function}
    for fn in paths.values():   # warm up
        for _ in range(100):
            fn()
    times = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    for name, us in times.items():
        print(f"{name}: median {statistics.median(us):.0f} us per fwd+bwd; rounds "
              f"{', '.join(f'{t:.0f}' for t in us)}")


if __name__ == "__main__":
    main()
