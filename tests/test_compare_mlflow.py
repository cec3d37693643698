"""The compare command against real MLflow stores: a temporary sqlite store, and a real
`mlflow server` on 127.0.0.1 (started once per test session, ~45 s on 2 cores).

The runs are synthetic, made with MlflowClient exactly as the grid contract says: one
parent run per grid (tag sagebwd.grid), its cells as child runs (tag mlflow.parentRunId)
carrying the trainer's axis tags, and curves whose means are exact in floating point.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from experiments.compare.comparison import compare_experiment, compare_manifest
from experiments.compare.store import COMPARISON_ROLE, PARENT_TAG, CompareError
from experiments.grid.tracking import GRID_TAG, ROLE_TAG
from experiments.paths import REPO_ROOT
from mlflow_server_process import MlflowServer, free_port

PYTHON = sys.executable
EXPERIMENT = "cmp-grid"
GRID = "cmpgrid@cpu"
MANIFEST = {
    "name": "cmpgrid", "node": "cpu", "base_config": "experiments/configs/cpu-tiny.yaml",
    "experiment": EXPERIMENT,
    "overrides": {"model.preset": "micro", "model.block_q": 32, "model.block_kv": 32},
    "tps": {"256": {"tokens": 256, "steps": 16, "warmup_steps": 1},
            "128": {"tokens": 128, "steps": 32, "warmup_steps": 1}},
    "grid": [{"attention": ["fpa"], "qk_norm": [True]},
             {"attention": ["sagebwd"], "qk_norm": [True, False], "smoothing": ["k"]}],
}
# What every store of these tests must give for the grid above.
EXPECTED_ROWS = [
    "| cmpgrid-tps256-fpa-qknorm | 256 | FPA | on | — | finished | 16/16 | 2.1875 | 2.5000 | baseline | no | 2,000 | 25.0% |",
    "| cmpgrid-tps256-sagebwd-qknorm-k | 256 | SageBwd | on | k | finished | 16/16 | 2.4375 | 3.5000 | +0.2500 | no | 1,000 | — |",
    "| cmpgrid-tps256-sagebwd-noqknorm-k | 256 | SageBwd | off | k | failed | 10/16 | nan | — | nan | yes, step 10 | — | — |",
    "| cmpgrid-tps128-fpa-qknorm | 128 | FPA | on | — | running | 12/32 | 2.3750 | — | baseline | no | — | — |",
    "| cmpgrid-tps128-sagebwd-qknorm-k | 128 | SageBwd | on | k | running | 8/32 | 4.1875 | — | +0.8125 | no | — | — |",
    "| cmpgrid-tps128-sagebwd-noqknorm-k | 128 | SageBwd | off | k | pending | 0/32 | — | — | — | — | — | — |",
]


def linear(start: float, slope: float, steps: range) -> list[tuple[int, float]]:
    return [(s, start + slope * s) for s in steps]


def log_cell(client: MlflowClient, experiment_id: str, name: str, *, parent: str | None,
             attention: str, qk_norm: bool, tps: int, total: int, status: str,
             loss: list[tuple[int, float]], eval_loss=(), tokens_per_s=(), mfu=(),
             start_time: int, tags: dict | None = None, params: dict | None = None) -> str:
    """One training run as launcher.train logs it (tags, params, per-step metrics)."""
    cell_tags = {"attention": attention, "qk_norm": str(qk_norm).lower(),
                 "smoothing": "k" if attention == "sagebwd" else "none",
                 "tokens_per_step": str(tps), **(tags or {})}
    if parent:
        cell_tags[PARENT_TAG] = parent
    run_id = client.create_run(experiment_id, run_name=name, tags=cell_tags,
                               start_time=start_time).info.run_id
    metrics = [Metric(key, value, start_time, step) for key, curve in
               (("loss", loss), ("eval_loss", eval_loss), ("tokens_per_s", tokens_per_s),
                ("mfu", mfu)) for step, value in curve]
    params = {"train.steps": str(total), "model.attention": attention, **(params or {})}
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    if status != "RUNNING":
        client.set_terminated(run_id, status=status)
    return run_id


def log_grid(client: MlflowClient, artifact_location: str | None) -> dict[str, str]:
    """The MANIFEST grid, part-way: two cells finished, one diverged, two running, one not
    started, and an older run of one cell that the comparison must leave out."""
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=artifact_location)
    parent = client.create_run(experiment_id, run_name=GRID,
                               tags={GRID_TAG: GRID, ROLE_TAG: "grid"}).info.run_id
    client.set_terminated(parent)
    cell = dict(parent=parent)
    big = dict(tps=256, total=16, **cell)
    small = dict(tps=128, total=32, **cell)
    log_cell(client, experiment_id, "cmpgrid-tps256-fpa-qknorm", attention="fpa", qk_norm=True,
             status="FAILED", loss=linear(9.0, 0.0, range(1, 5)), start_time=1000, **big)
    ids = {
        "fpa": log_cell(client, experiment_id, "cmpgrid-tps256-fpa-qknorm", attention="fpa",
                        qk_norm=True, status="FINISHED", loss=linear(4.0, -0.125, range(1, 17)),
                        eval_loss=[(8, 3.25), (16, 2.5)], mfu=[(1, 0.5), (2, 0.25), (3, 0.25)],
                        tokens_per_s=[(1, 10.0), (2, 4000.0), (3, 2000.0)], start_time=2000,
                        **big),
        "sage": log_cell(client, experiment_id, "cmpgrid-tps256-sagebwd-qknorm-k",
                         attention="sagebwd", qk_norm=True, status="FINISHED",
                         loss=linear(4.25, -0.125, range(1, 17)), eval_loss=[(8, 3.5)],
                         tokens_per_s=[(s, 1000.0) for s in range(1, 17)], start_time=2001, **big),
        "noqk": log_cell(client, experiment_id, "cmpgrid-tps256-sagebwd-noqknorm-k",
                         attention="sagebwd", qk_norm=False, status="FAILED",
                         loss=linear(4.0, -0.125, range(1, 10)) + [(10, float("nan"))],
                         tags={"diverged_at_step": "10"}, start_time=2002, **big),
        "small-fpa": log_cell(client, experiment_id, "cmpgrid-tps128-fpa-qknorm", attention="fpa",
                              qk_norm=True, status="RUNNING", loss=linear(5.0, -0.25, range(1, 13)),
                              start_time=2003, **small),
        "small-sage": log_cell(client, experiment_id, "cmpgrid-tps128-sagebwd-qknorm-k",
                               attention="sagebwd", qk_norm=True, status="RUNNING",
                               loss=linear(5.0, -0.125, range(1, 9)), start_time=2004, **small),
    }
    return {"experiment_id": experiment_id, "parent": parent, **ids}


def write_manifest(folder: Path, raw: dict) -> Path:
    path = folder / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| cmpgrid-")]


# --- a local sqlite store -----------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare-store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    ids = log_grid(client, (folder / "artifacts").as_uri())
    demo = client.create_experiment("cmp-demo", artifact_location=(folder / "demo").as_uri())
    for i, attention in enumerate(["fpa", "sagebwd"]):   # the demo: two runs, no grid
        ids[f"demo-{attention}"] = log_cell(
            client, demo, f"{attention}-demo", parent=None, attention=attention, qk_norm=True,
            tps=1024, total=4, status="FINISHED", loss=linear(3.0 + i / 4, -0.5, range(1, 5)),
            start_time=3000 + i)
    return {"uri": uri, "client": client, "folder": folder, "manifest":
            write_manifest(folder, MANIFEST), **ids}


def test_manifest_grid_gives_the_exact_table_and_logs_on_the_parent(store, tmp_path):
    lines: list[str] = []
    result = compare_manifest(store["manifest"], tracking_uri=store["uri"], out=tmp_path,
                              last_k=4, say=lines.append)
    assert table_rows(result.table) == EXPECTED_ROWS
    assert result.report_run_id == store["parent"]
    assert [p.name for p in result.figures] == ["loss-qk-norm.png"]
    artifacts = [a.path for a in store["client"].list_artifacts(store["parent"], "compare")]
    assert artifacts == ["compare/loss-qk-norm.png", "compare/report.md"]
    report = result.report.read_text()
    assert "# SageBwd vs FPA: grid cmpgrid@cpu" in report
    assert "cmpgrid-tps256-fpa-qknorm: 1 older run of this cell not shown" in report
    assert "MFU: no run logs" not in report           # one cell logs it
    assert "![loss-qk-norm](loss-qk-norm.png)" in report
    printed = "\n".join(lines)
    assert f"mlflow ui --backend-store-uri {store['uri']} --host 127.0.0.1 --port 5000" in printed
    assert (f"http://127.0.0.1:5000/#/experiments/{store['experiment_id']}/runs"
            "?workflowType=machine_learning") in printed


def test_experiment_mode_compares_the_runs_without_a_grid_on_a_comparison_run(store, tmp_path):
    first = compare_experiment("cmp-demo", tracking_uri=store["uri"], out=tmp_path, last_k=2,
                               say=lambda _: None)
    assert [(r.record.name, r.final_loss, r.gap) for r in first.rows] == [
        ("fpa-demo", 1.25, None), ("sagebwd-demo", 1.5, 0.25)]
    assert [p.name for p in first.figures] == ["loss-curves.png"]
    client = store["client"]
    holder = client.get_run(first.report_run_id)
    assert holder.data.tags[ROLE_TAG] == COMPARISON_ROLE
    again = compare_experiment("cmp-demo", tracking_uri=store["uri"], out=tmp_path,
                               run_ids=[store["demo-fpa"], store["demo-sagebwd"]],
                               say=lambda _: None)
    assert again.report_run_id == first.report_run_id     # no new run for the same comparison
    only_fpa = compare_experiment("cmp-demo", tracking_uri=store["uri"], out=tmp_path,
                                  run_ids=[store["demo-fpa"]], log=False, say=lambda _: None)
    assert [r.record.name for r in only_fpa.rows] == ["fpa-demo"]
    assert only_fpa.report_run_id is None


def test_experiment_mode_picks_one_grid(store, tmp_path):
    client = store["client"]
    stray = log_cell(client, store["experiment_id"], "stray", parent=None, attention="fpa",
                     qk_norm=True, tps=256, total=16, status="FINISHED",
                     loss=linear(1.0, 0.0, range(1, 3)), start_time=4000)
    try:
        with pytest.raises(CompareError) as err:
            compare_experiment(EXPERIMENT, tracking_uri=store["uri"], out=tmp_path)
        assert str(err.value) == (
            f"experiment {EXPERIMENT!r} holds runs of several grids: {GRID}, none; pick one with "
            "--grid NAME ('none' = the runs without a grid) or use --manifest")
        result = compare_experiment(EXPERIMENT, grid=GRID, tracking_uri=store["uri"], out=tmp_path,
                                    last_k=4, log=False, say=lambda _: None)
        assert table_rows(result.table) == EXPECTED_ROWS[:5]   # no plan: no pending cell
    finally:
        client.delete_run(stray)


def test_errors_say_what_is_missing_and_how_to_fix_it(store, tmp_path):
    uri = store["uri"]
    with pytest.raises(CompareError) as err:
        compare_experiment("no-such", tracking_uri=uri)
    assert str(err.value) == (
        f"experiment 'no-such' does not exist in {uri}; it has 'Default', 'cmp-demo', "
        "'cmp-grid'. The name is tracking.experiment of the run config (or experiment: of the "
        "manifest)")

    unstarted = write_manifest(tmp_path, {**MANIFEST, "name": "unstarted"})
    with pytest.raises(CompareError) as err:
        compare_manifest(unstarted, tracking_uri=uri)
    assert str(err.value).startswith(
        f"no runs logged yet for grid unstarted@cpu: experiment '{EXPERIMENT}' in {uri} has no "
        f"parent run tagged {GRID_TAG}=unstarted@cpu. Start the grid with `python -m experiments "
        "run unstarted --node cpu`")

    client = store["client"]
    parent = client.create_run(store["experiment_id"], run_name="empty@cpu",
                               tags={GRID_TAG: "empty@cpu", ROLE_TAG: "grid"}).info.run_id
    try:
        with pytest.raises(CompareError, match=f"no runs logged yet for grid empty@cpu: its parent "
                           f"run {parent} exists, but no cell has started logging"):
            compare_manifest(write_manifest(tmp_path, {**MANIFEST, "name": "empty"}),
                             tracking_uri=uri)
    finally:
        client.delete_run(parent)

    missing = tmp_path / "nowhere.db"
    with pytest.raises(CompareError, match=f"there is no MLflow store at {missing}"):
        compare_experiment("cmp-demo", tracking_uri=f"sqlite:///{missing}")
    assert not missing.exists()     # reading must not create an empty store


# --- a grid over seeds, its export and the round trip -------------------------------------

SEED_VARIANTS = {"s0": {"seed": 0}, "s1": {"seed": 1}, "s2": {"seed": 2},
                 "lr": {"seed": 0, "optimizer.lr": 0.004}}
SEED_MANIFEST = {
    **MANIFEST, "name": "seedgrid", "experiment": "cmp-seeds",
    "tps": {"256": {"tokens": 256, "steps": 16, "warmup_steps": 1}},
    # three seeds, and a variant that also sets the learning rate: a cell of its own
    "grid": [{"attention": ["fpa"], "qk_norm": [True], "overrides": SEED_VARIANTS},
             {"attention": ["sagebwd"], "qk_norm": [True], "smoothing": ["k"],
              "overrides": SEED_VARIANTS}],
}
# final eval loss per run; sagebwd s2 diverges
SEED_FINALS = {("fpa", "s0"): 3.0, ("fpa", "s1"): 3.25, ("fpa", "s2"): 3.5, ("fpa", "lr"): 3.0,
               ("sagebwd", "s0"): 3.125, ("sagebwd", "s1"): 3.5, ("sagebwd", "lr"): 3.0625}


def seed_rows(text: str) -> list[str]:
    """The over-seeds table's rows: those after its header."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| cell |") and "| seeds |" in line)
    return [line for line in lines[start:] if line.startswith("| seedgrid-")]


