"""The local executor: run a plan's jobs one after another on this machine.

Each run is the same command a Slurm job would run, started directly (one process) or
through `torchrun --standalone` (several processes on this node). Output streams to the
terminal and to <run_dir>/local.log.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.grid.plan import PYTHON, Plan, RunSpec
from experiments.grid.tracking import ensure_parent_run, job_environment, resolve_tracking_uri
from experiments.paths import REPO_ROOT


class LocalRunError(RuntimeError):
    """The plan cannot run on this machine (too many nodes or GPUs)."""


@dataclass(frozen=True)
class LocalResult:
    name: str
    returncode: int
    seconds: float
    log: Path


def local_argv(run: RunSpec, python: str) -> list[str]:
    argv = [python if a == PYTHON else a for a in run.argv]
    if run.procs_per_node > 1:
        # torchrun replaces `python`; it takes the same `-m module args`.
        argv = [python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={run.procs_per_node}", *argv[1:]]
    return argv


def check_fits_here(plan: Plan) -> None:
    if any(run.nodes > 1 for run in plan.runs):
        raise LocalRunError(f"{plan.manifest.name} asks for several nodes; the local executor runs "
                            "on this one: submit with `python -m slurm submit`")
    gpus = max((run.gpus_per_node for run in plan.runs), default=0)
    if gpus:
        import torch

        here = torch.cuda.device_count()
        if here < gpus:
            raise LocalRunError(f"node profile {plan.node.name} needs {gpus} GPUs, this machine has "
                                f"{here}: pass --node cpu (or a profile that matches this machine)")


def run_local(plan: Plan, *, python: str = sys.executable, keep_going: bool = False,
              tracking_uri: str | None = None,
              say: Callable[[str], None] = print) -> list[LocalResult]:
    """Run every job of the plan; stops at the first failure unless keep_going."""
    check_fits_here(plan)
    uri = resolve_tracking_uri(tracking_uri)
    parent = ensure_parent_run(plan, uri)
    results = []
    for index, run in enumerate(plan.runs, 1):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        log = run.run_dir / "local.log"
        env = {**os.environ, **job_environment(plan, run, uri, parent)}
        say(f"[experiments] run {index}/{len(plan.runs)}: {run.name} (log {log})")
        started = time.perf_counter()
        with open(log, "a") as sink:
            proc = subprocess.Popen(local_argv(run, python), cwd=REPO_ROOT, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for line in proc.stdout:
                sink.write(line)
                say(line.rstrip("\n"))
            returncode = proc.wait()
        results.append(LocalResult(run.name, returncode, time.perf_counter() - started, log))
        if returncode:
            say(f"[experiments] {run.name} failed with exit code {returncode}; log {log}")
            if not keep_going:
                break
    return results
