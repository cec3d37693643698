# The next GPU session's prepared calls (written in the twenty-fifth session, 2026-11-29; both run in the twenty-sixth:
# docs/measurements/gpu-calls-h200-1129d.sh). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1201.sh ws ws-forward-probe-h200-next")
#     the token d=64 forward in FlashAttention-3's program shape (docs/measurements/ws-forward-probe.py: two consumer
#     warpgroups of 64 rows at 240 registers, a TMA producer warp, P^ kept in registers as the P^ V^ product's A
#     operand): its O and LSE against the Triton forward's first, then both kernels timed on the same quantised
#     operands, i.i.d. and attention-sink inputs, causal and full. Offline (Triton 3.6): the numbers its `offline`
#     mode printed are in docs/kernel-notes.md, "Twenty-fifth session".
#   run(command="bash docs/measurements/gpu-calls-h200-1129c.sh fp32acc-pairs", carry=[".whl", ".cache"])
#     four more trainer pairs with DeepSpeed's BF16_Optimizer (six so far: 0.994x ± 0.007), to resolve the 1.0x
#     target inside its interval.
set -u
case "${1:-}" in
  ws)
    PYTHONPATH=$PWD timeout 200 python3 docs/measurements/ws-forward-probe.py check 2>&1 | grep -v Warn | tail -30
    PYTHONPATH=$PWD timeout 350 python3 docs/measurements/ws-forward-probe.py time "$2" 2>&1 | grep -v Warn | tail -12 ;;
  *) echo "usage: bash $0 ws NAME" >&2; exit 2 ;;
esac
