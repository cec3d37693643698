# The twenty-second session's device calls (H200, 2026-11-28/29), run from the repository root on a071482 and after.
#   prepare (local, with git):  .gpu/trialfiles = the files a trial changes, as the trial has them, e.g.
#     git apply docs/measurements/trial-token-dkdv-defer-dk16.patch && mkdir -p .gpu/trialfiles/sagebwd/triton \
#       && cp sagebwd/triton/dkdv_hopper.py .gpu/trialfiles/sagebwd/triton/ \
#       && git checkout sagebwd/triton/dkdv_hopper.py
#   call 1: run("bash docs/measurements/gpu-calls-h200-1128l.sh check")
#           the GPU tests that run the registry's defaults (the token dQ's gluon-ws2 default of 999cfc8 had not run
#           under them), the fwd+bwd table of both contracts, and the trial in .gpu/trialfiles (defer-dk): its
#           tests and a kernel A/B against the checkout (HEAD = the trial, BASE = the checkout).
#           As it ran: 36 tests passed; the trial's 38 tests failed at once (its first launch died with "unspecified
#           launch failure", which poisons the process's CUDA context) and its A/B stopped there.
#   call 2: run("bash docs/measurements/gpu-calls-h200-1128l.sh pairs", carry=[".whl", ".cache"])
#   call 3: run("bash docs/measurements/gpu-calls-h200-1128l.sh graph")
#   call 4: run("bash docs/measurements/gpu-calls-h200-1128l.sh ab ab-token-fp8-pv-probe-h200-1128l") on branch
#           fp8-pv-probe (the token forward's P V in FP8 e4m3, timing only: V^'s bytes read as e4m3;
#           probe-token-forward-fp8-pv.patch), .gpu/basefiles = main's forward.py
#   call 5: run("bash docs/measurements/gpu-calls-h200-1128l.sh gfwd ab-token-gluon-forward-h200-1128l") on branch
#           gluon-token-fwd (the experimental Gluon forward for the token contract at d=64)
#   call 6: run("bash docs/measurements/gpu-calls-h200-1128l.sh debug") on main, .gpu/trialfiles as in call 1
#           (as it ran, the trial's runs lacked PYTHONPATH, since added; the forward's caps ran);
#           call 7: `debug no-tiles`;
#           call 8: `debug no-tiles 1024` (compute-sanitizer on the failing size)
#   call 9: run("bash docs/measurements/gpu-calls-h200-1128l.sh trial-ab ab-token-defer-dk-smem-h200-1128l") on branch
#           defer-dk-smem (trial-token-dkdv-defer-dk-smem.patch: the deferred dK product with dS^T from shared memory)
#   call 10: run("bash docs/measurements/gpu-calls-h200-1128l.sh source-fwd ncu-source-token-d64-fp8-pv-probe-h200-1128l")
#           on branch fp8-pv-probe (the calls script as on main)
set -u
trial_tree() {   # /tmp/trial: the checkout with .gpu/trialfiles over it
  rm -rf /tmp/trial && mkdir -p /tmp/trial && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/trial/ \
    && cp -r .gpu/trialfiles/. /tmp/trial/
}
case "${1:-}" in
  check)
    TESTS_FILES="tests/test_triton_gpu.py tests/test_host_profile.py" TESTS_TIMEOUT=300 TESTS_K="compiled_model \
      or cuda_graph or direct_launches or programmatic or sections or allocates_only or two_streams \
      or (matches_simulation and token and not gluon) or launch_costs" \
      bash docs/measurements/gpu-calls-h200-1128k.sh tests defaults
    timeout 150 python3 -m benchmarks.attention --baselines CUDNN --kernel-times \
      --kernel-shapes 8,16,4096,64 8,8,4096,128 --shapes 8,16,4096,64 8,8,4096,128 \
      --json "$OUT/bench-h200-1128l.json" 2>&1 | tail -30
    trial_tree
    (cd /tmp/trial && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv or (matches_simulation and token and 64) or two_streams" 2>&1 | tail -4)
    (cd /tmp/trial && timeout 200 python3 -m benchmarks.ab "$OLDPWD" --rounds 2 \
      --json "$OUT/ab-token-defer-dk16-h200-1128l.json" -- --no-bench --quant token --kernel-times \
      --kernel-shapes 8,16,4096,64 4,12,4096,64 --kernel-masks causal full | tail -20) ;;
  pairs)   # call 2 (carry .whl, .cache): two trainer pairs on this tree (the token dQ's gluon-ws2 default)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 560 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/${2:-trainer-pairs-h200-1128l}.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead 2>&1 | tail -15 ;;
  graph)   # call 3: the benchmark's "fwd+bwd graph" rows (its test first), both contracts against CUDNN
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py -k replayed 2>&1 | tail -2
    timeout 420 python3 -m benchmarks.attention --baselines CUDNN \
      --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 --json "$OUT/bench-graph-h200-1128l.json" 2>&1 | tail -40 ;;
  ab)   # call 4: a kernel A/B, HEAD = the checkout (a probe branch), BASE = the checkout with .gpu/basefiles over it
    # (the files the probe changes, as main has them); OUT name: $2
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
      && cp -r .gpu/basefiles/. /tmp/base/
    timeout 400 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/$2.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 8,8,4096,128 \
      --kernel-masks causal full | tail -40 ;;
  gfwd)   # call 5, branch gluon-token-fwd: the experimental Gluon token forward's GPU test, then a kernel A/B
    # against the Triton forward (BASE = the checkout, HEAD = the checkout with the Gluon forward the token default)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py -k "token_gluon_forward" 2>&1 \
      | tail -4
    rm -rf /tmp/gl && mkdir -p /tmp/gl && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/gl/ \
      && sed -i 's/\(("sm90", 64, "forward", "token"): Row(\)"triton", ("gluon",)/\1"gluon", ("triton",)/' \
        /tmp/gl/sagebwd/triton/registry.py && grep -c 'Row("gluon", ("triton",)' /tmp/gl/sagebwd/triton/registry.py
    timeout 330 python3 -m benchmarks.ab "$PWD" --head /tmp/gl --rounds 2 --json "$OUT/$2.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | tail -30 ;;
  debug)   # call 6: where the defer-dk trial (.gpu/trialfiles) fails, on one small call under compute-sanitizer;
    # then the token forward's register caps on this tree (benchmarks.forward_tiles: 4, 3 or 2 programs an SM)
    trial_tree
    cat > /tmp/one.py <<'PY'
