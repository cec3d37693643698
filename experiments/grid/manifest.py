"""Experiment manifests: a node profile, a base run config and a grid, as one YAML file.

Two kinds share the file format. `kind: train` (the default) expands to training runs of
`launcher.train`; `kind: command` expands to non-training jobs (the sigma sweep, the
intermediate-error trace). Paths inside a manifest are relative to the repository root,
like every other command of the project. docs/slurm.md documents the keys.

This module is the single place where a manifest is read and validated; everything that
follows (expansion, submission) can assume a well-formed Manifest.
"""
from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError,
                      model_validator)

from experiments.grid.errors import (ManifestError, problems_error, read_yaml_mapping,
                                     validation_error)
from experiments.grid.trainer import LAYOUT_OWNED_KEYS
from experiments.paths import MANIFESTS_DIR, REPO_ROOT


# Names and labels end up in run names, Slurm job names and directory names.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=48)]
# YAML reads a key like `128:` as a number; a label is its text either way.
Label = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, float)) else v),
                  StringConstraints(pattern=r"^[a-z0-9][a-z0-9.]*$", max_length=24)]
DottedKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TpsPoint(Strict):
    """One point of the tokens-per-step axis with the schedule the paper used there."""

    tokens: int = Field(gt=0, description="tokens per optimizer step = global batch x seq_len")
    steps: int = Field(gt=0)
    warmup_steps: int = Field(ge=0)

    @model_validator(mode="after")
    def _warmup_within_steps(self) -> "TpsPoint":
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


class Parallel(Strict):
    """How one run is laid out; None means the node profile's default."""

    nodes: int = Field(1, gt=0)
    sp: int = Field(1, gt=0, description="sequence-parallel group size")
    micro_batch: int | None = Field(None, gt=0, description="sequences per rank per forward")
    zero_stage: int | None = Field(None, ge=0, le=3)


class TrainGridBlock(Strict):
    """One product of axis values; a grid is the union of its blocks. An axis left out
    takes the base config's value (and tps: every point of the manifest's tps table)."""

    tps: list[Label] | None = Field(None, min_length=1)
    attention: list[Literal["fpa", "sagebwd"]] | None = Field(None, min_length=1)
    qk_norm: list[bool] | None = Field(None, min_length=1)
    smoothing: list[Literal["none", "k", "qk"]] | None = Field(None, min_length=1)
    # SageBwd's quantisation contract (model.quant): "block" (the paper's), "token"
    quant: list[Literal["block", "token"]] | None = Field(None, min_length=1)
    # The free axis: label -> run-config overrides; the label joins the run name.
    overrides: dict[Label, dict[DottedKey, Any]] | None = Field(None, min_length=1)


class TrainManifest(Strict):
    kind: Literal["train"] = "train"
    name: Name
    description: str = ""
    node: str = Field(description="default node profile (experiments/nodes/<node>.yaml)")
    base_config: str = Field(description="run config YAML every cell starts from")
    experiment: str | None = Field(None, description="MLflow experiment; default: the base config's")
    overrides: dict[DottedKey, Any] = Field(default_factory=dict)
    parallel: Parallel = Parallel()
    tps: dict[Label, TpsPoint] = Field(min_length=1)
    grid: list[TrainGridBlock] = Field(default_factory=lambda: [TrainGridBlock()], min_length=1)


def train_problems(manifest: TrainManifest) -> list[tuple[str, str]]:
    """Cross-references within a train manifest, as (key, message)."""
    problems = []
    for i, block in enumerate(manifest.grid):
        for label in block.tps or []:
            if label not in manifest.tps:
                problems.append((f"grid[{i}].tps", f"{label!r} is not a point of the tps table "
                                 f"({', '.join(manifest.tps)})"))
        for label, values in (block.overrides or {}).items():
            problems += _layout_owned(values, f"grid[{i}].overrides.{label}.")
    problems += _layout_owned(manifest.overrides, "overrides.")
    return problems


