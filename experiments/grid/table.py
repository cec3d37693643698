"""The run table `python -m experiments expand` prints (text or JSON)."""
from __future__ import annotations

import json
import shlex

from experiments.grid.cost import ASSUMED_MFU
from experiments.grid.plan import Plan, RunSpec


def human_count(n: int) -> str:
    """78643200000 -> '78.6B'; 2097152 -> '2.1M'."""
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return str(n)


def _columns(run: RunSpec, axes: list[str]) -> dict[str, str]:
    row = {"name": run.name, **{a: run.axes.get(a, "") for a in axes}}
    if run.kind == "train":
        lay = run.layout
        row |= {"world": str(run.world), "dp": str(lay.dp), "sp": str(lay.sp),
                "micro": str(lay.micro_batch), "accum": str(lay.grad_accum),
                "batch": str(lay.global_batch), "zero": str(lay.zero_stage),
                "steps": str(run.steps), "tokens": human_count(run.tokens),
                "est_h": f"{run.est_hours:.1f}" if run.est_hours is not None else "-"}
    else:
        row |= {"gpus": str(run.gpus_per_node), "command": shlex.join(run.argv)}
    return row


def format_table(plan: Plan) -> str:
    node = plan.node
    unit = f"{node.gpus_per_node} GPUs" if node.accelerator == "gpu" else \
        f"{node.procs_per_node} CPU process"
    peak = f", {node.bf16_peak_tflops:g} bf16 TFLOPS each" if node.bf16_peak_tflops else ""
    lines = [f"{plan.manifest.name}: {len(plan.runs)} runs on {node.name} ({unit} per node{peak}) "
             f"from {plan.path}"]
    axes = list(dict.fromkeys(a for run in plan.runs for a in run.axes))
    rows = [_columns(run, axes) for run in plan.runs]
    if rows:
        headers = list(rows[0])
        widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in headers}
        last = headers[-1]
        lines.append("  ".join(h.ljust(widths[h]) if h != last else h for h in headers))
        lines += ["  ".join(r[h].ljust(widths[h]) if h != last else r[h] for h in headers)
                  for r in rows]
    if plan.manifest.kind == "train" and node.bf16_peak_tflops:
        lines.append(f"est_h: wall hours at {ASSUMED_MFU:.0%} MFU of the bf16 peak (a rough guide)")
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def plan_as_json(plan: Plan) -> str:
    runs = []
    for run in plan.runs:
        item = {"name": run.name, "kind": run.kind, "axes": run.axes, "nodes": run.nodes,
                "world": run.world, "gpus_per_node": run.gpus_per_node,
                "run_dir": str(run.run_dir), "argv": list(run.argv)}
        if run.layout:
            item |= {"dp": run.layout.dp, "sp": run.layout.sp,
                     "micro_batch": run.layout.micro_batch, "grad_accum": run.layout.grad_accum,
                     "zero_stage": run.layout.zero_stage, "steps": run.steps, "tps": run.tps,
                     "tokens": run.tokens, "est_hours": run.est_hours}
        runs.append(item)
    return json.dumps({"manifest": plan.manifest.name, "path": str(plan.path),
                       "node": plan.node.name, "experiment": plan.experiment,
                       "notes": plan.notes, "runs": runs}, indent=2)
