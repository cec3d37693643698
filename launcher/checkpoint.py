"""Checkpoints: DeepSpeed's engine state plus the trainer's own state, written atomically.

Layout of checkpoint.dir:

    step00000040/                 one checkpoint (DeepSpeed's files + trainer_rank<r>.pt
                                  + MANIFEST.json: sizes, sha256s, the run's identity)
    step00000080/
    latest                        the tag of the newest complete checkpoint
    tracking/                     the run's metric journal (launcher.journal)

A checkpoint counts only once its manifest is written, and the manifest is written (then
`latest` moved, write-then-rename, by rank 0) only after every rank has written its files and
passed a barrier. A run killed mid-save therefore resumes from the previous checkpoint. Older
checkpoints beyond keep_last are deleted after `latest` has moved.

Loading verifies the manifest first (launcher.checkpoint_manifest, on every rank): `--resume
auto` takes the newest step folder that verifies, says which ones it skipped and why, and
never starts fresh while a step folder exists that it could not use. docs/reliability.md

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

from launcher import checkpoint_manifest as manifests
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


def save(engine, directory: str | Path, state: TrainerState, keep_last: int,
         identity: dict[str, Any] | None = None) -> Path:
    """Collective: every rank calls it at the same step. Returns the checkpoint folder.
    identity: the run's MLflow run id, name and config (launcher.run_identity)."""
    directory = Path(directory)
    tag = tag_for(state.step)
    directory.mkdir(parents=True, exist_ok=True)
    stale = directory / tag / manifests.MANIFEST   # an earlier attempt's save of this step
    if rank() == 0 and stale.exists():
        stale.unlink()
    _barrier()
    engine.save_checkpoint(str(directory), tag=tag, save_latest=False)
    _atomic_torch_save(state.__dict__, directory / tag / f"trainer_rank{rank()}.pt")
    _barrier()  # every rank's files are on disk before the manifest and the marker name them
    manifests.write(directory / tag, tag=tag, step=state.step, identity=identity or {})
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


def read_latest(directory: str | Path) -> tuple[str | None, str]:
    """(the tag `latest` names, or None; what is wrong with it, or "")."""
    marker = Path(directory) / LATEST
    if not marker.is_file():
        return None, f"{marker} is missing"
    try:
        tag = marker.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        return None, f"{marker} is unreadable ({type(err).__name__})"
    if not tag:
        return None, f"{marker} is empty"
    if not TAG_PATTERN.match(tag):
        return None, f"{marker} holds {tag[:40]!r}, not a step tag"
    if not (Path(directory) / tag).is_dir():
        return None, f"{marker} names checkpoint {tag!r}, but {Path(directory) / tag} is missing"
    return tag, ""


def latest_tag(directory: str | Path) -> str | None:
    """The tag `latest` names, or None if there is no marker (no verification)."""
    tag, problem = read_latest(directory)
    if tag is None and (Path(directory) / LATEST).is_file():
        raise ConfigError(f"{problem}; restore it or point `latest` at an existing step folder")
    return tag


def step_tags(directory: Path) -> list[str]:
    """Every step folder's tag, newest first."""
    if not directory.is_dir():
        return []
    return sorted((p.name for p in directory.iterdir() if p.is_dir() and TAG_PATTERN.match(p.name)),
                  reverse=True)


def choose(directory: Path, say=lambda line: None) -> str | None:
    """Collective: the newest step folder of `directory` that verifies against its manifest.

    None only when there is no step folder at all (a fresh start). A folder without a
    manifest (a save that did not finish, or one from before manifests) is taken, unverified,
    only if `latest` names it and nothing newer verifies. Raises ConfigError, naming every
    folder and its problem, when folders exist but none can be used."""
    named, marker_problem = read_latest(directory)
    tags = step_tags(directory)
    if not tags:
        if named is None and (directory / LATEST).is_file():
            raise ConfigError(f"{marker_problem}; restore it or point `latest` at an existing "
                              "step folder")
        return None
    rejected: list[str] = []
    for tag in tags:
        verdict = manifests.verify(directory / tag)
        if verdict.ok:
            picked = tag
        elif verdict.manifest is None and tag == named and not (
                directory / tag / manifests.MANIFEST).exists():
            say(f"warning: checkpoint {directory / tag} has no {manifests.MANIFEST} (written "
                "before checkpoints carried one); loading it unverified")
            picked = tag
        else:
            rejected.append(f"{tag}: {verdict.reason}")
            continue
        if rejected or picked != named:
            why = "; ".join(rejected) if rejected else marker_problem or f"`latest` names {named}"
            say(f"warning: resuming from {directory / picked}, the newest checkpoint that "
                f"verifies ({why})")
        return picked
    raise ConfigError(f"no checkpoint in {directory} can be loaded:\n  " + "\n  ".join(rejected)
                      + f"\nRestore one, or move {directory} away to start the run afresh")


def resolve_resume(resume: str, directory: str | None,
                   say=lambda line: None) -> tuple[Path, str] | None:
    """--resume auto|none|PATH -> (checkpoint dir, tag) to load, or None to start fresh.
    Collective (it verifies manifests on every rank).

    auto: the newest checkpoint in checkpoint.dir that verifies, if there is any step folder
    (a fresh start only when there is none, so a requeued job and a first job run the same
    command). PATH: a step folder (verified; no fallback) or a checkpoint dir (as auto).
    """
    if resume == "none":
        return None
    if resume == "auto":
        if directory is None:
            raise ConfigError("--resume auto needs checkpoint.dir; set it, e.g. "
                              "--set checkpoint.dir=runs/my-run/checkpoints")
        tag = choose(Path(directory), say)
        return (Path(directory), tag) if tag else None
    path = Path(resume)
    if TAG_PATTERN.match(path.name) and path.is_dir():
        verdict = manifests.verify(path)
        if not verdict.ok and (verdict.manifest is not None
                               or (path / manifests.MANIFEST).exists()):
            raise ConfigError(f"--resume {resume}: {verdict.reason}; pass another step folder, "
                              f"or --resume {path.parent} for the newest one that verifies")
        if not verdict.ok:
            say(f"warning: checkpoint {path} has no {manifests.MANIFEST}; loading it unverified")
        return path.parent, path.name
    tag = choose(path, say) if path.is_dir() else None
    if tag is None:
        raise ConfigError(f"--resume {resume}: no checkpoint there (expected a step folder or a "
                          f"folder with a `{LATEST}` marker); use --resume auto to start fresh "
                          "when none exists")
    return path, tag


def read_identity(directory: Path, tag: str) -> dict[str, Any]:
    """The identity the checkpoint's manifest records ({} for a checkpoint without one)."""
    manifest, _ = manifests.read(directory / tag)
    return (manifest or {}).get("identity") or {}


def load(engine, directory: Path, tag: str) -> TrainerState:
    """Load engine state and this rank's trainer state; restores the RNGs too."""
    try:
        load_path, _ = engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as err:  # unpickling, zip
        raise ConfigError(f"checkpoint {directory / tag} could not be loaded by DeepSpeed "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
                          "; resume from another step folder") from err
    if load_path is None:
        raise ConfigError(f"DeepSpeed could not load checkpoint {directory / tag}")
    own = directory / tag / f"trainer_rank{rank()}.pt"
    if not own.is_file():
        raise ConfigError(f"{own} is missing: the checkpoint was written by a world of another "
                          "size; resume with the same number of processes")
    state = TrainerState(**torch.load(own, weights_only=False))
    restore_rng(state.rng)
    return state
