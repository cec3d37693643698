# The next GPU session's prepared calls (written in the twenty-eighth session, 2026-11-29). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1204.sh gc0", carry=[".whl", ".cache"])   (the qkv GPU tests first)
#   run(command="bash docs/measurements/gpu-next-1204.sh gc50", carry=[".whl", ".cache"])
#     train.gc_every's A/B in the trainer pairs' arguments: four pairs with Python's automatic collection
#     (train.gc_every=0, the default), then four with the schedule (50, torchtitan's default). Each
#     row records its collections and their pauses in the timed steps (`gc`). The twenty-eighth session found the
#     token step's extra time in the trainer to be host-side idle (its device busy only +0.3-0.5 ms a step, its
#     timed step +1.0-1.2 ms); if the automatic collector's pauses are that idle, gc0's token rows show them and
#     gc50's pairs move toward the device's ratio (~0.99). Table: `python docs/measurements/gc-table.py
#     $OUT/trainer-pairs-gc0.json $OUT/trainer-pairs-gc50.json` (each call prints its own).
#   run(command="bash docs/measurements/gpu-next-1204.sh prepass", carry=[".whl", ".cache"])
#     what K's mean handed over by model/qkv.py's forward could save before building it: `python -m
#     benchmarks.prepass` with its "K's mean given" row (the quantise launch alone) beside lag 8 (the op's launch)
#     and the two launches, at the trainer's shape and (8,16,4096,64), token and block
set -u
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
}
pairs() {   # pairs EVERY
  timeout 440 python3 -m benchmarks.pairs --pairs 4 --json "$OUT/trainer-pairs-gc$1.json" -- --case \
    experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed \
    --compile reduce-overhead --set train.grad_accum_dtype=fp32 --set train.gc_every=$1 2>&1 | tail -4
  python3 docs/measurements/gc-table.py "$OUT/trainer-pairs-gc$1.json"
}
case "${1:-}" in
  gc0) setup
    # first the qkv op's GPU tests: its eager path (model.qkv._EagerQkv, twenty-eighth session) has not run on a GPU
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_qkv_kernel.py -k gpu 2>&1 | tail -3
    pairs 0 ;;
  gc50) setup; pairs 50 ;;
  prepass)
    setup
    timeout 300 python3 -m benchmarks.prepass --shapes 4,12,4096,64 8,16,4096,64 --quant token block --lags 8 \
      --json "$OUT/prepass-mean-given-next.json" ;;
  *) echo "usage: bash $0 gc0 | gc50 | prepass" >&2; exit 2 ;;
esac