import sys, torch
from sagebwd.triton import attention
shape, causal = (1, 2, int(sys.argv[1]), 64), sys.argv[2] == "causal"
q, k, v, do = [torch.randn(*shape, device="cuda").bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, causal, True, False, 128, 64, "token")
g = torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print(shape, causal, "ok", [float(t.float().norm()) for t in g])
PY
    for c in "256 full" "256 causal" "1024 causal"; do
      (cd /tmp/trial && PYTHONPATH=/tmp/trial CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 /tmp/one.py $c 2>&1 | tail -3)
    done
    (cd /tmp/trial && PYTHONPATH=/tmp/trial timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
      --print-limit 5 python3 /tmp/one.py ${3:-256} causal 2>&1 | grep -v "^=========     Host Frame" | head -40)
    [ "${2:-}" = no-tiles ] || timeout 150 python3 -m benchmarks.forward_tiles --shapes 8,16,4096,64 4,12,4096,64 \
      --json "$OUT/forward-tiles-h200-1128l.json" 2>&1 | tail -16 ;;
  trial-ab)   # call 9, branch defer-dk-smem: the trial's token dK/dV tests, then `ab NAME` (.gpu/basefiles: main's
    # dkdv_hopper.py and dkdv_ws_hopper.py)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv_matches or (matches_simulation and token and 64) or two_streams" 2>&1 | tail -4
    bash "$0" ab "$2" ;;
  source-fwd)   # call 10, branch fp8-pv-probe: warp stalls per SASS instruction of the token forward, d=64 causal
    # (the base's: ncu-source-token-d64-_forward_kernel-h200-1128k.csv.gz, its forward unchanged since); OUT name: $2
    timeout 200 /usr/local/cuda/bin/ncu --clock-control none --section SourceCounters --section WarpStateStats \
      --kernel-name _forward_kernel --launch-count 1 -o /tmp/fwd python3 -m benchmarks.attention --once \
      --quant token --shapes 8,16,4096,64 > /dev/null 2>&1; echo "ncu rc $?"
    /usr/local/cuda/bin/ncu -i /tmp/fwd.ncu-rep --page source --csv --print-source sass > /tmp/fwd.csv
    gzip -c /tmp/fwd.csv > "$OUT/$2.csv.gz"
    python3 -m tools.ncu_source /tmp/fwd.csv --top 12 | head -60 ;;
  *) echo "usage: bash $0 check|pairs|graph|ab NAME|gfwd NAME|debug|trial-ab NAME|source-fwd NAME" >&2; exit 2 ;;
esac
