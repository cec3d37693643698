"""The MLflow side of the comparison: find a grid's runs, read them into RunRecords, log the
report back, and say where to look in the MLflow UI.

A grid is one parent run (tag sagebwd.grid = "<manifest>@<node>", made by
experiments.grid.tracking) with each cell a child run (tag mlflow.parentRunId), which
the MLflow UI shows nested under the parent. Runs without a parent (the demo) are
compared as they are; their report goes on a "comparison" run of their own.
"""
from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from experiments.compare.records import (METRIC_EVAL_LOSS, METRIC_LOSS, METRIC_MFU,
                                         METRIC_TOKENS_PER_S, PARAM_SEED, PARAM_TOKENS_PER_STEP,
                                         PARAM_TOTAL_STEPS, PENDING, TAG_ATTENTION,
                                         TAG_DIVERGED_AT, TAG_QK_NORM, TAG_QUANT, TAG_SMOOTHING,
                                         TAG_TOKENS_PER_STEP, TAG_TPS, CellAxes, Curve,
                                         RunRecord)
from experiments.grid.tracking import GRID_TAG, ROLE_TAG
from launcher.tracking import PARENT_RUN_TAG as PARENT_TAG   # MLflow's own nesting tag

if TYPE_CHECKING:
    from mlflow.entities import Experiment, Run
    from mlflow.tracking import MlflowClient

    from experiments.grid.plan import Plan, RunSpec

GRID_ROLE = "grid"                  # ROLE_TAG value on a grid's parent (manifest_tracking)
COMPARISON_ROLE = "comparison"      # ROLE_TAG value on a run that only holds a report
COMPARED_RUNS_TAG = "sagebwd.compared_runs"   # a hash of the compared run ids
ARTIFACT_DIR = "compare"
NO_GRID = "none"                    # --grid value for the runs without a parent
UI_PORT = 5000
COMPACT = (",", ":")            # JSON in URLs without spaces


class CompareError(RuntimeError):
    """Nothing to compare, or the store cannot be read; the message says how to fix it."""


@dataclass(frozen=True)
class Selection:
    """The runs one comparison covers, and where its report is logged."""

    experiment: "Experiment"
    records: list[RunRecord]
    parent_run_id: str | None       # the grid's parent run; None for runs without one
    scope: str                      # "grid main@b200" or "experiment sagebwd-demo"
    notes: list[str]


# --- connecting ------------------------------------------------------------------------

def connect(tracking_uri: str) -> "MlflowClient":
    """A client for a store that exists: fail in seconds, not after MLflow's retries."""
    from launcher.tracking import mlflow_client

    if tracking_uri.startswith(("http://", "https://")):
        health = tracking_uri.rstrip("/") + "/health"
        try:
            urllib.request.urlopen(health, timeout=5).close()
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise CompareError(
                f"the MLflow tracking server {tracking_uri} is not reachable ({reason}). Start it "
                "(`mlflow server --host 127.0.0.1 --port PORT --backend-store-uri sqlite:///PATH`) "
                f"or point --tracking-uri / MLFLOW_TRACKING_URI at a running one") from None
    elif tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise CompareError(
                f"there is no MLflow store at {db}: nothing has been logged to {tracking_uri} "
                "yet. Train first (`python -m experiments.demo`, `python -m experiments run "
                "smoke`) or pass --tracking-uri with the store the runs logged to")
    return mlflow_client(tracking_uri)


def find_experiment(client: "MlflowClient", name: str, tracking_uri: str) -> "Experiment":
    found = client.get_experiment_by_name(name)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(
            f"experiment {name!r} does not exist in {tracking_uri}; it has "
            f"{', '.join(map(repr, names)) or 'no experiments'}. The name is tracking.experiment "
            "of the run config (or experiment: of the manifest)")
    return found


