"""ManifestError and the helpers that turn YAML and pydantic failures into one message
whose every line names the file and the key."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class ManifestError(ValueError):
    """A manifest or node profile that cannot be used; raised before anything runs or is
    submitted. The message lists every problem as `FILE: KEY: what is wrong, how to fix`."""


def key_path(loc: tuple[Any, ...]) -> str:
    """('grid', 1, 'smoothing', 0) -> 'grid[1].smoothing[0]'."""
    text = ""
    for part in loc:
        if part == "[key]":   # pydantic's marker for "the mapping key itself is wrong"
            text += " (the key)"
        elif isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "<top level>"


def describe_error(error: dict[str, Any]) -> tuple[str, str]:
    """One pydantic error -> (key, message)."""
    key = key_path(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return key, "unknown key (check the spelling; docs/slurm.md lists the keys)"
    if kind == "missing":
        return key, "required but not set"
    if kind == "value_error":  # our own validators already say which values clash and why
        return key, error["msg"].removeprefix("Value error, ")
    return key, f"{error['msg']} (got {error.get('input')!r})"


def validation_error(err: ValidationError, source: str | Path, what: str) -> ManifestError:
    lines = [f"{source}: {key}: {message}" for key, message in map(describe_error, err.errors())]
    return ManifestError(f"invalid {what}:\n  " + "\n  ".join(lines))


def problems_error(source: str | Path, what: str, problems: list[tuple[str, str]]) -> ManifestError:
    """Several (key, message) findings about one file -> one ManifestError."""
    lines = [f"{source}: {key}: {message}" for key, message in problems]
    return ManifestError(f"invalid {what}:\n  " + "\n  ".join(lines))


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; errors name the file."""
    if not path.is_file():
        raise ManifestError(f"{what} {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ManifestError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: <top level>: a {what} must be a mapping of keys, "
                            f"got {type(raw).__name__}")
    return raw
