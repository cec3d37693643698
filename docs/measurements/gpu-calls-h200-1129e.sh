# The twenty-seventh session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1202.sh pairs", carry=[".whl", ".cache"]): four trainer pairs
#        with BF16_Optimizer on 1b5ab59 (RoPE without torch.cat; trainer-pairs-fp32acc-rope-next.json, kept as
#        trainer-pairs-fp32acc-rope-h200-1129e.json)
#   2. run(command="bash docs/measurements/gpu-next-1202.sh inductor", carry=[".whl", ".cache"]): the step by kernel
#        (FPA, compile default, no DeepSpeed) and Inductor's generated modules over 0.1 ms a step
#        (profile-step-fpa-next.txt, kept as profile-step-fpa-h200-1129e.txt; the modules not committed)
#   3. run(command="bash docs/measurements/gpu-calls-h200-1129e.sh qkv", carry=[".whl", ".cache"]): model/qkv.py's
#        kernels on the GPU (tests/test_qkv_kernel.py), `python -m benchmarks.qkv` (qkv-bench-h200-1129e.json), the
#        step by kernel with them (profile-step-fpa-qkv-fused-h200-1129e.txt), then the trainer's step with
#        model.qkv_impl plain and fused, both attentions, in two alternated rounds (trainer-qkv-{plain,fused}-r*.json;
#        table: `python docs/measurements/qkv-ab-table.py docs/measurements/trainer-qkv-*-h200-1129e.json`). Its GPU
#        test failed: one-ulp bounds that RoPE's cancellations break; the tests now bound each error against fp64
#   4. run(command="bash docs/measurements/gpu-calls-h200-1129e.sh pairs", carry=[".whl", ".cache"]): those GPU tests
#        again, then four trainer pairs with gpu-124m.yaml's model.qkv_impl=fused
#        (trainer-pairs-fp32acc-qkv-h200-1129e.json)
#   5. run(command="bash docs/measurements/gpu-calls-h200-1129e.sh token", carry=[".whl", ".cache"]): the token step
#        by kernel with the fused q, k, v (profile-step-token-qkv-fused-h200-1129e.txt), then four more pairs
#        (trainer-pairs-fp32acc-qkv-2-h200-1129e.json; all eight: `python -m benchmarks.pairs --combine
#        docs/measurements/trainer-pairs-fp32acc-qkv*-h200-1129e.json`)
#   6. run(command="bash docs/measurements/gpu-calls-h200-1129e.sh launches", carry=[".whl"]): the fused kernels'
#        launch (tokens a program x warps) swept at the trainer's shape (qkv-launches-h200-1129e.json)
set -u
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
}
trainer() {   # $1: model.qkv_impl, $2: round; both attentions in one process, the trainer pairs' arguments
  timeout 130 python3 -m benchmarks.train_throughput --case experiments/configs/gpu-124m.yaml@4096x4 --loss chunked \
    --steps 20 --engine deepspeed --compile reduce-overhead --set train.grad_accum_dtype=fp32 \
    --set "model.qkv_impl=$1" --attention fpa sagebwd-token --out "$OUT/trainer-qkv-$1-r$2.json" > /dev/null 2>&1 \
    || echo "trainer $1 round $2 failed"
}
case "${1:-}" in
  qkv)
    setup
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_qkv_kernel.py -k gpu 2>&1 | tail -3
    timeout 100 python3 -m benchmarks.qkv --shapes 4,12,4096,64 8,8,4096,128 --json "$OUT/qkv-bench-h200-1129e.json" \
      2>&1 | tail -20
    timeout 80 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
      --set train.micro_batch_size=4 --set model.attention=fpa --set model.qkv_impl=fused --compile default \
      --steps 3 --top 40 > "$OUT/profile-step-fpa-qkv-fused-h200-1129e.txt" 2>&1
    grep "ms per step\|triton_\|qkv" "$OUT/profile-step-fpa-qkv-fused-h200-1129e.txt" | head -14 | cut -c1-120
    trainer plain 1; trainer fused 1; trainer fused 2; trainer plain 2
    python3 docs/measurements/qkv-ab-table.py "$OUT"/trainer-qkv-*.json ;;
  pairs)
    setup
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_qkv_kernel.py -k gpu 2>&1 | tail -3
    timeout 470 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-fp32acc-qkv-h200-1129e.json" -- \
      --case experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -9 ;;
  token)
    setup
    timeout 80 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
      --set train.micro_batch_size=4 --set model.attention=sagebwd --set model.quant=token --set model.smoothing=k \
      --compile default --steps 3 --top 40 > "$OUT/profile-step-token-qkv-fused-h200-1129e.txt" 2>&1
    grep "ms per step" "$OUT/profile-step-token-qkv-fused-h200-1129e.txt" | cut -c1-120
    timeout 420 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-fp32acc-qkv-2-h200-1129e.json" -- \
      --case experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -6 ;;
  launches)
    setup
    timeout 150 python3 -m benchmarks.qkv --shapes 4,12,4096,64 --launches 32x2 32x4 64x2 64x4 64x8 128x4 128x8 \
      --json "$OUT/qkv-launches-h200-1129e.json" 2>&1 | tail -20 ;;
  *) echo "usage: bash $0 qkv | pairs | token | launches" >&2; exit 2 ;;
esac
