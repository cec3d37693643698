"""`python -m experiments.demo`: FPA vs SageBwd on the same tiny Llama, corpus and seed (CPU).

Trains experiments/configs/cpu-tiny.yaml twice (SageBwd runs as its exact PyTorch
simulation on the CPU), prints a comparison table, writes a loss-curve PNG and a
Markdown summary under --out, and logs both runs to MLflow.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from experiments.plot import plot_loss_curves
from experiments.summary import format_table, summarise
from launcher.config import RunConfig, load_run_config
from launcher.overrides import ConfigError
from launcher.train import RunResult, train

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "experiments" / "configs" / "cpu-tiny.yaml"
BASELINE = "FPA"
# Applied after the user's --set values: these two settings are what the demo compares.
VARIANTS = {
    "FPA": ["model.attention=fpa", "model.smoothing=none"],
    "SageBwd": ["model.attention=sagebwd", "model.smoothing=k"],
}
LAST_K = 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="base run config")
    parser.add_argument("--out", default=str(REPO_ROOT / "runs" / "demo"),
                        help="folder for loss_curves.png and summary.md")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override the base config, e.g. "
                        "--set train.steps=50 (repeatable)")
    return parser.parse_args(argv)


def build_variant_configs(path: str, overrides: list[str]) -> dict[str, RunConfig]:
    """Validate every run before training any, so a typo fails in seconds."""
    return {label: load_run_config(path, overrides + extra) for label, extra in VARIANTS.items()}


def report(results: dict[str, RunResult], configs: dict[str, RunConfig], out: Path,
           total_s: float) -> str:
    last_k = min([LAST_K] + [len(r.train_loss) for r in results.values()])
    table = format_table(summarise(results, baseline=BASELINE, last_k=last_k), last_k=last_k)
    base = configs[BASELINE]
    title = (f"{base.model.preset}: {base.model.num_layers} layers, width {base.model.hidden_size}, "
             f"seq {base.model.seq_len}, {base.tokens_per_step} tokens/step, seed {base.seed}")
    png = plot_loss_curves(results, BASELINE, out / "loss_curves.png", title=title)
    runs = "\n".join(f"- {label}: MLflow run `{r.run_id}` ({r.name})"
                     for label, r in results.items())
    uri = next(iter(results.values())).tracking_uri
    summary = (f"# FPA vs SageBwd demo\n\n{title}\n\n{table}\n\n"
               f"Loss curves: {png.name}. Total wall time {total_s:.0f} s.\n\n"
               f"MLflow store `{uri}`, experiment `{base.tracking.experiment}`:\n{runs}\n")
    (out / "summary.md").write_text(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
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

    summary = report(results, configs, out, total)
    uri = results[BASELINE].tracking_uri
    print("\n" + summary)
    print(f"Wrote {out / 'loss_curves.png'} and {out / 'summary.md'}")
    print(f"Browse the runs: mlflow ui --backend-store-uri {uri}")
    return 1 if any(r.diverged_at for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
