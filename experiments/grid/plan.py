"""manifest + node profile -> the validated list of runs (a Plan).

This is the one pipeline every consumer uses (`expand`, the local executor, `slurm
submit`): load and validate the manifest, expand the grid, lay each cell out on the node,
build and validate each cell's run config with the trainer's own schema, check that the
files the runs read exist. Every problem found is collected and raised as one
ManifestError, so nothing starts or is submitted until all cells are sound.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from experiments.grid.cells import TrainCell, command_cells, train_cells, train_run_name
from experiments.grid.cost import estimated_hours
from experiments.grid.errors import ManifestError, describe_error, problems_error
from experiments.grid.layout import PlanError, PlannedLayout, plan_layout
from experiments.grid.manifest import (CommandManifest, Manifest, TrainManifest, load_manifest,
                                       repo_path)
from experiments.grid.nodes import NodeProfile, load_node_profile
from experiments.grid.trainer import TRAINER_KEYS, format_override, trainer_argv
from experiments.paths import RUNS_DIR
from launcher.flops import train_flops_per_token

PYTHON = "{python}"   # argv[0] of every run; each executor substitutes its interpreter
DEFAULT_RUNS_DIR = RUNS_DIR


@dataclass(frozen=True)
class RunSpec:
    """One job: what to run, where its files go, and how it is laid out."""

    name: str
    kind: str                        # "train" | "command"
    axes: dict[str, str]             # readable axis values, for tables and MLflow tags
    argv: tuple[str, ...]            # starts with PYTHON
    run_dir: Path
    nodes: int = 1
    procs_per_node: int = 1          # trainer processes per node (1 for commands)
    gpus_per_node: int = 0           # GPUs the job asks for on each node
    layout: PlannedLayout | None = None   # train runs only
    base_config: str | None = None   # train runs: launcher.config.load_run_config(base_config,
    overrides: tuple[str, ...] = ()  #   list(overrides)) rebuilds the run's config in process
    steps: int | None = None
    tps: int | None = None
    est_hours: float | None = None   # wall hours at the assumed MFU, None without a peak
    resumes_on_signal: bool = False  # commands only; for training the trainer's --resume decides
    seed: int | None = None          # train runs: the run config's seed
    variant_overrides: tuple[tuple[str, Any], ...] = ()   # what the cell's free-axis variant sets

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def tokens(self) -> int | None:
        return self.steps * self.tps if self.steps and self.tps else None


@dataclass
class Plan:
    path: Path
    manifest: Manifest
    node: NodeProfile
    runs: list[RunSpec]
    runs_dir: Path
    experiment: str | None = None    # MLflow experiment of the train runs
    notes: list[str] = field(default_factory=list)

    @property
    def grid_dir(self) -> Path:
        return self.runs_dir / self.manifest.name


def plan_manifest(manifest: str | Path, *, node: str | None = None, only: str | None = None,
                  runs_dir: str | Path | None = None, check_paths: bool = True) -> Plan:
    """Validate everything; raise one ManifestError listing every problem."""
    path, loaded = load_manifest(manifest)
    profile = load_node_profile(node or loaded.node)
    runs_dir = Path(runs_dir).resolve() if runs_dir else DEFAULT_RUNS_DIR
    plan = Plan(path, loaded, profile, [], runs_dir)
    if isinstance(loaded, TrainManifest):
        problems = _plan_train(plan, loaded, check_paths)
    else:
        problems = _plan_command(plan, loaded, check_paths)
    seen: dict[str, int] = {}
    for run in plan.runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    problems += [("grid", f"{n} cells are named {name!r}; make the blocks disjoint")
                 for name, n in seen.items() if n > 1]
    if problems:   # cells often share a problem: report each once
        raise problems_error(path, f"manifest for node {profile.name}", list(dict.fromkeys(problems)))
    if only:
        plan.runs = [r for r in plan.runs if fnmatch.fnmatchcase(r.name, only)]
        if not plan.runs:
            raise ManifestError(f"--only {only!r} matches no run of {path}; run "
                                f"`python -m experiments expand {path}` to list the names")
    return plan


def _model_axes(cell: TrainCell) -> dict[str, Any]:
    values = {"attention": cell.attention, "qk_norm": cell.qk_norm, "smoothing": cell.smoothing,
              "quant": cell.quant}
    return {TRAINER_KEYS[k]: v for k, v in values.items() if v is not None}


def _plan_train(plan: Plan, manifest: TrainManifest, check_paths: bool) -> list[tuple[str, str]]:
    from launcher.config import build_run_config
    from launcher.overrides import ConfigError, apply_overrides
    from model import ModelConfig
    from pydantic import ValidationError

    base_raw = yaml.safe_load(repo_path(manifest.base_config).read_text()) or {}
    problems: list[tuple[str, str]] = []
    for cell in train_cells(manifest):
        where = f"grid[{cell.block}]"
        free = {**manifest.overrides, **dict(cell.variant_overrides), **_model_axes(cell)}
        sets = [format_override(k, v) for k, v in free.items()]
        try:
            raw = apply_overrides(base_raw, sets)
            model = ModelConfig.model_validate(raw.get("model", {}))
        except ConfigError as err:
            problems.append((where, str(err)))
            continue
        except ValidationError as err:
            problems += [(where, message if key == "<top level>" else f"model.{key}: {message}")
                         for key, message in map(describe_error, err.errors())]
            continue
        name = train_run_name(manifest.name, cell.tps, model.attention, model.qk_norm,
                              model.smoothing, cell.variant, model.quant)
        point = manifest.tps[cell.tps]
        try:
            layout = plan_layout(cell.tps, point, seq_len=model.seq_len, num_heads=model.num_heads,
                                 parallel=manifest.parallel, node=plan.node)
        except PlanError as err:
            problems.append((err.key, str(err)))
            continue
        run_dir = plan.grid_dir / name
        owned = {"micro_batch": layout.micro_batch, "grad_accum": layout.grad_accum,
                 "steps": point.steps, "warmup_steps": point.warmup_steps, "run_name": name}
        if manifest.experiment:
            owned["experiment"] = manifest.experiment
        owned |= {"tps": point.tokens, "sp": layout.sp, "zero_stage": layout.zero_stage,
                  "checkpoint_dir": str(run_dir / "checkpoints"), "tps_label": cell.tps}
        sets += [format_override(TRAINER_KEYS[k], v) for k, v in owned.items()]
        try:
            config = build_run_config(apply_overrides(base_raw, sets), source=name)
        except ConfigError as err:
            problems += [(f"{where} {name}", line.strip()) for line in str(err).splitlines()[1:]]
            continue
        if check_paths:
            problems += _data_path_problems(config.data.path, cell, manifest)
        m = config.model
        flops = train_flops_per_token(m)
        gpus = layout.world if plan.node.accelerator == "gpu" else 0
        axes = {"tps": cell.tps, "attention": m.attention, "qk_norm": str(m.qk_norm).lower(),
                "smoothing": m.smoothing}
        if m.attention == "sagebwd":
            axes["quant"] = m.quant
        if cell.variant:
            axes["variant"] = cell.variant
        plan.experiment = config.tracking.experiment
        plan.runs.append(RunSpec(
            name=name, kind="train", axes=axes,
            argv=(PYTHON, *trainer_argv(manifest.base_config, sets)), run_dir=run_dir,
            base_config=manifest.base_config, overrides=tuple(sets),
            nodes=layout.nodes, procs_per_node=layout.procs_per_node,
            gpus_per_node=plan.node.gpus_per_node, layout=layout, steps=point.steps,
            tps=point.tokens, seed=config.seed, variant_overrides=cell.variant_overrides,
            est_hours=estimated_hours(point.steps * point.tokens, flops, gpus,
                                      plan.node.bf16_peak_tflops)))
    return problems


def _data_path_problems(data_path: str, cell: TrainCell, manifest: TrainManifest) -> list[tuple[str, str]]:
    from data_prep.meta import META_FILE
    from launcher.data import DEMO_CORPUS

    if data_path == DEMO_CORPUS or (repo_path(data_path) / META_FILE).is_file():
        return []
    if "data.path" in dict(cell.variant_overrides):
        key = f"grid[{cell.block}].overrides.{cell.variant}.data.path"
    elif "data.path" in manifest.overrides:
        key = "overrides.data.path"
    else:
        key = f"base_config {manifest.base_config}: data.path"
    return [(key, f"{data_path} holds no prepared data set ({repo_path(data_path) / META_FILE} is "
             "missing); make it with `python -m data_prep prepare --source hf --input "
             f"Skylion007/openwebtext --out {data_path}` (or point data.path at one)")]


def _plan_command(plan: Plan, manifest: CommandManifest, check_paths: bool) -> list[tuple[str, str]]:
    problems = []
    if check_paths:
        problems += [(f"inputs.{label}", f"{path} does not exist; produce it first (see the "
                      "manifest's description)") for label, path in manifest.inputs.items()
                     if not repo_path(path).exists()]
    gpus = min(manifest.gpus, plan.node.gpus_per_node) if plan.node.accelerator == "gpu" else 0
    inputs = {f"inputs.{label}": str(repo_path(p)) for label, p in manifest.inputs.items()}
    for cell in command_cells(manifest):
        run_dir = plan.grid_dir / cell.name
        values = {"python": PYTHON, "run_dir": str(run_dir), "name": cell.name, **inputs}
        argv = [_substitute(arg, values) for arg in [*manifest.command, *cell.extra_args]]
        if argv[0] != PYTHON:
            problems.append(("command[0]", "must be {python}: jobs run the project's interpreter"))
            break
        plan.runs.append(RunSpec(name=cell.name, kind="command", axes=cell.axes, argv=tuple(argv),
                                 run_dir=run_dir, gpus_per_node=gpus,
                                 resumes_on_signal=manifest.resumes_on_signal))
    return problems


def _substitute(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{%s}" % key, value)
    return arg
