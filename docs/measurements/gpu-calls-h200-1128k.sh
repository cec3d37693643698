# The twenty-first session's device calls (H200, 2026-11-28), run from the repository root. The head is the working
# tree (the token forward's P~ in fp16, c924b96 and after), the base bb9b86f (the twentieth session's end):
#   prepare (local, with git):  .gpu/basefiles = the files the head changes, as bb9b86f has them
#   call 1: run("bash docs/measurements/gpu-calls-h200-1128k.sh ab", carry=[".cute1", ".gpu/basefiles"])
#           stashes the CuTe wheels for call 3, the forward's A/B, the preprocess's warps (kernel-notes, Next 2)
#   call 2: run("bash docs/measurements/gpu-calls-h200-1128k.sh tests")   the token GPU tests on the head
#   call 3: run("bash docs/measurements/gpu-calls-h200-1128k.sh table", carry=[".cute2", ".whl-cudnn"])
#           on the still-warm machine: the one table with every column (both contracts, FLASH, CUDNN, FA4, CUDNN-FP8)
# As they ran: call 1 `ab`; the forward lost (+0.6% / +2.8%), so call 2 was `table-base` (the table on the base) and
# call 3 `ncu` (where the token kernels' issue goes, by pipe); call 4 `source` on main (bb9b86f's kernels); call 5
# `ab-probe ab-token-exp2fma-dq-h200-1128k` with probe-token-dq-exp2-fma.patch applied to bb9b86f (carry
# .gpu/basefiles: bb9b86f's dq_hopper.py and dkdv_hopper.py); call 6 `ab-probe ab-token-intmax-probe-h200-1128k`
# with probe-token-forward-intmax.patch (.gpu/basefiles: bb9b86f's forward.py). The tests and table cases above
# were not run. Call 7 `dq-order` (branch dq-order: the token dQ's S first at both head dims; .gpu/basefiles:
# bb9b86f's dq_hopper.py); call 8 `final` on the landed tree (S first at d=64 only); calls 9 `ws2` and 10
# `ws2-masks` on that tree (their output is quoted in docs/benchmarks.md; no JSON).
# (.whl-cudnn holds .whl's nvidia_cudnn_frontend wheel alone: .cute2 and all of .whl pass the 64 MiB a call carries.)
set -u
BASE=bb9b86f
case "${1:-}" in
  prepare)
    rm -rf .gpu/basefiles && mkdir -p .gpu/basefiles
    for f in $(git diff --name-only $BASE -- sagebwd tools benchmarks tests setup.cfg); do
      mkdir -p ".gpu/basefiles/$(dirname "$f")" && git show "$BASE:$f" > ".gpu/basefiles/$f"
    done
    find .gpu/basefiles -type f ;;
  ab)
    mkdir -p /tmp/wheels && cp .cute1/* /tmp/wheels/
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
      && cp -r .gpu/basefiles/. /tmp/base/
    timeout 330 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/ab-token-fwd16-h200-1128k.json" \
      -- --quant token --baselines CUDNN --shapes 8,16,4096,64 8,8,4096,128 --kernel-times | tail -45
    timeout 150 python3 -m benchmarks.preprocess --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 --quant token block \
      --warps 4 8 16 --json "$OUT/preprocess-h200-1128k.json" | tail -30 ;;
  tests)   # the token GPU suite in two processes; logs gpu-tests-NAME-{1,2}.txt (NAME: $2, else fwd16); a later
    # session's selection through TESTS_FILES, TESTS_K and TESTS_TIMEOUT (gpu-calls-h200-1128l.sh check)
    name=${2:-fwd16}
    python3 -m pytest --collect-only -q -p no:cacheprovider ${TESTS_FILES:-tests/test_triton_gpu.py} \
      -k "${TESTS_K:-token or compiled_model or cuda_graph or direct_launches or programmatic or sections \
or allocates_only}" \
      2>/dev/null | grep "::" > /tmp/ids; wc -l < /tmp/ids
    awk 'NR%2==1' /tmp/ids > /tmp/h1; awk 'NR%2==0' /tmp/ids > /tmp/h2
    mapfile -t A < /tmp/h1; mapfile -t B < /tmp/h2
    (timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider "${A[@]}" \
       > "$OUT/gpu-tests-$name-1.txt" 2>&1
     echo "rc $?" >> "$OUT/gpu-tests-$name-1.txt") &
    (timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider "${B[@]}" \
       > "$OUT/gpu-tests-$name-2.txt" 2>&1
     echo "rc $?" >> "$OUT/gpu-tests-$name-2.txt") &
    wait
    tail -n 2 "$OUT"/gpu-tests-$name-*.txt; grep -h "^FAILED\|^ERROR" "$OUT"/gpu-tests-$name-*.txt | head ;;
  table)
    cp .cute2/libs.part.ab /tmp/wheels/ && (cd /tmp/wheels && cat libs.part.aa libs.part.ab \
      > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm libs.part.aa libs.part.ab)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/wheels/*.whl \
      .whl-cudnn/nvidia_cudnn_frontend-*.whl
    export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
    timeout 560 python3 -m benchmarks.attention --check-baselines --baselines FLASH CUDNN FA4 CUDNN-FP8 \
      --shapes 8,16,4096,64 8,8,4096,128 --json "$OUT/bench-baselines-h200-1128k.json" 2>&1 | tail -40 ;;
  table-base)   # call 2 as it ran, on the warm machine after call 1 (the forward had lost: the table on the base)
    cp .cute2/libs.part.ab /tmp/wheels/ && (cd /tmp/wheels && cat libs.part.aa libs.part.ab \
      > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm libs.part.aa libs.part.ab)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/wheels/*.whl \
      .whl-cudnn/nvidia_cudnn_frontend-*.whl
    cd /tmp/base && export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/base \
      FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
    timeout 540 python3 -m benchmarks.attention --check-baselines --baselines FLASH CUDNN FA4 CUDNN-FP8 \
      --shapes 8,16,4096,64 8,8,4096,128 --json "$OUT/bench-baselines-h200-1128k.json" 2>&1 | tail -45 ;;
  ncu)   # call 3 (carry .gpu/basefiles): pipe use, issue and stalls of the token kernels, base and head forward
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
      && cp -r .gpu/basefiles/. /tmp/base/
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); echo "ncu: $NCU"
    M="regex:sm__inst_executed_pipe_[a-z0-9_]*\.avg\.pct_of_peak_sustained_active"
    M="$M,regex:sm__pipe_[a-z0-9_]*_cycles_active\.avg\.pct_of_peak_sustained_active"
    M="$M,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active"
    M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpc__cycles_elapsed.avg.per_second"
    for tree in /tmp/base "$PWD"; do
      name=$([ "$tree" = /tmp/base ] && echo base || echo fwd16)
      (cd "$tree" && PYTHONPATH="$tree" timeout 250 "$NCU" --clock-control none --csv \
        --kernel-name regex:"_forward_kernel|_dq_kernel|_dkdv_ws_kernel" --launch-count 3 --metrics "$M" \
        python3 -m benchmarks.attention --once --quant token --shapes 8,16,4096,64 \
        > "$OUT/ncu-pipes-token-$name-h200-1128k.csv" 2> "$OUT/ncu-$name.err"; echo "$name rc $?")
      tail -3 "$OUT/ncu-$name.err"
    done ;;
  source)   # call 4 (main, bb9b86f): warp stalls per SASS instruction of the three token kernels, d=64 causal
    for k in _forward_kernel _dq_kernel _dkdv_ws_kernel; do
      timeout 150 /usr/local/cuda/bin/ncu --clock-control none --section SourceCounters --section WarpStateStats \
        --kernel-name "$k" --launch-count 1 -o "/tmp/$k" python3 -m benchmarks.attention --once --quant token \
        --shapes 8,16,4096,64 > /dev/null 2>&1; echo "$k rc $?"
      /usr/local/cuda/bin/ncu -i "/tmp/$k.ncu-rep" --page source --csv --print-source sass > "/tmp/$k.csv"
      gzip -c "/tmp/$k.csv" > "$OUT/ncu-source-token-d64-$k-h200-1128k.csv.gz"
      python3 -m tools.ncu_source "/tmp/$k.csv" --top 8 | head -60
    done ;;
  ab-probe)   # call 5 (branch exp2fma, carry .gpu/basefiles = bb9b86f's versions of the files it changes): the dQ's
    # exp2 of one tile in two on the FMA pipe, a kernel A/B against bb9b86f
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
      && cp -r .gpu/basefiles/. /tmp/base/
    timeout 300 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/${2:-ab-probe}.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 8,8,4096,128 | tail -20 ;;
  dq-order)   # call 7 (branch dq-order; .gpu/basefiles: bb9b86f's dq_hopper.py): its dQ tests, then the A/B
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dq or (matches_simulation and token) or (direct_launches and token) or two_streams" 2>&1 | tail -4
    bash "$0" ab-probe ab-token-dq-order-h200-1128k ;;
  final)   # call 8, the final kernels (the d=64 token dQ with S first): the dQ's GPU tests, then both contracts' table
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dq or (matches_simulation and token) or (direct_launches and token) or two_streams" 2>&1 | tail -4
    timeout 200 python3 -m benchmarks.attention --baselines FLASH CUDNN --shapes 8,16,4096,64 8,8,4096,128 4,12,4096,64 \
      --json "$OUT/bench-h200-1128k.json" 2>&1 | tail -16 ;;
  ws2)   # call 9, the final kernels: the token dQ's two-consumer kernel (gluon-ws2) against the default, kernel times
    for k in default dq=gluon-ws2; do
      timeout 120 python3 -m benchmarks.attention --no-bench --quant token --kernel-times --kernels "$k" \
        --kernel-shapes 8,16,4096,64 8,8,4096,128 2>&1 | grep -i "_dq_kernel\|all kernels" | sed "s/^/$k: /"
    done ;;
  ws2-masks)   # call 10 as it ran (warm after call 9): both choices twice, alternated, at d=64 with and without the mask
    for k in default dq=gluon-ws2 default dq=gluon-ws2; do
      timeout 45 python3 -m benchmarks.attention --no-bench --quant token --kernel-times --kernels "$k" \
        --kernel-shapes 8,16,4096,64 4,12,4096,64 --kernel-masks causal full 2>&1 \
        | grep -o "sage-token.*causal=[A-Za-z]*\|_dq_kernel [0-9.]*" | paste -sd' ' | sed "s/^/$k: /"
    done ;;
  *) echo "usage: bash $0 prepare|ab|table-base|ncu|source|ab-probe|dq-order|final|ws2|ws2-masks|tests|table" >&2
     exit 2 ;;
esac
