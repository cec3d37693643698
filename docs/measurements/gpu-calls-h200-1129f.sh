# The twenty-eighth session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1203.sh spread", carry=[".whl", ".cache"]): four trainer
#        processes, both attentions, each profiled by kernel (spread-{1..4}-h200-1129f.json; table:
#        `python docs/measurements/spread-table.py docs/measurements/spread-?-h200-1129f.json`)
#   2. run(command="bash docs/measurements/gpu-calls-h200-1129f.sh timeline", carry=[".whl", ".cache"]): two more
#        such processes, now with the device timeline in each profile (busy, overlap of two streams, idle gaps by
#        the kernels on either side; launcher.profile_step.device_timeline)
#   3. run(command="bash docs/measurements/gpu-calls-h200-1129f.sh issue", carry=[".whl", ".cache"]): the host's time
#        to issue one compiled step (forward and backward replayed from CUDA graphs, no optimizer;
#        launcher.profile_step's issue_ms), FPA and token, twice each alternated (issue-*.txt). issue_ms was then the
#        median time to return from a step queued behind others: it read the whole step (37.5 / 38.0 ms), so the
#        host waits inside a step; the call still gave each step's device timeline (busy, overlap, idle)
#   4. run(command="bash docs/measurements/gpu-calls-h200-1129f.sh issue", carry=[".whl", ".cache"]): the same with
#        issue_ms as the host's time for each half of a step begun on an idle device (forward, backward)
#   5. run(command="bash docs/measurements/gpu-calls-h200-1129f.sh replay", carry=[".whl", ".cache"]): where the
#        host's time goes when the compiled step is issued (docs/measurements/replay-host.py: the CUDA graph trees'
#        graphs, their inputs and outputs, cProfile of the forward and backward calls), FPA and token
#   6. run(command="bash docs/measurements/gpu-calls-h200-1129f.sh kept", carry=[".whl", ".cache"]): after the backward
#        stopped keeping empty tensors (sagebwd/triton/ops.py _save): replay-host.py for token (its graphs' outputs),
#        then the GPU tests of the op (tests/test_triton_gpu.py). The forward graph still had 394 outputs: the
#        partitioner already makes the empty placeholders again in the backward graph rather than saving them, so the
#        change (78fcf49) gained nothing under torch.compile and was taken back. The GPU tests ran into the call's
#        400 s limit at ~60% with every test so far passed (the session's device time then spent)
set -u
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
}
trainer() {   # trainer OUT_NAME ATTENTIONS... [-- --set ...]: the trainer pairs' arguments, profiled by kernel
  local name=$1; shift
  timeout 150 python3 -m benchmarks.train_throughput --case experiments/configs/gpu-124m.yaml@4096x4 \
    --loss chunked --steps 20 --engine deepspeed --compile reduce-overhead --set train.grad_accum_dtype=fp32 \
    --profile 60 --out "$OUT/$name.json" --attention "$@" > "$OUT/$name.txt" 2>&1 || echo "$name failed"
}
case "${1:-}" in
  timeline)
    setup
    trainer timeline-1 fpa sagebwd-token
    trainer timeline-2 sagebwd-token fpa
    python3 docs/measurements/spread-table.py "$OUT"/timeline-*.json ;;
  issue)
    setup
    for round in 1 2; do
      for attention in fpa token; do
        case $attention in
          fpa) sets="--set model.attention=fpa" ;;
          token) sets="--set model.attention=sagebwd --set model.smoothing=k --set model.quant=token" ;;
        esac
        timeout 120 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set \
          train.micro_batch_size=4 $sets --compile reduce-overhead --steps 20 --top 3 \
          > "$OUT/issue-$attention-$round.txt" 2>&1 || echo "$attention $round failed"
        grep -h "ms to issue\|device timeline" "$OUT/issue-$attention-$round.txt"
      done
    done ;;
  replay)
    setup
    for attention in fpa token; do
      timeout 150 python3 docs/measurements/replay-host.py --attention $attention > "$OUT/replay-$attention.txt" 2>&1 \
        || echo "$attention failed"
      grep -h "^graph\|median" "$OUT/replay-$attention.txt"
    done ;;
  kept)
    setup
    timeout 120 python3 docs/measurements/replay-host.py --attention token > "$OUT/replay-token-kept.txt" 2>&1 \
      || echo "replay failed"
    grep -h "^graph\|median" "$OUT/replay-token-kept.txt"
    timeout 400 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_gpu.py 2>&1 | tail -5 ;;
  *) echo "usage: bash $0 timeline|issue|replay|kept" >&2; exit 2 ;;
esac
