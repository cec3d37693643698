"""Triton kernels for SageBwd (the paper's Algorithms 1 and 2); entry point :func:`attention`.

Modules: ``registry`` (which kernel runs, per GPU architecture, head dim, pass and quantisation
contract: ``python -m sagebwd.triton.registry`` prints the table), ``quantize`` (smoothing +
per-block INT8 in the layouts the matmuls need, and the backward preprocess), ``forward``,
``backward`` (dK/dV and dQ kernels), ``dq_hopper``, ``dkdv_hopper``, ``dkdv_ws_hopper`` (Gluon
kernels for Hopper) with their host side ``hopper``, ``ops`` (the torch.library custom ops and
their autograd formula), ``launch`` (the one place kernels are launched, and the tools' hooks).
``experimental/`` holds kernels that are never a default. docs/kernel-notes.md has the design.
"""

__all__ = ["attention"]


def __getattr__(name):
    # Imported on first use, so that `sagebwd.triton.registry` (read by configs) costs no Triton import.
    if name == "attention":
        from .ops import attention
        globals()["attention"] = attention
        return attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
