"""Node profiles: what one node of a given type offers (experiments/nodes/<name>.yaml).

A profile is hardware data only (GPUs, memory; the GPU's peak comes from launcher.flops)
plus the per-node training defaults that follow from it (micro-batch, ZeRO stage). Cluster specifics (partition,
account) belong to the user's Slurm profile, not here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from experiments.grid.errors import ManifestError, read_yaml_mapping, validation_error
from experiments.paths import NODES_DIR
from launcher.flops import BF16_DENSE_PEAK_TFLOPS, gpu_peak_tflops


class NodeProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    accelerator: Literal["gpu", "cpu"]
    gpus_per_node: int = Field(ge=0)
    # Trainer processes per node; defaults to one per GPU (and must be given for CPU nodes).
    processes_per_node: int | None = Field(None, gt=0)
    gpu_memory_gib: float = Field(ge=0)
    # The GPU model, a name of launcher.flops' peak table ("H100"); it sets bf16_peak_tflops.
    gpu: str | None = None
    bf16_peak_tflops: float | None = Field(None, gt=0, description="dense, per GPU; default: "
                                           "the table's entry for `gpu`")
    cpus_per_node: int | None = Field(None, gt=0, description="CPU cores the job asks for")
    default_micro_batch: int = Field(gt=0, description="sequences per rank per forward")
    zero_stage: int = Field(ge=0, le=3)

    @model_validator(mode="before")
    @classmethod
    def _peak_of_the_gpu(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("gpu") and raw.get("bf16_peak_tflops") is None:
            peak = gpu_peak_tflops(str(raw["gpu"]))
            if peak is None:
                raise ValueError(f"gpu: {raw['gpu']!r} is not in launcher.flops' peak table "
                                 f"({', '.join(BF16_DENSE_PEAK_TFLOPS)}); set bf16_peak_tflops "
                                 "(dense bf16 TFLOPS per GPU) or leave it out for no estimate")
            raw = {**raw, "bf16_peak_tflops": peak}
        return raw

    @model_validator(mode="after")
    def _check_accelerator(self) -> "NodeProfile":
        if self.accelerator == "gpu":
            if self.gpus_per_node < 1:
                raise ValueError("accelerator: gpu needs gpus_per_node >= 1")
            if self.processes_per_node not in (None, self.gpus_per_node):
                raise ValueError(f"processes_per_node ({self.processes_per_node}) must equal "
                                 f"gpus_per_node ({self.gpus_per_node}) on a GPU node: one "
                                 "trainer process drives one GPU")
        elif self.gpus_per_node != 0 or self.processes_per_node is None:
            raise ValueError("accelerator: cpu needs gpus_per_node: 0 and an explicit "
                             "processes_per_node")
        return self

    @property
    def procs_per_node(self) -> int:
        return self.processes_per_node or self.gpus_per_node


def available_nodes() -> list[str]:
    return sorted(p.stem for p in NODES_DIR.glob("*.yaml"))


def load_node_profile(name_or_path: str | Path) -> NodeProfile:
    """A profile by name (experiments/nodes/<name>.yaml) or by path to a YAML file."""
    text = str(name_or_path)
    path = Path(text) if text.endswith((".yaml", ".yml")) else NODES_DIR / f"{text}.yaml"
    if not path.is_file():
        raise ManifestError(f"unknown node profile {text!r}: no file {path}; choose one of "
                            f"{available_nodes()} or pass a path to a profile YAML")
    raw = read_yaml_mapping(path, "node profile")
    try:
        profile = NodeProfile.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, path, "node profile") from None
    if path.parent == NODES_DIR and profile.name != path.stem:
        raise ManifestError(f"{path}: name: {profile.name!r} must match the file name "
                            f"({path.stem!r}), since manifests and --node refer to it by file name")
    return profile
