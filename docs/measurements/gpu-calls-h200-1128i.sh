# The nineteenth session's device calls (H200, 2026-11-28). Calls 1-2 ran the eighteenth session's prepared
# `gpu-next-1128h.sh ring`, then `late` and `lsum` (carry .gpu). Call 3 (this script, carry .gpu after `prepare`):
# the d=64 dK/dV at ring depth 2 for both contracts, its GPU tests and the fwd+bwd table; call 4 (`tests`).
set -u
case "${1:-}" in
  prepare)   # .gpu/main = the working tree's tracked kernels, tools, benchmarks and tests (contract: e068ded's)
    rm -rf .gpu/main && mkdir -p .gpu/main && git ls-files sagebwd tools benchmarks tests setup.cfg | tar -cf - -T - \
      | tar -xf - -C .gpu/main
    if [ "${2:-}" = contract ]; then
      rm -rf .gpu/dk16 && mv .gpu/main .gpu/dk16 && mkdir -p .gpu/main
      git archive e068ded sagebwd tools benchmarks tests setup.cfg | tar -x -C .gpu/main
    fi
    if [ "${2:-}" = dk16 ]; then   # HEAD with the dk16 probe (offline-built in the eighteenth session)
      rm -rf .gpu/dk16 && mkdir -p .gpu/dk16 && git archive HEAD sagebwd tools benchmarks tests | tar -x -C .gpu/dk16
      cp setup.cfg .gpu/dk16/ && (cd .gpu/dk16 && patch -s -p1 < ../../docs/measurements/probe-dkdv-token-dk16.patch)
    fi ;;
  ring)      # call 3: the dK/dV tests of both contracts, then fwd+bwd against the baselines
    (cd .gpu/main && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv or warp_specialised_kernels_match or matches_simulation or fp16_with_small" | tail -2)
    (cd .gpu/main && timeout 300 python3 -m benchmarks.attention --baselines FLASH CUDNN \
      --shapes 8,16,4096,64 8,8,4096,128 --json "$OUT/bench-h200-1128i.json" | tail -40) ;;
  tests)     # call 4: the same tree's dK/dV tests of both contracts (call 3's timeout stopped them)
    (cd .gpu/main && timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "warp_specialised_kernels_match or token_gluon_dkdv or (matches_simulation and 64)" | tail -4) ;;
  dk16)      # call 5: the dk16 probe's timing (its values are not meaningful): probe-dkdv-token-dk16.patch on
             # e068ded in .gpu/dk16 (`prepare dk16`), a kernel A/B against .gpu/main
    timeout 500 python3 -m benchmarks.ab .gpu/main --head .gpu/dk16 --rounds 2 --json "$OUT/ab-token-dk16-probe-h200.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 4,12,4096,64 8,16,4096,64 --kernel-masks causal full ;;
  contract)  # call 6: the token contract's dK as a bf16 product (d73c04c..): its GPU tests, then a kernel A/B against
             # e068ded (.gpu/main). `prepare contract` first: .gpu/dk16 = the working tree, .gpu/main = e068ded
    (cd .gpu/dk16 && timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv_matches or small_gradients or by_role or quantises_q_as" 2>&1 | tail -4)
    timeout 150 python3 -m benchmarks.ab .gpu/main --head .gpu/dk16 --rounds 2 --json "$OUT/ab-token-dk16-h200.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 4,12,4096,64 8,8,4096,128 --kernel-masks causal full ;;
  *) echo "usage: bash $0 prepare [dk16|contract]|ring|tests|dk16|contract" >&2; exit 2 ;;
esac
