"""Which run a checkpoint belongs to, and whether a resume may continue it.

Every checkpoint's manifest records the run's identity: the MLflow run id, run name,
experiment, tracking URI, the checkpoint dir it was written to, and the resolved config (flat)
with its sha256. On resume:

- a key that changes what is trained (model, data, optimizer, schedule, seed, batch and
  parallel layout) must hold its checkpoint value, or the resume is refused with the list of
  differing keys;
- SAFE_KEYS may change (more `train.steps`, eval cadence, ...): the change is said, and
  logged on the MLflow run as `resume.changed.<key>` tags;
- a checkpoint resumed from another folder than the one it was written to (a copy), or under
  another run name, experiment or tracking URI, continues in a *new* MLflow run (tagged with
  the run it forked from): it never writes into the original run.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.overrides import ConfigError
from launcher.tracking import flatten

# Keys a resumed run may change: they do not change the weights' trajectory up to the
# checkpoint (train.steps extends or shortens the cosine schedule from here on), or change only
# how the same model is computed (compilation, the kernel choice, the loss's chunking, q, k and v's kernels: the same
# function to rounding). train.check_grad_overflow changes no finite step, and a non-finite one
# stops the run either way (launcher/config.py); train.gc_every changes when Python collects, no number.
SAFE_KEYS = frozenset({
    "train.steps", "train.log_every", "train.peak_tflops", "train.compile", "train.compile_mode",
    "train.check_grad_overflow", "train.gc_every",
    "model.sagebwd_kernels", "model.loss_impl", "model.loss_chunk_tokens", "model.qkv_impl",
    "eval.every", "eval.batches", "checkpoint.every", "checkpoint.keep_last", "data.verify",
})
# Keys that say where the run is logged and kept, not what is trained: compared as identity.
WHERE_KEYS = ("tracking.", "checkpoint.dir")


def flat_config(config) -> dict[str, str]:
    return flatten(config.to_dict())


def config_sha256(flat: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()


def _where(checkpoint_dir: str | None) -> str | None:
    return str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None


def identity(config, *, run_name: str, run_id: str | None, tracking_uri: str) -> dict[str, Any]:
    flat = flat_config(config)
    return {"mlflow_run_id": run_id, "run_name": run_name,
            "experiment": config.tracking.experiment, "tracking_uri": tracking_uri,
            "checkpoint_dir": _where(config.checkpoint.dir), "config_sha256": config_sha256(flat),
            "config": flat}


@dataclass
class ResumeCheck:
    same_run: bool = True            # False: continue in a new MLflow run
    why_new_run: str = ""
    changed: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)  # safe ones


def check_resume(saved: dict[str, Any], config, *, run_name: str, tracking_uri: str,
                 checkpoint: Path) -> ResumeCheck:
    """Raises ConfigError listing every key that may not change; else what to do."""
    if not saved:      # a checkpoint from before manifests: nothing to compare
        return ResumeCheck()
    old, new = saved.get("config") or {}, flat_config(config)
    differing = [k for k in sorted(set(old) | set(new))
                 if old.get(k) != new.get(k) and not k.startswith(WHERE_KEYS)]
    unsafe = [k for k in differing if k not in SAFE_KEYS]
    if unsafe:
        lines = "\n  ".join(f"{k}: {old.get(k, '(unset)')} in the checkpoint, now "
                            f"{new.get(k, '(unset)')}" for k in unsafe)
        raise ConfigError(
            f"checkpoint {checkpoint} was written with another config; resuming would change "
            f"what is trained. Differing keys:\n  {lines}\nResume with the checkpoint's values "
            "(its config is in the run's config.yaml and its MANIFEST.json), or start a new run "
            f"in another checkpoint.dir. Keys that may change on resume: {', '.join(sorted(SAFE_KEYS))}")
    check = ResumeCheck(changed={k: (old.get(k), new.get(k)) for k in differing})
    moved = []
    if saved.get("checkpoint_dir") != _where(config.checkpoint.dir):
        moved.append(f"it was written to {saved.get('checkpoint_dir')}, this run keeps "
                     f"checkpoints in {_where(config.checkpoint.dir)}")
    for key, now in (("run_name", run_name), ("experiment", config.tracking.experiment),
                     ("tracking_uri", tracking_uri)):
        if saved.get(key) is not None and saved.get(key) != now:
            moved.append(f"its {key} is {saved.get(key)!r}, this run's is {now!r}")
    if moved:
        check.same_run, check.why_new_run = False, "; ".join(moved)
    return check
