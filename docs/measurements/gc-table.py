"""Python's collections in the trainer pairs of gpu-next-1204.sh (gc0: Python's automatic collection, gc50:
train.gc_every 50): per pairs file, each process's step and collection pauses per attention, then the pairs' ratio.

    python docs/measurements/gc-table.py trainer-pairs-gc0.json trainer-pairs-gc50.json
"""
import json
import sys

for path in sys.argv[1:]:
    record = json.load(open(path))
    print(f"\n{path}: | pair | attention | step ms | gc ms a step | collections (gen 0, 1, 2) |")
    for i, run in enumerate(record["runs"], 1):
        for row in run.get("rows", []):
            gc = row.get("gc") or {}
            print(f"| {i} | {row['attention']} | {row.get('step_ms') or 0:.2f} | {gc.get('ms_per_step', 0):.2f} "
                  f"| {gc.get('collections')} |")
    for name, row in record["rows"].items():
        s = row["summary"]
        print(f"{name}: {record['candidate']} / {record['baseline']} {s['mean']:.3f}x ± {s['se']:.3f} "
              f"(pairs {', '.join(f'{r:.3f}' for r in row['ratios'])})")
