"""Regenerate docs/examples/main-b200/: the main manifest on B200, as submit renders it.

    python -m slurm.examples

Rendered with docs/examples/cluster-profile.yaml (an illustrative cluster), as submit
renders it: training jobs checkpoint on USR1, requeue and resume (`--resume auto`). tests/test_slurm_render.py fails when
the committed files differ from a fresh rendering.
"""
from __future__ import annotations

from pathlib import Path

from experiments.grid.plan import plan_manifest
from experiments.paths import REPO_ROOT
from slurm.profile import load_user_profile
from slurm.render import JobContext, render_array_script, render_run_script

EXAMPLES_DIR = REPO_ROOT / "docs" / "examples"
PROFILE = EXAMPLES_DIR / "cluster-profile.yaml"
MANIFEST, NODE = "main", "b200"


def render_examples() -> dict[Path, str]:
    """docs/examples/main-b200/<file> -> its text."""
    profile = load_user_profile(str(PROFILE))
    plan = plan_manifest(MANIFEST, node=NODE, runs_dir=profile.runs_path, check_paths=False)
    ctx = JobContext(python=profile.python_path, workdir=profile.workdir_path,
                     tracking_uri=profile.tracking_uri, parent_run_id=None,
                     submit_command=f"python -m slurm submit {MANIFEST} --node {NODE}")
    out = EXAMPLES_DIR / f"{MANIFEST}-{NODE}"
    files = {out / f"{run.name}.sbatch": render_run_script(plan, run, profile, ctx)
             for run in plan.runs}
    files[out / f"{MANIFEST}-array.sbatch"] = render_array_script(plan, plan.runs, profile, ctx)
    return files


def main() -> int:
    for path, text in render_examples().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
