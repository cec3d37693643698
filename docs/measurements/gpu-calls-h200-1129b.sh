# The twenty-fourth session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1130.sh lazy lazy-flush-probe-h200-1129")
#        after `git apply docs/measurements/probe-token-forward-lazy-flush.patch` (reverted after the call)
#   2. run(command="PYTHONPATH=$PWD python3 -m benchmarks.prepass --shapes 4,12,4096,64 8,16,4096,64 --quant token
#        --lags 0 1 2 4 8 --forward --json $OUT/prepass-h200-1129b.json")
#   3. run(command="PYTHONPATH=$PWD python3 -m benchmarks.prepass --shapes 4,12,4096,64 8,16,4096,64 8,8,4096,128
#        4,12,8192,64 --quant token --lags 2 8 16 32 64 128 --forward --json $OUT/prepass-lags-h200-1129b.json")
#   4. run(command="bash docs/measurements/gpu-calls-h200-1129b.sh lag")
#        on MEAN_LAG = 8, with .gpu/basefiles/sagebwd/triton/quantize.py = main's (lag 2): the quantise launch's GPU
#        tests, the block contract's lags, and a kernel A/B of both contracts at d=64
set -u
base_tree() {   # /tmp/base: the checkout with .gpu/basefiles (the files a change touches, as main has them) over it
  rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
    && cp -r .gpu/basefiles/. /tmp/base/
}
case "${1:-}" in
  lag)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "k_mean or (matches_simulation and not gluon)" 2>&1 | tail -4
    PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.prepass --shapes 4,12,4096,64 8,16,4096,64 --quant block \
      --lags 2 8 16 --json "$OUT/prepass-lags-block-h200-1129b.json" 2>&1 | grep -v Warn | tail -12
    base_tree
    timeout 400 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/ab-mean-lag8-h200-1129b.json" \
      -- --no-bench --quant token block --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | tail -40 ;;
  *) echo "usage: bash $0 lag" >&2; exit 2 ;;
esac
