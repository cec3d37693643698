"""Where the suite's files are: the repository root (every path in a manifest or run config
is relative to it), the shipped configs, manifests and node profiles, and the default
folder for run outputs."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
CONFIGS_DIR = EXPERIMENTS_DIR / "configs"        # run configs (launcher.config)
MANIFESTS_DIR = EXPERIMENTS_DIR / "manifests"    # manifests (experiments.grid.manifest)
NODES_DIR = EXPERIMENTS_DIR / "nodes"            # node profiles (experiments.grid.nodes)
RUNS_DIR = REPO_ROOT / "runs"                    # run folders, comparisons, demo output
