# The twenty-fifth session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1130.sh r8o r8o-probe-h200-1129c")
#        after `git apply docs/measurements/probe-token-forward-r8o.patch` (reverted after the call): the r8o / r8i
#        forward probe's check and its times against main's forward (r8o-probe-h200-1129c.json)
#   2. run(command="bash docs/measurements/gpu-next-1130.sh fp32acc", carry=[".whl", ".cache"]): the trainer's step
#        with DeepSpeed's BF16_Optimizer by kernel and idle time, then two trainer pairs in it
#   3. run(command="bash docs/measurements/gpu-calls-h200-1129c.sh fp32acc-pairs", carry=[".whl", ".cache"]): four more
#        trainer pairs with BF16_Optimizer (trainer-pairs-fp32acc-h200-1129d.json)
#   4. run(command="bash docs/measurements/gpu-calls-h200-1129c.sh dp8") after `git apply
#        docs/measurements/probe-token-dp8.patch`, with .gpu/basefiles/sagebwd/triton/{dq,dkdv}_hopper.py = main's:
#        a kernel A/B of the token backward with dP = dO V^T as an INT8 product (timing only; reverted after)
#   5. run(command="bash docs/measurements/gpu-calls-h200-1129c.sh gpu-tests", carry=[".whl"]): the GPU tests on
#        today's tree (tests/test_triton_gpu.py; gpu-tests-h200-1129c.txt)
#   6. run(command="bash docs/measurements/gpu-calls-h200-1129c.sh diag") on the forward's half diagonal tile, with
#        .gpu/basefiles/sagebwd/triton/forward.py = main's: the forward's GPU tests, then a kernel A/B of the token
#        contract's causal rows (gpu-tests-diag-h200-1129c.txt, ab-forward-half-diagonal-h200-1129c.json)
set -u
base_tree() {   # /tmp/base: the checkout with .gpu/basefiles (the files a change touches, as main has them) over it
  rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
    && cp -r .gpu/basefiles/. /tmp/base/
}
case "${1:-}" in
  dp8)
    base_tree
    timeout 560 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/ab-token-dp8-probe-h200-1129c.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 8,8,4096,128 \
      --kernel-masks causal full 2>&1 | tail -45 ;;
  fp32acc-pairs)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 560 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-fp32acc-h200-1129d.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -9 ;;
  diag)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py -k "(matches_simulation and not \
      gluon and not fused) or programmatic or quantises_q or sections or direct_launches" \
      > "$OUT/gpu-tests-diag-h200-1129c.txt" 2>&1
    tail -2 "$OUT/gpu-tests-diag-h200-1129c.txt"
    base_tree
    timeout 200 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/ab-forward-half-diagonal-h200-1129c.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 8,8,4096,128 \
      --kernel-masks causal 2>&1 | grep "forward\|all kernels" ;;
  gpu-tests)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      > "$OUT/gpu-tests-h200-1129c.txt" 2>&1
    tail -3 "$OUT/gpu-tests-h200-1129c.txt" ;;
  *) echo "usage: bash $0 fp32acc-pairs | dp8 | gpu-tests | diag" >&2; exit 2 ;;
esac
