"""PROBE: the token forward with P V in bf16 (`git apply docs/measurements/probe-token-forward-pv16.patch`
first): accuracy of O against fp32 SDPA, then the forward kernel's time at register caps and pipeline depths,
against the INT8 P V forward in the same process."""
import os, sys, json
import torch
from benchmarks.attention import profiled_ms
from sagebwd.triton import attention
from sagebwd.triton.launch import Tuning

rows = []
for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64)]:
    torch.manual_seed(0)
    q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for causal in (True, False):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        for pv16, settings in [(0, {}), (1, {}), (1, {"maxnreg": 168, "num_stages": 3}),
                               (1, {"maxnreg": 128, "num_stages": 2}), (1, {"maxnreg": 200, "num_stages": 2}),
                               (1, {"maxnreg": 168, "num_stages": 1})]:
            os.environ["SAGEBWD_PROBE_PV16"] = str(pv16)
            tuning = Tuning(overrides={"forward": settings} if settings else {})
            def call():
                return attention(q, k, v, causal, True, False, 128, 64, "token", tuning=tuning)
            with torch.no_grad():
                o = call()
                err = float((o.float() - ref).norm() / ref.norm())
                ms = profiled_ms(call, 10, warmup=3)
            fwd = next(t for name, t in ms.items() if "_forward_kernel" in name)
            row = dict(shape=shape, causal=causal, pv16=pv16, settings=settings, forward_ms=fwd, o_rel_l2=err)
            rows.append(row)
            print(f"{shape} {'causal' if causal else 'full':6s} pv16={pv16} {json.dumps(settings):40s} "
                  f"fwd {fwd:.4f} ms  O rel-L2 {err:.5f}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), sys.argv[1] + ".json"), "w"), indent=1)
