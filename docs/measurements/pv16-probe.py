"""PROBE: the token forward with P V in bf16 (`git apply docs/measurements/probe-token-forward-pv16.patch` first):
O's error against fp32 SDPA, then the forward kernel's time at register caps, pipeline depths and (with the
probe's SAGEBWD_PROBE_KEYS) 64-key tiles, against the INT8 P V forward in the same process.

    python docs/measurements/pv16-probe.py NAME sweep|keys     (writes $OUT/NAME.json)

The twenty-third session ran "sweep" and "keys" as two scripts (.gpu/pv16_sweep.py, .gpu/pv16_keys.py) with
these loops, merged here; the timing is benchmarks.forward_tiles.call_ms (the same profiler call they made)."""
import json
import os
import sys

import torch

from benchmarks.forward_tiles import call_ms
from sagebwd.triton import attention
from sagebwd.triton.launch import Tuning

# (SAGEBWD_PROBE_PV16, keys a forward tile, the forward's launch settings)
CONFIGS = {
    "sweep": [(0, 128, {}), (1, 128, {}), (1, 128, {"maxnreg": 168, "num_stages": 3}),
              (1, 128, {"maxnreg": 128, "num_stages": 2}), (1, 128, {"maxnreg": 200, "num_stages": 2}),
              (1, 128, {"maxnreg": 168, "num_stages": 1})],
    "keys": [(0, 128, {}), (1, 128, {}), (1, 64, {"maxnreg": 168, "num_stages": 3}),
             (1, 64, {"maxnreg": 128, "num_stages": 3}), (1, 64, {"maxnreg": 128, "num_stages": 2}),
             (1, 64, {"maxnreg": 104, "num_stages": 3}), (1, 64, {"maxnreg": 96, "num_stages": 2}),
             (1, 64, {"maxnreg": 128, "num_stages": 4})],
}

rows = []
for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64)]:
    torch.manual_seed(0)
    q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for causal in (True, False):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        for pv16, keys, settings in CONFIGS[sys.argv[2]]:
            os.environ["SAGEBWD_PROBE_PV16"] = str(pv16)
            os.environ["SAGEBWD_PROBE_KEYS"] = str(keys)
            tuning = Tuning(overrides={"forward": settings} if settings else {})

            def call():
                return attention(q, k, v, causal, True, False, 128, 64, "token", tuning=tuning)
            with torch.no_grad():
                o = call()
                err = float((o.float() - ref).norm() / ref.norm())
            fwd = call_ms(call)["forward_ms"]
            rows.append(dict(shape=shape, causal=causal, pv16=pv16, keys=keys, settings=settings, forward_ms=fwd,
                             o_rel_l2=err))
            print(f"{shape} {'causal' if causal else 'full':6s} pv16={pv16} keys={keys} {json.dumps(settings):40s} "
                  f"fwd {fwd:.4f} ms  O rel-L2 {err:.5f}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), sys.argv[1] + ".json"), "w"), indent=1)
