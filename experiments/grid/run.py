"""Run a manifest's grid: on this machine (--executor local, the default) or on Slurm.

    python -m experiments run smoke
    python -m experiments run main --executor slurm --node b200   # = python -m slurm submit
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from experiments.grid.errors import ManifestError
from experiments.grid.expand import add_manifest_arguments
from experiments.grid.plan import plan_manifest
from experiments.paths import REPO_ROOT


def at_least_one(text: str) -> int:
    """--parallel's value, checked before the plan is built."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give how many runs may share this machine at "
                                         "once, 1 or more")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument("--executor", choices=["local", "slurm"], default="local",
                        help="local: one run after another here (default); slurm: submit jobs")
    parser.add_argument("--runs-dir", help="where run folders go (default <repo>/runs)")
    parser.add_argument("--keep-going", action="store_true",
                        help="local: carry on after a failed run")
    parser.add_argument("--parallel", type=at_least_one, default=1, metavar="N",
                        help="local: run up to N jobs at once (small models sharing a GPU; "
                             "each run's output then goes to its local.log only)")


def hand_to_slurm(args: argparse.Namespace) -> int:
    """`--executor slurm` is `python -m slurm submit MANIFEST [--node N] [--only P]`, run as
    that command: slurm/ sits above this package and is reached only through its CLI."""
    argv = [sys.executable, "-m", "slurm", "submit", args.manifest]
    for flag in ("node", "only"):
        if getattr(args, flag):
            argv += [f"--{flag}", getattr(args, flag)]
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.call(argv, env={**os.environ, "PYTHONPATH": path})


def main(args: argparse.Namespace) -> int:
    if args.executor == "slurm":
        return hand_to_slurm(args)
    from experiments.grid.local import LocalRunError, run_local
    from experiments.grid.table import format_table

    try:
        plan = plan_manifest(args.manifest, node=args.node, only=args.only,
                             runs_dir=args.runs_dir)
        print(format_table(plan), flush=True)
        results = run_local(plan, keep_going=args.keep_going, parallel=args.parallel,
                            say=lambda line: print(line, flush=True))
    except (ManifestError, LocalRunError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [r.name for r in results if r.returncode]
    done = len(results) - len(failed)
    print(f"[experiments] {done}/{len(plan.runs)} runs finished"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed or len(results) < len(plan.runs) else 0
