"""Per process of gpu-next-1203.sh spread: each attention's timed step, its kernels' device time per step, and the
kernels whose time per step moves most between processes (the largest max - min first).

    python docs/measurements/spread-table.py spread-*.json
"""
import json
import sys

runs = [json.load(open(path)) for path in sys.argv[1:]]
for attention in ("fpa", "sagebwd-token"):
    print(f"\n{attention}: | process | step ms | kernels ms per step | step - kernels ms (two streams overlap) |")
    per_kernel = {}
    for i, run in enumerate(runs, 1):
        for row in run["rows"]:
            if row["attention"] != attention or not row.get("profile"):
                continue
            kernels = row["profile"]["kernel_ms"]
            print(f"| {i} | {row['step_ms']:.2f} | {kernels:.2f} | {row['step_ms'] - kernels:.2f} |")
            for ms, _, name in row["profile"]["rows"]:
                per_kernel.setdefault(name, {})[i] = ms
    moved = sorted(((max(v.values()) - min(v.values()), name, v) for name, v in per_kernel.items()
                    if len(v) == len(runs)), reverse=True)[:8]
    print("| kernel | ms per step by process | max - min |")
    for spread, name, v in moved:
        print(f"| {name[:70]} | {', '.join(f'{v[i]:.3f}' for i in sorted(v))} | {spread:.3f} |")
