"""Grid cells and their names.

A grid is a list of blocks; each block is the product of its axes, and the grid is the
union of the blocks (so FPA need not be crossed with smoothing values it has no use for).
Run names are built from the cell's effective values in a fixed axis order, so the same
cell always gets the same name: `main-tps2.1m-sagebwd-qknorm-k`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from experiments.grid.manifest import CommandManifest, TrainManifest


@dataclass(frozen=True)
class TrainCell:
    """Axis values of one training cell; None = not on an axis, the base config decides."""

    block: int
    tps: str
    attention: str | None
    qk_norm: bool | None
    smoothing: str | None
    variant: str | None                 # label on the free overrides axis
    variant_overrides: tuple[tuple[str, Any], ...] = ()
    quant: str | None = None


def train_cells(manifest: TrainManifest) -> list[TrainCell]:
    cells = []
    for index, block in enumerate(manifest.grid):
        variants = list((block.overrides or {None: {}}).items())
        for tps, attention, qk_norm, smoothing, quant, (variant, extra) in itertools.product(
                block.tps or list(manifest.tps), block.attention or [None],
                block.qk_norm or [None], block.smoothing or [None], block.quant or [None], variants):
            cells.append(TrainCell(index, tps, attention, qk_norm, smoothing, variant,
                                   tuple(extra.items()), quant))
    return cells


def train_run_name(manifest: str, tps: str, attention: str, qk_norm: bool, smoothing: str,
                   variant: str | None, quant: str = "block") -> str:
    """Smoothing and the quantisation contract only concern SageBwd, so FPA names leave them
    out; the paper's contract ("block") is left out too, so its names are as they always were."""
    parts = [manifest, f"tps{tps}", attention, "qknorm" if qk_norm else "noqknorm"]
    if attention == "sagebwd":
        parts.append(smoothing)
        if quant != "block":
            parts.append(quant)
    if variant:
        parts.append(variant)
    return "-".join(parts)


@dataclass(frozen=True)
class CommandCell:
    name: str
    axes: dict[str, str]            # axis -> label
    extra_args: tuple[str, ...]     # the chosen labels' arguments, in axis order


def command_cells(manifest: CommandManifest) -> list[CommandCell]:
    cells = []
    for block in manifest.grid:
        axes = list(block.items())
        for choice in itertools.product(*(list(values.items()) for _, values in axes)):
            labels = {axis: label for (axis, _), (label, _) in zip(axes, choice)}
            extra = tuple(arg for _, args in choice for arg in args)
            name = "-".join([manifest.name, *labels.values()])
            cells.append(CommandCell(name, labels, extra))
    return cells
