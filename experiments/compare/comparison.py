"""One comparison of a grid's (or an experiment's) runs from MLflow: select the runs, compute
the table, draw the figures, write report.md and log it back. `python -m experiments
compare` (experiments.compare.command) and the demo call compare_experiment or
compare_manifest; docs/compare.md explains the result.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.compare.over_seeds import (SeedCell, format_seed_table, has_several_seeds,
                                            seed_cells)
from experiments.compare.store import (ARTIFACT_DIR, CompareError, Selection, comparison_run,
                                       connect, log_report, select_experiment, select_grid,
                                       ui_instructions)
from experiments.compare.table import CellRow, compare, format_table
from experiments.paths import RUNS_DIR

DEFAULT_LAST_K = 20
DEFAULT_OUT_ROOT = RUNS_DIR / "compare"


@dataclass(frozen=True)
class Comparison:
    """What one comparison produced (the demo and tests read it)."""

    rows: list[CellRow]
    table: str
    seed_cells: list[SeedCell]    # the rows pooled over seeds
    seed_table: str | None        # their table; None when no cell has two seeds
    figures: list[Path]
    report: Path
    report_run_id: str | None     # the run the files were logged on (None with log=False)
    ui_lines: list[str]


def _default_out(scope: str) -> Path:
    return DEFAULT_OUT_ROOT / re.sub(r"[^A-Za-z0-9_.@-]+", "-", scope.split(" ", 1)[-1])


def run_comparison(client, tracking_uri: str, selection: Selection, *, out: Path | None,
                   last_k: int, log: bool, say: Callable[[str], None]) -> Comparison:
    from experiments.compare.figures import write_figures
    from experiments.compare.report import write_report

    out = Path(out) if out else _default_out(selection.scope)
    rows = compare(selection.records, last_k=last_k)
    table = format_table(rows)
    cells = seed_cells(rows)
    seed_table = format_seed_table(cells) if has_several_seeds(cells) else None
    figures = write_figures(rows, out, title=selection.scope)
    report_run_id = comparison_run(client, selection) if log else None
    run_ids = [row.record.run_id for row in rows if row.record.run_id]
    ui_lines = ui_instructions(tracking_uri, selection.experiment.experiment_id,
                               report_run_id, run_ids)
    report = write_report(rows, out / "report.md", seed_cells=cells if seed_table else None, scope=selection.scope,
                          tracking_uri=tracking_uri, experiment=selection.experiment.name,
                          report_run_id=report_run_id, figures=figures, last_k=last_k,
                          notes=selection.notes, ui_lines=ui_lines)
    if log:
        log_report(client, report_run_id, [report, *figures])
    say(f"{selection.scope} ({len(rows)} cells, experiment {selection.experiment.name}, "
        f"{tracking_uri})")
    say(table)
    if seed_table:
        say("\nOver seeds (final eval loss; Δ vs FPA paired by seed: mean, its s.e.):")
        say(seed_table)
    for note in selection.notes:
        say(f"note: {note}")
    say(f"Wrote {report} and {', '.join(f.name for f in figures)}")
    if log:
        say(f"Logged them on run {report_run_id} under {ARTIFACT_DIR}/")
    for line in ui_lines:
        say(line)
    return Comparison(rows, table, cells, seed_table, figures, report, report_run_id, ui_lines)


def _tracking_uri(configured: str | None) -> str:
    from experiments.grid.tracking import resolve_tracking_uri

    return resolve_tracking_uri(configured)


def compare_experiment(experiment: str, *, tracking_uri: str | None = None,
                       out: str | Path | None = None, grid: str | None = None,
                       run_ids: list[str] | None = None, last_k: int = DEFAULT_LAST_K,
                       log: bool = True, say: Callable[[str], None] = print) -> Comparison:
    """Compare the runs of one experiment (one grid of it, or its runs without a grid;
    run_ids narrows it further, e.g. to the runs a demo just made). Raises CompareError."""
    uri = _tracking_uri(tracking_uri)
    client = connect(uri)
    selection = select_experiment(client, uri, experiment, grid=grid, run_ids=run_ids)
    return run_comparison(client, uri, selection, out=out, last_k=last_k, log=log, say=say)


def compare_manifest(manifest: str | Path, *, node: str | None = None,
                     tracking_uri: str | None = None, out: str | Path | None = None,
                     last_k: int = DEFAULT_LAST_K, log: bool = True,
                     say: Callable[[str], None] = print) -> Comparison:
    """Compare every cell of a manifest's grid on one node type, started or not."""
    from experiments.grid.errors import ManifestError
    from experiments.grid.plan import plan_manifest

    try:   # data paths are the training machines' business, not the comparison's
        plan = plan_manifest(manifest, node=node, check_paths=False)
    except ManifestError as err:
        raise CompareError(str(err)) from None
    uri = _tracking_uri(tracking_uri)
    client = connect(uri)
    selection = select_grid(client, uri, plan)
    return run_comparison(client, uri, selection, out=out, last_k=last_k, log=log, say=say)
