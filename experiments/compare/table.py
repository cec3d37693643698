"""The comparison itself, a pure function of RunRecords: one row of numbers per cell.

Matching FPA cell (the baseline of a SageBwd cell's gap): an FPA cell with the same TPS
and the same free-axis variant, where a variant that only sets the seed counts as no
variant. QK-norm and smoothing are SageBwd's own knobs, so they are not part of the match;
when a grid has several FPA cells at that TPS, the one with the same seed wins, then the
one with the same qk_norm, then the one that has logged steps, then the first in grid order.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from experiments.compare.records import PENDING, CellAxes, Curve, RunRecord

SMOOTHING_ORDER = {"none": 0, "k": 1, "qk": 2}
NO_VALUE = "—"


@dataclass(frozen=True)
class CellRow:
    record: RunRecord
    final_loss: float | None       # mean of the last k logged train losses
    best_eval_loss: float | None   # lowest finite eval loss
    baseline: RunRecord | None     # the matching FPA cell (None for FPA cells themselves)
    gap: float | None              # mean loss minus the baseline's over their last k common steps
    diverged_at: int | None        # first non-finite train loss, or the trainer's tag
    tokens_per_s: float | None     # median over steps: the first steps include compilation
    mfu: float | None              # median, a fraction of peak
    steps_done: int | None         # last logged train step


def cell_order(record: RunRecord) -> tuple:
    """Large TPS first (as in the paper's figures), FPA first, then QK-norm on, smoothing."""
    a = record.axes
    return (-(a.tokens_per_step or 0), a.tps, a.variant or "", a.attention != "fpa",
            a.qk_norm is False, SMOOTHING_ORDER.get(a.smoothing or "", 9), a.sage_label, record.name)


def matching_fpa(record: RunRecord, records: list[RunRecord]) -> RunRecord | None:
    a = record.axes
    if a.attention == "fpa":
        return None
    candidates = [r for r in records if r.axes.attention == "fpa" and r.axes.tps == a.tps
                  and r.axes.cell_variant == a.cell_variant]
    # sorted() is stable: ties keep grid order
    ranked = sorted(candidates, key=lambda r: (r.seed != record.seed, r.axes.qk_norm != a.qk_norm,
                                               not r.loss))
    return ranked[0] if ranked else None


def mean_of_last(curve: Curve, k: int) -> float | None:
    """Non-finite values propagate: a diverged run's final loss reads nan, not a number."""
    tail = [value for _, value in curve[-k:]]
    return sum(tail) / len(tail) if tail else None


def gap_over_common_steps(curve: Curve, baseline: Curve, k: int) -> float | None:
    """Compare at the same steps, so a run that is behind is not judged against a later loss."""
    base = dict(baseline)
    common = [(value, base[step]) for step, value in curve if step in base][-k:]
    if not common:
        return None
    return sum(v for v, _ in common) / len(common) - sum(b for _, b in common) / len(common)


def first_non_finite(curve: Curve) -> int | None:
    return next((step for step, value in curve if not math.isfinite(value)), None)


def median(curve: Curve) -> float | None:
    values = [value for _, value in curve if math.isfinite(value)]
    return statistics.median(values) if values else None


def compare(records: list[RunRecord], last_k: int = 20) -> list[CellRow]:
    if last_k < 1:
        raise ValueError(f"last_k must be at least 1, got {last_k}")
    ordered = sorted(records, key=cell_order)
    rows = []
    for record in ordered:
        baseline = matching_fpa(record, ordered)
        finite_evals = [v for _, v in record.eval_loss if math.isfinite(v)]
        gap = (gap_over_common_steps(record.loss, baseline.loss, last_k)
               if baseline is not None else None)
        non_finite = first_non_finite(record.loss)
        rows.append(CellRow(
            record=record, final_loss=mean_of_last(record.loss, last_k),
            best_eval_loss=min(finite_evals) if finite_evals else None,
            baseline=baseline, gap=gap,
            diverged_at=non_finite if non_finite is not None else record.diverged_at,
            tokens_per_s=median(record.tokens_per_s), mfu=median(record.mfu),
            steps_done=record.loss[-1][0] if record.loss else None))
    return rows


# --- text ------------------------------------------------------------------------------

COLUMNS = ("cell", "TPS", "attention", "QK-norm", "smoothing", "status", "steps",
           "train loss", "best eval", "Δ vs FPA", "diverged", "tokens/s", "MFU")


def number(value: float | None, fmt: str) -> str:
    if value is None:
        return NO_VALUE
    return "nan" if math.isnan(value) else format(value, fmt)


def _steps(row: CellRow) -> str:
    done = row.steps_done or 0
    total = row.record.total_steps
    return f"{done:,}/{total:,}" if total else f"{done:,}/{NO_VALUE}"


def _gap(row: CellRow) -> str:
    if row.record.axes.attention == "fpa":
        return "baseline"
    if row.baseline is None:
        return "no FPA cell"
    return number(row.gap, "+.4f")


def _diverged(row: CellRow) -> str:
    if row.record.status == PENDING:
        return NO_VALUE
    return f"yes, step {row.diverged_at:,}" if row.diverged_at is not None else "no"


def axis_cells(a: CellAxes) -> list[str]:
    """The TPS, attention, QK-norm and smoothing columns (smoothing only for SageBwd)."""
    sage = a.attention == "sagebwd"
    qk_norm = NO_VALUE if a.qk_norm is None else ("on" if a.qk_norm else "off")
    return [a.tps, a.sage_label if sage else a.attention.upper(), qk_norm,
            (a.smoothing or NO_VALUE) if sage else NO_VALUE]


def row_cells(row: CellRow) -> list[str]:
    return [row.record.name, *axis_cells(row.record.axes), row.record.status.lower(),
            _steps(row), number(row.final_loss, ".4f"), number(row.best_eval_loss, ".4f"),
            _gap(row), _diverged(row), number(row.tokens_per_s, ",.0f"),
            number(row.mfu, ".1%")]


def format_table(rows: list[CellRow]) -> str:
    """A Markdown table, which also reads well in a terminal."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def column_notes(last_k: int) -> str:
    return (f"train loss: mean of the last {last_k} logged steps (all, when fewer). "
            "best eval: lowest eval loss. "
            f"Δ vs FPA: train loss minus the matching FPA cell's, over the last {last_k} steps "
            "both have logged. diverged: a non-finite train loss. tokens/s and MFU: medians "
            f"over steps ({NO_VALUE}: not logged).")
