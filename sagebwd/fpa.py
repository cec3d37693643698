"""Full-precision attention (FPA) with every intermediate, the baseline for SageBwd.

Computed in float32 (float64 for float64 inputs) with the explicit backward
formulas, so the tracer can compare delta, P, dP, dS, O, dQ, dK, dV one by one.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .simulate import compute_dtype


class FpaResult(NamedTuple):
    o: torch.Tensor
    lse: torch.Tensor
    p: torch.Tensor
    # Backward tensors; None unless dO was given.
    delta: torch.Tensor | None = None
    dp: torch.Tensor | None = None
    ds: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None


def fpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None = None, *,
                  causal: bool = False) -> FpaResult:
    """softmax(Q K^T / sqrt(d)) V and, given dO, its gradients, all in full precision."""
    ct = compute_dtype(q.dtype)
    q, k, v = q.to(ct), k.to(ct), v.to(ct)
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * sm_scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    o = p @ v
    if do is None:
        return FpaResult(o, lse, p)
    do = do.to(ct)
    delta = (do * o).sum(dim=-1)
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = ds @ k * sm_scale
    dk = ds.transpose(-1, -2) @ q * sm_scale
    dv = p.transpose(-1, -2) @ do
    return FpaResult(o, lse, p, delta, dp, ds, dq, dk, dv)
