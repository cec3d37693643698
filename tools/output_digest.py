"""SageBwd's outputs on fixed seeded inputs, dumped by one revision and compared bit for bit with
another's: the check that a refactor left the default kernels' outputs unchanged (CUDA).

    PYTHONPATH=OTHER_CHECKOUT python tools/output_digest.py dump old.pt   # that checkout's sagebwd
    PYTHONPATH=. python tools/output_digest.py dump new.pt
    python tools/output_digest.py compare old.pt new.pt

Run as a script (not with -m), so that PYTHONPATH decides which sagebwd is imported. Only the
arguments every revision takes are passed (causal, smooth_q): each revision's defaults run.
"""
from __future__ import annotations

import sys

import torch

# (batch, heads, seq, head_dim, causal, smooth_q): both head dims, both masks, Q-smoothing once
CASES = [(2, 4, 2048, 64, True, False), (2, 4, 2048, 64, False, False), (2, 4, 2048, 128, True, False),
         (2, 4, 2048, 128, False, False), (1, 4, 2048, 64, True, True), (1, 2, 4224, 64, True, False)]


def dump(path: str) -> None:
    import sagebwd
    out = {}
    for case in CASES:
        b, h, n, d, causal, smooth_q = case
        gen = torch.Generator(device="cuda").manual_seed(hash(case) % 2**31)
        q, k, v, do = [torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16() for _ in range(4)]
        q, k, v = [t.requires_grad_() for t in (q, k, v)]
        o = sagebwd.attention(q, k, v, causal=causal, smooth_q=smooth_q)
        out[str(case)] = [t.cpu() for t in (o.detach(), *torch.autograd.grad(o, (q, k, v), do))]
    torch.save({"sagebwd": sagebwd.__file__, "outputs": out}, path)
    print(f"dumped {len(out)} cases from {sagebwd.__file__} to {path}")


def _load(path: str) -> dict:
    try:
        dumped = torch.load(path)
    except FileNotFoundError:
        sys.exit(f"error: {path}: no such file; write it with `python tools/output_digest.py dump {path}`")
    if not isinstance(dumped, dict) or "outputs" not in dumped:
        sys.exit(f"error: {path} is not a dump of tools/output_digest.py")
    return dumped


def compare(path_a: str, path_b: str) -> int:
    a, b = _load(path_a), _load(path_b)
    if set(a["outputs"]) != set(b["outputs"]):
        sys.exit(f"error: {path_a} and {path_b} hold different cases; dump both with the same tools/output_digest.py")
    same = True
    for case, outs in a["outputs"].items():
        equal = [bool(torch.equal(x, y)) for x, y in zip(outs, b["outputs"][case])]
        same &= all(equal)
        print(f"{case}: " + " ".join(f"{n} {'identical' if e else 'DIFFERS'}"
                                     for n, e in zip(("O", "dQ", "dK", "dV"), equal)))
    print(f"{a['sagebwd']} vs {b['sagebwd']}: {'bit-identical' if same else 'outputs differ'}")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
