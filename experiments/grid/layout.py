"""Tokens per step -> how a run is laid out on a node type.

The arithmetic is launcher.layout's (split_tokens_per_step, the trainer's own rule); this
module picks its inputs from the manifest and the node profile (world = nodes x processes
per node; the node's micro-batch unless parallel.micro_batch is set) and words a failure
in the manifest's keys.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments.grid.manifest import Parallel, TpsPoint
from experiments.grid.nodes import NodeProfile
from launcher.layout import (MICRO_BATCH, OVER_DP, SP_WORLD, WHOLE_SEQUENCES, Layout, LayoutError,
                             sp_misfits, split_tokens_per_step)


class PlanError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class PlannedLayout(Layout):
    """The trainer's Layout plus where it runs: nodes x processes per node, ZeRO stage."""

    nodes: int = 1
    procs_per_node: int = 1
    zero_stage: int = 0


def plan_layout(tps_label: str, point: TpsPoint, *, seq_len: int, num_heads: int,
                parallel: Parallel, node: NodeProfile) -> PlannedLayout:
    world = parallel.nodes * node.procs_per_node
    where = (f"on {parallel.nodes} x {node.name} ({world} "
             f"{'GPUs' if node.accelerator == 'gpu' else 'processes'})")
    sizes = {"the world size": world, "model.seq_len": seq_len, "model.num_heads": num_heads}
    misfits = sp_misfits(parallel.sp, **sizes)
    if misfits:
        what, size = next(iter(misfits.items()))
        raise PlanError("parallel.sp", f"sp={parallel.sp} must divide {what} ({size}) {where}; "
                        f"pick an sp that divides {size}")
    try:
        layout = split_tokens_per_step(point.tokens, seq_len=seq_len, world=world, sp=parallel.sp,
                                       micro_batch=parallel.micro_batch,
                                       max_micro_batch=node.default_micro_batch)
    except LayoutError as err:
        raise _plan_error(err, tps_label, point, seq_len, parallel, where) from None
    zero = node.zero_stage if parallel.zero_stage is None else parallel.zero_stage
    return PlannedLayout(**vars(layout), nodes=parallel.nodes, procs_per_node=node.procs_per_node,
                         zero_stage=zero)


def _plan_error(err: LayoutError, tps_label: str, point: TpsPoint, seq_len: int,
                parallel: Parallel, where: str) -> PlanError:
    key = f"tps.{tps_label}.tokens"
    if err.reason == WHOLE_SEQUENCES:
        return PlanError(key, f"{point.tokens} tokens per step is not a whole number of "
                         f"{seq_len}-token sequences; use a multiple of {seq_len}")
    if err.reason == OVER_DP:
        return PlanError(key, f"TPS {point.tokens} = {err.global_batch} sequences of {seq_len} "
                         f"cannot be reached {where}: the global batch must split evenly over "
                         f"DP={err.dp} ranks; use a multiple of {err.dp * seq_len} tokens, fewer "
                         "nodes, or a larger sp")
    if err.reason == MICRO_BATCH:
        return PlanError("parallel.micro_batch",
                         f"micro_batch {parallel.micro_batch} does not divide the {err.per_rank} "
                         f"sequences per rank of tps {tps_label} {where}; pick a divisor of "
                         f"{err.per_rank}")
    assert err.reason == SP_WORLD, err.reason   # plan_layout checked sp against the world
    return PlanError("parallel.sp", str(err))
