# The device calls of the eighteenth session (2026-11-28, one NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0), as run
# from the repository root through the device tool; their numbers are in docs/kernel-notes.md ("Eighteenth session")
# and docs/benchmarks.md. `prepare` runs here (not on the device) and builds the git-ignored trees the calls carry
# (carry .gpu): .gpu/base = 71bfe4c (the pre-pass still writing K^T); .gpu/fused = 6725e03 with
# trial-fused-d64-token.patch; .gpu/fused{A,B,C} its timing variants (docs/measurements/fused-d64-token-h200-1128h.log).
set -u
tree() {   # tree DIR REV [PATCH]
  rm -rf "$1" && mkdir -p "$1" && git archive "$2" sagebwd tools benchmarks tests | tar -x -C "$1"
  cp setup.cfg "$1/"   # pytest's rootdir there, so the tree's own sagebwd is imported
  if [ -n "${3:-}" ]; then (cd "$1" && patch -s -p1 < "$OLDPWD/$3"); fi
}
case "${1:-}" in
  prepare)
    tree .gpu/base 71bfe4c
    tree .gpu/fused 6725e03 docs/measurements/trial-fused-d64-token.patch
    for v in A B C; do rm -rf .gpu/fused$v && cp -r .gpu/fused .gpu/fused$v; done
    python3 - <<'PY'
wait_y = "        mbarrier.wait(dq_full.index(4 + half), r & 1)\n"
early = ("        rows = q_row + half * acc.shape[0] + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc16f))\n"
         "        factor = gl.load(dq_scale + rows)\n")
first = "        if r == 0:\n            mbarrier.wait(dq_full.index(6), 0)\n"
late = "        prod = warpgroup_mma_wait(0, deps=[prod])\n"
reducer_wait = ("    if r >= 1:   # DQ_STAGES 1: stage g of the block before was read "
                "(its product, which ran before it, too)\n"
                "        for g in gl.static_range(2):\n            mbarrier.wait(dq_empty.index(2 * g), (r - 1) & 1)\n")
for v in "ABC":
    path = f".gpu/fused{v}/sagebwd/triton/dkdv_hopper.py"
    s = open(path).read()
    for old, new in [(first + wait_y, early + first + ("" if v == "C" else wait_y)), (late + early, late)] + \
            ([(reducer_wait, "    pass\n")] if v in "BC" else []):
        assert s.count(old) == 1, (v, old)
        s = s.replace(old, new)
    open(path, "w").write(s)
PY
    ;;
  fused)     # calls 1-2: the fused kernel's GPU test, then its timing and its variants'
    (cd .gpu/fused && timeout 150 python3 -m pytest -q tests/test_triton_gpu.py -p no:cacheprovider -k fused_token)
    for v in fused fusedA fusedB fusedC; do
      (cd .gpu/$v && PYTHONPATH=$PWD timeout 110 python3 ../../docs/measurements/fused-d64-token-timing.py $v)
    done ;;
  nokt)      # call 1: the token pre-pass without K^T (bd39bfa) against 71bfe4c
    timeout 200 python3 -m benchmarks.ab .gpu/base --rounds 2 --json $OUT/ab-token-no-kt-h200.json -- --no-bench \
      --quant token --kernel-times --kernel-shapes 4,12,4096,64 8,16,4096,64 8,8,4096,128 --kernel-masks causal ;;
  tests)     # call 3 (6725e03): the whole GPU suite in two processes; then call 4 (1bc4c09, the fake's fix): the two
             # that failed and the compile tests
    bash docs/measurements/gpu-tests-h200-1128.sh
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py tests/test_host_profile.py \
      -k "launch_costs or cuda_graph_replay or compile" ;;
  pairs)     # call 4 (1bc4c09; carry .whl .cache)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    python3 -m benchmarks.pairs --pairs 3 --json $OUT/trainer-pairs-h200-1128h.json -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed --compile reduce-overhead ;;
  table)     # call 5 (1bc4c09): fwd+bwd, both contracts
    python3 -m benchmarks.attention --baselines FLASH CUDNN --shapes 8,16,4096,64 8,8,4096,128 \
      --json $OUT/bench-h200-1128h.json ;;
  ring)      # call 6: the d=64 token dK/dV's ring one q block shallower, default and fused kernels
    (cd .gpu/fused && PYTHONPATH=$PWD timeout 180 python3 ../../docs/measurements/fused-d64-token-timing.py --ring) ;;
  *) echo "usage: bash $0 prepare|fused|nokt|tests|pairs|table|ring" >&2; exit 2 ;;
esac
