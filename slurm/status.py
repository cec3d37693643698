"""Show the Slurm state of a manifest's runs (all runs in the ledger without MANIFEST).

    python -m slurm status main
"""
from __future__ import annotations

import argparse
import sys

from experiments.grid.errors import ManifestError
from experiments.grid.manifest import load_manifest
from slurm.commands import SlurmError, job_states
from slurm.ledger import Entry, Ledger
from slurm.profile import load_user_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", nargs="?", help="a manifest name or path (default: every run)")
    parser.add_argument("--profile", help="Slurm profile YAML (where the ledger lives: runs_dir)")


def selected_entries(args: argparse.Namespace) -> dict[str, Entry]:
    """Latest ledger entry per run, of the manifest's grid if one is given."""
    profile = load_user_profile(args.profile)
    grid = load_manifest(args.manifest)[1].name if args.manifest else None
    return Ledger(profile.runs_path).latest(grid)


def main(args: argparse.Namespace) -> int:
    try:
        entries = selected_entries(args)
        states = job_states([e.job_id for e in entries.values()])
    except (ManifestError, SlurmError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not entries:
        print("no runs submitted" + (f" for {args.manifest}" if args.manifest else ""))
        return 0
    rows = [("run", "job", "state", "node", "submitted", "log")]
    rows += [(e.run, e.job_id, states[e.job_id], e.node, e.submitted_at, e.log)
             for e in entries.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
