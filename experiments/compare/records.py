"""What the comparison reads about one grid cell: its axes, state and metric curves.

A RunRecord is plain data, filled from MLflow by experiments.compare.store (or built by
hand in tests), so the arithmetic in experiments.compare.table never touches MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from experiments.grid.table import human_count

# The trainer's tag and metric names (launcher.train.grid_tags and its step metrics).
# tests/test_compare_table.py checks these against the trainer, so a rename there fails
# a test instead of silently emptying this table.
TAG_ATTENTION = "attention"
TAG_QK_NORM = "qk_norm"
TAG_SMOOTHING = "smoothing"
TAG_QUANT = "quant"               # SageBwd's quantisation contract ("none" for FPA)
TAG_TOKENS_PER_STEP = "tokens_per_step"
TAG_TPS = "tps"                   # the manifest's TPS label ("2.1m"), once the trainer sets it
TAG_DIVERGED_AT = "diverged_at_step"
PARAM_TOTAL_STEPS = "train.steps"
PARAM_TOKENS_PER_STEP = "derived.tokens_per_step"
PARAM_SEED = "seed"               # the run config's seed
METRIC_LOSS = "loss"
METRIC_EVAL_LOSS = "eval_loss"
METRIC_TOKENS_PER_S = "tokens_per_s"
METRIC_MFU = "mfu"                # not logged yet: the MFU column then shows "—"

# A cell's state; MLflow's run statuses, plus PENDING for a planned cell with no run yet.
PENDING = "PENDING"
RUNNING = "RUNNING"
FINISHED = "FINISHED"

Curve = tuple[tuple[int, float], ...]   # (step, value), sorted by step, one value per step


@dataclass(frozen=True)
class CellAxes:
    """Where a cell sits in the grid. qk_norm and smoothing only matter for SageBwd."""

    attention: str                   # "fpa" | "sagebwd"
    qk_norm: bool | None
    smoothing: str | None            # "none" | "k" | "qk"
    tokens_per_step: int | None
    tps_label: str | None = None     # the manifest's label ("2.1m"); None: from tokens_per_step
    variant: str | None = None       # the manifest's free overrides axis
    quant: str | None = None         # SageBwd's quantisation contract: "block" | "token"
    seed_replica: bool = False       # the variant sets the seed and nothing else

    @property
    def without_seed(self) -> "CellAxes":
        """The cell its seeds are replicas of: a seed-only variant is dropped, any other kept."""
        return replace(self, variant=None, seed_replica=False) if self.seed_replica else self

    @property
    def cell_variant(self) -> str | None:
        """The variant, unless it only picks the seed."""
        return None if self.seed_replica else self.variant

    @property
    def sage_label(self) -> str:
        """'SageBwd', or 'SageBwd token' for a contract other than the paper's."""
        return "SageBwd" if self.quant in (None, "block", "none") else f"SageBwd {self.quant}"

    @property
    def tps(self) -> str:
        """The TPS as the paper writes it: '2.1M', '260K'."""
        if self.tps_label and not self.tps_label.isdigit():
            return self.tps_label.upper()
        tokens = self.tokens_per_step or (int(self.tps_label) if self.tps_label else None)
        return human_count(tokens) if tokens else "?"


@dataclass(frozen=True)
class RunRecord:
    """One grid cell: its newest MLflow run, or a planned cell with none yet (run_id None)."""

    name: str
    axes: CellAxes
    status: str                      # MLflow status or PENDING
    run_id: str | None = None
    total_steps: int | None = None
    loss: Curve = ()
    eval_loss: Curve = ()
    tokens_per_s: Curve = ()
    mfu: Curve = ()
    diverged_at: int | None = None   # the trainer's tag, when it stopped on a non-finite loss
    seed: int | None = None          # the run's `seed` param; for a pending cell, the plan's
    notes: tuple[str, ...] = field(default=())
