"""Where each kernel's warps wait: ncu's stall reasons per issued instruction, as a table.

    ncu --csv --kernel-name regex:"_forward_kernel|_dq_kernel|_dkdv_kernel|_dkdv_ws_kernel" --metrics \\
        "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active" \\
        python -m benchmarks.attention --once [--kernels triton] > ncu.csv
    python -m tools.ncu_stalls ncu.csv

Each stall value is the cycles a warp spends in that state per instruction it issues; their sum
(with "selected", the issuing cycle itself) is the cycles between a warp's instructions. With W
warps per scheduler the issue rate is about W / sum, so a kernel at 2 warps per scheduler and 4
cycles per instruction issues in half the cycles. "gmma" is the wait for wgmma results: small
values mean overlapping the tensor cores with elementwise work has little left to hide.
"""
from __future__ import annotations

import argparse
import collections
import csv
import sys

_STALL = "smsp__average_warps_issue_stalled_"
_ISSUE = "sm__inst_issued.avg.pct_of_peak_sustained_active"
_WARPS = "sm__warps_active.avg.per_cycle_active"


def read(path: str) -> list[dict]:
    """One dict per profiled launch: kernel, grid, block, issue %, warps per SM, stalls {reason: cycles}."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    try:
        head = next(i for i, r in enumerate(rows) if r[:2] == ["ID", "Process ID"])
    except StopIteration:
        raise ValueError(f"{path}: no ncu CSV header (ID, Process ID, ...); run ncu with --csv") from None
    cols = {name: i for i, name in enumerate(rows[head])}
    missing = {"ID", "Kernel Name", "Metric Name", "Metric Value"} - set(cols)
    if missing:
        raise ValueError(f"{path}: ncu CSV lacks {sorted(missing)}; use --metrics, not --page details")
    launches: dict = collections.OrderedDict()
    for r in rows[head + 1:]:
        if len(r) != len(rows[head]):
            continue
        launch = launches.setdefault(r[cols["ID"]], {
            "kernel": r[cols["Kernel Name"]].split("(")[0], "grid": r[cols.get("Grid Size", 0)],
            "block": r[cols.get("Block Size", 0)], "stalls": {}})
        name, value = r[cols["Metric Name"]], r[cols["Metric Value"]].replace(",", "")
        try:
            number = float(value)
        except ValueError:
            continue
        if name.startswith(_STALL):
            launch["stalls"][name[len(_STALL):].replace("_per_issue_active.ratio", "")] = number
        elif name == _ISSUE:
            launch["issue_pct"] = number
        elif name == _WARPS:
            launch["warps_per_sm"] = number
    if not launches:
        raise ValueError(f"{path}: no profiled launches in the CSV")
    return list(launches.values())


def markdown(launches: list[dict], top: int = 7) -> str:
    lines = ["| kernel | grid | block | issue slots busy | warps per SM | cycles per issued instruction | "
             "largest stalls (cycles per issued instruction) |", "|---|---|---|---|---|---|---|"]
    for launch in launches:
        stalls = sorted(launch["stalls"].items(), key=lambda kv: -kv[1])
        biggest = ", ".join(f"{k} {v:.2f}" for k, v in stalls[:top])
        lines.append(f"| {launch['kernel']} | {launch['grid']} | {launch['block']} | "
                     f"{launch.get('issue_pct', float('nan')):.1f}% | {launch.get('warps_per_sm', float('nan')):.1f} | "
                     f"{sum(launch['stalls'].values()):.2f} | {biggest} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --csv --metrics ... output (see the module docstring)")
    ap.add_argument("--top", type=int, default=7, help="stall reasons per kernel")
    args = ap.parse_args(argv)
    try:
        launches = read(args.csv)
    except (OSError, ValueError) as err:
        ap.error(str(err))
    print(markdown(launches, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
