"""Loss-curve PNGs in the layout of the paper's figures: one column per TPS, the train loss
on top and its difference to the matching FPA cell below.

A cell run over several seeds (a manifest variant that only sets the seed, or runs that
differ only in their logged seed) is drawn once: the mean over its seeds with a min..max
band, and below it the mean of each seed's gap to FPA on the same seed.

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
    """A seed-only variant is left out: the seeds of one cell share a label (and a curve)."""
    return f"{label} [{r.axes.cell_variant}]" if r.axes.cell_variant else label


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


def _seeds_suffix(rows: list[CellRow]) -> str:
    """'(mean of 2 seeds, 1 running; seed 2 diverged at step 140)' for a cell's seeds."""
    drawn = [row for row in rows if row.record.loss and row.diverged_at is None]
    states: dict[str, int] = {}
    for row in rows:
        if row.diverged_at is None and row.record.status != FINISHED:
            state = row.record.status.lower()
            states[state] = states.get(state, 0) + 1
    parts = [f"mean of {len(drawn)} seed{'s' if len(drawn) != 1 else ''}"
             + "".join(f", {n} {state}" for state, n in states.items())]
    parts += [f"seed {row.record.seed if row.record.seed is not None else '?'} diverged at "
              f"step {row.diverged_at:,}" for row in rows if row.diverged_at is not None]
    return f" ({'; '.join(parts)})"


def _band(curves: list[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max over curves at the steps all of them have, finite."""
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    steps = [s for s in steps if all(math.isfinite(c[s]) for c in curves)]
    values = [[c[s] for c in curves] for s in steps]
    return (steps, [sum(v) / len(v) for v in values], [min(v) for v in values],
            [max(v) for v in values])


class _Panel:
    """What one TPS column collects while its curves are drawn, for its axis limits."""

    def __init__(self, ax_loss, ax_gap, window: float, raw: bool):
        self.ax_loss, self.ax_gap, self.window = ax_loss, ax_gap, window
        self.raw = raw   # draw each run's raw loss faintly behind its EMA
        self.loss_range: list[float] = []
        self.gap_range: list[float] = []
        self.crosses: list[tuple[float, float, str]] = []

    def cross(self, row: CellRow, smooth: dict[int, float], color: str) -> None:
        """Mark where a diverged run left the finite range."""
        steps = [s for s, _ in row.record.loss]
        if row.diverged_at is not None and any(math.isfinite(v) for v in smooth.values()):
            last = max(s for s in steps if s < row.diverged_at or s == steps[0])
            self.crosses.append((_x_of(row)(last), smooth[last], color))

    def loss(self, finite: list[float]) -> None:
        # From 10% in: the first steps' loss (~ln vocab) would squash the part worth reading.
        self.loss_range += [finite[len(finite) // 10], min(finite)] if finite else []

    def gaps(self, row: CellRow) -> dict[int, float]:
        """The EMA gap to the row's matching FPA cell, at the steps both have."""
        if row.baseline is None or not row.baseline.loss:
            return {}
        smooth, base = _smoothed(row.record, self.window), _smoothed(row.baseline, self.window)
        return {s: smooth[s] - base[s] for s in smooth
                if s in base and math.isfinite(smooth[s] - base[s])}

    def run(self, row: CellRow, label: str, color: str) -> None:
        """One run: its EMA (the raw loss faint behind it), and its gap to FPA."""
        if not row.record.loss:
            self.ax_loss.plot([], [], linestyle=":", color=color, label=label + _state_suffix(row))
            return
        to_x = _x_of(row)
        steps = [s for s, _ in row.record.loss]
        smooth = _smoothed(row.record, self.window)
        xs = [to_x(s) for s in steps]
        if self.raw:
            self.ax_loss.plot(*thin(xs, [v for _, v in row.record.loss]), color=color,
                              alpha=0.15, linewidth=0.8)
        self.ax_loss.plot(*thin(xs, [smooth[s] for s in steps]), color=color, linewidth=1.8,
                          label=label + _state_suffix(row))
        self.loss([smooth[s] for s in steps if math.isfinite(smooth[s])])
        self.cross(row, smooth, color)
        gaps = self.gaps(row)
        if gaps:
            self.ax_gap.plot(*thin([to_x(s) for s in gaps], list(gaps.values())), color=color,
                             linewidth=1.5)
            if row.diverged_at is None:   # a blow-up would flatten every other gap to zero
                values = list(gaps.values())
                self.gap_range += values[len(values) // 20:]

    def seeds(self, rows: list[CellRow], label: str, color: str) -> None:
        """A cell's seeds: the mean of their EMAs with a min..max band; the gap below is the
        mean over seeds of each seed's gap to FPA on the same seed. A diverged seed is left
        out of the mean and drawn alone, dashed, with its x."""
        drawn = [row for row in rows if row.record.loss and row.diverged_at is None]
        to_x = _x_of(rows[0])
        steps, mean, low, high = _band([_smoothed(row.record, self.window) for row in drawn])
        xs = [to_x(s) for s in steps]
        label += _seeds_suffix(rows)
        if steps:
            self.ax_loss.fill_between(*thin(xs, low), thin(xs, high)[1], color=color, alpha=0.2,
                                      linewidth=0)
            self.ax_loss.plot(*thin(xs, mean), color=color, linewidth=1.8, label=label)
            self.loss(mean)
            label = None
        for row in rows:
            if row.record.loss and row.diverged_at is not None:
                smooth = _smoothed(row.record, self.window)
                self.ax_loss.plot(*thin([to_x(s) for s, _ in row.record.loss], list(smooth.values())),
                                  color=color, linewidth=1.0, linestyle="--", label=label)
                self.cross(row, smooth, color)
                label = None
        if label is not None:   # nothing logged yet
            self.ax_loss.plot([], [], linestyle=":", color=color, label=label)
        gap_steps, gap_mean, gap_low, gap_high = _band([g for g in map(self.gaps, drawn) if g])
        if gap_steps:
            gap_xs = [to_x(s) for s in gap_steps]
            self.ax_gap.fill_between(*thin(gap_xs, gap_low), thin(gap_xs, gap_high)[1],
                                     color=color, alpha=0.2, linewidth=0)
            self.ax_gap.plot(*thin(gap_xs, gap_mean), color=color, linewidth=1.5)
            self.gap_range += gap_low[len(gap_low) // 20:] + gap_high[len(gap_high) // 20:]


def _draw_panel(ax_loss, ax_gap, rows: list[CellRow], view: FigureView,
                colors: dict[str, str]) -> None:
    last_steps = [row.record.loss[-1][0] for row in rows if row.record.loss]
    cells: dict[str, list[CellRow]] = {}   # a cell's seeds share its label
    for row in rows:
        cells.setdefault(view.label(row.record), []).append(row)
    # Raw losses only without seed means: beside a band, one run's noise would hide it.
    panel = _Panel(ax_loss, ax_gap, max(1.0, EMA_WINDOW * max(last_steps, default=1)),
                   raw=all(len(members) == 1 for members in cells.values()))
    for label, members in cells.items():
        if len(members) == 1:
            panel.run(members[0], label, colors[label])
        else:
            panel.seeds(members, label, colors[label])
    if limits := _robust_limits(panel.loss_range, pad=0.05):
        ax_loss.set_ylim(*limits)
    top = ax_loss.get_ylim()[1]
    for x, y, color in panel.crosses:   # a run that blew up off the panel is marked at its edge
        ax_loss.plot(x, min(y, top), "x", color=color, markersize=10, markeredgewidth=2.5,
                     clip_on=False)
    if limits := _robust_limits(panel.gap_range + [0.0]):
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
