"""Thin wrappers over the Slurm client commands (sbatch, squeue, sacct, scancel)."""
from __future__ import annotations

import subprocess
from pathlib import Path

# States in which a job still holds or waits for resources (it may yet run or resume).
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD",
                 "SPECIAL_EXIT", "STOPPED", "PREEMPTED"}
UNKNOWN = "UNKNOWN"


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


def run_command(argv: list[str], timeout: float = 60) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: install the Slurm client (slurm-client) or run "
                         "where Slurm is available; tests start one with "
                         "`bash scripts/slurm_cluster.sh start`") from None
    if done.returncode:
        raise SlurmError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def sbatch(script: Path) -> str:
    """Submit a script; returns the job id (the array's id for an array job)."""
    out = run_command(["sbatch", "--parsable", str(script)]).strip()
    return out.split(";")[0]   # "<id>[;cluster]"


def _squeue_states(job_ids: list[str]) -> dict[str, str]:
    # -t all also lists jobs that ended in the last MinJobAge seconds; -r one line per array task
    out = run_command(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T", "-j", ",".join(job_ids)])
    states = {}
    for line in out.splitlines():
        job_id, _, state = line.strip().partition(" ")
        states[job_id] = state.strip()
    return states


def _sacct_states(job_ids: list[str]) -> dict[str, str]:
    """From accounting: slurmdbd if there is one, else the job-completion file (`sacct -c`)."""
    for extra in ([], ["-c"]):
        try:
            out = run_command(["sacct", *extra, "-n", "-X", "-P", "-o", "JobID,State",
                               "-j", ",".join(job_ids)])
        except SlurmError:
            continue
        states = {}
        for line in out.splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id:
                states[job_id] = state.split()[0] if state else UNKNOWN  # "CANCELLED by 0"
        if states:
            return states
    return {}


def job_states(job_ids: list[str]) -> dict[str, str]:
    """State of each job id ('123' or '123_4'); UNKNOWN when Slurm has forgotten it."""
    if not job_ids:
        return {}
    try:
        states = _squeue_states(job_ids)
    except SlurmError:
        states = {}   # squeue rejects ids the controller no longer knows
        for job_id in job_ids:
            try:
                states |= _squeue_states([job_id])
            except SlurmError:
                pass
    missing = [j for j in job_ids if j not in states]
    if missing:
        states |= {j: s for j, s in _sacct_states(missing).items() if j in missing}
    return {j: states.get(j, UNKNOWN) for j in job_ids}


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        run_command(["scancel", *job_ids])
