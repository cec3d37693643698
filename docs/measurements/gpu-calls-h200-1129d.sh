# The twenty-sixth session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1201.sh ws ws-forward-probe-h200-1129d"): the token d=64 forward
#        in FlashAttention-3's program shape (docs/measurements/ws-forward-probe.py) checked against the Triton
#        forward, then both timed (ws-forward-probe-h200-1129d.json)
#   2. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh occupancy"): the Triton forward with 2, 3 and 4
#        programs an SM (its ring's depth) beside the probe (ws-occupancy-h200-1129d.json)
#   3. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh fp32acc-pairs", carry=[".whl", ".cache"]): four
#        more trainer pairs with DeepSpeed's BF16_Optimizer (trainer-pairs-fp32acc-h200-1129e.json)
set -u
case "${1:-}" in
  occupancy)
    PYTHONPATH=$PWD timeout 400 python3 docs/measurements/ws-forward-probe.py occupancy ws-occupancy-h200-1129d 2>&1 \
      | grep -v Warn | tail -8 ;;
  fp32acc-pairs)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 560 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-fp32acc-h200-1129e.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -9 ;;
  *) echo "usage: bash $0 occupancy | fp32acc-pairs" >&2; exit 2 ;;
esac
