"""`--set a.b=c` command-line overrides applied to a nested config dict."""
from __future__ import annotations

import copy
from typing import Any

import yaml


class ConfigError(ValueError):
    """A run config that cannot be used; the message says what is wrong and how to fix it."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """'optimizer.lr=3e-4' -> (['optimizer', 'lr'], 0.0003). Values are parsed as YAML.

    PyYAML reads 3e-4 as a string; the typed config converts it to float on validation.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key.path=value, "
                          "e.g. --set optimizer.lr=3e-4")
    path = key.strip().split(".")
    if any(not part for part in path):
        raise ConfigError(f"override {text!r} has an empty key segment in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value {raw!r} is not valid YAML ({err})") from None
    return path, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `raw` with each override set; intermediate sections are created."""
    result = copy.deepcopy(raw)
    problems: list[str] = []   # every bad override at once, as the config's own errors are
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ConfigError as err:
            problems.append(str(err))
            continue
        node = result
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                problems.append(f"override {text!r}: {where!r} is a value ({child!r}), "
                                "not a section, so it has no sub-keys")
                break
            node = child
        else:
            node[path[-1]] = value
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("invalid --set overrides:\n  " + "\n  ".join(problems))
    return result
