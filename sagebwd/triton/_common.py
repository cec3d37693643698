"""Small Triton helpers shared by the SageBwd kernels: the INT8 rounding rule and the output layout.

The quantisation rule is the one in :mod:`sagebwd.quant` (the paper's psi): per block,
``scale = amax / 127``, ``inv = 127 / amax`` (0 for an all-zero block), both single
IEEE-rounded fp32 divisions (``div_rn``: Triton's ``/`` is approximate on the GPU), and
``q = round_half_to_even(x * inv)``, which already lies in [-127, 127].
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .. import quant

LOG2E = tl.constexpr(1.4426950408889634)   # kernels may read only constexpr globals
LN2 = tl.constexpr(0.6931471805599453)


def empty_in_layout_of(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dense tensor of t's shape in t's dimension order, head_dim innermost (contiguous where t's
    head_dim is not unit-stride): where the op writes O and the gradients, as FlashAttention does.
    In the model q, k, v are views of one (B, N, 3 H D) projection: O then comes out (B, N, H, D)
    in memory, which the output projection reads without a copy, and the gradients' (B, N, H, D)
    order lets autograd join them along the projection's last dim in one vectorised copy."""
    if t.stride(-1) != 1:
        return torch.empty(t.shape, device=t.device, dtype=dtype)
    return torch.empty_like(t, dtype=dtype)


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU interpreter): then run one fixed config, no autotuning."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRETING = tl.constexpr(interpreting())   # fixed at import, like Triton's own reading of the variable


