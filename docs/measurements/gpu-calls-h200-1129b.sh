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
#        tests, the block contract's lags, and a kernel A/B of both contracts at d=64 (the tests' summary line fell
#        outside the returned tail: call 5 runs them again into a file)
#   5. run(command="bash docs/measurements/gpu-calls-h200-1129b.sh graph") on 0d26324 (lag 8): the quantise launch's
#        GPU tests again, then the fwd+bwd table replayed from CUDA graphs, both contracts against CUDNN
#   6. run(command="bash docs/measurements/gpu-calls-h200-1129b.sh pairs", carry=[".whl", ".cache"]) on 0d26324: two
#        trainer pairs (FPA, token) on this tree
#   7. run(command="bash docs/measurements/gpu-calls-h200-1129b.sh pairs trainer-pairs-h200-1129c",
#        carry=[".whl", ".cache"]) on 0d26324: two more
#   8. run(command="bash docs/measurements/gpu-calls-h200-1129b.sh trainer-profile", carry=[".whl", ".cache"]): the
#        trainer's step by kernel, FPA and token, with the stand-in optimizer and with DeepSpeed's engine
#        (benchmarks.train_throughput --profile, new)
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
  graph)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "k_mean or replayed or (matches_simulation and not gluon)" > "$OUT/gpu-tests-h200-1129b.txt" 2>&1
    tail -2 "$OUT/gpu-tests-h200-1129b.txt"
    timeout 420 python3 -m benchmarks.attention --baselines CUDNN \
      --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 --json "$OUT/bench-graph-h200-1129b.json" 2>&1 | tail -40 ;;
  pairs)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 560 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/${2:-trainer-pairs-h200-1129b}.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead 2>&1 | tail -15 ;;
  trainer-profile)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 380 python3 -m benchmarks.train_throughput --case experiments/configs/gpu-124m.yaml@4096x4 \
      --attention fpa sagebwd-token --compile reduce-overhead --loss chunked --engine manual deepspeed --steps 20 \
      --profile 60 --out "$OUT/trainer-profile-h200-1129b.json" > "$OUT/trainer-profile-h200-1129b.txt" 2>&1
    grep -v Warn "$OUT/trainer-profile-h200-1129b.txt" | grep "step \|^| gpu-124m\|ms per step" | head -20 ;;
  *) echo "usage: bash $0 lag|graph|pairs|trainer-profile" >&2; exit 2 ;;
esac
