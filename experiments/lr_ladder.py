"""`python -m experiments.lr_ladder [--manifest paper-small-lr] [--node h100-1] [--write]`

Picks the learning rate of a scaled-down grid from its LR ladder (a manifest whose runs differ
only in optimizer.lr), read back from MLflow: the largest LR whose run

  (a) finished, with no divergence and no loss spike: after warmup, the train loss never rises
      more than SPIKE_NATS above its running minimum; and
  (b) ends within FINAL_TOLERANCE_NATS of the ladder's best final eval loss.

Issue 25 asks for the largest LR at which FPA trains stably at the large TPS, so that SageBwd is
compared where the paper saw its gap; (b) keeps "stable but clearly worse" LRs out. The ladder's
table is printed; `--write` puts the LR into the grid's base config (optimizer.lr). If the
largest LR of the ladder is picked, the ladder did not find the edge: exit 3, so a script does
not go on with it (extend the ladder upward and run it again). If the smallest is picked, a
note says the ladder does not bracket the best LR from below.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SPIKE_NATS = 0.5
FINAL_TOLERANCE_NATS = 0.02
LADDER_TOPPED_OUT = 3


@dataclass(frozen=True)
class Rung:
    lr: float
    name: str
    status: str
    final_eval: float | None
    best_eval: float | None
    diverged_at: int | None
    spike_at: int | None      # first step after warmup whose loss exceeds the running min + SPIKE_NATS

    @property
    def stable(self) -> bool:
        return (self.status == "FINISHED" and self.final_eval is not None
                and self.diverged_at is None and self.spike_at is None)


def first_spike(loss: tuple[tuple[int, float], ...], warmup_steps: int,
                nats: float = SPIKE_NATS) -> int | None:
    """The first step after warmup whose train loss is more than `nats` above the lowest loss
    logged before it (non-finite counts as a spike)."""
    lowest = float("inf")
    for step, value in loss:
        if step > warmup_steps and not (value <= lowest + nats):
            return step
        lowest = min(lowest, value)
    return None


def pick(rungs: list[Rung], tolerance: float = FINAL_TOLERANCE_NATS) -> Rung | None:
    """The largest stable LR within `tolerance` of the best final eval loss of the stable ones."""
    stable = [r for r in rungs if r.stable]
    if not stable:
        return None
    best = min(r.final_eval for r in stable)
    return max((r for r in stable if r.final_eval <= best + tolerance), key=lambda r: r.lr)


def write_lr(config_path: Path, lr: float, note: str) -> None:
    """Replace optimizer.lr (and the comment block just above it) in a base config."""
    text = config_path.read_text()
    pattern = re.compile(r"(optimizer:\n)((?:  #.*\n)*)(  lr: )[^\n]*\n")
    if not pattern.search(text):
        raise SystemExit(f"error: {config_path} has no `optimizer:` block with an `lr:` line to "
                         "replace; set optimizer.lr there by hand")
    comment = "".join(f"  # {line}\n" for line in note.splitlines())
    config_path.write_text(pattern.sub(lambda m: f"{m[1]}{comment}{m[3]}{lr:g}\n", text, count=1))


def read_ladder(manifest: str, node: str | None, tracking_uri: str | None) -> tuple[list[Rung], object]:
    from experiments.compare.store import connect, select_grid
    from experiments.grid.plan import plan_manifest
    from experiments.grid.tracking import resolve_tracking_uri
    from launcher.config import load_run_config

    plan = plan_manifest(manifest, node=node, check_paths=False)
    uri = resolve_tracking_uri(tracking_uri)
    records = {r.name: r for r in select_grid(connect(uri), uri, plan).records}
    rungs = []
    for spec in plan.runs:
        config = load_run_config(spec.base_config, list(spec.overrides))
        record = records[spec.name]
        evals = [v for _, v in record.eval_loss]
        rungs.append(Rung(lr=config.optimizer.lr, name=spec.name, status=record.status,
                          final_eval=evals[-1] if evals else None,
                          best_eval=min(evals) if evals else None,
                          diverged_at=record.diverged_at,
                          spike_at=first_spike(record.loss, config.schedule.warmup_steps)))
    return sorted(rungs, key=lambda r: r.lr), plan


def table(rungs: list[Rung], chosen: Rung | None) -> str:
    def num(v):
        return "—" if v is None else f"{v:.4f}"

    lines = ["| peak LR | run | status | final eval loss | best eval loss | diverged at | "
             f"spike (> {SPIKE_NATS} over running min) at | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rungs:
        lines.append(f"| {r.lr:g} | {r.name} | {r.status} | {num(r.final_eval)} | "
                     f"{num(r.best_eval)} | {r.diverged_at or '—'} | {r.spike_at or '—'} | "
                     f"{'**yes**' if r is chosen else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.lr_ladder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", default="paper-small-lr", help="the ladder's manifest")
    parser.add_argument("--node", help="the node profile it ran on (default: the manifest's)")
    parser.add_argument("--tracking-uri", help="MLflow store (default: as the trainer's)")
    parser.add_argument("--write", action="store_true",
                        help="write the chosen LR into the ladder's base config (optimizer.lr)")
    args = parser.parse_args(argv)
    from experiments.compare.store import CompareError
    from experiments.grid.errors import ManifestError

    try:
        rungs, plan = read_ladder(args.manifest, args.node, args.tracking_uri)
    except (ManifestError, CompareError) as err:   # no such manifest, no store, no runs of it yet
        print(f"error: {err}", file=sys.stderr)
        return 2
    chosen = pick(rungs)
    print(table(rungs, chosen))
    if chosen is None:
        print("error: no rung of the ladder trained stably to the end; lower the ladder",
              file=sys.stderr)
        return 2
    print(f"chosen: peak LR {chosen.lr:g} ({chosen.name})")
    if chosen.lr == min(r.lr for r in rungs):
        # Not an error: the rule is met. But the best LR may lie below the ladder.
        print("note: the ladder's smallest LR has the best final loss, so the ladder does not "
              "bracket the best LR from below; extend it downward to find it", file=sys.stderr)
    if chosen.lr == max(r.lr for r in rungs):
        print("error: the ladder's largest LR is still stable and within tolerance: extend the "
              "ladder upward and run it again", file=sys.stderr)
        return LADDER_TOPPED_OUT
    if args.write:
        config = Path(plan.manifest.base_config)
        write_lr(config, chosen.lr,
                 f"Chosen by `python -m experiments.lr_ladder` from {args.manifest}.yaml's ladder:\n"
                 f"the largest stable LR within {FINAL_TOLERANCE_NATS} nats of its best final "
                 "eval loss (docs/results.md).")
        print(f"wrote optimizer.lr = {chosen.lr:g} into {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
