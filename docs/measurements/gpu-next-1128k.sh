# The next GPU session's first calls, prepared in the twenty-first (2026-11-28; none run yet): the tree with the
# token dQ's two-consumer default (999cfc8 and after) under the whole token GPU suite, its fwd+bwd table, and the
# trainer (docs/kernel-notes.md, "Twenty-first session", Next 0). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1128k.sh tests")                           the token GPU suite
#   run(command="bash docs/measurements/gpu-next-1128k.sh table")                           fwd+bwd, both contracts
#   run(command="bash docs/measurements/gpu-next-1128k.sh pairs", carry=[".whl", ".cache"])  two trainer pairs
# and a prepared trial: locally `git apply docs/measurements/trial-token-dkdv-defer-dk16.patch`, then
#   mkdir -p .gpu/basefiles/sagebwd/triton && git show HEAD:sagebwd/triton/dkdv_hopper.py \
#     > .gpu/basefiles/sagebwd/triton/dkdv_hopper.py
#   run(command="bash docs/measurements/gpu-next-1128k.sh defer-dk", carry=[".gpu/basefiles"])
set -u
case "${1:-}" in
  tests)   # the same call as the twenty-first session's (logs gpu-tests-next-{1,2}.txt)
    bash docs/measurements/gpu-calls-h200-1128k.sh tests next ;;
  table)
    timeout 400 python3 -m benchmarks.attention --baselines FLASH CUDNN --kernel-times \
      --kernel-shapes 8,16,4096,64 8,8,4096,128 --shapes 8,16,4096,64 8,8,4096,128 \
      --json "$OUT/bench-h200-next.json" 2>&1 | tail -16 ;;
  pairs)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 430 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/trainer-pairs-h200-next.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead 2>&1 | tail -15 ;;
  defer-dk)   # the token d=64 dK/dV with each block's dK product left in flight into the next block: its tests, A/B
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv or (matches_simulation and token and 64) or two_streams" 2>&1 | tail -4
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
      && cp -r .gpu/basefiles/. /tmp/base/
    timeout 300 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/ab-token-defer-dk16.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | tail -20 ;;
  *) echo "usage: bash $0 tests|table|pairs|defer-dk" >&2; exit 2 ;;
esac
