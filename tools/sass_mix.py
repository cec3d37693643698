"""What each kernel's main loop issues per score element, read from its SASS (no GPU needed),
and the time floor that count sets.

The INT8 kernels are issue-bound on Hopper (docs/kernel-notes.md: tensor cores <= 25% busy,
issue slots 40-65%), so the number of thread instructions per score element is the quantity
to cut, and it can be counted offline: compile for sm_90 (``offline``), disassemble with
Triton's bundled nvdisasm, take the largest loop (a backward branch), histogram its opcodes
and divide by the score elements one iteration covers.

The issue floor of a kernel is elements x instructions / (4 schedulers x 32 lanes x SMs x
clock): the time at which every scheduler issues every cycle. A measured time divided into
it is the kernel's issue efficiency. The tensor floor is its dot FLOPs at the dense peak.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import subprocess
import tempfile

# Opcodes kept with their first modifier (the unit or shape matters); the rest by base name.
_KEEP_MODIFIER = {"MUFU", "HGMMA", "IGMMA", "SHFL", "LDS", "LDSM", "STS", "LDGSTS", "I2F", "F2I", "F2FP", "I2IP"}
# Dots per score element: (INT8 or FP8 dots, 16-bit dots), each HEAD_DIM MACs per element; per contract. The token
# contract's dQ and dK are bf16 products of Y (simulate.token_dq, token_dk), its dV an FP8 one.
DOTS_PER_ELEMENT = {
    "block": {"forward": (2, 0), "dq": (2, 1), "dkdv": (3, 1), "dv": (2, 0), "dk": (2, 1), "fused": (4, 1)},
    "token": {"forward": (2, 0), "dq": (1, 2), "dkdv": (2, 2), "dv": (2, 0), "dk": (1, 2)},
}


def disassemble(cubin: bytes) -> str:
    import triton
    tool = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"))
    if not tool:
        raise FileNotFoundError("nvdisasm is not bundled with this Triton; the loop mix needs it")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool[0], "-c", f.name], capture_output=True, text=True, check=True).stdout


def _parse(sass: str) -> tuple[list[str], dict[str, int]]:
    """The instruction texts in order, and the index of the instruction each label stands before."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        ins = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if ins:
            instructions.append(ins.group(1))
    return instructions, labels


def instructions_and_loops(sass: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The instruction texts in order, and (first, last) index of every loop: a branch back. A
    conditional one anywhere; an unconditional one only before the kernel's last EXIT (a rotated
    loop, whose exit test sits inside it: the causal d=128 dK pass with its diagonal block peeled).
    After the last EXIT,
    an unconditional branch back is no loop: ptxas puts an mbarrier wait's retry path there and
    jumps back from it into the kernel (Gluon kernels), which would look like a loop around
    everything between."""
    instructions, labels = _parse(sass)
    loops = []
    exits = [i for i, text in enumerate(instructions) if opcode(text) == "EXIT"]
    last_exit = exits[-1] if exits else len(instructions)
    for i, text in enumerate(instructions):
        target = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
        if target and (text.startswith("@") or i < last_exit) and labels.get(target.group(1), i + 1) <= i:
            loops.append((labels[target.group(1)], i))
    return instructions, loops


def _nests_a_loop(span: tuple[int, int], loops: list[tuple[int, int]]) -> bool:
    """Whether a sizeable loop (64+ instructions) lies inside span: a warp-specialised kernel's
    dispatch loop, say, around its partitions' loops (mbarrier retry loops are a few instructions)."""
    return any(other != span and span[0] <= other[0] and other[1] <= span[1] and other[1] - other[0] >= 64
               for other in loops)


def main_loop(loops: list[tuple[int, int]]) -> tuple[int, int]:
    """The largest loop with no sizeable loop inside it. A warp-specialised kernel wraps its
    partitions in a dispatch loop around everything; mbarrier retry loops are a few instructions."""
    return max((span for span in loops if not _nests_a_loop(span, loops)), key=lambda span: span[1] - span[0])


def opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P[T0-9]+\s+", "", text.strip())   # drop a predicate guard
    parts = text.split()[0].split(".")
    return ".".join(parts[:2]) if parts[0] in _KEEP_MODIFIER and len(parts) > 1 else parts[0]


def local_memory_in_loops(sass: str) -> int:
    """Local-memory instructions (LDL, STL: spill traffic) inside the kernel's innermost loops.
    Spills outside them cost little; inside, every trip reloads (the causal d=128 dK pass with its
    diagonal block peeled: 26
    per trip, ncu's long scoreboard 1.26 cycles per instruction). A warp-specialised kernel's
    dispatch loop, which wraps whole partitions (code that runs once per program too), is not
    counted."""
    instructions, loops = instructions_and_loops(sass)
    inside = set()
    for first, last in loops:
        if not _nests_a_loop((first, last), loops):
            inside.update(range(first, last + 1))
    return sum(1 for i in inside if opcode(instructions[i]) in ("LDL", "STL"))


