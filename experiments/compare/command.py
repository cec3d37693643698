"""Compare a grid's runs from MLflow: the paper's table and loss curves, logged on the grid.

    python -m experiments compare --manifest main --node b200
    python -m experiments compare --experiment sagebwd-demo --out runs/compare/demo
    python -m experiments compare --manifest paper-small --export docs/measurements/x.json
    python -m experiments compare --from-export docs/measurements/x.json --out docs/img/x

Prints one row per run (final train loss, best eval loss, gap to the matching FPA cell,
divergence, tokens/s, MFU, steps done) and, when cells ran over several seeds, one row per
cell over its seeds (mean final eval loss, the gap to FPA paired by seed with its standard
error); writes the loss-curve PNGs and report.md under --out, logs them on the grid's parent
run, and prints how to open it in the MLflow UI. Running, failed and not yet started cells
are shown as such. --export writes the records behind it all to a small JSON file, and
--from-export redoes the tables and figures from one without MLflow. docs/compare.md
explains it.
"""
from __future__ import annotations

import argparse
import sys

from experiments.compare.comparison import (DEFAULT_LAST_K, DEFAULT_OUT_ROOT, compare_experiment,
                                            compare_export, compare_manifest)
from experiments.compare.store import CompareError
from experiments.paths import REPO_ROOT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", metavar="NAME_OR_FILE",
                        help="a manifest (experiments/manifests/NAME.yaml or a path): its grid")
    source.add_argument("--experiment", metavar="NAME", help="an MLflow experiment's runs")
    source.add_argument("--from-export", metavar="FILE.json",
                        help="redo the tables, figures and report from an --export file, "
                        "without MLflow")
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
    parser.add_argument("--last-k", type=int,
                        help=f"final train loss = mean of the last K logged steps (default "
                        f"{DEFAULT_LAST_K}; with --from-export, the export's)")
    parser.add_argument("--export", metavar="FILE.json",
                        help="also write the records the tables and figures were made from "
                        "(per run: axes, status, seed, eval loss, thinned train loss, medians) "
                        "to FILE.json, small enough to commit")
    parser.add_argument("--no-log", action="store_true",
                        help="do not log the report on the parent run (read-only)")


def main(args: argparse.Namespace) -> int:
    from mlflow.exceptions import MlflowException

    if args.last_k is not None and args.last_k < 1:
        print(f"error: --last-k must be at least 1, got {args.last_k}", file=sys.stderr)
        return 2
    common = dict(tracking_uri=args.tracking_uri, out=args.out,
                  last_k=args.last_k or DEFAULT_LAST_K, log=not args.no_log, export=args.export)
    try:
        if args.from_export:
            used = [flag for flag, value in (("--node", args.node), ("--grid", args.grid),
                                             ("--runs", args.runs),
                                             ("--tracking-uri", args.tracking_uri)) if value]
            if used:
                raise CompareError("--from-export reads only its file, not MLflow: drop "
                                   + ", ".join(used))
            compare_export(args.from_export, out=args.out, last_k=args.last_k, export=args.export)
        elif args.manifest:
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
