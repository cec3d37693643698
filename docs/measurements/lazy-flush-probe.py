"""PROBE timing (prepared in the twenty-third session, run in the twenty-fourth: call 1 of
docs/measurements/gpu-calls-h200-1129b.sh, lazy-flush-probe-h200-1129.json): the token d=64 forward of variant r8 with a
lazy reference and its flush (`git apply docs/measurements/probe-token-forward-lazy-flush.patch` first; timing
only, its O is wrong: the V^ column-sum correction and V's per-channel scale are left out), against main's
forward in the same process, on the benchmark's i.i.d. inputs and on inputs with an attention sink (every query's
largest score at key 0, as trained models have it), where the running max never rises after the first tile.

    python docs/measurements/lazy-flush-probe.py NAME      (writes $OUT/NAME.json)

What was expected: on i.i.d. inputs the flush runs on about half the tiles at tau = 1 (flush-rate-1129.py), so the
probe should land near main; with the sink, near the INT32 probe's -10% (probe-token-forward-acc32.patch). What it
measured: +7..+11% i.i.d. and +2..+5% with the sink at its best setting (128-key tiles, 168 registers).
docs/benchmarks.md, "The r8 forward's lazy flush loses; the pre-pass's lag on the H200"."""
import json
import os
import sys

from benchmarks.forward_tiles import probe_inputs, token_forward_ms
from sagebwd.triton.launch import Tuning

# (SAGEBWD_PROBE_LAZY tau or None for main's forward, SAGEBWD_PROBE_KEYS, the forward's register cap)
CONFIGS = [(None, None, None), ("1.0", "128", 200), ("1.0", "128", 168), ("1.0", "64", 168), ("1.0", "64", 128),
           ("0.0", "64", 168)]


rows = []
for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64)]:
    for sink in (False, True):
        q, k, v = probe_inputs(shape, sink)
        for causal in (True, False):
            for tau, keys, cap in CONFIGS:
                for name, value in (("SAGEBWD_PROBE_LAZY", tau), ("SAGEBWD_PROBE_KEYS", keys)):
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                tuning = Tuning(overrides={"forward": {"maxnreg": cap}} if cap else {})
                fwd = token_forward_ms(q, k, v, causal, tuning)["forward_ms"]
                rows.append(dict(shape=shape, sink=sink, causal=causal, tau=tau, keys=keys, maxnreg=cap,
                                 forward_ms=fwd))
                print(f"{shape} {'sink' if sink else 'iid ':4s} {'causal' if causal else 'full':6s} tau={tau} "
                      f"keys={keys} cap={cap}: fwd {fwd:.4f} ms", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), sys.argv[1] + ".json"), "w"), indent=1)
