# The next GPU session's prepared calls (written in the twenty-sixth session, 2026-11-29). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1202.sh pairs", carry=[".whl", ".cache"])
#     four trainer pairs with DeepSpeed's BF16_Optimizer on the tree with RoPE without torch.cat (the ten before it:
#     0.990x ± 0.005; the RoPE change took 1.1% / 1.7% off the FPA / token step in A/Bs, the ratio not measured)
#   run(command="bash docs/measurements/gpu-next-1202.sh inductor", carry=[".whl", ".cache"])
#     the step by kernel (FPA, default compile, no DeepSpeed) and the generated modules of Inductor's pointwise and
#     per-row kernels over 0.1 ms a step, from its cache: the QK-norm + RoPE kernel (72 us a layer, ~1.4 TB/s for
#     its bytes) and the backward's norm and RoPE gradients (~2.0 ms a step) are the ones to read
set -u
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
}
case "${1:-}" in
  pairs)
    setup
    timeout 560 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-fp32acc-rope-next.json" -- --case \
      experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
      --compile reduce-overhead --set train.grad_accum_dtype=fp32 2>&1 | tail -9 ;;
  inductor)
    setup
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-next
    timeout 400 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
      --set train.micro_batch_size=4 --set model.attention=fpa --compile default --steps 3 --top 60 \
      > "$OUT/profile-step-fpa-next.txt" 2>&1
    grep "ms per step\|triton_p" "$OUT/profile-step-fpa-next.txt" | cut -c1-140
    mkdir -p "$OUT/inductor"
    for k in $(awk -F'|' '$2 + 0 > 0.1 && $4 ~ /triton_p/ {gsub(/ /, "", $4); print $4}' \
        "$OUT/profile-step-fpa-next.txt"); do
      for f in $(grep -rl "def $k(" /tmp/inductor-next | head -1); do cp "$f" "$OUT/inductor/"; done
    done
    ls "$OUT/inductor" ;;
  *) echo "usage: bash $0 pairs | inductor" >&2; exit 2 ;;
esac
