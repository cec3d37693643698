"""sbatch scripts from a Plan: one script per run, or one job array over the grid.

A training job runs one srun task per node; each task starts torchrun, which starts the
node's trainer processes and joins the others at a rendezvous on the first node. The job
asks Slurm for USR1 shortly before its time limit, passes it to the trainer (which
checkpoints and exits) and requeues itself; the restarted job resumes (`--resume auto`)
from the checkpoint under the same job id and MLflow run. A command job does the same when
its manifest says it resumes on the signal, and otherwise ends at its time limit.
Rendering is a pure function of the plan, the user profile and a JobContext, so a dry run
shows exactly what a submit sends.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from experiments.grid.cost import ASSUMED_MFU
from experiments.grid.plan import Plan, RunSpec
from experiments.grid.table import human_count
from experiments.grid.tracking import job_environment
from experiments.grid.trainer import RESUME_ARGS
from launcher.job_env import ENV_RUN_DIR, ENV_RUN_NAME
from slurm.profile import UserProfile

EXIT_FILE = "slurm-exit"   # "<ledger job id> <exit status>", written when a job ends unrequeued


@dataclass(frozen=True)
class JobContext:
    """What a script needs beyond the plan and the profile."""

    python: str
    workdir: Path
    tracking_uri: str
    parent_run_id: str | None      # None in a dry run: submit creates the grid's parent run
    submit_command: str            # shown in the header


def run_log(run: RunSpec) -> str:
    return f"{run.run_dir}/slurm-%j.out"


def array_log(plan: Plan) -> str:
    return f"{plan.grid_dir}/logs/%x-%A_%a.out"


def requeues(run: RunSpec) -> bool:
    return run.kind == "train" or run.resumes_on_signal


def _describe(run: RunSpec, node: str) -> list[str]:
    axes = " ".join(f"{k}={v}" for k, v in run.axes.items())
    lines = [f"# {run.name} ({axes})"]
    if run.kind == "train":
        lay = run.layout
        unit = "GPU" if run.gpus_per_node else "process"
        unit += "es" if unit == "process" and run.procs_per_node > 1 else \
            ("s" if run.procs_per_node > 1 else "")
        lines.append(f"# {run.nodes} x {node} ({run.procs_per_node} {unit} each): DP {lay.dp} x "
                     f"SP {lay.sp}, micro-batch {lay.micro_batch} x grad-accum {lay.grad_accum} "
                     f"= global batch {lay.global_batch}, ZeRO {lay.zero_stage}")
        estimate = (f", about {run.est_hours:.1f} h at {ASSUMED_MFU:.0%} MFU"
                    if run.est_hours is not None else "")
        lines.append(f"# {run.steps} steps x {human_count(run.tps)} tokens/step = "
                     f"{human_count(run.tokens)} tokens{estimate}")
    return lines


def _header(plan: Plan, runs: list[RunSpec], ctx: JobContext) -> list[str]:
    lines = ["#!/bin/bash"]
    for run in runs:
        lines += _describe(run, plan.node.name)
    lines.append(f"# Rendered by `{ctx.submit_command}`; change the manifest, not this file.")
    return lines


def _sbatch_options(plan: Plan, run: RunSpec, profile: UserProfile, *, job_name: str,
                    output: str, requeue: bool, array: str | None) -> list[str]:
    settings = profile.for_node(plan.node.name)
    options = [f"--job-name={job_name}", f"--nodes={run.nodes}", "--ntasks-per-node=1"]
    if settings.gres:
        options.append(f"--gres={settings.gres}")
    elif run.gpus_per_node:
        options.append(f"--gpus-per-node={run.gpus_per_node}")
    if plan.node.cpus_per_node:
        options.append(f"--cpus-per-task={plan.node.cpus_per_node}")
    options.append(f"--time={settings.time}")
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(settings, key):
            options.append(f"--{key}={getattr(settings, key)}")
    # append: a requeued job continues the same log instead of truncating it
    options += [f"--output={output}", "--open-mode=append", f"--chdir={profile.workdir_path}"]
    if array:
        options.append(f"--array={array}")
    if requeue:
        options += ["--requeue", f"--signal=B:USR1@{profile.signal_seconds}"]
    else:
        options.append("--no-requeue")
    options += settings.extra_sbatch
    return [f"#SBATCH {option}" for option in options]


def _exports(env: dict[str, str], indent: str = "") -> list[str]:
    return [f"{indent}export {key}={shlex.quote(value)}" for key, value in env.items()]


def _run_args(run: RunSpec, indent: str) -> list[str]:
    """RUN_ARGS=( ... ): the program's arguments after the interpreter, one option a line."""
    args = list(run.argv[1:])
    if run.kind == "train":
        args += RESUME_ARGS
    lines, i = [], 0
    while i < len(args):
        take = 2 if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") \
            else (2 if args[i] == "-m" else 1)
        lines.append(f"{indent}  {shlex.join(args[i:i + take])}")
        i += take
    return [f"{indent}RUN_ARGS=(", *lines, f"{indent})"]


