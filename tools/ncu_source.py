"""Which SASS instructions a kernel's warps stall at, and why: ncu's warp-state sampling per instruction.

    ncu --section SourceCounters --section WarpStateStats --kernel-name _dq_kernel --launch-skip 1 \\
        --launch-count 1 -o dq python -m benchmarks.attention --once --quant token
    ncu -i dq.ncu-rep --page source --csv --print-source sass > dq.csv
    python -m tools.ncu_source dq.csv

--consumers OPCODE REASON groups OPCODE's REASON samples by what reads each line's result (the first later
instruction naming its destination register): which computation the waiting instructions feed, e.g. in the token
dK/dV whether an FFMA waiting on a shared-memory read (short_sb) feeds exp2 (P^T) or a multiply (Y^T).

tools.ncu_stalls gives each kernel's stall reasons as averages; this attributes them to instructions,
which is what says *where* to act: for example the token dQ's first multiply of S waiting on the
short scoreboard (a shared-memory read of s_K queued behind the tile's wgmma reads; docs/kernel-notes.md,
"Per-column scales read before the products"). Each sample is one warp's state at one instruction, so
a reason's share of the samples is its share of the warps' time. Lines of idle warps (NOP, BRA,
USETMAXREG, EXIT: in a warp-specialised kernel the producer's padded warps park at a NOP, its copy
loop spins at a BRA) are left out unless --all.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import sys

_SAMPLES = "Warp Stall Sampling (All Samples)"
_IDLE = ("NOP", "BRA", "USETMAXREG", "EXIT", "RET")


def opcode(source: str) -> str:
    """The opcode of a SASS line ('@!P0 BRA 0x..' -> 'BRA')."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0] if words else ""


def read(path: str, include_idle: bool = False) -> dict:
    """{kernel, lines: [{address, source, opcode, samples, reasons: {reason: samples}}]} of one kernel."""
    opener = gzip.open if path.endswith(".gz") else open   # a kept profile is stored compressed
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"]), None)
    if head is None:
        raise ValueError(f"{path}: no ncu source-page header (Address, Source, ...); export with "
                         f"ncu -i REPORT --page source --csv --print-source sass")
    names = rows[head]
    if _SAMPLES not in names:
        raise ValueError(f"{path}: no warp-state samples; profile with --section SourceCounters")
    reasons = [n for n in names if n.startswith("stall_") and "(Not Issued)" not in n]
    kernel = next((r[1] for r in rows[:head] if len(r) > 1 and r[0] == "Kernel Name"), "?")
    lines = []
    for r in rows[head + 1:]:
        if len(r) != len(names):
            continue
        row = dict(zip(names, r))
        op = opcode(row["Source"])
        if not include_idle and op.startswith(_IDLE):
            continue
        lines.append({"address": row["Address"], "source": row["Source"].strip(), "opcode": op,
                      "samples": _number(row[_SAMPLES]),
                      "reasons": {n[len("stall_"):]: _number(row[n]) for n in reasons}})
    if not lines or not sum(line["samples"] for line in lines):
        raise ValueError(f"{path}: no sampled instructions")
    return {"kernel": kernel, "lines": lines}


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summary(profile: dict, top: int = 6) -> dict:
    """Shares of all samples: per reason, per (reason, opcode), and the hottest lines."""
    lines = profile["lines"]
    total = sum(line["samples"] for line in lines)
    by_reason = collections.Counter()
    by_reason_op = collections.defaultdict(collections.Counter)
    for line in lines:
        for reason, n in line["reasons"].items():
            by_reason[reason] += n
            by_reason_op[reason][line["opcode"]] += n
    hottest = sorted(lines, key=lambda line: -line["samples"])[:top]
    return {"kernel": profile["kernel"], "samples": total,
            "reasons": {r: n / total for r, n in by_reason.most_common() if n},
            "reason_opcodes": {r: {op: n / total for op, n in by_reason_op[r].most_common(top) if n}
                               for r, _ in by_reason.most_common()},
            "hottest": [{"address": line["address"], "source": line["source"], "share": line["samples"] / total,
                         "reasons": {r: n / line["samples"] for r, n in sorted(line["reasons"].items(),
                                                                               key=lambda kv: -kv[1])[:3] if n}}
                        for line in hottest if line["samples"]]}


def destination(source: str) -> str | None:
    """The register an instruction writes ('FFMA R1, R2, R3, -R4' -> 'R1'), or None."""
    words = [w for w in source.replace(",", " ").split() if not w.startswith("@")]
    return words[1] if len(words) > 1 and words[1].startswith("R") and words[1][1:].isdigit() else None


def consumers(profile: dict, op: str, reason: str, window: int = 128) -> dict[str, float]:
    """{opcode of the first instruction within `window` lines after each `op` line that reads its destination
    register ("none" if none does): share of all samples of `op` lines in `reason`}, most first."""
    lines = profile["lines"]
    total = sum(line["samples"] for line in lines)
    counts = collections.Counter()
    for i, line in enumerate(lines):
        n = line["reasons"].get(reason, 0)
        if line["opcode"] != op or not n:
            continue
        reg = destination(line["source"])
        reader = next((later["opcode"] for later in lines[i + 1:i + 1 + window]
                       if reg and reg in [w.split(".")[0].strip("-|") for w in
                                          later["source"].replace(",", " ").split()[2:]]), "none")
        counts[reader] += n
    return {reader: n / total for reader, n in counts.most_common()}


def markdown(s: dict) -> str:
    out = [f"{s['kernel']}: {s['samples']:.0f} samples", "",
           "| stall reason | share of samples | at these opcodes (share of all samples) |", "|---|---|---|"]
    for reason, share in s["reasons"].items():
        ops = ", ".join(f"{op} {v:.1%}" for op, v in s["reason_opcodes"].get(reason, {}).items())
        out.append(f"| {reason} | {share:.1%} | {ops} |")
    out += ["", "| address | SASS | share of samples | its reasons |", "|---|---|---|---|"]
    for line in s["hottest"]:
        why = ", ".join(f"{r} {v:.0%}" for r, v in line["reasons"].items())
        out.append(f"| {line['address']} | `{line['source'][:70]}` | {line['share']:.2%} | {why} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+", help="ncu --page source --csv --print-source sass output, one kernel each")
    ap.add_argument("--top", type=int, default=6, help="opcodes per reason and hottest lines")
    ap.add_argument("--all", action="store_true", help="keep idle warps' lines (NOP, BRA, USETMAXREG, EXIT)")
    ap.add_argument("--consumers", nargs=2, metavar=("OPCODE", "REASON"),
                    help="also: OPCODE's REASON samples by the opcode that reads each line's result")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top must be at least 1, got {args.top}")
    for path in args.csv:
        try:
            profile = read(path, args.all)
        except (OSError, ValueError) as err:
            ap.error(str(err))
        print(markdown(summary(profile, args.top)))
        print()
        if args.consumers:
            op, reason = args.consumers
            shares = consumers(profile, op, reason)
            if not shares:
                ap.error(f"{path}: no {op} line has {reason} samples (reasons: "
                         f"{', '.join(sorted(profile['lines'][0]['reasons']))})")
            print(f"| {op} lines' {reason} samples, by what reads their result | share of all samples |")
            print("|---|---|")
            for reader, share in shares.items():
                print(f"| {reader} | {share:.1%} |")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
