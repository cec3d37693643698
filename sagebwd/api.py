"""The public op: :func:`attention`, dispatching to the Triton kernels or the simulation."""
from __future__ import annotations

import logging
import os

import torch

from .simulate import SageConfig, SimulatedSageBwd
from .validate import BACKENDS, SageBwdInputError, check_inputs, check_kernels, check_quant, check_tensors

log = logging.getLogger("sagebwd")
_said_simulating = False


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise SageBwdInputError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "simulate"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SageBwdInputError(
            "backend='triton' needs CUDA tensors; on the CPU use backend='simulate' "
            "(or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter)")
    return backend


def _say_simulating_once() -> None:
    global _said_simulating
    if not _said_simulating:
        _said_simulating = True
        log.warning("sagebwd: no CUDA device, running the exact PyTorch simulation of the INT8 kernels "
                    "(same quantisation, slower; the Triton kernels run on CUDA)")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              smooth_k: bool = True, smooth_q: bool = False, block_q: int = 128, block_kv: int = 64,
              quant: str = "block", backend: str = "auto", check_finite: bool = True,
              kernels: str = "default") -> torch.Tensor:
    """SageBwd attention: INT8 QK^T, PV, dV, dQ, dK with 16-bit dP (the paper's Algorithms 1-2).

    q, k, v: (batch, heads, seq, head_dim), one dtype and device; head_dim 64 or 128; seq a
    multiple of block_q and block_kv (and of 128 with quant="token"). Returns O in the input dtype;
    differentiable.

    quant: the quantisation contract. "block" is the paper's (per-block Q, K, V; per-tile P and
    dS in the backward); "token" gives every scale the granularity of a token along the free
    axis of its product (per-token Q and K; dS per token within each tile; dV = P^T dO in FP8
    e4m3, P with a static scale; the forward's P and V per 128-key tile): more accurate (but for
    dV), and every maximum is a row reduction in the kernel. docs/sagebwd.md states both.

    backend: "triton" (CUDA kernels), "simulate" (exact PyTorch simulation, any device) or
    "auto" (triton on CUDA, simulate elsewhere). check_finite costs one device sync per call.
    kernels: which Triton kernels run ("default", "triton", ...: the table of sagebwd.triton.registry,
    `python -m sagebwd.triton.registry`); the simulation ignores it.
    """
    check_tensors(q, k, v)   # before anything reads q.device
    check_quant(quant)
    name = resolve_backend(backend, q.device)
    check_kernels(kernels)
    check_inputs(q, k, v, backend=name, block_q=block_q, block_kv=block_kv, check_finite=check_finite, quant=quant)
    if name == "triton":
        from . import triton as sage_triton   # imported lazily: needs a working Triton
        return sage_triton.attention(q, k, v, causal, smooth_k, smooth_q, block_q, block_kv, quant, kernels=kernels)
    if q.device.type != "cuda":
        _say_simulating_once()
    cfg = SageConfig(causal=causal, smooth_k=smooth_k, smooth_q=smooth_q, block_q=block_q, block_kv=block_kv,
                     quant=quant)
    return SimulatedSageBwd.apply(q, k, v, cfg)
