"""Per process of gpu-next-1203.sh spread: each attention's timed step, its kernels' device time per step, and the
kernels whose time per step moves most between processes (the largest max - min first); where the profile has a
device timeline (launcher.profile_step.device_timeline, since 2026-11-29 f), its busy, overlap and idle time per
step and the largest idle gaps of each process.

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
    for i, run in enumerate(runs, 1):
        for row in run["rows"]:
            t = (row.get("profile") or {}).get("timeline")
            if row["attention"] == attention and t:
                print(f"process {i} timeline ms per step: span {t['span_ms']:.2f}, busy {t['busy_ms']:.2f}, "
                      f"overlap {t['overlap_ms']:.2f}, idle {t['idle_ms']:.2f}; largest gaps: "
                      + "; ".join(f"{ms:.3f} ({n:g}x) {between}" for ms, n, between in t["gaps"][:6]))
    moved = sorted(((max(v.values()) - min(v.values()), name, v) for name, v in per_kernel.items()
                    if len(v) == len(runs)), reverse=True)[:8]
    print("| kernel | ms per step by process | max - min |")
    for spread, name, v in moved:
        print(f"| {name[:70]} | {', '.join(f'{v[i]:.3f}' for i in sorted(v))} | {spread:.3f} |")

# Each process's token / FPA tokens/s (FPA's step over token's), by which attention it timed first: a process's
# second row runs slower, so the two orders bracket the ratio and their mean (over equal numbers of each) cancels it.
ratios = {"fpa": [], "sagebwd-token": []}
for run in runs:
    steps = {row["attention"]: row["step_ms"] for row in run["rows"]}
    ratios[run["rows"][0]["attention"]].append(steps["fpa"] / steps["sagebwd-token"])
every = ratios["fpa"] + ratios["sagebwd-token"]
for first, values in ratios.items():
    print(f"{first} first: token / FPA {', '.join(f'{r:.4f}' for r in values)}")
mean = sum(every) / len(every)
sd = (sum((r - mean) ** 2 for r in every) / (len(every) - 1)) ** 0.5 if len(every) > 1 else 0.0
print(f"all {len(every)}: mean {mean:.4f}, sd {sd:.4f}, se {sd / len(every) ** 0.5:.4f}")
