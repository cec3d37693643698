"""One comparison of a grid's (or an experiment's) runs from MLflow: select the runs, compute
the tables, draw the figures, write report.md (and with export, the records as JSON) and log
it back. `python -m experiments compare` (experiments.compare.command) and the demo call
compare_experiment or compare_manifest; compare_export redoes a comparison from its export
file without MLflow. docs/compare.md explains the result.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.compare.over_seeds import (SeedCell, format_seed_table, has_several_seeds,
                                            seed_cells)
from experiments.compare.records import RunRecord
from experiments.compare.store import (ARTIFACT_DIR, CompareError, Selection, comparison_run,
                                       connect, log_report, select_experiment, select_grid,
                                       ui_instructions)
from experiments.compare.table import CellRow, cell_order, compare, format_table
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
    export: Path | None = None    # the records as JSON (--export)


def _default_out(scope: str) -> Path:
    return DEFAULT_OUT_ROOT / re.sub(r"[^A-Za-z0-9_.@-]+", "-", scope.split(" ", 1)[-1])


def render(records: list[RunRecord], *, scope: str, notes: list[str], out: Path | None,
           last_k: int, where: str, source_line: str, source: dict, ui_lines: list[str],
           report_run_id: str | None, export: Path | None,
           say: Callable[[str], None]) -> Comparison:
    """The tables, figures, report.md and (with export) the export file from records; no
    MLflow here, so an export redoes exactly this. where/source_line/source say where the
    records came from (the printed header, the report's first line, the export's "source")."""
    from experiments.compare.export import write_export
    from experiments.compare.figures import write_figures
    from experiments.compare.report import write_report

    out = Path(out) if out else _default_out(scope)
    rows = compare(records, last_k=last_k)
    table = format_table(rows)
    cells = seed_cells(rows)
    seed_table = format_seed_table(cells) if has_several_seeds(cells) else None
    figures = write_figures(rows, out, title=scope)
    report = write_report(rows, out / "report.md", scope=scope, source=source_line,
                          figures=figures, last_k=last_k, notes=notes, ui_lines=ui_lines,
                          seed_cells=cells if seed_table else None)
    if export is not None:
        export = write_export(rows, Path(export), scope=scope, source=source, last_k=last_k,
                              notes=notes)
    say(f"{scope} ({len(rows)} runs, {where})")
    say(table)
    if seed_table:
        say("\nOver seeds (final eval loss; Δ vs FPA paired by seed: mean, its s.e.):")
        say(seed_table)
    for note in notes:
        say(f"note: {note}")
    say(f"Wrote {report} and {', '.join(f.name for f in figures)}"
        + (f"; the records in {export}" if export is not None else ""))
    return Comparison(rows, table, cells, seed_table, figures, report, report_run_id, ui_lines,
                      export)


def run_comparison(client, tracking_uri: str, selection: Selection, *, out: Path | None,
                   last_k: int, log: bool, say: Callable[[str], None],
                   export: Path | None = None) -> Comparison:
    name = selection.experiment.name
    report_run_id = comparison_run(client, selection) if log else None
    run_ids = [r.run_id for r in sorted(selection.records, key=cell_order) if r.run_id]
    ui_lines = ui_instructions(tracking_uri, selection.experiment.experiment_id,
                               report_run_id, run_ids)
    result = render(
        selection.records, scope=selection.scope, notes=selection.notes, out=out, last_k=last_k,
        where=f"experiment {name}, {tracking_uri}",
        source_line=f"MLflow store `{tracking_uri}`, experiment `{name}`"
        + (f", report logged on run `{report_run_id}`." if report_run_id else "."),
        source={"tracking_uri": tracking_uri, "experiment": name}, ui_lines=ui_lines,
        report_run_id=report_run_id, export=export, say=say)
    if log:
        log_report(client, report_run_id, [result.report, *result.figures,
                                           *([result.export] if result.export else [])])
        say(f"Logged them on run {report_run_id} under {ARTIFACT_DIR}/")
    for line in ui_lines:
        say(line)
    return result


def compare_export(path: str | Path, *, out: str | Path | None = None, last_k: int | None = None,
                   export: str | Path | None = None,
                   say: Callable[[str], None] = print) -> Comparison:
    """Redo a comparison from an export file (write_export), without MLflow. last_k may be
    the export's or smaller: the export keeps the last last_k steps the tables read."""
    from experiments.compare.export import read_export

    data = read_export(path)
    if last_k is None:
        last_k = data.last_k
    if last_k > data.last_k:
        raise CompareError(f"{path} was exported with --last-k {data.last_k}: it keeps each "
                           f"run's last {data.last_k} train losses, so --last-k {last_k} cannot "
                           f"be redone from it (use {data.last_k} or less)")
    uri, name = data.source.get("tracking_uri"), data.source.get("experiment")
    origin = f"MLflow store `{uri}`, experiment `{name}`" if uri else "an unnamed source"
    return render(data.records, scope=data.scope, notes=data.notes, out=out, last_k=last_k,
                  where=f"from {path}", source_line=f"From the export `{Path(path).name}`, "
                  f"read from {origin}.", source=data.source, ui_lines=[], report_run_id=None,
                  export=Path(export) if export else None, say=say)


def _tracking_uri(configured: str | None) -> str:
    from experiments.grid.tracking import resolve_tracking_uri

    return resolve_tracking_uri(configured)


def compare_experiment(experiment: str, *, tracking_uri: str | None = None,
                       out: str | Path | None = None, grid: str | None = None,
                       run_ids: list[str] | None = None, last_k: int = DEFAULT_LAST_K,
                       log: bool = True, export: str | Path | None = None,
                       say: Callable[[str], None] = print) -> Comparison:
    """Compare the runs of one experiment (one grid of it, or its runs without a grid;
    run_ids narrows it further, e.g. to the runs a demo just made). Raises CompareError."""
    uri = _tracking_uri(tracking_uri)
    client = connect(uri)
    selection = select_experiment(client, uri, experiment, grid=grid, run_ids=run_ids)
    return run_comparison(client, uri, selection, out=out, last_k=last_k, log=log, say=say,
                          export=Path(export) if export else None)


def compare_manifest(manifest: str | Path, *, node: str | None = None,
                     tracking_uri: str | None = None, out: str | Path | None = None,
                     last_k: int = DEFAULT_LAST_K, log: bool = True,
                     export: str | Path | None = None,
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
    return run_comparison(client, uri, selection, out=out, last_k=last_k, log=log, say=say,
                          export=Path(export) if export else None)
