"""How often a forward program of 64 rows would have to flush an INT32 accumulator of P^ V^ (variant r8: P against
the running max) because some row's maximum rose, on the benchmark's i.i.d. Gaussian inputs (torch.randn q, k;
N=4096, D=64, one head, two draws), per 128-key tile after the first, by the margin tau (log2 units) a lazy
reference allows before it is raised (FlashAttention-4's rescale test; tau > 0 needs P^ room above 127 * 1).
CPU: python docs/measurements/flush-rate-1129.py [ROWS] (ROWS: rows a flush test covers, 64 by default, a program;
16, a warp) (twenty-third session; docs/kernel-notes.md)."""
import math
import sys

import torch

torch.manual_seed(0)
N, D = 4096, 64
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 64
LOG2E = 1.4426950408889634
for causal in (True, False):
    res = {}
    for trial in range(2):
        q, k = torch.randn(N, D), torch.randn(N, D)
        s = (q @ k.T) / math.sqrt(D) * LOG2E
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool), 1), float("-inf"))
        t = s.reshape(N, N // 128, 128).amax(-1)            # tile maxima, log2 units
        for tau in (0.0, 0.5, 1.0, 2.0):
            flushes = tiles = 0
            for p0 in range(0, N, ROWS):
                tt = t[p0:p0 + ROWS]
                last = (p0 + ROWS - 1) // 128 if causal else N // 128 - 1
                ref = tt[:, 0].clone()
                for j in range(1, last + 1):
                    tiles += 1
                    rise = tt[:, j] > ref + tau
                    if rise.any():
                        flushes += 1
                        ref = torch.maximum(ref, tt[:, j])
            res.setdefault(tau, []).append(flushes / tiles)
    print(f"{ROWS} rows,", "causal" if causal else "full", "flushed share of tiles by tau:",
          {tau: round(sum(v) / len(v), 3) for tau, v in res.items()})