def _all_runs(client: "MlflowClient", experiment_id: str, filter_string: str = "") -> list["Run"]:
    """Every active run that matches, newest first (search_runs pages at 1000)."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string,
                                  max_results=1000, order_by=["attributes.start_time DESC"],
                                  page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


# --- reading one run -------------------------------------------------------------------

def _bool_or_none(text: str | None) -> bool | None:
    return None if text is None else text.strip().lower() == "true"


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def axes_from_run(run: "Run") -> CellAxes:
    """Grid axes from the trainer's tags, else from its logged config."""
    tags, params = run.data.tags, run.data.params
    return CellAxes(
        attention=tags.get(TAG_ATTENTION) or params.get("model.attention") or "?",
        qk_norm=_bool_or_none(tags.get(TAG_QK_NORM) or params.get("model.qk_norm")),
        smoothing=tags.get(TAG_SMOOTHING) or params.get("model.smoothing"),
        tokens_per_step=_int_or_none(tags.get(TAG_TOKENS_PER_STEP)
                                     or params.get(PARAM_TOKENS_PER_STEP)),
        tps_label=tags.get(TAG_TPS), quant=tags.get(TAG_QUANT) or params.get("model.quant"))


def metric_curve(client: "MlflowClient", run: "Run", key: str) -> Curve:
    """One metric's history; a step logged twice (a resumed run) keeps its newest value."""
    if key not in run.data.metrics:
        return ()
    newest: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run.info.run_id, key):
        if m.step not in newest or m.timestamp >= newest[m.step][0]:
            newest[m.step] = (m.timestamp, m.value)
    return tuple((step, value) for step, (_, value) in sorted(newest.items()))


def read_record(client: "MlflowClient", run: "Run", *, name: str | None = None,
                axes: CellAxes | None = None, total_steps: int | None = None,
                seed: int | None = None, notes: tuple[str, ...] = ()) -> RunRecord:
    """seed: the plan's, used when the run logged none (the logged one wins)."""
    curves = {key: metric_curve(client, run, key)
              for key in (METRIC_LOSS, METRIC_EVAL_LOSS, METRIC_TOKENS_PER_S, METRIC_MFU)}
    logged_seed = _int_or_none(run.data.params.get(PARAM_SEED))
    if logged_seed is not None and seed is not None and logged_seed != seed:
        notes += (f"the run logged seed {logged_seed}, the manifest now says {seed}: "
                  f"seed {logged_seed} is used",)
    return RunRecord(
        name=name or run.info.run_name, axes=axes or axes_from_run(run), status=run.info.status,
        run_id=run.info.run_id,
        total_steps=_int_or_none(run.data.params.get(PARAM_TOTAL_STEPS)) or total_steps,
        loss=curves[METRIC_LOSS], eval_loss=curves[METRIC_EVAL_LOSS],
        tokens_per_s=curves[METRIC_TOKENS_PER_S], mfu=curves[METRIC_MFU],
        diverged_at=_int_or_none(run.data.tags.get(TAG_DIVERGED_AT)),
        seed=logged_seed if logged_seed is not None else seed, notes=notes)


def newest_per_cell(runs: list["Run"]) -> tuple[list["Run"], dict[str, int]]:
    """A cell run again (a retry, the demo run twice) counts once: its newest run.
    Returns the runs kept and, per name, how many older runs were left out."""
    kept: dict[str, "Run"] = {}
    older: dict[str, int] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
        name = run.info.run_name
        if name in kept:
            older[name] = older.get(name, 0) + 1
        else:
            kept[name] = run
    return list(kept.values()), older


def _older_note(name: str, older: dict[str, int]) -> tuple[str, ...]:
    n = older.get(name, 0)
    return (f"{n} older run{'s' if n > 1 else ''} of this cell not shown",) if n else ()


# --- selecting a comparison --------------------------------------------------------------

def _grid_name(parent: "Run | None", parent_id: str | None) -> str:
    if parent_id is None:
        return NO_GRID
    return parent.data.tags.get(GRID_TAG, parent.info.run_name) if parent else parent_id


