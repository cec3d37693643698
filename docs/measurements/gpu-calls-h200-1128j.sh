# The twentieth session's device calls (H200, 2026-11-28). Call 1: `gpu-next-1128i.sh tests` (the whole GPU suite on
# c94e363's parent; only the experimental roles kernel failed, under Triton 3.6), call 2: its roles tests again and
# `gpu-next-1128i.sh table` on c94e363 (`roles` below). Then this script, run from the repository root with carry
# [".gpu"] after `prepare` (local): .gpu/base = c94e363 (dK from Y and Q~), .gpu/ds16 = the working tree (dQ and dK
# from dS itself): `check` (call 3), `seeds` (calls 4-5, the first without .cache), `pairs` (calls 6, 7:
# `pairs trainer-pairs-h200-1128j.json`, then `pairs trainer-pairs-h200-1128j-b.json`).
set -u
case "${1:-}" in
  prepare)
    rm -rf .gpu/base .gpu/ds16 && mkdir -p .gpu/base .gpu/ds16
    git archive c94e363 sagebwd tools benchmarks tests setup.cfg | tar -x -C .gpu/base
    git ls-files sagebwd tools benchmarks tests setup.cfg | tar -cf - -T - | tar -xf - -C .gpu/ds16 ;;
  check)     # call 3: the token GPU tests on .gpu/ds16 in two processes, then fwd+bwd A/B against .gpu/base
    cd .gpu/ds16
    python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token or allocates_only or compiled_model or cuda_graph or direct_launches or two_streams" 2>/dev/null \
      | grep "::" > /tmp/ids; wc -l < /tmp/ids
    awk 'NR%2==1' /tmp/ids > /tmp/h1; awk 'NR%2==0' /tmp/ids > /tmp/h2
    mapfile -t A < /tmp/h1; mapfile -t B < /tmp/h2
    (timeout 300 python3 -m pytest -q -p no:cacheprovider "${A[@]}" > $OUT/gpu-tests-ds16-1.txt 2>&1; echo "rc $?" >> $OUT/gpu-tests-ds16-1.txt) &
    (timeout 300 python3 -m pytest -q -p no:cacheprovider "${B[@]}" > $OUT/gpu-tests-ds16-2.txt 2>&1; echo "rc $?" >> $OUT/gpu-tests-ds16-2.txt) &
    wait
    tail -n 2 $OUT/gpu-tests-ds16-1.txt $OUT/gpu-tests-ds16-2.txt; grep -h "^FAILED\|^ERROR" $OUT/gpu-tests-ds16-*.txt | head
    cd ../..
    timeout 270 python3 -m benchmarks.ab .gpu/base --head .gpu/ds16 --rounds 2 --json "$OUT/ab-token-ds16-h200-1128j.json" \
      -- --quant token --baselines CUDNN --shapes 8,16,4096,64 8,8,4096,128 --kernel-times | tail -45 ;;
  seeds)     # call 4: the seed study's token row on the ds16 contract (docs/results.md), 11 seeds beside FPA
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 420 python3 -m experiments.seeds --seeds 11 --variants fpa sagebwd-k-token --name gpu-token-ds16-11-1128j \
      --set eval.batches=16 --set tracking.system_metrics=false --set tracking.tracking_uri=sqlite:////tmp/mlflow.db \
      --out "$OUT/seeds-ds16" 2>&1 | tail -12 ;;
  roles)     # call 2 as it ran (on c94e363, no carry): the roles kernel's tests again, then the fwd+bwd table
    python3 -c "import triton; print(triton.__version__)"
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py -k "by_role or small_gradients" \
      2>&1 | tail -4
    bash docs/measurements/gpu-next-1128i.sh table 2>&1 | tail -40 ;;
  pairs)     # calls 6 and 7 (carry .whl, .cache): trainer pairs on the ds16 tree, two pairs a call (OUT name: $2)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 430 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/${2:-trainer-pairs-h200-1128j.json}" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead 2>&1 | tail -15 ;;
  *) echo "usage: bash $0 prepare|roles|check|seeds|pairs [JSON name]" >&2; exit 2 ;;
esac
