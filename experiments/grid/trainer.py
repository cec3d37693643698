"""The seam between manifests and the trainer: which run-config keys a manifest sets, and
the command line that starts one training run.

Every trainer key the manifest layer writes is named in TRAINER_KEYS, so when the trainer
renames or adds a field the change is one line here; the plan validates every cell's keys
with launcher.config's own schema.
"""
from __future__ import annotations

from typing import Any

import yaml

TRAINER_MODULE = "launcher.train"

# manifest concept -> trainer run-config key
TRAINER_KEYS: dict[str, str] = {
    "attention": "model.attention",
    "qk_norm": "model.qk_norm",
    "smoothing": "model.smoothing",
    "quant": "model.quant",
    "micro_batch": "train.micro_batch_size",
    "grad_accum": "train.grad_accum_steps",
    "steps": "train.steps",
    "warmup_steps": "schedule.warmup_steps",
    "run_name": "tracking.run_name",
    "experiment": "tracking.experiment",
    "tps": "train.tokens_per_step",
    "sp": "parallel.sp",
    "zero_stage": "parallel.zero_stage",
    "checkpoint_dir": "checkpoint.dir",
    "tps_label": "tracking.tps_label",   # the manifest's TPS name (e.g. 2.1m), as the MLflow tag
}
# The trainer flag that resumes from the newest checkpoint in checkpoint_dir.
RESUME_ARGS = ("--resume", "auto")

# Keys the grid axes and the TPS layout own; a free override of one would break the
# tokens-per-step arithmetic or the run's name.
LAYOUT_OWNED_KEYS: dict[str, str] = {
    TRAINER_KEYS[c]: source for c, source in {
        "attention": "the attention axis", "qk_norm": "the qk_norm axis",
        "smoothing": "the smoothing axis", "quant": "the quant axis", "micro_batch": "parallel.micro_batch or the node",
        "grad_accum": "the tps point and the node", "steps": "the tps point",
        "warmup_steps": "the tps point", "run_name": "the grid", "tps": "the tps point",
        "sp": "parallel.sp", "zero_stage": "parallel.zero_stage or the node",
        "checkpoint_dir": "the run directory",
    }.items()}


def format_override(key: str, value: Any) -> str:
    """('optimizer.lr', 3e-05) -> 'optimizer.lr=3.0e-05'; the trainer parses values as YAML,
    so strings YAML would misread (e.g. 'true') come out quoted."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"{key}={text}"


def trainer_argv(base_config: str, overrides: list[str]) -> list[str]:
    """Arguments after the Python interpreter (or torchrun) for one run."""
    argv = ["-m", TRAINER_MODULE, "--config", base_config]
    for item in overrides:
        argv += ["--set", item]
    return argv
