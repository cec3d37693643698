"""Symmetric INT8 quantisers shared by the simulation, the tracer and the kernel tests.

One rule everywhere (the paper's psi): per block, ``scale = amax / 127`` and
``q = round(x * (127 / amax))`` with round-half-to-even, clamped to [-127, 127].
Both divisions are single IEEE-rounded fp32 divisions, so a kernel that uses
``div_rn`` reproduces the same integers. A block whose amax is below ``MIN_AMAX`` (2^-120,
all-zero included) gets scale 0 and q 0: 127 / amax would overflow fp32 there, and the
kernels' exp2 flushes such P values to zero anyway. Small groups (the "token" contract's
rows of a P tile far from the diagonal) reach such amaxes; per-block tiles practically never.

The integers are held in floating point: products of two |q| <= 127 summed over
fewer than 1040 terms stay below 2**24, so float32 matmuls over them are exact.

``enabled=False`` returns the input unchanged with unit scales: the same dataflow
in full precision, which lets the tests check the formulas against autograd.

FP8 e4m3 (the "token" contract's dV = P^T dO, docs/sagebwd.md): the same rule with 448 (e4m3's
largest value) in place of 127 and e4m3's round-to-nearest-even in place of the integer rounding,
saturating at +-448 as the GPU's conversion does (``cvt.rn.satfinite``). P needs no maximum: P <= 1,
so it takes the static scale 1 / ``P_E4M3_SCALE``, a power of two (exact in fp32; the value's own
exponent does what a scale would, down to e4m3's subnormals at 2^-9, i.e. P >= 2^-17).
"""
from __future__ import annotations

import torch

QMAX = 127.0
MIN_AMAX = 2.0 ** -120
E4M3_MAX = 448.0
P_E4M3_LOG2 = 8   # the kernels' dK/dV read LSE minus this, so that their exp2 yields P_E4M3_SCALE * P
P_E4M3_SCALE = 2.0 ** P_E4M3_LOG2


def _scaled(x: torch.Tensor, reduce_dims: tuple[int, ...]):
    """(x * 127 / amax, amax / 127): the values the rounding takes, and the scale."""
    amax = x.abs().amax(dim=reduce_dims, keepdim=True)
    nonzero = amax >= MIN_AMAX
    # Tensor-by-tensor: PyTorch turns a division with a Python scalar into a multiply by a
    # reciprocal (1 ulp off for ~25% of values), which a div_rn kernel would not reproduce.
    qmax = torch.full_like(amax, QMAX)
    scale = amax / qmax
    inv = torch.where(nonzero, qmax / torch.where(nonzero, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    return x * inv, scale


def _quantize(x: torch.Tensor, reduce_dims: tuple[int, ...], enabled: bool):
    if not enabled:
        return x, torch.ones_like(x.amax(dim=reduce_dims, keepdim=True))
    scaled, scale = _scaled(x, reduce_dims)
    return torch.round(scaled).clamp_(-QMAX, QMAX), scale


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to FP8 e4m3 (nearest, ties to even; saturating at +-448), held in x's dtype."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def quantize_row_blocks_e4m3(x: torch.Tensor, block: int, enabled: bool = True):
    """Per-block FP8 e4m3 of ``x`` (..., N, D) over blocks of ``block`` rows: scale = amax / 448,
    q = e4m3(x * (448 / amax)). Returns q (..., N, D) in x's dtype and scale (..., N // block)."""
    *lead, n, d = x.shape
    xb = x.reshape(*lead, n // block, block, d)
    if not enabled:
        return x, torch.ones(*lead, n // block, dtype=x.dtype, device=x.device)
    amax = xb.abs().amax(dim=(-2, -1), keepdim=True)
    nonzero = amax >= MIN_AMAX
    qmax = torch.full_like(amax, E4M3_MAX)
    scale = amax / qmax
    inv = torch.where(nonzero, qmax / torch.where(nonzero, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    q = round_to_e4m3(x.reshape_as(xb) * inv)
    return q.reshape(*lead, n, d), scale.reshape(*lead, n // block)


def quantize_row_blocks(x: torch.Tensor, block: int, enabled: bool = True):
    """Per-block INT8 of ``x`` (..., N, D) over blocks of ``block`` rows.

    Returns q (..., N, D) and scale (..., N // block).
    """
    *lead, n, d = x.shape
    xb = x.reshape(*lead, n // block, block, d)
    q, scale = _quantize(xb, (-2, -1), enabled)
    return q.reshape(*lead, n, d), scale.reshape(*lead, n // block)


def quantize_tiles(x: torch.Tensor, block_rows: int, block_cols: int, enabled: bool = True):
    """Per-tile INT8 of a score-shaped ``x`` (..., N, M) over block_rows x block_cols tiles.

    Returns q viewed as (..., N // block_rows, block_rows, M // block_cols, block_cols)
    and scale (..., N // block_rows, M // block_cols).
    """
    *lead, n, m = x.shape
    xt = x.reshape(*lead, n // block_rows, block_rows, m // block_cols, block_cols)
    q, scale = _quantize(xt, (-3, -1), enabled)
    return q, scale.squeeze(-1).squeeze(-2)


def quantize_groups(x: torch.Tensor, group: int, dim: int, enabled: bool = True):
    """INT8 of ``x`` with one scale per run of ``group`` consecutive entries along ``dim``
    (every other index has its own scale): the "token" contract's granularity.

    ``dim=-1`` with ``group = D`` is per token (one scale per row of Q or K); on a score-shaped
    (..., N, M) tensor, ``dim=-1`` with ``group = block_kv`` gives each row one scale per kv tile,
    ``dim=-2`` with ``group = block_q`` each column one scale per q block.
    Returns q (x's shape) and scale (x's shape with ``dim`` divided by ``group``).
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    xg = x.reshape(*x.shape[:dim], n // group, group, *x.shape[dim + 1:])
    q, scale = _quantize(xg, (dim + 1,), enabled)
    return q.reshape(x.shape), scale.squeeze(dim + 1)


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    """Inverse of :func:`quantize_groups`."""
    return q * scale.repeat_interleave(group, dim=dim)


def dequantize_row_blocks(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    return q * scale.repeat_interleave(block, dim=-1).unsqueeze(-1)


def dequantize_tiles(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_tiles`: returns the (..., N, M) dequantised matrix."""
    *lead, tm, bq, tn, bk = q.shape
    return (q * scale[..., :, None, :, None]).reshape(*lead, tm * bq, tn * bk)
