"""Submit a manifest's runs as Slurm jobs (or render them with --dry-run).

    python -m slurm submit main --node b200 --dry-run --out /tmp/sbatch
    python -m slurm submit main --node b200 [--only 'main-tps260k-*'] [--array]

Everything is validated first (manifest, node, profile, data paths); then the ledger is
read under a lock, runs already queued, running or finished are skipped, and the rest are
submitted: one job per run, or one job array over them with --array.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from experiments.grid.errors import ManifestError
from experiments.grid.expand import add_manifest_arguments
from experiments.grid.plan import Plan, RunSpec, plan_manifest
from experiments.grid.tracking import ensure_parent_run, resolve_tracking_uri
from slurm.commands import SlurmError, job_states, sbatch
from slurm.ledger import Entry, Ledger, blocking_reason
from slurm.profile import UserProfile, load_user_profile
from slurm.render import JobContext, array_log, render_array_script, render_run_script, run_log


@dataclass(frozen=True)
class Outcome:
    run: str
    job_id: str | None     # None when skipped or rendered only
    note: str              # "submitted", "rendered: PATH", or why it was skipped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument("--array", action="store_true", help="one job array over the runs")
    parser.add_argument("--dry-run", action="store_true", help="render the scripts, submit nothing")
    parser.add_argument("--out", help="--dry-run: folder for the scripts (default "
                        "<runs_dir>/<manifest>/sbatch)")
    parser.add_argument("--profile", help="Slurm profile YAML (default $SAGEBWD_SLURM_PROFILE or "
                        "~/.config/sagebwd/slurm.yaml)")
    parser.add_argument("--force", action="store_true",
                        help="submit even runs the ledger says are queued, running or finished")


def submit_command(args: argparse.Namespace) -> str:
    """The command line to show in script headers (without dry-run plumbing)."""
    argv = ["python", "-m", "slurm", "submit", args.manifest]
    for flag in ("node", "only", "profile"):
        if getattr(args, flag, None):
            argv += [f"--{flag}", getattr(args, flag)]
    if args.array:
        argv.append("--array")
    return shlex.join(argv)


def job_context(plan: Plan, profile: UserProfile, command: str, parent_run_id: str | None) -> JobContext:
    return JobContext(python=profile.python_path, workdir=profile.workdir_path,
                      tracking_uri=resolve_tracking_uri(profile.tracking_uri),
                      parent_run_id=parent_run_id,
                      submit_command=command)


def render_scripts(plan: Plan, runs: list[RunSpec], profile: UserProfile, ctx: JobContext,
                   out: Path, array: bool) -> list[tuple[list[RunSpec], Path]]:
    """Write the scripts; returns (runs of the script, its path) pairs."""
    out.mkdir(parents=True, exist_ok=True)
    if array:
        path = out / f"{plan.manifest.name}-array.sbatch"
        path.write_text(render_array_script(plan, runs, profile, ctx))
        return [(runs, path)]
    written = []
    for run in runs:
        path = out / f"{run.name}.sbatch"
        path.write_text(render_run_script(plan, run, profile, ctx))
        written.append(([run], path))
    return written


def submit_plan(plan: Plan, profile: UserProfile, *, command: str, array: bool = False,
                force: bool = False, say: Callable[[str], None] = print) -> list[Outcome]:
    ledger = Ledger(plan.runs_dir)
    with ledger.locked():
        latest = ledger.latest()
        submitted = {run.name: latest[run.name] for run in plan.runs if run.name in latest}
        states = job_states([e.job_id for e in submitted.values()])
        outcomes, todo = [], []
        for run in plan.runs:
            entry = submitted.get(run.name)
            reason = entry and not force and blocking_reason(entry, states[entry.job_id])
            if reason:
                outcomes.append(Outcome(run.name, None, f"skipped: {reason}"))
            else:
                todo.append(run)
        if not todo:
            return outcomes
        tracking_uri = resolve_tracking_uri(profile.tracking_uri)
        ctx = job_context(plan, profile, command, ensure_parent_run(plan, tracking_uri))
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        entries = []
        for run in todo:   # Slurm opens the log before the script runs: its folder must exist
            run.run_dir.mkdir(parents=True, exist_ok=True)
        if array:
            Path(array_log(plan)).parent.mkdir(parents=True, exist_ok=True)
        for runs, script in render_scripts(plan, todo, profile, ctx,
                                           plan.grid_dir / "sbatch" / stamp, array):
            job_id = sbatch(script)
            for index, run in enumerate(runs):
                ref = f"{job_id}_{index}" if array else job_id
                log = array_log(plan).replace("%x", plan.manifest.name).replace("%A", job_id) \
                    .replace("%a", str(index)) if array else run_log(run).replace("%j", job_id)
                entries.append(Entry(run=run.name, grid=plan.manifest.name, node=plan.node.name,
                                     job_id=ref, script=str(script), log=log,
                                     run_dir=str(run.run_dir), submitted_at=stamp))
                outcomes.append(Outcome(run.name, ref, f"submitted as job {ref}"))
            ledger.append(entries[-len(runs):])   # record each sbatch as soon as it succeeded
    return outcomes


def warn_about_paths(args: argparse.Namespace, profile: UserProfile) -> None:
    try:
        plan_manifest(args.manifest, node=args.node, only=args.only, runs_dir=profile.runs_path)
    except ManifestError as err:
        print(f"warning (a submit would stop here): {err}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    try:
        profile = load_user_profile(args.profile)
        # A dry run may render on a machine without the data; it warns instead of refusing.
        plan = plan_manifest(args.manifest, node=args.node, only=args.only,
                             runs_dir=profile.runs_path, check_paths=not args.dry_run)
        command = submit_command(args)
        if args.dry_run:
            warn_about_paths(args, profile)
            out = Path(args.out) if args.out else plan.grid_dir / "sbatch" / "dry-run"
            ctx = job_context(plan, profile, command, parent_run_id=None)
            for runs, path in render_scripts(plan, plan.runs, profile, ctx, out, args.array):
                print(f"{path}  ({', '.join(r.name for r in runs)})")
            return 0
        outcomes = submit_plan(plan, profile, command=command, array=args.array, force=args.force)
    except (ManifestError, SlurmError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    width = max(len(o.run) for o in outcomes)
    for outcome in outcomes:
        print(f"{outcome.run.ljust(width)}  {outcome.note}")
    return 0
