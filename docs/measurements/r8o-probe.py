"""PROBE (prepared in the twenty-fourth session, 2026-11-29; `git apply docs/measurements/probe-token-forward-r8o.patch`
first): the token d=64 forward of variant r8o (tools.quant_study: P~ against tile 0's row max, then a reference raised
in whole log2 steps; P' = round(254 P~) - 127 in INT8; O's sum in int32 across all tiles, shifted right by each rise
of the reference, the offset added back as 127 x V^'s column sums per tile; V^ per channel over the sequence).

    TRITON_INTERPRET=1 python docs/measurements/r8o-probe.py check     (CPU; or on a GPU without the variable)
    python docs/measurements/r8o-probe.py time NAME      (GPU: writes $OUT/NAME.json)

check: the probe kernel's O and LSE against the exact integer model of the same operands (q8, s_q as the kernel
wrote them, k8, s_k, V^ per channel), causal and full, two shapes; prints the largest differences.
time: the forward kernel against main's (the same process, the env switch SAGEBWD_PROBE_R8O), on i.i.d. inputs and
on inputs with an attention sink: at d=64 r8o and r8i (SAGEBWD_PROBE_R8O=o|i) at 168 registers, r8i at 144 too; at
d=128 r8i uncapped and at 168 registers with 2 stages (3 programs an SM); the op's per-tile V scales stand in for
per-channel ones (timing only). Offline (Triton 3.6, `tools.offline --loop-mix`): at d=64 main 11.9 SASS per score
element, r8o 12.3 (16 B spilled at 168: the column sums' loads and adds), r8i 11.0 (no spill); at d=128 main 14.7
(13.5 with its lazy rescale's branch taken), r8i 11.9 (255 registers, no spill; 96 B spilled at 168).

check ran clean on the CPU (TRITON_INTERPRET=1): O within 4e-5 (rel. L2, fp32 output) and LSE within 3e-6 of the
integer model for both variants."""
import json
import math
import os
import sys

import torch

LOG2E = math.log2(math.e)


def reference(q8, s_q, k8, s_k, v_hat, c_v, causal, levels):
    """(O, LSE) of r8o from the kernel's own operands, in float64 and int64 (tools.quant_study's _shifted_pv_output
    on the kernel's S, kept in log2 units)."""
    b, h, n, d = q8.shape
    s2 = ((q8.double() @ k8.double().transpose(-1, -2)) * s_k.double()[..., None, :]
          * (s_q.double() * (LOG2E / math.sqrt(d)))[..., None])
    if causal:
        s2 = s2.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    tn = n // 128
    tiles = s2.reshape(b, h, n, tn, 128)
    run_max = tiles.amax(dim=-1).cummax(dim=-1).values.float()   # the kernel keeps these in fp32
    rises = torch.zeros_like(run_max)
    ref = run_max.clone()
    for j in range(1, tn):   # r_j = r_(j-1) + ceil(max(m_j - r_(j-1), 0)) in fp32, as the kernel
        rises[..., j] = torch.ceil(torch.clamp(run_max[..., j] - ref[..., j - 1], min=0))
        ref[..., j] = ref[..., j - 1] + rises[..., j]
    rises, ref = rises.double(), ref.double()
    e = torch.exp2(tiles - ref.unsqueeze(-1))
    p_hat = torch.round(levels * e).to(torch.int64)
    v_int = v_hat.to(torch.int64).reshape(b, h, tn, 128, d)
    acc = torch.zeros(b, h, n, d, dtype=torch.int64)
    l = torch.zeros(b, h, n, dtype=torch.float64)
    for j in range(tn):
        if j:
            rise = rises[..., j].to(torch.int64)
            acc = torch.bitwise_right_shift(acc, rise.clamp(max=31).unsqueeze(-1))
            l = l * torch.exp2(-rise.double())
        acc = acc + torch.einsum("bhnk,bhkd->bhnd", p_hat[..., j, :], v_int[:, :, j])
        l = l + e[..., j, :].sum(dim=-1)
    o = acc.double() * c_v.double()[..., None, :] / levels / l.unsqueeze(-1)
    return o, (ref[..., -1] + torch.log2(l)) / LOG2E


