"""The comparison as a Markdown file: source, table, column meanings, figures, run ids."""
from __future__ import annotations

from pathlib import Path

from experiments.compare.over_seeds import SEED_NOTES, SeedCell, format_seed_table
from experiments.compare.table import CellRow, column_notes, format_table

MATCH_RULE = ("Matching FPA cell: same TPS and variant (a variant that only sets the seed "
              "counts as none) and, among those, the same seed; QK-norm and smoothing only "
              "apply to SageBwd, so they do not take part (with several FPA cells at one TPS "
              "and seed, the one with the same QK-norm is used).")


def missing_metric_notes(rows: list[CellRow]) -> list[str]:
    """Columns no run could fill, so a reader knows a dash is "not logged", not zero."""
    started = [row for row in rows if row.record.run_id]
    notes = []
    if started and all(row.mfu is None for row in started):
        notes.append("MFU: no run logs an `mfu` metric yet")
    if started and all(not row.record.eval_loss for row in started):
        notes.append("best eval: no run has logged `eval_loss` yet")
    if started and all(row.record.total_steps is None for row in started):
        notes.append("steps: no run logged its total (`train.steps` param)")
    return notes


def write_report(rows: list[CellRow], path: Path, *, scope: str, source: str,
                 figures: list[Path], last_k: int, notes: list[str], ui_lines: list[str],
                 seed_cells: list[SeedCell] | None = None) -> Path:
    """source: where the records came from (one line). seed_cells: the over-seeds table,
    written after the per-run one (None: no such table)."""
    lines = [f"# SageBwd vs FPA: {scope}", "", source, "",
             format_table(rows), "", column_notes(last_k), MATCH_RULE, ""]
    all_notes = notes + missing_metric_notes(rows) + [
        f"{row.record.name}: {note}" for row in rows for note in row.record.notes]
    if all_notes:
        lines += ["Notes:", *[f"- {note}" for note in all_notes], ""]
    if seed_cells:
        cell_notes = [f"- {note}" for cell in seed_cells for note in cell.notes]
        lines += ["## Over seeds", "", format_seed_table(seed_cells), "", SEED_NOTES, "",
                  *cell_notes, *([""] if cell_notes else [])]
    lines += ["## Figures", "", *[f"![{figure.stem}]({figure.name})" for figure in figures]]
    lines += ["", "## Runs", ""]
    lines += [f"- {row.record.name}: `{row.record.run_id}`" if row.record.run_id
              else f"- {row.record.name}: not started" for row in rows]
    if ui_lines:
        lines += ["", "## Open in the MLflow UI", "", *[f"- {line}" for line in ui_lines]]
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
