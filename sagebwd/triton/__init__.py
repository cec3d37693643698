"""Triton kernels for SageBwd (the paper's Algorithms 1 and 2); entry point :func:`attention`.

Modules: ``quantize`` (smoothing + per-block INT8 in the layouts the matmuls need, and the
backward preprocess), ``forward``, ``backward`` (dK/dV and dQ kernels), ``ops`` (the
torch.library custom ops and their autograd formula). docs/kernel-notes.md has the design.
"""
from .ops import attention

__all__ = ["attention"]
