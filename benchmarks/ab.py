"""A/B of two source trees on one GPU: a benchmark run alternately in each, one table.

    python -m benchmarks.ab BASE [--head HEAD] [--rounds 2] [--benchmark attention|train_throughput]
                            [--json FILE] -- ARGS...

BASE and HEAD are git revisions or directories holding a source tree (HEAD: this checkout, with
its uncommitted changes). A revision is extracted with `git archive` into a temporary folder; on a
machine without the repository's history (the lent GPU) extract it beforehand (`git archive REV |
tar -x -C DIR`) and pass DIR. Each round runs `python -m benchmarks.attention ARGS --json ...` (or
`benchmarks.train_throughput ARGS --out ...`: `--benchmark train_throughput`) in each tree (on its own PYTHONPATH, with its own Triton cache), BASE first in odd rounds and HEAD first in
even ones, so that both see the same machine, clocks and neighbours and neither always runs second. ARGS are the
benchmark's own (`--no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64`, or the
fwd+bwd table's `--quant token --baselines CUDNN`; for the trainer `--case
experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --engine deepspeed --attention sagebwd-token
--compile default`).

The table has one row per measured quantity: each kernel's milliseconds (`--kernel-times`), each
timed column's fwd/bwd/fwd+bwd milliseconds (the benchmark table) or each trainer row's step
milliseconds, BASE's and HEAD's per round, and HEAD's change against BASE (means over the rounds).
Compare only within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# --benchmark: its module and the flag it takes for its JSON
BENCHMARKS = {"attention": ("benchmarks.attention", "--json"),
              "train_throughput": ("benchmarks.train_throughput", "--out")}


def source_tree(spec: str, workdir: Path, label: str) -> Path:
    """A directory holding `spec`'s sources: spec itself if it is one, else `git archive spec`."""
    if Path(spec).is_dir():
        return Path(spec).resolve()
    out = workdir / label
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", spec], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"error: {spec!r} is neither a directory nor a git revision of {REPO}: "
                         f"{archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def run_benchmark(tree: Path, args: list[str], out_json: Path, module: str, cache: Path,
                  json_flag: str = "--json") -> dict:
    """`python -m module ARGS --json out_json` (json_flag) with cwd and PYTHONPATH at `tree`: its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "TRITON_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", module, *args, json_flag, str(out_json)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0 or not out_json.is_file():
        raise SystemExit(f"error: the benchmark failed in {tree} (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return json.loads(out_json.read_text())


def trainer_row_name(row: dict, attention: bool = True) -> str:
    """A benchmarks.train_throughput row's name: config, seq x micro-batch, (attention,) compile mode, loss, engine."""
    who = f" {row['attention']}" if attention else ""
    return (f"{Path(row['config']).stem} {row['seq_len']}x{row['micro_batch']}{who} compile={row['compile']} "
            f"loss={row['loss']} engine={row['engine']}")


def measurements(result: dict) -> dict[str, float]:
    """{row name: ms} of one benchmark JSON: every kernel of --kernel-times and their sum, every timed column of
    the fwd/bwd/fwd+bwd table, every trainer row's step (benchmarks.train_throughput; rows that failed
    are left out)."""
    out = {}
    for r in result.get("rows", []):
        if r.get("step_ms") and not r.get("error"):
            out[f"{trainer_row_name(r)} step"] = r["step_ms"]
    for r in result.get("kernel_times", []):
        where = f"{r['impl']} {tuple(r['shape'])} {'causal' if r['causal'] else 'full'}"
        for kernel, ms in r["ms"].items():
            out[f"{where} {kernel}"] = ms
        out[f"{where} all kernels"] = sum(r["ms"].values())   # comparable where a change renames or merges kernels
    for r in result.get("bench", []):
        where = f"{tuple(r['shape'])} {'causal' if r['causal'] else 'full'} {r['mode']}"
        for impl, cell in r.items():
            if isinstance(cell, dict) and cell.get("ms"):
                out[f"{impl} {where}"] = cell["ms"]
    return out


def compare(base_runs: list[dict[str, float]], head_runs: list[dict[str, float]]) -> list[dict]:
    """Rows present in every run of both trees: the times per round, and HEAD's change of the mean."""
    names = [n for n in base_runs[0] if all(n in r for r in base_runs + head_runs)]
    dropped = sorted({n for r in base_runs + head_runs for n in r} - set(names))
    if dropped:   # a kernel renamed, added or removed by the change, or a run that timed less
        print("[ab] not in every run, left out: " + "; ".join(dropped), flush=True)
    rows = []
    for name in names:
        base = [r[name] for r in base_runs]
        head = [r[name] for r in head_runs]
        rows.append({"name": name, "base": base, "head": head,
                     "change": sum(head) / len(head) / (sum(base) / len(base)) - 1.0})
    return rows


def format_table(rows: list[dict], base_label: str, head_label: str) -> str:
    lines = [f"| measurement (ms) | {base_label} | {head_label} | change |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {', '.join(f'{v:.3f}' for v in r['base'])} | "
                     f"{', '.join(f'{v:.3f}' for v in r['head'])} | {100 * r['change']:+.1f}% |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", usage="%(prog)s BASE [--head HEAD] [--rounds N] "
                                "[--json FILE] -- BENCHMARK_ARGS...", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="a git revision or a directory with the sources to compare against")
    p.add_argument("--head", help="a git revision or a directory (default: this checkout as it is)")
    p.add_argument("--rounds", type=int, default=2, help="how many times each tree runs, alternating")
    p.add_argument("--benchmark", choices=sorted(BENCHMARKS), default="attention",
                   help="benchmarks.attention (default) or benchmarks.train_throughput")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--module", help=argparse.SUPPRESS)   # the tests' stand-in for the benchmark's module
    return p


def parse_before_dashes(parser: argparse.ArgumentParser, argv=None) -> tuple[argparse.Namespace, list[str]]:
    """The tool's options (before `--`) parsed, and the benchmark's arguments (after it) as given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def main(argv=None) -> int:
    parser = build_parser()
    args, bench_args = parse_before_dashes(parser, argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    module, json_flag = BENCHMARKS[args.benchmark]
    if json_flag in bench_args:
        parser.error(f"{json_flag} after --: this tool writes each run's JSON itself; give --json before --")
    with tempfile.TemporaryDirectory(prefix="sagebwd-ab-") as tmp:
        work = Path(tmp)
        trees = {"base": source_tree(args.base, work, "base"),
                 "head": source_tree(args.head, work, "head") if args.head else REPO}
        runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for i in range(1, args.rounds + 1):
            for label, tree in (trees.items() if i % 2 else reversed(trees.items())):
                print(f"[ab] round {i}/{args.rounds}: {label} ({tree})", flush=True)
                result = run_benchmark(tree, bench_args, work / f"{label}-{i}.json", args.module or module,
                                       work / f"triton-cache-{label}", json_flag)
                runs[label].append(measurements(result))
    rows = compare(runs["base"], runs["head"])
    if not rows:
        print("error: the runs share no measurement (benchmarks.attention: pass --kernel-times, or leave out "
              "--no-bench; benchmarks.train_throughput: every row failed)", file=sys.stderr)
        return 2
    base_label, head_label = f"base {args.base}", f"head {args.head or 'this checkout'}"
    print(format_table(rows, base_label, head_label))
    if args.json:
        Path(args.json).write_text(json.dumps({"base": args.base, "head": args.head or "checkout",
                                               "benchmark": args.benchmark,
                                               "benchmark_args": bench_args, "rounds": args.rounds,
                                               "runs": runs, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
