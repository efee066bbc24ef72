#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for kubegpu's tests (docs/testing.md):
#   scripts/control-plane.sh build                                    build or reuse the binaries (prints their dir)
#   scripts/control-plane.sh up DIR [--nodes N] [--gpus COUNTxMODEL]  start it; writes DIR/kubeconfig and DIR/pids
#   scripts/control-plane.sh down DIR                                 stop exactly what `up DIR` started
# The logic lives in kubegpu.testing.controlplane (the pytest fixtures use the same code).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; fi
exec "$PYTHON" -m kubegpu.testing.controlplane "$@"
