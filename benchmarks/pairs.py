"""Trainer throughput of one attention against another, in side-by-side pairs of processes: the ratio with its error.

    python -m benchmarks.pairs [--pairs 4] [--baseline fpa] [--candidate sagebwd-token] [--json FILE] -- ARGS...
    python -m benchmarks.pairs --combine FILE FILE ...

Each pair is one process of `python -m benchmarks.train_throughput ARGS --attention A B --out ...` in this
checkout, the baseline first in odd pairs and the candidate first in even ones. Why processes and not more steps
in one: a step's time moves between processes of the same code more than within one (the token contract's step
on one H100 took 54.7 ms in one process and 57.6-57.7 in two others, the FPA step 54.1-54.7; docs/benchmarks.md),
so one process is one sample and the spread over processes is the error. ARGS are the trainer benchmark's own,
without --attention and --out (for the issue's target: `--case experiments/configs/gpu-124m.yaml@4096x4 --loss
chunked --steps 20 --engine deepspeed --compile reduce-overhead`).

For every trainer row (config, seq x micro-batch, compile mode, loss, engine) it prints each pair's step times
and the candidate's tokens/s over the baseline's (= baseline step / candidate step), then their mean, standard
deviation, standard error and a 95% interval (Student's t over the pairs): the number to hold against a target
such as "token >= FPA's tokens/s". --combine runs nothing: it takes the pairs of earlier runs' --json files (the
same two attentions and trainer arguments, on other machines or days) and prints the same table over all of them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.ab import REPO, parse_before_dashes, run_benchmark, trainer_row_name
from benchmarks.train_throughput import ATTENTIONS

MODULE = "benchmarks.train_throughput"
# Student's t at 97.5% for 1..10 degrees of freedom (two-sided 95%); beyond, the normal's 1.96 (within 10%).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_975(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else 1.96


def summary(ratios: list[float]) -> dict:
    """Mean, standard deviation, standard error and 95% interval of per-pair ratios (two or more)."""
    mean, sd = statistics.fmean(ratios), statistics.stdev(ratios)
    se = sd / len(ratios) ** 0.5
    half = t_975(len(ratios) - 1) * se
    return {"mean": mean, "sd": sd, "se": se, "low": mean - half, "high": mean + half, "pairs": len(ratios)}


def pair_ratios(results: list[dict], baseline: str, candidate: str) -> dict[str, dict]:
    """{trainer row without its attention: {"baseline_ms": [...], "candidate_ms": [...], "ratios": [...], "first":
    [...]}} over the pairs' JSONs ("first": the attention each pair's process ran first, from its arguments); a row
    counts only where both attentions ran in every pair (failed rows are reported by name)."""
    per_pair = []
    for result in results:
        steps = {}
        for r in result.get("rows", []):
            if r.get("step_ms") and not r.get("error"):
                steps[(trainer_row_name(r, attention=False), r["attention"])] = r["step_ms"]
        per_pair.append(steps)
    names = sorted({name for steps in per_pair for name, _ in steps})
    out = {}
    for name in names:
        if all((name, a) in steps for steps in per_pair for a in (baseline, candidate)):
            base = [steps[(name, baseline)] for steps in per_pair]
            cand = [steps[(name, candidate)] for steps in per_pair]
            first = [(result.get("args") or {}).get("attention", [None])[0] for result in results]
            out[name] = {"baseline_ms": base, "candidate_ms": cand, "ratios": [b / c for b, c in zip(base, cand)],
                         "first": first}
        else:
            print(f"[pairs] {name}: not timed for both attentions in every pair, left out", flush=True)
    return out


def format_table(rows: dict[str, dict], baseline: str, candidate: str) -> str:
    lines = [f"| trainer row | pair | {baseline} step ms | {candidate} step ms | {candidate} / {baseline} tokens/s |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        for i, (b, c, ratio, first) in enumerate(zip(r["baseline_ms"], r["candidate_ms"], r["ratios"], r["first"]), 1):
            order = f"{first or (baseline if i % 2 else candidate)} first"
            lines.append(f"| {name} | {i} ({order}) | {b:.2f} | {c:.2f} | {ratio:.3f}x |")
        s = r["summary"]
        lines.append(f"| {name} | **mean of {s['pairs']}** | | | **{s['mean']:.3f}x ± {s['se']:.3f}** "
                     f"(sd {s['sd']:.3f}; 95% interval {s['low']:.3f} to {s['high']:.3f}) |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pairs", usage="%(prog)s [--pairs N] [--baseline A] "
                                "[--candidate B] [--json FILE] -- TRAIN_THROUGHPUT_ARGS...", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=4, help="processes, each timing both attentions (default 4)")
    p.add_argument("--baseline", choices=sorted(ATTENTIONS), default="fpa")
    p.add_argument("--candidate", choices=sorted(ATTENTIONS), default="sagebwd-token")
    p.add_argument("--json", help="write the pairs' step times, ratios and summaries here")
    p.add_argument("--combine", nargs="+", metavar="FILE",
                   help="summarise the pairs of these earlier --json files together instead of running any")
    p.add_argument("--module", help=argparse.SUPPRESS)   # the tests' stand-in for the trainer benchmark
    return p


def combined_runs(paths: list[str]) -> dict:
    """The pairs of earlier runs' --json files, in the files' order, as one run's record (baseline, candidate,
    benchmark_args, runs; a combined file combines again); they must name the same two attentions and the same
    trainer arguments, else the error says which file differs."""
    runs = []
    for path in paths:
        try:
            runs.append((path, json.loads(Path(path).read_text())))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: --combine {path}: not a readable benchmarks.pairs --json file ({e})")
    first_path, first = runs[0]
    key = ("baseline", "candidate", "benchmark_args")
    for path, run in runs:
        if not all(k in run for k in (*key, "runs")):
            raise SystemExit(f"error: --combine {path}: no {', '.join(key)} and runs: "
                             "not a benchmarks.pairs --json file")
        differs = [k for k in key if run[k] != first[k]]
        if differs:
            raise SystemExit(f"error: --combine {path}: its {', '.join(differs)} differ from {first_path}'s "
                             f"({', '.join(repr(run[k]) for k in differs)} against "
                             f"{', '.join(repr(first[k]) for k in differs)}): combine runs of one comparison only")
    return {**{k: first[k] for k in key}, "combined": paths, "runs": [pair for _, run in runs for pair in run["runs"]]}


def main(argv=None) -> int:
    parser = build_parser()
    args, bench_args = parse_before_dashes(parser, argv)
    if args.combine:
        if bench_args:
            parser.error("--combine runs nothing: give no trainer arguments after --")
        record = combined_runs(args.combine)
        rows = pair_ratios(record["runs"], record["baseline"], record["candidate"])
        return report(rows, record.pop("baseline"), record.pop("candidate"), args.json, record)
    if args.pairs < 2:
        parser.error(f"--pairs {args.pairs}: at least 2 (one pair has no spread to give an error)")
    if args.baseline == args.candidate:
        parser.error(f"--baseline and --candidate are both {args.baseline!r}: give two attentions")
    for flag in ("--attention", "--out"):
        if flag in bench_args:
            parser.error(f"{flag} after --: this tool sets each process's attentions and JSON itself")
    results = []
    with tempfile.TemporaryDirectory(prefix="sagebwd-pairs-") as tmp:
        work = Path(tmp)
        for i in range(1, args.pairs + 1):
            order = [args.baseline, args.candidate] if i % 2 else [args.candidate, args.baseline]
            print(f"[pairs] pair {i}/{args.pairs}: {' then '.join(order)}", flush=True)
            results.append(run_benchmark(REPO, [*bench_args, "--attention", *order], work / f"pair-{i}.json",
                                         args.module or MODULE, work / "triton-cache", "--out"))
    rows = pair_ratios(results, args.baseline, args.candidate)
    return report(rows, args.baseline, args.candidate, args.json,
                  {"pairs": args.pairs, "benchmark_args": bench_args, "environment": results[0].get("environment"),
                   "runs": results})


def report(rows: dict[str, dict], baseline: str, candidate: str, json_path: str | None, record: dict) -> int:
    """Each row's summary, the table printed, and (json_path) the rows written with `record`."""
    if not rows:
        print("error: no trainer row was timed for both attentions in every pair", file=sys.stderr)
        return 2
    if any(len(r["ratios"]) < 2 for r in rows.values()):
        print("error: a row has one pair only: no spread to give an error", file=sys.stderr)
        return 2
    for r in rows.values():
        r["summary"] = summary(r["ratios"])
    print(format_table(rows, baseline, candidate))
    if json_path:
        Path(json_path).write_text(json.dumps({"baseline": baseline, "candidate": candidate, **record, "rows": rows},
                                              indent=1))
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
