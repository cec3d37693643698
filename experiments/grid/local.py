"""The local executor: run a plan's jobs on this machine, one after another or several at once.

Each run is the same command a Slurm job would run, started directly (one process) or
through `torchrun --standalone` (several processes on this node). One at a time, output
streams to the terminal and to <run_dir>/local.log; with `parallel > 1` (small models sharing
one GPU: their kernels interleave and the GPU stays busy through each run's start-up) it goes
to the log only, and the terminal gets a line per start and finish.
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
              tracking_uri: str | None = None, parallel: int = 1,
              say: Callable[[str], None] = print) -> list[LocalResult]:
    """Run every job of the plan, up to `parallel` at once. After a failure no new run starts
    unless keep_going (runs already started finish)."""
    if parallel < 1:
        raise LocalRunError(f"parallel must be 1 or more (got {parallel})")
    check_fits_here(plan)
    uri = resolve_tracking_uri(tracking_uri)
    parent = ensure_parent_run(plan, uri)   # once, before any run: runs started together share it
    if parallel == 1:
        return _run_one_by_one(plan, python, keep_going, uri, parent, say)
    return _run_side_by_side(plan, python, keep_going, uri, parent, parallel, say)


def _start(plan: Plan, run: RunSpec, index: int, python: str, uri: str, parent: str | None,
           say: Callable[[str], None], stdout) -> subprocess.Popen:
    env = {**os.environ, **job_environment(plan, run, uri, parent)}
    say(f"[experiments] run {index}/{len(plan.runs)}: {run.name} (log {run.run_dir / 'local.log'})")
    return subprocess.Popen(local_argv(run, python), cwd=REPO_ROOT, env=env, text=True,
                            stdout=stdout, stderr=subprocess.STDOUT)


def _run_one_by_one(plan, python, keep_going, uri, parent, say) -> list[LocalResult]:
    results = []
    for index, run in enumerate(plan.runs, 1):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        log = run.run_dir / "local.log"
        started = time.perf_counter()
        with open(log, "a") as sink:
            proc = _start(plan, run, index, python, uri, parent, say, subprocess.PIPE)
            for line in proc.stdout:
                sink.write(line)
                say(line.rstrip("\n"))
            returncode = proc.wait()
        results.append(_finished(run, returncode, started, say))
        if returncode and not keep_going:
            break
    return results


def _run_side_by_side(plan, python, keep_going, uri, parent, parallel, say) -> list[LocalResult]:
    waiting = list(enumerate(plan.runs, 1))
    running: list[tuple[RunSpec, subprocess.Popen, float, object]] = []
    results: list[LocalResult] = []
    failed = False
    while running or (waiting and not (failed and not keep_going)):
        while waiting and len(running) < parallel and not (failed and not keep_going):
            index, run = waiting.pop(0)
            run.run_dir.mkdir(parents=True, exist_ok=True)
            sink = open(run.run_dir / "local.log", "a")
            proc = _start(plan, run, index, python, uri, parent, say, sink)
            running.append((run, proc, time.perf_counter(), sink))
        time.sleep(0.5)
        for entry in [e for e in running if e[1].poll() is not None]:
            run, proc, started, sink = entry
            sink.close()
            running.remove(entry)
            results.append(_finished(run, proc.returncode, started, say))
            failed = failed or proc.returncode != 0
    return results


def _finished(run: RunSpec, returncode: int, started: float,
              say: Callable[[str], None]) -> LocalResult:
    result = LocalResult(run.name, returncode, time.perf_counter() - started,
                         run.run_dir / "local.log")
    if returncode:
        say(f"[experiments] {run.name} failed with exit code {returncode}; log {result.log}")
    else:
        say(f"[experiments] {run.name} finished in {result.seconds:.0f} s")
    return result
