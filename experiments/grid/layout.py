"""Tokens per step -> how a run is laid out on a node type.

TPS = global_batch x seq_len and global_batch = micro_batch x grad_accum x DP, with
DP = world / SP (a sequence-parallel group shares each sequence). Everything here is
integer arithmetic; a TPS that does not split evenly is an error, never rounded.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments.grid.manifest import Parallel, TpsPoint
from experiments.grid.nodes import NodeProfile


class LayoutError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Layout:
    nodes: int
    procs_per_node: int
    sp: int
    micro_batch: int
    grad_accum: int
    zero_stage: int

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def dp(self) -> int:
        return self.world // self.sp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def check_sequence_parallel(sp: int, world: int, seq_len: int, num_heads: int, where: str) -> None:
    """SP splits each sequence across `sp` ranks and (Ulysses all-to-all) the heads too."""
    if sp == 1:
        return
    for what, size in (("the world size", world), ("model.seq_len", seq_len),
                       ("model.num_heads", num_heads)):
        if size % sp:
            raise LayoutError("parallel.sp", f"sp={sp} must divide {what} ({size}) {where}; "
                              f"pick an sp that divides {size}")


def plan_layout(tps_label: str, point: TpsPoint, *, seq_len: int, num_heads: int,
                parallel: Parallel, node: NodeProfile) -> Layout:
    world = parallel.nodes * node.procs_per_node
    where = (f"on {parallel.nodes} x {node.name} ({world} "
             f"{'GPUs' if node.accelerator == 'gpu' else 'processes'})")
    check_sequence_parallel(parallel.sp, world, seq_len, num_heads, where)
    dp = world // parallel.sp
    key = f"tps.{tps_label}.tokens"
    if point.tokens % seq_len:
        raise LayoutError(key, f"{point.tokens} tokens per step is not a whole number of "
                          f"{seq_len}-token sequences; use a multiple of {seq_len}")
    global_batch = point.tokens // seq_len
    if global_batch % dp:
        raise LayoutError(key, f"TPS {point.tokens} = {global_batch} sequences of {seq_len} cannot "
                          f"be reached {where}: the global batch must split evenly over "
                          f"DP={dp} ranks; use a multiple of {dp * seq_len} tokens, fewer nodes, "
                          "or a larger sp")
    per_rank = global_batch // dp
    if parallel.micro_batch is not None:
        micro = parallel.micro_batch
        if per_rank % micro:
            raise LayoutError("parallel.micro_batch",
                              f"micro_batch {micro} does not divide the {per_rank} sequences per "
                              f"rank of tps {tps_label} {where}; pick a divisor of {per_rank}")
    else:
        # The node's micro-batch is what fits in memory; a smaller divisor keeps TPS exact.
        micro = largest_divisor_at_most(per_rank, node.default_micro_batch)
    zero = node.zero_stage if parallel.zero_stage is None else parallel.zero_stage
    return Layout(nodes=parallel.nodes, procs_per_node=node.procs_per_node, sp=parallel.sp,
                  micro_batch=micro, grad_accum=per_rank // micro, zero_stage=zero)
