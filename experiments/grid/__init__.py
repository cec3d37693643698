"""Experiment manifests -> validated runs, and the local executor.

A manifest (manifests/*.yaml: a node profile, a base run config and a grid) is read and
checked by `manifest`, expanded into cells by `cells`, laid out on the node by `layout`
(the TPS rule itself is launcher.layout's), turned into trainer command lines by `trainer`
and collected into one Plan by `plan`. `expand` and `run` are the `python -m experiments`
subcommands; `local` runs a plan here, `tracking` makes the grid's MLflow parent run and the
jobs' environment, `table` prints the run table. slurm/ submits the same Plan to Slurm.
"""
