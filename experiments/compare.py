"""Compare a grid's runs from MLflow: the paper's table and loss curves, logged on the grid.

    python -m experiments compare --manifest main --node b200
    python -m experiments compare --experiment sagebwd-demo --out runs/compare/demo

Prints one row per cell (final train loss, best eval loss, gap to the matching FPA cell,
divergence, tokens/s, MFU, steps done), writes the loss-curve PNGs and report.md under
--out, logs them on the grid's parent run, and prints how to open it in the MLflow UI.
Running, failed and not yet started cells are shown as such. docs/compare.md explains it.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.compare_mlflow import (ARTIFACT_DIR, CompareError, Selection, comparison_run,
                                        connect, log_report, select_experiment, select_grid,
                                        ui_instructions)
from experiments.compare_table import CellRow, compare, format_table
from experiments.manifest import REPO_ROOT

DEFAULT_LAST_K = 20
DEFAULT_OUT_ROOT = REPO_ROOT / "runs" / "compare"


@dataclass(frozen=True)
class Comparison:
    """What one comparison produced (the demo and tests read it)."""

    rows: list[CellRow]
    table: str
    figures: list[Path]
    report: Path
    report_run_id: str | None     # the run the files were logged on (None with log=False)
    ui_lines: list[str]


def _default_out(scope: str) -> Path:
    return DEFAULT_OUT_ROOT / re.sub(r"[^A-Za-z0-9_.@-]+", "-", scope.split(" ", 1)[-1])


def run_comparison(client, tracking_uri: str, selection: Selection, *, out: Path | None,
                   last_k: int, log: bool, say: Callable[[str], None]) -> Comparison:
    from experiments.compare_figures import write_figures
    from experiments.compare_report import write_report

    out = Path(out) if out else _default_out(selection.scope)
    rows = compare(selection.records, last_k=last_k)
    table = format_table(rows)
    figures = write_figures(rows, out, title=selection.scope)
    report_run_id = comparison_run(client, selection) if log else None
    run_ids = [row.record.run_id for row in rows if row.record.run_id]
    ui_lines = ui_instructions(tracking_uri, selection.experiment.experiment_id,
                               report_run_id, run_ids)
    report = write_report(rows, out / "report.md", scope=selection.scope,
                          tracking_uri=tracking_uri, experiment=selection.experiment.name,
                          report_run_id=report_run_id, figures=figures, last_k=last_k,
                          notes=selection.notes, ui_lines=ui_lines)
    if log:
        log_report(client, report_run_id, [report, *figures])
    say(f"{selection.scope} ({len(rows)} cells, experiment {selection.experiment.name}, "
        f"{tracking_uri})")
    say(table)
    for note in selection.notes:
        say(f"note: {note}")
    say(f"Wrote {report} and {', '.join(f.name for f in figures)}")
    if log:
        say(f"Logged them on run {report_run_id} under {ARTIFACT_DIR}/")
    for line in ui_lines:
        say(line)
    return Comparison(rows, table, figures, report, report_run_id, ui_lines)


def _tracking_uri(configured: str | None) -> str:
    from experiments.manifest_tracking import resolve_tracking_uri

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
    from experiments.manifest_errors import ManifestError
    from experiments.manifest_plan import plan_manifest

    try:   # data paths are the training machines' business, not the comparison's
        plan = plan_manifest(manifest, node=node, check_paths=False)
    except ManifestError as err:
        raise CompareError(str(err)) from None
    uri = _tracking_uri(tracking_uri)
    client = connect(uri)
    selection = select_grid(client, uri, plan)
    return run_comparison(client, uri, selection, out=out, last_k=last_k, log=log, say=say)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", metavar="NAME_OR_FILE",
                        help="a manifest (experiments/manifests/NAME.yaml or a path): its grid")
    source.add_argument("--experiment", metavar="NAME", help="an MLflow experiment's runs")
    parser.add_argument("--node", help="with --manifest: the node profile the grid ran on "
                        "(default: the manifest's node)")
    parser.add_argument("--grid", help="with --experiment: the grid to compare, e.g. main@b200 "
                        "('none': the runs without a grid); needed when there are several")
    parser.add_argument("--runs", nargs="+", metavar="RUN_ID",
                        help="with --experiment: only these runs")
    parser.add_argument("--tracking-uri", help="MLflow store or server (default: "
                        "$MLFLOW_TRACKING_URI, else sqlite:///<repo>/.cache/mlflow.db)")
    parser.add_argument("--out", help=f"folder for report.md and the PNGs (default "
                        f"{DEFAULT_OUT_ROOT.relative_to(REPO_ROOT)}/<grid or experiment>)")
    parser.add_argument("--last-k", type=int, default=DEFAULT_LAST_K,
                        help="final train loss = mean of the last K logged steps "
                        "(default %(default)s)")
    parser.add_argument("--no-log", action="store_true",
                        help="do not log the report on the parent run (read-only)")


def main(args: argparse.Namespace) -> int:
    from mlflow.exceptions import MlflowException

    if args.last_k < 1:
        print(f"error: --last-k must be at least 1, got {args.last_k}", file=sys.stderr)
        return 2
    common = dict(tracking_uri=args.tracking_uri, out=args.out, last_k=args.last_k,
                  log=not args.no_log)
    try:
        if args.manifest:
            if args.grid or args.runs:
                raise CompareError("--grid and --runs go with --experiment; --manifest picks "
                                   "its grid itself (use --node for another node type)")
            compare_manifest(args.manifest, node=args.node, **common)
        else:
            if args.node:
                raise CompareError("--node goes with --manifest; with --experiment use --grid")
            compare_experiment(args.experiment, grid=args.grid, run_ids=args.runs, **common)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except MlflowException as err:
        print(f"error: MLflow could not read the runs: {err.message}", file=sys.stderr)
        return 2
    return 0