def _launch(run: RunSpec, profile: UserProfile, requeue: bool) -> list[str]:
    srun = "srun --ntasks-per-node=1 --kill-on-bad-exit=1"
    lines = [f"{srun} \\"]
    if requeue:
        # USR1 is for the trainer, which saves a checkpoint on it; torchrun would die of it.
        # An ignored signal stays ignored across exec, until the trainer installs its handler.
        lines.append("  bash -c 'trap \"\" USR1; exec \"$@\"' ignore-usr1 \\")
    if run.kind == "train":
        lines.append(f'  "$PYTHON" -m torch.distributed.run --nnodes={run.nodes} '
                     f"--nproc-per-node={run.procs_per_node} \\")
        if run.nodes == 1:
            lines.append("    --standalone \\")
        else:
            lines.append('    --rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:'
                         f'{profile.rendezvous_port}" --rdzv-id="$SLURM_JOB_ID" \\')
        lines.append('    "${RUN_ARGS[@]}"' + (" &" if requeue else ""))
    else:
        lines.append('  "$PYTHON" "${RUN_ARGS[@]}"' + (" &" if requeue else ""))
    return lines


def _supervise_start(profile: UserProfile) -> list[str]:
    return [
        f"# Slurm sends USR1 to this script {profile.signal_seconds} s before the time limit. We pass",
        "# it on (srun hands it to every process of the step); the run checkpoints and exits; we",
        "# requeue, and the restarted job resumes from that checkpoint.",
        "REQUEUE=0",
        "STEP_PID=",
        "on_usr1() {",
        "  REQUEUE=1",
        '  echo "[slurm] USR1: asking the run to checkpoint and exit"',
        '  [ -n "$STEP_PID" ] && kill -USR1 "$STEP_PID" 2>/dev/null',
        "}",
        "trap on_usr1 USR1",
        "",
    ]


def _finish(requeue: bool) -> list[str]:
    lines = []
    if requeue:
        lines += [
            "STEP_PID=$!",
            "# `wait` returns early when a trapped signal arrives: wait until the step has ended.",
            "while true; do",
            '  wait "$STEP_PID"; STATUS=$?',
            '  kill -0 "$STEP_PID" 2>/dev/null || break',
            "done",
            'if [ "$REQUEUE" = 1 ]; then',
            '  echo "[slurm] requeueing job $SLURM_JOB_ID (step exit status $STATUS)"',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "  exit 0",
            "fi",
        ]
    else:
        lines.append("STATUS=$?")
    lines += [f'echo "$JOB_REF $STATUS" > "$RUN_DIR/{EXIT_FILE}"',
              'echo "[slurm] $SAGEBWD_RUN_NAME ended with exit status $STATUS"',
              'exit "$STATUS"']
    return lines


def _body(plan: Plan, runs: list[RunSpec], profile: UserProfile, ctx: JobContext,
          requeue: bool, array: bool) -> list[str]:
    envs = [job_environment(plan, run, ctx.tracking_uri, ctx.parent_run_id) for run in runs]
    per_run = (ENV_RUN_NAME, ENV_RUN_DIR)
    common = {k: v for k, v in envs[0].items() if k not in per_run}
    lines = ["", "set -uo pipefail   # not -e: the script decides what a failed step means", ""]
    lines += profile.setup + ([""] if profile.setup else [])
    lines += [f"PYTHON={shlex.quote(ctx.python)}"] + _exports(common)
    if ctx.parent_run_id is None and plan.manifest.kind == "train":
        lines.append("# SAGEBWD_PARENT_RUN_ID: the grid's MLflow parent run, created at submit")
    lines.append("")
    if array:
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        for index, (run, env) in enumerate(zip(runs, envs)):
            lines.append(f"  {index})")
            lines += _exports({k: env[k] for k in per_run}, indent="    ")
            lines += _run_args(run, indent="    ")
            lines.append("    ;;")
        lines += ['  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    else:
        lines += _exports({k: envs[0][k] for k in per_run}) + _run_args(runs[0], indent="")
    # The id the ledger knows this run by: "<array id>_<task>" for array tasks.
    lines.append('JOB_REF="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"'
                 if array else 'JOB_REF="$SLURM_JOB_ID"')
    lines += ['RUN_DIR="$SAGEBWD_RUN_DIR"', 'mkdir -p "$RUN_DIR"']
    if runs[0].nodes > 1:
        lines.append('HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    lines += ['echo "[slurm] $SAGEBWD_RUN_NAME: job $SLURM_JOB_ID, restart '
              '${SLURM_RESTART_COUNT:-0}, nodes $SLURM_JOB_NODELIST"', ""]
    if requeue:
        lines += _supervise_start(profile)
    lines += _launch(runs[0], profile, requeue)
    lines += _finish(requeue)
    return lines


def render_run_script(plan: Plan, run: RunSpec, profile: UserProfile, ctx: JobContext) -> str:
    requeue = requeues(run)
    lines = _header(plan, [run], ctx)
    lines += _sbatch_options(plan, run, profile, job_name=run.name, output=run_log(run),
                             requeue=requeue, array=None)
    lines += _body(plan, [run], profile, ctx, requeue, array=False)
    return "\n".join(lines) + "\n"


def render_array_script(plan: Plan, runs: list[RunSpec], profile: UserProfile,
                        ctx: JobContext) -> str:
    """One job array over `runs`; task i runs runs[i]. All cells of a plan share one node
    profile and layout size, so one resource request fits every task."""
    requeue = requeues(runs[0])
    lines = _header(plan, runs, ctx)
    lines += _sbatch_options(plan, runs[0], profile, job_name=plan.manifest.name,
                             output=array_log(plan), requeue=requeue,
                             array=f"0-{len(runs) - 1}")
    lines += _body(plan, runs, profile, ctx, requeue, array=True)
    return "\n".join(lines) + "\n"