def select_experiment(client: "MlflowClient", tracking_uri: str, experiment_name: str, *,
                      grid: str | None = None, run_ids: list[str] | None = None) -> Selection:
    """The training runs of one experiment: all of one grid (or of no grid), newest per cell."""
    experiment = find_experiment(client, experiment_name, tracking_uri)
    runs = _all_runs(client, experiment.experiment_id)
    parents = {r.info.run_id: r for r in runs if r.data.tags.get(ROLE_TAG) == GRID_ROLE}
    cells = [r for r in runs if r.data.tags.get(ROLE_TAG) not in (GRID_ROLE, COMPARISON_ROLE)]
    if run_ids is not None:
        missing = set(run_ids) - {r.info.run_id for r in cells}
        if missing:
            raise CompareError(f"run(s) {', '.join(sorted(missing))} are not training runs of "
                               f"experiment {experiment_name!r} in {tracking_uri}")
        cells = [r for r in cells if r.info.run_id in set(run_ids)]
    groups: dict[str | None, list["Run"]] = {}
    for run in cells:
        groups.setdefault(run.data.tags.get(PARENT_TAG), []).append(run)
    names = {pid: _grid_name(parents.get(pid), pid) for pid in groups}
    if not groups:
        raise CompareError(f"experiment {experiment_name!r} in {tracking_uri} has no training "
                           "runs logged yet; train first, then compare")
    if grid is not None:
        chosen = [pid for pid, name in names.items() if grid in (name, pid)]
        if not chosen:
            raise CompareError(f"experiment {experiment_name!r} has no grid {grid!r}; its runs "
                               f"belong to {', '.join(sorted(map(str, names.values())))} "
                               f"(pass one of these to --grid; {NO_GRID!r} = runs without a grid)")
    elif len(groups) > 1:
        raise CompareError(f"experiment {experiment_name!r} holds runs of several grids: "
                           f"{', '.join(sorted(map(str, names.values())))}; pick one with --grid "
                           f"NAME ({NO_GRID!r} = the runs without a grid) or use --manifest")
    else:
        chosen = list(groups)
    parent_id = chosen[0]
    kept, older = newest_per_cell(groups[parent_id])
    records = [read_record(client, run, notes=_older_note(run.info.run_name, older))
               for run in kept]
    scope = f"grid {names[parent_id]}" if parent_id else f"experiment {experiment_name}"
    return Selection(experiment, records, parent_id, scope, [])


def is_seed_replica(variant_overrides: tuple[tuple[str, object], ...]) -> bool:
    """A variant that sets the seed and nothing else ({s1: {seed: 1}}): its cells are
    replicas of one cell over seeds. One that also sets anything else is a cell of its own."""
    return bool(variant_overrides) and {key for key, _ in variant_overrides} == {PARAM_SEED}


def _plan_axes(spec: "RunSpec") -> CellAxes:
    return CellAxes(attention=spec.axes["attention"],
                    qk_norm=_bool_or_none(spec.axes.get("qk_norm")),
                    smoothing=spec.axes.get("smoothing"), tokens_per_step=spec.tps,
                    tps_label=spec.axes.get("tps"), variant=spec.axes.get("variant"),
                    quant=spec.axes.get("quant"),
                    seed_replica=is_seed_replica(spec.variant_overrides))


