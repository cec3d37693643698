"""Print the run table of a manifest on a node type (validates everything, runs nothing).

    python -m experiments expand main --node b200
    python -m experiments expand experiments/manifests/smoke.yaml --json
"""
from __future__ import annotations

import argparse
import sys

from experiments.grid.errors import ManifestError
from experiments.grid.plan import plan_manifest
from experiments.grid.table import format_table, plan_as_json


def add_manifest_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every manifest-reading command shares (also `slurm submit`)."""
    parser.add_argument("manifest", help="a manifest name (experiments/manifests/NAME.yaml) or path")
    parser.add_argument("--node", help="node profile (experiments/nodes/NODE.yaml); "
                        "default: the manifest's node")
    parser.add_argument("--only", metavar="PATTERN",
                        help="only runs whose name matches this glob, e.g. 'main-tps260k-*'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--check-paths", action="store_true",
                        help="also check that data and input files exist here (run and submit "
                        "always do)")


def main(args: argparse.Namespace) -> int:
    try:
        plan = plan_manifest(args.manifest, node=args.node, only=args.only,
                             check_paths=args.check_paths)
    except ManifestError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(plan_as_json(plan) if args.json else format_table(plan))
    return 0