def elements_per_iteration(kernel: str, constexprs: dict) -> int:
    """Score elements one trip of the kernel's main loop covers (see each kernel's docstring)."""
    if kernel == "forward":
        return constexprs["BLOCK_M"] * constexprs["BLOCK_N"]
    if kernel == "dq" and "Q_ROWS" in constexprs:   # the Gluon dQ: a trip is a pair of kv tiles
        return constexprs["Q_ROWS"] * 2 * constexprs["KV_ROWS"]
    if kernel == "dq":
        return constexprs["BLOCK_M"] * constexprs["BLOCK_N"]
    if kernel in ("dkdv", "dv", "dk", "fused") and "SLICE" in constexprs:
        # the Gluon dK/dV (and the fused backward, fused_hopper): a trip is a q block (two slices) on
        # one warpgroup's kv tile (a slice tall)
        return constexprs.get("KV_BLOCK", constexprs["SLICE"]) * constexprs.get("Q_BLOCK", 2 * constexprs["SLICE"])
    if kernel in ("dkdv", "dv", "dk"):   # BLOCK_N kv rows; a trip is a q slice, or a q block when chained
        step = constexprs["Q_BLOCK"] if constexprs.get("CHAIN") else constexprs["BLOCK_M"]
        return constexprs["BLOCK_N"] * step
    raise KeyError(f"no loop model for kernel {kernel!r}")


def branched_in_loop(sass: str, span: tuple[int, int]) -> int:
    """Instructions of the loop span that a trip skips when every conditional forward branch inside
    it is taken: a block behind a rarely true test (the token forward's lazy rescaling at d=128) is
    counted in the loop but seldom runs."""
    instructions, labels = _parse(sass)
    skipped = set()
    first, last = span
    for i in range(first, last):
        target = re.match(r"@!?U?P[T0-9]+\s+BRA\b.*?(\.L_x_\d+)", instructions[i])
        if target and i < labels.get(target.group(1), -1) <= last:
            skipped.update(range(i + 1, labels[target.group(1)]))
    return len(skipped)


def loop_mix(sass: str, kernel: str, constexprs: dict, num_warps: int, role_loops: int = 1) -> dict:
    """Thread instructions per score element in the kernel's largest loop, in all and by opcode;
    per_element_branches_taken: the same with every conditional forward branch taken
    (branched_in_loop). role_loops > 1: a kernel whose partitions each walk every score element once
    in a loop of their own (experimental/dkdv_roles_hopper): its that many largest loops, summed."""
    instructions, loops = instructions_and_loops(sass)
    if not loops:
        raise ValueError(f"{kernel}: no loop found in the SASS")
    innermost = sorted((span for span in loops if not _nests_a_loop(span, loops)), key=lambda s: s[0] - s[1])
    spans = innermost[:role_loops] if role_loops > 1 else [main_loop(loops)]
    body = [text for first, last in spans for text in instructions[first:last + 1]]
    per_element = 32 * num_warps / elements_per_iteration(kernel, constexprs)
    counts = collections.Counter(opcode(text) for text in body)
    branched = sum(branched_in_loop(sass, span) for span in spans)
    return {"kernel": kernel, "loop_instructions": len(body), "per_element": len(body) * per_element,
            "per_element_branches_taken": (len(body) - branched) * per_element,
            "by_opcode": {op: n * per_element for op, n in counts.most_common()}}


def causal_elements(n: int, block_q: int, block_kv: int) -> int:
    """Score elements in the tiles on or below the diagonal of one head (the kernels' work)."""
    return sum(block_q * min(n, -(-(i + 1) * block_q // block_kv) * block_kv) for i in range(n // block_q))


def floors_ms(kernel: str, per_element: float, shape, causal: bool, block_q: int, block_kv: int, quant: str = "block",
              sms: int = 132, ghz: float = 1.98, int8_tops: float = 1979.0, bf16_tflops: float = 989.0) -> dict:
    """(issue floor, tensor floor) in ms of one kernel of contract `quant` for (B, H, N, D); H200 defaults."""
    b, h, n, d = shape
    elements = b * h * (causal_elements(n, block_q, block_kv) if causal else n * n)
    issue = elements * per_element / (4 * 32 * sms * ghz * 1e9) * 1e3
    int8_dots, bf16_dots = DOTS_PER_ELEMENT[quant][kernel]
    tensor = (2 * d * elements * (int8_dots / (int8_tops * 1e12) + bf16_dots / (bf16_tflops * 1e12))) * 1e3
    return {"issue_ms": issue, "tensor_ms": tensor, "elements": elements}