def _layout_owned(overrides: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """Keys the grid and layout compute must not be set by hand, or TPS would be wrong."""
    return [(prefix + key, f"set by the manifest itself (from {LAYOUT_OWNED_KEYS[key]}); "
             "remove this override") for key in overrides if key in LAYOUT_OWNED_KEYS]


# Placeholders a command may use; {inputs.NAME} refers to the manifest's inputs table.
COMMAND_PLACEHOLDERS = {"python", "run_dir", "name"}


class CommandManifest(Strict):
    """Non-training jobs: one command per grid cell, its arguments chosen by the axes."""

    kind: Literal["command"]
    name: Name
    description: str = ""
    node: str
    command: list[str] = Field(min_length=1)
    gpus: int = Field(1, ge=0, description="GPUs the command uses (ignored on CPU nodes)")
    inputs: dict[Label, str] = Field(default_factory=dict, description="files that must exist")
    # The command saves its state on SIGUSR1, exits, and continues when started again: Slurm
    # jobs then requeue themselves before the time limit, like training runs do.
    resumes_on_signal: bool = False
    # Each block maps axis -> {label: extra arguments}; a cell takes one label per axis.
    grid: list[dict[Name, dict[Label, list[str]]]] = Field(default_factory=lambda: [{}], min_length=1)


def command_problems(manifest: CommandManifest) -> list[tuple[str, str]]:
    """Placeholders that name nothing, as (key, message)."""
    args = [("command", a) for a in manifest.command]
    args += [(f"grid[{i}].{axis}.{label}", a) for i, block in enumerate(manifest.grid)
             for axis, values in block.items() for label, extra in values.items() for a in extra]
    problems = []
    for key, arg in args:
        for field in _placeholders(arg):
            if field.startswith("inputs."):
                if field.removeprefix("inputs.") not in manifest.inputs:
                    problems.append((key, f"{{{field}}} names no entry of inputs "
                                     f"({', '.join(manifest.inputs) or 'none defined'})"))
            elif field not in COMMAND_PLACEHOLDERS:
                problems.append((key, f"unknown placeholder {{{field}}} in {arg!r}; use "
                                 f"{', '.join('{%s}' % p for p in sorted(COMMAND_PLACEHOLDERS))} "
                                 "or {inputs.NAME}"))
    return problems


def _placeholders(text: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(text) if field]


Manifest = TrainManifest | CommandManifest


def resolve_manifest_path(name_or_path: str | Path) -> Path:
    """`main` -> experiments/manifests/main.yaml; anything with a suffix is a path."""
    text = str(name_or_path)
    if re.fullmatch(r"[a-z0-9][a-z0-9-]*", text):
        return MANIFESTS_DIR / f"{text}.yaml"
    return Path(text)


def repo_path(path: str | Path) -> Path:
    """Manifest paths are relative to the repository root (absolute ones stay)."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def load_manifest(name_or_path: str | Path) -> tuple[Path, Manifest]:
    """Read and validate a manifest; every problem is reported at once, naming file and key."""
    path = resolve_manifest_path(name_or_path)
    if not path.is_file():
        shipped = sorted(p.stem for p in MANIFESTS_DIR.glob("*.yaml"))
        raise ManifestError(f"manifest {path} does not exist; pass a path or one of {shipped}")
    raw = read_yaml_mapping(path, "manifest")
    kind = raw.get("kind", "train")
    model = {"train": TrainManifest, "command": CommandManifest}.get(kind)
    if model is None:
        raise ManifestError(f"{path}: kind: {kind!r} is not a manifest kind; use train or command")
    try:
        manifest = model.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, path, "manifest") from None
    if isinstance(manifest, TrainManifest):
        problems = train_problems(manifest)
        if not repo_path(manifest.base_config).is_file():
            problems.append(("base_config", f"{manifest.base_config} does not exist (paths are "
                             f"relative to the repository root, {REPO_ROOT})"))
    else:
        problems = command_problems(manifest)
    if problems:
        raise problems_error(path, "manifest", problems)
    return path, manifest
