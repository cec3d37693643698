"""Checkpoints: DeepSpeed's engine state plus the trainer's own state, written atomically.

Layout of checkpoint.dir:

    step00000040/                 one checkpoint (DeepSpeed's files + trainer_rank<r>.pt)
    step00000080/
    latest                        the tag of the newest complete checkpoint

A checkpoint counts only once `latest` names it, and `latest` moves (write-then-rename,
by rank 0) only after every rank has written its files and passed a barrier. A run killed
mid-save therefore resumes from the previous checkpoint. Older checkpoints beyond
keep_last are deleted after `latest` has moved.

The trainer state (per rank): step, tokens seen, the MLflow run id, the data loader's
position, and the torch/CUDA/NumPy/Python RNG states; together with DeepSpeed's model,
optimizer and lr-scheduler state a resumed run repeats the uninterrupted run bit for bit.
"""
from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from launcher.distributed import rank
from launcher.overrides import ConfigError

LATEST = "latest"   # DeepSpeed's own marker name, so its tools (zero_to_fp32) find it too
TAG_PATTERN = re.compile(r"^step(\d{8})$")


@dataclass
class TrainerState:
    step: int
    tokens_seen: int
    mlflow_run_id: str | None
    loader: dict[str, Any]
    rng: dict[str, Any]


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def capture_rng() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save(engine, directory: str | Path, state: TrainerState, keep_last: int) -> Path:
    """Collective: every rank calls it at the same step. Returns the checkpoint folder."""
    directory = Path(directory)
    tag = tag_for(state.step)
    directory.mkdir(parents=True, exist_ok=True)
    engine.save_checkpoint(str(directory), tag=tag, save_latest=False)
    _atomic_torch_save(state.__dict__, directory / tag / f"trainer_rank{rank()}.pt")
    _barrier()  # every rank's files are on disk before the marker names them
    if rank() == 0:
        _atomic_write_bytes(directory / LATEST, tag.encode())
        _prune(directory, keep_last, keep=tag)
    _barrier()
    return directory / tag


def _prune(directory: Path, keep_last: int, keep: str) -> None:
    tags = sorted(p.name for p in directory.iterdir() if p.is_dir() and TAG_PATTERN.match(p.name))
    for old in tags[:-keep_last]:
        if old != keep:
            shutil.rmtree(directory / old, ignore_errors=True)


def latest_tag(directory: str | Path) -> str | None:
    """The newest complete checkpoint's tag, or None if there is none yet."""
    marker = Path(directory) / LATEST
    if not marker.is_file():
        return None
    tag = marker.read_text().strip()
    if not (Path(directory) / tag).is_dir():
        raise ConfigError(f"{marker} names checkpoint {tag!r}, but {Path(directory) / tag} is "
                          "missing; restore it or point `latest` at an existing step folder")
    return tag


def resolve_resume(resume: str, directory: str | None) -> tuple[Path, str] | None:
    """--resume auto|none|PATH -> (checkpoint dir, tag) to load, or None to start fresh.

    auto: the newest checkpoint in checkpoint.dir, if any (a fresh start otherwise, so a
    requeued job and a first job run the same command). PATH: a step folder or a checkpoint
    dir with a `latest` marker; it must exist.
    """
    if resume == "none":
        return None
    if resume == "auto":
        if directory is None:
            raise ConfigError("--resume auto needs checkpoint.dir; set it, e.g. "
                              "--set checkpoint.dir=runs/my-run/checkpoints")
        tag = latest_tag(directory)
        return (Path(directory), tag) if tag else None
    path = Path(resume)
    if TAG_PATTERN.match(path.name) and path.is_dir():
        return path.parent, path.name
    tag = latest_tag(path) if path.is_dir() else None
    if tag is None:
        raise ConfigError(f"--resume {resume}: no checkpoint there (expected a step folder or a "
                          f"folder with a `{LATEST}` marker); use --resume auto to start fresh "
                          "when none exists")
    return path, tag


def load(engine, directory: Path, tag: str) -> TrainerState:
    """Load engine state and this rank's trainer state; restores the RNGs too."""
    load_path, _ = engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                          load_lr_scheduler_states=True)
    if load_path is None:
        raise ConfigError(f"DeepSpeed could not load checkpoint {directory / tag}")
    own = directory / tag / f"trainer_rank{rank()}.pt"
    if not own.is_file():
        raise ConfigError(f"{own} is missing: the checkpoint was written by a world of another "
                          "size; resume with the same number of processes")
    state = TrainerState(**torch.load(own, weights_only=False))
    restore_rng(state.rng)
    return state
