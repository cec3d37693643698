# The next GPU session's calls, prepared in the eighteenth (2026-11-28; none run yet): the prepared patches' GPU
# tests and kernel A/Bs (docs/kernel-notes.md, "Eighteenth session", Next 0-2). `prepare` runs here and builds the
# git-ignored trees the calls carry (carry .gpu): .gpu/main = HEAD, and HEAD with each patch applied.
# run(command="bash docs/measurements/gpu-next-1128h.sh ring", carry=[".gpu"]), then "late", then "lsum".
set -u
tree() {   # tree DIR [PATCH]: the archive of HEAD (its docs hunks are skipped: the tree holds no docs)
  rm -rf "$1" && mkdir -p "$1" && git archive HEAD sagebwd tools benchmarks tests | tar -x -C "$1" && cp setup.cfg "$1/"
  if [ -n "${2:-}" ]; then (cd "$1" && patch -s -p1 -f < "$OLDPWD/$2" > /dev/null || true); fi
}
ab() {   # ab HEAD_TREE JSON QUANT MASKS SHAPES...: a kernel A/B against .gpu/main, two rounds
  local head=$1 json=$2 quant=$3 masks=$4; shift 4
  timeout 200 python3 -m benchmarks.ab .gpu/main --head "$head" --rounds 2 --json "$OUT/$json" -- --no-bench \
    --quant "$quant" --kernel-times --kernel-shapes "$@" --kernel-masks $masks
}
case "${1:-}" in
  prepare)
    tree .gpu/main
    tree .gpu/ring2 docs/measurements/trial-token-d64-ring2.patch
    tree .gpu/ring2b docs/measurements/trial-token-d64-ring2.patch   # and the block contract's depth 2
    sed -i 's/"block": {"dkdv": 3,/"block": {"dkdv": 2,/' .gpu/ring2b/sagebwd/triton/dkdv_ws_hopper.py
    tree .gpu/late docs/measurements/trial-fused-d64-token-late.patch
    tree .gpu/lsum docs/measurements/trial-token-l-from-p8.patch ;;
  ring)   # Next 0: the token dK/dV at ring depth 2 (tests, A/B), and the block contract's
    (cd .gpu/ring2 && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv or fp16_with_small" | tail -2)
    ab .gpu/ring2 ab-token-ring2-h200.json token "causal full" 4,12,4096,64 8,16,4096,64
    (cd .gpu/ring2b && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "warp_specialised_kernels_match or (matches_simulation and not token)" | tail -2)
    ab .gpu/ring2b ab-block-ring2-h200.json block causal 4,12,4096,64 8,16,4096,64 ;;
  late)   # Next 1: the fused backward with its products a block late (its test, then its timing)
    (cd .gpu/late && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k fused_token | tail -3)
    (cd .gpu/late && PYTHONPATH=$PWD timeout 100 python3 ../../docs/measurements/fused-d64-token-timing.py late) ;;
  lsum)   # Next 2: the token forward's denominator from the tensor cores (tests, A/B)
    (cd .gpu/lsum && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token and (matches_simulation or forward or cuda_graph)" | tail -2)
    ab .gpu/lsum ab-token-lsum-h200.json token "causal full" 4,12,4096,64 8,16,4096,64 8,8,4096,128 ;;
  *) echo "usage: bash $0 prepare|ring|late|lsum" >&2; exit 2 ;;
esac
