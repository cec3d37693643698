#!/usr/bin/env bash
# Creates ./.venv and installs the suite with its test extras; fetches the offline assets
# (GPT-2 ranks, demo corpus). Idempotent: a second run only checks the stamp.
# One line per stage; the tools' own output goes to .cache/setup.log, shown only on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
LOG=.cache/setup.log
mkdir -p .cache
: > "$LOG"

# stage "what it does" command...: one line, the command's output into the log
stage() {
  local what=$1 start
  shift
  start=$(($(wc -l < "$LOG") + 1))
  echo "[setup] $what"
  if ! "$@" >> "$LOG" 2>&1; then
    echo "[setup] failed: $what; its output (all stages: $LOG):" >&2
    tail -n "+$start" "$LOG" >&2
    exit 1
  fi
}

stamp="$VENV/.installed-$(sha256sum setup.cfg pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  stage "creating $VENV" "$PY" -m venv "$VENV"
  stage "upgrading pip" "$VENV/bin/python" -m pip install --upgrade pip
  stage "installing the suite and its test extras (about 1.5 min on 2 cores)" \
    "$VENV/bin/python" -m pip install -e '.[test]'
  rm -f "$VENV"/.installed-*
  touch "$stamp"
else
  echo "[setup] $VENV is up to date"
fi
# Offline assets: GPT-2 BPE ranks (checked by sha256) and the demo corpus.
stage "fetching the offline assets (GPT-2 ranks, demo corpus)" "$VENV/bin/python" -m data_prep fetch-assets
