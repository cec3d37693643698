# The next GPU session's first calls, prepared in the twentieth (2026-11-28; none run yet): the benchmark's one
# table with every column (both contracts, FLASH, CUDNN, FA4, CUDNN-FP8) on the ds16 tree, and the preprocess's
# warps since it stopped writing dO s_Q (docs/kernel-notes.md, "Twentieth session", Next 2). From the repository
# root, wheels first (here, with network): bash benchmarks/fetch_baseline_wheels.sh --fa4
#   run(command="bash docs/measurements/gpu-next-1128j.sh cute1", carry=[".cute1"])           stash, preprocess sweep
#   run(command="bash docs/measurements/gpu-next-1128j.sh table", carry=[".cute2", ".whl"])   on the still-warm machine
set -u
case "${1:-}" in
  cute1)
    mkdir -p /tmp/wheels && cp .cute1/* /tmp/wheels/
    python3 -m benchmarks.preprocess --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 --quant token block \
      --warps 4 8 16 --json "$OUT/preprocess-h200-next.json" | tail -30 ;;
  table)
    cp .cute2/libs.part.ab /tmp/wheels/ && (cd /tmp/wheels && cat libs.part.aa libs.part.ab \
      > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm libs.part.aa libs.part.ab)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/wheels/*.whl \
      .whl/nvidia_cudnn_frontend-*.whl
    export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
    timeout 560 python3 -m benchmarks.attention --check-baselines --baselines FLASH CUDNN FA4 CUDNN-FP8 \
      --shapes 8,16,4096,64 8,8,4096,128 --json "$OUT/bench-baselines-h200-next.json" 2>&1 | tail -40 ;;
  *) echo "usage: bash $0 cute1|table" >&2; exit 2 ;;
esac