def check():
    from sagebwd.triton import forward, quantize
    from sagebwd.triton._common import k_order_index
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    worst = {}
    cases = [(v, s, c) for v in ("o", "i") for s, c in
             [((1, 2, 256, 64), True), ((1, 2, 256, 64), False), ((1, 1, 512, 64), True)]]
    cases += [("i", (1, 2, 256, 128), True), ("i", (1, 1, 384, 128), False)]   # r8i at d=128 (two halves of O)
    for variant, (b, h, n, d), causal in cases:
        os.environ["SAGEBWD_PROBE_R8O"] = variant
        gen = torch.Generator().manual_seed(n + causal)
        q, k, v = [(torch.randn(b, h, n, d, generator=gen) * 2).bfloat16().to(dev) for _ in range(3)]
        _, _, _, _, k8, _, s_k, _, _ = quantize.quantize_qkv(q, k, v, 128, 64, k_mean=None, smooth_q=False,
                                                              cols=False, token=True, quantize_q=False)
        c_v = v.float().abs().amax(dim=-2) / 127                                   # (B, H, D)
        v_hat = torch.round(v.float() / c_v[..., None, :]).to(torch.int8)
        v8t = v_hat.transpose(-1, -2)[..., k_order_index(n, dev)].contiguous()
        q8 = torch.empty(b, h, n, d, dtype=torch.int8, device=dev)
        s_q = torch.empty(b, h, n, dtype=torch.float32, device=dev)
        o, lse = forward.run(q8, k8, v8t, s_q, s_k, c_v.contiguous(), out_dtype=torch.float32, causal=causal,
                             smooth_k=False, mu_q=None, k=None, k_mean=None, block_q=128, block_kv=64,
                             layout_of=None, quant="token", q=q)
        o_ref, lse_ref = reference(q8.cpu(), s_q.cpu(), k8.cpu(), s_k.cpu(), v_hat.cpu(), c_v.cpu(), causal,
                                   254 if variant == "o" else 127)
        rel = ((o.double().cpu() - o_ref).norm() / o_ref.norm()).item()
        worst[f"r8{variant} {(b, h, n, d)} {'causal' if causal else 'full'}"] = {
            "o_rel_l2": rel, "o_max_abs": (o.double().cpu() - o_ref).abs().max().item(),
            "lse_max_abs": (lse.double().cpu() - lse_ref).abs().max().item()}
    print(json.dumps(worst, indent=1))
    assert all(w["o_rel_l2"] < 1e-4 and w["lse_max_abs"] < 1e-4 for w in worst.values()), "the probe's O is off"


def time(name):
    from benchmarks.forward_tiles import probe_inputs, token_forward_ms
    from sagebwd.triton.launch import Tuning
    rows = []
    for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64), (8, 8, 4096, 128)]:
        for sink in (False, True):
            q, k, v = probe_inputs(shape, sink)
            for causal in (True, False):
                settings = ((("", None), ("i", 168), ("o", 168), ("i", 144)) if shape[-1] == 64 else
                            (("", None), ("i", None), ("i", 168)))   # d=128: uncapped (255), or 168 at 2 stages
                for probe, cap in settings:
                    os.environ["SAGEBWD_PROBE_R8O"] = probe
                    knobs = {"maxnreg": cap, **({"num_stages": 2} if shape[-1] == 128 else {})} if cap else {}
                    tuning = Tuning(overrides={"forward": knobs} if knobs else {})
                    fwd = token_forward_ms(q, k, v, causal, tuning)["forward_ms"]
                    rows.append(dict(shape=shape, sink=sink, causal=causal, probe=probe, maxnreg=cap, forward_ms=fwd))
                    print(f"{shape} {'sink' if sink else 'iid ':4s} {'causal' if causal else 'full':6s} "
                          f"{'r8' + probe if probe else 'main'} cap={cap}: fwd {fwd:.4f} ms", flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), name + ".json"), "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        check()
    elif len(sys.argv) == 3 and sys.argv[1] == "time":
        time(sys.argv[2])
    else:
        sys.exit(f"usage: python {sys.argv[0]} check | time NAME (got {' '.join(sys.argv[1:]) or 'no arguments'})")
