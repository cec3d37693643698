# The next GPU session's prepared calls (written in the twenty-third session, 2026-11-29; `lazy` ran in the
# twenty-fourth as call 1 of gpu-calls-h200-1129b.sh, which added `r8o` and `fp32acc`; those two ran in the
# twenty-fifth as calls 1 and 2 of gpu-calls-h200-1129c.sh). All three are records now. From the repository root:
#   run(command="bash docs/measurements/gpu-next-1130.sh r8o r8o-probe-h200-next")
#     after `git apply docs/measurements/probe-token-forward-r8o.patch`: the forward of variants r8o and r8i
#     (tools.quant_study; no per-tile weighting of O and no flush: the int32 sum shifted right when the reference
#     rises in whole log2 steps) against main's, i.i.d. and attention-sink inputs, its correctness check first
#     (docs/measurements/r8o-probe.py), d=64 and (r8i) d=128. Offline (Triton 3.6): d=64 main 11.9 SASS per score
#     element, r8o 12.3 (16 B spilled), r8i 11.0 (none); d=128 main 14.7 (13.5 with its branch taken), r8i 11.9.
#   run(command="bash docs/measurements/gpu-next-1130.sh fp32acc", carry=[".whl", ".cache"]): the trainer's step with
#     DeepSpeed's BF16_Optimizer (train.grad_accum_dtype=fp32) by kernel and idle time, both attentions, beside the
#     default engine and the stand-in (benchmarks.train_throughput --profile), then two trainer pairs in it.
#   run(command="bash docs/measurements/gpu-next-1130.sh lazy lazy-flush-probe-h200-next")
#     after `git apply docs/measurements/probe-token-forward-lazy-flush.patch` (timing only): variant r8's forward
#     with a lazy reference and its flush against main's forward, on i.i.d. inputs and on inputs with an attention
#     sink (docs/measurements/lazy-flush-probe.py). Offline (Triton 3.6): 168 registers with 80 B spilled at
#     128-key tiles (tau = 1), none at 200 (2 programs an SM); at 64-key tiles none at 168, 24 B at 128.
set -u
case "${1:-}" in
  lazy)
    PYTHONPATH=$PWD timeout 500 python3 docs/measurements/lazy-flush-probe.py "$2" 2>&1 | grep -v Warn | tail -50 ;;
  r8o)
    PYTHONPATH=$PWD timeout 120 python3 docs/measurements/r8o-probe.py check 2>&1 | grep -v Warn | tail -30
    PYTHONPATH=$PWD timeout 450 python3 docs/measurements/r8o-probe.py time "$2" 2>&1 | grep -v Warn | tail -50 ;;
  fp32acc)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 250 python3 -m benchmarks.train_throughput --case experiments/configs/gpu-124m.yaml@4096x4 \
      --attention fpa sagebwd-token --compile reduce-overhead --loss chunked --engine deepspeed --steps 20 \
      --set train.grad_accum_dtype=fp32 --profile 40 --out "$OUT/trainer-profile-fp32acc-h200-next.json" 2>&1 \
      | grep -v Warn | grep "step \|^| gpu-124m" | head -8
    timeout 300 python3 -m benchmarks.pairs --pairs 2 --json "$OUT/trainer-pairs-fp32acc-h200-next.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -8 ;;
  *) echo "usage: bash $0 lazy|r8o NAME | fp32acc" >&2; exit 2 ;;
esac
