# The twenty-second session's device calls (H200, 2026-11-28/29), run from the repository root on a071482 and after.
#   prepare (local, with git):  .gpu/trialfiles = the files a trial changes, as the trial has them, e.g.
#     git apply docs/measurements/trial-token-dkdv-defer-dk16.patch && mkdir -p .gpu/trialfiles/sagebwd/triton \
#       && cp sagebwd/triton/dkdv_hopper.py .gpu/trialfiles/sagebwd/triton/ && git checkout sagebwd/triton/dkdv_hopper.py
#   call 1: run("bash docs/measurements/gpu-calls-h200-1128l.sh check")
#           the GPU tests that run the registry's defaults (the token dQ's gluon-ws2 default of 999cfc8 had not run
#           under them), the fwd+bwd table of both contracts, and the trial in .gpu/trialfiles (defer-dk): its
#           tests and a kernel A/B against the checkout (HEAD = the trial, BASE = the checkout).
#           As it ran: 36 tests passed; the trial's 38 tests failed at once (its first launch died with "unspecified
#           launch failure", which poisons the process's CUDA context) and its A/B stopped there.
#   call 2: run("bash docs/measurements/gpu-calls-h200-1128l.sh pairs", carry=[".whl", ".cache"])
#   call 3: run("bash docs/measurements/gpu-calls-h200-1128l.sh graph")
set -u
trial_tree() {   # /tmp/trial: the checkout with .gpu/trialfiles over it
  rm -rf /tmp/trial && mkdir -p /tmp/trial && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/trial/ \
    && cp -r .gpu/trialfiles/. /tmp/trial/
}
case "${1:-}" in
  check)
    python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_triton_gpu.py tests/test_host_profile.py -k \
      "compiled_model or cuda_graph or direct_launches or programmatic or sections or allocates_only or two_streams \
       or (matches_simulation and token and not gluon) or launch_costs" 2>/dev/null | grep "::" > /tmp/ids
    wc -l < /tmp/ids
    awk 'NR%2==1' /tmp/ids > /tmp/h1; awk 'NR%2==0' /tmp/ids > /tmp/h2
    mapfile -t A < /tmp/h1; mapfile -t B < /tmp/h2
    (timeout 300 python3 -m pytest -q -p no:cacheprovider "${A[@]}" > "$OUT/gpu-tests-defaults-1.txt" 2>&1
     echo "rc $?" >> "$OUT/gpu-tests-defaults-1.txt") &
    (timeout 300 python3 -m pytest -q -p no:cacheprovider "${B[@]}" > "$OUT/gpu-tests-defaults-2.txt" 2>&1
     echo "rc $?" >> "$OUT/gpu-tests-defaults-2.txt") &
    wait
    tail -n 2 "$OUT"/gpu-tests-defaults-*.txt; grep -h "^FAILED\|^ERROR" "$OUT"/gpu-tests-defaults-*.txt | head
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
    timeout 560 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/trainer-pairs-h200-1128l.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead 2>&1 | tail -15 ;;
  graph)   # call 3: the benchmark's "fwd+bwd graph" rows (its test first), both contracts against CUDNN
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py -k replayed 2>&1 | tail -2
    timeout 420 python3 -m benchmarks.attention --baselines CUDNN \
      --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 --json "$OUT/bench-graph-h200-1128l.json" 2>&1 | tail -40 ;;
  *) echo "usage: bash $0 check|pairs|graph" >&2; exit 2 ;;
esac
