"""The script that measured docs/measurements/preprocess-warps-h100-1128.json (H100, 2026-11-28, fifteenth session),
kept as it ran: preprocess time by num_warps, in the tree it runs in (argv[1]: label; "base": the tree before the
change, whose launch ignored the override; "dos": with dO s_Q written). Model layout (B,N,H,D) views, bf16.
Run from a tree's root: PYTHONPATH=$PWD python3 docs/measurements/preprocess-warps-h100-1128.py dos
Its committed successor is `python -m benchmarks.preprocess` (the same method, more columns)."""
import sys, json, os, torch
from benchmarks.prepass import graph_ms
from sagebwd.triton import quantize as qz
from sagebwd.triton.launch import Tuning
label = sys.argv[1]
rows = []
for (b, h, n, d) in [(4, 12, 4096, 64), (8, 16, 4096, 64), (8, 8, 4096, 128)]:
    do = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    o = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lse = torch.randn(b, h, n, device="cuda", dtype=torch.float32)
    sq = torch.rand(b, h, n, device="cuda", dtype=torch.float32) + 0.01
    moved = b * h * n * d * (7 if 'dos' in label else 5)   # read dO, O (bf16); write dO^ (fp8) [and dO s_Q (bf16)]
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")   # a copy reads and writes as many
    dst = torch.empty_like(src)
    copy = graph_ms(lambda: dst.copy_(src), 20, 21)
    for w in (2, 4, 8, 16):
        t = Tuning(overrides={"backward_preprocess": {"num_warps": w}})
        ms = graph_ms(lambda: qz.backward_preprocess(do, o, lse, 128, sq, tuning=t), 20, 21)
        rows.append(dict(label=label, shape=(b, h, n, d), warps=w, ms=ms, copy_ms=copy))
        print(f"{label:10s} {(b, h, n, d)} warps {w:2d}: {ms * 1e3:7.1f} us (copy of the bytes {copy * 1e3:6.1f} us)", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"pre-{label}.json"), "w"), indent=1)
