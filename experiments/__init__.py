"""Experiments on top of the trainer: run configs (configs/), manifests and node profiles
(manifests/, nodes/) with their planner and local executor (grid/), the comparison from
MLflow (compare/), the FPA vs SageBwd CPU demo (`python -m experiments.demo`) and seed
studies (`python -m experiments.seeds`)."""