def select_grid(client: "MlflowClient", tracking_uri: str, plan: "Plan") -> Selection:
    """Every cell of a manifest's grid: its newest child run of the grid's parent, or pending."""
    from experiments.grid.tracking import grid_id

    grid = grid_id(plan)
    if plan.manifest.kind != "train" or not plan.experiment:
        raise CompareError(f"manifest {plan.path} trains nothing (kind: {plan.manifest.kind}); "
                           "compare works on training grids")
    experiment = find_experiment(client, plan.experiment, tracking_uri)
    start = (f"`python -m experiments run {plan.manifest.name} --node {plan.node.name}` "
             f"(or `python -m slurm submit {plan.manifest.name} --node {plan.node.name}`)")
    parents = _all_runs(client, experiment.experiment_id,
                        f"tags.`{GRID_TAG}` = '{grid}' AND tags.`{ROLE_TAG}` = '{GRID_ROLE}'")
    if not parents:
        raise CompareError(f"no runs logged yet for grid {grid}: experiment {plan.experiment!r} in "
                           f"{tracking_uri} has no parent run tagged {GRID_TAG}={grid}. Start "
                           f"the grid with {start}, or pass --node if it ran on another node type")
    parent = parents[0]
    notes = []
    children = _all_runs(client, experiment.experiment_id,
                         f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    if not children:
        # Runs logged before the trainer nested its runs: match them by the plan's names.
        names = {spec.name for spec in plan.runs}
        children = [r for r in _all_runs(client, experiment.experiment_id)
                    if r.info.run_name in names and PARENT_TAG not in r.data.tags
                    and r.data.tags.get(ROLE_TAG) is None]
        if children:
            notes.append(f"the cells' runs carry no {PARENT_TAG} tag: matched to the grid by "
                         "run name")
    if not children:
        raise CompareError(f"no runs logged yet for grid {grid}: its parent run "
                           f"{parent.info.run_id} exists, but no cell has started logging. Check "
                           f"the jobs (`python -m slurm status {plan.manifest.name}`) or start "
                           f"the grid with {start}")
    kept, older = newest_per_cell(children)
    by_name = {run.info.run_name: run for run in kept}
    records = []
    for spec in plan.runs:
        run = by_name.pop(spec.name, None)
        if run is None:
            records.append(RunRecord(spec.name, _plan_axes(spec), PENDING, total_steps=spec.steps,
                                     seed=spec.seed))
        else:
            records.append(read_record(client, run, axes=_plan_axes(spec), total_steps=spec.steps,
                                       seed=spec.seed, notes=_older_note(spec.name, older)))
    for run in by_name.values():   # logged under the grid, but not a cell of this manifest now
        records.append(read_record(client, run, notes=("not a cell of the manifest",)))
    return Selection(experiment, records, parent.info.run_id, f"grid {grid}", notes)


# --- writing back ------------------------------------------------------------------------

def comparison_run(client: "MlflowClient", selection: Selection) -> str:
    """The run that holds the report: the grid's parent, else one run per set of compared
    runs (found again by a hash of their ids, so repeating a comparison adds no run)."""
    if selection.parent_run_id:
        return selection.parent_run_id
    ids = sorted(r.run_id for r in selection.records if r.run_id)
    key = hashlib.sha1(",".join(ids).encode()).hexdigest()[:16]
    experiment_id = selection.experiment.experiment_id
    found = _all_runs(client, experiment_id, f"tags.`{COMPARED_RUNS_TAG}` = '{key}'")
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=f"compare-{key[:8]}",
                            tags={ROLE_TAG: COMPARISON_ROLE, COMPARED_RUNS_TAG: key,
                                  "mlflow.note.content": "Comparison of runs " + ", ".join(ids)})
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def log_report(client: "MlflowClient", run_id: str, files: list[Path]) -> None:
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path=ARTIFACT_DIR)


def ui_instructions(tracking_uri: str, experiment_id: str, report_run_id: str | None,
                    run_ids: list[str]) -> list[str]:
    """Loopback links; MLflow 3's UI shows the runs table only with workflowType set."""
    lines = []
    if tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri.rstrip("/")
    else:
        base = f"http://127.0.0.1:{UI_PORT}"
        lines.append(f"Start the UI: mlflow ui --backend-store-uri {tracking_uri} "
                     f"--host 127.0.0.1 --port {UI_PORT}")
    lines.append("Runs table (a grid's cells fold under its parent run): "
                 f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning")
    if report_run_id:
        lines.append(f"This report: {base}/#/experiments/{experiment_id}/runs/{report_run_id}"
                     f"/artifacts/{ARTIFACT_DIR}/report.md")
    if run_ids:
        lines.append(f"Loss curves of these runs in MLflow: {base}/#/"
                     + metric_plot_route(run_ids, experiment_id, [METRIC_LOSS, METRIC_EVAL_LOSS]))
    return lines


def metric_plot_route(run_ids: list[str], experiment_id: str, keys: list[str]) -> str:
    """MLflow's metric plot page for these runs, with the query its UI builds itself
    (Routes.getMetricPageRoute of MLflow 3's UI: the 'Plot chart' link of a run comparison)."""
    def arg(value) -> str:
        return quote(json.dumps(value, separators=COMPACT))

    return (f"metric?runs={arg(run_ids)}&metric={arg(keys[0])}&experiments={arg([experiment_id])}"
            f"&plot_metric_keys={arg(keys)}&plot_layout={arg({})}&x_axis=step"
            f"&y_axis_scale=linear&line_smoothness=1&show_point=false"
            f"&deselected_curves={arg([])}&last_linear_y_axis_range={arg([])}")
