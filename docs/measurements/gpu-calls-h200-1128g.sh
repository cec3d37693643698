# The device calls of the seventeenth session (2026-11-28, one NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0), as
# run from the repository root through the device tool; their numbers are in docs/kernel-notes.md ("Seventeenth
# session"), docs/benchmarks.md ("dQ in bf16 from Y") and docs/results.md. Trees: BASE = `git archive <rev> sagebwd
# tools benchmarks tests | tar -x -C .gpu/base`; the call's own tree is the checkout at the commit named.
set -u
case "${1:-}" in
  patches)   # call 1: the two prepared patches (tree .gpu/fix = e3f57d5 + fix-token-fp16-dos-scale.patch, .gpu/y16 =
             # that + trial-token-y16-dq.patch; git show ae66909 750a626 for the fp16 fix): token tests, A/Bs
    (cd .gpu/y16 && timeout 240 python3 -m pytest -q tests/test_triton_gpu.py -p no:cacheprovider \
      -k "token or cuda_graph or direct_launches or allocates_only or gluon_kernels_match_simulation" | tail -3)
    for t in fix y16; do
      python3 -m benchmarks.ab .gpu/base --head .gpu/$t --rounds 2 --json $OUT/ab-$t-h200.json -- --no-bench \
        --quant token --kernel-times --kernel-shapes 4,12,4096,64 8,16,4096,64 8,8,4096,128 --kernel-masks causal
    done ;;
  fp16)      # calls 2-3 (commit 697c278): the token GPU tests with the landed fp16 fix, then its new test with -s
    timeout 540 python3 -m pytest -q tests/test_triton_gpu.py -p no:cacheprovider -rs \
      -k "fp16_with_small or (matches_simulation and token) or token_gluon_dkdv or dkdv_by_role or token_kernels"
    timeout 300 python3 -m pytest -q -s tests/test_triton_gpu.py -p no:cacheprovider -k "fp16_with_small" ;;
  y16)       # call 4 (commit 62c6bd7, squashed into 5e491f0; BASE 060702c): token tests, then the dQ A/B
    timeout 330 python3 -m pytest -q tests/test_triton_gpu.py -p no:cacheprovider \
      -k "token or cuda_graph or direct_launches or allocates_only or gluon_kernels_match_simulation"
    timeout 240 python3 -m benchmarks.ab .gpu/base --rounds 2 --json $OUT/ab-y16-gluon-dq-h200.json -- --no-bench \
      --quant token --kernel-times --kernel-shapes 4,12,4096,64 8,16,4096,64 8,8,4096,128 --kernel-masks causal full ;;
  seeds)     # call 5 (same tree; carry .whl .cache)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    python3 -m experiments.seeds --seeds 11 --variants fpa sagebwd-k-token --name gpu-token-y16-11-1128 \
      --out $OUT/seeds --set eval.batches=16 --set tracking.system_metrics=false \
      --set tracking.tracking_uri=sqlite:////tmp/mlflow.db ;;
  table)     # call 6 (same tree): the fwd+bwd table, token only
    python3 -m benchmarks.attention --quant token --baselines FLASH CUDNN --shapes 8,16,4096,64 8,8,4096,128 \
      4,12,4096,64 --json $OUT/bench-y16-h200-1128.json ;;
  *) echo "usage: bash $0 patches|fp16|y16|seeds|table" >&2; exit 2 ;;
esac
