"""The user's cluster profile: where and as whom jobs run (partition, account, QOS, time),
and where the repository, interpreter, run folders and MLflow server are on the cluster.

Looked up as --profile PATH, else $SAGEBWD_SLURM_PROFILE, else
~/.config/sagebwd/slurm.yaml, else built-in defaults (this checkout, this interpreter,
the trainer's MLflow default), which suit a cluster that shares this file system.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from experiments.grid.errors import read_yaml_mapping, validation_error
from experiments.paths import REPO_ROOT

PROFILE_ENV = "SAGEBWD_SLURM_PROFILE"
DEFAULT_PROFILE = Path("~/.config/sagebwd/slurm.yaml")
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_PATTERN = r"^(\d+-\d{1,2}(:\d{2}){0,2}|\d+(:\d{2}){0,2})$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSettings(Strict):
    """Per node-profile settings on this cluster; unset keys fall back to the top level."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = Field(None, pattern=TIME_PATTERN)
    constraint: str | None = None
    gres: str | None = Field(None, description="e.g. gpu:b200:8, instead of --gpus-per-node")
    extra_sbatch: list[str] = Field(default_factory=list)


class UserProfile(Strict):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = Field("24:00:00", pattern=TIME_PATTERN,
                      description="per job; longer runs checkpoint and requeue themselves")
    extra_sbatch: list[str] = Field(default_factory=list, description='e.g. ["--exclusive"]')
    workdir: str | None = Field(None, description="the repository on the cluster; default this checkout")
    python: str | None = Field(None, description="interpreter on the nodes; default this one")
    runs_dir: str | None = Field(None, description="run folders, logs, ledger; default <workdir>/runs")
    tracking_uri: str | None = Field(None, description="MLflow; default $MLFLOW_TRACKING_URI or "
                                     "the trainer's sqlite file")
    setup: list[str] = Field(default_factory=list, description="shell lines run first in each job")
    rendezvous_port: int = Field(29500, gt=0, lt=65536)
    signal_seconds: int = Field(120, gt=0, description="USR1 this long before the time limit")
    nodes: dict[str, NodeSettings] = Field(default_factory=dict)

    def for_node(self, node: str) -> NodeSettings:
        """Top-level settings with the node's own entries on top."""
        own = self.nodes.get(node, NodeSettings())
        return NodeSettings(
            partition=own.partition or self.partition, account=own.account or self.account,
            qos=own.qos or self.qos, time=own.time or self.time, constraint=own.constraint,
            gres=own.gres, extra_sbatch=[*self.extra_sbatch, *own.extra_sbatch])

    @property
    def workdir_path(self) -> Path:
        return Path(self.workdir) if self.workdir else REPO_ROOT

    @property
    def python_path(self) -> str:
        return self.python or sys.executable

    @property
    def runs_path(self) -> Path:
        return Path(self.runs_dir) if self.runs_dir else self.workdir_path / "runs"


def profile_path(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get(PROFILE_ENV):
        return Path(os.environ[PROFILE_ENV])
    default = DEFAULT_PROFILE.expanduser()
    return default if default.is_file() else None


def load_user_profile(explicit: str | None = None) -> UserProfile:
    path = profile_path(explicit)
    if path is None:
        return UserProfile()
    raw = read_yaml_mapping(path, "Slurm profile")
    try:
        return UserProfile.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, path, "Slurm profile") from None

