"""Slurm jobs from experiment manifests: render sbatch scripts (one per run, or one job
array), submit them with a ledger that prevents duplicates, follow and cancel them.

    python -m slurm submit MANIFEST --node NODE [--dry-run --out DIR] [--only PATTERN] [--array]
    python -m slurm status [MANIFEST]
    python -m slurm cancel MANIFEST

Modules: profile (the user's cluster settings), render (sbatch text), commands (Slurm CLI
wrappers), ledger (submitted runs), submit/status/cancel (the subcommands). docs/slurm.md
has the full story; scripts/slurm_cluster.sh runs a one-node cluster for the tests.
"""
