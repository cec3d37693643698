"""The trainer's step with model.qkv_impl plain and fused (gpu-calls-h200-1129e.sh qkv): one row per attention,
each round's step milliseconds and fused's change against plain (means over the rounds).

    python docs/measurements/qkv-ab-table.py trainer-qkv-*.json
"""
import json
import re
import statistics
import sys

steps = {}   # (attention, impl) -> [step ms per round]
for path in sorted(sys.argv[1:]):
    impl = re.search(r"trainer-qkv-(plain|fused)-r\d+", path).group(1)
    for row in json.load(open(path))["rows"]:
        if row.get("step_ms") and not row.get("error"):
            steps.setdefault((row["attention"], impl), []).append(row["step_ms"])
print("| attention | plain step ms (rounds) | fused step ms (rounds) | fused / plain step |")
print("|---|---|---|---|")
for attention in sorted({a for a, _ in steps}):
    plain, fused = steps.get((attention, "plain"), []), steps.get((attention, "fused"), [])
    change = statistics.fmean(fused) / statistics.fmean(plain) if plain and fused else float("nan")
    print(f"| {attention} | {', '.join(f'{s:.2f}' for s in plain)} | {', '.join(f'{s:.2f}' for s in fused)} | "
          f"{change:.4f} |")
