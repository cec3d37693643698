"""Loss-curve PNGs in the layout of the paper's figures: one column per TPS, the train loss
on top and its difference to the matching FPA cell below.

Two views of a grid, each written only when the grid varies that axis:
  loss-qk-norm.png    Figure 1: FPA, SageBwd with and without QK-norm (K-smoothing)
  loss-smoothing.png  the ablation: FPA, SageBwd (QK-norm) with none / K / QK smoothing
A grid that varies neither (the demo: FPA vs one SageBwd cell) gets loss-curves.png.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI or servers
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.compare.records import FINISHED, PENDING, Curve, RunRecord  # noqa: E402
from experiments.compare.table import CellRow  # noqa: E402
from experiments.grid.table import human_count  # noqa: E402

EMA_WINDOW = 0.02   # of the panel's longest run, in steps
MAX_POINTS = 2000   # per drawn curve: enough for a 12-inch PNG, fast for 300k-step runs
SMOOTHING_NAMES = {"none": "no smoothing", "k": "K-smoothing", "qk": "QK-smoothing"}


@dataclass(frozen=True)
class FigureView:
    stem: str                                  # file name without .png
    title: str
    selects: Callable[[RunRecord], bool]
    label: Callable[[RunRecord], str]


def _fpa_label(r: RunRecord) -> str:
    return "FPA" if r.axes.qk_norm is not False else "FPA w/o QK-norm"


def _with_variant(label: str, r: RunRecord) -> str:
    return f"{label} [{r.axes.variant}]" if r.axes.variant else label


def _qk_norm_label(r: RunRecord) -> str:
    if r.axes.attention == "fpa":
        return _with_variant(_fpa_label(r), r)
    return _with_variant(f"{r.axes.sage_label} + QK-norm" if r.axes.qk_norm else f"{r.axes.sage_label} w/o QK-norm", r)


def _smoothing_label(r: RunRecord) -> str:
    if r.axes.attention == "fpa":
        return _with_variant(_fpa_label(r), r)
    return _with_variant(f"{r.axes.sage_label}, {SMOOTHING_NAMES.get(r.axes.smoothing, r.axes.smoothing)}", r)


def _full_label(r: RunRecord) -> str:
    """Every setting the run logged: 'FPA, QK-norm' against 'SageBwd, QK-norm, K-smoothing'."""
    qk = {True: "QK-norm", False: "no QK-norm"}.get(r.axes.qk_norm)
    if r.axes.attention == "fpa":
        parts = ["FPA", qk]
    else:
        parts = [r.axes.sage_label, qk, SMOOTHING_NAMES.get(r.axes.smoothing, r.axes.smoothing)]
    return _with_variant(", ".join(part for part in parts if part), r)


QK_NORM_VIEW = FigureView(
    "loss-qk-norm", "FPA vs SageBwd with and without QK-norm (K-smoothing)",
    lambda r: r.axes.attention == "fpa" or r.axes.smoothing == "k", _qk_norm_label)
SMOOTHING_VIEW = FigureView(
    "loss-smoothing", "Smoothing ablation: SageBwd with QK-norm, none / K / QK smoothing, vs FPA",
    lambda r: r.axes.attention == "fpa" or r.axes.qk_norm is True, _smoothing_label)
ALL_CELLS_VIEW = FigureView("loss-curves", "FPA vs SageBwd", lambda r: True, _full_label)


def views_for(records: list[RunRecord]) -> list[FigureView]:
    sage = [r.axes for r in records if r.axes.attention == "sagebwd"]
    views = []
    if len({a.qk_norm for a in sage if a.smoothing == "k"}) > 1:
        views.append(QK_NORM_VIEW)
    if len({a.smoothing for a in sage if a.qk_norm is True}) > 1:
        views.append(SMOOTHING_VIEW)
    return views or [ALL_CELLS_VIEW]


def ema(curve: Curve, window: float) -> list[float]:
    """Exponential moving average with a time constant of `window` steps. One window for
    every curve of a panel, so their difference shows the runs, not unequal smoothing lag;
    non-finite values are skipped (the legend reports divergence)."""
    out, acc, last_step = [], None, None
    for step, value in curve:
        if math.isfinite(value):
            if acc is None:
                acc = value
            else:
                alpha = 1.0 - math.exp(-(step - last_step) / window)
                acc += alpha * (value - acc)
            last_step = step
        out.append(acc if acc is not None else math.nan)
    return out


def thin(xs: list, ys: list) -> tuple[list, list]:
    stride = max(1, len(xs) // MAX_POINTS)
    return xs[::stride] + xs[-1:], ys[::stride] + ys[-1:]


def _x_of(row: CellRow) -> Callable[[int], float]:
    tps = row.record.axes.tokens_per_step
    return (lambda step: step * tps) if tps else float


def _state_suffix(row: CellRow) -> str:
    r = row.record
    if r.status == PENDING:
        return " (pending)"
    if row.diverged_at is not None:
        return f" (diverged at step {row.diverged_at:,})"
    if r.status != FINISHED:
        done = f"{row.steps_done or 0:,}/{r.total_steps:,}" if r.total_steps else \
            f"{row.steps_done or 0:,} steps"
        return f" ({r.status.lower()}, {done})"
    return ""


def _smoothed(record: RunRecord, window: float) -> dict[int, float]:
    return dict(zip([s for s, _ in record.loss], ema(record.loss, window)))


def _robust_limits(values: list[float], pad: float = 0.08) -> tuple[float, float] | None:
    if not values:
        return None
    low, high = min(values), max(values)
    margin = pad * (high - low or abs(high) or 1.0)
    return low - margin, high + margin


def _draw_panel(ax_loss, ax_gap, rows: list[CellRow], view: FigureView,
                colors: dict[str, str]) -> None:
    last_steps = [row.record.loss[-1][0] for row in rows if row.record.loss]
    window = max(1.0, EMA_WINDOW * max(last_steps, default=1))
    loss_range, gap_range, crosses = [], [], []
    for row in rows:
        label = view.label(row.record)
        color = colors[label]
        if not row.record.loss:
            ax_loss.plot([], [], linestyle=":", color=color, label=label + _state_suffix(row))
            continue
        to_x = _x_of(row)
        steps = [s for s, _ in row.record.loss]
        smooth = _smoothed(row.record, window)
        xs = [to_x(s) for s in steps]
        ax_loss.plot(*thin(xs, [v for _, v in row.record.loss]), color=color, alpha=0.15,
                     linewidth=0.8)
        ax_loss.plot(*thin(xs, [smooth[s] for s in steps]), color=color, linewidth=1.8,
                     label=label + _state_suffix(row))
        finite = [smooth[s] for s in steps if math.isfinite(smooth[s])]
        # From 10% in: the first steps' loss (~ln vocab) would squash the part worth reading.
        loss_range += [finite[len(finite) // 10], min(finite)] if finite else []
        if row.diverged_at is not None and finite:
            last = max(s for s in steps if s < row.diverged_at or s == steps[0])
            crosses.append((to_x(last), smooth[last], color))
        if row.baseline is not None and row.baseline.loss:
            base = _smoothed(row.baseline, window)
            common = [s for s in steps if s in base and math.isfinite(smooth[s] - base[s])]
            gaps = [smooth[s] - base[s] for s in common]
            ax_gap.plot(*thin([to_x(s) for s in common], gaps), color=color, linewidth=1.5)
            if row.diverged_at is None:   # a blow-up would flatten every other gap to zero
                gap_range += gaps[len(gaps) // 20:]
    if limits := _robust_limits(loss_range, pad=0.05):
        ax_loss.set_ylim(*limits)
    top = ax_loss.get_ylim()[1]
    for x, y, color in crosses:   # a run that blew up off the panel is marked at its edge
        ax_loss.plot(x, min(y, top), "x", color=color, markersize=10, markeredgewidth=2.5,
                     clip_on=False)
    if limits := _robust_limits(gap_range + [0.0]):
        ax_gap.set_ylim(*limits)
    ax_gap.axhline(0.0, color="black", linewidth=0.8)
    tokens = all(row.record.axes.tokens_per_step for row in rows)
    ax_gap.set_xlabel("tokens" if tokens else "step")
    if tokens:
        ax_gap.xaxis.set_major_formatter(
            FuncFormatter(lambda v, _: human_count(int(v)) if v >= 1 else "0"))
    ax_loss.legend(fontsize=8)
    for ax in (ax_loss, ax_gap):
        ax.grid(alpha=0.3)


def write_figure(rows: list[CellRow], view: FigureView, path: Path, title: str = "") -> Path:
    selected = [row for row in rows if view.selects(row.record)]
    tps_columns = list(dict.fromkeys(row.record.axes.tps for row in selected))
    labels = list(dict.fromkeys(view.label(row.record) for row in selected))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    fig, axes = plt.subplots(2, len(tps_columns), figsize=(6 * len(tps_columns), 6.5),
                             sharex="col", squeeze=False, constrained_layout=True,
                             gridspec_kw={"height_ratios": [3, 1.3]})
    for column, tps in enumerate(tps_columns):
        ax_loss, ax_gap = axes[0][column], axes[1][column]
        column_rows = [row for row in selected if row.record.axes.tps == tps]
        _draw_panel(ax_loss, ax_gap, column_rows, view, colors)
        ax_loss.set_title(f"{tps} tokens/step")
        if column == 0:
            ax_loss.set_ylabel("train loss (EMA)")
            ax_gap.set_ylabel("Δ loss vs FPA")
    fig.suptitle(f"{view.title}{f' — {title}' if title else ''}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_figures(rows: list[CellRow], out_dir: Path, title: str = "") -> list[Path]:
    return [write_figure(rows, view, out_dir / f"{view.stem}.png", title)
            for view in views_for([row.record for row in rows])]
