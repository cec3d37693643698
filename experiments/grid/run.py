"""Run a manifest's grid: on this machine (--executor local, the default) or on Slurm.

    python -m experiments run smoke
    python -m experiments run main --executor slurm --node b200   # = python -m slurm submit
"""
from __future__ import annotations

import argparse
import sys

from experiments.grid.errors import ManifestError
from experiments.grid.expand import add_manifest_arguments
from experiments.grid.plan import plan_manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument("--executor", choices=["local", "slurm"], default="local",
                        help="local: one run after another here (default); slurm: submit jobs")
    parser.add_argument("--runs-dir", help="where run folders go (default <repo>/runs)")
    parser.add_argument("--keep-going", action="store_true",
                        help="local: carry on after a failed run")


def main(args: argparse.Namespace) -> int:
    if args.executor == "slurm":
        from slurm.submit import main as submit

        return submit(argparse.Namespace(**vars(args), dry_run=False, out=None, array=False,
                                         profile=None, force=False))
    from experiments.grid.local import LocalRunError, run_local
    from experiments.grid.table import format_table

    try:
        plan = plan_manifest(args.manifest, node=args.node, only=args.only,
                             runs_dir=args.runs_dir)
        print(format_table(plan), flush=True)
        results = run_local(plan, keep_going=args.keep_going,
                            say=lambda line: print(line, flush=True))
    except (ManifestError, LocalRunError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [r.name for r in results if r.returncode]
    done = len(results) - len(failed)
    print(f"[experiments] {done}/{len(plan.runs)} runs finished"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed or len(results) < len(plan.runs) else 0
