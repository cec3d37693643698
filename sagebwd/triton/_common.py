"""Small Triton helpers shared by the SageBwd kernels: the INT8 rounding rule and launch settings.

The quantisation rule is the one in :mod:`sagebwd.quant` (the paper's psi): per block,
``scale = amax / 127``, ``inv = 127 / amax`` (0 for an all-zero block), both single
IEEE-rounded fp32 divisions (``div_rn``: Triton's ``/`` is approximate on the GPU), and
``q = round_half_to_even(x * inv)``, which already lies in [-127, 127].
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# The last compiled kernel of each launcher, for the benchmark's register/spill/SASS report.
COMPILED: dict = {}


# Launch settings (num_warps, num_stages) to use instead of the defaults, by kernel name;
# set only by the benchmark's sweep.
LAUNCH_OVERRIDES: dict = {}


def remember(name: str, compiled) -> None:
    COMPILED[name] = compiled


def launch_settings(name: str, default: dict) -> dict:
    if interpreting():
        return dict(num_warps=1, num_stages=1)
    return {**default, **LAUNCH_OVERRIDES.get(name, {})}


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU interpreter): then run one fixed config, no autotuning."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def round_half_even(x):
    # Adding 1.5 * 2**23 leaves no fraction bits, so the FPU rounds to an integer with its
    # default mode (ties to even, like torch.round); exact for |x| < 2**22 (here |x| <= 127).
    return (x + 12582912.0) - 12582912.0


@triton.jit
def block_scales(amax):
    """(scale, inv) of a block with absolute maximum ``amax`` (fp32 scalar)."""
    scale = tl.math.div_rn(amax, 127.0)
    inv = tl.where(amax > 0, tl.math.div_rn(127.0, tl.maximum(amax, 1e-30)), 0.0)
    return scale, inv


@triton.jit
def quantize_tile(x):
    """Per-tile INT8 of a 2-D fp32 tile: returns (int8 tile, scale)."""
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale, inv = block_scales(amax)
    return round_half_even(x * inv).to(tl.int8), scale
