"""The LM head and its cross-entropy: `lm_head_loss(hidden, weight, targets, impl=...)`.

"plain" is the reference: logits = hidden @ weight^T for the whole micro-batch in the compute
dtype, an fp32 copy, `F.cross_entropy` (what `launcher.train.lm_loss(model(x), y)` computes).
At gpu-124m (16,384 tokens x 50,304 vocab) that materialises 1.6 GB of bf16 logits, 3.3 GB of
fp32 logits and as much for the saved log-softmax and its gradient; the fp32 softmax forward
and backward were 16% of an H100 step (issue 27).

"chunked" computes the same loss and the same gradients without ever holding more than
`chunk_tokens` rows of logits: `ChunkedLinearCrossEntropy`, the algorithm of Liger-Kernel's
fused linear cross-entropy written in PyTorch (Liger's own kernel is Triton/CUDA-only, so a
CPU path would be needed anyway; this one runs everywhere and under torch.compile, where
Inductor fuses each chunk's elementwise work). Per chunk of tokens, in the forward:
  logits = h_c @ W^T                        compute dtype, as plain
  lse = logsumexp(fp32(logits))             fp32, as plain's log-softmax
  loss += sum(lse - logits[target])         fp32
  dlogits = (softmax - onehot(target)) * valid / n_valid, cast to the compute dtype
                                            (plain's grad of `.float()` casts the same way)
  dh_c = dlogits @ W;  dW += dlogits^T @ h_c  (dW accumulated in fp32 over chunks)
and the backward only scales dh and dW by the incoming gradient. The differences to plain are
the rounding of the matmuls' outputs (per chunk instead of whole) and softmax computed as
exp(z - lse) instead of exp(log_softmax(z)): within bf16 rounding (tests/test_loss.py).

Padded vocabulary rows take part in the softmax exactly as in plain (they are never targets);
a tied LM head gets its gradient through `weight` and autograd adds the embedding's.
`ignore_index` tokens (default -100, as F.cross_entropy) add nothing and do not count in the
mean; the trainer itself never uses one.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

LossImpl = Literal["plain", "chunked"]
LOSS_IMPLS: tuple[str, ...] = ("plain", "chunked")
IGNORE_INDEX = -100


def plain_lm_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                       ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The reference: whole-batch logits, fp32 cross-entropy (mean over non-ignored tokens)."""
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(),
                           ignore_index=ignore_index)


def logits_grad(z: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                dtype: torch.dtype, *, elementwise: bool | None = None) -> torch.Tensor:
    """d loss / d logits of one chunk: (softmax(z) - onehot(targets)) * weight per row, cast to dtype.

    z: (n, V) fp32 logits (overwritten on the in-place path), lse: (n,) their logsumexp,
    targets: (n, 1) int64, weight: (n,) fp32. Two forms, bit-identical (x + (-1) and x - 1 are one
    IEEE operation): in place on z (eager: no temporary as large as z), or one elementwise
    expression (under torch.compile: Inductor fuses it with the logsumexp into one kernel that
    writes the dtype gradient; the in-place scatter made it materialise z in fp32 and read it
    back, two kernels and ~3x the bytes per chunk). `elementwise` None: the second form exactly
    when torch.compile is tracing."""
    if elementwise is None:
        elementwise = torch.compiler.is_compiling()
    if elementwise:
        columns = torch.arange(z.shape[1], device=z.device)
        p = torch.exp(z - lse.unsqueeze(1))
        return (torch.where(columns == targets, p - 1.0, p) * weight.unsqueeze(1)).to(dtype)
    z.sub_(lse.unsqueeze(1)).exp_()
    z.scatter_add_(1, targets, torch.full_like(lse, -1.0).unsqueeze(1))
    return z.mul_(weight.unsqueeze(1)).to(dtype)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (hidden @ weight^T, targets), gradients computed in the forward.

    hidden: (N, H), weight: (V, H), targets: (N,) int64. Returns a 0-dim fp32 loss."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int, ignore_index: int, needs_grad: bool) -> torch.Tensor:
        n = hidden.shape[0]
        valid = targets != ignore_index
        safe_targets = torch.where(valid, targets, torch.zeros_like(targets))
        # Mean over valid tokens, without a host sync: 0/0 = nan when all are ignored, as plain.
        inv_count = 1.0 / valid.sum().to(torch.float32)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        if needs_grad:
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, n, chunk_tokens):
            stop = min(start + chunk_tokens, n)
            h = hidden[start:stop]
            t = safe_targets[start:stop].unsqueeze(1)
            keep = valid[start:stop]
            z = F.linear(h, weight).float()   # a new fp32 tensor (or the fp32 logits themselves)
            lse = torch.logsumexp(z, dim=-1)
            target_logit = z.gather(1, t).squeeze(1)
            loss_sum = loss_sum + torch.where(keep, lse - target_logit, 0.0).sum()
            if not needs_grad:
                continue
            dlogits = logits_grad(z, lse, t, keep.to(torch.float32) * inv_count, hidden.dtype)
            grad_hidden[start:stop] = dlogits @ weight
            grad_weight += dlogits.t() @ h
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.needs_grad = needs_grad
        ctx.weight_dtype = weight.dtype
        return loss_sum * inv_count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        if not ctx.needs_grad:
            raise RuntimeError("ChunkedLinearCrossEntropy ran without gradients (no_grad or "
                               "inputs without requires_grad); it has none to give")
        grad_hidden, grad_weight = ctx.saved_tensors
        g = grad_loss.to(torch.float32)
        dh = (grad_hidden * g).to(grad_hidden.dtype)
        dw = (grad_weight * g).to(ctx.weight_dtype)
        return dh, dw, None, None, None, None


def chunked_lm_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_tokens: int = 2048,
                         ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Same value and gradients as `plain_lm_head_loss`, at most chunk_tokens rows of logits
    at a time. Under no_grad (evaluation) only the loss is computed."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return ChunkedLinearCrossEntropy.apply(hidden.flatten(0, -2), weight, targets.flatten(),
                                           chunk_tokens, ignore_index, needs_grad)


def lm_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                 impl: LossImpl = "plain", chunk_tokens: int = 2048,
                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean next-token cross-entropy of the LM head `weight` (V, H) over hidden (..., H)."""
    if impl == "plain":
        return plain_lm_head_loss(hidden, weight, targets, ignore_index)
    if impl == "chunked":
        return chunked_lm_head_loss(hidden, weight, targets, chunk_tokens, ignore_index)
    raise ValueError(f"unknown loss impl {impl!r}; choose one of {LOSS_IMPLS}")
