"""`python -m launcher.bench_parallel --config FILE --out DIR [--nproc 2] [--layout dp2xsp2 ...]
[--compile off|on|both] [--set k=v ...]`

FPA vs SageBwd throughput on this machine's GPUs, for each layout (default: DP=nproc and
SP=nproc): real training runs of launcher.train started with torchrun, logged to one MLflow
store (DIR/mlflow.db), then a Markdown table (DIR/results.md) read back from that store.
The table is rewritten after every run, so a time limit still leaves the finished rows.
`--compile both` runs every layout and backend eagerly and under torch.compile
(`train.compile=true`, runs named `...-compiled`).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

WARMUP_STEPS_SKIPPED = 10   # first steps include compilation and allocator growth
RUN_TIMEOUT_S = 600


def layouts(nproc: int, names: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """Layout names as dpN, spN or dpAxspB; the DP size is what the world size leaves."""
    names = names or [f"dp{nproc}", f"sp{nproc}"]
    result = []
    for name in names:
        match = re.fullmatch(r"(?:dp(\d+))?x?(?:sp(\d+))?", name)
        dp, sp = (int(v) if v else None for v in match.groups()) if match else (None, None)
        if dp is None and sp is None:
            raise ValueError(f"layout {name!r}: write it as dpN, spN or dpAxspB (e.g. dp2xsp2)")
        dp, sp = dp or nproc // (sp or 1), sp or 1
        if dp * sp != nproc:
            raise ValueError(f"layout {name!r} needs {dp * sp} GPUs (DP {dp} x SP {sp}), but "
                             f"--nproc is {nproc}; pick DP x SP = {nproc}")
        result.append((name, [f"parallel.sp={sp}"]))
    return result


def backends() -> list[tuple[str, list[str]]]:
    return [("fpa", ["model.attention=fpa", "model.smoothing=none"]),
            ("sagebwd", ["model.attention=sagebwd", "model.smoothing=k"])]


COMPILE_CHOICES = {"off": [False], "on": [True], "both": [False, True]}


def compile_variants(choice: str) -> list[tuple[str, list[str]]]:
    """(run-name suffix, overrides) for each compile setting asked for."""
    return [("-compiled" if on else "", [f"train.compile={str(on).lower()}"])
            for on in COMPILE_CHOICES[choice]]


def run_one(name: str, args: argparse.Namespace, sets: list[str], log) -> int:
    uri = f"sqlite:///{Path(args.out).resolve() / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", "-m", "launcher.train", "--config", args.config]
    for item in [*args.overrides, *sets, f"tracking.run_name={name}",
                 f"tracking.tracking_uri={uri}"]:
        cmd += ["--set", item]
    log.write(f"\n=== {name}: {' '.join(cmd)}\n")
    log.flush()
    try:
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.run_timeout).returncode
    except subprocess.TimeoutExpired:
        log.write(f"=== {name}: timed out after {args.run_timeout}s\n")
        return 124


def table(store: Path, experiment: str) -> str:
    from launcher.tracking import mlflow_client

    client = mlflow_client(f"sqlite:///{store}")
    exp = client.get_experiment_by_name(experiment)
    rows = ["| run | layout | status | steps | tokens/s (all GPUs) | tokens/s per GPU | MFU | "
            "peak mem GiB | final loss | eval loss |", "|---" * 10 + "|"]
    if exp is None:
        return "\n".join(rows)
    for run in sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time):
        def series(key: str) -> list[float]:
            return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key),
                                            key=lambda m: m.step)]

        def median(key: str) -> float | None:
            values = series(key)[WARMUP_STEPS_SKIPPED:]
            return statistics.median(values) if values else None

        p = run.data.params
        layout = (f"DP {p.get('derived.dp')} x SP {p.get('derived.sp')}, micro "
                  f"{p.get('derived.micro_batch')}, seq {p.get('model.seq_len')}, ZeRO "
                  f"{p.get('parallel.zero_stage')}"
                  + (", compiled" if p.get("train.compile") == "True" else ""))
        loss, evals, mem = series("loss"), series("eval_loss"), series("memory_gib")
        mfu = median("mfu")
        fmt = lambda v, f: "—" if v is None else format(v, f)  # noqa: E731
        rows.append(
            f"| {run.info.run_name} | {layout} | {run.info.status} | {len(loss)} | "
            f"{fmt(median('tokens_per_s'), ',.0f')} | {fmt(median('tokens_per_s_per_gpu'), ',.0f')} | "
            f"{'—' if mfu is None else f'{100 * mfu:.1f}%'} | {fmt(max(mem) if mem else None, '.1f')} | "
            f"{fmt(loss[-1] if loss else None, '.3f')} | {fmt(evals[-1] if evals else None, '.3f')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.bench_parallel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, help="folder for mlflow.db, results.md, bench.log")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--layout", dest="layouts", action="append", default=None,
                        help="dpN, spN or dpAxspB, repeatable (default: dpNPROC and spNPROC)")
    parser.add_argument("--compile", choices=sorted(COMPILE_CHOICES), default="off",
                        help="train.compile for every run: off, on, or both (each run twice)")
    parser.add_argument("--run-timeout", type=int, default=RUN_TIMEOUT_S)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        plan = layouts(args.nproc, args.layouts)
    except ValueError as error:
        parser.error(str(error))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from launcher.config import load_run_config

    experiment = load_run_config(args.config, args.overrides).tracking.experiment
    failures = 0
    with open(out / "bench.log", "a") as log:
        for layout, layout_sets in plan:
            for suffix, compile_sets in compile_variants(args.compile):
                for backend, backend_sets in backends():
                    name = f"{backend}-{layout}{suffix}"
                    code = run_one(name, args, [*layout_sets, *backend_sets, *compile_sets], log)
                    failures += code != 0
                    text = table(out / "mlflow.db", experiment)
                    (out / "results.md").write_text(text + "\n")
                    print(f"{name}: exit {code}\n{text}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
