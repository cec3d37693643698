# The next GPU session's prepared calls (written in the twenty-third session, 2026-11-29; `lazy` ran in the
# twenty-fourth as call 1 of gpu-calls-h200-1129b.sh). From the repository root:
#   run(command="bash docs/measurements/gpu-next-1130.sh lazy lazy-flush-probe-h200-next")
#     after `git apply docs/measurements/probe-token-forward-lazy-flush.patch` (timing only): variant r8's forward
#     with a lazy reference and its flush against main's forward, on i.i.d. inputs and on inputs with an attention
#     sink (docs/measurements/lazy-flush-probe.py). Offline (Triton 3.6): 168 registers with 80 B spilled at
#     128-key tiles (tau = 1), none at 200 (2 programs an SM); at 64-key tiles none at 168, 24 B at 128.
set -u
case "${1:-}" in
  lazy)
    PYTHONPATH=$PWD timeout 500 python3 docs/measurements/lazy-flush-probe.py "$2" 2>&1 | grep -v Warn | tail -50 ;;
  *) echo "usage: bash $0 lazy NAME" >&2; exit 2 ;;
esac