def test_a_grid_over_seeds_gives_paired_gaps_and_an_export_that_redoes_it(store, tmp_path):
    from experiments.compare.comparison import compare_export
    from experiments.grid.plan import plan_manifest

    client = store["client"]
    manifest = write_manifest(tmp_path, SEED_MANIFEST)
    experiment_id = client.create_experiment("cmp-seeds",
                                             artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment_id, run_name="seedgrid@cpu",
                               tags={GRID_TAG: "seedgrid@cpu", ROLE_TAG: "grid"}).info.run_id
    for i, spec in enumerate(plan_manifest(manifest, check_paths=False).runs):
        attention, variant = spec.axes["attention"], spec.axes["variant"]
        diverged = (attention, variant) == ("sagebwd", "s2")
        final = SEED_FINALS.get((attention, variant), 3.0)
        log_cell(client, experiment_id, spec.name, parent=parent, attention=attention,
                 qk_norm=True, tps=256, total=16, status="FAILED" if diverged else "FINISHED",
                 loss=linear(4.0, -0.125, range(1, 10)) + [(10, float("nan"))] if diverged
                 else linear(4.0 + i / 8, -0.125, range(1, 17)),
                 eval_loss=[(8, final + 0.25)] + ([] if diverged else [(16, final)]),
                 params={"seed": str(spec.seed)}, start_time=5000 + i,
                 tags={"diverged_at_step": "10"} if diverged else None)
    export = tmp_path / "seeds.json"
    result = compare_manifest(manifest, tracking_uri=store["uri"], out=tmp_path / "out",
                              export=export, say=lambda _: None)
    assert {row.record.name: row.record.seed for row in result.rows}[
        "seedgrid-tps256-sagebwd-qknorm-k-s1"] == 1
    # by hand: sagebwd seeds 0 and 1 pair with FPA's (3.125-3.0, 3.5-3.25 = 0.125, 0.25):
    # mean 0.1875, sd 0.0884, s.e. 0.0884/sqrt(2) = 0.0625; seed 2 diverged, left out
    assert seed_rows(result.seed_table) == [
        "| seedgrid-tps256-fpa-qknorm-lr | 256 | FPA | on | — | 1/1 | 3.0000 | — | 3.0000 | baseline | — | — | no |",
        "| seedgrid-tps256-sagebwd-qknorm-k-lr | 256 | SageBwd | on | k | 1/1 | 3.0625 | — | 3.0625 | +0.0625 | — | — | no |",
        "| seedgrid-tps256-fpa-qknorm | 256 | FPA | on | — | 3/3 | 3.2500 | 0.2500 | 3.2500 | baseline | — | — | no |",
        "| seedgrid-tps256-sagebwd-qknorm-k | 256 | SageBwd | on | k | 2/3 | 3.3125 | 0.2652 | 3.3125 | +0.1875 | 0.0625 | +3.0 | "
        "**yes**, 1 of 3: seed 2 at step 10 (left out) |",
    ]
    report = result.report.read_text()
    assert report.index("## Over seeds") > report.index("| seedgrid-tps256-fpa-qknorm-s0 |")
    assert "Δ vs FPA is paired: per seed" in report
    assert [a.path for a in client.list_artifacts(parent, "compare")] == [
        "compare/loss-curves.png", "compare/report.md", "compare/seeds.json"]
    # the round trip: the same tables from the file alone
    again = compare_export(export, out=tmp_path / "again", say=lambda _: None)
    assert again.table == result.table and again.seed_table == result.seed_table
    assert "From the export `seeds.json`, read from MLflow store" in again.report.read_text()
    done = run_compare("--from-export", str(export), "--out", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    assert seed_rows(done.stdout) == seed_rows(result.seed_table)
    done = run_compare("--from-export", str(export), "--last-k", "21")
    assert done.returncode == 2 and "exported with --last-k 20" in done.stderr


# --- the command against a real `mlflow server` ---------------------------------------------

@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real tracking server with its own sqlite store and proxied artifact folder."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server.start().url
    finally:
        server.stop()


def run_compare(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run([PYTHON, "-m", "experiments", "compare", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_compare_command_against_a_tracking_server(mlflow_server, tmp_path):
    client = MlflowClient(mlflow_server)
    ids = log_grid(client, artifact_location=None)     # artifacts go through the server
    manifest = write_manifest(tmp_path, MANIFEST)
    done = run_compare("--manifest", str(manifest), "--tracking-uri", mlflow_server,
                       "--out", str(tmp_path / "out"), "--last-k", "4")
    assert done.returncode == 0, done.stderr
    assert table_rows(done.stdout) == EXPECTED_ROWS
    experiment_id = ids["experiment_id"]
    assert ("Runs table (a grid's cells fold under its parent run): "
            f"{mlflow_server}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            ) in done.stdout
    assert (f"This report: {mlflow_server}/#/experiments/{experiment_id}/runs/{ids['parent']}"
            "/artifacts/compare/report.md") in done.stdout
    assert "mlflow ui" not in done.stdout        # the server is the UI
    artifacts = [a.path for a in client.list_artifacts(ids["parent"], "compare")]
    assert artifacts == ["compare/loss-qk-norm.png", "compare/report.md"]
    png = client.download_artifacts(ids["parent"], "compare/loss-qk-norm.png", str(tmp_path))
    assert Path(png).read_bytes() == (tmp_path / "out" / "loss-qk-norm.png").read_bytes()
    with urllib.request.urlopen(mlflow_server + "/", timeout=10) as page:   # the UI the links open
        assert b"<html" in page.read(2000).lower()


def test_unreachable_server_fails_fast_with_a_fix():
    port = free_port()     # nothing listens there once the probe socket is closed
    started = time.monotonic()
    done = run_compare("--experiment", EXPERIMENT, "--tracking-uri", f"http://127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"error: the MLflow tracking server http://127.0.0.1:{port} is not reachable "
        "([Errno 111] Connection refused). Start it (`mlflow server --host 127.0.0.1 --port PORT "
        "--backend-store-uri sqlite:///PATH`) or point --tracking-uri / MLFLOW_TRACKING_URI at a "
        "running one")
    assert time.monotonic() - started < 60
