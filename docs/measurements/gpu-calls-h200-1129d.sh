# The twenty-sixth session's device calls (2026-11-29, H200 `nvidia-h200`, torch 2.11, Triton 3.6.0), from the
# repository root, in order:
#   1. run(command="bash docs/measurements/gpu-next-1201.sh ws ws-forward-probe-h200-1129d"): the token d=64 forward
#        in FlashAttention-3's program shape (docs/measurements/ws-forward-probe.py) checked against the Triton
#        forward, then both timed (ws-forward-probe-h200-1129d.json)
#   2. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh occupancy"): the Triton forward with 2, 3 and 4
#        programs an SM (its ring's depth) beside the probe (ws-occupancy-h200-1129d.json)
#   3. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh fp32acc-pairs", carry=[".whl", ".cache"]): four
#        more trainer pairs with DeepSpeed's BF16_Optimizer (trainer-pairs-fp32acc-h200-1129e.json)
#   4. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh graph", carry=[".cute1"]): stashes the CuTe wheels'
#        first half for call 5; the fwd+bwd rows, replayed from CUDA graphs too, at the trainer's shape against CUDNN
#        (bench-graph-h200-1129d.json)
#   5. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh table", carry=[".cute2", ".whl-cudnn"]) on the
#        still-warm machine: every column in one run on today's tree (bench-baselines-h200-1129d.json). .cute1 and
#        .cute2 come from `bash ../shared/device/fetch_cute_wheels.sh`, .whl-cudnn holds nvidia-cudnn-frontend 1.32.0's
#        wheel alone (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
#        manylinux_2_28_x86_64 -d .whl-cudnn nvidia-cudnn-frontend==1.32.0`)
#   6. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh host"): where the token op's host time per
#        fwd+bwd goes at the trainer's shape (host-profile-h200-1129d.json)
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
  graph)
    mkdir -p /tmp/wheels && cp .cute1/* /tmp/wheels/
    timeout 400 python3 -m benchmarks.attention --baselines CUDNN --shapes 4,12,4096,64 \
      --json "$OUT/bench-graph-h200-1129d.json" 2>&1 | tail -14 ;;
  table)
    cp .cute2/libs.part.ab /tmp/wheels/ && (cd /tmp/wheels && cat libs.part.aa libs.part.ab \
      > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm libs.part.aa libs.part.ab)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/wheels/*.whl \
      .whl-cudnn/nvidia_cudnn_frontend-*.whl
    export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
    timeout 570 python3 -m benchmarks.attention --check-baselines --baselines FLASH CUDNN FA4 CUDNN-FP8 \
      --shapes 8,16,4096,64 8,8,4096,128 --json "$OUT/bench-baselines-h200-1129d.json" 2>&1 | tail -45 ;;
  host)
    PYTHONPATH=$PWD timeout 400 python3 -m tools.host_profile --quant token --shape 4,12,4096,64 --calls 50 --top 40 \
      --json "$OUT/host-profile-h200-1129d.json" 2>&1 | grep -v Warn | tail -120 ;;
  *) echo "usage: bash $0 occupancy | fp32acc-pairs | graph | table | host" >&2; exit 2 ;;
esac
