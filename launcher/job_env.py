"""The environment a grid job starts with: the names of the variables that the manifest
layer (experiments.grid.tracking, slurm/) sets and the trainer reads. The names live here
only."""
from __future__ import annotations

ENV_GRID = "SAGEBWD_GRID"                 # manifest name, e.g. "main"
ENV_NODE = "SAGEBWD_NODE"                 # node profile, e.g. "b200"; the trainer tags its run
ENV_PARENT_RUN_ID = "SAGEBWD_PARENT_RUN_ID"   # the grid's MLflow parent run; the trainer nests under it
ENV_RUN_NAME = "SAGEBWD_RUN_NAME"
ENV_RUN_DIR = "SAGEBWD_RUN_DIR"           # checkpoints and logs of this run
