"""The table over seeds: one row per cell with the seed removed (attention, QK-norm,
smoothing, quant, TPS, and any variant that sets more than the seed), from the per-run rows
of experiments.compare.table.

A cell's seeds are its runs that differ only in the seed: a manifest variant that sets the
seed and nothing else (CellAxes.seed_replica), or runs without a variant that logged
different `seed` params (an experiment's runs). Per cell: how many seeds finished, the mean
and sd over seeds of the final eval loss (the last logged `eval_loss`), the mean best eval
loss, and the paired gap to FPA: per seed, this run's final eval loss minus that of its
matching FPA run (table.matching_fpa) when that run has the same seed, then the mean of
those differences with its standard error (experiments.compare.stats.summarise). Only
finished runs count; a diverged seed is left out of every mean and named in the row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from experiments.compare.records import FINISHED, PENDING, CellAxes, RunRecord
from experiments.compare.stats import SeedSummary, mean_sd, summarise
from experiments.compare.table import NO_VALUE, CellRow, axis_cells, number

COLUMNS = ("cell", "TPS", "attention", "QK-norm", "smoothing", "seeds", "final eval", "sd",
           "best eval", "Δ vs FPA", "s.e.", "Δ / s.e.", "diverged")


@dataclass(frozen=True)
class SeedCell:
    name: str
    axes: CellAxes                   # without the seed
    runs: tuple[CellRow, ...]        # one per seed, in table order
    counted: tuple[CellRow, ...]     # finished, not diverged, with a finite final eval loss
    diverged: tuple[CellRow, ...]
    final_eval: SeedSummary          # of the counted final eval losses; the paired gap to FPA
    best_eval: float | None          # mean over the counted seeds of the best eval loss
    has_fpa: bool                    # some run of the cell has a matching FPA cell
    notes: tuple[str, ...] = ()


def final_eval_loss(record: RunRecord) -> float | None:
    return record.eval_loss[-1][1] if record.eval_loss else None


def counts(row: CellRow) -> bool:
    """A seed that enters the means: finished, not diverged, with a finite final eval loss."""
    final = final_eval_loss(row.record)
    return (row.record.status == FINISHED and row.diverged_at is None and final is not None
            and math.isfinite(final))


def _seed_text(seed: int | None) -> str:
    return "?" if seed is None else str(seed)


def _without_seed_name(record: RunRecord) -> str:
    """main-tps2.1m-fpa-qknorm-s1 -> main-tps2.1m-fpa-qknorm; fpa-seed1337 -> fpa-seed."""
    a, name = record.axes, record.name
    if a.seed_replica and a.variant and name.endswith("-" + a.variant):
        return name[:-len(a.variant) - 1]
    seed = _seed_text(record.seed)
    if record.seed is not None and name.endswith(seed) and name != seed:
        return name[:-len(seed)].rstrip("-_")
    return name


def seed_cells(rows: list[CellRow]) -> list[SeedCell]:
    """The per-run rows pooled over seeds, cells in the order of their first run."""
    groups: dict[CellAxes, list[CellRow]] = {}
    for row in rows:
        groups.setdefault(row.record.axes.without_seed, []).append(row)
    by_record = {id(row.record): row for row in rows}
    cells = []
    for key, members in groups.items():
        runs, seen, notes = [], {}, []
        for row in members:   # one run per seed: a second one is named and left out
            seed = row.record.seed
            if seed in seen:
                notes.append(f"{row.record.name} has seed {_seed_text(seed)} like "
                             f"{seen[seed]}: left out of the over-seeds table")
            else:
                seen[seed] = row.record.name
                runs.append(row)
        counted = [row for row in runs if counts(row)]
        finals = {row.record.seed: final_eval_loss(row.record) for row in counted}
        baseline = None
        if key.attention != "fpa":
            baseline = {}
            for row in counted:
                base = by_record.get(id(row.baseline)) if row.baseline is not None else None
                if base is not None and base.record.seed == row.record.seed and counts(base):
                    baseline[row.record.seed] = final_eval_loss(base.record)
        best, _ = mean_sd(row.best_eval_loss for row in counted)
        cells.append(SeedCell(
            name=" / ".join(dict.fromkeys(_without_seed_name(row.record) for row in runs)),
            axes=key, runs=tuple(runs), counted=tuple(counted),
            diverged=tuple(row for row in runs if row.diverged_at is not None),
            final_eval=summarise(finals, baseline), best_eval=best,
            has_fpa=any(row.baseline is not None for row in runs), notes=tuple(notes)))
    return cells


def has_several_seeds(cells: list[SeedCell]) -> bool:
    """Whether the table says more than the per-run one: some cell has two seeds or more."""
    return any(len(cell.runs) > 1 for cell in cells)


# --- text ------------------------------------------------------------------------------

def _gap_cells(cell: SeedCell) -> list[str]:
    if cell.axes.attention == "fpa":
        return ["baseline", NO_VALUE, NO_VALUE]
    if not cell.has_fpa:
        return ["no FPA cell", NO_VALUE, NO_VALUE]
    s = cell.final_eval
    gap = number(s.gap, "+.4f")
    if s.gap is not None and s.paired_seeds < s.seeds:
        gap += f" ({s.paired_seeds} of {s.seeds} seeds paired)"
    ratio = number(s.gap / s.gap_se, "+.1f") if s.gap is not None and s.gap_se else NO_VALUE
    return [gap, number(s.gap_se, ".4f"), ratio]


def _diverged(cell: SeedCell) -> str:
    if not cell.diverged:
        return "no" if any(row.record.status != PENDING for row in cell.runs) else NO_VALUE
    seeds = "; ".join(f"seed {_seed_text(row.record.seed)} at step {row.diverged_at:,}"
                      for row in cell.diverged)
    return f"**yes**, {len(cell.diverged)} of {len(cell.runs)}: {seeds} (left out)"


def row_cells(cell: SeedCell) -> list[str]:
    s = cell.final_eval
    return [cell.name, *axis_cells(cell.axes), f"{len(cell.counted)}/{len(cell.runs)}",
            number(s.mean, ".4f"), number(s.sd, ".4f"), number(cell.best_eval, ".4f"),
            *_gap_cells(cell), _diverged(cell)]


def format_seed_table(cells: list[SeedCell]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(cell)) + " |" for cell in cells]
    return "\n".join(lines)


SEED_NOTES = (
    "Over seeds: one row per cell, its seeds pooled (runs that differ only in the seed). "
    "seeds: finished runs counted / runs of the cell; running, pending, failed and diverged "
    "runs are left out of every mean. final eval: mean over seeds of the last logged eval "
    "loss; sd: its standard deviation over seeds; best eval: mean of each seed's lowest eval "
    "loss. Δ vs FPA is paired: per seed, this cell's final eval loss minus the matching FPA "
    "cell's on the same seed and TPS, then the mean of those differences over the seeds both "
    "finished; s.e.: their standard deviation / √n (— with one seed); Δ / s.e.: how many "
    "standard errors the gap is from zero. diverged: seeds with a non-finite train loss, "
    "left out of the means.")
