"""MLflow wiring shared by every executor: the environment a run starts with, and the
grid's parent run.

A grid (one manifest on one node type) gets one parent MLflow run, found or created
before any job starts; each job learns its id from SAGEBWD_PARENT_RUN_ID so the trainer
can attach its run as a child (issue 7). Creating it up front also creates the tracking
store once, instead of letting parallel jobs race to initialise a sqlite file.
"""
from __future__ import annotations

from experiments.grid.plan import Plan, RunSpec
from launcher.job_env import ENV_GRID, ENV_NODE, ENV_PARENT_RUN_ID, ENV_RUN_DIR, ENV_RUN_NAME

GRID_TAG = "sagebwd.grid"                 # on the parent run: "<manifest>@<node>"
ROLE_TAG = "sagebwd.role"


def resolve_tracking_uri(configured: str | None = None) -> str:
    """Same rule as the trainer: explicit, else $MLFLOW_TRACKING_URI, else the repo's sqlite."""
    from launcher.tracking import resolve_tracking_uri as trainer_rule

    return trainer_rule(configured)


def grid_id(plan: Plan) -> str:
    return f"{plan.manifest.name}@{plan.node.name}"


def ensure_parent_run(plan: Plan, tracking_uri: str) -> str | None:
    """Find or create the grid's parent run; None for grids that train nothing."""
    if plan.manifest.kind != "train" or not plan.experiment:
        return None
    from launcher.tracking import experiment_id, mlflow_client, store_lock

    client = mlflow_client(tracking_uri)
    exp_id = experiment_id(client, plan.experiment, tracking_uri)
    with store_lock(tracking_uri):   # two grids started side by side: one parent run
        existing = client.search_runs([exp_id], filter_string=f"tags.`{GRID_TAG}` = '{grid_id(plan)}'",
                                      max_results=1)
        if existing:
            return existing[0].info.run_id
        run = client.create_run(exp_id, run_name=grid_id(plan),
                                tags={GRID_TAG: grid_id(plan), ROLE_TAG: "grid",
                                      "manifest": str(plan.path), "node": plan.node.name})
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def job_environment(plan: Plan, run: RunSpec, tracking_uri: str,
                    parent_run_id: str | None) -> dict[str, str]:
    env = {"MLFLOW_TRACKING_URI": tracking_uri,
           ENV_GRID: plan.manifest.name, ENV_NODE: plan.node.name,
           ENV_RUN_NAME: run.name, ENV_RUN_DIR: str(run.run_dir),
           # the project's convention (scripts/test.sh): no telemetry from jobs
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
    if plan.experiment:
        env["MLFLOW_EXPERIMENT_NAME"] = plan.experiment
    if parent_run_id:
        env[ENV_PARENT_RUN_ID] = parent_run_id
    return env
