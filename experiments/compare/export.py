"""A comparison's records as one small JSON file, to commit next to its PNGs: `compare
--export FILE.json` writes it, `compare --from-export FILE.json` redoes the tables, figures
and report from it without MLflow.

Per run: name, axes, status, run id, seed, total steps, the eval loss curve, the train loss
curve thinned to about MAX_CURVE_POINTS points, the medians of tokens/s and MFU, and the
step it diverged at. The thinning keeps every point the tables read, so the tables come back
exactly with the export's --last-k (or a smaller one): each run's last K train losses, the
last K steps it shares with its matching FPA cell, and its first non-finite loss. The rest
is one point every `stride` steps, the same stride for every run of one TPS, so the runs of
a figure's column keep common steps for the gap panel.

Non-finite values are written as the strings "nan", "inf" and "-inf", so the file is
strict JSON.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.compare.records import CellAxes, Curve, RunRecord
from experiments.compare.store import CompareError
from experiments.compare.table import CellRow, first_non_finite

FORMAT = "sagebwd-compare-export"
VERSION = 1
MAX_CURVE_POINTS = 200
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class Export:
    """What an export file holds: enough to redo the comparison."""

    scope: str                 # "grid paper-small@h100-1"
    source: dict               # where the records were read: tracking_uri, experiment
    last_k: int                # the --last-k the export was made with
    notes: list[str]
    records: list[RunRecord]


def _value(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _curve_out(curve: Curve, steps: set[int] | None = None) -> list[list]:
    return [[step, _value(value)] for step, value in curve if steps is None or step in steps]


def _curve_in(points: list) -> Curve:
    return tuple((int(step), NON_FINITE[value] if isinstance(value, str) else float(value))
                 for step, value in points)


def kept_steps(rows: list[CellRow], last_k: int,
               max_points: int = MAX_CURVE_POINTS) -> dict[str, set[int]]:
    """Per run name, the train-loss steps the export keeps (see the module's docstring)."""
    last_step: dict[str, int] = {}
    for row in rows:
        if row.record.loss:
            tps = row.record.axes.tps
            last_step[tps] = max(last_step.get(tps, 0), row.record.loss[-1][0])
    keep: dict[str, set[int]] = {row.record.name: set() for row in rows}
    for row in rows:
        steps = [step for step, _ in row.record.loss]
        if not steps:
            continue
        stride = max(1, math.ceil(last_step[row.record.axes.tps] / max_points))
        kept = keep[row.record.name]
        kept |= {s for s in steps if s % stride == 0} | {steps[0]} | set(steps[-last_k:])
        if (bad := first_non_finite(row.record.loss)) is not None:
            kept.add(bad)
        if row.baseline is not None and row.baseline.name in keep:
            base = {step for step, _ in row.baseline.loss}
            common = [s for s in steps if s in base][-last_k:]
            kept |= set(common)
            keep[row.baseline.name] |= set(common)
    return keep


def _median(value: float | None) -> Curve:
    """A median read back as a one-point curve, whose median it is."""
    return () if value is None else ((0, value),)


def write_export(rows: list[CellRow], path: Path, *, scope: str, source: dict, last_k: int,
                 notes: list[str]) -> Path:
    keep = kept_steps(rows, last_k)
    runs = [{"name": row.record.name, "axes": asdict(row.record.axes),
             "status": row.record.status, "run_id": row.record.run_id, "seed": row.record.seed,
             "total_steps": row.record.total_steps, "diverged_at": row.diverged_at,
             "tokens_per_s_median": row.tokens_per_s, "mfu_median": row.mfu,
             "eval_loss": _curve_out(row.record.eval_loss),
             "loss": _curve_out(row.record.loss, keep[row.record.name]),
             "notes": list(row.record.notes)} for row in rows]
    header = {"format": FORMAT, "version": VERSION, "scope": scope, "source": source,
              "last_k": last_k, "max_curve_points": MAX_CURVE_POINTS, "notes": notes}
    # One run a line: small diffs when a grid is exported again, and still strict JSON.
    lines = ["{", *[f" {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()],
             ' "runs": [',
             ",\n".join("  " + json.dumps(run, separators=(",", ":"), allow_nan=False)
                        for run in runs), " ]", "}", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def read_export(path: str | Path) -> Export:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"there is no export at {path}; write one with `python -m experiments "
                           "compare ... --export FILE.json`") from None
    except json.JSONDecodeError as err:
        raise CompareError(f"{path} is not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CompareError(f"{path} is not a comparison export (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise CompareError(f"{path} is export version {data.get('version')}; this code reads "
                           f"version {VERSION}")
    records = [RunRecord(
        name=run["name"], axes=CellAxes(**run["axes"]), status=run["status"],
        run_id=run["run_id"], total_steps=run["total_steps"], loss=_curve_in(run["loss"]),
        eval_loss=_curve_in(run["eval_loss"]), tokens_per_s=_median(run["tokens_per_s_median"]),
        mfu=_median(run["mfu_median"]), diverged_at=run["diverged_at"], seed=run["seed"],
        notes=tuple(run["notes"])) for run in data["runs"]]
    return Export(data["scope"], data["source"], data["last_k"], data["notes"], records)
