"""dK's accuracy of the token contract in fp16 with small output gradients (sixteenth session, 2026-11-28).

    PYTHONPATH=. python docs/measurements/fp16-small-grad-check-1128.py

Run in this tree and in `git archive 4ffba3c^ sagebwd` (the contract before dO s_Q was written in dO's dtype) for the
numbers in docs/kernel-notes.md ("Found: dO s_Q in fp16 underflows with small gradients"); CPU, the simulation.
"""
import torch

from sagebwd.fpa import fpa_attention
from sagebwd.simulate import SageConfig, SimulatedSageBwd

torch.manual_seed(0)
b, h, n, d = 1, 2, 512, 64
q, k, v, do0 = (torch.randn(b, h, n, d) for _ in range(4))
for dt in (torch.bfloat16, torch.float16):
    for scale in (1.0, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6):
        cfg = SageConfig(causal=True, block_q=128, block_kv=64, quant="token")
        qq, kk, vv = (t.to(dt).requires_grad_() for t in (q, k, v))
        do = (do0 * scale).to(dt)
        SimulatedSageBwd.apply(qq, kk, vv, cfg).backward(do)
        ref = fpa_attention(q.double(), k.double(), v.double(), do.double(), causal=True)

        def err(a, r):
            return ((a.double() - r.double()).norm() / r.double().norm()).item()
        print(dt, scale, "dQ %.4f dK %.4f dV %.4f" % (err(qq.grad, ref.dq), err(kk.grad, ref.dk), err(vv.grad, ref.dv)))
