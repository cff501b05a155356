#!/usr/bin/env bash
# The GPU check in one device call (docs/gpu.md). Here:   scripts/gpu-check.sh pack [--cpu]
# There (the device call, carrying gpu-payload):          scripts/gpu-check.sh run   (writes to $OUT)
# The rehearsal here:  scripts/gpu-check.sh pack --cpu && PYTHON=... scripts/gpu-check.sh run --cpu --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  pack) exec "${PYTHON:-.venv/bin/python}" scripts/gpu_check.py "$@" ;;
  run) exec "${PYTHON:-python3}" scripts/gpu_check.py "$@" ;;
  *) echo "usage: scripts/gpu-check.sh pack|run [--cpu] [options]" >&2; exit 2 ;;
esac
