"""Whether ptxas packs exp2 of two fp16 values into one MUFU on sm_90 (docs/kernel-notes.md, "Twenty-first
session", trial 1), without a GPU: a kernel taking exp2 of a 64 x 128 tile in fp32 (mode 0) and by
`ex2.approx.f16x2` on packed fp16 pairs (mode 1), built for sm_90 by Triton, its SASS opcodes counted.

    PYTHONPATH=. python docs/measurements/probe-ex2-f16x2-sass.py

2026-11-28, Triton 3.7.1: mode 1 issues 64 MUFU.EX2.F16 for 64 elements a thread (one per element, on each
half of a pair), as mode 0 issues 64 MUFU.EX2; the fp16 rounding (HFMA2) and conversion (F2FP) are packed.
"""
import collections
import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tools.sass_mix import disassemble


@triton.jit
def _ex2_f16x2(x):
    return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x], dtype=tl.float16, is_pure=True,
                                     pack=2)


@triton.jit
def _kernel(X, Y, L, MODE: tl.constexpr):
    r = tl.arange(0, 64)
    c = tl.arange(0, 128)
    x = tl.load(X + r[:, None] * 128 + c[None, :])
    if MODE == 0:
        p = tl.math.exp2(x)
        y = (p * 127.0 + 12582912.0).to(tl.int32, bitcast=True).to(tl.int8)
        l_sum = tl.sum(p, axis=1)
    else:
        ph = _ex2_f16x2(x.to(tl.float16))
        y = (ph * 127.0 + 1536.0).to(tl.int16, bitcast=True).to(tl.int8)
        l_sum = tl.sum(ph.to(tl.float32), axis=1)
    tl.store(Y + r[:, None] * 128 + c[None, :], y)
    tl.store(L + r, l_sum)


if __name__ == "__main__":
    for mode in (0, 1):
        src = ASTSource(_kernel, {"X": "*fp32", "Y": "*i8", "L": "*fp32", "MODE": "constexpr"},
                        constexprs={(3,): mode})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=4))
        sass = disassemble(compiled.asm["cubin"])
        ops = collections.Counter(re.findall(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\d\s+)?([A-Z0-9_.]+)", sass))
        print(f"mode {mode}:", {k: v for k, v in ops.items() if k.startswith(("MUFU", "HFMA2", "F2FP", "HADD2"))})
