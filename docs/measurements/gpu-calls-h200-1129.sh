# The twenty-third session's device calls (H200, 2026-11-29), run from the repository root.
#   call 1: run("bash docs/measurements/gpu-calls-h200-1129.sh halves ab-token-forward-halves-h200-1129") after
#           `git apply docs/measurements/probe-token-forward-halves.patch` (the d=64 token forward's S as two
#           64-key products, so the row max and sum run as two chains a row), with
#           .gpu/basefiles/sagebwd/triton/forward.py = main's: the token GPU tests and the CUDA-graph ones
#           (kernel_checks.captured, moved in the twenty-second session and not run on a GPU since), a kernel A/B
#           against main's forward, and the register caps of the probe's forward
#   call 2: run("bash docs/measurements/gpu-calls-h200-1129.sh pv16 pv16-probe-h200-1129") after
#           `git apply docs/measurements/probe-token-forward-pv16.patch` (the d=64 token forward's P V in bf16, V
#           itself, P against the running max, accumulating into O as FlashAttention does): O's error against fp32
#           SDPA and the forward kernel's time at register caps and pipeline depths, against the INT8 P V forward
#           in the same process (`docs/measurements/pv16-probe.py NAME sweep`; it ran as .gpu/pv16_sweep.py, the
#           same loops; its first run stopped at once, the case then lacking PYTHONPATH, and was run again)
#   call 3: run("bash docs/measurements/gpu-calls-h200-1129.sh pv16-keys pv16-keys-probe-h200-1129") with the
#           same patch (its SAGEBWD_PROBE_KEYS sets the tile): the bf16-P V forward over 64-key tiles (no P
#           quantisation tile binds it to 128), at caps that fit 4-5 programs an SM
#           (`docs/measurements/pv16-probe.py NAME keys`; it ran as .gpu/pv16_keys.py, the same loops)
#   call 4: run("bash docs/measurements/gpu-calls-h200-1129.sh profile", carry=[".whl", ".cache"]) on main, with
#           .gpu/trialfiles = trial-token-dkdv-defer-dk16.patch's dkdv_hopper.py (prepared as the twenty-second
#           session's calls script says): where the deferred dK product's race begins (seq 384-768, one process
#           each), then one training step's kernels with FPA and with token (launcher.profile_step, the trainer's
#           gpu-124m at seq 4096 x 4, compiled and replayed), as the sixteenth session profiled them
#   call 5: run("bash docs/measurements/gpu-calls-h200-1128l.sh pairs trainer-pairs-h200-1129",
#           carry=[".whl", ".cache"]) on main (its kernels unchanged since the twenty-second session's two pairs)
#   call 6: run("bash docs/measurements/gpu-calls-h200-1129.sh defer-b ab-token-defer-dk16-unpeeled-h200-1129") on main,
#           with .gpu/trialfiles as in call 4 and .gpu/trialfiles-b = trial-token-dkdv-defer-dk16-unpeeled.patch's
#           dkdv_hopper.py (the deferred dK product outside the peeled diagonal block only: that block waits for
#           its own product and frees its own ring entry): the first trial without the mask at 512 and 1024, the
#           variant causal at 384-1024 and full at 1024; if the variant passes them, its token dK/dV GPU tests and
#           a kernel A/B against main
#   call 7: run("bash docs/measurements/gpu-calls-h200-1129.sh defer-d") on main, .gpu/trialfiles as in call 4 and
#           .gpu/trialfiles-d = the first trial without the warpgroup barrier before its in-loop release (a
#           discriminator, not a fix: the arrive may then precede another warp's wait): causal 512, full 512 and
#           1024; then the first trial under compute-sanitizer's racecheck, full 512. As it ran, `one` read an
#           unset $5 under set -u, so only the racecheck ran (its hazard's lines cut by the tail); call 8: the
#           same after the mend
#   call 9: run("bash docs/measurements/gpu-calls-h200-1129.sh racecheck-main") on main: racecheck on main's
#           kernels, full 512, to see whether its one hazard (Triton's warp-specialisation dispatch) is main's too
#   call 10: run("bash docs/measurements/gpu-calls-h200-1129.sh acc32 ab-token-forward-acc32-probe-h200-1129") after
#           `git apply docs/measurements/probe-token-forward-acc32.patch` (timing only, wrong numbers: P^ against
#           the running max, P^ V^ accumulated in INT32 across the tiles, no per-tile weighting), with
#           .gpu/basefiles/sagebwd/triton/forward.py = main's: a kernel A/B of the forward
#   call 11: run("bash docs/measurements/gpu-calls-h200-1129.sh acc32 ab-token-forward-late-update-h200-1129") after
#           `git apply docs/measurements/probe-token-forward-late-update.patch` instead (the same numbers: each
#           tile's weighting of O done in the next tile, after its S product is issued), .gpu/basefiles as call 10
set -u
trial_tree() {   # /tmp/trial: the checkout with .gpu/trialfiles over it
  rm -rf /tmp/trial && mkdir -p /tmp/trial && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/trial/ \
    && cp -r .gpu/trialfiles/. /tmp/trial/
}
base_tree() {   # /tmp/base: the checkout with .gpu/basefiles (the files a probe changes, as main has them) over it
  rm -rf /tmp/base && mkdir -p /tmp/base && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/base/ \
    && cp -r .gpu/basefiles/. /tmp/base/
}
case "${1:-}" in
  halves)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "(matches_simulation and token and not gluon) or replayed or cuda_graph" 2>&1 | tail -4
    base_tree
    timeout 260 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/$2.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | tail -24
    timeout 150 python3 -m benchmarks.forward_tiles --shapes 8,16,4096,64 4,12,4096,64 \
      --json "$OUT/forward-tiles-halves-h200-1129.json" 2>&1 | tail -16 ;;
  pv16)
    PYTHONPATH=$PWD timeout 500 python3 docs/measurements/pv16-probe.py "$2" sweep 2>&1 | grep -v Warn | tail -30 ;;
  pv16-keys)
    PYTHONPATH=$PWD timeout 500 python3 docs/measurements/pv16-probe.py "$2" keys 2>&1 | grep -v Warn | tail -34 ;;
  profile)
    trial_tree
    for n in 384 512 640 768; do
      (cd /tmp/trial && PYTHONPATH=/tmp/trial timeout 60 python3 -c "
import torch
from sagebwd.triton import attention
q, k, v, do = [torch.randn(1, 2, $n, 64, device='cuda').bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, True, True, False, 128, 64, 'token')
torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print('seq $n: ok')" 2>&1 | tail -1)
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD MLFLOW_DISABLE_TELEMETRY=true
    for att in fpa token; do
      if [ $att = fpa ]; then sets="--set model.attention=fpa"; else
        sets="--set model.attention=sagebwd --set model.smoothing=k --set model.quant=token"; fi
      timeout 200 python3 -m launcher.profile_step --config experiments/configs/gpu-124m.yaml --set model.seq_len=4096 \
        --set train.micro_batch_size=4 $sets --compile reduce-overhead --steps 5 --top 45 \
        > "$OUT/profile-step-h200-1129-$att.txt" 2>&1
      grep -v Warn "$OUT/profile-step-h200-1129-$att.txt" | head -14
    done ;;
  defer-b)
    one() {   # one small fwd+bwd of the tree $1 (mask $2, seq $3) in its own process
      (cd "$1" && PYTHONPATH="$1" timeout 60 python3 -c "
import torch
from sagebwd.triton import attention
q, k, v, do = [torch.randn(1, 2, $3, 64, device='cuda').bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, '$2' == 'causal', True, False, 128, 64, 'token')
torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print('$1 $2 seq $3: ok')" 2>&1 | tail -1)
    }
    trial_tree
    one /tmp/trial full 512; one /tmp/trial full 1024
    rm -rf /tmp/trialb && mkdir -p /tmp/trialb && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/trialb/ \
      && cp -r .gpu/trialfiles-b/. /tmp/trialb/
    rm -f /tmp/b.log
    for c in "causal 384" "causal 512" "causal 1024" "full 1024"; do
      one /tmp/trialb $c | tee -a /tmp/b.log
    done
    [ "$(grep -c ': ok' /tmp/b.log)" = 4 ] || exit 0
    (cd /tmp/trialb && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py \
      -k "token_gluon_dkdv or (matches_simulation and token and 64) or two_streams" 2>&1 | tail -4)
    (cd /tmp/trialb && timeout 220 python3 -m benchmarks.ab "$OLDPWD" --rounds 2 --json "$OUT/$2.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | grep -E "dkdv|all kernels") ;;
  defer-d)
    one() {   # as in defer-b
      (cd "$1" && PYTHONPATH="$1" timeout ${4:-60} ${5:-} python3 -c "
import torch
from sagebwd.triton import attention
q, k, v, do = [torch.randn(1, 2, $3, 64, device='cuda').bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, '$2' == 'causal', True, False, 128, 64, 'token')
torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print('$1 $2 seq $3: ok')" > /tmp/one.log 2>&1; tail -1 /tmp/one.log)
    }
    rm -rf /tmp/triald && mkdir -p /tmp/triald && cp -r sagebwd tools benchmarks tests setup.cfg /tmp/triald/ \
      && cp -r .gpu/trialfiles-d/. /tmp/triald/
    for c in "causal 512" "full 512" "full 1024"; do one /tmp/triald $c; done
    trial_tree
    one /tmp/trial full 512 200 "/usr/local/cuda/bin/compute-sanitizer --tool racecheck --print-limit 8"
    grep -E "^=========" /tmp/one.log | grep -v "Host Frame" | head -40 ;;
  acc32)
    base_tree
    timeout 300 python3 -m benchmarks.ab /tmp/base --rounds 2 --json "$OUT/$2.json" \
      -- --no-bench --quant token --kernel-times --kernel-shapes 8,16,4096,64 4,12,4096,64 \
      --kernel-masks causal full | grep -E "_forward_kernel|all kernels" ;;
  racecheck-main)
    (PYTHONPATH=$PWD timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --print-limit 8 python3 -c "
import torch
from sagebwd.triton import attention
q, k, v, do = [torch.randn(1, 2, 512, 64, device='cuda').bfloat16() for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
o = attention(q, k, v, False, True, False, 128, 64, 'token')
torch.autograd.grad(o, (q, k, v), do)
torch.cuda.synchronize()
print('main full seq 512: ok')" 2>&1 | grep -E "^=========|: ok" | grep -v "Host Frame" | head -30) ;;
  *) echo "usage: bash $0 halves NAME|pv16 NAME|pv16-keys NAME|profile|defer-b NAME|defer-d|racecheck-main|" \
       "acc32 NAME" >&2
     exit 2 ;;
esac
