"""Compare finished runs against an FPA baseline: the numbers the demo's table shows."""
from __future__ import annotations

from dataclasses import dataclass

from launcher.train import RunResult


@dataclass(frozen=True)
class RunSummary:
    label: str
    final_train_loss: float          # mean of the last k steps: one step is too noisy
    best_eval_loss: float
    final_eval_loss: float
    gap_to_baseline: float | None    # final eval loss minus the baseline's (None for it)
    tokens_per_s: float
    wall_s: float


def mean_of_last(points: list[tuple[int, float]], k: int) -> float:
    tail = [loss for _, loss in points[-k:]]
    return sum(tail) / len(tail) if tail else float("nan")


def summarise(results: dict[str, RunResult], baseline: str, last_k: int = 20) -> list[RunSummary]:
    if baseline not in results:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {sorted(results)}")
    base_final = results[baseline].eval_loss[-1][1] if results[baseline].eval_loss else None
    rows = []
    for label, r in results.items():
        evals = [loss for _, loss in r.eval_loss]
        final_eval = evals[-1] if evals else float("nan")
        gap = None if label == baseline or base_final is None else final_eval - base_final
        rows.append(RunSummary(label=label, final_train_loss=mean_of_last(r.train_loss, last_k),
                               best_eval_loss=min(evals) if evals else float("nan"),
                               final_eval_loss=final_eval, gap_to_baseline=gap,
                               tokens_per_s=r.tokens_per_s, wall_s=r.wall_s))
    return rows


def format_table(rows: list[RunSummary], last_k: int) -> str:
    """A Markdown table (prints readably in a terminal too)."""
    header = ("| run | train loss (mean last %d) | best eval loss | final eval loss | "
              "final eval gap to FPA | tokens/s | wall s |" % last_k)
    lines = [header, "|" + "---|" * 7]
    for r in rows:
        gap = "—" if r.gap_to_baseline is None else f"{r.gap_to_baseline:+.4f}"
        lines.append(f"| {r.label} | {r.final_train_loss:.4f} | {r.best_eval_loss:.4f} | "
                     f"{r.final_eval_loss:.4f} | {gap} | {r.tokens_per_s:,.0f} | {r.wall_s:.0f} |")
    return "\n".join(lines)
