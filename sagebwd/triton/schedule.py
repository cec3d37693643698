"""The order in which the forward's and dQ's programs start: one rule for the kernels over q tiles.

Such a kernel over B*H heads x `tiles` q tiles is a 1-D grid of tiles * B*H programs, and
`_common.program_tile` gives each program its (rank, head): rank 0 is the tile with the most work under the
causal mask (the last q block). The GPU starts programs in id order.

Heads go in sections of `heads_per_section`, rank-major inside a section: every head's longest tile of the
section starts first and the shortest fill the end, longest processing time first (FlashAttention-3's LPT
tile scheduler does the same), while the operands the section's programs read whole (K^ and V^ for a forward,
K^, K^T and V for a dQ) stay within L2_SECTION_BYTES, so that a head's tiles still share them in L2. In the
head-major order (each head's tiles together, longest first) the last heads' longest tiles started when the
other SMs were running out of work. Kernel A/B on an H100 (docs/kernel-notes.md, "Longest tiles first"),
causal: forward -4.4% / -8.3% / -4.4% and dQ -2.9% / -6.0% / -3.5% at (8,16,4096,64) / (4,12,4096,64) /
(8,8,4096,128). The dK/dV kernels (one program per SM) keep the head-major order of a 2-D grid: in sections
they measured +3.0% / -0.6% / -0.2%. Without the mask all tiles have the same work: one head per section,
the head-major order.
"""
from __future__ import annotations

# Bytes that a section's heads may read whole: a third of the H100's 50 MB L2.
L2_SECTION_BYTES = 16 * 2**20


def heads_per_section(causal: bool, heads: int, streamed) -> int:
    """Heads per section for a launch over `heads` heads (B*H) whose every program reads the tensors
    `streamed` (all heads of each) of its head whole: as many as L2_SECTION_BYTES hold, in sections of equal
    size; 1 without the causal mask."""
    if not causal:
        return 1
    per_head = max(1, sum(t.numel() * t.element_size() for t in streamed if t is not None) // heads)
    most = max(1, L2_SECTION_BYTES // per_head)
    sections = -(-heads // most)
    return -(-heads // sections)


def tile_grid(tiles: int, heads: int) -> tuple:
    """The 1-D grid of a launch over `heads` heads of `tiles` tiles each (program_tile decodes it)."""
    return (tiles * heads,)
