"""Cancel a manifest's queued and running jobs (those the ledger knows).

    python -m slurm cancel main [--only 'main-tps2.1m-*']
"""
from __future__ import annotations

import argparse
import fnmatch
import sys

from experiments.grid.errors import ManifestError
from slurm.commands import ACTIVE_STATES, SlurmError, job_states, scancel
from slurm.status import selected_entries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="a manifest name or path")
    parser.add_argument("--only", metavar="PATTERN", help="only runs whose name matches this glob")
    parser.add_argument("--profile", help="Slurm profile YAML (where the ledger lives: runs_dir)")


def main(args: argparse.Namespace) -> int:
    try:
        entries = [e for e in selected_entries(args).values()
                   if not args.only or fnmatch.fnmatchcase(e.run, args.only)]
        states = job_states([e.job_id for e in entries])
        active = [e for e in entries if states[e.job_id] in ACTIVE_STATES]
        scancel([e.job_id for e in active])
    except (ManifestError, SlurmError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for entry in active:
        print(f"cancelled {entry.run} (job {entry.job_id}, was {states[entry.job_id]})")
    if not active:
        print("nothing to cancel: no queued or running job")
    return 0
