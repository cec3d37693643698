"""The trainer pairs' order effect (docs/kernel-notes.md, "Twenty-fifth session"): token / FPA tokens/s in the pairs
where FPA ran first in its process against those where token did, over every `benchmarks.pairs` JSON in this folder
(files without a "first" list alternate as benchmarks.pairs does, baseline first in odd pairs; combined files are
skipped: their pairs are in the others).

    python docs/measurements/pairs-order-effect.py

Printed on 2026-11-29 (twenty-fifth session): 21 pairs with FPA first, mean 0.969; 17 with token first, mean 0.983.
With the twenty-sixth session's four (trainer-pairs-fp32acc-h200-1129e.json): 23 with FPA first, mean 0.971; 19 with
token first, mean 0.983.
"""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
by_first = {"fpa": [], "token": []}
for path in sorted(glob.glob(os.path.join(here, "trainer-pairs-*.json"))):
    data = json.load(open(path))
    if "combined" in data:
        continue
    for row in data["rows"].values():
        first = row.get("first") or ["fpa" if i % 2 == 0 else "token" for i in range(len(row["ratios"]))]
        for ratio, who in zip(row["ratios"], first):
            by_first["fpa" if who == "fpa" else "token"].append(ratio)
for who, ratios in by_first.items():
    print(f"{who} first: {len(ratios)} pairs, token / FPA mean {statistics.mean(ratios):.3f}")
