"""Slurm job rendering and submission from experiment manifests (issue 6; not built yet)."""
