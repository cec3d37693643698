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
#   7. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh inductor-code", carry=[".whl", ".cache"]): the
#        trainer's step (FPA, compiled, no DeepSpeed) profiled by kernel, and the generated modules that define
#        Inductor's kernels with a cat, from its cache (profile-step-fpa-h200-1129d.txt; the modules not committed).
#        A first try without carry stopped at once (no pydantic there: the wheels install it)
#   8. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh rope-ab", carry=[".whl", ".cache"]) with
#        .gpu/basefiles/model/layers.py = 5804b96's (RoPE by torch.cat of the halves): the trainer's step, FPA, in both
#        trees alternated (trainer-ab-rope-flip-h200-1129d.json), then the new tree's step by kernel
#        (profile-step-fpa-rope-flip-h200-1129d.txt)
#   9. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh rope-loss", carry=[".whl", ".cache"]), the same
#        trees: both attentions' first loss and step in each (trainer-rope-{base,head}-h200-1129d.json)
#  10. run(command="bash docs/measurements/gpu-calls-h200-1129d.sh rope-ab-token", carry=[".whl", ".cache"]), the
#        same trees: the trainer's step with sagebwd token (trainer-ab-rope-flip-token-h200-1129d.json)
set -u
trainer_trees() {   # the wheels, and /tmp/base: the checkout with .gpu/basefiles (5804b96's model/layers.py) over it
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf /tmp/base && mkdir -p /tmp/base && cp -r benchmarks data_prep experiments launcher model sagebwd tools \
    setup.cfg /tmp/base/ && cp -r .gpu/basefiles/. /tmp/base/
}
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
  inductor-code)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-1129d PYTHONPATH=/tmp/site:$PWD
    timeout 400 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
      --set train.micro_batch_size=4 --set model.attention=fpa --compile default --steps 3 --top 60 \
      > "$OUT/profile-step-fpa-h200-1129d.txt" 2>&1
    grep -v Warn "$OUT/profile-step-fpa-h200-1129d.txt" | tail -64 | cut -c1-150
    mkdir -p "$OUT/inductor"
    for k in $(grep -o "triton_poi_fused[a-z0-9_]*cat[a-z0-9_]*" "$OUT/profile-step-fpa-h200-1129d.txt" | sort -u); do
      for f in $(grep -rl "def $k(" /tmp/inductor-1129d | head -2); do cp "$f" "$OUT/inductor/"; done
    done
    ls -la "$OUT/inductor" ;;
  rope-ab)
    trainer_trees
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 420 python3 -m benchmarks.ab /tmp/base --benchmark train_throughput --rounds 2 \
      --json "$OUT/trainer-ab-rope-flip-h200-1129d.json" -- --case experiments/configs/gpu-124m.yaml@4096x4 \
      --loss chunked --steps 20 --engine deepspeed --attention fpa --compile reduce-overhead 2>&1 | tail -8
    timeout 150 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
      --set train.micro_batch_size=4 --set model.attention=fpa --compile default --steps 3 --top 30 \
      > "$OUT/profile-step-fpa-rope-flip-h200-1129d.txt" 2>&1
    grep "ms per step\|triton_poi\|triton_per" "$OUT/profile-step-fpa-rope-flip-h200-1129d.txt" | cut -c1-140 ;;
  rope-ab-token)
    trainer_trees
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    timeout 330 python3 -m benchmarks.ab /tmp/base --benchmark train_throughput --rounds 2 \
      --json "$OUT/trainer-ab-rope-flip-token-h200-1129d.json" -- --case experiments/configs/gpu-124m.yaml@4096x4 \
      --loss chunked --steps 20 --engine deepspeed --attention sagebwd-token --compile reduce-overhead 2>&1 | tail -4 ;;
  rope-loss)
    trainer_trees
    export MLFLOW_DISABLE_TELEMETRY=true
    for tree in base head; do
      dir=$([ $tree = base ] && echo /tmp/base || echo "$PWD")
      (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 240 python3 -m benchmarks.train_throughput --case \
        experiments/configs/gpu-124m.yaml@4096x4 --loss chunked --steps 10 --engine deepspeed \
        --attention fpa sagebwd-token --compile reduce-overhead --out "$OUT/trainer-rope-$tree-h200-1129d.json" \
        > /dev/null 2>&1)
      python3 -c "import json; [print('$tree', r['attention'], r['first_loss'], round(r['step_ms'], 2), r['error']) \
        for r in json.load(open('$OUT/trainer-rope-$tree-h200-1129d.json'))['rows']]"
    done ;;
  *) echo "usage: bash $0 occupancy | fp32acc-pairs | graph | table | host | inductor-code | rope-ab |" \
       "rope-ab-token | rope-loss" >&2
     exit 2 ;;
esac
