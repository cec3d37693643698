"""`python -m experiments.demo`: FPA vs SageBwd on the same tiny Llama, corpus and seed (CPU).

Trains experiments/configs/cpu-tiny.yaml twice (SageBwd runs as its exact PyTorch
simulation on the CPU), logs both runs to MLflow, then reads them back through MLflow
with `python -m experiments compare`'s code: the table, the loss-curve PNG and report.md
under --out, logged on a comparison run, with the MLflow UI link.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiments.compare.comparison import Comparison, compare_experiment
from experiments.compare.store import CompareError
from experiments.paths import CONFIGS_DIR, RUNS_DIR
from experiments.seeds import VARIANTS as SEED_VARIANTS
from launcher.config import RunConfig, load_run_config
from launcher.logs import configure_logging
from launcher.overrides import ConfigError
from launcher.train import RunResult, train

DEFAULT_CONFIG = CONFIGS_DIR / "cpu-tiny.yaml"
BASELINE = "FPA"
# Applied after the user's --set values: these two settings are what the demo compares.
VARIANTS = {"FPA": SEED_VARIANTS["fpa"], "SageBwd": SEED_VARIANTS["sagebwd-k"]}
LAST_K = 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="base run config")
    parser.add_argument("--out", default=str(RUNS_DIR / "demo"),
                        help="folder for the comparison: report.md and the loss-curve PNG")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override the base config, e.g. "
                        "--set train.steps=50 (repeatable)")
    return parser.parse_args(argv)


def build_variant_configs(path: str, overrides: list[str]) -> dict[str, RunConfig]:
    """Validate every run before training any, so a typo fails in seconds."""
    return {label: load_run_config(path, overrides + extra) for label, extra in VARIANTS.items()}


def compare_runs(results: dict[str, RunResult], configs: dict[str, RunConfig], out: Path) -> Comparison:
    """The demo's table and figures come from MLflow, as any grid's do."""
    uri = results[BASELINE].tracking_uri
    return compare_experiment(configs[BASELINE].tracking.experiment, tracking_uri=uri,
                              run_ids=[r.run_id for r in results.values()], out=out,
                              last_k=min([LAST_K] + [len(r.train_loss) for r in results.values()]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        configs = build_variant_configs(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    results: dict[str, RunResult] = {}
    for i, (label, config) in enumerate(configs.items(), start=1):
        print(f"\n=== run {i}/{len(configs)}: {label} ({config.train.steps} steps) ===", flush=True)
        results[label] = train(config)
    total = time.perf_counter() - started

    print(f"\n=== trained both runs in {total:.0f} s; comparing them from MLflow ===", flush=True)
    try:
        compare_runs(results, configs, out)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 1 if any(r.diverged_at for r in results.values()) else 0


if __name__ == "__main__":
    from launcher.distributed import exit_after_run   # the process group of the runs trained here
    exit_after_run(main())