@triton.jit
def program_tile(TILES, SECTION):
    """(rank, bh): the tile rank and head of this program in a grid of schedule.tile_grid(TILES, B*H), in
    schedule.py's order: heads in sections of SECTION, rank-major inside a section (SECTION 1: head-major).
    Rank 0 is the tile with the most work under the causal mask; each kernel maps rank to its tile.
    Callable from Gluon kernels too."""
    lin = tl.program_id(0)
    span = SECTION * TILES
    section = lin // span
    first = section * SECTION
    local = lin - section * span
    width = tl.minimum(SECTION, tl.num_programs(0) // TILES - first)   # the last section may be narrower
    return local // width, first + local % width


# Float -> int8 without a conversion instruction (F2I runs at 1/8 of the fp32 rate, and P and
# dS need one per score element): adding 1.5 * 2**23 to a float with |x| < 2**22 leaves no
# fraction bits, so the FPU rounds it to an integer with its default mode (ties to even, like
# torch.round), and that integer sits in the low mantissa bits: bits(x + 1.5 * 2**23) =
# 0x4B400000 + round(x), whose low byte is round(x) as an int8.
MAGIC_F = tl.constexpr(12582912.0)   # 1.5 * 2**23


@triton.jit
def to_16bit(x, dtype: tl.constexpr):
    """fp32 x in dtype (fp16 or bf16), rounded to nearest even, as torch's .to() and the GPU's conversion
    round. Triton's interpreter truncates fp32 -> bf16, so under it bf16 is rounded here on the bits (finite
    x)."""
    if INTERPRETING and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def mul_rn(a, b):
    """a * b rounded to fp32 on its own, as the contract's round(x * inv) reads.

    The GPU compiler contracts `a * b + c` into one fma, which rounds the exact product: with
    bf16 inputs x / amax is often a short dyadic fraction, x * inv then lands on a .5 tie after
    fp32 rounding but just below it exactly, and the fma path rounds the other way (measured:
    ~7e-4 of Q^ and V^ entries on an H200). The interpreter may hold the product in fp64; the
    cast rounds it to fp32 (an fp64 product of two fp32 values is exact).
    """
    if INTERPRETING:
        return (a * b).to(tl.float32)
    return libdevice.mul_rn(a, b)


@triton.jit
def round_to_int8(x):
    """int8 round(x) (ties to even) of fp32 x with |x| <= 127.

    The low byte of 0x4B400000 + round(x) is round(x) in two's complement (the magic number's
    low byte is zero), so truncating the bit pattern is the whole conversion.
    """
    return (x + MAGIC_F).to(tl.int32, bitcast=True).to(tl.int8)


# FP8 e4m3 (the token contract's dV = P^T dO; sagebwd.quant): P with the static scale 1/256 (P <= 1),
# dO^ per block with amax / 448.
P_E4M3_SCALE = tl.constexpr(quant.P_E4M3_SCALE)
P_E4M3_LOG2 = tl.constexpr(float(quant.P_E4M3_LOG2))
E4M3_MAX = tl.constexpr(quant.E4M3_MAX)
MIN_AMAX = tl.constexpr(quant.MIN_AMAX)   # below it a block's scale inverse is 0


@triton.jit
def to_e4m3(x):
    """FP8 e4m3 of fp32 x with |x| <= 448: round to nearest, ties to even, as the GPU's conversion
    (cvt.rn.satfinite.e4m3x2.f32) and torch's float8_e4m3fn do.

    Triton's interpreter converts fp32 -> fp8 by truncating the significand and adding the first
    dropped bit, without the carry into the exponent (1.95 -> 1.0, not 2.0; Triton 3.7), so there
    the value is first rounded to e4m3's precision in fp32, exactly (x + C - C with C = 1.5 * 2^23
    times e4m3's step at x's exponent, 2^-9 below the normal range), and the conversion is then exact.
    """
    if INTERPRETING:
        exponent = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
        c = (((tl.maximum(exponent, 121) + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
        x = (x + c) - c
    return x.to(tl.float8e4nv)


@triton.jit
def magic_to_int8(y):
    """int8 of y = round(x) + MAGIC_F (the rounded value still in the magic domain)."""
    return y.to(tl.int32, bitcast=True).to(tl.int8)


@triton.jit
def round_scaled_to_int8(x, inv):
    """int8 round(x * inv), for the backward's and forward's own tiles (P, dS), |x * inv| <= 127.

    One fma (x * inv + MAGIC_F) rounds the exact product instead of fl(x * inv): they differ
    only when fl(x * inv) lands on a .5 tie that the exact product misses. That exactness
    matters for Q^, K^, V^, dO^ (bf16 inputs make ties common, see mul_rn), not here: these
    tiles are recomputed with exp2 and tensor-core sums that already differ from the
    simulation in the last bits.
    """
    return magic_to_int8(x * inv + MAGIC_F)


# dS^ in the dK/dV kernels. They quantise dS = P (dP - delta) with the tile scale s_dS the dQ
# kernel measured, but compute dP in the other orientation: its sums run in another order, and
# where dP - delta cancels that difference is all of dS, so a value can land past the amax and
# must saturate at +-127, not wrap. Written as y = clamp(dS / (254 s_dS) + 1/2, 0, 1) and
# int8 = round(254 y) - 127, the clamp is the fma's own saturation (ptxas folds the min/max
# into FFMA.SAT), and with kq = 1 / (254 s_dS) folded into dP - delta, the whole step is three
# fmas where the plain form took FADD, FMUL, FFMA and two clamps (FMNMX): -1.4 instructions
# per score element. It differs from round(dS / s_dS) within ~1.5e-5 of a rounding tie
# (y carries 24 bits over [0, 1], a step is 1/254) and on exact ties (the offset 127 is odd):
# flips of one step in ~1e-5 of the elements, which moved dK from 1.9e-4 to 4.6e-4 of the
# simulation's (rel. L2, H200 --check; tolerance 5e-3, the INT8 error itself ~4.5e-2). Keeping
# the exact dP - delta (FADD, FMUL before the FFMA.SAT) changed none of that and cost 2-4% of
# the d=64 dK/dV. Gluon: dkdv_hopper.
DS_SPAN = tl.constexpr(254.0)


@triton.jit
def saturated_ds_to_int8(p, dp, delta_kq, kq):
    """int8 of clamp(round(p * (dp - delta) / s_dS), -127, 127), given kq = 1 / (254 s_dS) and
    delta_kq = delta * kq (rounded on its own: the Gluon kernel computes it once per column)."""
    u = tl.fma(dp, kq, -delta_kq)
    y = tl.minimum(tl.maximum(tl.fma(p, u, 0.5), 0.0), 1.0)
    return magic_to_int8(tl.fma(y, DS_SPAN, MAGIC_F - 127.0))


# Sequence order of the transposed (B, H, D, N) copies Q^T, K^T, V^T, dO^T ("k order"): within
# each 16 positions, stored position 4t + 2h + p holds sequence index 8h + 2t + p (t < 4; h, p < 2).
# That is the order in which a Hopper wgmma (or mma.sync) accumulator gives thread t of a quad the
# columns of its row, and the A operand of an INT8 dot wants 4 consecutive k per thread: with the
# B operand's rows (these copies) in k order, P^ and dS^ go from the accumulator into the A operand
# inside each thread, by the same permutation of their columns (to_k_order), instead of through
# byte shuffles between lanes (SHFL, SEL, PRMT: 0.75 instructions per quantised element).
# FlashAttention-3 permutes its FP8 V for the same reason. The product is unchanged: both sides
# of the reduction are permuted alike.


@triton.jit
def to_k_order(x):
    """x (R, C) with its columns permuted into k order (C a multiple of 16): column 16g + 4t + 2h + p
    of the result is column 16g + 8h + 2t + p of x."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(tl.reshape(x, [R, C // 16, 2, 4, 2]), [0, 1, 3, 2, 4]), [R, C])


def k_order_index(n: int, device=None):
    """The sequence index stored at each of the n positions of a k-ordered copy (n a multiple of 16):
    ``copy[..., i] = x[..., k_order_index(n)[i]]``."""
    import torch
    return torch.arange(n, device=device).reshape(n // 16, 2, 4, 2).permute(0, 2, 1, 3).reshape(n)


def from_k_order(copy):
    """A k-ordered (..., D, N) copy back in sequence order (for checks against the simulation)."""
    out = copy.clone()
    out[..., k_order_index(copy.shape[-1], copy.device)] = copy
    return out


@triton.jit
def int_to_float(x):
    """fp32 of an int32 dot result (exact: INT8 dots here stay below 127 * 127 * 256 < 2**24).

    A plain conversion: on Hopper it is one I2FP, which measured faster than the magic-number
    form (add 0x4B400000, reinterpret, subtract 1.5 * 2**23: two ops, plus MOVs that preset
    the dot's accumulator): -3% over forward, dQ and dK/dV (docs/kernel-notes.md).
    """
    return x.to(tl.float32)


@triton.jit
def block_scales(amax):
    """(scale, inv) of a block with absolute maximum ``amax`` (fp32 scalar)."""
    scale = tl.math.div_rn(amax, 127.0)
    inv = tl.where(amax > 0, tl.math.div_rn(127.0, tl.maximum(amax, 1e-30)), 0.0)
    return scale, inv


@triton.jit
def tile_scales(amax, EXACT_SCALE: tl.constexpr):
    """(scale, inv) of a P or dS tile (the dQ kernels' per-tile scales): inv by the GPU's
    approximate division (MUFU.RCP and a multiply, within 2 ulps), the scale by a multiply with
    fl(1/127) (1 ulp), or by IEEE division if EXACT_SCALE. These tiles already differ from the
    simulation in their last bits (exp2, tensor-core sums), and the IEEE divisions of
    block_scales take ~8 instructions each with a slow-path check, four per tile: 1.5 of the
    d=64 dQ kernel's 19 instructions per score element. inv never exceeds 127 / amax by
    enough to round amax past 127. EXACT_SCALE is for the d=128 Gluon dQ (dq_hopper), where the
    multiply moved ptxas from 252 registers to 255 and 16 bytes of spills (+2..5%)."""
    if EXACT_SCALE:
        scale = tl.math.div_rn(amax, 127.0)
    else:
        scale = amax * (1.0 / 127.0)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    return scale, inv


@triton.jit
def quantize_token_rows(x):
    """The token contract's INT8 of a (rows, D) fp32 tile, one scale per row: (int8 rows, scales). Called by the
    quantise pass (K, and Q with Q-smoothing) and by the token forward, which quantises Q itself."""
    scale, inv = block_scales(tl.max(tl.abs(x), axis=1))
    return round_to_int8(mul_rn(x, inv[:, None])), scale


@triton.jit
def quantize_tile(x):
    """Per-tile INT8 of a 2-D fp32 tile: returns (int8 tile, scale)."""
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale, inv = block_scales(amax)
    return round_to_int8(mul_rn(x, inv)), scale
