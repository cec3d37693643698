# The next GPU session's prepared calls (written in the twenty-seventh session, 2026-11-29). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1203.sh spread", carry=[".whl", ".cache"])
#     where the token step's spread between processes comes from: four processes of the trainer pairs' arguments,
#     each timing both attentions and then profiling 40 more steps of each by kernel (--profile 60). Token's step
#     moved by sd 0.17-1.32 ms between processes in the twenty-seventh session's calls, FPA's by 0.15-0.35; if one
#     kernel's time per step moves with the step, that kernel is the cause; if no kernel does, the GPU idles (host,
#     stream waits). `python docs/measurements/spread-table.py $OUT/spread-*.json` prints both per process.
set -u
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
}
case "${1:-}" in
  spread)
    setup
    for i in 1 2 3 4; do
      if [ $((i % 2)) = 1 ]; then order="fpa sagebwd-token"; else order="sagebwd-token fpa"; fi
      timeout 135 python3 -m benchmarks.train_throughput --case experiments/configs/gpu-124m.yaml@4096x4 \
        --loss chunked --steps 20 --engine deepspeed --compile reduce-overhead --set train.grad_accum_dtype=fp32 \
        --attention $order --profile 60 --out "$OUT/spread-$i.json" > /dev/null 2>&1 || echo "process $i failed"
    done
    python3 docs/measurements/spread-table.py "$OUT"/spread-*.json ;;
  *) echo "usage: bash $0 spread" >&2; exit 2 ;;
esac
