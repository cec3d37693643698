"""Loss-curve figure for a set of runs: curves on the left, gap to the baseline on the right."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI or servers
import matplotlib.pyplot as plt  # noqa: E402

from launcher.train import RunResult  # noqa: E402


def ema(values: list[float]) -> list[float]:
    """Exponential moving average over ~5% of the run, so per-step noise does not hide
    the trend (and short runs are barely smoothed)."""
    alpha = 2.0 / (max(1, len(values) // 20) + 1)
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def plot_loss_curves(results: dict[str, RunResult], baseline: str, path: Path,
                     title: str = "") -> Path:
    fig, (ax_loss, ax_gap) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    base = results[baseline]
    base_train = dict(zip([s for s, _ in base.train_loss], ema([l for _, l in base.train_loss])))
    base_eval = dict(base.eval_loss)
    for color, (label, r) in zip(colors, results.items()):
        steps = [s for s, _ in r.train_loss]
        raw = [l for _, l in r.train_loss]
        smooth = ema(raw)
        # The baseline is drawn wide and translucent so a matching run stays visible on it.
        width, alpha = (4.0, 0.45) if label == baseline else (1.6, 1.0)
        ax_loss.plot(steps, raw, color=color, alpha=0.15, linewidth=0.8)
        ax_loss.plot(steps, smooth, color=color, linewidth=width, alpha=alpha,
                     label=f"{label} train (EMA)")
        if r.eval_loss:
            ax_loss.plot(*zip(*r.eval_loss), "o--" if label == baseline else "s:", color=color,
                         markersize=7 if label == baseline else 4, alpha=alpha,
                         label=f"{label} eval")
        if label != baseline:
            gap_steps = [s for s in steps if s in base_train]
            ax_gap.plot(gap_steps, [sm - base_train[s] for s, sm in zip(steps, smooth)
                                    if s in base_train],
                        color=color, linewidth=1.8, label=f"{label} − {baseline}, train (EMA)")
            common = [(s, l - base_eval[s]) for s, l in r.eval_loss if s in base_eval]
            if common:
                ax_gap.plot(*zip(*common), "o--", color=color, markersize=4,
                            label=f"{label} − {baseline}, eval")
    ax_loss.set(xlabel="step", ylabel="cross-entropy loss", title="Loss")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_gap.axhline(0.0, color="black", linewidth=0.8)
    ax_gap.set(xlabel="step", ylabel="loss difference", title=f"Gap to {baseline}")
    ax_gap.legend()
    ax_gap.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
