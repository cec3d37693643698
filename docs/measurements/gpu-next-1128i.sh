# The next GPU session's calls, prepared in the nineteenth (2026-11-28; none run yet): the token contract's dK as a
# bf16 product (f65b5dd..) on a GPU beyond the 14 bit-identity cases the nineteenth session ran
# (docs/kernel-notes.md, "Nineteenth session", Next 0). Run from the repository root:
#   run(command="bash docs/measurements/gpu-next-1128i.sh tests")   the whole GPU suite, two processes (~8 min)
#   run(command="bash docs/measurements/gpu-next-1128i.sh table")   fwd+bwd, both contracts, FLASH and CUDNN
#   run(command="bash docs/measurements/gpu-next-1128i.sh pairs", carry=[".whl", ".cache"])   trainer pairs
set -u
case "${1:-}" in
  tests) bash docs/measurements/gpu-tests-h200-1128.sh ;;
  table) python3 -m benchmarks.attention --baselines FLASH CUDNN --shapes 8,16,4096,64 8,8,4096,128 \
           --json "$OUT/bench-h200-next.json" ;;
  pairs) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
         export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
         python3 -m benchmarks.pairs --pairs 3 --json "$OUT/trainer-pairs-h200-next.json" -- --case \
           experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 20 --engine deepspeed --compile reduce-overhead ;;
  *) echo "usage: bash $0 tests|table|pairs" >&2; exit 2 ;;
esac
