"""SageBwd: trainable INT8 attention (forward and backward) with an exact PyTorch simulation.

    import sagebwd
    o = sagebwd.attention(q, k, v, causal=True)     # (batch, heads, seq, head_dim)

Modules: ``api`` (the op and its dispatch), ``quant`` (the INT8 quantisers), ``simulate``
(Algorithms 1-2 in PyTorch, the reference), ``fpa`` (full precision with intermediates),
``trace`` (error of every intermediate against FPA), ``triton`` (the CUDA kernels).
"""
from .api import attention, resolve_backend
from .fpa import FpaResult, fpa_attention
from .simulate import SageConfig
from .validate import SUPPORTED_HEAD_DIMS, SageBwdInputError

__all__ = ["attention", "fpa_attention", "FpaResult", "SageConfig", "SageBwdInputError",
           "SUPPORTED_HEAD_DIMS", "resolve_backend"]
