"""`python -m experiments.seeds --seeds 11 [--config FILE] [--variants fpa sagebwd-k ...]
[--set KEY=VALUE ...] [--out DIR]`

A seed study: one recipe trained once per seed for each variant (launcher.train in this
process, one MLflow run each, tagged with the study's name), then each variant's final eval
loss against FPA's *on the same seed* (same init, same data order): the mean paired gap with
its standard error, next to the spread over seeds. Single-seed gaps between FPA and SageBwd at
small scale are mostly this noise; the study says how large it is.

The table is computed from the MLflow store (the runs' eval_loss histories), printed, and
written to DIR/seeds.md and DIR/seeds.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from experiments.compare.stats import summarise
from experiments.paths import CONFIGS_DIR, RUNS_DIR
from launcher.config import load_run_config
from launcher.logs import configure_logging
from launcher.overrides import ConfigError

DEFAULT_CONFIG = CONFIGS_DIR / "cpu-tiny.yaml"
BASELINE = "fpa"
VARIANTS = {
    "fpa": ["model.attention=fpa", "model.smoothing=none"],
    "sagebwd-k": ["model.attention=sagebwd", "model.smoothing=k"],
    "sagebwd-none": ["model.attention=sagebwd", "model.smoothing=none"],
    "sagebwd-qk": ["model.attention=sagebwd", "model.smoothing=qk"],
    "sagebwd-k-token": ["model.attention=sagebwd", "model.smoothing=k", "model.quant=token"],
}
STUDY_TAG = "seed_study"


def seed_list(base: int, count: int) -> list[int]:
    return [base + i for i in range(count)]


def paired_gaps(finals: dict[str, dict[int, float]], baseline: str = BASELINE) -> list[dict]:
    """Per variant: mean and sd of its final eval loss over seeds, and the mean paired gap to
    the baseline (variant - baseline on the same seed) with its standard error (sd / sqrt(n);
    None below two seeds). Only seeds that both finished count toward a gap. The arithmetic
    is experiments.compare.stats.summarise, shared with the comparison's over-seeds table."""
    base = finals[baseline]
    return [{"variant": variant,
             **asdict(summarise(dict(sorted(by_seed.items())),
                                None if variant == baseline else base))}
            for variant, by_seed in finals.items()]


def markdown(rows: list[dict], baseline: str = BASELINE) -> str:
    def fmt(value, spec=".4f"):
        return "—" if value is None else format(value, spec)

    lines = [f"| variant | seeds | mean final eval loss | sd over seeds | paired gap to {baseline} "
             "(mean ± s.e.) | gap / s.e. |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["variant"] == baseline:
            gap, ratio = "—", "—"
        else:
            gap = f"{fmt(r['gap'], '+.4f')} ± {fmt(r['gap_se'])}"
            ratio = fmt(r["gap"] / r["gap_se"], "+.1f") if r["gap_se"] else "—"
        lines.append(f"| {r['variant']} | {r['seeds']} | {fmt(r['mean'])} | {fmt(r['sd'])} | "
                     f"{gap} | {ratio} |")
    return "\n".join(lines)


def final_eval_losses(tracking_uri: str, run_ids: dict[tuple[str, int], str]) -> dict[str, dict[int, float]]:
    """{variant: {seed: last eval_loss}} read back from the store (runs without one are left out)."""
    from launcher.tracking import mlflow_client

    client = mlflow_client(tracking_uri)
    finals: dict[str, dict[int, float]] = {}
    for (variant, seed), run_id in run_ids.items():
        history = sorted(client.get_metric_history(run_id, "eval_loss"), key=lambda m: m.step)
        finals.setdefault(variant, {})
        if history:
            finals[variant][seed] = history[-1].value
    return finals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.seeds", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="the recipe (a run config)")
    parser.add_argument("--seeds", type=int, default=5,
                        help="how many seeds: the config's seed and the ones after it")
    parser.add_argument("--variants", nargs="+", default=["fpa", "sagebwd-k"], choices=list(VARIANTS),
                        help=f"variants to train; {BASELINE} is the baseline and always included")
    parser.add_argument("--name", help="the study's name (an MLflow tag; default: the experiment's)")
    parser.add_argument("--out", default=str(RUNS_DIR / "seeds"),
                        help="folder for seeds.md and seeds.json")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override the recipe, e.g. --set train.steps=200 (repeatable)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: train at least one seed (two for a standard error)")
    if BASELINE not in args.variants:
        args.variants = [BASELINE, *args.variants]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:   # every run's config is validated before any trains, so a typo fails in seconds
        base = load_run_config(args.config, args.overrides)
        seeds = seed_list(base.seed, args.seeds)
        configs = {(variant, seed): load_run_config(args.config, [*args.overrides, *VARIANTS[variant],
                                                                  f"seed={seed}",
                                                                  f"tracking.run_name={variant}-seed{seed}"])
                   for seed in seeds for variant in args.variants}
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from launcher.tracking import mlflow_client
    from launcher.train import train

    name = args.name or base.tracking.experiment
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_ids, uri, diverged, table, stopped = {}, None, [], "", False
    for i, ((variant, seed), config) in enumerate(configs.items(), start=1):
        print(f"\n=== run {i}/{len(configs)}: {variant}, seed {seed} ===", flush=True)
        result = train(config)
        uri = result.tracking_uri
        if not result.stopped_by:   # a stopped run's last eval loss is not a final one
            run_ids[(variant, seed)] = result.run_id
        mlflow_client(uri).set_tag(result.run_id, STUDY_TAG, name)
        if result.diverged_at:
            diverged.append(f"{variant} seed {seed} (step {result.diverged_at})")
        if result.stopped_by:   # SIGTERM/SIGUSR1: the run checkpointed and stopped; so does the study
            print(f"seed study stopped by {result.stopped_by} during {variant} seed {seed}; the table holds "
                  "the runs that finished", file=sys.stderr)
            stopped = True
        # Rewritten after every run, so a time limit still leaves the seeds that finished.
        rows = paired_gaps(final_eval_losses(uri, run_ids))
        table = markdown(rows)
        (out / "seeds.md").write_text(f"Seed study {name!r}: {args.config} with {args.overrides}, "
                                      f"seeds {seeds[0]}..{seeds[-1]}\n\n{table}\n")
        (out / "seeds.json").write_text(json.dumps({"name": name, "config": args.config,
                                                    "overrides": args.overrides, "seeds": seeds,
                                                    "rows": rows}, indent=1))
        if stopped:
            return 1
    print(f"\n=== seed study {name!r}: final eval loss over {len(seeds)} seeds "
          f"(from MLflow, {uri}) ===\n{table}", flush=True)
    if diverged:
        print("diverged (left out of the table): " + ", ".join(diverged), file=sys.stderr)
    return 1 if diverged else 0

if __name__ == "__main__":
    from launcher.distributed import exit_after_run   # the process group of the runs trained here
    exit_after_run(main())
